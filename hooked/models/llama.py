"""Llama (`LlamaForCausalLM`: Llama 2, 3, 3.1, 3.2) and Mistral (`MistralForCausalLM`), with a hook point on
every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/llama/modeling_llama.py` and
`models/mistral/modeling_mistral.py` operation for operation: RMSNorm in float32, cast back before the
weight; q/k/v/o projections (biases with `attention_bias`, Llama only); half-split RoPE with cos/sin in
float32 cast to the activation dtype, its frequencies plain, "linear" or "llama3" scaled
(`hooked.rotary.rotary_frequencies`, after transformers' `modeling_rope_utils`); grouped-query attention
with the softmax in float32; a SiLU-gated MLP (biases with `mlp_bias`, Llama only); tied or untied
unembedding. Mistral is Llama without biases plus an optional `sliding_window`: query column i sees key
column j only if i - j < sliding_window (the window lives in the mask, `AttentionMask.windowed`, so the
forward, generation with a KV cache and left-padded batches all apply it; docs/attention.md). Float32
logits equal transformers' bit for bit (tests/families/test_llama_parity.py, tests/families/test_mistral_parity.py).

Both are the shared rotary decoder (hooked/models/rotary_decoder.py) of pre-norm blocks, each grouped-query
attention without per-head q/k norms (hooked/models/grouped_query_attention.py) and Llama's MLP below: the
module tree, checkpoint leaf names and TransformerLens hook names (hook_q/k/v, hook_rot_q/k, ...) of Qwen3's,
less the q/k norms. This file holds the configs, the MLP, the models built from those parts, and their
declarations. See docs/llama.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hooked.layers import GatedMLP, Projection
from hooked.models.config import alias
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.rotary_decoder import (
    PreNormBlock,
    RotaryDecoder,
    RotaryDecoderConfig,
    rms_rotary_fields,
    rope_default_linear_or_llama3,
)
from hooked.rotary import LinearScaling, Llama3Scaling, RotaryEmbedding


# ============================================================================= config
@dataclass
class LlamaConfig(RotaryDecoderConfig):
    """The rotary decoder's fields (head_dim: hidden_size / num_attention_heads when config.json has none), plus
    RoPE's scaling, MLP biases and Mistral's window."""

    rope_scaling: LinearScaling | Llama3Scaling | None = None  # rope_type "linear" / "llama3"; None: plain RoPE
    tie_word_embeddings: bool = False  # unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections (Llama only)
    mlp_bias: bool = False  # biases on gate/up/down projections (Llama only)
    sliding_window: int | None = None  # Mistral: keys at most this many columns back, the query's own included
    max_position_embeddings: int = 2048  # informative (RoPE has no hard limit); bounds sliding_window
    default_prepend_bos: bool = True  # Llama and Mistral tokenizers start with <s> / <|begin_of_text|>

    # TransformerLens' names for what the architecture fixes (the rest are RotaryDecoderConfig's)
    act_fn = "silu"
    original_architecture = "LlamaForCausalLM"

    @property
    def use_NTK_by_parts_rope(self) -> bool:  # TransformerLens' name for the "llama3" scaling
        return isinstance(self.rope_scaling, Llama3Scaling)

    window_size = alias("sliding_window")  # TransformerLens' name (its Mistral: attn_types "local")

    @property
    def use_local_attn(self) -> bool:
        return self.sliding_window is not None

    def __post_init__(self):
        super().__post_init__()
        self.check_sliding_window()

    transformer_lens_shape = (
        "normalization_type='RMS', positional_embedding_type='rotary', act_fn='silu', gated_mlp=True,"
        " use_qk_norm=False, final_rms=True"
    )

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[LlamaConfig | None, list[str] | None]:
        """A Llama from TransformerLens' fields (hooked.transformer_lens.config); plain RoPE (TransformerLens'
        NTK-by-parts
        and sliding-window fields are refused there, so neither reaches here)."""
        if cls is not LlamaConfig or tl["use_qk_norm"]:
            return None, None  # Mistral without a window is this same Llama; with q/k norms it is Qwen3
        fields, problems = rms_rotary_fields(tl, "Llama", qk_norm=False)
        return (None, problems) if fields is None else (LlamaConfig(**fields), [])

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        """The keyword arguments of this config, read from a Hugging Face config.json dict."""
        family = cls.original_architecture
        cls.require_silu(config, family)
        # pretraining_tp > 1 is accepted: transformers 5.24's Llama never reads it (4.x sliced the same matmuls).
        theta, scaling = rope_default_linear_or_llama3(config, family)
        return dict(
            **cls.common_fields_from_hf(config, max_position_embeddings=2048),  # transformers' LlamaConfig defaults
            rope_theta=theta,
            rope_scaling=scaling,
            mlp_bias=config.get("mlp_bias", False),
        )


@dataclass
class MistralConfig(LlamaConfig):
    """Llama's config without biases, with `sliding_window` (transformers' MistralConfig default 4096 when
    config.json has no such key; null: plain causal attention)."""

    original_architecture = "MistralForCausalLM"

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        layer_types = set(config.get("layer_types") or ())
        if len(layer_types) > 1:  # Ministral's interleaving: transformers' Mistral would ignore it
            raise ValueError(
                f"{cls.original_architecture} with layer_types {sorted(layer_types)} (interleaved sliding and full"
                " attention) is not supported by hooked: every layer must attend alike"
            )
        fields = super()._fields_from_hf(config)
        # transformers' Mistral has no attention_bias / mlp_bias: it builds bias-free layers whatever the config says.
        fields.update(
            attention_bias=False,
            mlp_bias=False,
            sliding_window=config.get("sliding_window", 4096),
            max_position_embeddings=config.get("max_position_embeddings", 4096 * 32),
        )
        return fields


# ============================================================================= modules and forward
class LlamaMLP(GatedMLP):
    """`GatedMLP` (hook_pre = gate, hook_pre_linear = up, hook_post = silu(gate) * up), with biases under `mlp_bias`."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg.d_model, cfg.d_mlp)
        if cfg.mlp_bias:
            for linear in (self.gate_proj, self.up_proj, self.down_proj):
                linear.bias = nn.Parameter(torch.zeros(linear.out_features))

    def residual_readers(self) -> tuple[Projection, ...]:
        return (
            Projection(self.gate_proj.weight, 1, self.gate_proj.bias),
            Projection(self.up_proj.weight, 1, self.up_proj.bias),
        )

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.down_proj.weight, 0, self.down_proj.bias),)

    @property
    def b_gate(self) -> Float[Tensor, " d_mlp"]:
        return self._bias(self.gate_proj)

    @property
    def b_in(self) -> Float[Tensor, " d_mlp"]:
        """up_proj's bias (zeros without `mlp_bias`)."""
        return self._bias(self.up_proj)

    @property
    def b_out(self) -> Float[Tensor, " d_model"]:
        return self._bias(self.down_proj)

    @staticmethod
    def _bias(linear: nn.Linear) -> Tensor:
        return linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)


