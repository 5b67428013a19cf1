"""The decoder Gemma 2 and Gemma 3 are built on: sandwich norms, Gemma's RMSNorm, per-layer sliding windows,
embeddings scaled by sqrt(d_model) and capped logits.

Numerics follow Hugging Face transformers 5.24 `models/gemma2/modeling_gemma2.py` (and
`models/gemma3/modeling_gemma3.py`, the same there) operation for operation:

    resid  = embed_tokens[tokens] * normalizer      # normalizer = float32(sqrt(hidden_size)) cast to the weights' dtype
    resid_mid  = resid_pre + ln1_post(attn(ln1(resid_pre)))      # input_layernorm, post_attention_layernorm
    resid_post = resid_mid + ln2_post(mlp(ln2(resid_mid)))       # pre_feedforward_layernorm, post_feedforward_layernorm
    logits = cap * tanh((ln_final(resid) @ W_U) / cap)           # final_logit_softcapping

Every norm is Gemma's RMSNorm: `x * rsqrt(mean(x^2) + eps)` in float32, times `(1 + weight)` in float32, cast
back at the end (the weight stores the gain minus one; hooked.layers.RMSNorm casts before its weight). The MLP is
gated by `gelu_pytorch_tanh`. Layers whose `layer_types` entry is "sliding_attention" see only the last
`sliding_window` columns: a block knows its layer type and picks its mask and rotary table from `block_inputs`,
which holds every variant once per forward (global and local cos/sin, full and windowed masks). The attention is
`GroupedQueryAttention` with the family's score scale and cap (Gemma 2) or per-head Gemma norms (Gemma 3).

Names are TransformerLens 3.9's (`components/transformer_block.py` with `use_normalization_before_and_after`,
`pretrained/weight_conversions/gemma.py`): `ln1` / `ln2` the pre-norms, `ln1_post` / `ln2_post` the
post-norms, `hook_attn_out` / `hook_mlp_out` after the post-norm (what the residual stream gains); hooked adds
`hook_attn_out_pre_norm` / `hook_mlp_out_pre_norm` before it (as OLMo 2). See docs/gemma2.md and docs/gemma3.md.
"""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import AttentionMask, GatedMLP, RMSNorm, attention_input, mlp_input, softcap_
from hooked.models.base import DecoderBlock
from hooked.models.config import alias
from hooked.models.rotary_decoder import RotaryDecoder, RotaryDecoderConfig
from hooked.rotary import RotaryEmbedding

LAYER_TYPES = ("sliding_attention", "full_attention")


# ============================================================================= config
class SandwichDecoderConfig(RotaryDecoderConfig):
    """What Gemma 2's and Gemma 3's config dataclasses share (each declares its own fields and defaults): the checks of
    the layer pattern, the window, the score scale and the caps, and TransformerLens' names for them. A config
    without `layer_types` gets transformers' Gemma2Config alternation (Gemma 3 sets its own pattern first)."""

    # TransformerLens' names for what the architecture fixes (the rest are RotaryDecoderConfig's)
    act_fn = "gelu_pytorch_tanh"
    use_normalization_before_and_after = True  # ln1_post / ln2_post
    use_attn_scale = True

    def __post_init__(self):
        if self.layer_types is None:  # transformers' Gemma2Config: layer i slides iff (i + 1) % 2, so 0, 2, 4, ...
            types = tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(self.n_layers))
        else:
            types = tuple(self.layer_types)
        object.__setattr__(self, "layer_types", types)  # fields are frozen once set: a derived value, set once
        super().__post_init__()
        if len(types) != self.n_layers or set(types) - set(LAYER_TYPES):
            raise ValueError(
                f"layer_types {list(types)} must list one of {list(LAYER_TYPES)} per layer"
                f" (num_hidden_layers = {self.n_layers}), or be null for transformers' alternation"
            )
        self.check_sliding_window()
        if self.sliding_window is None and "sliding_attention" in types:
            raise ValueError(
                "sliding_window is null but layer_types has sliding_attention layers: give a window,"
                " or make every layer full_attention"
            )
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            cap = getattr(self, name)
            if cap is not None and not cap > 0:
                raise ValueError(f"{name} {cap!r} must be positive (cap * tanh(x / cap)), or null for no cap")
        if not self.query_pre_attn_scalar > 0:
            raise ValueError(
                f"query_pre_attn_scalar {self.query_pre_attn_scalar!r} must be positive: scores are scaled"
                " by its inverse square root"
            )

    # TransformerLens' names for the same settings (its Gemma 2 configs, loading_from_pretrained.py)
    @property
    def attn_scale(self) -> float:
        return math.sqrt(self.query_pre_attn_scalar)

    @property
    def attn_scores_soft_cap(self) -> float:
        # -1: off, as TransformerLens
        return -1.0 if self.attn_logit_softcapping is None else self.attn_logit_softcapping

    @property
    def output_logits_soft_cap(self) -> float:
        return -1.0 if self.final_logit_softcapping is None else self.final_logit_softcapping

    window_size = alias("sliding_window")

    @property
    def use_local_attn(self) -> bool:
        return "sliding_attention" in self.layer_types

    @property
    def attn_types(self) -> list[str]:
        return ["local" if kind == "sliding_attention" else "global" for kind in self.layer_types]

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"


