"""circuit-tracer 0.5.0's transcoder folders: a cross-layer transcoder read (`load_circuit_tracer_clt`), a CLT
or a per-layer transcoder set written (`save_circuit_tracer`), so that circuit-tracer's own loaders read them
(`transcoder/cross_layer_transcoder.py` `load_clt`, `transcoder/single_layer_transcoder.py`
`load_transcoder_set`, `utils/caching.py` `load_transcoders_from_cache`).

A folder holds `config.yaml` (`model_kind: cross_layer_transcoder | transcoder_set`, `feature_input_hook`,
`feature_output_hook`: point names under `blocks.{layer}.`, in TransformerLens' spelling) and:

- a CLT: `W_enc_{i}.safetensors` with `W_enc_{i}` [d_sae, d_in] (F.linear's layout), `b_enc_{i}`, `b_dec_{i}`
  (the bias of output i) and, for JumpReLU, `threshold_{i}`; `W_dec_{i}.safetensors` with `W_dec_{i}` [d_sae,
  n_layers - i, d_out]. circuit-tracer 0.5.0 neither writes nor reads a CLT's skip (its `to_safetensors` leaves
  it out); hooked writes it as `W_skip_{i}` [d_in, d_out] (used as x @ W_skip) beside the encoder, and reads it.
- a transcoder set: `layer_{i}.safetensors` with `W_enc` and `W_dec` [d_sae, d_model], `b_enc`, `b_dec`,
  `activation_function.threshold` for JumpReLU and an optional `W_skip` [d_model, d_model] (used as x @ W_skip.T,
  hooked's layout too).

Hook names: circuit-tracer names TransformerLens points, which hooked names the same (`hook_resid_mid`,
`mlp.hook_in`, the MLP's input after ln2, `hook_mlp_out`), except its `mlp.hook_out`, the MLP module's own output:
hooked's `hook_mlp_out`, or `hook_mlp_out_pre_norm` on a model with a norm after its MLP (Gemma 2 and 3, OLMo 2),
where it is given as `hook_name_out=`. A name with no equivalent is refused, naming the nearest.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from hooked.sae import architectures
from hooked.sae.architectures import JUMPRELU, STANDARD
from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats.files import write_safetensors
from hooked.weights import SafetensorsFile

# circuit-tracer's points under blocks.{layer} (TransformerLens' names) -> hooked's
HOOK_NAMES = {
    "hook_resid_pre": "hook_resid_pre",
    "hook_resid_mid": "hook_resid_mid",
    "hook_resid_post": "hook_resid_post",
    "hook_attn_out": "hook_attn_out",
    "hook_mlp_in": "hook_mlp_in",
    "mlp.hook_in": "mlp.hook_in",
    "hook_mlp_out": "hook_mlp_out",
    "mlp.hook_out": "hook_mlp_out",  # the MLP module's output; where a norm follows it, hook_mlp_out_pre_norm
}
_WRITTEN_AS = {"hook_mlp_out_pre_norm": "mlp.hook_out"} | {hooked: hooked for hooked in HOOK_NAMES.values()}
# circuit-tracer's load_clt, when a folder has no config.yaml
DEFAULT_HOOKS = ("hook_resid_mid", "hook_mlp_out")


def hooked_name(name: str, field: str) -> str:
    """circuit-tracer's point `name` (under blocks.{layer}) as a hooked template: 'mlp.hook_in' ->
    'blocks.{layer}.mlp.hook_in'; a ValueError naming the nearest for a name with no equivalent."""
    if name not in HOOK_NAMES:
        nearest = difflib.get_close_matches(name, list(HOOK_NAMES), n=3, cutoff=0.4)
        hint = f" (the nearest: {', '.join(map(repr, nearest))})" if nearest else ""
        raise ValueError(
            f"config.yaml's {field} {name!r} has no equivalent hook point in hooked{hint}; circuit-tracer's names"
            f" are {', '.join(HOOK_NAMES)}. Name the point yourself: load_circuit_tracer_clt(path,"
            " hook_name='blocks.{layer}.mlp.hook_in', hook_name_out='blocks.{layer}.hook_mlp_out')"
        )
    return "blocks.{layer}." + HOOK_NAMES[name]


def circuit_tracer_name(template: str, what: str) -> str:
    """hooked's per-layer point, a template 'blocks.{layer}.X', as circuit-tracer names it under blocks.{layer}:
    'X' ('hook_mlp_out_pre_norm' -> 'mlp.hook_out')."""
    match = re.fullmatch(r"blocks\.\{layer\}\.(.+)", template)
    if match is None or match.group(1) not in _WRITTEN_AS:
        point = match.group(1) if match else template
        nearest = difflib.get_close_matches(point, list(_WRITTEN_AS), n=3, cutoff=0.4)
        hint = f" (the nearest: {', '.join(map(repr, nearest))})" if nearest else ""
        raise ValueError(
            f"{what} {template!r} is not a point circuit-tracer can name{hint}; it names blocks.{{layer}}.X with X one"
            f" of {', '.join(_WRITTEN_AS)}"
        )
    return _WRITTEN_AS[match.group(1)]


def _template(name: str) -> str:
    """A user's hook name for every layer, in hooked's spelling: a template with {layer}, or the point under
    blocks.{layer} ('mlp.hook_in')."""
    return name if "{layer}" in name else f"blocks.{{layer}}.{name}"


# ----------------------------------------------------------------------------- reading a CLT
def load_circuit_tracer_clt(
    path: str | Path,
    *,
    hook_name: str | None = None,
    hook_name_out: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    lazy_decoder: bool = True,
) -> CrossLayerTranscoder:
    """The cross-layer transcoder in circuit-tracer folder `path` (module docstring), in `dtype` (default: as
    stored) on `device` (default: the CPU). `hook_name` / `hook_name_out` replace config.yaml's points, in hooked's
    names ('blocks.{layer}.mlp.hook_in' or 'mlp.hook_in'). With `lazy_decoder` each layer's decoder, most of the
    weights, is read when first used (`clt.decoder(layer)`), as circuit-tracer's `lazy_decoder`.

        clt = load_circuit_tracer_clt("path/to/clt")
        logits = model.run_with_saes(tokens, saes=[clt.to(model.dtype)])
    """
    folder = Path(path)
    config = _read_config(folder)
    if config.get("model_kind", "cross_layer_transcoder") != "cross_layer_transcoder":
        raise ValueError(
            f"{folder}/config.yaml says model_kind: {config['model_kind']}, not cross_layer_transcoder;"
            " hooked.sae.load(path) reads a transcoder set"
        )
    n_layers = _layer_count(folder, "W_enc_{i}.safetensors", "W_dec_{i}.safetensors")
    read = config.get("feature_input_hook", DEFAULT_HOOKS[0])
    write = config.get("feature_output_hook", DEFAULT_HOOKS[1])
    read = _template(hook_name) if hook_name else hooked_name(read, "feature_input_hook")
    write = _template(hook_name_out) if hook_name_out else hooked_name(write, "feature_output_hook")
    shapes = _encoder_shapes(folder, n_layers)
    (d_sae, d_in), d_out = shapes["W_enc"], shapes["b_dec"][0]
    decoders = [_DecoderSource.checked(folder, layer, (d_sae, n_layers - layer, d_out)) for layer in range(n_layers)]
    with SafetensorsFile(folder / "W_enc_0.safetensors") as file:
        dtype = dtype or file.dtype("W_enc_0")
    device = torch.device(device if device is not None else "cpu")

    cfg = CLTConfig(
        n_layers=n_layers,
        d_in=d_in,
        d_sae=d_sae,
        d_out=d_out,
        architecture=(JUMPRELU if "threshold" in shapes else STANDARD).name,  # circuit-tracer's rule, by the weights
        hook_name=read,
        hook_name_out=write,
        dtype=str(dtype).removeprefix("torch."),
        device="meta",  # built without memory: every parameter is replaced by what the files hold
        metadata={"format": "circuit-tracer", "source": str(folder)},
    )
    clt = CrossLayerTranscoder(cfg, skip="W_skip" in shapes)
    cfg.device = str(device)
    for layer, module in enumerate(clt.layers):
        with SafetensorsFile(folder / f"W_enc_{layer}.safetensors") as file:
            for name in shapes:
                value = _read(file, f"{name}_{layer}", dtype, device)
                setattr(module, name, nn.Parameter(value.T if name == "W_enc" else value))  # W_enc: [d_in, d_sae]
        module.W_dec, module.decoder_source = None, decoders[layer]
        if not lazy_decoder:
            clt.decoder(layer)
    return clt


def _encoder_shapes(folder: Path, n_layers: int) -> dict[str, tuple[int, ...]]:
    """The shapes every layer's encoder file holds, by hooked's names (W_enc, b_enc, b_dec, threshold, W_skip;
    the keys are `{name}_{layer}`), checked to be one transcoder's."""
    layers = []
    for layer in range(n_layers):
        with SafetensorsFile(folder / f"W_enc_{layer}.safetensors") as file:
            shapes = {}
            for name in ("W_enc", "b_enc", "b_dec", "threshold", "W_skip"):
                if f"{name}_{layer}" in file.keys():
                    shapes[name] = tuple(file.shape(f"{name}_{layer}"))
                elif name in ("W_enc", "b_enc", "b_dec"):
                    raise ValueError(f"{file.path} has no {name}_{layer}; a circuit-tracer CLT's encoder file holds it")
            layers.append(shapes)
    (d_sae, d_in), (d_out,) = layers[0]["W_enc"], layers[0]["b_dec"]
    expected = {"W_enc": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_out,)}
    expected |= {"threshold": (d_sae,)} if "threshold" in layers[0] else {}
    expected |= {"W_skip": (d_in, d_out)} if "W_skip" in layers[0] else {}
    for layer, shapes in enumerate(layers):
        if shapes != expected:
            raise ValueError(
                f"{folder}/W_enc_{layer}.safetensors holds {_listed(shapes, layer)}, but layer 0 makes every layer's"
                f" {_listed(expected, layer)}; the folder mixes transcoders"
            )
    return expected