class Llama(RotaryDecoder):
    """Llama 2 / 3 / 3.1 / 3.2 with TransformerLens hook names. Load with `hooked.load("meta-llama/Llama-3.2-1B")`."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.rope_scaling))

    @staticmethod
    def make_block(cfg: LlamaConfig, layer: int) -> PreNormBlock:
        return PreNormBlock(cfg, LlamaMLP(cfg), GroupedQueryAttention(cfg))

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about Llama (docs/adding-a-model.md).
    config_class = LlamaConfig
    architectures = ("LlamaForCausalLM", "llama")
    family = "llama"
    title = "Llama"
    checkpoint_table = RotaryDecoder.checkpoint_table_of(
        PreNormBlock.checkpoint_norms,
        attention=r"(q_proj|k_proj|v_proj|o_proj)\.(weight|bias)",  # no q/k norms
        mlp=r"(gate_proj|up_proj|down_proj)\.(weight|bias)",  # mlp_bias
    )
    # Older checkpoints saved RoPE's inv_freq (recomputed here).
    checkpoint_extra_ignored = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)
    # TransformerLens 3.9's official names (supported_models.py) of these checkpoints -> its aliases
    # (hooked.transformer_lens.aliases); Llama 1's names are local paths there
    transformer_lens_names = {
        "codellama/CodeLlama-7b-hf": ("CodeLlamallama-2-7b",),
        "codellama/CodeLlama-7b-Instruct-hf": ("CodeLlama-7b-instruct",),
        "codellama/CodeLlama-7b-Python-hf": ("CodeLlama-7b-python",),
        "meta-llama/Llama-2-13b-chat-hf": ("Llama-2-13b-chat",),
        "meta-llama/Llama-2-13b-hf": ("Llama-2-13b",),
        "meta-llama/Llama-2-70b-chat-hf": ("Llama-2-70b-chat", "meta-llama-2-70b-chat-hf"),
        "meta-llama/Llama-2-7b-chat-hf": ("Llama-2-7b-chat",),
        "meta-llama/Llama-2-7b-hf": ("Llama-2-7b",),
        "meta-llama/Llama-3.1-70B": (),
        "meta-llama/Llama-3.1-70B-Instruct": (),
        "meta-llama/Llama-3.1-8B": (),
        "meta-llama/Llama-3.1-8B-Instruct": (),
        "meta-llama/Llama-3.2-1B": (),
        "meta-llama/Llama-3.2-1B-Instruct": (),
        "meta-llama/Llama-3.2-3B": (),
        "meta-llama/Llama-3.2-3B-Instruct": (),
        "meta-llama/Llama-3.3-70B-Instruct": (),
        "meta-llama/Meta-Llama-3-70B": (),
        "meta-llama/Meta-Llama-3-70B-Instruct": (),
        "meta-llama/Meta-Llama-3-8B": (),
        "meta-llama/Meta-Llama-3-8B-Instruct": (),
    }

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """The rotary decoder's draws, plus Llama's MLP biases and rope scalings."""
        return dict(
            super().draw_sizes(draw, st, n_layers, n_heads),
            mlp_bias=draw(st.booleans()),
            rope_scaling=draw(st.sampled_from([None, LinearScaling(2.0), Llama3Scaling(8.0, 1.0, 4.0, 16)])),
        )

    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md
        **PreNormBlock.hook_docs,
        **GroupedQueryAttention.hook_docs,  # the attention's q and k
        "blocks.{i}.attn.hook_rot_q": "q after RoPE: `x * cos + rotate_half(x) * sin`, frequencies plain, `linear` or"
        " `llama3`-scaled",
        "blocks.{i}.mlp.hook_in": "`ln2(resid_mid)`, the RMSNorm's weight included: what `gate_proj` and `up_proj`"
        " read; circuit-tracer's name, the point a transcoder reads; a default cache leaves it out (cache it by name)",
        "blocks.{i}.mlp.hook_pre": "the gate's pre-activation `gate_proj(x)` (with its bias under `mlp_bias`)",
        "blocks.{i}.mlp.hook_pre_linear": "the up projection `up_proj(x)`",
        "blocks.{i}.mlp.hook_post": "the neurons, `silu(pre) * pre_linear` = `down_proj`'s input",
    }


class Mistral(Llama):
    """Mistral with TransformerLens hook names: Llama without biases, plus a sliding window when the
    config sets one. Load with `hooked.load("mistralai/Mistral-7B-v0.1")`."""

    # ------------------------------------------------------------------------- declarations
    config_class = MistralConfig
    architectures = ("MistralForCausalLM", "mistral")
    family = "mistral"
    title = "Mistral"
    # TransformerLens 3.9's official names (supported_models.py) of these checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        "mistralai/Mistral-7B-Instruct-v0.1": ("mistral-7b-instruct",),
        "mistralai/Mistral-7B-v0.1": ("mistral-7b",),
        "mistralai/Mistral-Nemo-Base-2407": ("mistral-nemo-base-2407",),
        "mistralai/Mistral-Small-24B-Base-2501": (),
    }
    random_sizes = dict(Llama.random_sizes, sliding_window=4)
    hook_docs = {**Llama.hook_docs, **GroupedQueryAttention.sliding_window_hook_docs}

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        sizes = super().draw_sizes(draw, st, n_layers, n_heads)
        sizes.update(attention_bias=False, mlp_bias=False, sliding_window=draw(st.sampled_from([None, 1, 2, 4])))
        return sizes
