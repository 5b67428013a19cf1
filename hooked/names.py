"""Naming and slicing activations: TransformerLens' shorthand keys and its `Slice`.

`act_name("z", 9)` -> `"blocks.9.attn.hook_z"`, also the compact keys (`"k6a"`, `"scale4ln1"`,
`"resid_pre5"`); `Slice` and `apply_pos_slice` choose positions or batch rows. Shared by
`run_with_cache`, `ActivationCache` (hooked/cache.py) and `hooked.transformer_lens.utils`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from hooked.hooks import HookPoint

SliceInput = int | slice | tuple | Sequence[int] | Tensor | None


class Slice:
    """TransformerLens' `utils.Slice`: one way to select along an axis, applied with `.apply(tensor, dim)`.

    Modes (as TransformerLens 3.9): `Slice(3)` indexes (the axis is dropped); `Slice((1, 5))` is
    `1:5`, `Slice((1, 5, 2))` is `1:5:2` and `Slice((5,))` is `:5`; `Slice([0, 3])` or a tensor
    takes those indices (a bool tensor is a mask); `Slice(None)` leaves the tensor unchanged.

    >>> Slice(-1).apply(torch.zeros(2, 7, 4), dim=1).shape
    torch.Size([2, 4])
    """

    def __init__(self, input_slice: SliceInput | Slice = None):
        if isinstance(input_slice, Slice):
            self.slice, self.mode = input_slice.slice, input_slice.mode
        elif isinstance(input_slice, tuple):
            self.slice, self.mode = slice(*input_slice), "slice"
        elif isinstance(input_slice, int):
            self.slice, self.mode = input_slice, "int"
        elif isinstance(input_slice, slice):
            self.slice, self.mode = input_slice, "slice"
        elif isinstance(input_slice, (list, Tensor)) or type(input_slice).__name__ == "ndarray":
            index = torch.as_tensor(input_slice)
            self.slice = index.long() if index.numel() == 0 else index  # an empty list indexes nothing
            self.mode = "array"
        elif input_slice is None:
            self.slice, self.mode = slice(None), "identity"
        else:
            raise ValueError(f"Invalid input_slice {input_slice!r}: give an int, a tuple, a slice, a list or a tensor")

    def apply(self, tensor: Tensor, dim: int = 0) -> Tensor:
        """`tensor` selected along `dim` (negative counts from the end)."""
        index = self.slice.to(tensor.device) if isinstance(self.slice, Tensor) else self.slice
        return tensor[(slice(None),) * (dim % tensor.ndim) + (index,)]

    def indices(self, max_ctx: int | None = None) -> Tensor:
        """The indices this slice selects on an axis of length `max_ctx` (a tensor; TransformerLens: numpy)."""
        if self.mode == "int":
            return torch.tensor([self.slice])
        if max_ctx is None:
            raise ValueError("max_ctx must be specified if slice is not an integer")
        return torch.arange(max_ctx)[self.slice]

    @classmethod
    def unwrap(cls, slice_input: SliceInput | Slice) -> Slice:
        """A `Slice` from any slice input; an int becomes `[int]`, keeping the axis (as TransformerLens)."""
        if isinstance(slice_input, Slice):
            return slice_input
        return cls([slice_input] if isinstance(slice_input, int) else slice_input)

    def __repr__(self) -> str:
        return f"Slice: {self.slice} Mode: {self.mode} "


PosSlice = SliceInput | Slice

_ATTN_NAMES = {"q", "k", "v", "z", "rot_q", "rot_k", "q_normed", "k_normed", "result", "pattern", "attn_scores"}
_MLP_NAMES = {
    "pre",
    "pre_linear",
    "post",
    "router_logits",
    "expert_weights",
    "expert_indices",
    "expert_pre",
    "expert_post",
}
_NAME_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_post": "post",
}
_LAYER_TYPE_ALIASES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}


_COMPACT_KEY = re.compile(r"([a-z_]+?)(\d+)([a-z]?.*)")  # name, layer, layer type: "scale4ln1", "k6a", "resid_pre5"


def act_name(
    name: str,
    layer: int | Int[Tensor, ""] | None = None,  # a 0-d tensor too, as TransformerLens' demos index caches
    layer_type: str | None = None,
) -> str:
    """Expand a TransformerLens shorthand: `act_name("z", 9)` -> `"blocks.9.attn.hook_z"`.

    Compact keys put the layer (and layer type) in the name, as TransformerLens' `get_act_name`:
    `"k6a"` -> `"blocks.6.attn.hook_k"`, `"scale4ln1"` -> `"blocks.4.ln1.hook_scale"`. Names with an
    underscore parse too (`"resid_pre5"` -> `"blocks.5.hook_resid_pre"`; TransformerLens gives `"hook_resid_pre5"`).
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = _COMPACT_KEY.fullmatch(name)
    if compact is not None:  # as TransformerLens, the numbers in the name win over the arguments
        name, layer, layer_type = compact.group(1), int(compact.group(2)), compact.group(3)
    name = _NAME_ALIASES.get(name, name)
    if name in _ATTN_NAMES:
        layer_type = "attn"
    elif name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type is not None:
        layer_type = _LAYER_TYPE_ALIASES.get(layer_type, layer_type)
    full = f"blocks.{layer}." if layer is not None else ""
    if layer_type:
        full += f"{layer_type}."
    full += f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full


def pos_axis(point: HookPoint) -> int:
    """The axis a `pos_slice` applies to: `pos`, or `query_pos` for scores and patterns."""
    for axis_name in ("pos", "query_pos"):
        if axis_name in point.axes:
            return point.axes.index(axis_name)
    raise ValueError(f"{point.name} has no position axis ({' '.join(point.axes)})")


def apply_pos_slice(tensor: Tensor, pos_slice: PosSlice, dim: int) -> Tensor:
    """Select positions along `dim`. An int keeps the axis (length 1) so shapes stay comparable;
    a TransformerLens `Slice` applies as it does there (`Slice(int)` drops the axis)."""
    if pos_slice is None:
        return tensor
    if isinstance(pos_slice, Slice):
        return pos_slice.apply(tensor, dim)
    if isinstance(pos_slice, int):
        index = pos_slice % tensor.shape[dim]
        return tensor.narrow(dim, index, 1)
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, slice):
        return tensor[(slice(None),) * dim + (pos_slice,)]
    index = torch.as_tensor(pos_slice, device=tensor.device, dtype=torch.long)
    return tensor.index_select(dim, index)
