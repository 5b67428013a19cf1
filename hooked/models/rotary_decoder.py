"""The rotary decoder every RoPE family but GPT-NeoX is built on, and its pre-norm block.

`RotaryDecoder` is the model: token embedding (`embed_tokens`, `hook_embed`; no position embedding) -> blocks,
each given the cos/sin of the positions and the mask (`block_inputs`) -> final norm (`ln_final`) -> unembedding,
tied to the embedding or its own (`lm_head`), as transformers 5.24's `Qwen3ForCausalLM`, `LlamaForCausalLM`,
`Olmo2ForCausalLM`, `Gemma2ForCausalLM`, .... A family gives it a rotary table and the block of each layer
(`make_block`). `PreNormBlock` is the block of Qwen3, Qwen3-MoE, Llama, Mistral and Mixtral: an RMSNorm before
attention and before the MLP; OLMo 2 (post-norms, hooked/models/olmo2.py) and Gemma (sandwich norms,
hooked/models/sandwich_decoder.py) build their own. The config side: `RotaryDecoderConfig`, the fields every
family's config opens with (and TransformerLens' names for them, the checks they need, and `common_fields_from_hf` /
`require_silu` reading a Hugging Face config.json), `rms_rotary_fields` reading TransformerLens' config,
`rope_default_or_yarn` and `rope_default_linear_or_llama3` the RoPE settings. Declarations shared alike:
`RotaryDecoder.checkpoint_table_of` (transformers' checkpoint names), `RotaryDecoder.random_sizes` and
`PreNormBlock.hook_docs` (what the pre-norm block's hooks hold).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import AttentionMask, Projection, RMSNorm, attention_input, mlp_input
from hooked.models.base import DecoderBlock, HookedTransformer
from hooked.models.config import ModelConfig, alias
from hooked.rotary import LinearScaling, Llama3Scaling, RotaryEmbedding, YarnScaling


# ============================================================================= config
@dataclass
class RotaryDecoderConfig(ModelConfig):
    """The fields every rotary decoder's config opens with, in this order, what they fix and the checks they need.
    Each family's config dataclass subclasses it, adds its own fields and may give one of these another default."""

    n_layers: int  # transformer blocks (num_hidden_layers)
    d_model: int  # residual stream width (hidden_size)
    n_heads: int  # query heads (num_attention_heads)
    n_kv_heads: int  # key/value heads (num_key_value_heads); n_heads / n_kv_heads queries share one
    d_head: int  # per-head width (head_dim), independent of d_model / n_heads
    d_mlp: int  # MLP width (intermediate_size)
    d_vocab: int  # vocabulary size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # RoPE base

    # TransformerLens' names for what every rotary decoder fixes
    normalization_type = "RMS"
    positional_embedding_type = "rotary"
    gated_mlp = True
    final_rms = True
    rotary_adjacent_pairs = False  # half-split RoPE

    # Keys a query sees at most, its own included, on every layer (RotaryDecoder.block_inputs): none here; a family
    # with a window declares the field (Mistral, Mixtral; Gemma's config picks layers by type).
    sliding_window = None

    # TransformerLens' names for these settings
    rotary_dim = alias("d_head")  # RoPE turns every pair of a head's dimensions
    n_ctx = alias(
        "max_position_embeddings",
        "Where `to_tokens(truncate=True)` cuts: the config's length (TransformerLens caps some at 2048).",
    )

    eps = alias("rms_norm_eps")
    rotary_base = alias("rope_theta")

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.n_heads} is not a multiple of num_key_value_heads {self.n_kv_heads}"
            )
        if self.d_head % 2:
            raise ValueError(f"head_dim {self.d_head} is odd: half-split RoPE turns pairs of dimensions")

    @classmethod
    def from_hf(cls, config: dict) -> RotaryDecoderConfig:
        """This config from a Hugging Face config.json dict: the fields the family's `_fields_from_hf` reads."""
        return cls(**cls._fields_from_hf(config))

    @staticmethod
    def require_silu(config: dict, family: str) -> None:
        """Refuse a config.json whose `hidden_act` is not the SiLU every gated rotary family here computes."""
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"{family} with hidden_act {config['hidden_act']!r} (the MLP's activation) is not supported by hooked"
                " (silu only)"
            )

    @staticmethod
    def common_fields_from_hf(
        config: dict,
        *,
        max_position_embeddings: int,
        head_dim: int | None = None,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
    ) -> dict:
        """The fields every rotary family reads alike from a Hugging Face config.json dict: the sizes above but
        rope_theta, and tie_word_embeddings, attention_bias, max_position_embeddings. A key the config leaves out takes
        the family's transformers default given here (head_dim: None, hidden_size / num_attention_heads)."""
        n_heads = config["num_attention_heads"]
        return dict(
            n_layers=config["num_hidden_layers"],
            d_model=config["hidden_size"],
            n_heads=n_heads,
            n_kv_heads=config.get("num_key_value_heads") or n_heads,
            d_head=config.get("head_dim") or head_dim or config["hidden_size"] // n_heads,
            d_mlp=config["intermediate_size"],
            d_vocab=config["vocab_size"],
            rms_norm_eps=config.get("rms_norm_eps", rms_norm_eps),
            tie_word_embeddings=config.get("tie_word_embeddings", tie_word_embeddings),
            attention_bias=config.get("attention_bias", False),
            max_position_embeddings=config.get("max_position_embeddings", max_position_embeddings),
        )

    def check_sliding_window(self) -> None:
        """A family with `sliding_window` calls it: null, or a whole number of columns in 1..max_position_embeddings."""
        window = self.sliding_window
        if window is not None and not (isinstance(window, int) and 0 < window <= self.max_position_embeddings):
            raise ValueError(
                f"sliding_window {window!r} must be a whole number in 1..max_position_embeddings"
                f" ({self.max_position_embeddings}), or null for plain causal attention"
            )


