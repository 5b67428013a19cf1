"""The model's weights under the names TransformerLens users read: `model.embed.W_E`, `model.pos_embed.W_pos`,
`model.unembed.W_U`, the `[n_layers ...]` stacks (`model.W_Q`, ..., `model.OV`, `model.QK`) and the unembedding
read-outs. A mixin of `HookedTransformer` (hooked/models/base.py); the per-module views (`blocks[i].attn.W_Q`, ...)
are declared by each attention and MLP module.

Every view is read from the model's own parameters on each access, so it shows the weights the model computes
with (processed only where the model was: hooked/processing.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from hooked.factored import ov_circuit, qk_circuit


class WeightView:
    """A TransformerLens module's weights under its attribute names (`model.embed.W_E`, `model.unembed.W_U`),
    read from the model's own parameters on each access; calling it calls `call`.

    Not an `nn.Module`: the parameters keep their checkpoint names (`wte.weight`, `lm_head.weight`) and
    appear once in the state dict, and the weights stay those the model computes with, processed or not.
    """

    def __init__(self, name: str, call, **weights):
        self._name, self._call, self._weights = name, call, weights  # weights: attribute -> zero-argument function

    def __call__(self, *args, **kwargs):
        if self._call is None:
            raise TypeError(
                f"model.{self._name} is not callable in hooked; read its weights ({', '.join(self._weights)})"
            )
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str):
        weights = self.__dict__.get("_weights", {})
        if name in weights:
            return weights[name]()
        raise AttributeError(
            f"model.{self.__dict__.get('_name')} has no attribute {name!r} (it has {', '.join(weights)})"
        )

    def __dir__(self):
        return [*super().__dir__(), *self._weights]

    def __repr__(self) -> str:
        return f"WeightView(model.{self._name}: {', '.join(self._weights)})"


class StackedOverBlocks:
    """A read-only attribute of the model: `blocks[i].<sublayer>.<the attribute's own name>` stacked over the blocks
    (`WeightStacks._stack_blocks`), as TransformerLens' `model.W_Q`; `doc` gives its shape."""

    def __init__(self, sublayer: str, doc: str):
        self.sublayer, self.__doc__ = sublayer, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, model, owner: type | None = None):
        return self if model is None else model._stack_blocks(self.sublayer, self.name)

    def __set__(self, model, value) -> None:
        raise AttributeError(f"model.{self.name} is built from the blocks' weights on each access: set those instead")


