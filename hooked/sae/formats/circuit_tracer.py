"""circuit-tracer's per-layer transcoder sets (circuit-tracer 0.4, `transcoder/single_layer_transcoder.py`,
`utils/hf_utils.py`, `utils/caching.py`), read and written: a directory with `config.yaml` and one
`layer_{i}.safetensors` per layer, as `TranscoderSet.to_safetensors` and `save_transcoders_to_cache` leave it.

    config.yaml: model_kind: transcoder_set, feature_input_hook: mlp.hook_in, feature_output_hook: hook_mlp_out,
                 activation: relu | topk (with k) | absent (JumpReLU when the weights hold a threshold, else relu),
                 transcoders: [paths] (optional: the layers' files, .safetensors or Gemma Scope .npz, local or hf://)
    layer_{i}.safetensors: W_enc [d_transcoder, d_model] (F.linear's layout), W_dec [d_transcoder, d_model], b_enc,
                 b_dec, activation_function.threshold (JumpReLU), W_skip [d_model, d_model] (x @ W_skip.T), k (TopK)
    output = activation(x @ W_enc.T + b_enc) @ W_dec + b_dec (+ x @ W_skip.T)

The hooks are TransformerLens names relative to a block (`blocks.{i}.` + the name). `load` returns a list of
dictionaries, layer i at index i. circuit-tracer's TopK keeps the k largest pre-activations even when negative;
hooked's topk (SAELens', eai-sparsify's) also applies relu, which differs only where fewer than k are positive.
A `cross_layer_transcoder` config is hooked.sae.clt's.

circuit-tracer runs TransformerLens with fold_ln, center_writing_weights and center_unembed off
(`TransformerLensReplacementModel.from_pretrained_and_transcoders`), so the dictionaries record an unprocessed
model. It leaves fold_value_biases at TransformerLens' default (on), which changes only hook_v, hook_z and
hook_result, none of which a transcoder set reads or writes; it is recorded as off.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from hooked.processing import unprocessed
from hooked.sae import architectures
from hooked.sae.architectures import JUMPRELU, STANDARD
from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats import gemma_scope
from hooked.sae.formats.files import Safetensors, write_safetensors
from hooked.sae.formats.layout import Stored, build, check
from hooked.sae.formats.names import to_hooked, to_transformer_lens

NAME = "circuit-tracer"
CONFIG = "config.yaml"
# a set's layer files, or a cross-layer transcoder's (hooked/sae/formats/circuit_tracer_clt.py)
FILES = (CONFIG, "layer_*.safetensors", "W_enc_*.safetensors", "W_dec_*.safetensors")
LOOKS_FOR = "config.yaml (circuit-tracer)"
_THRESHOLD = "activation_function.threshold"
# a declared parameter's key in a layer file, where it is not the parameter's own name
KEYS = {"threshold": _THRESHOLD}
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def read_config(directory: Path) -> dict:
    import yaml  # PyYAML, a dependency of huggingface_hub

    path = directory / CONFIG
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a YAML {type(config).__name__}, not circuit-tracer's config mapping")
    return config


def detect(path: Path) -> bool:
    """Whether directory `path` is circuit-tracer's: it has config.yaml (its model_kind is checked by `read`)."""
    return (path / CONFIG).is_file()


def read(
    directory: Path,
    *,
    hook_name: str | None,
    hook_name_out: str | None,
    device: str,
    dtype: str | None,
    model=None,
    norm_scaling_factor: float | None = None,
) -> list[Dictionary] | CrossLayerTranscoder:
    """What circuit-tracer saved in `directory`: a transcoder set (a list, layer i at index i) or a cross-layer
    transcoder (hooked.sae.clt's; its points and widths are checked against a model when it is spliced)."""
    kind = read_config(directory).get("model_kind")
    if kind not in ("transcoder_set", "cross_layer_transcoder"):
        raise ValueError(f"{directory / CONFIG}: model_kind {kind!r} is not transcoder_set or cross_layer_transcoder")
    if hook_name or hook_name_out or norm_scaling_factor is not None:
        raise ValueError(
            f"{directory}: a circuit-tracer set names its points in config.yaml (feature_input_hook,"
            " feature_output_hook) and has no input scale; edit the file rather than pass hook_name / hook_name_out /"
            " norm_scaling_factor"
        )
    if kind == "cross_layer_transcoder":
        from hooked.sae.formats.circuit_tracer_clt import load_circuit_tracer_clt

        return load_circuit_tracer_clt(directory, device=device, dtype=getattr(torch, dtype) if dtype else None)
    return _read_set(directory, device=device, dtype=dtype, model=model)


