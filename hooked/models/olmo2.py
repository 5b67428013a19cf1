"""OLMo 2 (`Olmo2ForCausalLM`), with a hook point on every activation TransformerLens names and on the
intermediates a post-norm block adds.

Numerics follow Hugging Face transformers 5.24 `models/olmo2/modeling_olmo2.py` operation for operation:
a block has NO norm before attention or the MLP; instead RMSNorms normalise each sublayer's OUTPUT before
the residual add (`post_attention_layernorm`, `post_feedforward_layernorm`):

    resid_mid  = resid_pre + post_attention_layernorm(attn(resid_pre))
    resid_post = resid_mid + post_feedforward_layernorm(mlp(resid_mid))

`q_norm` / `k_norm` are RMSNorms over the WHOLE q / k projection (n_heads * d_head and
n_kv_heads * d_head wide), before the head split and RoPE, not per head as Qwen3's; then half-split RoPE
(plain, cos/sin in float32 cast to the activation dtype), grouped-query attention with the softmax in
float32, a SiLU-gated MLP without biases, a final RMSNorm and a tied or untied unembedding. RMSNorm runs
in float32 and casts back before its weight. Float32 logits equal transformers' bit for bit
(tests/families/test_olmo2_parity.py).

Names are TransformerLens 3.9's (`components/transformer_block.py` for its POST_NORM_ARCHITECTURES):
`ln1` is the post-attention norm and `ln2` the post-feedforward norm, so `hook_attn_out` / `hook_mlp_out`
hold what is added to the residual stream (after the post-norm). The attention is the shared grouped-query
attention (hooked/models/grouped_query_attention.py) with its q/k norms replaced by norms over every head at
once, in the shared rotary decoder (hooked/models/rotary_decoder.py) with OLMo 2's post-norm block. Under tensor
parallelism a rank holds some heads, so each rank sums its heads' squares and ONE all-reduce per layer (q's
and k's sums stacked) gives both norms their whole-projection scale. What does not apply to a post-norm model
is refused, naming the reason: folding norms into the next weights (`fold_ln`) and `apply_ln_to_stack` before
a block (no norm reads the residual stream there). See docs/olmo2.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import AttentionMask, GatedMLP, Projection, RMSNorm, Split, mlp_input
from hooked.models.base import DecoderBlock
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.rotary_decoder import RotaryDecoder, RotaryDecoderConfig, rope_default
from hooked.rotary import RotaryEmbedding

_NO_PRE_NORM = (
    "OLMo 2 has no norm before attention or the MLP: its ln1 / ln2 normalise each sublayer's output"
    " before the residual add (post-norms), and the sublayers read the residual stream as it is"
)


# ============================================================================= config
@dataclass
class Olmo2Config(RotaryDecoderConfig):
    """The rotary decoder's fields (head_dim: hidden_size / num_attention_heads when config.json has none)."""

    rms_norm_eps: float = 1e-5  # transformers' Olmo2Config default
    rope_theta: float = 10000.0  # RoPE base (the OLMo 2 checkpoints: 500000)
    tie_word_embeddings: bool = False  # unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections
    max_position_embeddings: int = 2048  # informative only: RoPE has no hard limit
    default_prepend_bos: bool = False  # OLMo 2's tokenizer adds no BOS (TransformerLens 3.9 loads it without)

    # TransformerLens' names for what the architecture fixes (the rest are RotaryDecoderConfig's)
    act_fn = "silu"
    original_architecture = "Olmo2ForCausalLM"
    use_qk_norm = (
        False  # TransformerLens' per-head q/k norm flag: OLMo 2's norms span all heads (by architecture there)
    )

    @classmethod
    def from_hf(cls, config: dict) -> Olmo2Config:
        cls.require_silu(config, "Olmo2ForCausalLM")
        theta = rope_default(config, "Olmo2ForCausalLM")  # plain RoPE: every OLMo 2 checkpoint's
        n_heads = config["num_attention_heads"]
        if not config.get("head_dim") and config["hidden_size"] % n_heads:
            raise ValueError(
                f"hidden_size {config['hidden_size']} is not a multiple of num_attention_heads {n_heads}"
                " and config.json gives no head_dim"
            )
        # transformers' Olmo2Config defaults
        return cls(
            **cls.common_fields_from_hf(config, max_position_embeddings=2048, rms_norm_eps=1e-5),
            rope_theta=theta,
        )


