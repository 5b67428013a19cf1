"""Gemma 3, text only (`Gemma3ForCausalLM`, model_type "gemma3_text": google/gemma-3-270m, gemma-3-1b), with a
hook point on every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/gemma3/modeling_gemma3.py` operation for operation. Gemma 3
is, as Gemma 2, the sandwich-norm decoder (hooked/models/sandwich_decoder.py: pre- and post-norms, Gemma's
`(1 + weight)` RMSNorm in float32, embeddings times `sqrt(hidden_size)` cast to the weights' dtype, a gelu_tanh-gated
MLP, an optional final logit cap) with grouped-query attention (hooked/models/grouped_query_attention.py) scaled by
`query_pre_attn_scalar ** -0.5`, plus:

    q = rope(q_norm(q_proj(x)), local or global)   # per-head Gemma RMSNorms over d_head, BEFORE RoPE
    k = rope(k_norm(k_proj(x)), local or global)

- two rotary tables, computed once per forward: "sliding_attention" layers use `rope_local_theta`
  (`rope_local_base_freq`, default 10000), "full_attention" layers `rope_theta` (default 1e6), possibly with
  `linear` scaling (factor 8 in the 4B+ models); `rope_parameters` is keyed by layer type;
- the layer pattern `layer_types`, by default `sliding_window_pattern` (6): layer i is global iff (i + 1) % 6 == 0;
- no attention softcap: transformers 5.24 builds the eager path without one whatever `attn_logit_softcapping`
  says, so a config that sets it is refused rather than read one way or the other.

Names are TransformerLens 3.9's (`loading_from_pretrained.py` for google/gemma-3-270m: `use_qk_norm`,
`rotary_base_local`, `rotary_scaling_factor`; `pretrained/weight_conversions/gemma.py`). See docs/gemma3.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hooked.layers import AttentionMask
from hooked.models.config import alias
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.sandwich_decoder import (
    LAYER_TYPES,
    GemmaRMSNorm,
    SandwichDecoder,
    SandwichDecoderConfig,
    SandwichNormBlock,
)
from hooked.rotary import LinearScaling, RotaryEmbedding

# ============================================================================= config
# transformers 5.24 `Gemma3TextConfig`'s defaults, for keys a config.json leaves out (the 4B+ models' text_config
# lists only what differs from them).
_HF_DEFAULTS = dict(
    vocab_size=262_208,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=131_072,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
)
ROPE_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # transformers' default_theta


@dataclass
class Gemma3Config(SandwichDecoderConfig):
    """The rotary decoder's sizes (RotaryDecoderConfig: n_layers ... d_vocab, rms_norm_eps, rope_theta), and:"""

    rope_theta: float = 1_000_000.0  # RoPE base of full_attention layers
    tie_word_embeddings: bool = True  # unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections
    max_position_embeddings: int = 131_072  # bounds sliding_window (RoPE itself has no hard limit)
    query_pre_attn_scalar: float = 256.0  # scores are scaled by query_pre_attn_scalar ** -0.5
    sliding_window: int | None = 4096  # keys at most this many columns back on "sliding_attention" layers
    layer_types: tuple[str, ...] | None = None  # per layer: "sliding_attention" / "full_attention"; None: the pattern
    attn_logit_softcapping: float | None = None  # must stay None (transformers 5.24 never applies it to Gemma 3)
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap); None: off
    default_prepend_bos: bool = True  # Gemma's tokenizer starts with <bos>
    rope_local_theta: float = 10_000.0  # RoPE base of sliding_attention layers (rope_local_base_freq)
    rope_scaling: LinearScaling | None = None  # full_attention layers' scaling ("linear"); None: plain RoPE
    rope_local_scaling: LinearScaling | None = None  # sliding_attention layers' scaling; None: plain RoPE
    sliding_window_pattern: int = 6  # without layer_types: layer i is full_attention iff (i + 1) % pattern == 0
    multimodal_checkpoint: bool = False  # a Gemma3ForConditionalGeneration checkpoint: its text model, vision skipped

    # TransformerLens' names of what Gemma 3 fixes (the rest are the sandwich decoder's, SandwichDecoderConfig)
    original_architecture = "Gemma3ForCausalLM"
    use_qk_norm = True  # per-head q_norm / k_norm

    def __post_init__(self):
        pattern = self.sliding_window_pattern
        if not (isinstance(pattern, int) and pattern > 0):
            raise ValueError(
                f"sliding_window_pattern {pattern!r} must be a positive whole number (every pattern-th"
                " layer is full_attention)"
            )
        if self.layer_types is None:  # transformers' Gemma3TextConfig.__post_init__, with its bool((i + 1) % pattern)
            object.__setattr__(
                self,
                "layer_types",
                tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(self.n_layers)),
            )
        if self.attn_logit_softcapping is not None:
            raise ValueError(
                f"attn_logit_softcapping {self.attn_logit_softcapping!r}: transformers 5.24's Gemma3ForCausalLM never"
                " applies it (no Gemma 3 model sets it), so hooked cannot tell which model is meant; set it to null"
            )
        for name in ("rope_theta", "rope_local_theta"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)!r} must be positive (the RoPE base)")
        super().__post_init__()

    # TransformerLens' names for the same settings (its google/gemma-3-* configs)
    rotary_base_local = alias("rope_local_theta")

    @property
    def rotary_scaling_factor(self) -> float:
        return 1.0 if self.rope_scaling is None else self.rope_scaling.factor

    @classmethod
    def from_hf(cls, config: dict) -> Gemma3Config:
        """A `gemma3_text` config.json, or a `Gemma3ForConditionalGeneration` one (the 4B+ models), whose `text_config`
        describes the language model (the vision tower is not loaded)."""
        if "text_config" not in config:
            return cls(**cls._fields_from_hf(config))
        text = dict(config["text_config"] or {})
        if (
            text.get("final_logit_softcapping") is not None
        ):  # Gemma3ForCausalLM applies it, the multimodal class does not
            raise ValueError(
                f"text_config.final_logit_softcapping {text['final_logit_softcapping']!r}: transformers 5.24's"
                " Gemma3ForConditionalGeneration never applies it (its Gemma3ForCausalLM does), so hooked"
                " cannot tell which model is meant; set it to null"
            )
        text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
        return cls(**cls._fields_from_hf(text), multimodal_checkpoint=True)

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        """A `gemma3_text` config (or the `text_config` of a multimodal one) over transformers' defaults: Gemma 2's
        keys (docs/gemma2.md), the per-layer-type rotary parameters and the layer pattern."""
        if config.get("use_bidirectional_attention"):
            raise ValueError(
                "use_bidirectional_attention is true (EmbeddingGemma: every text token attends both ways)"
                " and hooked implements causal Gemma 3 only; load a Gemma3ForCausalLM checkpoint"
            )
        config = {
            **_HF_DEFAULTS,
            **{
                key: value
                for key, value in config.items()
                if value is not None or key in ("final_logit_softcapping", "attn_logit_softcapping", "sliding_window")
            },
        }
        rope = _rope_from_hf(config)
        # transformers 5.24 reads hidden_activation only (a hub config's hidden_act is ignored there, and here).
        activation = config.get("hidden_activation") or "gelu_pytorch_tanh"
        if activation != "gelu_pytorch_tanh":
            raise ValueError(
                f"{cls.original_architecture} with hidden_activation {activation!r} is not supported by hooked"
                " (gelu_pytorch_tanh)"
            )
        layer_types = config.get("layer_types")
        return dict(  # every key but layer_types is there: _HF_DEFAULTS fills what the config leaves out
            **cls.common_fields_from_hf(
                config,
                max_position_embeddings=_HF_DEFAULTS["max_position_embeddings"],
                head_dim=_HF_DEFAULTS["head_dim"],
            ),
            query_pre_attn_scalar=config["query_pre_attn_scalar"],
            sliding_window=config["sliding_window"],
            layer_types=None if layer_types is None else tuple(layer_types),
            attn_logit_softcapping=config["attn_logit_softcapping"],
            final_logit_softcapping=config["final_logit_softcapping"],
            **rope,
            sliding_window_pattern=config.get("sliding_window_pattern", 6),
        )


