"""`run_with_cache` and the `ActivationCache` it returns.

The cache stores a *copy* of each activation (`detach().clone()`, or the copy `.to(device)` makes).
TransformerLens stores the live tensor, so `blocks.i.hook_resid_post` and `blocks.{i+1}.hook_resid_pre`
share storage and an in-place edit at one silently rewrites the cached other; here nothing a later
hook does can change what was cached, and the cache holds exactly one buffer per activation
(`benchmarks/cache_memory.py`).

Keys are full hook names or the TransformerLens shorthands: `cache["z", 9]`, `cache["resid_post", -1]`,
`cache["scale", 3, "ln1"]`, `cache["embed"]`. The analysis helpers (`accumulated_resid`,
`decompose_resid`, `stack_head_results`, `apply_ln_to_stack`, `logit_attrs`) follow TransformerLens'
signatures, with one difference that comes from loading weights unfolded: `logit_attrs` multiplies by
the final norm's weight before the unembedding, so attributions of a full decomposition add up to the
logits minus the constant `model.logit_bias_terms(tokens)` (norm bias and unembedding bias).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Union

import torch
from torch import Tensor

from hooked.hooks import HookPoint, NameFilter, current_rows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

PosSlice = Union[None, int, slice, tuple, Sequence[int], Tensor]

_ATTN_NAMES = {"q", "k", "v", "z", "rot_q", "rot_k", "q_normed", "k_normed", "result", "pattern", "attn_scores"}
_MLP_NAMES = {
    "pre", "pre_linear", "post", "router_logits", "expert_weights", "expert_indices", "expert_pre", "expert_post",
}
_NAME_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                 "mlp_pre": "pre", "mlp_post": "post"}
_LAYER_TYPE_ALIASES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """Expand a TransformerLens shorthand: `act_name("z", 9)` -> `"blocks.9.attn.hook_z"`."""
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
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
    """Select positions along `dim`. An int keeps the axis (length 1) so shapes stay comparable."""
    if pos_slice is None:
        return tensor
    if isinstance(pos_slice, int):
        index = pos_slice % tensor.shape[dim]
        return tensor.narrow(dim, index, 1)
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, slice):
        return tensor[(slice(None),) * dim + (pos_slice,)]
    index = torch.as_tensor(pos_slice, device=tensor.device, dtype=torch.long)
    return tensor.index_select(dim, index)


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
    names = model.hook_names if names_filter is None else model.resolve_hook_names(names_filter)
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


class ActivationCache:
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
    def _layers_upto(self, layer: int | None) -> int:
        """How many blocks a decomposition covers. As TransformerLens 3.9: None and -1 mean every block
        plus the final residual (before the final norm); other negatives count back from there."""
        n_layers = self.model.cfg.n_layers
        if layer is None:
            return n_layers
        upto = n_layers + 1 + layer if layer < 0 else layer
        if not 0 <= upto <= n_layers:
            raise IndexError(f"layer {layer} is out of range for {n_layers} layers (0..{n_layers}, or -1 for all)")
        return upto

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ):
        """Residual stream before each block up to `layer` (all, plus the final one, by default).

        Returns [component, batch, pos, d_model]; labels `"0_pre"`, `"0_mid"`, ..., `"final_post"`.
        """
        upto = self._layers_upto(layer)
        n_layers = self.model.cfg.n_layers
        components, labels = [], []
        for i in range(upto + 1):
            if i == n_layers:
                components.append(self["resid_post", n_layers - 1])
                labels.append("final_post")
                break
            components.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if (incl_mid and i < upto) or (mlp_input and i == upto):
                components.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        return self._stack(components, labels, layer, mlp_input, apply_ln, pos_slice, return_labels)

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ):
        """The residual stream at `layer` split into what each component wrote.

        Components: `embed`, `pos_embed` (GPT-2), then `{i}_attn_out` and `{i}_mlp_out` per block
        (`mode` "attn" or "mlp" keeps one kind). They sum to the residual stream exactly up to float
        rounding. Returns [component, batch, pos, d_model].
        """
        upto = self._layers_upto(layer)
        components, labels = [], []
        if incl_embeds:
            for name in self.model.embedding_hook_names:
                components.append(self[name])
                labels.append(name.removeprefix("hook_"))
        for i in range(upto):
            if mode in ("all", "attn"):
                components.append(self["attn_out", i])
                labels.append(f"{i}_attn_out")
            if mode in ("all", "mlp"):
                components.append(self["mlp_out", i])
                labels.append(f"{i}_mlp_out")
        if mlp_input and upto < self.model.cfg.n_layers and mode in ("all", "attn"):
            components.append(self["attn_out", upto])
            labels.append(f"{upto}_attn_out")
        return self._stack(components, labels, layer, mlp_input, apply_ln, pos_slice, return_labels)

    def _stack(self, components, labels, layer, mlp_input, apply_ln, pos_slice, return_labels):
        stack = torch.stack([self._slice(t, pos_slice) for t in components])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
    ):
        """Every head's write to the residual stream for blocks before `layer` (-1: all blocks).

        Uses cached `hook_result` where present, else computes `z[..., h, :] @ W_O[h]` from the
        cached `hook_z` and the model's weights. Returns [component, batch, pos, d_model] with labels
        `L{layer}H{head}`; `incl_remainder` appends what is left of the residual stream.
        """
        upto = self.model.cfg.n_layers if layer == -1 else layer
        components, labels = [], []
        for i in range(upto):
            result_name = act_name("result", i)
            if result_name in self.cache_dict:
                result = self.cache_dict[result_name]
            else:
                z = self["z", i]
                w_o = self.model.blocks[i].attn.W_O.to(z.device, z.dtype)
                result = torch.einsum("...hd,hdm->...hm", z, w_o)
            result = self._slice(result, pos_slice)
            head_axis = result.ndim - 2
            for h in range(result.shape[head_axis]):
                components.append(result.select(head_axis, h))
                labels.append(f"L{i}H{h}")
        stack = torch.stack(components)
        if incl_remainder:
            resid = self._slice(self._final_or_pre(upto), pos_slice)
            stack = torch.cat([stack, (resid - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, None if layer == -1 else layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _final_or_pre(self, layer: int) -> Tensor:
        if layer >= self.model.cfg.n_layers:
            return self["resid_post", self.model.cfg.n_layers - 1]
        return self["resid_pre", layer]

    def apply_ln_to_stack(
        self,
        residual_stack: Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: PosSlice = None,
        batch_slice: PosSlice = None,
        has_batch_dim: bool = True,
    ) -> Tensor:
        """Normalise each component with the scale the real forward used at that norm.

        LayerNorm centres each component and divides by the cached `hook_scale`; RMSNorm only divides.
        The norm's weight and bias are *not* applied (as in TransformerLens); `logit_attrs` applies
        the weight.
        """
        upto = self._layers_upto(layer)
        if upto == self.model.cfg.n_layers:
            norm, scale_name = self.model.ln_final, "ln_final.hook_scale"
        else:
            block = self.model.blocks[upto]
            norm, scale_name = (block.ln2, act_name("scale", upto, "ln2")) if mlp_input else (block.ln1, act_name("scale", upto, "ln1"))
        if scale_name not in self.cache_dict:
            raise KeyError(f"apply_ln needs {scale_name} in the cache; run run_with_cache without a names_filter that drops it")
        scale = self._slice(self.cache_dict[scale_name], pos_slice)
        if batch_slice is not None and has_batch_dim:
            scale = apply_pos_slice(scale, batch_slice, 0)
        if not has_batch_dim and self.has_batch_dim:
            scale = scale[0]
        return norm.normalize_with_scale(residual_stack, scale)

    def logit_attrs(
        self,
        residual_stack: Tensor,
        tokens: Tensor | int | str,
        incorrect_tokens: Tensor | int | str | None = None,
        pos_slice: PosSlice = None,
        batch_slice: PosSlice = None,
        has_batch_dim: bool = True,
    ) -> Tensor:
        """Each component's direct contribution to the logit of `tokens` (minus `incorrect_tokens`).

        The stack is normalised with the final norm's cached scale, multiplied by its weight, and
        projected on the unembedding columns: [component, ...] (the d_model axis is reduced).
        """
        normalized = self.apply_ln_to_stack(residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim)
        direction = self.model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            direction = direction - self.model.tokens_to_residual_directions(incorrect_tokens)
        direction = direction.to(normalized.device, normalized.dtype)
        if direction.ndim == 1:
            return normalized @ direction
        return (normalized * direction).sum(-1)

    def _slice(self, tensor: Tensor, pos_slice: PosSlice) -> Tensor:
        return apply_pos_slice(tensor, pos_slice, 1 if self.has_batch_dim else 0)

    def stack_activation(self, name: str, layer: int = -1) -> Tensor:
        """`cache[name, i]` for every block before `layer`, stacked on a new leading axis."""
        upto = self.model.cfg.n_layers if layer == -1 else layer
        return torch.stack([self[name, i] for i in range(upto)])
