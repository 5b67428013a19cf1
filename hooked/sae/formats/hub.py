"""Dictionaries on the Hugging Face hub: a hub path fetched (or found in the cache) into local files.

A hub path names a repository and a place in it, as circuit-tracer's configs do (circuit-tracer 0.5.0,
`utils/hf_utils.py` `parse_hf_uri`):

    hf://<owner>/<repo>[/<path in the repo>][?revision=<branch, tag or commit>]

`hooked.sae.load` also takes it without `hf://` when it is not a local path, as `hooked.load` takes a model's hub
id (then, as circuit-tracer's `HfUri.from_str` reads it, `owner/repo/path@revision`). Only the files a
dictionary is made of are fetched (each format's `FILES`, `hooked.sae.formats.FORMATS`), not the repository: a
SAELens release holds hundreds of dictionaries (`cfg.json`, `sae_weights.safetensors`, `activation_scaler.json`,
`activation_whitening.safetensors`), a Gemma Scope repository thousands (`params.npz`), a circuit-tracer
repository one set (`config.yaml` and its `layer_{i}.safetensors` or a CLT's `W_enc_{i}` / `W_dec_{i}`).
`huggingface_hub.snapshot_download` fetches them into its cache
(https://huggingface.co/docs/huggingface_hub/guides/manage-cache) and honours HF_HUB_OFFLINE, as for models.
huggingface_hub is imported here only when a hub path is given.

A SAELens release and SAE id, `hooked.sae.load("gpt2-small-res-jb", "blocks.8.hook_resid_pre")` as SAELens'
`SAE.from_pretrained(release, sae_id)`, are looked up in SAELens' registry (`sae_lens/pretrained_saes.yaml`, read as
a file, SAELens not imported) where SAELens is installed: hooked keeps no registry of its own. A release name alone
is not a hub path: the error for it reads the same registry and names the hub path of the release and of the SAE
asked for.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

SCHEME = "hf://"
# circuit-tracer's own names for two transcoder sets (circuit-tracer 0.5.0 `utils/hf_utils.py`,
# `load_transcoders_from_hub`): not paths, so `load` refuses them and names the repository they stand for
CIRCUIT_TRACER_SETS = {"gemma": "mwhanna/gemma-scope-transcoders", "llama": "mntss/transcoder-Llama-3.2-1B"}


@dataclass(frozen=True)
class HubPath:
    repo_id: str
    path: str  # inside the repository; "" for its root
    revision: str | None = None

    def __str__(self) -> str:
        where = f"{SCHEME}{self.repo_id}" + (f"/{self.path}" if self.path else "")
        return where + (f"?revision={self.revision}" if self.revision else "")


def is_hub_path(name: str) -> bool:
    return str(name).startswith(SCHEME)


def parse(name: str, revision: str | None = None) -> HubPath:
    """`hf://owner/repo/path?revision=r` (or the same without `hf://`) as a HubPath; `revision=` where the name
    gives none (both: they must agree)."""
    text = str(name)
    at = None
    if not is_hub_path(text) and "@" in text:  # circuit-tracer's bare form: owner/repo/path@revision
        text, at = text.rsplit("@", 1)
    url = urlparse(text if is_hub_path(text) else SCHEME + text)
    parts = [part for part in (url.netloc + url.path).split("/") if part]
    if len(parts) < 2:
        raise FileNotFoundError(
            f"{text!r} is not a local path, nor a hub path: a hub path is hf://<owner>/<repo>[/<path in the repo>]"
            + release_hint(text)
            + (
                f"; circuit-tracer's {text!r} transcoders are hooked.sae.load('{SCHEME}{CIRCUIT_TRACER_SETS[text]}')"
                if text in CIRCUIT_TRACER_SETS
                else ""
            )
        )
    given = at or parse_qs(url.query).get("revision", [None])[0] or None
    if given is not None and revision is not None and given != revision:
        raise ValueError(f"{text!r} asks for revision {given!r} but revision={revision!r} was passed; give one")
    return HubPath("/".join(parts[:2]), "/".join(parts[2:]), given or revision)


def fetch(name: str, revision: str | None = None, *, files: Sequence[str]) -> Path:
    """The local copy of what hub path `name` names (a file, or a folder with its dictionary files: `files`,
    fnmatch patterns relative to the folder, every format's, `hooked.sae.formats.dictionary_files()`), fetched into
    the Hugging Face cache or found there; a clear error where it is neither."""
    where = parse(name, revision)
    patterns = [where.path] if Path(where.path).suffix else []  # a file, or a folder named like one
    prefix = f"{where.path}/" if where.path else ""
    patterns += [prefix + pattern for pattern in files]
    snapshot = _snapshot(where, patterns, str(name))
    local = snapshot / where.path if where.path else snapshot
    if not local.exists():
        # the folders that hold a file a format is named by (a whole name, not a pattern: cfg.json, params.npz, ...)
        names = {pattern for pattern in files if not any(char in pattern for char in "*?[/")}
        present = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file() and p.name in names)
        raise FileNotFoundError(
            f"hub repository {where.repo_id}"
            + (f" (revision {where.revision})" if where.revision else "")
            + f" has no dictionary at {where.path!r}"
            + (f"; it holds dictionaries at {', '.join(_folders(present)[:6])}" if present else "")
            + _nearest(where.path, _folders(present))
        )
    return local


def fetch_file(uri: str) -> Path:
    """One file named by a hub URI (a circuit-tracer config's `hf://.../layer_0.safetensors`)."""
    where = parse(uri)
    if not where.path:
        raise ValueError(f"{uri!r} names a repository, not a file")
    local = _snapshot(where, [where.path], uri) / where.path
    if not local.is_file():
        raise FileNotFoundError(f"hub repository {where.repo_id} has no file {where.path!r} (named by {uri!r})")
    return local


def _folders(files: list[str]) -> list[str]:
    return sorted({str(Path(f).parent) if Path(f).parent != Path(".") else "(the root)" for f in files})


def _nearest(asked: str, folders: list[str]) -> str:
    close = difflib.get_close_matches(asked, folders, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _snapshot(where: HubPath, patterns: list[str], named: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from hooked.weights.sources import why_not_downloaded

    try:
        return Path(snapshot_download(where.repo_id, revision=where.revision, allow_patterns=patterns))
    except HFValidationError as error:
        raise FileNotFoundError(
            f"{named!r} is neither a local path nor a valid hub path ({error}){release_hint(named)}"
        ) from None
    except LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"{named!r} is not a local path, and hub repository {where.repo_id} is not in the Hugging Face cache, and"
            f" {why_not_downloaded(error, 'pass a local directory')}{release_hint(named)}"
        ) from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"hub repository {where.repo_id} has no revision {where.revision!r}") from None
    except RepositoryNotFoundError as error:
        if isinstance(error, GatedRepoError):  # it exists: the hub's own message says how to get access
            raise
        raise FileNotFoundError(
            f"{named!r} is not a local path, nor a repository on the Hugging Face hub ({where.repo_id})"
            + release_hint(named)
        ) from None


# ----------------------------------------------------------------------------- what some releases' files omit
# What the files of some SAELens releases do not say, and SAELens' `SAE.from_pretrained` supplies from its registry
# (SAELens 6.54.12, `sae_lens/pretrained_saes.yaml`): a release's `config_overrides` that change the numbers (merged
# into cfg.json before it is read, as `get_sae_lens_config_from_disk` merges them) and a SAE's `norm_scaling_factor`
# (folded, as `SAE.from_pretrained` folds it), for every release whose files hooked reads as they are (no
# `conversion_func`). Keyed by hub repository; applied when a dictionary is loaded from it by hub path.
# tests/sae/test_hub.py checks the table against an installed SAELens' registry, entry for entry.
_CENTRED = {"model_from_pretrained_kwargs": {"center_writing_weights": True}}
_MLP_TM = "sae_group_gpt2_blocks.{}.hook_mlp_out_24576:v{}"
RELEASE_FACTS: dict[str, tuple[dict, dict[str, float]]] = {
    "jbloom/GPT2-Small-SAEs-Reformatted": (_CENTRED, {}),  # gpt2-small-res-jb
    "jbloom/GPT2-Small-Feature-Splitting-Experiment-Layer-8": (_CENTRED, {}),  # gpt2-small-res-jb-feature-splitting
    "tommmcgrath/gpt2-small-mlp-out-saes": (  # gpt2-small-mlp-tm
        _CENTRED,
        {
            _MLP_TM.format(layer, version): factor
            for layer, version, factor in (
                (0, 1, 1.049317316132615),
                (1, 0, 2.3693984005104283),
                (2, 0, 1.6411934982190302),
                (3, 0, 1.8958522157897557),
                (4, 0, 1.81673478700627),
                (5, 0, 1.550234472245924),
                (6, 0, 1.3237742807210804),
                (7, 0, 1.1042905114723296),
                (8, 1, 0.9123762783479742),
                (9, 0, 0.6955335635232373),
                (10, 0, 0.3619728926727644),
                (11, 2, 0.2851548652550073),
            )
        },
    ),
    "JoshEngels/Mistral-7B-Residual-Stream-SAEs": ({"normalize_activations": "constant_norm_rescale"}, {}),
    "jbloom/Gemma-2b-Residual-Stream-SAEs": ({}, {"gemma_2b_blocks.12.hook_resid_post_16384": 0.21381938399317255}),
}


def release_facts(name: str, revision: str | None = None) -> tuple[dict, float | None]:
    """(cfg.json overrides, norm scaling factor) SAELens' registry gives the dictionary at hub path `name`."""
    where = parse(name, revision)
    overrides, factors = RELEASE_FACTS.get(where.repo_id, ({}, {}))
    return dict(overrides), factors.get(where.path.rstrip("/"))


# ----------------------------------------------------------------------------- SAELens release names
def release_path(release: str, sae_id: str) -> tuple[str, dict]:
    """The hub path of SAE `sae_id` of SAELens release `release` (`hooked.sae.load(release, sae_id)`, SAELens'
    `SAE.from_pretrained(release, sae_id)`), read from an installed SAELens' registry, and what SAELens'
    `from_pretrained` adds to its metadata from there (its Neuronpedia id, where it has one: SAELens 6.54
    `loading/pretrained_saes_directory.py`, `get_config_overrides`); a clear error where there is no registry, or
    it does not list the release or the SAE."""
    registry = _saelens_registry()
    if registry is None:
        raise ValueError(
            f"load({release!r}, {sae_id!r}) looks the release up in SAELens' registry of releases"
            " (sae_lens/pretrained_saes.yaml, read as a file, SAELens not imported), and SAELens is not installed:"
            " pip install sae-lens, or give the SAE's hub path, hooked.sae.load('hf://<repo_id>/<path>'), the"
            " release's repo_id and the SAE's path as that file lists them"
        )
    entry = registry.get(release)
    if not isinstance(entry, dict) or not isinstance(entry.get("repo_id"), str):
        close = difflib.get_close_matches(str(release), [str(name) for name in registry], n=3, cutoff=0.5)
        raise ValueError(
            f"{release!r} is not a release in SAELens' registry ({len(registry)} releases)"
            + (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "")
        )
    by_id = _saes_by_id(entry)
    chosen = by_id.get(str(sae_id))
    if chosen is None:
        close = difflib.get_close_matches(str(sae_id), list(by_id), n=3, cutoff=0.5)
        raise ValueError(
            f"SAELens release {release!r} has no SAE {sae_id!r}; it has {len(by_id)}, such as"
            f" {', '.join(repr(c) for c in close or list(by_id)[:3])}"
        )
    folder = str(chosen.get("path") or "").strip("/")
    metadata = {"neuronpedia_id": chosen["neuronpedia"]} if chosen.get("neuronpedia") is not None else {}
    return f"{SCHEME}{entry['repo_id']}" + (f"/{folder}" if folder else ""), metadata


def release_hint(name: str) -> str:
    """Where `name` starts with a SAELens release's name and SAELens is installed: the hub path of the release
    (and of the SAE `release/sae_id` asks for), from SAELens' registry; else nothing."""
    text = str(name).removeprefix(SCHEME).split("?")[0]
    release, _, sae_id = text.partition("/")
    registry = _saelens_registry()
    if registry is None or release not in registry:
        return ""
    entry = registry[release]
    repo = entry.get("repo_id")
    if not isinstance(repo, str):
        return ""
    by_id = _saes_by_id(entry)
    chosen = by_id.get(sae_id)
    if chosen is None and sae_id:
        close = difflib.get_close_matches(sae_id, list(by_id), n=3, cutoff=0.5)
        hint = f"; its SAEs include {', '.join(repr(c) for c in close or list(by_id)[:3])}"
    else:
        hint = ""
    example = chosen or (next(iter(by_id.values())) if by_id else None)
    path = f"{SCHEME}{repo}" + (f"/{example['path']}" if example and example.get("path") else "")
    conversion = entry.get("conversion_func")
    note = (
        f" (SAELens converts this release with {conversion!r}: hooked reads it where it is a format hooked.sae"
        " knows, Gemma Scope's with hook_name=)"
        if conversion
        else ""
    )
    which = f"SAE {example['id']!r}" if example else "its SAEs"
    return (
        f"; {release!r} is a SAELens release (read from SAELens' installed registry): {which} is at"
        f" hooked.sae.load({path!r}){note}{hint}"
    )


def _saes_by_id(entry: dict) -> dict[str, dict]:
    """A registry release's SAEs by their id."""
    return {str(sae.get("id")): sae for sae in entry.get("saes") or [] if isinstance(sae, dict)}


def _saelens_registry() -> dict | None:
    """SAELens' pretrained_saes.yaml as a mapping, where SAELens is installed (found without importing it)."""
    try:
        spec = importlib.util.find_spec("sae_lens")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained_saes.yaml"
    if not path.is_file():
        return None
    import yaml  # PyYAML, a dependency of huggingface_hub

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        registry = yaml.load(path.read_text(), Loader=loader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        return None
    return registry if isinstance(registry, dict) else None
