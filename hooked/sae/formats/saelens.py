"""SAELens 6.54's directory format, read and written: `cfg.json` + `sae_weights.safetensors`, as `SAE.save_model`
writes it and `SAE.load_from_disk` reads it (SAELens 6.54 `saes/sae.py`, `saes/*_sae.py`, `saes/transcoder.py`,
`loading/pretrained_sae_loaders.py`); and SAELens SAE objects in memory (`from_saelens`). A set, one dictionary per
layer, is a directory of such directories, `layer_0/`, `layer_1/`, ...: read as a list, layer i at index i, and
written from one.

What the config means, and what the reader does with it:

- `architecture`: each declared architecture's SAELens names (`saelens` of hooked/sae/architectures.py): standard,
  gated, topk, jumprelu; transcoder, skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder (a `Dictionary`
  with `hook_name_out`, and `W_skip`); the training checkpoints of batchtopk and matryoshka_batchtopk, which SAELens
  saves for inference as jumprelu (threshold = the running `topk_threshold`, decoder norms folded into the encoder
  when `rescale_acts_by_decoder_norm`: `BatchTopKTrainingSAE.process_state_dict_for_saving_inference`); the same is
  done here on reading.
- `normalize_activations`: `constant_norm_rescale` and `layer_norm` run at run time (the dictionary does it);
  `expected_average_only_in` is a constant factor the training multiplied the input by. SAELens' trainer folds
  it into the weights before the final save (`SAETrainer.fit`, `fold_activation_norm_scaling_factor`, after which
  the saved config says `none`); an intermediate checkpoint keeps it in `activation_scaler.json`, and a
  pretrained release in `pretrained_saes.yaml`'s `norm_scaling_factor`. The reader folds the checkpoint's (or
  `norm_scaling_factor=`) and refuses a config that names the mode without a factor. `covariance_whitening`
  (mean and matrices in `activation_whitening.safetensors`) is folded the same way
  (`SAE.fold_activation_whitening`).
- `metadata.hook_name` / `hook_name_out` (TransformerLens names; Hugging Face module names for a
  `model_class_name` of AutoModelForCausalLM), `reshape_activations` (hook_z), `dtype`.
- `metadata.model_from_pretrained_kwargs`: SAELens trains on `HookedTransformer.from_pretrained_no_processing(
  **model_from_pretrained_kwargs)` (SAELens 6.54 `load_model.py`, and the warning `SAE.__init__` prints), so
  every TransformerLens processing flag is off unless the kwargs turn it on: that becomes `cfg.processing`.
  Without the key the processing is unknown (None).
- configs older than SAELens 6 (flat keys, `hook_point`, `activation_fn_str`) are upgraded as SAELens'
  `handle_pre_6_0_config` does; a `scaling_factor` tensor (the old finetuning scale of each feature's output)
  is folded into W_dec's rows.

Where SAELens' own classes disagree with this reading, the difference is one: SAELens normalises a transcoder's
input at run time but not its output (`Transcoder.decode`), so a transcoder with run-time normalisation is
refused here rather than run either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hooked.processing import FLAGS
from hooked.sae import architectures
from hooked.sae.architectures import STANDARD, TOPK
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.formats import sparsify
from hooked.sae.formats.files import InMemory, Safetensors, TensorSource, write_safetensors
from hooked.sae.formats.layout import Stored, build, check, dtype_name
from hooked.sae.formats.names import from_module_name, to_hooked, to_transformer_lens

NAME = "saelens"
CONFIG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
SCALER = "activation_scaler.json"  # SAELens' ACTIVATION_SCALER_CFG_FILENAME, written with every checkpoint
WHITENING = "activation_whitening.safetensors"
_OWN = (CONFIG, WEIGHTS, SCALER, WHITENING)
# one directory, or a set: one directory per layer, layer_0/, layer_1/, ... (fnmatch's `*` also crosses "/")
FILES = _OWN + tuple(f"layer_*/{name}" for name in _OWN)
LOOKS_FOR = "cfg.json + sae_weights.safetensors (SAELens) or SAELens directories layer_0/, layer_1/, ... (a set)"
LAYER_DIR = re.compile(r"^layer_(\d+)$")  # a set's per-layer directories
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
FORMAT_VERSION = "6.54.12"  # the SAELens version whose format `write` produces (SAELens reads the version)

_NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm", "covariance_whitening")


def detect(path: Path) -> bool:
    """Whether directory `path` holds a SAELens dictionary (cfg.json, unless eai-sparsify's, which has the same
    name: `sparsify.detect` tells them apart) or a set of them (layer_0/, layer_1/, ... each with its cfg.json)."""
    if not path.is_dir():
        return False
    if (path / CONFIG).is_file():
        return not sparsify.detect(path)
    return any(_is_layer(child) for child in path.iterdir())


def read(
    directory: Path,
    *,
    hook_name: str | None,
    hook_name_out: str | None,
    device: str,
    dtype: str | None,
    model=None,
    norm_scaling_factor: float | None = None,
    overrides: dict[str, Any] | None = None,
) -> Dictionary | list[Dictionary]:
    """The dictionary SAELens saved in `directory` (cfg.json + sae_weights.safetensors), or the set of them in its
    layer_{i}/ directories (a list, layer i at index i); `overrides` are merged into cfg.json's keys first, as
    SAELens merges a release's `config_overrides` (hooked.sae.formats.hub)."""
    options = {"device": device, "dtype": dtype, "model": model}
    options |= {"norm_scaling_factor": norm_scaling_factor, "overrides": overrides}
    if (directory / CONFIG).is_file():
        return _read_directory(directory, hook_name, hook_name_out, **options)
    if hook_name or hook_name_out:
        raise ValueError(
            f"{directory} is a set of per-layer dictionaries, each naming its own points; hook_name / hook_name_out"
            f" would give every layer the same one: load one layer ({directory / 'layer_0'}) to override its names"
        )
    return [_read_directory(layer, None, None, **options) for layer in _layers(directory)]


