"""Qwen3 (`Qwen3ForCausalLM`) with a hook point on every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/qwen3/modeling_qwen3.py` exactly: RMSNorm computed in float32 and cast back before the weight; q/k/v projections
(biases only with `attention_bias`); per-head RMSNorms `q_norm`/`k_norm` over d_head BEFORE RoPE;
half-split RoPE with cos/sin computed in float32 and cast to the activation dtype (plain or YaRN,
`hooked.layers.rotary_frequencies`); grouped-query attention with the softmax in float32; a
SiLU-gated MLP; tied or untied unembedding. Float32 logits are bit-identical to `Qwen3ForCausalLM`
(tests/test_qwen3_parity.py). `head_dim` comes from the config and may differ from d_model / n_heads.

Weights keep the checkpoint's leaf names (`q_proj`, `q_norm`, `gate_proj`, ...) and `nn.Linear`
layout, under a module tree named like the hooks. The attention and block classes serve
`qwen3_moe.py` too: a Qwen3 block takes its MLP as an argument. See docs/qwen3.md for what each hook
holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from hooked.factored import ov_circuit, qk_circuit
from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import (
    AttentionMask, GatedMLP, RMSNorm, RotaryEmbedding, YarnScaling, add_bias, apply_rotary, attend, attention_input,
    mlp_input, writable,
)
from hooked.models.base import HookedTransformer, ModelConfig
from hooked.processing import Projection


@dataclass
class Qwen3Config(ModelConfig):
    n_layers: int  # transformer blocks (num_hidden_layers)
    d_model: int  # residual stream width (hidden_size)
    n_heads: int  # query heads (num_attention_heads)
    n_kv_heads: int  # key/value heads (num_key_value_heads); n_heads / n_kv_heads queries share one
    d_head: int  # per-head width (head_dim), independent of d_model / n_heads
    d_mlp: int  # dense MLP width (intermediate_size)
    d_vocab: int  # vocabulary size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # RoPE base
    yarn: YarnScaling | None = None  # rope_type "yarn"; None: plain RoPE
    tie_word_embeddings: bool = False  # unembedding = the token embedding
    attention_bias: bool = False  # biases on q/k/v/o projections
    max_position_embeddings: int = 32768  # informative only: RoPE has no hard limit
    default_prepend_bos: bool = False  # Qwen3 has no BOS token; settable, read by to_tokens and the forward

    # TransformerLens' names for what the architecture fixes
    normalization_type = "RMS"
    positional_embedding_type = "rotary"
    act_fn = "silu"
    original_architecture = "Qwen3ForCausalLM"
    gated_mlp = True
    final_rms = True

    @property
    def rotary_dim(self) -> int:
        return self.d_head  # RoPE turns every pair of a head's dimensions

    @property
    def n_ctx(self) -> int:
        """Where `to_tokens(truncate=True)` cuts (TransformerLens caps Qwen3 at 2048; here the config's length)."""
        return self.max_position_embeddings

    @property
    def eps(self) -> float:
        return self.rms_norm_eps

    @property
    def rotary_base(self) -> float:
        return self.rope_theta

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")

    @classmethod
    def from_hf(cls, config: dict) -> "Qwen3Config":
        return cls(**cls._fields_from_hf(config))

    @classmethod
    def _fields_from_hf(cls, config: dict) -> dict:
        """The keyword arguments of this config, read from a Hugging Face config.json dict."""
        if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
            raise ValueError("Qwen3 with sliding-window attention is not supported by hooked")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3 activation {config['hidden_act']!r} is not supported (silu)")
        theta, yarn = _rope_from_hf(config)
        return dict(
            n_layers=config["num_hidden_layers"],
            d_model=config["hidden_size"],
            n_heads=config["num_attention_heads"],
            n_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            d_head=config.get("head_dim", 128),  # transformers' Qwen3Config default
            d_mlp=config["intermediate_size"],
            d_vocab=config["vocab_size"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            yarn=yarn,
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=config.get("attention_bias", False),
            max_position_embeddings=config.get("max_position_embeddings", 32768),
        )


def _rope_from_hf(config: dict) -> tuple[float, YarnScaling | None]:
    """RoPE base and scaling from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (hub)."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("Qwen3 with partial_rotary_factor != 1 is not supported by hooked")
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise ValueError(f"rope_type {rope_type!r} is not supported for Qwen3 (default, yarn)")
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


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        self.scaling = cfg.d_head**-0.5
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=cfg.attention_bias)
        # Submodules with hooks are declared in forward order, so hook_names lists the forward order.
        self.hook_q = HookPoint("batch pos head_index d_head")  # q_proj output, before q_norm
        self.hook_k = HookPoint("batch pos kv_head_index d_head")  # k_proj output, before k_norm
        self.hook_v = HookPoint("batch pos kv_head_index d_head")
        self.q_norm = RMSNorm(cfg.d_head, cfg.rms_norm_eps, axes="batch pos head_index")
        self.hook_q_normed = HookPoint("batch pos head_index d_head")  # after q_norm, before RoPE
        self.k_norm = RMSNorm(cfg.d_head, cfg.rms_norm_eps, axes="batch pos kv_head_index")
        self.hook_k_normed = HookPoint("batch pos kv_head_index d_head")  # after k_norm, before RoPE
        self.hook_rot_q = HookPoint("batch pos head_index d_head")  # after RoPE
        self.hook_rot_k = HookPoint("batch pos kv_head_index d_head")  # after RoPE
        self.hook_attn_scores = HookPoint("batch head_index query_pos key_pos")  # scaled, masked, pre-softmax
        self.hook_pattern = HookPoint("batch head_index query_pos key_pos")
        self.hook_z = HookPoint("batch pos head_index d_head")  # o_proj's input, split by head
        self.hook_result = HookPoint("batch pos head_index d_model")  # each head's write, before the bias

    def forward(
        self, x: Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor, Tensor], cos: Tensor, sin: Tensor,
        mask: AttentionMask, kv: LayerKV | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if isinstance(x, tuple):  # per-head inputs [batch pos (kv_)head_index d_model] (hooked.layers.attention_input)
            q, k, v = (self._project_per_head(inputs, linear, heads) for inputs, linear, heads in
                       zip(x, (self.q_proj, self.k_proj, self.v_proj), (self.n_heads, self.n_kv_heads, self.n_kv_heads)))
        else:
            batch, pos, _ = x.shape
            q = self.q_proj(x).view(batch, pos, self.n_heads, self.d_head)
            k = self.k_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)
            v = self.v_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)
        batch, pos = q.shape[:2]
        q = self.hook_q(q)
        k = self.hook_k(k)
        v = self.hook_v(v)
        q = self.hook_q_normed(self.q_norm(q))
        k = self.hook_k_normed(self.k_norm(k))
        q = self.hook_rot_q(apply_rotary(q, cos, sin))
        k = self.hook_rot_k(apply_rotary(k, cos, sin))
        if kv is not None:  # a KV cache: keys and values of every column so far (this call's included)
            k, v = kv.append(k, v)
        z = attend(q, k, v, mask, self.scaling, self.hook_attn_scores, self.hook_pattern, softmax_in_float32=True)
        z = self.hook_z(writable(z) if self.hook_z.listening else z)
        if self.hook_result.listening:  # per-head writes, summed: differs from o_proj by rounding only
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return add_bias(self.o_proj, result.sum(2))
        return self.o_proj(z.reshape(batch, pos, -1))  # a view (z is contiguous): editing z edits o_proj's input

    def _project_per_head(self, inputs: Tensor, linear: nn.Linear, heads: int) -> Tensor:
        """Head h's slice of `linear` applied to head h's own input [batch pos heads d_model]."""
        weight = linear.weight.view(heads, self.d_head, -1)
        out = torch.einsum("bphm,hdm->bphd", inputs, weight)
        return out if linear.bias is None else out + linear.bias.view(heads, self.d_head)

    @property
    def W_Q(self) -> Float[Tensor, "head_index d_model d_head"]:
        return self.q_proj.weight.view(self.n_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_K_grouped(self) -> Float[Tensor, "kv_head_index d_model d_head"]:
        """The key weights as stored, one per key/value head (a view)."""
        return self.k_proj.weight.view(self.n_kv_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_V_grouped(self) -> Float[Tensor, "kv_head_index d_model d_head"]:
        """The value weights as stored, one per key/value head (a view)."""
        return self.v_proj.weight.view(self.n_kv_heads, self.d_head, -1).transpose(1, 2)

    @property
    def b_K_grouped(self) -> Float[Tensor, "kv_head_index d_head"]:
        return self._bias(self.k_proj, self.n_kv_heads)

    @property
    def b_V_grouped(self) -> Float[Tensor, "kv_head_index d_head"]:
        return self._bias(self.v_proj, self.n_kv_heads)

    # TransformerLens' views index query heads: under grouped-query attention each key/value head is
    # repeated for the n_heads // n_kv_heads query heads that read it (a copy; a view when they are equal).
    @property
    def W_K(self) -> Float[Tensor, "head_index d_model d_head"]:
        """The keys query head h reads (key/value head h // (n_heads // n_kv_heads)), as TransformerLens."""
        return self._per_query_head(self.W_K_grouped)

    @property
    def W_V(self) -> Float[Tensor, "head_index d_model d_head"]:
        """The values query head h reads (key/value head h // (n_heads // n_kv_heads)), as TransformerLens."""
        return self._per_query_head(self.W_V_grouped)

    @property
    def W_O(self) -> Float[Tensor, "head_index d_head d_model"]:
        return self.o_proj.weight.T.reshape(self.n_heads, self.d_head, -1)

    @property
    def b_Q(self) -> Float[Tensor, "head_index d_head"]:
        """q_proj's bias per head (zeros without `attention_bias`, as TransformerLens)."""
        return self._bias(self.q_proj, self.n_heads)

    @property
    def b_K(self) -> Float[Tensor, "head_index d_head"]:
        return self._per_query_head(self.b_K_grouped)

    @property
    def b_V(self) -> Float[Tensor, "head_index d_head"]:
        return self._per_query_head(self.b_V_grouped)

    @property
    def b_O(self) -> Float[Tensor, " d_model"]:
        bias = self.o_proj.bias
        return bias if bias is not None else self.o_proj.weight.new_zeros(self.o_proj.weight.shape[0])

    OV = property(ov_circuit, doc="Each head's OV circuit W_V @ W_O: FactoredMatrix [head_index d_model d_model]")
    QK = property(qk_circuit, doc="Each head's QK circuit W_Q @ W_K^T: FactoredMatrix [head_index d_model d_model]")

    # For weight processing (hooked.processing): nn.Linear weights are [out, in], d_model the last axis of a reader.
    def residual_readers(self) -> tuple[Projection, ...]:
        return tuple(Projection(linear.weight, 1, linear.bias) for linear in (self.q_proj, self.k_proj, self.v_proj))

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.o_proj.weight, 0, self.o_proj.bias),)

    @property
    def value_bias(self) -> Tensor | None:  # [kv_head_index * d_head]
        """v_proj's bias as stored (None without `attention_bias`)."""
        return self.v_proj.bias

    def _per_query_head(self, grouped: Tensor) -> Tensor:
        group = self.n_heads // self.n_kv_heads
        return grouped if group == 1 else grouped.repeat_interleave(group, dim=0)

    def _bias(self, linear: nn.Linear, heads: int) -> Tensor:
        if linear.bias is None:
            return linear.weight.new_zeros(heads, self.d_head)
        return linear.bias.view(heads, self.d_head)


class Qwen3Block(nn.Module):
    """Pre-norm block; the MLP is given (dense `GatedMLP`, or Qwen3-MoE's sparse MLP)."""

    def __init__(self, cfg: Qwen3Config, mlp: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint("batch pos head_index d_model")  # each head's copy of resid_pre (see attention_input)
        self.hook_k_input = HookPoint("batch pos kv_head_index d_model")
        self.hook_v_input = HookPoint("batch pos kv_head_index d_model")
        self.ln1 = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.attn = Qwen3Attention(cfg)
        self.hook_attn_out = HookPoint("batch pos d_model")
        self.hook_resid_mid = HookPoint("batch pos d_model")
        self.hook_mlp_in = HookPoint("batch pos d_model")  # what the MLP half reads, before ln2
        self.ln2 = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = mlp
        self.hook_mlp_out = HookPoint("batch pos d_model")
        self.hook_resid_post = HookPoint("batch pos d_model")

    def forward(self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None) -> Tensor:
        return self.mlp_half(self.attn_half(resid_pre, cos, sin, mask, kv=kv))

    def attn_half(self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_in = attention_input(self, resid_pre, self.attn.n_heads, self.attn.n_kv_heads)
        attn_out = self.hook_attn_out(self.attn(attn_in, cos, sin, mask, kv))
        return self.hook_resid_mid(resid_pre + attn_out)

    def mlp_half(self, resid_mid: Tensor) -> Tensor:
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_input(self, resid_mid))))
        return self.hook_resid_post(resid_mid + mlp_out)


