"""Mixtral (`MixtralForCausalLM`: Mixtral-8x7B, 8x22B): Mistral's attention with a sparse mixture-of-experts
MLP in every block.

Numerics follow Hugging Face transformers 5.24 `models/mixtral/modeling_mixtral.py` operation for operation.
Attention, norms, RoPE and the sliding window are Mistral's: the shared rotary decoder
(hooked/models/rotary_decoder.py) of pre-norm blocks with grouped-query attention
(hooked/models/grouped_query_attention.py), no biases, the window in the mask. The MLP is the sparse MLP Qwen3-MoE
has too (hooked/models/moe.py) with Mixtral's router:

    logits = x @ gate.weight.T                    in the model dtype         hook_router_logits
    p      = softmax(logits) over ALL experts     in float32
    w, e   = top-k of p, w renormalised: w / sum(w)   (always: Mixtral has no norm_topk_prob switch)
    out    = sum over slots of w * down_e(silu(gate_e(x)) * up_e(x)), weighted and summed in float32, cast

Unlike Qwen3-MoE, transformers' Mixtral never casts the routing weights to the model dtype: in bf16 each
slot's output is multiplied by a float32 weight, summed over slots in float32 and cast once
(`integrations/moe.py`, grouped_mm_experts_forward), and so it is here (`float32_expert_weights`).
Float32 logits equal transformers' bit for bit; bf16 too on the cases tests/families/test_mixtral_parity.py measures.

Checkpoints: the hub's (and transformers 5.24's save_pretrained's) per-expert
`model.layers.{i}.block_sparse_moe.experts.{e}.w1/w2/w3.weight` (gate, down, up) and
`block_sparse_moe.gate.weight` (the router) are stacked at load into `experts.gate_up_proj`
[n_experts 2*d_mlp d_model] and `experts.down_proj` [n_experts d_model d_mlp]. transformers' conversion mapping
(`conversion_mapping.py`, "mixtral") also reads the `mlp.` prefix and the already-fused in-memory tensors
`mlp.experts.gate_up_proj` / `mlp.experts.down_proj`; so does this loader. See docs/mixtral.md.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from hooked.models.config import EXPERT_AXIS_FIELDS, ModelConfig, alias
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.moe import SparseMoeMLP
from hooked.models.rotary_decoder import PreNormBlock, RotaryDecoder, RotaryDecoderConfig, rope_default_linear_or_llama3
from hooked.rotary import LinearScaling, Llama3Scaling, RotaryEmbedding


# ============================================================================= config
@dataclass
class MixtralConfig(RotaryDecoderConfig):
    """Mistral's fields (d_mlp is each expert's width, intermediate_size; head_dim hidden_size / num_attention_heads
    when config.json has none; no biases) plus the experts."""

    rope_scaling: LinearScaling | Llama3Scaling | None = None  # rope_type "linear" / "llama3"; None: plain RoPE
    tie_word_embeddings: bool = False  # unembedding = the token embedding
    attention_bias: bool = False  # always False from a config.json: transformers' Mixtral has no biases
    mlp_bias: bool = False  # always False (every MLP is sparse, its experts without biases)
    sliding_window: int | None = None  # keys at most this many columns back, the query's own included
    max_position_embeddings: int = 2048  # informative (RoPE has no hard limit); bounds sliding_window
    default_prepend_bos: bool = True  # Mixtral's tokenizer starts with <s>
    _: KW_ONLY
    n_experts: int  # experts per block (num_local_experts)
    top_k: int  # experts per token (num_experts_per_tok)

    # TransformerLens' names for what the architecture fixes (the rest are RotaryDecoderConfig's)
    act_fn = "silu"
    original_architecture = "MixtralForCausalLM"
    axis_fields = {**ModelConfig.axis_fields, **EXPERT_AXIS_FIELDS}
    norm_topk_prob = True  # transformers' MixtralTopKRouter renormalises the top-k weights unconditionally

    d_expert_mlp = alias("d_mlp")  # every MLP is sparse: the expert width is intermediate_size
    # TransformerLens' names for the same settings
    num_experts = alias("n_experts")
    experts_per_token = alias("top_k")

    @property
    def use_NTK_by_parts_rope(self) -> bool:  # the "llama3" scaling
        return isinstance(self.rope_scaling, Llama3Scaling)

    window_size = alias("sliding_window")  # TransformerLens' Mistral: attn_types "local"

    @property
    def use_local_attn(self) -> bool:
        return self.sliding_window is not None

    def __post_init__(self):
        super().__post_init__()
        self.check_sliding_window()
        if not (isinstance(self.n_experts, int) and self.n_experts >= 1):
            raise ValueError(f"num_local_experts {self.n_experts!r} must be a whole number >= 1")
        if not (isinstance(self.top_k, int) and 1 <= self.top_k <= self.n_experts):
            raise ValueError(f"num_experts_per_tok {self.top_k!r} must lie in 1..num_local_experts ({self.n_experts})")

    def is_sparse(self, layer: int) -> bool:
        return True  # every Mixtral block routes

    # HookedTransformer(cfg) builds no Mixtral: hooked.transformer_lens.config refuses TransformerLens' num_experts,
    # and from_transformer_lens keeps ModelConfig's answer, (None, None).

    @classmethod
    def from_hf(cls, config: dict) -> MixtralConfig:
        """Mistral's keys with transformers' MixtralConfig defaults where they differ from Mistral's (rope_theta 1e6,
        its default_theta; no sliding window; rms_norm_eps 1e-5), plus the experts."""
        config = {"rope_theta": 1e6, "sliding_window": None, "rms_norm_eps": 1e-5, **config}
        family = cls.original_architecture
        layer_types = set(config.get("layer_types") or ())
        if len(layer_types) > 1:  # Ministral's interleaving: transformers' Mistral would ignore it
            raise ValueError(
                f"{family} with layer_types {sorted(layer_types)} (interleaved sliding and full"
                " attention) is not supported by hooked: every layer must attend alike"
            )
        cls.require_silu(config, family)
        theta, scaling = rope_default_linear_or_llama3(config, family)
        # router_jitter_noise is ignored: transformers multiplies the MLP input by U(1 - noise, 1 + noise) only
        # when training (`self.training and jitter_noise > 0`); hooked computes the inference forward.
        # output_router_logits / router_aux_loss_coef are training losses, attention_dropout training only.
        fields = cls.common_fields_from_hf(config, max_position_embeddings=4096 * 32)  # MixtralConfig's default
        fields["attention_bias"] = False  # transformers' Mixtral has no attention biases, whatever config.json says
        return cls(
            **fields,
            rope_theta=theta,
            rope_scaling=scaling,
            sliding_window=config.get("sliding_window", 4096),
            n_experts=config["num_local_experts"],
            top_k=config["num_experts_per_tok"],
        )


# ============================================================================= modules and forward
class MixtralSparseMLP(SparseMoeMLP):
    """The sparse MLP with `norm_topk_prob` always on and float32 routing weights (see the module docstring)."""

    float32_expert_weights = True


class Mixtral(RotaryDecoder):
    """Mixtral with TransformerLens hook names plus the router and per-slot expert hooks.

    Load with `hooked.load("mistralai/Mixtral-8x7B-v0.1")`; everything but the MLP is Mistral's.
    """

    def __init__(self, cfg: MixtralConfig):
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.rope_scaling))

    @staticmethod
    def make_block(cfg: MixtralConfig, layer: int) -> PreNormBlock:
        return PreNormBlock(cfg, MixtralSparseMLP(cfg), GroupedQueryAttention(cfg))

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about Mixtral (docs/adding-a-model.md).
    config_class = MixtralConfig
    architectures = ("MixtralForCausalLM", "mixtral")
    family = "mixtral"
    title = "Mixtral"
    checkpoint_table = RotaryDecoder.checkpoint_table_of(
        PreNormBlock.checkpoint_norms, attention=r"(q_proj|k_proj|v_proj|o_proj)\.(weight)", mlp=None
    ) + (
        (r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.gate\.weight", r"blocks.\1.mlp.gate.weight"),  # the router
        # transformers' in-memory layout, already fused and stacked
        (
            r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(gate_up_proj|down_proj)",
            r"blocks.\1.mlp.experts.\2",
        ),
    )
    # Older checkpoints saved RoPE's inv_freq (recomputed here).
    checkpoint_extra_ignored = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)

    # Per-expert keys on disk -> one expert of a stacked parameter (`expert` indexes axis 0); (part, parts) places
    # w1 (gate) and w3 (up) in the two halves of gate_up_proj's axis 1, as transformers' MergeModulelist + Concatenate.
    checkpoint_stacked = (
        (
            r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(?P<expert>\d+)\.w1\.weight",
            r"blocks.\1.mlp.experts.gate_up_proj",
            (0, 2),
        ),
        (
            r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(?P<expert>\d+)\.w3\.weight",
            r"blocks.\1.mlp.experts.gate_up_proj",
            (1, 2),
        ),
        (
            r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(?P<expert>\d+)\.w2\.weight",
            r"blocks.\1.mlp.experts.down_proj",
        ),
    )
    # TransformerLens 3.9's official names (supported_models.py) of these checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mixtral-instruct", "mixtral-8x7b-instruct"),
        "mistralai/Mixtral-8x7B-v0.1": ("mixtral", "mixtral-8x7b"),
    }
    random_sizes = dict(RotaryDecoder.random_sizes, d_mlp=16, sliding_window=4, n_experts=4, top_k=2)
    random_std = {"mlp.gate.weight": 0.6}  # router logits apart: top-k decided by margins

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """The rotary decoder's draws without biases, plus Llama's rope scalings, a window and the experts."""
        sizes = super().draw_sizes(draw, st, n_layers, n_heads)
        sizes.update(
            attention_bias=False,
            mlp_bias=False,
            rope_scaling=draw(st.sampled_from([None, LinearScaling(2.0), Llama3Scaling(8.0, 1.0, 4.0, 16)])),
            sliding_window=draw(st.sampled_from([None, 1, 2, 4])),
        )
        n_experts = draw(st.integers(2, 6))
        sizes.update(
            d_mlp=draw(st.sampled_from([8, 12, 16])), n_experts=n_experts, top_k=draw(st.integers(1, min(3, n_experts)))
        )
        return sizes

    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md
        **PreNormBlock.hook_docs,
        **GroupedQueryAttention.hook_docs,  # the attention's q and k
        "blocks.{i}.attn.hook_rot_q": "q after RoPE: `x * cos + rotate_half(x) * sin`, frequencies plain, `linear` or"
        " `llama3`-scaled",
        **GroupedQueryAttention.sliding_window_hook_docs,
        "blocks.{i}.mlp.hook_in": "`ln2(resid_mid)`, the RMSNorm's weight included: what the router (`gate`) and the"
        " experts read; circuit-tracer's name, the point a transcoder reads; a default cache leaves it out (cache it"
        " by name)",
        "blocks.{i}.hook_mlp_out": "MLP output: `sum_j weight_j * down_e(j)(expert_post_j)` over the top_k slots,"
        " weighted and summed in float32, cast to the model dtype",
        "blocks.{i}.mlp.hook_expert_weights": "the top_k routing weights `top-k(softmax(router_logits)) / their sum`;"
        " float32 whatever the model dtype, as transformers' Mixtral",
    }