def _rope_from_hf(config: dict) -> dict:
    """Both rotary tables as transformers 5.24 `Gemma3TextConfig.convert_rope_params_to_dict` builds them:
    `rope_parameters` keyed by layer type wins; else `rope_scaling` applies to full_attention layers, `rope_theta`
    is their base and `rope_local_base_freq` the sliding layers' base."""
    keyed = config.get("rope_parameters")
    if keyed is not None and not (isinstance(keyed, dict) and set(keyed) <= set(LAYER_TYPES)):
        raise ValueError(
            f"rope_parameters {keyed!r} must be keyed by layer type ({' / '.join(LAYER_TYPES)}), as"
            " transformers 5.24's Gemma 3 reads it (it ignores a flat one and uses its default bases)"
        )
    keyed = {
        kind: dict(value)
        for kind, value in (keyed or {kind: {"rope_type": "default"} for kind in LAYER_TYPES}).items()
        if value is not None
    }
    keyed.setdefault("full_attention", {"rope_type": "default"})
    keyed["full_attention"].update(config.get("rope_scaling") or {})  # a hub config's scaling: global layers only
    keyed["full_attention"].setdefault("rope_theta", config.get("rope_theta") or ROPE_THETA["full_attention"])
    keyed.setdefault("sliding_attention", {"rope_type": "default"})
    keyed["sliding_attention"].setdefault(
        "rope_theta", config.get("rope_local_base_freq") or ROPE_THETA["sliding_attention"]
    )
    thetas, scalings = {}, {}
    for kind, rope in keyed.items():
        where = f"rope_parameters[{kind!r}]"
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(
                f"{where} partial_rotary_factor {rope['partial_rotary_factor']} is not supported by hooked"
                " (RoPE on whole heads)"
            )
        if rope_type == "default":
            scalings[kind] = None
        elif rope_type == "linear":
            if rope.get("factor") is None:
                raise ValueError(f"{where} has rope_type 'linear' but no 'factor'")
            scalings[kind] = LinearScaling(float(rope["factor"]))
        else:
            raise ValueError(
                f"{where} rope_type {rope_type!r} is not supported for Gemma 3: hooked implements"
                " 'default' and 'linear'"
            )
        thetas[kind] = float(rope["rope_theta"])
    return dict(
        rope_theta=thetas["full_attention"],
        rope_scaling=scalings["full_attention"],
        rope_local_theta=thetas["sliding_attention"],
        rope_local_scaling=scalings["sliding_attention"],
    )


