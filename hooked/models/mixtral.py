"""Mixtral (`MixtralForCausalLM`: Mixtral-8x7B, 8x22B): Mistral's attention with a sparse mixture-of-experts
MLP in every block.

Numerics follow Hugging Face transformers 5.24 `models/mixtral/modeling_mixtral.py` operation for operation.
Attention, norms, RoPE and the sliding window are Mistral's (hooked/models/llama.py: no biases, the window in
the mask). The MLP is Qwen3-MoE's sparse MLP (hooked/models/qwen3_moe.py) with Mixtral's router:

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

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from hooked.hooks import HookPoint
from hooked.layers import RMSNorm
from hooked.models.base import HookedTransformer
from hooked.models.llama import Mistral, MistralConfig
from hooked.models.qwen3 import Qwen3Attention, Qwen3Block
from hooked.models.qwen3_moe import Qwen3MoeSparseMLP
from hooked.rotary import RotaryEmbedding


@dataclass(kw_only=True)
class MixtralConfig(MistralConfig):
    """Mistral's config (d_mlp is each expert's width, intermediate_size) plus the experts."""

    n_experts: int  # experts per block (num_local_experts)
    top_k: int  # experts per token (num_experts_per_tok)

    original_architecture = "MixtralForCausalLM"
    norm_topk_prob = True  # transformers' MixtralTopKRouter renormalises the top-k weights unconditionally

    @property
    def d_expert_mlp(self) -> int:
        return self.d_mlp  # every MLP is sparse: the expert width is intermediate_size

    @property
    def num_experts(self) -> int:  # TransformerLens' names
        return self.n_experts

    @property
    def experts_per_token(self) -> int:
        return self.top_k

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.n_experts, int) and self.n_experts >= 1):
            raise ValueError(f"num_local_experts {self.n_experts!r} must be a whole number >= 1")
        if not (isinstance(self.top_k, int) and 1 <= self.top_k <= self.n_experts):
            raise ValueError(f"num_experts_per_tok {self.top_k!r} must lie in 1..num_local_experts ({self.n_experts})")

    def is_sparse(self, layer: int) -> bool:
        return True  # every Mixtral block routes

    # HookedTransformer(cfg) builds no Mixtral: hooked.transformer_lens.config refuses TransformerLens' num_experts, and the
    # inherited from_transformer_lens answers (None, None) for every subclass of LlamaConfig.
    transformer_lens_shape = None

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        # transformers' MixtralConfig defaults, where they differ from Mistral's: rope_theta 1e6 (its
        # default_theta), no sliding window, rms_norm_eps 1e-5.
        config = {"rope_theta": 1e6, "sliding_window": None, "rms_norm_eps": 1e-5, **config}
        fields = super()._fields_from_hf(config)
        # router_jitter_noise is ignored: transformers multiplies the MLP input by U(1 - noise, 1 + noise) only
        # when training (`self.training and jitter_noise > 0`); hooked computes the inference forward.
        # output_router_logits / router_aux_loss_coef are training losses, attention_dropout training only.
        fields.update(n_experts=config["num_local_experts"], top_k=config["num_experts_per_tok"])
        return fields


class MixtralSparseMLP(Qwen3MoeSparseMLP):
    """Qwen3-MoE's sparse MLP with `norm_topk_prob` always on and float32 routing weights (see the module docstring)."""

    float32_expert_weights = True


class MixtralBlock(Qwen3Block):
    """Mistral's pre-norm block (attention without q/k norms or biases) with the sparse MLP."""

    def __init__(self, cfg: MixtralConfig):
        super().__init__(cfg, MixtralSparseMLP(cfg), Qwen3Attention(cfg, qk_norm=False))


_CHECKPOINT_RENAMES = (
    (r"model\.embed_tokens\.weight", r"embed_tokens.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.ln1.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.ln2.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.weight", r"blocks.\1.attn.\2.weight"),
    (r"model\.norm\.weight", r"ln_final.weight"),
    (r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.gate\.weight", r"blocks.\1.mlp.gate.weight"),  # the router
    # transformers' in-memory layout, already fused and stacked
    (r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.experts.\2"),
)


class Mixtral(Mistral):
    """Mixtral with TransformerLens hook names plus Qwen3-MoE's router and per-slot expert hooks.

    Load with `hooked.load("mistralai/Mixtral-8x7B-v0.1")`; everything but the MLP is Mistral's.
    """

    config_class = MixtralConfig
    architectures = ("MixtralForCausalLM", "mixtral")
    family: ClassVar[str] = "mixtral"
    # TransformerLens 3.9's official names (supported_models.py) of these checkpoints -> its aliases (hooked.transformer_lens.aliases)
    transformer_lens_names: ClassVar[dict[str, tuple[str, ...]]] = {
        "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mixtral-instruct", "mixtral-8x7b-instruct"),
        "mistralai/Mixtral-8x7B-v0.1": ("mixtral", "mixtral-8x7b"),
    }
    title: ClassVar[str] = "Mixtral"
    random_sizes: ClassVar[dict] = dict(
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_head=8,
        d_mlp=16,
        d_vocab=64,
        sliding_window=4,
        n_experts=4,
        top_k=2,
    )
    random_std: ClassVar[dict[str, float]] = {"mlp.gate.weight": 0.6}  # router logits apart: top-k decided by margins
    hook_docs: ClassVar[dict[str, str]] = {  # Mistral's, less its dense MLP's
        **{name: text for name, text in Mistral.hook_docs.items() if not name.startswith("blocks.{i}.mlp.")},
        "blocks.{i}.hook_mlp_out": "MLP output: `sum_j weight_j * down_e(j)(expert_post_j)` over the top_k slots,"
        " weighted and summed in float32, cast to the model dtype",
        "blocks.{i}.mlp.hook_expert_weights": "the top_k routing weights `top-k(softmax(router_logits)) / their sum`;"
        " float32 whatever the model dtype, as transformers' Mixtral",
    }

    def __init__(self, cfg: MixtralConfig):
        HookedTransformer.__init__(self, cfg)  # not Llama's __init__: the blocks differ
        self.embed_tokens = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint("batch pos d_model")
        self.rotary = RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.rope_scaling)
        self.blocks = nn.ModuleList(MixtralBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_final = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.setup_hooks()

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        sizes = super().draw_sizes(draw, st, n_layers, n_heads)
        n_experts = draw(st.integers(2, 6))
        sizes.update(
            d_mlp=draw(st.sampled_from([8, 12, 16])), n_experts=n_experts, top_k=draw(st.integers(1, min(3, n_experts)))
        )
        return sizes

    def axis_sizes(self) -> dict[str, int]:
        return {
            **super().axis_sizes(),
            "n_experts": self.cfg.n_experts,
            "top_k": self.cfg.top_k,
            "d_expert_mlp": self.cfg.d_expert_mlp,
        }

    checkpoint_table = _CHECKPOINT_RENAMES

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