def rms_rotary_fields(tl: dict, family: str, qk_norm: bool) -> tuple[dict | None, list[str] | None]:
    """TransformerLens' fields for an RMSNorm, rotary, SiLU-gated model (Qwen3 with per-head q/k norms, Llama
    without) as a rotary decoder's config fields: (fields, []), (None, problems naming each field) when the
    shape is RMS + rotary but something differs, (None, None) for another shape (hooked.transformer_lens.config)."""
    if (tl["normalization_type"], tl["positional_embedding_type"]) != ("RMS", "rotary"):
        return None, None
    d_head, rotary_dim = tl["d_head"], tl["rotary_dim"]
    problems = [
        f"attn_only=True ({family} blocks have an MLP; attention-only models are GPT-2-shaped: LN, standard)"
        if tl["attn_only"]
        else None,
        f"act_fn={tl['act_fn']!r} ({family} has silu)" if tl["act_fn"] != "silu" else None,
        f"gated_mlp=False ({family}'s MLP is gated)" if not tl["gated_mlp"] else None,
        (
            f"use_qk_norm={tl['use_qk_norm']} ({family} "
            + ("normalises" if qk_norm else "does not normalise")
            + " each head's q and k)"
        )
        if tl["use_qk_norm"] != qk_norm
        else None,
        f"final_rms=False ({family}'s final norm is RMSNorm)" if not tl["final_rms"] else None,
        f"rotary_dim={rotary_dim} ({family} rotates all of d_head={d_head})"
        if rotary_dim not in (None, d_head)
        else None,
        "scale_attn_by_inverse_layer_idx=True" if tl["scale_attn_by_inverse_layer_idx"] else None,
        "parallel_attn_mlp=True" if tl["parallel_attn_mlp"] else None,
    ]
    problems = [problem for problem in problems if problem]
    if problems:
        return None, problems
    return dict(
        n_layers=tl["n_layers"],
        d_model=tl["d_model"],
        n_heads=tl["n_heads"],
        n_kv_heads=tl["n_key_value_heads"] or tl["n_heads"],
        d_head=d_head,
        d_mlp=tl["d_mlp"],
        d_vocab=tl["d_vocab"],
        rms_norm_eps=tl["eps"],
        rope_theta=float(tl["rotary_base"]),
        tie_word_embeddings=tl["tie_word_embeddings"],
        max_position_embeddings=tl["n_ctx"],
    ), []


