"""Reading .safetensors files: `SafetensorsFile` parses the header and streams each tensor into a destination.

The format (safetensors' README, "Format", https://github.com/huggingface/safetensors#format) is an
8-byte little-endian header length, a JSON header mapping each tensor name to its dtype, shape and
[begin, end) byte offsets (plus an optional `__metadata__`), then the raw bytes. A checkpoint larger
than one file lists its shards in `model.safetensors.index.json` (`{"weight_map": {key: file}}`,
transformers' `SAFE_WEIGHTS_INDEX_NAME`), which `safetensors_files` reads.

Tensors are read here, not with safetensors' own `safe_open`: that one memory-maps the file, and every
page touched while converting a tensor stays resident until the file closes, so a float32 checkpoint
read into bfloat16 peaked at 3.6x the weights (`benchmarks/loading.py`, docs/benchmarks.md). Streaming
each tensor through one reused buffer into its preallocated destination keeps the peak near the size
of the result, in any dtype, and the parameters own their memory (none stays backed by the file).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from torch import Tensor

from hooked.weights.errors import CheckpointError

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

    def dtype(self, key: str) -> torch.dtype:
        """The dtype tensor `key` is stored in."""
        return _SAFETENSORS_DTYPES[self.header[key]["dtype"]]

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
        # a strided destination (a transposed view) is read into a contiguous copy: empty_like would keep its strides
        target = (
            destination
            if destination.is_contiguous()
            else torch.empty(destination.shape, dtype=destination.dtype, device=destination.device)
        )
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
