"""Gemma 2 (`Gemma2ForCausalLM`), with a hook point on every activation TransformerLens names and on the
intermediates its post-norms add.

Numerics follow Hugging Face transformers 5.24 `models/gemma2/modeling_gemma2.py` operation for operation. Gemma 2
is the sandwich-norm decoder (hooked/models/sandwich_decoder.py: pre- and post-norms, Gemma's `(1 + weight)`
RMSNorm in float32, embeddings times `sqrt(hidden_size)` cast to the weights' dtype, a gelu_tanh-gated MLP, per-layer
sliding windows, the final logit cap `final_logit_softcapping`) with one rotary table and this attention
(hooked/models/grouped_query_attention.py): q/k/v/o projections, half-split RoPE (cos/sin cast to the activation
dtype), scores scaled by `query_pre_attn_scalar ** -0.5` (not d_head's), capped at
`attn_logit_softcapping * tanh(scores / cap)` before the mask, grouped-query heads, softmax in float32. The MLP's
activation is `hidden_activation` (transformers 5.24 never reads `hidden_act` for Gemma 2). The unembedding is
tied by default. This file holds the config, the model built from those parts, and its declarations. See
docs/gemma2.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.rotary_decoder import rope_default
from hooked.models.sandwich_decoder import SandwichDecoder, SandwichDecoderConfig, SandwichNormBlock
from hooked.rotary import RotaryEmbedding


# ============================================================================= config
@dataclass
class Gemma2Config(SandwichDecoderConfig):
    """The rotary decoder's sizes (RotaryDecoderConfig: n_layers ... d_vocab, rms_norm_eps, rope_theta), and:"""

    tie_word_embeddings: bool = True  # transformers' Gemma2Config default: unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections
    max_position_embeddings: int = 8192  # bounds sliding_window (RoPE itself has no hard limit)
    query_pre_attn_scalar: float = 256.0  # scores are scaled by query_pre_attn_scalar ** -0.5
    sliding_window: int | None = 4096  # keys at most this many columns back on "sliding_attention" layers
    layer_types: tuple[str, ...] | None = None  # per layer: "sliding_attention" / "full_attention"; None: alternate
    attn_logit_softcapping: float | None = 50.0  # scores -> cap * tanh(scores / cap) before the mask; None: off
    final_logit_softcapping: float | None = 30.0  # logits -> cap * tanh(logits / cap); None: off
    default_prepend_bos: bool = True  # Gemma's tokenizer starts with <bos>

    # TransformerLens' name of the architecture (its other names are the sandwich decoder's, SandwichDecoderConfig)
    original_architecture = "Gemma2ForCausalLM"

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        """The keyword arguments of this config, read from a Hugging Face config.json dict."""
        family = cls.original_architecture
        # transformers 5.24 reads hidden_activation only (a hub config's hidden_act is ignored there, and here).
        activation = config.get("hidden_activation") or "gelu_pytorch_tanh"
        if activation != "gelu_pytorch_tanh":
            raise ValueError(
                f"{family} with hidden_activation {activation!r} is not supported by hooked (gelu_pytorch_tanh)"
            )
        if config.get("use_bidirectional_attention"):
            raise ValueError(f"{family} with use_bidirectional_attention is not supported by hooked (causal only)")
        theta = rope_default(config, family)
        layer_types = config.get("layer_types")
        return dict(
            # transformers' Gemma2Config defaults
            **cls.common_fields_from_hf(config, max_position_embeddings=8192, head_dim=256, tie_word_embeddings=True),
            rope_theta=theta,
            query_pre_attn_scalar=config.get("query_pre_attn_scalar", 256),
            sliding_window=config.get("sliding_window", 4096),
            layer_types=None if layer_types is None else tuple(layer_types),
            attn_logit_softcapping=config.get("attn_logit_softcapping", 50.0),
            final_logit_softcapping=config.get("final_logit_softcapping", 30.0),
        )


# ============================================================================= modules and forward
class Gemma2(SandwichDecoder):
    """Gemma 2 with TransformerLens hook names. Load with `hooked.load("google/gemma-2-2b")`."""

    def __init__(self, cfg: Gemma2Config):
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta))

    @staticmethod
    def make_block(cfg: Gemma2Config, layer: int) -> SandwichNormBlock:
        scaling = cfg.query_pre_attn_scalar**-0.5
        return SandwichNormBlock(
            cfg, layer, GroupedQueryAttention(cfg, scaling=scaling, softcap=cfg.attn_logit_softcapping)
        )

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about Gemma 2 (docs/adding-a-model.md); checkpoint_table and draw_sizes are the
    # sandwich decoder's.
    config_class = Gemma2Config
    architectures = ("Gemma2ForCausalLM", "gemma2")
    family = "gemma2"
    title = "Gemma 2"
    # TransformerLens 3.9's official names (supported_models.py) of Gemma 2 checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        f"google/gemma-2-{size}{tuned}": (f"gemma-2-{size}{tuned}",)
        for size in ("2b", "9b", "27b")
        for tuned in ("", "-it")
    }
    random_sizes = dict(SandwichDecoder.random_sizes, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md: the sandwich decoder's, and
        **SandwichDecoder.hook_docs,
        "blocks.{i}.attn.hook_q": "`q_proj(ln1 output)` (its bias included) split by head, before RoPE",
        "blocks.{i}.attn.hook_k": "`k_proj(ln1 output)` split by kv head, before RoPE",
        "blocks.{i}.attn.hook_rot_q": "q after RoPE: `x * cos + rotate_half(x) * sin`",
        "blocks.{i}.attn.hook_rot_k": "k after RoPE",
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * query_pre_attn_scalar**-0.5`, then CAPPED"
        " `cap * tanh(s / cap)` (attn_logit_softcapping, TransformerLens' order), kv heads repeated, set to the"
        " dtype's minimum on future keys and, on sliding_attention layers, on keys `sliding_window` or more columns"
        " back; listening switches the layer to the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the capped scores, computed in float32 and cast back"
        " (transformers' eager `attn_weights`)",
        "ln_final.hook_scale": "the final RMSNorm's scale; float32. The logits are"
        " `cap * tanh((ln_final @ W_U) / cap)` (final_logit_softcapping): direct logit attribution, which is linear,"
        " attributes the PRE-cap logits",
    }