def _read_directory(
    directory: Path, hook_name: str | None, hook_name_out: str | None, *, norm_scaling_factor, overrides, **options
) -> Dictionary:
    """The one dictionary in `directory` (cfg.json + sae_weights.safetensors)."""
    config_file = directory / CONFIG
    if not (directory / WEIGHTS).exists():
        raise FileNotFoundError(
            f"{directory} has {CONFIG} but no {WEIGHTS}: a SAELens directory holds both (SAE.save_model writes"
            " them); copy the weights next to the config"
        )
    raw = _read_json(config_file) | dict(overrides or {})
    statistics = _statistics(directory, raw)
    with Safetensors(directory / WEIGHTS) as source:
        return from_config(
            raw,
            source,
            config_file=str(config_file),
            hook_name=hook_name,
            hook_name_out=hook_name_out,
            norm_scaling_factor=norm_scaling_factor,
            statistics=statistics,
            **options,
        )


def from_saelens(
    sae,
    *,
    hook_name: str | None = None,
    hook_name_out: str | None = None,
    norm_scaling_factor: float | None = None,
    model=None,
) -> Dictionary:
    """A SAELens SAE, transcoder or training SAE in memory as a `hooked` dictionary, on its device and dtype (a copy:
    the two share no tensor), with its `use_error_term`.

        dictionary = hooked.sae.from_saelens(sae_lens.SAE.load_from_disk(path))
    """
    raw = sae.cfg.to_dict()
    tensors = dict(sae.state_dict())
    source = InMemory(tensors, f"the {type(sae).__name__}'s state_dict")
    device = str(next(iter(tensors.values())).device)
    dictionary = from_config(
        raw,
        source,
        config_file=f"the {type(sae).__name__}'s cfg",
        hook_name=hook_name,
        hook_name_out=hook_name_out,
        device=device,
        dtype=None,
        model=model,
        norm_scaling_factor=norm_scaling_factor,
        statistics={},
        call="hooked.sae.from_saelens(sae",
    )
    dictionary.use_error_term = bool(
        getattr(sae, "use_error_term", False)
    )  # run_with_saes(use_error_term=None) reads it
    return dictionary