# ============================================================================= modules and forward
class GemmaRMSNorm(RMSNorm):
    """transformers' Gemma2RMSNorm and Gemma3RMSNorm: normalise in float32, multiply by `1 + weight` in float32, cast
    back.

    `hook_scale` is sqrt(mean(x^2) + eps) in float32; `hook_normalized` x / scale cast to the model dtype,
    before the gain. `gain` (the factor the normalised input is multiplied by) is `1 + weight`, and so is
    TransformerLens' `w` (its converter adds the one): the checkpoint's `weight` stays the parameter.
    """

    def __init__(self, d: int, eps: float, axes: str = "batch pos"):
        super().__init__(d, eps, axes)
        nn.init.zeros_(self.weight)  # gain 1, as transformers initialises it

    def affine(self, normalized: Tensor) -> Tensor:
        return (normalized.float() * (1.0 + self.weight.float())).to(normalized.dtype)

    def unhooked(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)

    @property
    def gain(self) -> Tensor:
        """`1 + weight`, computed in float32 as the forward does and cast to the weight's dtype (TransformerLens'
        `w` in a model of that dtype: its converter adds 1 in float32, the model stores it in its dtype)."""
        return (1.0 + self.weight.float()).to(self.weight.dtype)

    def set_unit_gain(self) -> None:
        self.weight.zero_()

    w = property(
        lambda self: self.gain, doc="TransformerLens' `w`: the gain `1 + weight` (a new tensor, not the parameter)"
    )


class GemmaPostNorm(GemmaRMSNorm):
    """A Gemma RMSNorm on a sublayer's output, before the residual add (`ln1_post`, `ln2_post`). Nothing reads
    the residual stream through it, so weight processing leaves it alone and `apply_ln_to_stack` has no use for it."""

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        raise ValueError(
            "ln1_post / ln2_post normalise a sublayer's output, not the residual stream: no residual"
            " component is read through them"
        )


