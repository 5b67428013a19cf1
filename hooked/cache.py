"""`run_with_cache` and the `ActivationCache` it returns.

The cache stores a *copy* of each activation (`detach().clone()`, or the copy `.to(device)` makes).
TransformerLens stores the live tensor, so `blocks.i.hook_resid_post` and `blocks.{i+1}.hook_resid_pre`
share storage and an in-place edit at one silently rewrites the cached other; here nothing a later
hook does can change what was cached, and the cache holds exactly one buffer per activation
(`benchmarks/cache_memory.py`).

Keys are full hook names or the TransformerLens shorthands: `cache["z", 9]`, `cache["resid_post", -1]`,
`cache["scale", 3, "ln1"]`, `cache["embed"]`. The analysis helpers (`accumulated_resid`,
`decompose_resid`, `stack_head_results`, `apply_ln_to_stack`, `logit_attrs`) follow TransformerLens'
signatures (plus `get_expert_results` / `stack_expert_results`, each expert's write in a
mixture-of-experts block), with one difference that comes from loading weights unfolded: `logit_attrs` multiplies by
the final norm's weight before the unembedding, so attributions of a full decomposition add up to the
logits minus the constant `model.logit_bias_terms(tokens)` (norm bias and unembedding bias).

Positions and batch rows are chosen by `pos_slice` / `batch_slice`: a `slice`, a (start, stop[, step])
tuple, a list or tensor of indices, or an int, which here keeps a length-1 axis so shapes stay
comparable. TransformerLens' `Slice` object (`hooked/names.py`, also `hooked.utils.Slice`) is taken
everywhere too and keeps TransformerLens' meaning: `Slice(-1)` indexes, dropping the axis.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.decomposition import ResidualDecomposition, accumulated_bias  # noqa: F401  (accumulated_bias re-exported)
from hooked.hooks import HookPoint, NameFilter, current_rows
from hooked.names import PosSlice, Slice, act_name, apply_pos_slice, pos_axis  # noqa: F401  (Slice, act_name re-exported)

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

def run_with_cache(
    model: "HookedTransformer",
    *model_args,
    names_filter: NameFilter | None = None,
    device: torch.device | str | None = None,
    remove_batch_dim: bool = False,
    incl_bwd: bool = False,
    pos_slice: PosSlice = None,
    **model_kwargs,
) -> tuple[Tensor, "ActivationCache"]:
    # Resolved by model.hooks() (a bad name there raises on every rank of a tensor-parallel group).
    names = model.default_cache_names() if names_filter is None else names_filter
    store: dict[str, Tensor] = {}
    rows = {}  # the forward's position ids and mask, kept so a cache knows its padding

    def keep_rows(point: HookPoint) -> None:
        if not rows:
            current = current_rows()
            rows["position_ids"], rows["attention_mask"] = current.position_ids, current.attention_mask

    def keep(tensor: Tensor, point: HookPoint) -> Tensor:
        tensor = apply_pos_slice(tensor.detach(), pos_slice, pos_axis(point)) if pos_slice is not None else tensor.detach()
        if remove_batch_dim:
            if tensor.shape[0] != 1:
                raise ValueError(f"remove_batch_dim=True needs a batch of 1, but {point.name} has batch {tensor.shape[0]}")
            tensor = tensor[0]
        moved = tensor.to(device) if device is not None else tensor
        return moved.clone() if moved.data_ptr() == tensor.data_ptr() else moved

    def save(tensor: Tensor, point: HookPoint) -> None:
        keep_rows(point)
        store[point.name] = keep(tensor, point)

    def save_grad(grad: Tensor, point: HookPoint) -> None:
        store[point.name + "_grad"] = keep(grad, point)

    with model.hooks(fwd_hooks=[(names, save)], bwd_hooks=[(names, save_grad)] if incl_bwd else []):
        output = model(*model_args, **model_kwargs)
        if incl_bwd:
            if output.ndim != 0:
                raise ValueError(
                    "incl_bwd=True backpropagates from the model's output, which must be a scalar;"
                    " pass return_type='loss'"
                )
            output.backward()
    position_ids, attention_mask = rows.get("position_ids"), rows.get("attention_mask")
    if pos_slice is not None and position_ids is not None:
        position_ids = apply_pos_slice(position_ids, pos_slice, 1)
        attention_mask = None if attention_mask is None else apply_pos_slice(attention_mask, pos_slice, 1)
    if remove_batch_dim and position_ids is not None:
        position_ids = position_ids[0]
        attention_mask = None if attention_mask is None else attention_mask[0]
    cache = ActivationCache(store, model, has_batch_dim=not remove_batch_dim,
                            position_ids=position_ids, attention_mask=attention_mask)
    return output, cache


class ActivationCache(ResidualDecomposition):
    """Activations of one forward, by hook name, with TransformerLens' analysis helpers."""

    def __init__(
        self,
        cache_dict: dict[str, Tensor],
        model: "HookedTransformer",
        has_batch_dim: bool = True,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.position_ids = position_ids  # [batch pos] each column's position in its prompt
        self.attention_mask = attention_mask  # [batch pos] True for real tokens; None: no padding

    # ----------------------------------------------------------------- mapping
    def _key(self, key) -> str:
        if isinstance(key, tuple):
            name, layer, *layer_type = key
            if layer is not None and layer < 0:
                layer += self.model.cfg.n_layers
            return act_name(name, layer, *layer_type)
        return act_name(key)

    def __getitem__(self, key) -> Tensor:
        name = self._key(key)
        if name not in self.cache_dict:
            if name in self.model.hook_dict or name.removesuffix("_grad") in self.model.hook_dict:
                raise KeyError(f"{name!r} was not cached by this run (check names_filter / incl_bwd)")
            self.model._check_name(name)  # raises with the nearest real names
        return self.cache_dict[name]

    def __contains__(self, key) -> bool:
        return self._key(key) in self.cache_dict

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache with {len(self)} activations: {list(self.cache_dict)[:4]}..."

    def to(self, device: torch.device | str) -> "ActivationCache":
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return ActivationCache({k: v.to(device) for k, v in self.items()}, self.model, self.has_batch_dim,
                               move(self.position_ids), move(self.attention_mask))

    def remove_batch_dim(self) -> "ActivationCache":
        if self.has_batch_dim:
            for name, tensor in self.cache_dict.items():
                if tensor.shape[0] != 1:
                    raise ValueError(f"remove_batch_dim needs a batch of 1, but {name} has batch {tensor.shape[0]}")
            self.cache_dict = {k: v[0] for k, v in self.cache_dict.items()}
            self.has_batch_dim = False
            if self.position_ids is not None:
                self.position_ids = self.position_ids[0]
                self.attention_mask = None if self.attention_mask is None else self.attention_mask[0]
        return self

    def nbytes(self) -> int:
        """Bytes held by distinct storages (a shared buffer counts once)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.values()}
        return sum(storages.values())

    # ----------------------------------------------------------------- residual decompositions
    def apply_slice_to_batch_dim(self, batch_slice: PosSlice) -> "ActivationCache":
        """A new cache with every activation sliced on the batch axis, as TransformerLens: an int
        (or `Slice(int)`) picks one prompt and drops the batch axis (`has_batch_dim` becomes False)."""
        batch_slice = Slice(batch_slice)
        if not self.has_batch_dim and batch_slice.mode != "identity":
            raise ValueError("Cannot index into a cache without a batch dim")

        def cut(t: Tensor | None) -> Tensor | None:
            return None if t is None else batch_slice.apply(t, 0)

        return ActivationCache({name: cut(t) for name, t in self.items()}, self.model,
                               has_batch_dim=self.has_batch_dim and batch_slice.mode != "int",
                               position_ids=cut(self.position_ids), attention_mask=cut(self.attention_mask))

    def toggle_autodiff(self, mode: bool = False) -> None:
        """`torch.set_grad_enabled(mode)`, global state, as TransformerLens (prefer `torch.inference_mode()`)."""
        logging.warning("Changed the global state, set autodiff to %s", mode)
        torch.set_grad_enabled(mode)
