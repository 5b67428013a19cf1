"""Qwen3 (`Qwen3ForCausalLM`) with a hook point on every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/qwen3/modeling_qwen3.py` exactly: RMSNorm computed in float32
and cast back before the weight; q/k/v projections (biases only with `attention_bias`); per-head RMSNorms
`q_norm`/`k_norm` over d_head BEFORE RoPE; half-split RoPE with cos/sin computed in float32 and cast to the
activation dtype (plain or YaRN, `hooked.rotary.rotary_frequencies`); grouped-query attention with the softmax in
float32; a SiLU-gated MLP; tied or untied unembedding. Float32 logits are bit-identical to `Qwen3ForCausalLM`
(tests/families/test_qwen3_parity.py). `head_dim` comes from the config and may differ from d_model / n_heads.

Qwen3 is the shared rotary decoder (hooked/models/rotary_decoder.py) of pre-norm blocks, each grouped-query
attention with per-head RMSNorms on q and k (hooked/models/grouped_query_attention.py) and a SiLU-gated MLP.
Weights keep the checkpoint's leaf names (`q_proj`, `q_norm`, `gate_proj`, ...) and `nn.Linear` layout, under a
module tree named like the hooks. This file holds the config, the model built from those parts, and its
declarations. See docs/qwen3.md for what each hook holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from hooked.layers import GatedMLP, RMSNorm
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.rotary_decoder import (
    PreNormBlock,
    RotaryDecoder,
    RotaryDecoderConfig,
    rms_rotary_fields,
    rope_default_or_yarn,
)
from hooked.rotary import RotaryEmbedding, YarnScaling


# ============================================================================= config
@dataclass
class Qwen3Config(RotaryDecoderConfig):
    """The rotary decoder's fields (d_mlp: the dense MLP width), plus RoPE's YaRN scaling."""

    yarn: YarnScaling | None = None  # rope_type "yarn"; None: plain RoPE
    tie_word_embeddings: bool = False  # unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections
    max_position_embeddings: int = 32768  # informative only: RoPE has no hard limit
    default_prepend_bos: bool = False  # Qwen3 has no BOS token; settable, read by to_tokens and the forward

    # TransformerLens' names for what the architecture fixes (the rest are RotaryDecoderConfig's)
    act_fn = "silu"
    original_architecture = "Qwen3ForCausalLM"

    transformer_lens_shape = (
        "normalization_type='RMS', positional_embedding_type='rotary', act_fn='silu', gated_mlp=True,"
        " use_qk_norm=True, final_rms=True"
    )

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[Qwen3Config | None, list[str] | None]:
        fields, problems = rms_rotary_fields(tl, "Qwen3", qk_norm=True)
        return (None, problems) if fields is None else (Qwen3Config(**fields), [])

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        """The keyword arguments of this config, read from a Hugging Face config.json dict."""
        if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
            raise ValueError("Qwen3 with sliding-window attention is not supported by hooked")
        cls.require_silu(config, "Qwen3")
        theta, yarn = rope_default_or_yarn(config, "Qwen3")
        return dict(  # transformers' Qwen3Config defaults
            **cls.common_fields_from_hf(config, max_position_embeddings=32768, head_dim=128),
            rope_theta=theta,
            yarn=yarn,
        )


# ============================================================================= modules and forward
class Qwen3(RotaryDecoder):
    """Qwen3 dense with TransformerLens hook names. Load with `hooked.load("Qwen/Qwen3-0.6B")`."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.yarn))

    @staticmethod
    def make_block(cfg: Qwen3Config, layer: int) -> PreNormBlock:
        return PreNormBlock(cfg, GatedMLP(cfg.d_model, cfg.d_mlp), GroupedQueryAttention(cfg, qk_norm=RMSNorm))

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about Qwen3 (docs/adding-a-model.md); random_sizes and draw_sizes are
    # the rotary decoder's.
    config_class = Qwen3Config
    architectures = ("Qwen3ForCausalLM", "qwen3")
    family = "qwen3"
    title = "Qwen3"
    checkpoint_table = RotaryDecoder.checkpoint_table_of(PreNormBlock.checkpoint_norms)
    # TransformerLens 3.9's official names (supported_models.py) of Qwen3 checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        f"Qwen/Qwen3-{size}": (f"qwen3-{size.lower()}",) for size in ("0.6B", "0.6B-Base", "1.7B", "4B", "8B", "14B")
    }
    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md (shared meanings live there)
        **PreNormBlock.hook_docs,
        **GroupedQueryAttention.rms_qk_norm_hook_docs,
        "blocks.{i}.mlp.hook_in": "`ln2(resid_mid)`, the RMSNorm's weight included: what `gate_proj` and `up_proj`"
        " read; circuit-tracer's name, the point a transcoder reads; a default cache leaves it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "the gate's pre-activation `gate_proj(x)`",
        "blocks.{i}.mlp.hook_post": "the neurons, `silu(pre) * pre_linear` = `down_proj`'s input",
    }
