"""`run_with_cache` and the `ActivationCache` it returns.

Nothing a later hook or the model does can change what was cached. TransformerLens stores the live
tensor, so an in-place edit by a later hook (at `blocks.{i+1}.hook_resid_pre`, say) silently rewrites
the cached `blocks.i.hook_resid_post`. Here the cache copies an activation (`detach().clone()`, or the
copy `.to(device)` makes) unless nothing could edit it after the cache saw it, which holds when
(`_by_reference`):

* the cache's hooks are the only hooks of the call: no hook added to the model, none of an enclosing
  `model.hooks()` block (any other hook might edit in place what it is handed, or a view of it);
* the model's forward never edits a hooked tensor in place (`HookedRootModule.edits_hooked_tensors`,
  False for the audited architectures: tests/core/test_cache.py checks every point of each after the
  forward); not under tensor parallelism, whose hooks see gathered tensors;
* the tensor is compact (not a view into a bigger buffer, such as GPT-2's q/k/v, slices of the fused
  `c_attn` output, or a `pos_slice`: those are copied so they do not pin the buffer) and is neither
  the forward's input (`start_at_layer`) nor its output (`stop_at_layer`), which the caller owns.

Then the cache keeps the detached activation itself, as TransformerLens does: copying every activation
cost a third of a forward (docs/benchmarks.md). The same tensor at two names (`blocks.i.hook_resid_post`
and `blocks.{i+1}.hook_resid_pre`) is then one buffer under both, as in TransformerLens; clone a cached
tensor before editing it in place. Gradients (`incl_bwd`) are always copied.

Keys are full hook names or the TransformerLens shorthands: `cache["z", 9]`, `cache["resid_post", -1]`,
`cache["scale", 3, "ln1"]`, `cache["embed"]`. The analysis helpers (`accumulated_resid`,
`decompose_resid`, `stack_head_results`, `apply_ln_to_stack`, `logit_attrs`) follow TransformerLens'
signatures (plus `get_expert_results` / `stack_expert_results`, each expert's write in a
mixture-of-experts block), with one difference that comes from loading weights unfolded: `logit_attrs` multiplies by
the final norm's weight before the unembedding, so attributions of a full decomposition add up to the
logits minus the constant `model.logit_bias_terms(tokens)` (norm bias and unembedding bias).

Positions and batch rows are chosen by `pos_slice` / `batch_slice`: a `slice`, a (start, stop[, step])
tuple, a list or tensor of indices, or an int, which here keeps a length-1 axis so shapes stay
comparable. TransformerLens' `Slice` object (`hooked/names.py`, also `hooked.transformer_lens.utils.Slice`) is taken
everywhere too and keeps TransformerLens' meaning: `Slice(-1)` indexes, dropping the axis.

`run_with_cache(..., sparse=names)` keeps the points `names` selects as torch sparse COO tensors (the indices and
values of their nonzero entries; `.to_dense()` gives the tensor back), converted as each point fires, so a forward
never holds their dense copies at once: a dictionary's features (hooked.sae, `sparse_features=True`), of which a
few in thousands are active. A nonzero entry costs 8 bytes per axis plus its value (28 bytes for a float32
[batch pos d_sae]), a dense one its value alone, so it pays below one active entry in seven.

`run_with_cache(..., stop_after=names)` ends the forward as soon as every point `names` selects has run (and been
cached): what a caller needs from the middle of a block is then not followed by the rest of the model. The output is
None when it stopped (`stop_at_layer` is the same for whole blocks, and returns the residual stream).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.components import accumulated_bias  # noqa: F401  (re-exported)
from hooked.decomposition import ResidualDecomposition
from hooked.hooks import AssertionValueError, HookPoint, NameFilter
from hooked.names import PosSlice, Slice, act_name, apply_pos_slice, pos_axis  # noqa: F401  (Slice, act_name re-exported)
from hooked.rows import current_rows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


def run_with_cache(
    model: HookedTransformer,
    *model_args,
    names_filter: NameFilter | None = None,
    device: torch.device | str | None = None,
    remove_batch_dim: bool = False,
    incl_bwd: bool = False,
    pos_slice: PosSlice = None,
    sparse: NameFilter | None = None,
    stop_after: NameFilter | None = None,
    **model_kwargs,
) -> tuple[Tensor | tuple[Tensor, Tensor] | None, ActivationCache]:  # the forward's output (by return_type)
    # Resolved by model.hooks() (a bad name there raises on every rank of a tensor-parallel group).
    names = model.default_cache_names() if names_filter is None else names_filter
    sparse_names = set() if sparse is None else set(model.resolve_hook_names(sparse))
    pending = set() if stop_after is None else set(model.resolve_hook_names(stop_after))
    if pending and incl_bwd:
        raise ValueError(
            "stop_after ends the forward before its output, so there is nothing to backpropagate"
            " (incl_bwd=True); drop one of them"
        )
    by_reference = _by_reference(model)
    store: dict[str, Tensor] = {}
    rows = {}  # the forward's position ids and mask, kept so a cache knows its padding

    def keep_rows(point: HookPoint) -> None:
        if not rows:
            current = current_rows()
            rows["position_ids"], rows["attention_mask"] = current.position_ids, current.attention_mask

    def keep(tensor: Tensor, point: HookPoint, copy: bool) -> Tensor:
        tensor = (
            apply_pos_slice(tensor.detach(), pos_slice, pos_axis(point)) if pos_slice is not None else tensor.detach()
        )
        if remove_batch_dim:
            if tensor.shape[0] != 1:
                raise AssertionValueError(
                    f"remove_batch_dim=True needs a batch of 1, but {point.name} has batch {tensor.shape[0]}"
                )
            tensor = tensor[0]
        moved = tensor.to(device) if device is not None else tensor
        if point.name in sparse_names:
            return moved.to_sparse()  # new buffers: nothing later can edit them
        if moved.data_ptr() != tensor.data_ptr():
            return moved  # .to() made the copy
        return moved.clone() if copy or not _compact(moved) else moved

    def save(tensor: Tensor, point: HookPoint) -> None:
        keep_rows(point)
        store[point.name] = keep(tensor, point, copy=not by_reference)

    def save_grad(grad: Tensor, point: HookPoint) -> None:
        store[point.name + "_grad"] = keep(grad, point, copy=True)  # autograd may accumulate into a gradient buffer

    def stop(tensor: Tensor, point: HookPoint) -> None:
        pending.discard(point.name)
        if not pending:
            raise _Stopped

    stops = [(sorted(pending), stop)] if pending else []  # after `save`: a point is cached before it stops the forward
    with model.hooks(fwd_hooks=[(names, save), *stops], bwd_hooks=[(names, save_grad)] if incl_bwd else []):
        try:
            output = model(*model_args, **model_kwargs)
        except _Stopped:
            output = None
        if by_reference:  # the caller's tensors (a start_at_layer input, a stop_at_layer output) are theirs to edit
            _copy_shared(store, [output, *model_args, *model_kwargs.values()])
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
    cache = ActivationCache(
        store, model, has_batch_dim=not remove_batch_dim, position_ids=position_ids, attention_mask=attention_mask
    )
    return output, cache


class _Stopped(Exception):
    """Raised by `run_with_cache`'s own hook once every `stop_after` point has run; caught there."""