# ============================================================================= modules and forward
class Olmo2RMSNorm(RMSNorm):
    """transformers' Olmo2RMSNorm: normalise in float32 and multiply by the weight in float32 too, casting back
    only then (Qwen3's and Llama's cast before the weight: the two round differently in bfloat16).
    `hook_normalized` holds x / scale cast to the model dtype, before the weight."""

    def affine(self, normalized: Tensor) -> Tensor:
        return (self.weight * normalized.float()).to(normalized.dtype)

    def unhooked(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


class PostNorm(Olmo2RMSNorm):
    """An RMSNorm on a sublayer's output, before the residual add (`ln1`, `ln2`). Nothing reads the residual
    stream through it, so normalising a residual component with its scale (`apply_ln_to_stack`) is refused."""

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        raise ValueError(
            f"{_NO_PRE_NORM}, so no norm scale applies to a residual-stream component before a block;"
            " apply_ln=True works into the unembedding only (layer = n_layers, ln_final), or pass apply_ln=False"
        )


class WholeProjectionRMSNorm(Olmo2RMSNorm):
    """OLMo 2's q_norm / k_norm: one RMSNorm over every head's q (or k) at once, [batch pos heads d_head] in
    and out, computed on the flat [batch pos heads * d_head] view exactly as transformers does. `hook_scale`
    is [batch pos 1] (one scale for all heads, as TransformerLens); `hook_normalized` is split by head
    (TransformerLens 3.9 holds it flat, [batch pos heads * d_head]: the same numbers).

    Under tensor parallelism a rank holds some heads and the matching slice of the weight; the attention
    all-reduces every rank's `partial_sum_of_squares` and passes the whole sum in (`with_sum_of_squares`), so
    the scale is sqrt(sum / (heads * d_head) + eps) over every head, replicated, and `hook_scale` holds it whole.
    """

    def __init__(self, heads: int, d_head: int, eps: float, head_axis: str):
        super().__init__(heads * d_head, eps)
        self.heads, self.d_head = heads, d_head  # every head of the model, on every rank (the mean's denominator)
        self.tp_axis = "heads" if head_axis == "head_index" else "kv_heads"
        self.hook_normalized = HookPoint(f"batch pos {head_axis} d_head")
        self.tp_share = None  # under tensor parallelism: 1.0, or 0.0 where another rank counts the same heads
        self.whole_sum_of_squares = None  # [batch pos 1] float32, set by with_sum_of_squares for one call

    def scale(self, x: Tensor) -> Tensor:
        if self.tp_share is None:
            return super().scale(x.flatten(-2))  # [batch pos 1]
        return (self._whole_sum() / (self.heads * self.d_head) + self.eps).sqrt()

    def normalize(self, x: Tensor, scale: Tensor) -> Tensor:
        return (x.float() / scale[..., None]).to(x.dtype)

    def affine(self, normalized: Tensor) -> Tensor:
        return (self.weight.view(-1, self.d_head) * normalized.float()).to(normalized.dtype)

    def unhooked(self, x: Tensor) -> Tensor:
        if self.tp_share is None:
            return super().unhooked(x.flatten(-2)).view(x.shape)
        # Olmo2RMSNorm.unhooked's operations, with the mean over every rank's heads
        h = x.flatten(-2).float() * torch.rsqrt(self._whole_sum() / (self.heads * self.d_head) + self.eps)
        return (self.weight * h).to(x.dtype).view(x.shape)

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        return x / scale[..., None]

    # ------------------------------------------------------------------------- tensor parallelism
    def tp_plan(self) -> dict[str, Split]:
        """The weight follows the heads, as q_proj's / k_proj's rows do."""
        return {"weight": Split(self.tp_axis, 0, self.d_head)}

    def tp_applied(self, parallel, local_ranges: dict[str, tuple[int, int]]) -> None:
        # With fewer kv heads than ranks each is held by several ranks: only the first of them counts its squares.
        spans = parallel.even_or_replicated(self.heads, self.tp_axis)
        self.tp_share = 1.0 if spans.index(spans[parallel.tp_rank]) == parallel.tp_rank else 0.0

    def partial_sum_of_squares(self, x: Tensor) -> Tensor:
        """This rank's share of the sum of squares over the whole projection: [batch pos 1], float32."""
        return x.flatten(-2).float().pow(2).sum(-1, keepdim=True) * self.tp_share

    def with_sum_of_squares(self, x: Tensor, whole_sum_of_squares: Tensor) -> Tensor:
        """The norm of this rank's heads `x` (through the hooks) given the all-reduced sum of squares."""
        self.whole_sum_of_squares = whole_sum_of_squares
        try:
            return self(x)
        finally:
            self.whole_sum_of_squares = None

    def _whole_sum(self) -> Tensor:
        if self.whole_sum_of_squares is None:
            raise RuntimeError(
                "under tensor parallelism OLMo 2's q_norm / k_norm normalise over every rank's heads: run"
                " them through their attention (Olmo2Attention.normed_qk), which all-reduces the sums"
                " of squares, not on one rank's heads alone"
            )
        return self.whole_sum_of_squares


class Olmo2Attention(GroupedQueryAttention):
    """The grouped-query attention (q/k/v/o projections, hooks, TransformerLens weight views) with `q_norm` / `k_norm`
    over the whole projection: a head's normalised q depends on every head's q through the shared scale,
    which holds for the per-head split inputs too (`hook_q_input`: editing one head's input moves the others')."""

    def __init__(self, cfg: Olmo2Config):
        super().__init__(cfg, qk_norm=RMSNorm)
        # Replacing the per-head norms keeps their place in the module order (and so in hook_names).
        self.q_norm = WholeProjectionRMSNorm(cfg.n_heads, cfg.d_head, cfg.rms_norm_eps, "head_index")
        self.k_norm = WholeProjectionRMSNorm(cfg.n_kv_heads, cfg.d_head, cfg.rms_norm_eps, "kv_head_index")
        self.parallel = None  # under tensor parallelism: hooked.distributed.Parallel (tp_applied)

    def normed_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if self.parallel is None:
            return super().normed_qk(q, k)
        # Both norms' statistics in ONE all-reduce: each rank's float32 sums of squares over its own heads.
        sums = self.parallel.reduce(
            torch.stack([self.q_norm.partial_sum_of_squares(q), self.k_norm.partial_sum_of_squares(k)]),
            split_after=True,  # each rank scales its own heads by the whole sums
        )
        return (
            self.hook_q_normed(self.q_norm.with_sum_of_squares(q, sums[0])),
            self.hook_k_normed(self.k_norm.with_sum_of_squares(k, sums[1])),
        )

    def tp_applied(self, parallel, local_ranges: dict[str, tuple[int, int]]) -> None:
        self.parallel = parallel

    def residual_readers(self) -> tuple[Projection, ...]:
        raise ValueError(
            f"fold_ln=True: {_NO_PRE_NORM}, so there is no norm weight to fold into q/k/v or the MLP's"
            " input (TransformerLens 3.9 turns fold_ln off for OLMo 2 with a warning). Pass fold_ln=False:"
            " HookedTransformer.from_pretrained(path, fold_ln=False), or hooked.load(path)"
        )


class Olmo2Block(DecoderBlock):
    """Post-norm block: each sublayer reads the residual stream un-normalised; its output is normalised
    (ln1 / ln2) before it is added."""

    mlp_stage: ClassVar[tuple[str, ...]] = (
        "hook_mlp_in",
        "mlp",
        "hook_mlp_out_pre_norm",
        "ln2",
        "hook_mlp_out",
        "hook_resid_post",
    )
    # Norms between a sublayer's output and the residual add: a head's, neuron's or bias's write is not additive
    # (hooked.components.additive_writes refuses the per-head / per-neuron stacks for this block; the circuits
    # graph takes its attention as one node, L{l}.attn).
    output_norms: ClassVar[tuple[str, ...]] = ("ln1", "ln2")
    checkpoint_norms: ClassVar[dict[str, str]] = {
        "post_attention_layernorm": "ln1",
        "post_feedforward_layernorm": "ln2",
    }

    def __init__(self, cfg: Olmo2Config):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint("batch pos head_index d_model")  # each head's copy of resid_pre (no norm follows)
        self.hook_k_input = HookPoint("batch pos kv_head_index d_model")
        self.hook_v_input = HookPoint("batch pos kv_head_index d_model")
        self.attn = Olmo2Attention(cfg)
        self.hook_attn_out_pre_norm = HookPoint("batch pos d_model")  # o_proj's output, before ln1
        self.ln1 = PostNorm(cfg.d_model, cfg.rms_norm_eps)  # post_attention_layernorm
        self.hook_attn_out = HookPoint("batch pos d_model")  # ln1's output: what is added to the residual
        self.hook_resid_mid = HookPoint("batch pos d_model")
        self.hook_mlp_in = HookPoint("batch pos d_model")  # what the MLP reads: resid_mid (a copy when hooked)
        self.mlp = GatedMLP(cfg.d_model, cfg.d_mlp)
        self.hook_mlp_out_pre_norm = HookPoint("batch pos d_model")  # down_proj's output, before ln2
        self.ln2 = PostNorm(cfg.d_model, cfg.rms_norm_eps)  # post_feedforward_layernorm
        self.hook_mlp_out = HookPoint("batch pos d_model")  # ln2's output: what is added to the residual
        self.hook_resid_post = HookPoint("batch pos d_model")

    def attn_half(
        self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None
    ) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out_pre_norm = self.hook_attn_out_pre_norm(self.attn(self._attention_input(resid_pre), cos, sin, mask, kv))
        attn_out = self.hook_attn_out(self.ln1(attn_out_pre_norm))
        return self.hook_resid_mid(resid_pre + attn_out)

    def mlp_half(self, resid_mid: Tensor) -> Tensor:
        mlp_in = mlp_input(self, resid_mid)
        if mlp_in is resid_mid and self.mlp.hook_in.listening:  # with no norm between, mlp.hook_in would hold the
            mlp_in = resid_mid.clone()  # residual stream itself: an in-place edit there must not reach it
        mlp_out_pre_norm = self.hook_mlp_out_pre_norm(self.mlp(mlp_in))
        mlp_out = self.hook_mlp_out(self.ln2(mlp_out_pre_norm))
        return self.hook_resid_post(resid_mid + mlp_out)

    def _attention_input(self, resid_pre: Tensor) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """resid_pre itself, or, while a hook listens at a split input, one copy per head (TransformerLens'
        `use_split_qkv_input`; hooked.layers.attention_input for pre-norm blocks). No norm sits between, so an
        unedited copy is exactly the shared input."""
        points = (self.hook_q_input, self.hook_k_input, self.hook_v_input)
        if not any(point.listening for point in points):
            return resid_pre
        if any(point.shard is not None for point in points):
            raise RuntimeError(
                "the split q/k/v inputs are not supported under tensor parallelism (hooked.load(..., tp=N))"
            )
        inputs = []
        for point, count in zip(points, (self.n_heads, self.n_kv_heads, self.n_kv_heads), strict=True):
            shared = resid_pre[:, :, None].expand(-1, -1, count, -1)  # [batch pos heads d_model]
            inputs.append(point(shared.clone()) if point.listening else shared)
        return tuple(inputs)


class Olmo2(RotaryDecoder):
    """OLMo 2 with TransformerLens hook names. Load with `hooked.load("allenai/OLMo-2-0425-1B")`."""

    def __init__(self, cfg: Olmo2Config):
        # The final norm is a true pre-norm: the unembedding reads it.
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta), final_norm=Olmo2RMSNorm)

    @staticmethod
    def make_block(cfg: Olmo2Config, layer: int) -> Olmo2Block:
        return Olmo2Block(cfg)

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        # [batch pos d_head] in float32 whatever the model's dtype: transformers' Olmo2RotaryEmbedding returns
        # them uncast, so q and k are rotated in float32 and cast back (Llama's and Qwen3's rotate in the model dtype).
        cos, sin = self.rotary(position_ids, torch.float32)
        return cos, sin, mask

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about OLMo 2 (docs/adding-a-model.md); random_sizes and draw_sizes are
    # the rotary decoder's.
    config_class = Olmo2Config
    architectures = ("Olmo2ForCausalLM", "olmo2")
    family = "olmo2"
    title = "OLMo 2"
    checkpoint_table = RotaryDecoder.checkpoint_table_of(Olmo2Block.checkpoint_norms)
    # TransformerLens 3.9's official names (supported_models.py) of OLMo 2 checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        "allenai/OLMo-2-0425-1B": ("olmo-2-1b",),
        "allenai/OLMo-2-1124-7B": ("olmo-2-7b",),
    }
    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md
        "hook_embed": "token embeddings `embed_tokens[tokens]`, which are block 0's `hook_resid_pre` (no position"
        " embedding: RoPE acts on q and k)",
        "blocks.{i}.hook_q_input": "one copy of `resid_pre` per query head (no norm follows: OLMo 2 attention reads"
        " the residual stream as it is); listening switches to per-head projections",
        "blocks.{i}.hook_k_input": "one copy of `resid_pre` per kv head, read by `k_proj`",
        "blocks.{i}.hook_v_input": "one copy of `resid_pre` per kv head, read by `v_proj`",
        "blocks.{i}.attn.hook_q": "`q_proj(resid_pre)` (its bias included) split by head, before `q_norm` and RoPE",
        "blocks.{i}.attn.hook_k": "`k_proj(resid_pre)` split by kv head, before `k_norm` and RoPE",
        "blocks.{i}.attn.hook_v": "`v_proj(resid_pre)` split by kv head",
        "blocks.{i}.attn.q_norm.hook_scale": "the scale `sqrt(mean(q^2) + eps)` over ALL heads' q at once (one per"
        " position, float32)",
        "blocks.{i}.attn.q_norm.hook_normalized": "q divided by that shared scale, split by head, before `q_norm`'s"
        " weight (TransformerLens holds it flat)",
        "blocks.{i}.attn.hook_q_normed": "`q_norm(q)`: normalised over every head at once, times the weight, split by"
        " head, before RoPE",
        "blocks.{i}.attn.k_norm.hook_scale": "the scale over ALL kv heads' k at once (one per position, float32)",
        "blocks.{i}.attn.k_norm.hook_normalized": "k divided by that shared scale, split by kv head, before `k_norm`'s"
        " weight",
        "blocks.{i}.attn.hook_k_normed": "`k_norm(k)`: normalised over every kv head at once, times the weight, before"
        " RoPE",
        "blocks.{i}.attn.hook_rot_q": "`q_norm(q)` after RoPE: `x * cos + rotate_half(x) * sin`, computed in float32"
        " (cos/sin are not cast, as transformers') and cast back",
        "blocks.{i}.attn.hook_rot_k": "`k_norm(k)` after RoPE",
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * d_head**-0.5`, kv heads repeated (query head h reads"
        " kv head h // (n_heads / n_kv_heads)), masked entries set to the dtype's minimum; listening switches the"
        " layer to the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the scores, computed in float32 and cast back",
        "blocks.{i}.attn.hook_result": "each head's write `z[h] @ W_O[h]` BEFORE the post-norm: with `b_O` they sum to"
        " `hook_attn_out_pre_norm`, not to `hook_attn_out` (ln1 is not linear)",
        "blocks.{i}.hook_attn_out_pre_norm": "`o_proj`'s output, the attention sublayer's raw write, before the"
        " post-attention norm `ln1`",
        "blocks.{i}.ln1.hook_scale": "the post-attention RMSNorm's scale `sqrt(mean(a^2) + eps)` of the attention"
        " output `a` (not of the residual stream); float32",
        "blocks.{i}.ln1.hook_normalized": "the attention output divided by that scale, before `ln1`'s weight",
        "blocks.{i}.hook_attn_out": "`ln1(o_proj output)`: what the attention adds to the residual stream (after OLMo"
        " 2's post-norm, as TransformerLens)",
        "blocks.{i}.hook_mlp_in": "what the MLP reads: `resid_mid` as it is, no norm in between (a copy when hooked)",
        "blocks.{i}.mlp.hook_in": "resid_mid itself (OLMo 2 has no norm before its MLP), as `hook_mlp_in`: what"
        " `gate_proj` and `up_proj` read; circuit-tracer's name, the point a transcoder reads; a default cache leaves"
        " it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "the gate's pre-activation `gate_proj(resid_mid)`",
        "blocks.{i}.mlp.hook_pre_linear": "the up projection `up_proj(resid_mid)`",
        "blocks.{i}.mlp.hook_post": "the neurons, `silu(pre) * pre_linear` = `down_proj`'s input",
        "blocks.{i}.hook_mlp_out_pre_norm": "`down_proj`'s output, the MLP's raw write, before the post-feedforward"
        " norm `ln2`",
        "blocks.{i}.ln2.hook_scale": "the post-feedforward RMSNorm's scale of the MLP output (not of the residual"
        " stream); float32",
        "blocks.{i}.ln2.hook_normalized": "the MLP output divided by that scale, before `ln2`'s weight",
        "blocks.{i}.hook_mlp_out": "`ln2(down_proj output)`: what the MLP adds to the residual stream (after the"
        " post-norm, as TransformerLens)",
    }
