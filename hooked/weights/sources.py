"""Where a checkpoint is: a name or path resolved to the directory that holds its config.json.

In order: a model bundled with the package (`hooked/ioi-gpt2`, docs/ioi-models.md), a local
directory, else a snapshot from the Hugging Face hub, fetched or found in its cache by
`huggingface_hub.snapshot_download` (the cache layout, `models--<org>--<name>/snapshots/<commit>/`,
is huggingface_hub's: https://huggingface.co/docs/huggingface_hub/guides/manage-cache; it honours
HF_HUB_OFFLINE). A TransformerLens model name (`"gpt2-small"`) stands for the hub id TransformerLens
loads for it (hooked.transformer_lens.aliases, from TransformerLens 3.9's `supported_models.py`), and
an unknown name's error suggests the closest of those names. That table belongs to the compatibility wing
(hooked/transformer_lens/), above the loader: it is imported where a name is looked up, not with this module.

huggingface_hub is imported inside the functions that ask the hub: a bundled or local checkpoint
never needs it, and the tests replace `huggingface_hub.snapshot_download` to prove the hub is not asked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hooked.weights.errors import CheckpointError

_HUB_PATTERNS = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
]


# Models that ship inside the package (hooked/bundled/<name>/), trained by scripts/train_ioi.py
# (docs/ioi-models.md). `hooked.load("hooked/ioi-gpt2")` reads them offline, before any hub lookup.
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "bundled"
BUNDLED_MODELS: tuple[str, ...] = ("hooked/ioi-gpt2", "hooked/ioi-qwen3moe")
BUNDLED_PREFIX = "hooked/"


def bundled_models() -> dict[str, Path]:
    """The bundled models by name, each with its directory: {"hooked/ioi-gpt2": .../hooked/bundled/ioi-gpt2, ...}."""
    return {name: BUNDLED_DIR / name.removeprefix(BUNDLED_PREFIX) for name in BUNDLED_MODELS}


_TOKENIZER_PATTERNS = ["config.json", *(name for name in _HUB_PATTERNS if "safetensors" not in name)]


def resolve(name_or_path: str | Path, config_only: bool = False, tokenizer_only: bool = False) -> Path:
    """A bundled model's directory, a local checkpoint directory, or the hub snapshot of `name_or_path`
    (honours HF_HUB_OFFLINE), in that order; a TransformerLens name (`"gpt2-small"`) fetches the hub id it
    stands for (`hub_name_for`). A `hooked/...` name that is neither bundled nor a local directory raises,
    listing the bundled names; an unknown name's error suggests the closest TransformerLens names.

    `config_only` fetches config.json alone (`hooked hooks` needs nothing else); `tokenizer_only` the tokenizer's
    files and config.json, no weights (TransformerLens' `tokenizer_name`).
    """
    bundled = bundled_models()
    if str(name_or_path) in bundled:
        directory = bundled[str(name_or_path)]
        if not (directory / "config.json").exists():
            raise CheckpointError(
                f"{str(name_or_path)!r} is a bundled model, but {directory} has no config.json: this copy of hooked was"
                " installed without its package data; reinstall it, or retrain with scripts/train_ioi.py"
            )
        return directory
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; give the checkpoint's directory (with config.json)")
    if str(name_or_path).startswith(BUNDLED_PREFIX):
        raise CheckpointError(
            f"{str(name_or_path)!r} is not a bundled model (nor a local directory); the models bundled with hooked"
            f" are: {', '.join(bundled)}"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    hub_name = hub_name_for(name_or_path)
    named = repr(str(name_or_path)) + (
        f" (TransformerLens' name for hub id {hub_name!r})" if hub_name != str(name_or_path) else ""
    )
    try:
        patterns = ["config.json"] if config_only else _TOKENIZER_PATTERNS if tokenizer_only else _HUB_PATTERNS
        return Path(snapshot_download(hub_name, allow_patterns=patterns))
    except HFValidationError as error:
        raise CheckpointError(
            f"{named} is neither a local directory nor a valid hub id: {error}{_did_you_mean(name_or_path)}"
        ) from None
    except LocalEntryNotFoundError as error:
        raise CheckpointError(
            f"{named} is not a local directory and is not in the Hugging Face cache, and {why_not_downloaded(error)}"
            + _did_you_mean(name_or_path)
        ) from None
    except RepositoryNotFoundError as error:
        if isinstance(error, GatedRepoError):  # it exists: the hub's own message says how to get access
            raise
        raise CheckpointError(
            f"{named} is not a local directory nor a model on the Hugging Face hub{_did_you_mean(name_or_path)}"
        ) from None


def hub_name_for(name_or_path: str | Path) -> str:
    """The hub id to download for a name that is not a local directory: TransformerLens' official name
    for one of its names or aliases (`"gpt2-small"` -> `"gpt2"`; hooked.transformer_lens.aliases), else
    the name itself."""
    from hooked.transformer_lens import aliases

    return aliases.hub_id(str(name_or_path)) or str(name_or_path)


def same_model_name(recorded: str, name_or_path: str | Path) -> bool:
    """Whether a model name a file records (a SAELens or circuit-tracer config's `model_name`) names the model loaded
    from `name_or_path`: the same hub id once TransformerLens' names are resolved (`"gpt2-small"` is `"gpt2"`), case
    aside; or, where one of the two names no owner (`"gpt2"`; a local directory counts by its last folder), the same
    name after the other's owner (`"openai-community/gpt2"`)."""
    a = hub_name_for(str(recorded)).rstrip("/").lower()
    path = Path(name_or_path).expanduser()
    local = str(name_or_path) not in bundled_models() and path.is_dir()
    b = path.resolve().name.lower() if local else hub_name_for(str(name_or_path)).rstrip("/").lower()
    if a == b:
        return True
    return ("/" not in a or "/" not in b) and a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def name_agreement(name_or_path: str | Path | None, recorded: str) -> str:
    """Whether the model loaded from `name_or_path` is the one a file's `model_name` records: "same"; "other";
    "other directory" where the model came from a local directory, whose folder name need not be the model's;
    "unknown" where either name names no model (a model built in memory has no `name_or_path`, and training records
    its class name, `"GPT2"`, for one)."""
    from hooked.models import MODEL_CLASSES

    in_memory = {model_class.__name__ for model_class in MODEL_CLASSES}
    if name_or_path is None or not recorded or recorded in in_memory:
        return "unknown"
    if same_model_name(recorded, name_or_path):
        return "same"
    local = is_local_directory(name_or_path)
    names = [recorded] if local else [recorded, str(name_or_path)]
    if not all(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) for name in names):  # `owner/name` or `name`: a model's
        return "unknown"
    return "other directory" if local else "other"


def is_local_directory(name_or_path: str | Path) -> bool:
    """Whether `resolve` reads `name_or_path` as a local directory (not a bundled model)."""
    return str(name_or_path) not in bundled_models() and Path(name_or_path).expanduser().is_dir()


def from_the_hub(name_or_path: str | Path) -> bool:
    """Whether `resolve` takes `name_or_path` from the hub: it is neither a bundled model nor a local directory."""
    return str(name_or_path) not in bundled_models() and not Path(name_or_path).expanduser().is_dir()


def _did_you_mean(name_or_path: str | Path) -> str:
    """A hint naming the closest TransformerLens names, when `name_or_path` is none of them."""
    from hooked.transformer_lens import aliases

    if aliases.hub_id(str(name_or_path)) is not None:
        return ""
    close = aliases.nearest(str(name_or_path))
    return f"; did you mean {' or '.join(repr(name) for name in close)} (TransformerLens' names)?" if close else ""


def why_not_downloaded(error: Exception, instead: str = "pass a local checkpoint directory") -> str:
    """Why the hub served no snapshot, and what to do: offline mode (and the variable that set it), or the
    failed request; `instead` is the local alternative to name."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    if isinstance(error.__cause__, OfflineModeIsEnabled):
        # huggingface_hub reads these once, at import: name the ones set now (none: changed since)
        flags = [
            f"{name}={os.environ[name]}"
            for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
            if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")
        ]
        return (
            f"huggingface_hub is in offline mode ({', '.join(flags) or 'set when it was imported'}), so the hub was"
            f" not asked; start Python without it to download it, or {instead}"
        )
    cause = error.__cause__ or error
    detail = str(cause).splitlines()[0] if str(cause) else "no detail"
    return (
        f"the hub could not be reached ({type(cause).__name__}: {detail}); download it once with network access"
        f" or {instead}"
    )