def _by_reference(model: HookedTransformer) -> bool:
    """Whether the cache may keep the activations themselves: nothing but its own hooks runs in the call and the
    model's forward edits no hooked tensor in place (see the module docstring)."""
    return not (model.edits_hooked_tensors or getattr(model, "tensor_parallel", False) or model.hooks_attached())


def _compact(tensor: Tensor) -> bool:
    """Whether `tensor` is the whole of its storage (a view of a bigger buffer would pin all of it)."""
    return tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def _copy_shared(store: dict[str, Tensor], outside: list) -> None:
    """Copy every cached tensor that shares a buffer with one of `outside` (the call's inputs and output)."""
    storages = {t.untyped_storage().data_ptr() for t in outside if isinstance(t, Tensor) and t.is_floating_point()}
    if storages:
        for name, tensor in store.items():
            if tensor.untyped_storage().data_ptr() in storages:
                store[name] = tensor.clone()


class ActivationCache(ResidualDecomposition):
    """Activations of one forward, by hook name, with TransformerLens' analysis helpers."""

    def __init__(
        self,
        cache_dict: dict[str, Tensor],
        model: HookedTransformer,
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

    def to(self, device: torch.device | str) -> ActivationCache:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return ActivationCache(
            {k: v.to(device) for k, v in self.items()},
            self.model,
            self.has_batch_dim,
            move(self.position_ids),
            move(self.attention_mask),
        )

    def remove_batch_dim(self) -> ActivationCache:
        if self.has_batch_dim:
            for name, tensor in self.cache_dict.items():
                if tensor.shape[0] != 1:
                    raise AssertionValueError(
                        f"remove_batch_dim needs a batch of 1, but {name} has batch {tensor.shape[0]}"
                    )
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
    def apply_slice_to_batch_dim(self, batch_slice: PosSlice) -> ActivationCache:
        """A new cache with every activation sliced on the batch axis, as TransformerLens: an int
        (or `Slice(int)`) picks one prompt and drops the batch axis (`has_batch_dim` becomes False)."""
        batch_slice = Slice(batch_slice)
        if not self.has_batch_dim and batch_slice.mode != "identity":
            raise AssertionValueError("Cannot index into a cache without a batch dim")

        def cut(t: Tensor | None) -> Tensor | None:
            return None if t is None else batch_slice.apply(t, 0)

        return ActivationCache(
            {name: cut(t) for name, t in self.items()},
            self.model,
            has_batch_dim=self.has_batch_dim and batch_slice.mode != "int",
            position_ids=cut(self.position_ids),
            attention_mask=cut(self.attention_mask),
        )

    def toggle_autodiff(self, mode: bool = False) -> None:
        """`torch.set_grad_enabled(mode)`, global state, as TransformerLens (prefer `torch.inference_mode()`)."""
        logging.warning("Changed the global state, set autodiff to %s", mode)
        torch.set_grad_enabled(mode)
