"""circuit-tracer's graph file: what its `Graph.to_pt` writes and `Graph.from_pt` reads (circuit-tracer 0.5.0
`graph.py`), written and read by hooked without circuit-tracer installed.

The file is `torch.save` of a dict: input_string, adjacency_matrix (dense), cfg, active_features,
logit_targets, logit_probabilities, vocab_size, input_tokens, selected_features, activation_values, scan. Two of
its values are circuit-tracer objects: `cfg` a `UnifiedConfig` (`utils/tl_nnsight_mapping.py`, a dataclass) and
each logit target a `LogitTarget` (`attribution/targets.py`, a NamedTuple). hooked writes stand-ins that pickle
under circuit-tracer's module and class names, with the same fields, so `from_pt` builds circuit-tracer's own
objects; reading, `torch.load(weights_only=True)` maps those names back to plain stand-ins, and nothing else in
the file can run code.

The config's fields come from `graph.model_info`: n_layers (else `graph.n_layers`), d_vocab (else
`graph.vocab_size`), d_model, d_head, n_heads, d_mlp, n_key_value_heads (else None: circuit-tracer's graph code
reads none of them), model_name (else "unknown"), tokenizer_name (else model_name: `create_graph_files` loads
`AutoTokenizer.from_pretrained(tokenizer_name)`, a Hugging Face id or a local folder), original_architecture
(else "unknown").
"""

from __future__ import annotations

import pickle
import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from hooked.graphs.graph import Graph


class LogitTarget(NamedTuple):
    """A logit node: the token's text and its vocabulary id (circuit-tracer 0.5.0 `attribution/targets.py`)."""

    token_str: str
    vocab_idx: int


CONFIG_NAME = "circuit_tracer.utils.tl_nnsight_mapping.UnifiedConfig"
LOGIT_TARGET_NAME = "circuit_tracer.attribution.targets.LogitTarget"
CONFIG_FIELDS = (
    "n_layers",
    "d_model",
    "d_head",
    "n_heads",
    "d_mlp",
    "d_vocab",
    "tokenizer_name",
    "model_name",
    "original_architecture",
    "n_key_value_heads",
    "dtype",
)
DENSE_WARNING_BYTES = 1 << 30  # a sparse graph written dense past this size warns