def _read_set(directory: Path, *, device: str, dtype: str | None, model) -> list[Dictionary]:
    """The transcoder set circuit-tracer saved in `directory`, layer i at index i."""
    config = read_config(directory)
    where = directory / CONFIG
    for field in ("feature_input_hook", "feature_output_hook"):
        if not isinstance(config.get(field), str):
            raise ValueError(f"{where} has no {field} (e.g. {field}: mlp.hook_in); circuit-tracer needs it too")
    activation, k = config.get("activation"), config.get("k")
    known = architectures.circuit_tracer_names()
    if activation is not None and activation not in known:
        raise ValueError(
            f"{where}: activation {activation!r} is not one of {', '.join(known)} (or absent: relu or JumpReLU, as"
            " the weights say)"
        )
    if activation is not None and known[activation].k is not None and not isinstance(k, int):
        raise ValueError(f"{where}: activation is {activation}, so it needs an int k (k: 64), not {k!r}")
    paths = _layer_paths(directory, config)
    metadata = {key: value for key, value in config.items() if key != "transcoders"} | {"source": "circuit-tracer"}
    transcoders = []
    for layer, path in enumerate(paths):
        hook_in = to_hooked(f"blocks.{layer}.{config['feature_input_hook']}", model)
        hook_out = to_hooked(f"blocks.{layer}.{config['feature_output_hook']}", model)
        if path.suffix == ".npz" or gemma_scope.is_version_2(path):
            transcoder = gemma_scope.read(
                path, hook_name=hook_in, hook_name_out=hook_out, device=device, dtype=dtype, model=model
            )
        else:
            transcoder = _read_layer(path, hook_in, hook_out, activation, k, device, dtype, model)
        transcoder.cfg.metadata = metadata | {"layer": layer}
        transcoders.append(transcoder)
    return transcoders


def _layer_paths(directory: Path, config: dict) -> list[Path]:
    where = directory / CONFIG
    if "transcoders" in config:
        from hooked.sae.formats import hub

        listed = config["transcoders"]
        if not isinstance(listed, list) or not all(isinstance(path, str) for path in listed):
            raise ValueError(f"{where}: transcoders is a list of file paths (one per layer), not {listed!r}")
        # a file on the hub (hf://owner/repo/file, as circuit-tracer's configs name them) is fetched
        paths = [hub.fetch_file(path) if hub.is_hub_path(path) else directory / path for path in listed]
    else:
        found = {
            int(m.group(1)) for f in directory.glob("layer_*.safetensors") if (m := re.match(r"layer_(\d+)$", f.stem))
        }
        if not found:
            raise FileNotFoundError(
                f"{directory} has {CONFIG} but no layer_{{i}}.safetensors files (nor a transcoders list)"
            )
        missing = sorted(set(range(max(found) + 1)) - found)
        if missing:
            raise FileNotFoundError(
                f"{directory} has transcoders for layers {sorted(found)} but not for {missing}: a transcoder set covers"
                " every layer from 0 (circuit-tracer's TranscoderSet requires it too)"
            )
        paths = [directory / f"layer_{layer}.safetensors" for layer in range(max(found) + 1)]
    absent = [str(path) for path in paths if not path.exists()]
    if absent:
        raise FileNotFoundError(f"{where} names transcoder files that do not exist: {absent}")
    return paths


def _read_layer(
    path: Path, hook_in: str, hook_out: str, activation, k, device: str, dtype: str | None, model
) -> Dictionary:
    with Safetensors(path) as source:
        keys = set(source.keys())
        for key in ("W_enc", "b_enc", "b_dec"):
            if key not in keys:
                raise ValueError(f"{path} has no {key}: it holds {sorted(keys)}, not a circuit-tracer transcoder")
        if k is None and "k" in keys:  # SingleLayerTranscoder.to_safetensors keeps a TopK's k in the file
            k = int(source.read("k").item())
        if activation is None:  # circuit-tracer's rule: a JumpReLU where the weights hold a threshold, else relu
            declaration = JUMPRELU if _THRESHOLD in keys else STANDARD
        else:
            declaration = architectures.circuit_tracer_names()[activation]
        d_transcoder, d_model = source.shape("W_enc")
        skip = "W_skip" in keys
        cfg = DictionaryConfig(
            d_in=d_model,
            d_sae=d_transcoder,
            hook_name=hook_in,
            architecture=declaration.name,
            hook_name_out=hook_out,
            d_out=source.shape("b_dec")[0],
            k=k if declaration.k is not None else None,
            dtype=dtype or "float32",  # circuit-tracer's load_transcoder_set default
            device=device,
            processing=unprocessed(),
        )
        layout = {"W_enc": Stored("W_enc", transposed=True), "W_dec": Stored("W_dec"), "b_dec": Stored("b_dec")}
        layout |= {name: Stored(KEYS.get(name, name)) for name in declaration.parameters}
        if skip:
            layout["W_skip"] = Stored("W_skip")
        check(cfg, source, layout, skip, f"the shape of {path.name}'s W_enc", extra={"k"} & keys, model=model)
        return build(cfg, source, layout, skip)