def _listed(shapes: dict[str, tuple[int, ...]], layer: int) -> str:
    return ", ".join(f"{name}_{layer} {list(shape)}" for name, shape in shapes.items())


@dataclasses.dataclass(frozen=True)
class _DecoderSource:
    """Reads one layer's decoder from its file when the CLT first uses it."""

    path: Path
    key: str

    @classmethod
    def checked(cls, folder: Path, layer: int, shape: tuple[int, ...]) -> _DecoderSource:
        """Layer `layer`'s decoder, its shape checked from the file's header now (nothing else is read)."""
        path, key = folder / f"W_dec_{layer}.safetensors", f"W_dec_{layer}"
        with SafetensorsFile(path) as file:
            have = tuple(file.shape(key)) if key in file.keys() else None
        if have != shape:
            raise ValueError(
                f"{path} holds {key} {list(have) if have else 'nowhere'}; this CLT's layer {layer} decodes [d_sae,"
                f" n_layers - {layer}, d_out] = {list(shape)}"
            )
        return cls(path, key)

    def __call__(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        with SafetensorsFile(self.path) as file:
            return _read(file, self.key, dtype, device)


def _read(file: SafetensorsFile, key: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    return file.read_into(key, torch.empty(file.shape(key), dtype=dtype, device=device))


def _read_config(folder: Path) -> dict:
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} is not a folder; a circuit-tracer CLT is a folder of W_enc_{{i}}.safetensors"
        )
    config_path = folder / "config.yaml"
    if not config_path.exists():
        return {}  # a bare folder of weights, as circuit-tracer's load_clt reads it (DEFAULT_HOOKS)
    import yaml  # PyYAML comes with huggingface_hub

    config = yaml.safe_load(config_path.read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a mapping of keys to values (model_kind, feature_input_hook, ...)")
    return config


def _layer_count(folder: Path, *patterns: str) -> int:
    """How many layers the folder's files cover: files `patterns[0]` for i = 0..n-1 with no gap, and each other
    pattern for every such i."""
    first = re.compile(re.escape(patterns[0]).replace(re.escape("{i}"), r"(\d+)"))
    found = sorted(int(match.group(1)) for p in folder.iterdir() if (match := first.fullmatch(p.name)))
    if not found:
        raise FileNotFoundError(f"{folder} has no {patterns[0].format(i=0)}: it is not a circuit-tracer transcoder")
    if found != list(range(len(found))):
        missing = sorted(set(range(found[-1] + 1)) - set(found))
        raise FileNotFoundError(f"{folder} has no {', '.join(patterns[0].format(i=i) for i in missing)}")
    for pattern in patterns[1:]:
        missing = [pattern.format(i=i) for i in found if not (folder / pattern.format(i=i)).exists()]
        if missing:
            raise FileNotFoundError(f"{folder} has no {', '.join(missing)}")
    return len(found)


# ----------------------------------------------------------------------------- writing
def save_circuit_tracer(obj: CrossLayerTranscoder | Sequence[Dictionary], path: str | Path) -> Path:
    """Write a cross-layer transcoder, or a transcoder set (one transcoder per layer, layer 0 first), as
    circuit-tracer's folder at `path` (module docstring); returns the folder.

        save_circuit_tracer(clt, "out/clt")               # circuit-tracer: load_clt("out/clt", ...)
        save_circuit_tracer([tc0, tc1, tc2], "out/set")   # load_transcoders_from_cache, load_transcoder_set
    """
    folder = Path(path)
    if isinstance(obj, CrossLayerTranscoder):
        files, config = _clt_files(obj)
    elif isinstance(obj, Sequence) and obj and all(isinstance(d, Dictionary) for d in obj):
        files, config = _set_files(list(obj))
    else:
        raise TypeError(
            "save_circuit_tracer writes a CrossLayerTranscoder or a list of transcoders (hooked.sae.Dictionary, one"
            f" per layer), not {type(obj).__name__}"
        )
    folder.mkdir(parents=True, exist_ok=True)
    stale = [
        p.name
        for p in folder.iterdir()
        if re.fullmatch(r"(W_enc_|W_dec_|layer_)\d+\.safetensors", p.name) and p.name not in files
    ]
    if stale:
        raise FileExistsError(
            f"{folder} holds {', '.join(sorted(stale))}, which this transcoder would not replace, so circuit-tracer"
            " would read them as more layers; save into an empty folder"
        )
    for name, tensors in files.items():
        write_safetensors(tensors, folder / name)
    (folder / "config.yaml").write_text("".join(f"{key}: {value}\n" for key, value in config.items()))
    return folder


def _clt_files(clt: CrossLayerTranscoder) -> tuple[dict[str, dict[str, Tensor]], dict[str, str]]:
    config = {
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": circuit_tracer_name(clt.cfg.hook_name, "hook_name"),
        "feature_output_hook": circuit_tracer_name(clt.cfg.hook_name_out, "hook_name_out"),
    }
    if clt.has_skip:
        warnings.warn(
            "circuit-tracer 0.5.0 does not read a CLT's skip connection (its load_clt builds none): hooked writes"
            " W_skip_{i} and reads it back, circuit-tracer will run this CLT without it",
            stacklevel=3,
        )
    files = {}
    for layer, module in enumerate(clt.layers):
        encoder = {"W_enc": module.W_enc.T, "b_enc": module.b_enc, "b_dec": module.b_dec}
        encoder |= {"threshold": module.threshold} if module.threshold is not None else {}
        encoder |= {"W_skip": module.W_skip} if module.W_skip is not None else {}
        files[f"W_enc_{layer}.safetensors"] = {f"{name}_{layer}": value for name, value in encoder.items()}
        files[f"W_dec_{layer}.safetensors"] = {f"W_dec_{layer}": clt.decoder(layer)}
    return files, config


def _set_files(transcoders: list[Dictionary]) -> tuple[dict[str, dict[str, Tensor]], dict[str, str]]:
    first = transcoders[0].cfg
    read = re.sub(r"^blocks\.\d+\.", "blocks.{layer}.", first.hook_name)
    write = re.sub(r"^blocks\.\d+\.", "blocks.{layer}.", first.hook_name_out or "")
    for layer, transcoder in enumerate(transcoders):
        problem = _not_in_a_set(transcoder.cfg, first, read.format(layer=layer), write.format(layer=layer))
        threshold = getattr(transcoder, "threshold", None)
        if problem is None and threshold is not None and bool((threshold < 0).any()):
            problem = "has a negative threshold, where circuit-tracer's JumpReLU, pre * (pre > threshold), differs"
        if problem is not None:
            raise ValueError(f"transcoder {layer} of the set, {transcoder!r}, {problem}")
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": circuit_tracer_name(read, "hook_name"),
        "feature_output_hook": circuit_tracer_name(write, "hook_name_out"),
    }
    files = {}
    for layer, transcoder in enumerate(transcoders):
        tensors = {"W_enc": transcoder.W_enc.T, "W_dec": transcoder.W_dec, "b_enc": transcoder.b_enc}
        tensors["b_dec"] = transcoder.b_dec
        if "threshold" in transcoder.declaration.parameters:
            tensors["activation_function.threshold"] = transcoder.threshold
        if transcoder.W_skip is not None:
            tensors["W_skip"] = transcoder.W_skip
        files[f"layer_{layer}.safetensors"] = tensors
    return files, config


