"""Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention with sparse mixture-of-experts MLPs.

Numerics follow Hugging Face transformers 5.24 `models/qwen3_moe/modeling_qwen3_moe.py` operation for operation.
Attention, norms, rotary embeddings and the pre-norm block are Qwen3's: grouped-query attention with per-head
RMSNorms on q and k (hooked/models/grouped_query_attention.py) in the shared rotary decoder
(hooked/models/rotary_decoder.py). Layer i is sparse iff `i not in mlp_only_layers and n_experts > 0 and
(i + 1) % decoder_sparse_step == 0`, its MLP the top-k router and stacked experts of hooked/models/moe.py
(routing weights cast to the model dtype, renormalised only with `norm_topk_prob`); the other layers are dense
SiLU-gated MLPs of width `intermediate_size`. Float32 logits are bit-identical to `Qwen3MoeForCausalLM`
(tests/families/test_qwen3_moe.py).

Checkpoints store each expert's `gate_proj` / `up_proj` / `down_proj` on its own; they are stacked at load into
`experts.gate_up_proj` and `experts.down_proj` (`checkpoint_stacked`). See docs/qwen3.md.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from hooked.layers import GatedMLP, RMSNorm
from hooked.models.config import EXPERT_AXIS_FIELDS, ModelConfig
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.moe import SparseMoeMLP
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
class Qwen3MoeConfig(RotaryDecoderConfig):
    """The rotary decoder's fields (d_mlp: the dense layers' width; head_dim: hidden_size / num_attention_heads when
    config.json has none, transformers' Qwen3MoeConfig having no default), Qwen3's, and the experts."""

    yarn: YarnScaling | None = None  # rope_type "yarn"; None: plain RoPE
    tie_word_embeddings: bool = False  # unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections
    max_position_embeddings: int = 32768  # informative only: RoPE has no hard limit
    default_prepend_bos: bool = False  # Qwen3 has no BOS token; settable, read by to_tokens and the forward
    _: KW_ONLY
    n_experts: int  # routed experts per sparse layer (num_experts / num_local_experts)
    top_k: int  # experts per token (num_experts_per_tok)
    d_expert_mlp: int  # each expert's MLP width (moe_intermediate_size)
    decoder_sparse_step: int = 1  # every decoder_sparse_step-th layer is sparse
    mlp_only_layers: tuple[int, ...] = field(default=())  # layers kept dense regardless
    norm_topk_prob: bool = False  # renormalise the top-k probabilities to sum to 1

    # TransformerLens' names for what the architecture fixes (the rest are RotaryDecoderConfig's)
    act_fn = "silu"
    original_architecture = "Qwen3MoeForCausalLM"
    axis_fields = {**ModelConfig.axis_fields, **EXPERT_AXIS_FIELDS}

    def __post_init__(self):
        super().__post_init__()
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k} must lie in 1..n_experts ({self.n_experts})")

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and self.n_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0

    transformer_lens_shape = (
        "normalization_type='RMS', positional_embedding_type='rotary', act_fn='silu', gated_mlp=True,"
        " use_qk_norm=True, final_rms=True"
    )

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[Qwen3MoeConfig | None, list[str] | None]:
        """None: TransformerLens' config has no experts, so one that fits is Qwen3's (hooked.models.Qwen3); one that
        is Qwen3-shaped but differs gets Qwen3's problems, named for this family too."""
        return None, rms_rotary_fields(tl, "Qwen3", qk_norm=True)[1]

    @classmethod
    def from_hf(cls, config: dict) -> Qwen3MoeConfig:
        if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
            raise ValueError("Qwen3 with sliding-window attention is not supported by hooked")
        cls.require_silu(config, "Qwen3")
        theta, yarn = rope_default_or_yarn(config, "Qwen3")
        return cls(
            **cls.common_fields_from_hf(config, max_position_embeddings=32768),  # transformers' Qwen3MoeConfig defaults
            rope_theta=theta,
            yarn=yarn,
            n_experts=config.get("num_experts", config.get("num_local_experts", 0)),  # hub: num_experts
            top_k=config["num_experts_per_tok"],
            d_expert_mlp=config["moe_intermediate_size"],
            decoder_sparse_step=config.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
            norm_topk_prob=config.get("norm_topk_prob", False),
        )


