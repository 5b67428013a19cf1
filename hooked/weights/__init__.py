"""Loading checkpoints: Hugging Face `config.json` + `.safetensors`, never a transformers model.

The model is built on the meta device (no memory), every tensor is read from safetensors straight
into the target dtype and device, renamed by the architecture's table, checked (every parameter
found once, every checkpoint key used or deliberately ignored, every shape right), and only then
assigned. Any failure raises before a model exists, so a caller gets a fully loaded model or an
exception, never a half-loaded one.

Tensors are read with `SafetensorsFile`, not safetensors' own `safe_open`: that one memory-maps the
file, and every page touched while converting a tensor stays resident until the file closes, so a
float32 checkpoint read into bfloat16 peaked at 3.6x the weights (`benchmarks/loading.py`). The
format is small (an 8-byte little-endian header length, a JSON header of dtype/shape/offsets, raw
bytes); streaming each tensor through one reused buffer into its preallocated destination keeps the
peak near the size of the result, in any dtype, and the parameters own their memory (none stays
backed by the file).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from hooked.distributed import Parallel, parallelize
from hooked.tokenizer import HookedTokenizer
from hooked.transformer_lens import aliases
from hooked.transformer_lens.processing import FLAGS, check_flags, process_weights, unprocessed

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


class CheckpointError(ValueError):
    """A checkpoint that does not match the architecture its config names."""


# Models that ship inside the package (hooked/bundled/<name>/), trained by scripts/train_ioi.py
# (docs/ioi-models.md). `hooked.load("hooked/ioi-gpt2")` reads them offline, before any hub lookup.
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "bundled"
BUNDLED_MODELS: tuple[str, ...] = ("hooked/ioi-gpt2", "hooked/ioi-qwen3moe")
BUNDLED_PREFIX = "hooked/"


def bundled_models() -> dict[str, Path]:
    """The bundled models by name, each with its directory: {"hooked/ioi-gpt2": .../hooked/bundled/ioi-gpt2, ...}."""
    return {name: BUNDLED_DIR / name.removeprefix(BUNDLED_PREFIX) for name in BUNDLED_MODELS}


def resolve(name_or_path: str | Path, config_only: bool = False) -> Path:
    """A bundled model's directory, a local checkpoint directory, or the hub snapshot of `name_or_path`
    (honours HF_HUB_OFFLINE), in that order; a TransformerLens name (`"gpt2-small"`) fetches the hub id it
    stands for (`hub_name_for`). A `hooked/...` name that is neither bundled nor a local directory raises,
    listing the bundled names; an unknown name's error suggests the closest TransformerLens names.

    `config_only` fetches config.json alone (`hooked hooks` needs nothing else).
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
        return Path(snapshot_download(hub_name, allow_patterns=["config.json"] if config_only else _HUB_PATTERNS))
    except HFValidationError as error:
        raise CheckpointError(
            f"{named} is neither a local directory nor a valid hub id: {error}{_did_you_mean(name_or_path)}"
        ) from None
    except LocalEntryNotFoundError as error:
        raise CheckpointError(
            f"{named} is not a local directory and is not in the Hugging Face cache, and {_why_not_downloaded(error)}"
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
    for one of its names or aliases (`"gpt2-small"` -> `"gpt2"`; hooked.transformer_lens.aliases), else the name itself."""
    return aliases.hub_id(str(name_or_path)) or str(name_or_path)


def _did_you_mean(name_or_path: str | Path) -> str:
    """A hint naming the closest TransformerLens names, when `name_or_path` is none of them."""
    if aliases.hub_id(str(name_or_path)) is not None:
        return ""
    close = aliases.nearest(str(name_or_path))
    return f"; did you mean {' or '.join(repr(name) for name in close)} (TransformerLens' names)?" if close else ""


def _why_not_downloaded(error: Exception) -> str:
    """Why the hub served no snapshot, and what to do: offline mode (and the variable that set it), or the failed request."""
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
            " not asked; start Python without it to download the model, or pass a local checkpoint directory"
        )
    cause = error.__cause__ or error
    detail = str(cause).splitlines()[0] if str(cause) else "no detail"
    return (
        f"the hub could not be reached ({type(cause).__name__}: {detail}); download it once with network access"
        " or pass a local checkpoint directory"
    )


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.exists():
        raise CheckpointError(f"{directory} has no config.json")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{path} is not valid JSON ({error}); fix or re-download the checkpoint's config.json"
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{path} holds a JSON {type(config).__name__}, not an object of settings; fix or re-download it"
        )
    return config


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's shard files: from `model.safetensors.index.json`, else the single file."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
            problem = f"not valid JSON ({error})" if isinstance(error, ValueError) else 'without a "weight_map" object'
            raise CheckpointError(f"{index} is {problem}; fix or re-download it") from None
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index.name} names shard files that are missing: {missing}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} has no .safetensors weights (pytorch_model.bin is not read: convert it)")
    return files


def architecture_for(config: dict):
    """The model class serving a config.json, or an error naming the supported ones."""
    from hooked.models import MODEL_CLASSES

    names = [*(config.get("architectures") or []), config.get("model_type", "")]
    for model_class in MODEL_CLASSES:
        if any(name in model_class.architectures for name in names):
            return model_class
    supported = sorted(
        {arch for model_class in MODEL_CLASSES for arch in model_class.architectures if arch[0].isupper()}
    )
    raise CheckpointError(f"architecture {names} is not supported by hooked; supported: {', '.join(supported)}")


def load_model(
    name_or_path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    model_class=None,
    tp: int | None = None,
    timeout: float | None = None,
    processing: dict | None = None,
):
    """Build the model a checkpoint describes and fill it from its safetensors files.

    `processing` (flag -> bool, `hooked.transformer_lens.processing.FLAGS`) processes the weights in place once read, as
    TransformerLens' `from_pretrained` does; refused, before anything is read, under tensor parallelism.
    With `tp` (under torchrun), this process builds and reads only its shard (hooked.distributed);
    the ranks of a group agree at the end, so either every rank has its shard or every rank raises.
    """
    check_device(device)
    processing = {**unprocessed(), **(processing or {})}
    unknown = set(processing) - set(FLAGS)
    if unknown:
        raise TypeError(f"unknown processing flag(s) {sorted(unknown)}; the flags are {', '.join(FLAGS)}")
    if tp is not None and tp > 1 and any(processing.values()):
        raise ValueError(
            "weight processing is not supported under tensor parallelism (tp > 1): centring the unembedding needs"
            " the whole vocabulary on one rank; load with tp=1 or without processing"
        )
    if tp is None:
        return _load(name_or_path, dtype, device, model_class, processing=processing)
    parallel = Parallel.create(tp, timeout)
    model, error = None, None
    try:
        model = _load(name_or_path, dtype, parallel.device(device), model_class, parallel, processing)
    except Exception as caught:
        error = caught
    parallel.agree(error, what="hooked.load")
    return model


def _load(name_or_path, dtype, device, model_class, parallel=None, processing=None):
    dtype = _as_dtype(dtype)
    directory = resolve(name_or_path)
    config = read_config(directory)
    detected = architecture_for(config)
    if model_class is not None and model_class is not detected:
        raise CheckpointError(
            f"{directory} holds a {detected.__name__} checkpoint, not {model_class.__name__}; use hooked.load"
        )
    model_class = detected
    model = build_on_meta(model_class, config)
    processing = processing or unprocessed()
    check_flags(model, processing)  # a refused combination (a rotary model's refactoring) fails before any read
    plan = None
    if parallel is not None:
        model.parallel = parallel
        plan = parallelize(model, parallel) if parallel.tp_size > 1 else None
    state = read_state_dict(directory, model, dtype, torch.device(device), plan)
    model.load_state_dict(state, strict=True, assign=True)
    del state  # the parameters are these tensors: processing changes them in place, tensor by tensor
    if any(processing.values()):
        process_weights(model, **processing)
    model.tokenizer = HookedTokenizer.from_directory(directory, config)
    # Recorded in sweep results' provenance; a TransformerLens name as the hub id it stood for.
    model.name_or_path = hub_name_for(name_or_path) if _from_the_hub(name_or_path) else str(name_or_path)
    return model.eval()


def _from_the_hub(name_or_path: str | Path) -> bool:
    return str(name_or_path) not in bundled_models() and not Path(name_or_path).expanduser().is_dir()


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Skip torch.nn.init's random fills while building on meta: every value is overwritten by the
    checkpoint, and a random fill on a meta tensor imports torch._dynamo (over a second)."""
    names = [name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")]
    saved = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def build_on_meta(model_class, config: dict):
    """The model a config.json describes, on the meta device: shapes only, no memory, no init."""
    cfg = model_class.config_class.from_hf(config)
    with torch.device("meta"), _no_init():
        return model_class(cfg)


def check_device(device: torch.device | str) -> None:
    """Refuse a device this torch cannot use before anything is read, naming the `device=` argument and the fix."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r} is not a torch device ({error}); use 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) was built without CUDA"
            if torch.version.cuda is None
            else "no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)"
        )
        raise RuntimeError(
            f"device={device!r}, but {why}; load with device='cpu', or install a CUDA build of torch on a"
            " machine with a GPU"
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise RuntimeError(f"device={device!r}, but this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in names:
            raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(names)}")
        return names[dtype.removeprefix("torch.")]
    if dtype not in names.values():
        raise ValueError(f"dtype {dtype} is not supported; use one of {', '.join(names)}")
    return dtype


def read_state_dict(directory: Path, model, dtype: torch.dtype, device: torch.device, plan=None) -> dict[str, Tensor]:
    """Every parameter of `model`, read from the checkpoint into dtype/device, renamed and checked.

    `plan` (tensor parallelism, `hooked.distributed.parallelize`) maps a parameter to the part of the
    tensor on disk this rank holds: (dim, [start, stop) ranges along it, concatenated; the shape on
    disk). Only those bytes are read; stacked experts outside the rank's range are skipped.
    """
    plan = plan or {}
    expected = dict(model.state_dict(keep_vars=True))
    renames = [(re.compile(pattern), replacement) for pattern, replacement in model.checkpoint_renames]
    ignored = [re.compile(pattern) for pattern in model.checkpoint_ignored]
    stacked = [(re.compile(entry[0]), *entry[1:]) for entry in getattr(model, "checkpoint_stacked", ())]
    filled: dict[str, tuple[set, int]] = {}  # stacked parameter -> (the (slice, part) pairs read, parts per slice)
    state: dict[str, Tensor] = {}
    unexpected, mis_shaped = [], []
    for path in safetensors_files(directory):
        with SafetensorsFile(path) as file:
            for key in file.keys():
                target = _rename(key, renames)
                if target is None and stacked:
                    outcome = _read_slice(file, key, stacked, expected, state, filled, dtype, device, plan)
                    if outcome is not None:  # the key is one slice of a stacked parameter
                        if outcome == "unexpected":
                            unexpected.append(key)
                        elif outcome != "read":
                            mis_shaped.append(outcome)
                        continue
                if target is None:
                    if not any(pattern.fullmatch(key) for pattern in ignored):
                        unexpected.append(key)
                    continue
                if target not in expected or target in state:
                    unexpected.append(key)
                    continue
                on_disk = plan[target][2] if target in plan else expected[target].shape
                if file.shape(key) != on_disk:
                    mis_shaped.append(f"{key}: {tuple(file.shape(key))} in the file, {tuple(on_disk)} expected")
                    continue
                destination = empty_weight(expected[target].shape, dtype, device)
                if target in plan:  # this rank's slices only
                    dim, spans, _ = plan[target]
                    offset = 0
                    for start, stop in spans:
                        file.read_part_into(key, dim, start, stop, destination.narrow(dim, offset, stop - start))
                        offset += stop - start
                    state[target] = destination
                else:
                    state[target] = file.read_into(key, destination)
    missing = [name for name in expected if name not in state]
    missing += [
        f"{name}[{i}]" + (f" (part {part + 1} of {parts})" if parts > 1 else "")
        for name, (done, parts) in filled.items()
        if name in state  # (a parameter with no piece read is listed once above)
        for i in range(expected[name].shape[0])
        for part in range(parts)
        if (i, part) not in done
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if unexpected:
        problems.append(f"unexpected tensors: {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
    if mis_shaped:
        problems.append("mis-shaped tensors: " + "; ".join(mis_shaped[:10]))
    if problems:
        raise CheckpointError(
            f"checkpoint {directory} does not match {type(model).__name__}({model.cfg}): " + " | ".join(problems)
        )
    return state


HUGE_PAGE = 2 * 1024 * 1024
MADV_HUGEPAGE = 14  # linux/mman.h


@functools.cache
def _madvise():
    """libc's madvise on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def empty_weight(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised weight tensor; on a Linux CPU, its whole 2 MiB pages are asked to be huge pages.

    Decoding one token streams every weight through the CPU once per step, and with 4 KiB pages
    the address translations miss the TLB along the way: huge pages make the same matmuls about 3%
    faster (benchmarks/generate.py). torch's allocator does this only when THP_MEM_ALLOC_ENABLE=1
    is set before torch starts; here the advice is given for the weights alone, before the file is
    read into them (the pages are not yet touched). Where transparent huge pages are off, the advice
    is a no-op.
    """
    tensor = torch.empty(shape, dtype=dtype, device=device)
    madvise = _madvise() if tensor.device.type == "cpu" else None
    if madvise is not None:
        start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        end = (tensor.data_ptr() + tensor.nbytes) // HUGE_PAGE * HUGE_PAGE
        if end > start:
            madvise(start, end - start, MADV_HUGEPAGE)  # advice only: a failure changes nothing
    return tensor


def _read_slice(file, key: str, stacked, expected, state, filled, dtype, device, plan=None) -> str | None:
    """Read `key` into one slice of a stacked parameter (e.g. one expert of [n_experts, ...]).

    A `checkpoint_stacked` entry is (key pattern with a named group `expert`, parameter name
    template[, (part, parts)]): the group gives the index along axis 0; with (part, parts) the tensor
    fills block `part` of `parts` equal blocks along axis 1 (e.g. gate and up fused into one
    [n_experts, 2 * d_mlp, d_model] parameter). The parameter is allocated once and filled piece by
    piece, so stacking costs no second copy. Under tensor parallelism `plan` gives the range of axis 0
    this rank holds, and other slices are skipped (their shape still checked). Returns None when `key`
    matches no entry, "read", "unexpected" (unknown parameter, index out of range, read twice), or a
    message when its shape is wrong.
    """
    for pattern, replacement, *split in stacked:
        match = pattern.fullmatch(key)
        if match is None:
            continue
        target, index = match.expand(replacement), int(match.group("expert"))
        part, parts = split[0] if split else (0, 1)
        if plan and target in plan:  # expert parallelism: this rank holds experts [start, stop)
            ((start, stop),) = plan[target][1]
            whole = plan[target][2]
            if not 0 <= index < whole[0]:
                return "unexpected"
            if not start <= index < stop:  # another rank's expert: not read here
                if file.shape(key) != _piece_shape(whole, parts):
                    return f"{key}: {tuple(file.shape(key))} in the file, {tuple(_piece_shape(whole, parts))} expected"
                return "read"
            index -= start
        done, _ = filled.setdefault(target, (set(), parts)) if target in expected else (set(), parts)
        if target not in expected or not 0 <= index < expected[target].shape[0] or (index, part) in done:
            return "unexpected"
        if target in state and not done:  # already read whole (a fused tensor of another layout): never overwrite it
            return "unexpected"
        shape = expected[target].shape
        piece = _piece_shape(shape, parts)
        if file.shape(key) != piece:
            return f"{key}: {tuple(file.shape(key))} in the file, {tuple(piece)} expected (a piece of {target} {tuple(shape)})"
        if target not in state:
            state[target] = empty_weight(shape, dtype, device)
        destination = (
            state[target][index] if parts == 1 else state[target][index, part * piece[0] : (part + 1) * piece[0]]
        )
        file.read_into(key, destination)
        done.add((index, part))
        return "read"
    return None


def _piece_shape(shape: torch.Size, parts: int) -> torch.Size:
    """The shape of one key on disk that fills one slice (or one of `parts` blocks of it) of a stacked parameter."""
    return shape[1:] if parts == 1 else torch.Size((shape[1] // parts, *shape[2:]))


def _rename(key: str, renames) -> str | None:
    for pattern, replacement in renames:
        match = pattern.fullmatch(key)
        if match:
            return match.expand(replacement)
    return None


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on a header


class SafetensorsFile:
    """One .safetensors file: its header, and tensors streamed into destinations of any dtype."""

    CHUNK_BYTES = 16 * 2**20

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "rb")
        try:
            size = os.fstat(self.file.fileno()).st_size
            length = int.from_bytes(self.file.read(8), "little")
            if size < 8 or length > min(size - 8, MAX_HEADER_BYTES):
                raise self._error(f"its header claims {length} bytes but the file has {size}")
            self.data_start = 8 + length
            self.header = self._validated(json.loads(self.file.read(length)), size - self.data_start)
        except Exception as error:  # JSON, a missing field, a bad layout: never anything but CheckpointError
            self.file.close()
            raise (
                error if isinstance(error, CheckpointError) else self._error(f"its header is unreadable ({error!r})")
            ) from None

    def _validated(self, header, data_bytes: int) -> dict:
        """The header's tensors, checked as the format requires (safetensors' README, "Format"): each
        entry has a known dtype, a shape of non-negative ints and [begin, end) offsets whose length is
        the tensor's size, and the entries, sorted by offset, tile the data buffer from 0 to its end
        with no gap and no overlap."""
        if not isinstance(header, dict):
            raise self._error("its header is not a JSON object")
        header.pop("__metadata__", None)
        spans = []
        for key, info in header.items():
            if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
                raise self._error(f"tensor {key}'s entry is not {{dtype, shape, data_offsets}}")
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in _SAFETENSORS_DTYPES:
                raise self._error(f"tensor {key} has dtype {dtype!r}, which hooked cannot read")
            if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
                raise self._error(f"tensor {key} has shape {shape!r}; a shape is a list of non-negative ints")
            if not (
                isinstance(offsets, list)
                and len(offsets) == 2
                and all(type(n) is int for n in offsets)
                and 0 <= offsets[0] <= offsets[1]
            ):
                raise self._error(
                    f"tensor {key} has data_offsets {offsets!r}; they are [begin, end] with 0 <= begin <= end"
                )
            if offsets[1] - offsets[0] != math.prod(shape) * _SAFETENSORS_DTYPES[dtype].itemsize:
                raise self._error(
                    f"tensor {key} spans {offsets[1] - offsets[0]} bytes, but {dtype} {shape} needs"
                    f" {math.prod(shape) * _SAFETENSORS_DTYPES[dtype].itemsize}"
                )
            spans.append((offsets[0], offsets[1], key))
        position = 0
        for begin, end, key in sorted(spans):
            if begin != position:
                problem = (
                    "overlaps the tensor before it"
                    if begin < position
                    else f"leaves a gap of {begin - position} bytes before it"
                )
                raise self._error(f"tensor {key} {problem}")
            position = end
        if position != data_bytes:
            raise self._error(f"its tensors cover {position} bytes of data but the file holds {data_bytes}")
        return header

    def _error(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path} is not a readable safetensors file: {problem}; is it truncated?")

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.file.close()

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, key: str) -> torch.Size:
        return torch.Size(self.header[key]["shape"])

    def read_part_into(self, key: str, dim: int, start: int, stop: int, destination: Tensor) -> Tensor:
        """Copy indices [start, stop) along `dim` of tensor `key` into `destination` (that part's shape, any
        dtype, possibly a strided view), reading only those bytes: one contiguous run per index of the
        leading dims (a row block of an [out, in] matrix is a single run; a column block one per row)."""
        info = self.header[key]
        source_dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        shape = info["shape"]
        if not 0 <= start <= stop <= shape[dim]:
            raise self._error(f"tensor {key} has {shape[dim]} entries along dim {dim}, not [{start}, {stop})")
        inner = math.prod(shape[dim + 1 :])
        outer = math.prod(shape[:dim])
        run = (stop - start) * inner  # elements per contiguous run
        target = destination
        try:  # a column block of a wider destination still has contiguous rows: read into them directly
            rows = destination.view(outer, run)
        except RuntimeError:
            rows = None
        if rows is None or (run > 1 and rows.stride(-1) != 1):
            target = torch.empty(destination.shape, dtype=destination.dtype, device=destination.device)
            rows = target.view(outer, run)
        for index in range(outer):
            byte = info["data_offsets"][0] + (index * shape[dim] + start) * inner * source_dtype.itemsize
            self._stream(key, byte, source_dtype, rows[index])
        if target is not destination:
            destination.copy_(target)
        return destination

    def read_into(self, key: str, destination: Tensor) -> Tensor:
        """Copy tensor `key` into `destination` (same shape, any dtype and device), chunk by chunk."""
        info = self.header[key]
        source_dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        target = destination if destination.is_contiguous() else torch.empty_like(destination)
        self._stream(key, info["data_offsets"][0], source_dtype, target.view(-1))
        return destination if target is destination else destination.copy_(target)

    def _stream(self, key: str, offset: int, source_dtype: torch.dtype, flat: Tensor) -> None:
        """Read flat.numel() elements of `source_dtype`, from `offset` bytes into the data, into `flat`."""
        self.file.seek(self.data_start + offset)
        if source_dtype == flat.dtype and flat.device.type == "cpu":  # no conversion: read in place
            raw = flat.view(torch.uint8).numpy()
            if self.file.readinto(raw) != raw.nbytes:
                raise self._error(f"tensor {key} ends early")
            return
        per_chunk = max(1, self.CHUNK_BYTES // source_dtype.itemsize)
        buffer = bytearray(min(per_chunk, max(flat.numel(), 1)) * source_dtype.itemsize)
        for start in range(0, flat.numel(), per_chunk):
            count = min(per_chunk, flat.numel() - start)
            view = memoryview(buffer)[: count * source_dtype.itemsize]
            if self.file.readinto(view) != len(view):
                raise self._error(f"tensor {key} ends early")
            flat[start : start + count].copy_(torch.frombuffer(buffer, dtype=source_dtype, count=count))


def shard_bytes(config: dict | str, tp: int, dtype: torch.dtype = torch.bfloat16) -> list[dict[str, int]]:
    """The bytes of parameters each rank of a `tp` group would hold for a checkpoint (its config.json
    dict, a directory or a hub id; only config.json is read): per rank, "split" (parameters cut by
    the plan, including key/value heads held by several ranks), "replicated" (held whole by every
    rank) and "total". Built on the meta device: no memory, no process group. docs/scaling.md uses it.
    """
    if not isinstance(config, dict):
        config = read_config(resolve(config, config_only=True))
    model_class = architecture_for(config)
    itemsize = dtype.itemsize
    sizes = []
    for rank in range(tp):
        model = build_on_meta(model_class, config)
        plan = parallelize(model, Parallel(tp, rank, list(range(tp)), None, 1, 0, None))
        parameters = dict(model.named_parameters())
        split = sum(parameters[name].numel() for name in plan) * itemsize
        total = sum(p.numel() for p in parameters.values()) * itemsize
        sizes.append({"split": split, "replicated": total - split, "total": total})
    return sizes