class SandwichNormBlock(DecoderBlock):
    """Pre- and post-norm block: ln1 -> attention -> ln1_post -> add; ln2 -> MLP -> ln2_post -> add, the MLP gated by
    gelu_pytorch_tanh. It knows its layer type and picks, from every block's inputs, the windowed mask (and local
    rotary) or the full ones. The attention is given: `GroupedQueryAttention` with Gemma's scale and cap (Gemma 2)
    or per-head norms (Gemma 3)."""

    mlp_stage: ClassVar[tuple[str, ...]] = (
        "hook_mlp_in",
        "ln2",
        "mlp",
        "hook_mlp_out_pre_norm",
        "ln2_post",
        "hook_mlp_out",
        "hook_resid_post",
    )
    # Norms between a sublayer's output and the residual add: a head's or neuron's write is not additive
    # (hooked.components.additive_writes refuses the per-head / per-neuron stacks for this block; the circuits
    # graph takes its attention as one node, L{l}.attn).
    output_norms: ClassVar[tuple[str, ...]] = ("ln1_post", "ln2_post")
    checkpoint_norms: ClassVar[dict[str, str]] = {  # transformers' names -> hooked's
        "input_layernorm": "ln1",
        "post_attention_layernorm": "ln1_post",
        "pre_feedforward_layernorm": "ln2",
        "post_feedforward_layernorm": "ln2_post",
    }

    def __init__(self, cfg: SandwichDecoderConfig, layer: int, attn: nn.Module):
        super().__init__()
        self.sliding = cfg.is_sliding(layer)
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint("batch pos head_index d_model")  # each head's copy of resid_pre (attention_input)
        self.hook_k_input = HookPoint("batch pos kv_head_index d_model")
        self.hook_v_input = HookPoint("batch pos kv_head_index d_model")
        self.ln1 = GemmaRMSNorm(cfg.d_model, cfg.rms_norm_eps)  # input_layernorm
        self.attn = attn
        self.hook_attn_out_pre_norm = HookPoint("batch pos d_model")  # o_proj's output, before ln1_post
        self.ln1_post = GemmaPostNorm(cfg.d_model, cfg.rms_norm_eps)  # post_attention_layernorm
        self.hook_attn_out = HookPoint("batch pos d_model")  # ln1_post's output: what the residual gains
        self.hook_resid_mid = HookPoint("batch pos d_model")
        self.hook_mlp_in = HookPoint("batch pos d_model")  # what the MLP half reads, before ln2
        self.ln2 = GemmaRMSNorm(cfg.d_model, cfg.rms_norm_eps)  # pre_feedforward_layernorm
        self.mlp = GatedMLP(cfg.d_model, cfg.d_mlp, activation=functools.partial(F.gelu, approximate="tanh"))
        self.hook_mlp_out_pre_norm = HookPoint("batch pos d_model")  # down_proj's output, before ln2_post
        self.ln2_post = GemmaPostNorm(cfg.d_model, cfg.rms_norm_eps)  # post_feedforward_layernorm
        self.hook_mlp_out = HookPoint("batch pos d_model")  # ln2_post's output: what the residual gains
        self.hook_resid_post = HookPoint("batch pos d_model")

    def attn_half(
        self,
        resid_pre: Tensor,
        cos: Tensor | None,  # None: a table the model has no layer for (Gemma 3 without global or local layers)
        sin: Tensor | None,
        local_cos: Tensor | None,
        local_sin: Tensor | None,
        mask: AttentionMask,
        local_mask: AttentionMask,
        kv: LayerKV | None = None,
    ) -> Tensor:
        if self.sliding:
            cos, sin, mask = local_cos, local_sin, local_mask
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_in = attention_input(self, resid_pre, self.attn.n_heads, self.attn.n_kv_heads)
        attn_out_pre_norm = self.hook_attn_out_pre_norm(self.attn(attn_in, cos, sin, mask, kv))
        attn_out = self.hook_attn_out(self.ln1_post(attn_out_pre_norm))
        return self.hook_resid_mid(resid_pre + attn_out)

    def mlp_half(self, resid_mid: Tensor) -> Tensor:
        mlp_out_pre_norm = self.hook_mlp_out_pre_norm(self.mlp(self.ln2(mlp_input(self, resid_mid))))
        mlp_out = self.hook_mlp_out(self.ln2_post(mlp_out_pre_norm))
        return self.hook_resid_post(resid_mid + mlp_out)