class WeightStacks:
    """TransformerLens' weight attributes of a model (a mixin: the weights are the model's)."""

    @property
    def embed(self) -> WeightView:
        """TransformerLens' `model.embed`: `.W_E` [d_vocab d_model]; `model.embed(tokens)` is `W_E[tokens]`, as
        there, and `model.embed(tokens, position_ids)` the model's first step (`resid_from_tokens`: the
        embedding hooks fire, positions are added on GPT-2)."""

        def call(tokens: Tensor, position_ids: Tensor | None = None) -> Tensor:
            if position_ids is not None:
                return self.resid_from_tokens(self.token_ids(tokens), position_ids)
            if self.tensor_parallel:  # W_E holds this rank's vocabulary rows only
                raise ValueError(
                    "model.embed(tokens) under tensor parallelism: pass position_ids (the model's first step)"
                )
            return self.W_E[tokens]

        return WeightView("embed", call, W_E=lambda: self.W_E)

    @property
    def unembed(self) -> WeightView:
        """TransformerLens' `model.unembed`: `.W_U` [d_model d_vocab], `.b_U` [d_vocab], as `model.W_U` / `b_U`.

        Calling it is TransformerLens' step: `model.unembed(x)` is `x @ W_U + b_U`, without the final norm
        (TransformerLens notebooks call `model.unembed(model.ln_final(resid))`). `logits_from_resid(resid)`
        applies the final norm too.
        """

        def call(x: Float[Tensor, "... d_model"]) -> Tensor:
            bias = self.unembed_bias
            return F.linear(x, self.unembed_weight, bias)

        return WeightView("unembed", call, W_U=lambda: self.W_U, b_U=lambda: self.b_U)

    @property
    def pos_embed(self) -> WeightView:
        """TransformerLens' `model.pos_embed`: `.W_pos` [n_ctx d_model], on a model that declares `W_pos` (GPT-2);
        rotary models have none, as there.

        Calling it is TransformerLens 3.9's `PosEmbed.forward(tokens, past_kv_pos_offset=0, attention_mask=None)`:
        [batch pos d_model], `W_pos` at positions `past_kv_pos_offset + 0..pos-1`, or, with an attention mask
        over the past and present columns, each token's position in its own prompt, 0 at padded positions (what
        `hook_pos_embed` holds in the forward). No hook fires.
        """
        if not hasattr(type(self), "W_pos"):
            raise AttributeError(f"{type(self).__name__} has no pos_embed: its positions are rotary (no W_pos)")

        def call(tokens: Tensor, past_kv_pos_offset: int = 0, attention_mask: Tensor | None = None) -> Tensor:
            batch, length = tokens.shape[0], tokens.shape[-1]
            if attention_mask is None:
                if past_kv_pos_offset + length > self.cfg.n_ctx:
                    raise ValueError(
                        f"positions {past_kv_pos_offset}..{past_kv_pos_offset + length - 1} are past this"
                        f" model's {self.cfg.n_ctx} positions"
                    )
                return self.W_pos[past_kv_pos_offset : past_kv_pos_offset + length].expand(batch, -1, -1).clone()
            mask = attention_mask.to(device=self.W_pos.device, dtype=torch.bool)
            if mask.shape != (batch, past_kv_pos_offset + length):
                raise ValueError(
                    f"attention_mask has shape {tuple(mask.shape)}; it must cover the past and present"
                    f" columns, [batch past+pos] = {(batch, past_kv_pos_offset + length)}"
                )
            positions = (mask.long().cumsum(1) - 1).clamp(min=0)[:, past_kv_pos_offset:]
            return self.W_pos[positions].masked_fill(~mask[:, past_kv_pos_offset:, None], 0.0)

        return WeightView("pos_embed", call, W_pos=lambda: self.W_pos)

    # ----------------------------------------------------------------- unembedding helpers
    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed_weight.T

    @property
    def b_U(self) -> Float[Tensor, " d_vocab"]:
        """The unembedding bias: zeros, as in TransformerLens, unless weight processing folded the final
        LayerNorm's bias into it (`unembed_bias`)."""
        bias = self.unembed_bias
        return self.unembed_weight.new_zeros(self.cfg.d_vocab) if bias is None else bias

    # TransformerLens' stacked weights, [n_layers, ...]: copies, built on each access, of the model's own
    # weights (processed only where the model was: hooked.processing). Grouped-query key/value heads
    # are repeated to one per query head, as
    # TransformerLens does (blocks[i].attn.W_K_grouped keeps them grouped).
    def _stack_blocks(self, module: str, name: str) -> Tensor:
        if any(getattr(block, module) is None for block in self.blocks):  # cfg.attn_only: block.mlp is None
            raise ValueError(f"model.{name}: this model's blocks have no {module} (attention-only, cfg.attn_only)")
        parts = [getattr(getattr(block, module), name, None) for block in self.blocks]
        shapes = [None if part is None else list(part.shape) for part in parts]
        if None in shapes or any(shape != shapes[0] for shape in shapes):
            listed = ", ".join(f"block {i}: {shape or 'none'}" for i, shape in enumerate(shapes))
            raise ValueError(
                f"model.{name} stacks blocks[i].{module}.{name} over the blocks, but they differ ({listed}; a"
                f" mixture-of-experts MLP has one per expert): read blocks[i].{module}.{name}"
            )
        return torch.stack(parts)

    W_Q = StackedOverBlocks("attn", "[n_layers head_index d_model d_head]")
    W_K = StackedOverBlocks("attn", "[n_layers head_index d_model d_head] (k/v heads repeated per query head)")
    W_V = StackedOverBlocks("attn", "[n_layers head_index d_model d_head] (k/v heads repeated per query head)")
    W_O = StackedOverBlocks("attn", "[n_layers head_index d_head d_model]")
    b_Q = StackedOverBlocks("attn", "[n_layers head_index d_head] (zeros without biases)")
    b_K = StackedOverBlocks("attn", "[n_layers head_index d_head] (zeros without biases)")
    b_V = StackedOverBlocks("attn", "[n_layers head_index d_head] (zeros without biases)")
    b_O = StackedOverBlocks("attn", "[n_layers d_model] (zeros without biases)")
    W_in = StackedOverBlocks("mlp", "[n_layers d_model d_mlp] (dense MLPs)")
    W_out = StackedOverBlocks("mlp", "[n_layers d_mlp d_model] (dense MLPs)")
    b_in = StackedOverBlocks("mlp", "[n_layers d_mlp] (dense MLPs; zeros without biases)")
    b_out = StackedOverBlocks("mlp", "[n_layers d_model] (dense MLPs; zeros without biases)")
    OV = property(
        ov_circuit, doc="Every head's OV circuit W_V @ W_O: FactoredMatrix [n_layers head_index d_model d_model]"
    )
    QK = property(
        qk_circuit, doc="Every head's QK circuit W_Q @ W_K^T: FactoredMatrix [n_layers head_index d_model d_model]"
    )

    def tokens_to_residual_directions(self, tokens) -> Tensor:
        """The direction in the normalised residual stream that reads out each token's logit.

        It includes the final norm's weight (1 once `fold_ln` has folded it into the unembedding): [d_model]
        for one token (a str, an int or a one-element tensor of any rank, squeezed as TransformerLens does),
        [..., d_model] for a tensor of several tokens.
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.unembed_weight.device)
        if tokens.numel() == 1:
            tokens = tokens.reshape(())
        return self._unembed_rows(tokens) * self.ln_final.gain

    def logit_bias_terms(self, tokens) -> Tensor:
        """The part of a token's logit no residual component writes: final-norm bias @ W_U (+ b_U)."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.unembed_weight.device)
        bias = getattr(self.ln_final, "bias", None)
        terms = (
            torch.zeros(tokens.shape, dtype=self.dtype, device=tokens.device)
            if bias is None
            else self._unembed_rows(tokens) @ bias
        )
        return terms if self.unembed_bias is None else terms + self.unembed_bias[tokens]