def rope_settings(config: dict, family: str) -> tuple[dict, float, str]:
    """(the RoPE parameters, the base, the rope type) of a config.json: `rope_parameters` (transformers 5) or
    `rope_theta` + `rope_scaling` (hub). RoPE over part of each head is refused: every family here turns whole heads."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(
            f"{family} with partial_rotary_factor {partial} is not supported by hooked (RoPE on whole heads)"
        )
    return rope, theta, rope.get("rope_type", rope.get("type", "default"))


def rope_default(config: dict, family: str) -> float:
    """The RoPE base of a family with plain RoPE only (OLMo 2, Gemma 2); any scaling is refused."""
    _, theta, rope_type = rope_settings(config, family)
    if rope_type != "default":
        raise ValueError(
            f"rope_type {rope_type!r} (config.json rope_parameters / rope_scaling) is not supported for"
            f" {family}: hooked implements plain RoPE ('default')"
        )
    return theta


def rope_default_or_yarn(config: dict, family: str) -> tuple[float, YarnScaling | None]:
    """RoPE base and scaling, plain or YaRN (Qwen3, Qwen3-MoE), from `rope_parameters` (transformers 5) or
    `rope_theta` + `rope_scaling` (hub)."""
    rope, theta, rope_type = rope_settings(config, family)
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise ValueError(f"rope_type {rope_type!r} is not supported for {family} (default, yarn)")
    # As transformers' standardize_rope_params: a top-level original_max_position_embeddings wins.
    original = config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    original = original or config.get("max_position_embeddings", 32768)
    factor = rope.get("factor") or config.get("max_position_embeddings", 32768) / original
    yarn = YarnScaling(
        factor=float(factor),
        original_max_positions=int(original),
        beta_fast=float(rope.get("beta_fast") or 32),
        beta_slow=float(rope.get("beta_slow") or 1),
        attention_factor=rope.get("attention_factor"),
        mscale=rope.get("mscale"),
        mscale_all_dim=rope.get("mscale_all_dim"),
        truncate=rope.get("truncate", True),
    )
    return theta, yarn


def rope_default_linear_or_llama3(config: dict, family: str) -> tuple[float, LinearScaling | Llama3Scaling | None]:
    """RoPE base and scaling, plain, "linear" or "llama3" (Llama, Mistral, Mixtral), from `rope_parameters`
    (transformers 5) or `rope_theta` + `rope_scaling` (hub)."""
    rope, theta, rope_type = rope_settings(config, family)
    if rope_type == "default":
        return theta, None

    def field(name: str) -> float:
        if rope.get(name) is None:
            raise ValueError(
                f"rope_scaling of type {rope_type!r} needs {name!r} (config.json rope_scaling / rope_parameters)"
            )
        return float(rope[name])

    if rope_type == "linear":
        return theta, LinearScaling(field("factor"))
    if rope_type == "llama3":
        # As transformers' standardize_rope_params: a top-level original_max_position_embeddings wins.
        original = (
            config.get("original_max_position_embeddings")
            or rope.get("original_max_position_embeddings")
            or config.get("max_position_embeddings", 2048)
        )
        return theta, Llama3Scaling(field("factor"), field("low_freq_factor"), field("high_freq_factor"), int(original))
    raise ValueError(
        f"rope_type {rope_type!r} (config.json rope_scaling / rope_parameters) is not supported for"
        f" {family}: hooked implements 'default', 'linear' and 'llama3'"
    )


# ============================================================================= modules and forward
class PreNormBlock(DecoderBlock):
    """The pre-norm block: resid_mid = resid_pre + attn(ln1(resid_pre)); resid_post = resid_mid + mlp(ln2(resid_mid)),
    both norms RMSNorms. The attention (`GroupedQueryAttention`, with or without per-head q/k norms) and the MLP
    (`GatedMLP`, Llama's with biases, or a sparse mixture of experts: hooked.models.moe) are given."""

    mlp_stage = ("hook_mlp_in", "ln2", "mlp", "hook_mlp_out", "hook_resid_post")  # what mlp_half computes
    checkpoint_norms = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}  # transformers' names -> hooked's
    # What the hook points of a rotary decoder of pre-norm blocks hold (docs/hooks-reference.md), in the same words for
    # every family built of PreNormBlock and GroupedQueryAttention; a family's hook_docs adds its attention's and MLP's.
    hook_docs: ClassVar[dict[str, str]] = {
        "hook_embed": "token embeddings `embed_tokens[tokens]`, which are block 0's `hook_resid_pre` (no position"
        " embedding: RoPE acts on q and k)",
        "blocks.{i}.ln1.hook_scale": "the RMSNorm's scale `sqrt(mean(x^2) + eps)`, before attention; always float32",
        "blocks.{i}.ln1.hook_normalized": "`x / scale` cast to the model dtype, before the norm's weight",
        "blocks.{i}.attn.hook_v": "`v_proj` output split by kv head",
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * d_head**-0.5`, kv heads repeated (query head h reads"
        " kv head h // (n_heads / n_kv_heads)), masked entries set to the dtype's minimum; listening switches the"
        " layer to the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the scores, computed in float32 and cast back",
        "blocks.{i}.attn.hook_z": "per-head attention output; a view of `o_proj`'s input, so an in-place edit changes"
        " what the projection reads",
    }

    def __init__(self, cfg: ModelConfig, mlp: nn.Module, attn: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint("batch pos head_index d_model")  # each head's copy of resid_pre (attention_input)
        self.hook_k_input = HookPoint("batch pos kv_head_index d_model")
        self.hook_v_input = HookPoint("batch pos kv_head_index d_model")
        self.ln1 = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.attn = attn
        self.hook_attn_out = HookPoint("batch pos d_model")
        self.hook_resid_mid = HookPoint("batch pos d_model")
        self.hook_mlp_in = HookPoint("batch pos d_model")  # what the MLP half reads, before ln2
        self.ln2 = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = mlp
        self.hook_mlp_out = HookPoint("batch pos d_model")
        self.hook_resid_post = HookPoint("batch pos d_model")

    def attn_half(
        self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None
    ) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_in = attention_input(self, resid_pre, self.attn.n_heads, self.attn.n_kv_heads)
        attn_out = self.hook_attn_out(self.attn(attn_in, cos, sin, mask, kv))
        return self.hook_resid_mid(resid_pre + attn_out)

    def mlp_half(self, resid_mid: Tensor) -> Tensor:
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_input(self, resid_mid))))
        return self.hook_resid_post(resid_mid + mlp_out)


class RotaryDecoder(HookedTransformer):
    """Embedding -> blocks -> final norm -> unembedding, positions entering through RoPE in every block.

    A family calls `super().__init__(cfg, rotary, final_norm)` and defines `make_block(cfg, layer)`; the modules are
    built in the order the forward runs them, which is the order of `hook_names` and of the parameters."""

    embedding_hook_names = ("hook_embed",)
    # hooked.testing's tiny random model (a family adds its own fields or changes one)
    random_sizes = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, d_vocab=64)

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, final_norm: type[RMSNorm] = RMSNorm):
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint("batch pos d_model")
        self.rotary = rotary
        self.blocks = nn.ModuleList(self.make_block(cfg, layer) for layer in range(cfg.n_layers))
        self.ln_final = final_norm(cfg.d_model, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.setup_hooks()

    @staticmethod
    @abc.abstractmethod
    def make_block(cfg: ModelConfig, layer: int) -> nn.Module:
        """Block `layer` of the model: each family defines it."""

    @staticmethod
    def checkpoint_table_of(
        norms: dict[str, str],
        attention: str = r"(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.(weight|bias)",
        mlp: str | None = r"(gate_proj|up_proj|down_proj)\.(weight)",
    ) -> tuple[tuple[str, str], ...]:
        """A rotary decoder's `checkpoint_table`: transformers' `model.embed_tokens`, `model.layers.{i}.*` and
        `model.norm` keys -> this module tree (`embed_tokens`, `blocks.{i}.*`, `ln_final`).

        `norms`: each block's norms, checkpoint name -> hooked's (the block's `checkpoint_norms`). `attention` and
        `mlp`: the leaves of `self_attn.` and `mlp.` a family reads, each a regex of two groups (module, parameter);
        `mlp=None` for a family that maps its MLP itself (Mixtral's stacked experts)."""
        layer = r"model\.layers\.(\d+)\."
        return (
            (r"model\.embed_tokens\.weight", r"embed_tokens.weight"),
            *(
                (layer + checkpoint_name + r"\.weight", rf"blocks.\1.{name}.weight")
                for checkpoint_name, name in norms.items()
            ),
            (layer + r"self_attn\." + attention, r"blocks.\1.attn.\2.\3"),
            *(() if mlp is None else ((layer + r"mlp\." + mlp, r"blocks.\1.mlp.\2.\3"),)),
            (r"model\.norm\.weight", r"ln_final.weight"),
        )

    def resid_from_tokens(self, tokens: Tensor, position_ids: Tensor) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_embed(self.embed_tokens(tokens))

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        cos, sin = self.rotary(position_ids, dtype)  # [batch pos d_head], once for all blocks
        return cos, sin, mask.windowed(self.cfg.sliding_window)  # every block: one mask (windowed: Mistral, Mixtral)

    def embedding_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.embed_tokens.weight, 1),)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed_tokens.weight

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """The sizes every rotary decoder has, drawn for hooked.testing's random models; a family adds its own."""
        return dict(
            d_model=draw(st.sampled_from([16, 24, 32, 48])),
            n_kv_heads=draw(st.sampled_from([k for k in range(1, n_heads + 1) if n_heads % k == 0])),
            d_head=draw(st.sampled_from([4, 8, 16])),  # even (half-split rotary), not d_model / n_heads
            d_mlp=draw(st.sampled_from([32, 48])),
            tie_word_embeddings=draw(st.booleans()),
            attention_bias=draw(st.booleans()),
        )