def write(dictionary: Dictionary | CrossLayerTranscoder | Sequence[Dictionary], directory: Path) -> Path:
    """Save a list of transcoders (or one), layer i at index i, as circuit-tracer's transcoder set, or a cross-layer
    transcoder as its CLT folder (hooked/sae/formats/circuit_tracer_clt.py)."""
    if isinstance(dictionary, CrossLayerTranscoder):
        from hooked.sae.formats.circuit_tracer_clt import save_circuit_tracer

        return save_circuit_tracer(dictionary, directory)
    return _write_set([dictionary] if isinstance(dictionary, Dictionary) else list(dictionary), directory)


@torch.no_grad()
def _write_set(transcoders: Sequence[Dictionary], directory: Path) -> Path:
    """Save a list of transcoders, layer i at index i, as circuit-tracer's transcoder set (the layout
    `load_transcoders_from_cache` reads: config.yaml and layer_{i}.safetensors)."""
    import yaml

    if not transcoders or not all(isinstance(t, Dictionary) for t in transcoders):
        raise TypeError("format='circuit-tracer' saves a list of hooked.sae transcoders, layer i at index i")
    first = transcoders[0].cfg
    points = set()
    for layer, transcoder in enumerate(transcoders):
        _check_writable(transcoder, layer, first)
        names = [_BLOCK.match(to_transformer_lens(name)) for name in (transcoder.hook_name, transcoder.hook_name_out)]
        if not all(match and int(match.group(1)) == layer for match in names):
            raise ValueError(
                f"{transcoder!r} is at index {layer} but reads or writes another layer's point; circuit-tracer's set"
                " holds the transcoder of layer i at index i, at blocks.i.<point>"
            )
        points.add((names[0].group(2), names[1].group(2)))
    if len(points) != 1:
        raise ValueError(f"the transcoders read and write different points ({sorted(points)}); a set names one pair")
    directory.mkdir(parents=True, exist_ok=True)
    for layer, transcoder in enumerate(transcoders):
        W_enc, W_dec, b_enc = transcoder.W_enc, transcoder.W_dec, transcoder.b_enc
        if transcoder.cfg.rescale_acts_by_decoder_norm:  # fold the ranking by contribution into the weights
            norms = W_dec.norm(dim=-1).clamp(min=1e-8)
            W_enc, W_dec, b_enc = W_enc * norms, W_dec / norms[:, None], b_enc * norms
        tensors = {"W_enc": W_enc.T, "W_dec": W_dec, "b_enc": b_enc, "b_dec": transcoder.b_dec}
        for name in transcoder.declaration.parameters:
            tensors.setdefault(KEYS.get(name, name), getattr(transcoder, name))
        if transcoder.W_skip is not None:
            tensors["W_skip"] = transcoder.W_skip
        write_safetensors(tensors, directory / f"layer_{layer}.safetensors")
    ((hook_in, hook_out),) = points
    kept = {key: value for key, value in first.metadata.items() if key in ("scan", "model_name") and _plain(value)}
    config = {"model_kind": "transcoder_set", "feature_input_hook": hook_in, "feature_output_hook": hook_out}
    config |= {"scan": directory.name} | kept
    declaration = first.declaration
    if "threshold" not in declaration.parameters:  # circuit-tracer reads a JumpReLU's threshold from the weights
        config["activation"] = declaration.circuit_tracer
    if declaration.k is not None:
        config["k"] = first.k
        warnings.warn(
            "a TopK transcoder set: circuit-tracer 0.5.0 reads activation/k from config.yaml when it loads a set by its"
            " config (utils/hf_utils.py load_transcoders), but its local-folder loader (utils/caching.py"
            " load_transcoders_from_cache) drops them and would run the set without TopK (docs/saes.md)",
            stacklevel=4,
        )
    (directory / CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    return directory


def _check_writable(transcoder: Dictionary, layer: int, first: DictionaryConfig) -> None:
    """Refuse a dictionary circuit-tracer's SingleLayerTranscoder cannot hold, naming each reason."""
    cfg = transcoder.cfg
    known = ", ".join(architectures.circuit_tracer_names())
    problems = [
        what
        for what, bad in (
            ("it is an SAE, not a transcoder", not cfg.is_transcoder),
            (f"architecture {cfg.architecture} (circuit-tracer has {known})", cfg.declaration.circuit_tracer is None),
            (f"run-time normalisation {cfg.normalize_activations}", cfg.normalize_activations != "none"),
            ("a hook_z input", cfg.reshape_activations != "none"),
            (f"d_in {cfg.d_in} != d_out {cfg.d_out}", cfg.d_in != cfg.d_out),
            ("another architecture or k than index 0's", (cfg.architecture, cfg.k) != (first.architecture, first.k)),
        )
        if bad
    ]
    if problems:
        raise ValueError(f"{transcoder!r} (index {layer}) cannot be a circuit-tracer transcoder: {'; '.join(problems)}")


def _plain(value) -> bool:
    return isinstance(value, str | int | float | bool)