class Qwen3(HookedTransformer):
    """Qwen3 dense with TransformerLens hook names. Load with `hooked.load("Qwen/Qwen3-0.6B")`."""

    config_class = Qwen3Config
    architectures = ("Qwen3ForCausalLM", "qwen3")
    embedding_hook_names = ("hook_embed",)

    def __init__(self, cfg: Qwen3Config):
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint("batch pos d_model")
        self.rotary = RotaryEmbedding(cfg.d_head, cfg.rope_theta, cfg.yarn)
        self.blocks = nn.ModuleList(self.make_block(cfg, layer) for layer in range(cfg.n_layers))
        self.ln_final = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.setup_hooks()

    @staticmethod
    def make_block(cfg: Qwen3Config, layer: int) -> Qwen3Block:
        return Qwen3Block(cfg, GatedMLP(cfg.d_model, cfg.d_mlp))

    def resid_from_tokens(self, tokens: Tensor, position_ids: Tensor) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_embed(self.embed_tokens(tokens))

    def block_inputs(self, position_ids: Tensor, mask: AttentionMask, dtype: torch.dtype) -> tuple:
        cos, sin = self.rotary(position_ids, dtype)  # [batch pos d_head], once for all blocks
        return cos, sin, mask

    @property
    def unembed_weight(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight  # lm_head: untied or processed

    def embedding_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.embed_tokens.weight, 1),)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed_tokens.weight

    @property
    def checkpoint_renames(self) -> tuple[tuple[str, str], ...]:
        """Checkpoint key -> parameter name; lm_head only when untied."""
        head = () if self.cfg.tie_word_embeddings else ((r"lm_head\.weight", r"lm_head.weight"),)
        return _CHECKPOINT_RENAMES + head

    @property
    def checkpoint_ignored(self) -> tuple[str, ...]:
        # A tied checkpoint may still carry lm_head.weight (a copy of the embedding): not a parameter here.
        return (r"lm_head\.weight",) if self.cfg.tie_word_embeddings else ()

    checkpoint_stacked: tuple[tuple, ...] = ()  # see hooked.weights._read_slice; Qwen3-MoE fills it


_CHECKPOINT_RENAMES = (
    (r"model\.embed_tokens\.weight", r"embed_tokens.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.ln1.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.ln2.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"model\.layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"model\.norm\.weight", r"ln_final.weight"),
)