class SandwichDecoder(RotaryDecoder):
    """The rotary decoder with embeddings scaled by sqrt(d_model), sandwich-norm blocks that pick their mask and rotary
    table by layer type, Gemma's final norm and the final logit cap."""

    def __init__(self, cfg: SandwichDecoderConfig, rotary: RotaryEmbedding):
        super().__init__(cfg, rotary, final_norm=GemmaRMSNorm)

    # ------------------------------------------------------------------------- declarations
    # What Gemma 2 and Gemma 3 declare alike (docs/adding-a-model.md): the checkpoint's names, the tiny random model's
    # sizes (each family adds its own), and what the hooks they share hold (each family adds its attention's).
    checkpoint_table = RotaryDecoder.checkpoint_table_of(SandwichNormBlock.checkpoint_norms)
    random_sizes = dict(RotaryDecoder.random_sizes, sliding_window=3, query_pre_attn_scalar=16.0)
    hook_docs = {  # for docs/hooks-reference.md
        "hook_embed": "token embeddings times `sqrt(d_model)` (the normalizer in the weights' dtype, as transformers"
        " and TransformerLens' `W_E`), which are block 0's `hook_resid_pre`",
        "blocks.{i}.hook_q_input": "one copy of `resid_pre` per query head, each normalised by `ln1` on its own;"
        " listening switches to per-head projections",
        "blocks.{i}.hook_k_input": "one copy of `resid_pre` per kv head, read through `ln1` by `k_proj`",
        "blocks.{i}.hook_v_input": "one copy of `resid_pre` per kv head, read through `ln1` by `v_proj`",
        "blocks.{i}.ln1.hook_scale": "the pre-attention RMSNorm's scale `sqrt(mean(x^2) + eps)` of `resid_pre`;"
        " float32",
        "blocks.{i}.ln1.hook_normalized": "`resid_pre / scale` cast to the model dtype, before the gain `1 + weight`",
        "blocks.{i}.attn.hook_v": "`v_proj(ln1 output)` split by kv head",
        "blocks.{i}.attn.hook_z": "per-head attention output; a view of `o_proj`'s input, so an in-place edit changes"
        " what the projection reads",
        "blocks.{i}.attn.hook_result": "each head's write `z[h] @ W_O[h]` BEFORE the post-norm: with `b_O` they sum to"
        " `hook_attn_out_pre_norm`, not to `hook_attn_out` (ln1_post is not linear)",
        "blocks.{i}.hook_attn_out_pre_norm": "`o_proj`'s output, the attention's raw write, before the post-attention"
        " norm `ln1_post`",
        "blocks.{i}.ln1_post.hook_scale": "the post-attention RMSNorm's scale of the attention output (not of the"
        " residual stream); float32",
        "blocks.{i}.ln1_post.hook_normalized": "the attention output divided by that scale, before the gain"
        " `1 + weight`",
        "blocks.{i}.hook_attn_out": "`ln1_post(o_proj output)`: what the attention adds to the residual stream (after"
        " the post-norm, as TransformerLens)",
        "blocks.{i}.hook_mlp_in": "what the MLP half reads, `resid_mid`, before `ln2` (a copy when hooked)",
        "blocks.{i}.ln2.hook_scale": "the pre-feedforward RMSNorm's scale of `resid_mid`; float32",
        "blocks.{i}.ln2.hook_normalized": "`resid_mid / scale` cast to the model dtype, before the gain `1 + weight`",
        "blocks.{i}.mlp.hook_in": "`ln2(resid_mid)`, after the pre-feedforward norm and its gain `1 + weight`: what"
        " `gate_proj` and `up_proj` read; circuit-tracer's name, the point a transcoder reads; a default cache leaves"
        " it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "the gate's pre-activation `gate_proj(ln2 output)`",
        "blocks.{i}.mlp.hook_pre_linear": "the up projection `up_proj(ln2 output)`",
        "blocks.{i}.mlp.hook_post": "the neurons, `gelu_tanh(pre) * pre_linear` = `down_proj`'s input",
        "blocks.{i}.hook_mlp_out_pre_norm": "`down_proj`'s output, the MLP's raw write, before the post-feedforward"
        " norm `ln2_post`",
        "blocks.{i}.ln2_post.hook_scale": "the post-feedforward RMSNorm's scale of the MLP output (not of the residual"
        " stream); float32",
        "blocks.{i}.ln2_post.hook_normalized": "the MLP output divided by that scale, before the gain `1 + weight`",
        "blocks.{i}.hook_mlp_out": "`ln2_post(down_proj output)`: what the MLP adds to the residual stream (after the"
        " post-norm, as TransformerLens)",
        "ln_final.hook_normalized": "the final residual stream divided by its scale, before the gain `1 + weight`",
    }

    def normalizer(self, dtype: torch.dtype) -> Tensor:
        """sqrt(d_model) as transformers' Gemma2TextScaledWordEmbedding: a float32 scalar cast to `dtype`."""
        return torch.tensor(self.cfg.d_model**0.5, dtype=torch.float32).to(dtype)

    def resid_from_tokens(self, tokens: Tensor, position_ids: Tensor) -> Float[Tensor, "batch pos d_model"]:
        weight = self.embed_tokens.weight
        return self.hook_embed(self.embed_tokens(tokens) * self.normalizer(weight.dtype).to(weight.device))

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        """Every variant a block may pick, each computed once per forward: (global cos, sin, local cos, sin,
        full mask, windowed mask). With one RoPE table (Gemma 2) the local pair is the global one."""
        cos, sin = self.rotary(position_ids, dtype)  # [batch pos d_head]
        return cos, sin, cos, sin, mask, mask.windowed(self.cfg.sliding_window)

    def logits_from_resid(self, resid: Float[Tensor, "batch pos d_model"], columns: Tensor | None = None) -> Tensor:
        """Final norm, unembedding, then `final_logit_softcapping` (every logit path of the library comes here)."""
        return softcap_(super().logits_from_resid(resid, columns), self.cfg.final_logit_softcapping)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        """TransformerLens' W_E: the embedding times sqrt(d_model), what `hook_embed` holds (a new tensor, not
        the parameter `embed_tokens.weight`)."""
        weight = self.embed_tokens.weight
        return weight * self.normalizer(weight.dtype).to(weight.device)

    @property
    def token_embedding_weight(self) -> Tensor:
        return self.embed_tokens.weight  # W_E is derived from it (scaled)

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """The rotary decoder's sizes, plus the window, the score scale, the caps and a layer pattern."""
        sizes = super().draw_sizes(draw, st, n_layers, n_heads)
        sizes.update(
            sliding_window=draw(st.sampled_from([1, 2, 4])),
            query_pre_attn_scalar=draw(st.sampled_from([8.0, 16.0, 256.0])),
            attn_logit_softcapping=draw(st.sampled_from([None, 2.0, 50.0])),
            final_logit_softcapping=draw(st.sampled_from([None, 1.5, 30.0])),
            layer_types=draw(
                st.sampled_from([None, ("full_attention",) * n_layers, ("sliding_attention",) * n_layers])
            ),
        )
        return sizes
