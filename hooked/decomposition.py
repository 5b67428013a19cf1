"""What an `ActivationCache` reads out of the residual stream: TransformerLens' decomposition helpers.

`accumulated_resid`, `decompose_resid`, `apply_ln_to_stack`, `logit_attrs` and `stack_activation` here, and
per component (`stack_head_results`, `stack_neuron_results`, `stack_expert_results`,
`get_full_resid_decomposition`) in `hooked/components.py`, with TransformerLens' signatures, as methods every
`ActivationCache` has (it mixes this class in; see `hooked/cache.py` for the container and `docs/hooks.md`
for the differences).
The methods read the cache's activations (`self[name]`), its `model`, `has_batch_dim`,
`position_ids` and `attention_mask`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hooked.components import ComponentWrites, mlp_reads_attention
from hooked.names import PosSlice, Slice, act_name, apply_pos_slice


class ResidualDecomposition(ComponentWrites):
    """The decomposition helpers of `ActivationCache` (a mixin: it holds no state of its own)."""

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

    def _has_mlp(self, layer: int) -> bool:
        """Whether block `layer` has an MLP (an attention-only block, `cfg.attn_only`, has `mlp = None`)."""
        return self.model.blocks[layer].mlp is not None

    def _mlp_after_attention(self, layer: int, mlp_input: bool) -> bool:
        """Whether the MLP input of block `layer` (`mlp_input`) includes that block's attention output: not in
        a parallel-residual block, whose MLP reads resid_pre (see `mlp_reads_attention`)."""
        return mlp_input and layer < self.model.cfg.n_layers and mlp_reads_attention(self.model, layer)

    def _check_mlp_input(self, upto: int, mlp_input: bool) -> None:
        if mlp_input and upto < self.model.cfg.n_layers and not self._has_mlp(upto):
            raise ValueError(
                f"mlp_input=True: block {upto} is attention-only (no MLP, no ln2), so it has no MLP input;"
                " pass mlp_input=False"
            )

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
        `apply_ln` up to the final residual runs `ln_final` itself on each component (weight and
        bias included, statistics of that component: the logit lens), as TransformerLens 3.9; up to
        an earlier block it divides by that block's cached norm scale. An attention-only block has no
        `resid_mid` (as TransformerLens): `incl_mid` adds none for it.
        """
        upto = self._layers_upto(layer)
        self._check_mlp_input(upto, mlp_input)
        n_layers = self.model.cfg.n_layers
        components, labels = [], []
        for i in range(upto + 1):
            if i == n_layers:
                components.append(self["resid_post", n_layers - 1])
                labels.append("final_post")
                break
            components.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            has_mid = self._has_mlp(i) and mlp_reads_attention(self.model, i)  # no resid_mid: attention-only, parallel
            if ((incl_mid and i < upto) or (mlp_input and i == upto)) and has_mid:
                components.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        return self._stack(
            components, labels, layer, mlp_input, apply_ln, pos_slice, return_labels, recompute_ln=upto == n_layers
        )

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
        rounding. Returns [component, batch, pos, d_model]. Attention-only blocks have no `mlp_out`.
        """
        upto = self._layers_upto(layer)
        self._check_mlp_input(upto, mlp_input)
        components, labels = [], []
        if incl_embeds:
            for name in self.model.embedding_hook_names:
                components.append(self[name])
                labels.append(name.removeprefix("hook_"))
        for i in range(upto):
            if mode in ("all", "attn"):
                components.append(self["attn_out", i])
                labels.append(f"{i}_attn_out")
            if mode in ("all", "mlp") and self._has_mlp(i):
                components.append(self["mlp_out", i])
                labels.append(f"{i}_mlp_out")
        if self._mlp_after_attention(upto, mlp_input) and mode in ("all", "attn"):
            components.append(self["attn_out", upto])
            labels.append(f"{upto}_attn_out")
        return self._stack(components, labels, layer, mlp_input, apply_ln, pos_slice, return_labels)

    def _stack(self, components, labels, layer, mlp_input, apply_ln, pos_slice, return_labels, recompute_ln=False):
        stack = torch.stack([self._slice(t, pos_slice) for t in components])
        if apply_ln:
            stack = self.apply_ln_to_stack(
                stack,
                layer,
                mlp_input=mlp_input,
                pos_slice=pos_slice,
                has_batch_dim=self.has_batch_dim,
                recompute_ln=recompute_ln,
            )
        return (stack, labels) if return_labels else stack

    def _empty_stack(self, pos_slice: PosSlice, width: int | None = None) -> Tensor:
        """[0, batch, pos, d_model]: what a stack of no components looks like (layer 0)."""
        like = self._slice(self[self.model.embedding_hook_names[0]], pos_slice)
        shape = like.shape if width is None else (*like.shape[:-1], width)
        return like.new_zeros((0, *shape))

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
        recompute_ln: bool = False,
    ) -> Tensor:
        """Normalise each component with the scale the real forward used at that norm.

        LayerNorm centres each component and divides by the cached `hook_scale`; RMSNorm only divides.
        The norm's weight and bias are *not* applied (as in TransformerLens); `logit_attrs` applies
        the weight. `batch_slice` is applied to the stack's batch axis and to the scale, as
        TransformerLens. `recompute_ln=True` into the unembedding instead runs `ln_final` itself on
        each component (its own statistics, weight and bias): the logit lens.
        """
        upto = self._layers_upto(layer)
        if batch_slice is not None and not isinstance(batch_slice, Slice):
            batch_slice = Slice(batch_slice)  # as TransformerLens: an int picks one prompt and drops the axis
        if has_batch_dim and batch_slice is not None:
            residual_stack = apply_pos_slice(residual_stack, batch_slice, 1)
        if recompute_ln and upto == self.model.cfg.n_layers:
            return self.model.ln_final(residual_stack)
        norm, scale = self._norm_and_scale(upto, mlp_input, pos_slice)
        if batch_slice is not None and self.has_batch_dim:
            scale = apply_pos_slice(scale, batch_slice, 0)
        if not has_batch_dim and self.has_batch_dim:
            scale = scale[0]
        return norm.normalize_with_scale(residual_stack, scale)

    def _norm_and_scale(self, upto: int, mlp_input: bool, pos_slice: PosSlice) -> tuple[torch.nn.Module, Tensor]:
        """The norm read at block `upto`'s input (ln_final past the last block) and its cached scale."""
        if upto == self.model.cfg.n_layers:
            norm, scale_name = self.model.ln_final, "ln_final.hook_scale"
        else:
            block = self.model.blocks[upto]
            self._check_mlp_input(upto, mlp_input)
            norm, scale_name = (
                (block.ln2, act_name("scale", upto, "ln2"))
                if mlp_input
                else (block.ln1, act_name("scale", upto, "ln1"))
            )
        if scale_name not in self.cache_dict:
            raise KeyError(
                f"apply_ln needs {scale_name} in the cache; run run_with_cache without a names_filter that drops it"
            )
        return norm, self._slice(self.cache_dict[scale_name], pos_slice)

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
        projected on the unembedding columns: [component, ...] (the d_model axis is reduced). With
        one answer per prompt (`tokens` [batch]) or one token for all, and an int `pos_slice`, the
        result is [component, batch], as TransformerLens, whether the stack kept the length-1 position axis
        (`decompose_resid(pos_slice=-1)` here) or not.
        """
        if incorrect_tokens is not None and _token_shape(tokens) != _token_shape(incorrect_tokens):
            raise ValueError(
                f"tokens and incorrect_tokens must have the same shape! "
                f"(tokens.shape={_token_shape(tokens)}, incorrect_tokens.shape={_token_shape(incorrect_tokens)})"
            )
        normalized = self.apply_ln_to_stack(
            residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim
        )
        direction = self.model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            direction = direction - self.model.tokens_to_residual_directions(incorrect_tokens)
        direction = direction.to(normalized.device, normalized.dtype)
        one_position = (
            isinstance(pos_slice, int) and has_batch_dim and normalized.ndim == 4 and normalized.shape[2] == 1
        )
        if (
            one_position and len(_token_shape(tokens)) <= 1
        ):  # answers [batch] or one token, stack [component batch 1 d_model]
            normalized = normalized[:, :, 0]
        return (normalized * direction).sum(-1)

    def _slice(self, tensor: Tensor, pos_slice: PosSlice) -> Tensor:
        # The analysis methods read pos_slice as TransformerLens does: an int indexes, dropping the axis.
        return Slice(pos_slice).apply(tensor, 1 if self.has_batch_dim else 0)

    def stack_activation(
        self, activation_name: str, layer: int | None = -1, sublayer_type: str | None = None
    ) -> Tensor:
        """`cache[activation_name, i, sublayer_type]` for every block before `layer` (-1 or None: all),
        stacked on a new leading axis: `cache.stack_activation("scale", sublayer_type="ln2")`."""
        upto = self.model.cfg.n_layers if layer is None or layer == -1 else layer
        return torch.stack([self[activation_name, i, sublayer_type] for i in range(upto)])


def _token_shape(tokens) -> tuple[int, ...]:
    return tuple(tokens.shape) if isinstance(tokens, Tensor) else ()