def from_config(
    raw: dict[str, Any],
    source: TensorSource,
    *,
    config_file: str,
    hook_name: str | None,
    hook_name_out: str | None,
    device: str,
    dtype: str | None,
    model,
    norm_scaling_factor: float | None,
    statistics: dict[str, Any],
    call: str = "hooked.sae.load(path",
) -> Dictionary:
    """A SAELens config (a cfg.json's contents) and its tensors -> the dictionary; everything checked first.
    `call`: how the caller's own call begins, for the fix an error names."""
    raw = upgrade(raw)
    architecture = raw.get("architecture", STANDARD.saelens.sae)
    known = architectures.saelens_names()
    if architecture not in known:
        raise ValueError(
            f"{config_file}: architecture {architecture!r} is not one hooked.sae reads; it reads"
            f" {', '.join(known)} (SAELens' abstopk, temporal and matching_pursuit have no hooked"
            " equivalent)"
        )
    declaration, transcoder, skip = known[architecture]
    runs = declaration.runs  # a training checkpoint's (batchtopk) is the dictionary it saves for inference
    checkpoint = declaration.saelens.running_threshold  # its one threshold's key
    metadata = dict(raw.get("metadata") or {})
    hook_in, hook_out = _hook_names(
        metadata, transcoder, architecture, config_file, hook_name, hook_name_out, model, call
    )
    for field in ("d_in", "d_sae"):
        if not isinstance(raw.get(field), int) or raw[field] <= 0:
            raise ValueError(f"{config_file}: {field} is {raw.get(field)!r}; it must be a positive int")
    normalize = raw.get("normalize_activations") or "none"
    factor = _normalization(normalize, architecture, transcoder, norm_scaling_factor, statistics, config_file)
    rescale = bool(raw.get("rescale_acts_by_decoder_norm", declaration.saelens.rescale_by_default))
    k = raw.get("k", runs.saelens.default_k) if runs.k is not None else None
    if runs.k is not None and (not isinstance(k, int) or isinstance(k, bool)):
        raise ValueError(f"{config_file}: k is {k!r}; a {runs.name} SAE keeps an int number of features")
    cfg = DictionaryConfig(
        d_in=raw["d_in"],
        d_sae=raw["d_sae"],
        hook_name=hook_in,
        architecture=runs.name,
        hook_name_out=hook_out,
        d_out=raw.get("d_out", raw["d_in"]) if transcoder else None,
        apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)) and not transcoder,
        normalize_activations=normalize if normalize in ("constant_norm_rescale", "layer_norm") else "none",
        rescale_acts_by_decoder_norm=rescale and runs.ranked,
        k=k,
        reshape_activations=raw.get("reshape_activations") or "none",
        dtype=dtype or dtype_name(raw.get("dtype", "float32"), f"{config_file}'s dtype"),
        device=device,
        processing=_processing(metadata),
        metadata=metadata,
    )
    keys = set(source.keys())
    layout = {name: Stored(name) for name in ("W_enc", "W_dec", "b_dec", *runs.parameters)}
    extra = {"scaling_factor", "finetuning_scaling_factor"} & keys
    if checkpoint is not None:  # its threshold is filled from the running one below
        if checkpoint not in keys:
            raise ValueError(f"{source.path} has no {checkpoint}, which a {architecture} checkpoint keeps")
        extra.add(checkpoint)
        del layout["threshold"]
    elif "threshold" in layout and "log_threshold" in keys:  # older JumpReLU checkpoints (JumpReLUTrainingSAE)
        layout["threshold"] = Stored("log_threshold")
    if skip:
        layout["W_skip"] = Stored("W_skip")
    check(cfg, source, layout, skip, config_file, extra, model=model)
    dictionary = build(cfg, source, layout, skip)
    _fold(dictionary, source, checkpoint, layout, extra, factor, rescale, statistics)
    return dictionary


