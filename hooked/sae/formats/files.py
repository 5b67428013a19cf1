"""The containers the dictionary formats store tensors in, behind one small interface (`TensorSource`): names,
shapes read from the header alone (so every shape is checked before anything is built), and each tensor
streamed into its destination in the destination's dtype and device.

- `.safetensors` (SAELens, Gemma Scope 2, eai-sparsify, circuit-tracer): hooked.weights' `SafetensorsFile`,
  which reads tensor by tensor through one small buffer, never the whole file at once.
- `.npz` (Gemma Scope): numpy's zip of `.npy` arrays; the shapes come from each member's header.
- tensors already in memory (`hooked.sae.from_saelens`).

`write_safetensors` writes the format (safetensors' README, "Format": an 8-byte little-endian header length, a
JSON header of dtype, shape and [begin, end) data offsets, then the bytes), so saving needs no extra package.
"""

from __future__ import annotations

import abc
import json
import zipfile
from pathlib import Path

import torch
from torch import Tensor

from hooked.weights import SafetensorsFile

_SAFETENSORS_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
_SAFETENSORS_NAMES |= {torch.int64: "I64", torch.int32: "I32"}
_SAFETENSORS_DTYPES = {name: dtype for dtype, name in _SAFETENSORS_NAMES.items()}


class TensorSource(abc.ABC):
    """Named tensors in a file or in memory: `keys()`, `shape(key)`, `read_into(key, destination)`, `read(key)`."""

    path: str  # what error messages name

    @abc.abstractmethod
    def keys(self) -> list[str]: ...

    @abc.abstractmethod
    def shape(self, key: str) -> tuple[int, ...]: ...

    @abc.abstractmethod
    def read_into(self, key: str, destination: Tensor) -> Tensor: ...

    def read(self, key: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Tensor:
        return self.read_into(key, torch.empty(self.shape(key), dtype=dtype, device=device))

    def close(self) -> None:  # noqa: B027  (optional: a source in memory holds no file)
        pass

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class Safetensors(TensorSource):
    def __init__(self, path: Path):
        self.path = str(path)
        self.file = SafetensorsFile(Path(path))

    def keys(self) -> list[str]:
        return self.file.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.file.shape(key))

    def dtype(self, key: str) -> torch.dtype | None:
        """The tensor's stored dtype (None for one a dictionary cannot have)."""
        return _SAFETENSORS_DTYPES.get(self.file.header[key]["dtype"])

    def read_into(self, key: str, destination: Tensor) -> Tensor:
        return self.file.read_into(key, destination)

    def close(self) -> None:
        self.file.file.close()


class Npz(TensorSource):
    """numpy's `.npz`: a zip whose member `NAME.npy` holds array NAME (numpy's `lib.format`)."""

    def __init__(self, path: Path):
        import numpy as np

        self.path = str(path)
        self.np = np
        self.zip = zipfile.ZipFile(path)
        self.members = {name.removesuffix(".npy"): name for name in self.zip.namelist() if name.endswith(".npy")}
        self.shapes = {}
        for key, member in self.members.items():
            with self.zip.open(member) as file:
                version = np.lib.format.read_magic(file)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                self.shapes[key] = tuple(read_header(file)[0])

    def keys(self) -> list[str]:
        return list(self.members)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.shapes[key]

    def read_into(self, key: str, destination: Tensor) -> Tensor:
        with self.zip.open(self.members[key]) as file:
            array = self.np.lib.format.read_array(file)
        return destination.copy_(torch.from_numpy(array))

    def close(self) -> None:
        self.zip.close()


class InMemory(TensorSource):
    def __init__(self, tensors: dict[str, Tensor], path: str):
        self.tensors, self.path = tensors, path

    def keys(self) -> list[str]:
        return list(self.tensors)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.tensors[key].shape)

    def read_into(self, key: str, destination: Tensor) -> Tensor:
        return destination.copy_(self.tensors[key].detach())


def write_safetensors(tensors: dict[str, Tensor], path: Path) -> Path:
    """Write `tensors` to `path` in the safetensors format (readable by the safetensors package and SAELens)."""
    header: dict = {}
    blobs, offset = [], 0
    for key in sorted(tensors):
        tensor = tensors[key].detach().to("cpu").contiguous()
        if tensor.dtype not in _SAFETENSORS_NAMES:
            raise ValueError(
                f"{key} is {tensor.dtype}; safetensors here holds {', '.join(map(str, _SAFETENSORS_NAMES))}"
            )
        size = tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": _SAFETENSORS_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        blobs.append(tensor)
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format lets the header be padded with spaces to align the data
    with open(path, "wb") as file:
        file.write(len(encoded).to_bytes(8, "little"))
        file.write(encoded)
        for tensor in blobs:
            file.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return Path(path)