def _not_in_a_set(c: DictionaryConfig, first: DictionaryConfig, read: str, write: str) -> str | None:
    """Why a transcoder with config `c` cannot be a layer of circuit-tracer's set whose layer 0 is `first` (the
    layer reading `read` and writing `write`), or None."""
    if not c.is_transcoder:
        return "is an SAE; a transcoder set holds transcoders (hook_name_out set)"
    if not c.declaration.cross_layer:  # what circuit-tracer tells apart by the weights alone, as for its CLTs
        return (
            f"is {c.architecture}; circuit-tracer 0.5.0's transcoders are relu or JumpReLU"
            f" ({', '.join(architectures.cross_layer())})"
        )
    if c.normalize_activations != "none" or c.rescale_acts_by_decoder_norm or c.reshape_activations != "none":
        return "normalises or reshapes its input, which circuit-tracer's transcoders do not"
    if c.d_in != c.d_out or (c.d_sae, c.d_in) != (first.d_sae, first.d_in):
        return (
            f"has d_in {c.d_in}, d_sae {c.d_sae}, d_out {c.d_out}; circuit-tracer's set has one d_model and one"
            f" d_sae ({first.d_in} and {first.d_sae} at layer 0)"
        )
    if (c.hook_name, c.hook_name_out) != (read, write):
        return (
            f"reads {c.hook_name} and writes {c.hook_name_out}; at its layer, the set's transcoder reads {read} and"
            f" writes {write}"
        )
    return None