@torch.no_grad()
def _fold(
    dictionary: Dictionary, source: TensorSource, checkpoint: str | None, layout, extra, factor, rescale, statistics
):
    """What SAELens does to the weights after loading or at the end of training, done to the read dictionary."""
    if layout.get("threshold") == Stored("log_threshold"):  # older JumpReLU checkpoints (JumpReLUTrainingSAE)
        dictionary.threshold.exp_()
    for key in extra & {"scaling_factor", "finetuning_scaling_factor"}:  # pre-6 decode: (acts * scale) @ W_dec
        dictionary.W_dec.mul_(source.read(key, dictionary.dtype, dictionary.device)[:, None])
    if factor is not None:
        dictionary.fold_scaling_factor(factor)
    if checkpoint is not None:  # BatchTopKTrainingSAE: fold the factor, then save for inference
        threshold = source.read(checkpoint, torch.float64).item()
        if factor is not None and rescale:  # the threshold is in units of pre * ||W_dec row||
            threshold /= factor
        if rescale:
            fold_decoder_norms(dictionary)
        dictionary.threshold.fill_(threshold)
    if "whitening" in statistics:
        _fold_whitening(dictionary, **statistics["whitening"])


def _normalization(
    normalize: str, architecture: str, transcoder: bool, given: float | None, statistics, config_file: str
) -> float | None:
    """Refuse a normalisation hooked cannot run or fold; the input scale to fold (expected_average_only_in)."""
    if normalize not in _NORMALIZATIONS:
        raise ValueError(
            f"{config_file}: normalize_activations {normalize!r} is not one of {', '.join(_NORMALIZATIONS)}"
        )
    if normalize == "covariance_whitening" and "whitening" not in statistics:
        raise ValueError(
            f"{config_file}: normalize_activations is 'covariance_whitening' but there is no {WHITENING} beside it"
            " (SAELens folds the whitening into the weights at the end of training; a checkpoint keeps it there)."
            " Copy the checkpoint's whitening file next to the config, or load the final save"
        )
    if transcoder and normalize in ("constant_norm_rescale", "layer_norm", "covariance_whitening"):
        raise ValueError(
            f"{config_file}: a {architecture} with normalize_activations={normalize!r}: SAELens normalises a"
            " transcoder's input but not its output (Transcoder.decode), which hooked.sae does not reproduce;"
            " retrain it with normalize_activations='none' or 'expected_average_only_in'"
        )
    if normalize != "expected_average_only_in":
        if given is not None:
            raise ValueError(
                f"norm_scaling_factor={given} is given, but {config_file} says normalize_activations={normalize!r};"
                " the factor is for a dictionary trained with 'expected_average_only_in' (leave it out)"
            )
        return None
    factor = given if given is not None else statistics.get("scaling_factor")
    if factor is None:
        raise ValueError(
            f"{config_file}: normalize_activations is 'expected_average_only_in', so the dictionary was trained on"
            " inputs times a constant factor, and no factor is known: there is no activation_scaler.json beside it."
            " Pass the factor: hooked.sae.load(path, norm_scaling_factor=...) (a SAELens release lists it as"
            " norm_scaling_factor in pretrained_saes.yaml)"
        )
    return float(factor)


def upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """A config older than SAELens 6 in 6's shape (SAELens 6.54 `handle_pre_6_0_config`): renamed keys, defaults,
    a topk activation as the topk architecture, a boolean normalize_activations, the metadata gathered."""
    version = raw.get("sae_lens_version") or (raw.get("metadata") or {}).get("sae_lens_version")
    if version and str(version).split(".")[0].isdigit() and int(str(version).split(".")[0]) >= 6:
        return raw
    renames = {
        "hook_point": "hook_name",
        "hook_point_head_index": "hook_head_index",
        "activation_fn_str": "activation_fn",
    }
    old = {renames.get(key, key): value for key, value in raw.items()}
    new = dict(old)
    new.setdefault("apply_b_dec_to_input", True)
    new.setdefault("architecture", STANDARD.saelens.sae)
    if old.get("activation_fn") == "topk" and (old.get("activation_fn_kwargs") or {}).get("k") is not None:
        new["architecture"], new["k"] = TOPK.saelens.sae, old["activation_fn_kwargs"]["k"]
    if isinstance(new.get("normalize_activations"), bool):
        new["normalize_activations"] = "expected_average_only_in" if new["normalize_activations"] else "none"
    new.setdefault("reshape_activations", "hook_z" if str(new.get("hook_name", "")).endswith("hook_z") else "none")
    metadata_keys = (
        "model_name",
        "hook_name",
        "model_class_name",
        "hook_head_index",
        "model_from_pretrained_kwargs",
        "prepend_bos",
        "context_size",
        "dataset_path",
        "hook_name_out",
    )
    new["metadata"] = {key: old[key] for key in metadata_keys if key in old} | dict(old.get("metadata") or {})
    return new


# ----------------------------------------------------------------------------- what the config records
def _hook_names(metadata, transcoder, architecture, config_file, hook_name, hook_name_out, model, call):
    """The hooked names of the points the dictionary reads and writes: the arguments, else the metadata's (`call`:
    how the user's call begins, `hooked.sae.load(path` or `hooked.sae.from_saelens(sae`, to name the fix)."""
    if metadata.get("hook_head_index") is not None:
        raise ValueError(
            f"{config_file}: this dictionary reads head {metadata['hook_head_index']} of {metadata.get('hook_name')}"
            " alone (hook_head_index); hooked.sae splices dictionaries over a whole hook point"
        )
    if hook_name_out is not None and not transcoder:
        raise ValueError(
            f"hook_name_out={hook_name_out!r}, but {config_file} is a SAELens {architecture} SAE, which rewrites the"
            " point it reads; hook_name_out is a transcoder's output point (leave it out)"
        )
    proxy = metadata.get("model_class_name") == "AutoModelForCausalLM"  # SAELens' HookedProxyLM: module names
    names = []
    for given, field in ((hook_name, "hook_name"), (hook_name_out, "hook_name_out")):
        if field == "hook_name_out" and not transcoder:
            names.append(None)
            continue
        name = given if given is not None else metadata.get(field)
        if name is None:
            raise ValueError(
                f"{config_file} records no {field} (metadata.{field}); pass it: {call},"
                f" {field}='blocks.3.{'hook_mlp_out' if field == 'hook_name_out' else 'hook_resid_post'}')"
            )
        if given is None and proxy:
            name = (from_module_name(name, transcoder=False) or (name, None))[0]
        names.append(to_hooked(name, model))
    return names[0], names[1]


def _processing(metadata: dict[str, Any]) -> dict[str, bool] | None:
    """The TransformerLens processing of the model the dictionary was trained on, as hooked.processing's flags."""
    if metadata.get("model_class_name") == "AutoModelForCausalLM":  # a Hugging Face model, never processed
        return dict.fromkeys(FLAGS, False)
    kwargs = metadata.get("model_from_pretrained_kwargs")
    if kwargs is None or not isinstance(kwargs, dict):
        return None
    return {flag: bool(kwargs.get(flag, False)) for flag in FLAGS}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); is it the config SAELens wrote?") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a JSON {type(raw).__name__}, not the object of a SAELens config")
    return raw