# ============================================================================= modules and forward
class Qwen3Moe(RotaryDecoder):
    """Qwen3-MoE with TransformerLens hook names plus router and per-slot expert hooks.

    Load with `hooked.load("Qwen/Qwen3-30B-A3B")`; everything but the sparse MLP is Qwen3's.
    """

    def __init__(self, cfg: Qwen3MoeConfig):
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.yarn))

    @staticmethod
    def make_block(cfg: Qwen3MoeConfig, layer: int) -> PreNormBlock:
        mlp = SparseMoeMLP(cfg) if cfg.is_sparse(layer) else GatedMLP(cfg.d_model, cfg.d_mlp)
        return PreNormBlock(cfg, mlp, GroupedQueryAttention(cfg, qk_norm=RMSNorm))

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about Qwen3-MoE (docs/adding-a-model.md).
    config_class = Qwen3MoeConfig
    architectures = ("Qwen3MoeForCausalLM", "qwen3_moe")
    family = "qwen3_moe"
    title = "Qwen3-MoE"
    checkpoint_table = RotaryDecoder.checkpoint_table_of(PreNormBlock.checkpoint_norms)

    @property
    def checkpoint_renames(self) -> tuple[tuple[str, str], ...]:
        return super().checkpoint_renames + (
            (r"model\.layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.gate.weight"),
        )

    # Per-expert keys on disk -> a piece of a stacked parameter: `expert` indexes axis 0; (part, parts)
    # places gate and up in the two halves of axis 1 of gate_up_proj.
    checkpoint_stacked = (
        (
            r"model\.layers\.(\d+)\.mlp\.experts\.(?P<expert>\d+)\.gate_proj\.weight",
            r"blocks.\1.mlp.experts.gate_up_proj",
            (0, 2),
        ),
        (
            r"model\.layers\.(\d+)\.mlp\.experts\.(?P<expert>\d+)\.up_proj\.weight",
            r"blocks.\1.mlp.experts.gate_up_proj",
            (1, 2),
        ),
        (r"model\.layers\.(\d+)\.mlp\.experts\.(?P<expert>\d+)\.down_proj\.weight", r"blocks.\1.mlp.experts.down_proj"),
    )
    transformer_lens_names = {}  # TransformerLens 3.9 lists no Qwen3-MoE model
    random_sizes = dict(RotaryDecoder.random_sizes, n_experts=4, top_k=2, d_expert_mlp=16)
    random_std = {"mlp.gate.weight": 0.6}  # router logits a few units apart: top-k decided by margins, not rounding
    docs_sizes = {"n_layers": 2, "mlp_only_layers": (0,), "decoder_sparse_step": 1}  # both MLP kinds in the reference

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        sizes = super().draw_sizes(draw, st, n_layers, n_heads)
        sizes.update(
            n_experts=draw(st.integers(4, 6)),
            top_k=draw(st.integers(1, 3)),
            d_expert_mlp=draw(st.sampled_from([8, 12, 16])),
            norm_topk_prob=draw(st.booleans()),
        )
        step = draw(st.sampled_from([1, 1, 2])) if n_layers > 1 else 1
        dense = draw(st.sets(st.integers(0, n_layers - 1), max_size=n_layers - 1)) if n_layers > 1 else set()
        sparse = [i for i in range(n_layers) if i not in dense and (i + 1) % step == 0]
        if not sparse:  # keep one sparse layer: the expert properties need it
            dense.discard(step - 1)
        sizes.update(decoder_sparse_step=step, mlp_only_layers=tuple(sorted(dense)))
        return sizes

    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md (shared meanings live there)
        **PreNormBlock.hook_docs,
        **GroupedQueryAttention.rms_qk_norm_hook_docs,
        "blocks.{i}.mlp.hook_in": "`ln2(resid_mid)`, the RMSNorm's weight included: what `gate_proj` and `up_proj` read"
        " on a dense layer, the router and the experts on a sparse one; circuit-tracer's name, the point a transcoder"
        " reads; a default cache leaves it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "the gate's pre-activation `gate_proj(x)`",
        "blocks.{i}.mlp.hook_post": "the neurons, `silu(pre) * pre_linear` = `down_proj`'s input",
        "blocks.{i}.hook_mlp_out": "MLP output; on a sparse layer `sum_j weight_j * down_e(j)(post_j)` over the slots",
    }