class UnifiedConfig:
    """Stand-in for circuit-tracer's `UnifiedConfig`: its fields as attributes, pickled under its name."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"UnifiedConfig({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


# What each stand-in pickles as: the module and class name circuit-tracer's unpickler looks up.
_PICKLED_AS = {UnifiedConfig: CONFIG_NAME.rsplit(".", 1), LogitTarget: LOGIT_TARGET_NAME.rsplit(".", 1)}


class _CircuitTracerPickler(pickle._Pickler):
    """Python's pickler, writing the stand-in classes under circuit-tracer's names. (The C pickler imports a
    class's module to check its name, which would need circuit-tracer here.)"""

    def save_global(self, obj, name=None):
        if obj not in _PICKLED_AS:
            return super().save_global(obj, name)
        module, qualname = _PICKLED_AS[obj]
        self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
        self.memoize(obj)

    dispatch = {**pickle._Pickler.dispatch, type: save_global}


_PICKLE_MODULE = types.SimpleNamespace(__name__="hooked.graphs.files", Pickler=_CircuitTracerPickler)


def default_scan(model_info: dict[str, Any]) -> str:
    """The `scan` of a graph whose transcoders name none and were not loaded from a path (made in memory): the
    model's name, else "unknown". circuit-tracer's `create_graph_files` refuses a graph without a scan."""
    return model_info.get("model_name") or "unknown"


def circuit_tracer_config(graph: Graph) -> UnifiedConfig:
    """The `cfg` circuit-tracer's graph carries, from `graph.model_info` (the module docstring)."""
    info = graph.model_info
    model_name = info.get("model_name") or "unknown"
    values = {
        "n_layers": info.get("n_layers", graph.n_layers),
        "d_vocab": info.get("d_vocab", graph.vocab_size),
        "model_name": model_name,
        "tokenizer_name": info.get("tokenizer_name") or model_name,
        "original_architecture": info.get("original_architecture") or "unknown",
    }
    return UnifiedConfig(**{name: values.get(name, info.get(name)) for name in CONFIG_FIELDS})


def save_circuit_tracer(graph: Graph, path: str | Path) -> None:
    """Write `graph` to `path` (.pt) for circuit-tracer 0.5.0's `Graph.from_pt`. A sparse adjacency is written
    dense, since circuit-tracer reads only dense ones: N x N float32, with a warning past 1 GiB."""
    if graph.n_layers != graph.model_info.get("n_layers", graph.n_layers):
        raise ValueError(
            f"graph.n_layers is {graph.n_layers} but model_info['n_layers'] is {graph.model_info['n_layers']}: "
            "circuit-tracer counts error nodes with the config's, so they must agree"
        )
    adjacency = graph.adjacency
    if adjacency.is_sparse:
        size = adjacency.shape[0] * adjacency.shape[1] * 4
        if size > DENSE_WARNING_BYTES:
            warnings.warn(
                f"writing the sparse {adjacency.shape[0]} x {adjacency.shape[1]} adjacency dense for circuit-tracer "
                f"({size / 2**30:.1f} GiB in memory and on disk); prune first or keep hooked's own format to avoid it",
                stacklevel=3,
            )
        adjacency = adjacency.to_dense()
    record = {
        "input_string": graph.input_string,
        "adjacency_matrix": adjacency.detach().float().cpu().contiguous(),
        "cfg": circuit_tracer_config(graph),
        "active_features": graph.active_features.cpu(),
        "logit_targets": [LogitTarget(str(t.token_str), int(t.vocab_idx)) for t in graph.logit_targets],
        "logit_probabilities": graph.logit_probabilities.cpu(),
        "vocab_size": graph.vocab_size,
        "input_tokens": graph.input_tokens.cpu(),
        "selected_features": graph.selected_features.cpu(),
        "activation_values": graph.activation_values.cpu(),
        "scan": default_scan(graph.model_info) if graph.scan is None else graph.scan,  # create_graph_files needs one
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, path, pickle_module=_PICKLE_MODULE)


def read_circuit_tracer(path: str | Path, feature_input_hook: str, feature_output_hook: str) -> dict[str, Any]:
    """Read a circuit-tracer 0.5.0 graph file as the fields of hooked's `Graph`, which `Graph.load_circuit_tracer`
    makes of them (this module reads and writes files; graph.py owns the Graph and imports it, not the reverse)."""
    stand_ins = [(UnifiedConfig, CONFIG_NAME), (LogitTarget, LOGIT_TARGET_NAME)]
    with torch.serialization.safe_globals(stand_ins):
        record = torch.load(path, map_location="cpu", weights_only=True)
    missing = {"input_string", "adjacency_matrix", "cfg", "active_features", "input_tokens"} - set(record)
    if missing:
        raise ValueError(f"{path} is not a circuit-tracer graph file (Graph.to_pt): it lacks {sorted(missing)}")
    config = dict(vars(record["cfg"]))
    targets = record["logit_targets"]
    if isinstance(targets, torch.Tensor):  # files from before LogitTarget (circuit-tracer's from_pt reads them too)
        targets = [LogitTarget("", int(i)) for i in targets.tolist()]
    return dict(
        input_tokens=record["input_tokens"],
        input_string=record["input_string"],
        active_features=record["active_features"],
        activation_values=record["activation_values"],
        selected_features=record["selected_features"],
        adjacency=record["adjacency_matrix"],
        logit_targets=[LogitTarget(*target) for target in targets],
        logit_probabilities=record["logit_probabilities"],
        n_layers=int(config["n_layers"]),
        vocab_size=int(record.get("vocab_size") or config["d_vocab"]),
        feature_input_hook=feature_input_hook,
        feature_output_hook=feature_output_hook,
        model_info={key: value for key, value in config.items() if value is not None},
        scan=record.get("scan"),
    )