def _statistics(directory: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The input statistics a SAELens training checkpoint keeps beside the weights (ActivationScaler.save)."""
    statistics: dict[str, Any] = {}
    scaler = directory / SCALER
    if scaler.exists():
        factor = _read_json(scaler).get("scaling_factor")
        if factor is not None:
            statistics["scaling_factor"] = float(factor)
    if (directory / WHITENING).exists() and (raw.get("normalize_activations") == "covariance_whitening"):
        with Safetensors(directory / WHITENING) as file:
            statistics["whitening"] = {
                "mean": file.read("mean", torch.float64),
                "matrix": file.read("matrix", torch.float64),
                "inverse": file.read("inverse_matrix", torch.float64),
            }
    return statistics


# ----------------------------------------------------------------------------- folds into the weights
@torch.no_grad()
def fold_decoder_norms(dictionary: Dictionary) -> None:
    """Scale each feature so its decoder row has norm 1, the encoder taking the norm (SAELens' `_fold_norm_topk`):
    a topk dictionary that ranks by contribution (`rescale_acts_by_decoder_norm`) computes the same without it."""
    norms = dictionary.W_dec.norm(dim=-1).clamp(min=1e-8)  # SAE.get_W_dec_norm
    dictionary.W_dec.div_(norms[:, None])
    dictionary.W_enc.mul_(norms)
    dictionary.b_enc.mul_(norms)
    dictionary.cfg.rescale_acts_by_decoder_norm = False


@torch.no_grad()
def _fold_whitening(dictionary: Dictionary, mean, matrix, inverse) -> None:
    """SAELens' `SAE.fold_activation_whitening` (with the gated and topk overrides): the dictionary read
    z = (x - mean) @ matrix and wrote x = z @ inverse + mean; both maps move into its weights."""
    if dictionary.cfg.rescale_acts_by_decoder_norm:  # TopKSAE: unwhitening would change the ranking
        fold_decoder_norms(dictionary)
    dtype = torch.promote_types(dictionary.dtype, matrix.dtype)
    mean, matrix, inverse = (t.to(dictionary.device, dtype) for t in (mean, matrix, inverse))
    dictionary.W_enc.copy_(matrix @ dictionary.W_enc.to(dtype))
    if not dictionary.cfg.apply_b_dec_to_input:
        shift = (mean @ dictionary.W_enc.to(dtype)).to(dictionary.dtype)
        dictionary.declaration.shift(dictionary, shift)
    dictionary.W_dec.copy_(dictionary.W_dec.to(dtype) @ inverse)
    dictionary.b_dec.copy_(dictionary.b_dec.to(dtype) @ inverse + mean)


# ----------------------------------------------------------------------------- writing
def _layers(directory: Path) -> list[Path]:
    """A set's per-layer directories, layer 0 first; refused unless they are layer_0 ... layer_{n-1}."""
    found = {int(LAYER_DIR.match(child.name).group(1)): child for child in directory.iterdir() if _is_layer(child)}
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise ValueError(
            f"{directory} holds {', '.join(f'layer_{i}' for i in sorted(found))} but not layer_{missing[0]}: a set of"
            " per-layer directories is layer_0 ... layer_{n-1}, layer i at index i; load the layers one by one"
        )
    return [found[i] for i in range(len(found))]


def _is_layer(path: Path) -> bool:
    return path.is_dir() and LAYER_DIR.match(path.name) is not None and (path / CONFIG).exists()


def write(dictionary: Dictionary | Sequence[Dictionary], directory: Path) -> Path:
    """Save `dictionary` as SAELens 6.54's `SAE.save_model` does, so `SAE.load_from_disk(directory)` reads it; a
    list, layer i at index i, as one such directory per layer, `directory/layer_{i}/`."""
    if isinstance(dictionary, Sequence) and not isinstance(dictionary, str):
        return _write_layers(list(dictionary), directory)
    if not isinstance(dictionary, Dictionary):
        raise TypeError(
            f"format='saelens' saves a hooked.sae dictionary or a list of them (layer i at index i), not"
            f" {type(dictionary).__name__}"
        )
    return _write_directory(dictionary, directory)


def _write_layers(dictionaries: list, directory: Path) -> Path:
    """A list in SAELens' format: `directory/layer_{i}/` for dictionary i, which must read and write layer i."""
    if not dictionaries or not all(isinstance(d, Dictionary) for d in dictionaries):
        raise TypeError("format='saelens' saves a list of hooked.sae dictionaries, layer i at index i")
    for layer, d in enumerate(dictionaries):
        if any(
            (m := _BLOCK.match(name)) is None or int(m.group(1)) != layer for name in (d.hook_name, d.hook_name_out)
        ):
            raise ValueError(
                f"{d!r} is at index {layer} but reads or writes another layer's point; a list is saved layer i at"
                f" index i (path/layer_{{i}}/), so it loads back in that order; save the others one by one"
            )
    for layer, d in enumerate(dictionaries):
        _write_directory(d, directory / f"layer_{layer}")
    return directory


def _write_directory(dictionary: Dictionary, directory: Path) -> Path:
    """Save `dictionary` as SAELens 6.54's `SAE.save_model` does, so `SAE.load_from_disk(directory)` reads it."""
    cfg = dictionary.cfg
    skip = dictionary.W_skip is not None
    names = cfg.declaration.saelens or architectures.SAELensNames()
    if cfg.is_transcoder:
        architecture = names.skip_transcoder if skip else names.transcoder
        if architecture is None:
            with_skip = " with a skip connection" if skip else ""
            raise ValueError(
                f"{dictionary!r}: SAELens 6.54 has no {cfg.architecture} transcoder{with_skip} to save it as"
            )
        if cfg.normalize_activations != "none":
            raise ValueError(
                f"{dictionary!r} normalises its input at run time; SAELens' transcoders would not undo it on the"
                " output (Transcoder.decode), so it cannot be saved for SAELens"
            )
    elif skip:
        raise ValueError(f"{dictionary!r} has a skip connection; SAELens 6.54 has SAEs only without one")
    else:
        architecture = names.sae
        if architecture is None:
            raise ValueError(f"{dictionary!r}: SAELens 6.54 has no {cfg.architecture} SAE to save it as")
    metadata = {key: value for key, value in cfg.metadata.items() if key not in ("hook_name", "hook_name_out")}
    metadata["hook_name"] = to_transformer_lens(cfg.hook_name)
    if cfg.is_transcoder:
        metadata["hook_name_out"] = to_transformer_lens(cfg.hook_name_out)
    kwargs = {k: v for k, v in (metadata.get("model_from_pretrained_kwargs") or {}).items() if k not in FLAGS}
    if cfg.processing is not None:
        metadata["model_from_pretrained_kwargs"] = kwargs | {flag: True for flag, on in cfg.processing.items() if on}
    metadata["sae_lens_version"] = FORMAT_VERSION
    config: dict[str, Any] = {
        "architecture": architecture,
        "d_in": cfg.d_in,
        "d_sae": cfg.d_sae,
        "dtype": dtype_name(dictionary.dtype),
        "device": str(dictionary.device),
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input and not cfg.is_transcoder,
        "normalize_activations": cfg.normalize_activations,
        "reshape_activations": cfg.reshape_activations,
        "metadata": metadata,
    }
    if cfg.declaration.k is not None:
        config |= {"k": cfg.k, "rescale_acts_by_decoder_norm": cfg.rescale_acts_by_decoder_norm}
    if cfg.is_transcoder:
        config["d_out"] = cfg.d_out
    tensors = {name: parameter for name, parameter in dictionary.named_parameters()}
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, directory / WEIGHTS)
    (directory / CONFIG).write_text(json.dumps(config, indent=2, default=str))
    return directory