# ============================================================================= modules and forward
class Gemma3(SandwichDecoder):
    """Gemma 3 (text) with TransformerLens hook names. Load with `hooked.load("google/gemma-3-270m")`."""

    def __init__(self, cfg: Gemma3Config):
        super().__init__(cfg, RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.rope_scaling))  # full_attention layers
        self.rotary_local = RotaryEmbedding(cfg.d_head, cfg.rope_local_theta, cfg.rope_local_scaling)

    @staticmethod
    def make_block(cfg: Gemma3Config, layer: int) -> SandwichNormBlock:
        attn = GroupedQueryAttention(cfg, qk_norm=GemmaRMSNorm, scaling=cfg.query_pre_attn_scalar**-0.5)
        return SandwichNormBlock(cfg, layer, attn)

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        """(global cos, sin, local cos, sin, full mask, windowed mask), each table computed once per forward and
        only for the layer types present (as transformers); a block picks by its layer type."""
        kinds = set(self.cfg.layer_types)
        cos, sin = self.rotary(position_ids, dtype) if "full_attention" in kinds else (None, None)
        local_cos, local_sin = self.rotary_local(position_ids, dtype) if "sliding_attention" in kinds else (None, None)
        return cos, sin, local_cos, local_sin, mask, mask.windowed(self.cfg.sliding_window)

    # ------------------------------------------------------------------------- declarations
    # What the rest of the library reads about Gemma 3 (docs/adding-a-model.md); checkpoint_table is the sandwich
    # decoder's.
    config_class = Gemma3Config
    architectures = ("Gemma3ForCausalLM", "gemma3_text", "Gemma3ForConditionalGeneration", "gemma3")
    family = "gemma3"
    title = "Gemma 3"

    @property
    def checkpoint_renames(self) -> tuple[tuple[str, str], ...]:
        """The table; a multimodal checkpoint's text weights sit under `language_model.model.` (as transformers
        5.24 saves them) or `model.language_model.` (depending on the version that saved it) instead of `model.`."""
        renames = super().checkpoint_renames
        if not self.cfg.multimodal_checkpoint:
            return renames
        prefix = r"(?:language_model\.model|model\.language_model)\."
        return tuple(
            (prefix + pattern.removeprefix(r"model\."), target)
            if pattern.startswith(r"model\.")
            else (r"(?:language_model\.)?" + pattern, target)
            for pattern, target in renames
        )

    @property
    def checkpoint_ignored(self) -> tuple[str, ...]:
        """A tied lm_head; a multimodal checkpoint's vision tower and projector (TransformerLens skips them too)."""
        if not self.cfg.multimodal_checkpoint:
            return super().checkpoint_ignored
        head = (r"(?:language_model\.)?lm_head\.weight",) if self.cfg.tie_word_embeddings else ()
        return head + (r"(?:model\.)?(?:vision_tower|multi_modal_projector)\..+",)

    # TransformerLens 3.9's official names (supported_models.py) of Gemma 3 checkpoints -> its aliases
    # (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        **{
            f"google/gemma-3-{name}": (f"gemma-3-{name}",)
            for name in ("270m", "270m-it", "1b-pt", "1b-it", "4b-pt", "4b-it", "12b-pt", "12b-it", "27b-pt", "27b-it")
        },
        **{f"google/medgemma-{name}": (f"medgemma-{name}",) for name in ("4b-pt", "4b-it", "27b-it", "27b-text-it")},
    }
    random_sizes = dict(
        SandwichDecoder.random_sizes,
        sliding_window_pattern=2,
        rope_scaling=LinearScaling(8.0),
        final_logit_softcapping=3.0,
    )

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        """The sandwich decoder's draws without an attention cap, plus the local base, a linear scaling and a layer
        pattern."""
        sizes = super().draw_sizes(draw, st, n_layers, n_heads)
        sizes.update(
            attn_logit_softcapping=None,
            rope_local_theta=draw(st.sampled_from([100.0, 10_000.0])),
            rope_scaling=draw(st.sampled_from([None, LinearScaling(8.0)])),
            sliding_window_pattern=draw(st.sampled_from([1, 2, 6])),
        )
        return sizes

    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md: the sandwich decoder's, and
        **SandwichDecoder.hook_docs,
        "blocks.{i}.attn.hook_q": "`q_proj(ln1 output)` split by head, before `q_norm` and RoPE",
        "blocks.{i}.attn.hook_k": "`k_proj(ln1 output)` split by kv head, before `k_norm` and RoPE",
        "blocks.{i}.attn.hook_rot_q": "q_normed after RoPE with the layer's table: base `rope_local_theta` on"
        " sliding_attention layers, `rope_theta` (and its linear scaling) on full_attention layers",
        "blocks.{i}.attn.hook_rot_k": "k_normed after RoPE with the layer's table",
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * query_pre_attn_scalar**-0.5` (no cap), kv heads"
        " repeated, set to the dtype's minimum on future keys and, on sliding_attention layers, on keys"
        " `sliding_window` or more columns back; listening switches the layer to the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the scores, computed in float32 and cast back (transformers' eager"
        " `attn_weights`)",
        "ln_final.hook_scale": "the final RMSNorm's scale; float32. With `final_logit_softcapping` the logits are"
        " `cap * tanh((ln_final @ W_U) / cap)`, and direct logit attribution (linear) attributes the pre-cap logits",
        "blocks.{i}.attn.q_norm.hook_scale": "each query head's Gemma RMSNorm scale `sqrt(mean(q^2) + eps)` over"
        " d_head; float32",
        "blocks.{i}.attn.q_norm.hook_normalized": "`q / scale` cast to the model dtype, before the gain"
        " `1 + q_norm.weight`",
        "blocks.{i}.attn.hook_q_normed": "`q_norm(q)`: each query head normalised over d_head with the gain"
        " `1 + weight`, before RoPE",
        "blocks.{i}.attn.k_norm.hook_scale": "each kv head's Gemma RMSNorm scale over d_head; float32",
        "blocks.{i}.attn.k_norm.hook_normalized": "`k / scale` cast to the model dtype, before the gain"
        " `1 + k_norm.weight`",
        "blocks.{i}.attn.hook_k_normed": "`k_norm(k)`, before RoPE",
    }
