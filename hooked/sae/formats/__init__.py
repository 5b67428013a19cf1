"""`hooked.sae.load` and `hooked.sae.save`: every common dictionary format into one in-memory model
(`hooked.sae.Dictionary`) and back. One small module per format, each following one protocol (`Format`: its
NAME, FILES, LOOKS_FOR, `detect`, `read`, and `write` where it writes), all listed once in `FORMATS`, which `load`,
`save` and the hub read: a new format is a module and an entry there (docs/adding-a-format.md).

| module | files |
|---|---|
| `saelens` | SAELens 6.54: `cfg.json` + `sae_weights.safetensors` (and SAELens SAE objects: `from_saelens`) |
| `gemma_scope` | Gemma Scope's `params.npz`, Gemma Scope 2's `params.safetensors` |
| `sparsify` | eai-sparsify 1.3: `cfg.json` + `sae.safetensors` |
| `circuit_tracer` | circuit-tracer: `config.yaml` + `layer_{i}.safetensors` (a set), or a CLT (`circuit_tracer_clt`) |
| `hub` | any of these on the Hugging Face hub: `hf://<owner>/<repo>/<path>`, only the dictionary's files fetched |

A directory of per-layer SAELens directories `layer_0/`, `layer_1/`, ... is a set (a transcoder per layer): it loads
as a list, layer i at index i, and `save` writes a list so. The dictionaries bundled with hooked's IOI models load by
name, `hooked.sae.load("hooked/ioi-gpt2/saes/transcoders")`, as `hooked.load` finds the models (`bundled_saes`).

Each reader checks the whole file against its config before anything is allocated (`layout.check`: every
tensor present with the shape the config implies, none left unexplained), then builds the dictionary once in
its final dtype and device and streams each tensor into its parameter, one at a time, through a small buffer
(hooked.weights' safetensors reader): loading a large dictionary needs its own size in memory, not twice it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary
from hooked.sae.formats import circuit_tracer, gemma_scope, hub, saelens, sparsify
from hooked.sae.formats.layout import dtype_name
from hooked.sae.formats.saelens import from_saelens
from hooked.weights import bundled_models, check_device


@runtime_checkable
class Format(Protocol):
    """What a format module defines (docs/adding-a-format.md); `load`, `save` and the hub read only this.

    `detect(path)` is given a directory, or a file the user named: a format stored in single files (Gemma Scope's)
    claims such a file itself; for a directory format, a file named in its FILES stands for its directory.
    `read(path, *, hook_name, hook_name_out, device, dtype, model)` returns a `Dictionary`, a list of them (layer i
    at index i) or a cross-layer transcoder; `device` is a str, `dtype` a name ('float32') or None for the file's.
    A reader that also names `norm_scaling_factor` or `overrides` (SAELens') is given them; any other refuses them.
    A module that writes has `write(dictionary, directory) -> directory` too: `save(format=NAME)`.
    """

    NAME: str  # save's format= and what errors call it
    FILES: tuple[str, ...]  # what a hub path fetches, fnmatch patterns relative to the dictionary's folder
    LOOKS_FOR: str  # what detect looks for, in words, for the error when no format claims a directory

    def detect(self, path: Path) -> bool: ...

    def read(self, path: Path, **kwargs) -> Dictionary | list[Dictionary] | nn.Module: ...


# Every format hooked.sae reads, each a module following `Format`: a new format is a module and an entry here.
# The order is only the order errors list them in: a directory two formats claim is refused, not given to the first.
FORMATS: list[Format] = [saelens, sparsify, gemma_scope, circuit_tracer]


def load(
    path: str | Path | None = None,
    sae_id: str | None = None,
    *,
    release: str | None = None,
    hook_name: str | None = None,
    hook_name_out: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    model: nn.Module | None = None,
    norm_scaling_factor: float | None = None,
    revision: str | None = None,
) -> Dictionary | list[Dictionary] | nn.Module:
    """A dictionary from its files, the format told by them: a SAELens directory, an eai-sparsify directory, a
    Gemma Scope params.npz / params.safetensors, or a circuit-tracer directory (a transcoder set: a list of
    dictionaries, layer i at index i; a cross-layer transcoder: hooked.sae.clt's). A directory of SAELens
    directories `layer_0/` ... `layer_{n-1}/` is a set too: a list, layer i at index i. A bundled dictionary loads
    by name (`bundled_saes()` lists them; docs/saes.md, "Bundled dictionaries"). A path that is not local is a path
    on the Hugging Face hub, `hf://<owner>/<repo>/<path in the repo>` (`hf://` optional; `revision=` or
    `?revision=` picks a branch, tag or commit): its dictionary's files alone are fetched into the hub's cache, or
    found there offline (hooked.sae.formats.hub).

        sae = hooked.sae.load("path/to/saelens_dir")
        gs = hooked.sae.load("params.npz", hook_name="blocks.3.hook_resid_post")
        transcoders = hooked.sae.load("path/to/circuit_tracer_dir", model=model)
        transcoders = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders")  # bundled: 4 transcoders, layer order
        sae = hooked.sae.load("hf://jbloom/GPT2-Small-SAEs-Reformatted/blocks.8.hook_resid_pre")  # SAELens' files
        sae = hooked.sae.load("gpt2-small-res-jb", "blocks.8.hook_resid_pre")  # the same, by release and id

    `sae_id`: `path` (or `release=`, SAELens' keyword) is then a SAELens release and `sae_id` one of its SAEs, as
    SAELens' `SAE.from_pretrained(release, sae_id)` takes them; both are looked up in SAELens' registry of releases,
    which needs SAELens installed (its `pretrained_saes.yaml` is read as a file), and the SAE loads from its hub
    path.

    `hook_name` / `hook_name_out` override (or, where the files do not say, give) the points the dictionary reads
    and writes, by hooked's names. With `model`, every name is checked to be one of its hook points and every
    width to match (before the weights are read), and the dictionary takes the model's dtype and device unless
    `dtype` / `device` say otherwise; without one, `dtype` is the file's and `device` the CPU.
    `norm_scaling_factor`: the input scale of a SAELens dictionary trained with
    `normalize_activations="expected_average_only_in"`, where its directory does not keep it.
    """
    if release is not None:
        if path is not None:
            raise ValueError(f"load({path!r}, release={release!r}): give the release once, as path or as release=")
        if sae_id is None:
            raise ValueError(f"release={release!r} needs sae_id=, the SAE of the release to load (SAELens' sae_id)")
        path = release
    if path is None:
        raise TypeError("load() needs what to load: a path, a hub path, a bundled name, or a release and sae_id")
    registry = {}
    if sae_id is not None:  # a SAELens release and one of its SAEs: its hub path (revision=, if given, of its repo)
        path, registry = hub.release_path(str(path), sae_id)
    loaded = _read(
        path,
        hook_name=hook_name,
        hook_name_out=hook_name_out,
        device=device,
        dtype=dtype,
        model=model,
        norm_scaling_factor=norm_scaling_factor,
        revision=revision,
    )
    if registry and isinstance(loaded, Dictionary):  # what SAELens' from_pretrained records besides (neuronpedia_id)
        loaded.cfg.metadata.update(registry)
    for module in loaded if isinstance(loaded, list) else [loaded]:
        module.loaded_from = str(path)  # as given: an attribution graph's scan where the files name none
    return loaded


def _read(path, *, hook_name, hook_name_out, device, dtype, model, norm_scaling_factor, revision):
    """`load` of a local or hub path (a release already turned into its hub path)."""
    overrides, factor = ({}, None)
    if not _local(path):  # a hub path: what SAELens' registry adds to some releases' files (hub.RELEASE_FACTS)
        overrides, factor = hub.release_facts(str(path), revision)
    if factor is not None and norm_scaling_factor is not None and factor != norm_scaling_factor:
        raise ValueError(
            f"norm_scaling_factor={norm_scaling_factor} but SAELens' registry gives {path} the factor {factor}; leave"
            " it out to use the registry's"
        )
    norm_scaling_factor = factor if norm_scaling_factor is None else norm_scaling_factor
    path = resolve(path, revision)
    device = str(device if device is not None else model.device if model is not None else "cpu")
    check_device(device)
    if dtype is None and model is not None:
        dtype = model.dtype
    dtype = dtype_name(dtype) if dtype is not None else None
    found, place = locate(path)
    # what only some formats read (SAELens'): passed to a reader whose signature names it, refused by any other
    extras = {"norm_scaling_factor": norm_scaling_factor, "overrides": overrides or None}
    taken = inspect.signature(found.read).parameters
    for keyword, value in extras.items():
        if value is not None and keyword not in taken:
            raise ValueError(_NOT_READ[keyword].format(place=place))
    return found.read(
        place,
        hook_name=hook_name,
        hook_name_out=hook_name_out,
        device=device,
        dtype=dtype,
        model=model,
        **{keyword: value for keyword, value in extras.items() if value is not None},
    )


_NOT_READ = {
    "norm_scaling_factor": "norm_scaling_factor is for SAELens dictionaries; {place} is not one",
    "overrides": "{place}: SAELens' registry overrides its cfg.json, but it holds no SAELens dictionary",
}


class SAE:
    """SAELens 6.54's loaders under their own names, so SAELens code runs as written: `SAE.from_pretrained(release,
    sae_id)` and `SAE.load_from_disk(path)` each return a `hooked.sae.Dictionary` (`load` does the work). There is
    no SAE class to build or subclass here: a dictionary of any architecture is a `Dictionary`."""

    def __new__(cls, *args, **kwargs):
        raise TypeError(
            "hooked.sae.SAE only loads: SAE.from_pretrained(release, sae_id) and SAE.load_from_disk(path) return a"
            " hooked.sae.Dictionary; to build one, hooked.sae.Dictionary(hooked.sae.DictionaryConfig(...))"
        )

    @staticmethod
    def from_pretrained(
        release: str, sae_id: str, device: str = "cpu", dtype: str = "float32", fold_W_dec_norm: bool = False
    ) -> Dictionary:
        """SAELens' `SAE.from_pretrained`: `load(release, sae_id)` in float32 unless `dtype` says otherwise, as
        SAELens; `fold_W_dec_norm=True` folds the decoder norms after loading (`Dictionary.fold_W_dec_norm`)."""
        return _folded(load(release, sae_id, device=device, dtype=dtype), fold_W_dec_norm)

    @staticmethod
    def load_from_disk(
        path: str | Path, device: str = "cpu", dtype: str | None = None, fold_W_dec_norm: bool = False
    ) -> Dictionary:
        """SAELens' `SAE.load_from_disk`: `load(path)`, in the file's dtype unless `dtype` says otherwise."""
        return _folded(load(path, device=device, dtype=dtype), fold_W_dec_norm)


def _folded(dictionary, fold: bool):
    if fold:
        if not isinstance(dictionary, Dictionary):
            raise ValueError(f"fold_W_dec_norm=True folds one dictionary; this loaded {type(dictionary).__name__}")
        dictionary.fold_W_dec_norm()
    return dictionary


def save(
    dictionary: Dictionary | CrossLayerTranscoder | Sequence[Dictionary], path: str | Path, format: str = "saelens"
) -> Path:
    """Write `dictionary` to the directory `path`: `format="saelens"` as SAELens 6.54's `SAE.save_model` does
    (`sae_lens.SAE.load_from_disk(path)` reads it back and computes the same; a list, layer i at index i, as one
    such directory per layer, `path/layer_{i}/`), `format="circuit-tracer"` a list of transcoders, layer i at index
    i, as circuit-tracer's transcoder set, or a `CrossLayerTranscoder` as its CLT folder. Returns the directory.

        hooked.sae.save(sae, "my_sae")
        hooked.sae.save(transcoders, "my_transcoders")  # my_transcoders/layer_0/, layer_1/, ...
        hooked.sae.save(transcoders, "my_transcoders", format="circuit-tracer")
    """
    writers = {found.NAME: found for found in FORMATS if hasattr(found, "write")}
    if format not in writers:
        raise ValueError(f"format={format!r}: hooked.sae.save writes {', '.join(repr(f) for f in writers)}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file; save writes a directory")
    return writers[format].write(dictionary, path)


def bundled_saes() -> dict[str, Path]:
    """The dictionaries bundled with hooked's IOI models, by the name `load` takes, each with its directory:
    {"hooked/ioi-gpt2/saes/transcoders": .../hooked/bundled/ioi-gpt2/saes/transcoders, ...} (docs/saes.md,
    "Bundled dictionaries"; trained by scripts/train_saes.py)."""
    found = {}
    for model, directory in bundled_models().items():
        saes = directory / "saes"
        for child in sorted(saes.iterdir()) if saes.is_dir() else ():
            if child.is_dir():
                found[f"{model}/saes/{child.name}"] = child
    return found


def _local(path: str | Path) -> bool:
    """Whether `resolve` reads `path` from this machine (a local path or a bundled name) rather than the hub."""
    name = str(path)
    if hub.is_hub_path(name):
        return False
    return Path(path).expanduser().exists() or name.startswith(("hooked/", ".", "~")) or Path(path).is_absolute()


def resolve(path: str | Path, revision: str | None = None) -> Path:
    """`path` itself where it exists, else a bundled dictionary's directory for its name
    (`hooked/<model>/saes/<name>`, or a layer of a set: `.../transcoders/layer_1`), else the local copy of the hub
    path it is (`hub.fetch`)."""
    name = str(path)
    if not _local(path):
        return hub.fetch(name, revision, files=dictionary_files())  # as hooked.load reads a model's hub id
    if revision is not None:
        raise ValueError(f"revision={revision!r} is for a path on the hub; {name} is a local path or a bundled name")
    given = Path(path).expanduser()
    if given.exists():
        return given
    for model, directory in bundled_models().items():
        prefix = f"{model}/saes/"
        if name.startswith(prefix) and (directory / "saes" / name.removeprefix(prefix)).exists():
            return directory / "saes" / name.removeprefix(prefix)
    if name.startswith("hooked/"):
        listed = ", ".join(bundled_saes()) or "none (this copy of hooked was installed without its package data)"
        raise FileNotFoundError(
            f"{name!r} is not a bundled dictionary nor a local path; the bundled ones are: {listed}"
        )
    raise FileNotFoundError(f"{given} does not exist; hooked.sae.load takes a dictionary's directory or file")


def locate(path: Path) -> tuple[Format, Path]:
    """The format that reads `path` (a local directory or file) and what it reads there; refused where no format
    claims it, or where two do (hooked.sae.load will not pick one)."""
    claims = [found for found in FORMATS if found.detect(path)]
    if path.is_file() and not claims:
        if any(path.name in found.FILES for found in FORMATS):  # a directory format's file: read its directory
            return locate(path.parent)
        raise ValueError(
            f"{path} is not a dictionary file hooked.sae reads on its own; give the directory that holds it (a"
            " circuit-tracer layer_{i}.safetensors: the set's directory, with its config.yaml)"
        )
    if not claims:
        raise FileNotFoundError(
            f"{path} holds no dictionary hooked.sae knows: it looks for "
            + "; ".join(found.LOOKS_FOR for found in FORMATS)
        )
    if len(claims) > 1:
        raise ValueError(
            f"{path} holds the files of {len(claims)} formats ("
            + "; ".join(found.LOOKS_FOR for found in claims)
            + "), so which dictionary it means is ambiguous: move each into a directory of its own"
            + (" (or give the file itself)" if path.is_dir() else "")
        )
    return claims[0], path


def dictionary_files() -> tuple[str, ...]:
    """Every format's files (fnmatch patterns, relative to a dictionary's folder): what a hub path fetches."""
    return tuple(dict.fromkeys(pattern for found in FORMATS for pattern in found.FILES))


__all__ = ["bundled_saes", "from_saelens", "load", "save"]
