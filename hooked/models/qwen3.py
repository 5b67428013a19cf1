"""Qwen3 (`Qwen3ForCausalLM`) with a hook point on every activation TransformerLens names.

Numerics follow Hugging Face transformers 5.24 `models/qwen3/modeling_qwen3.py` exactly: RMSNorm computed in float32 and cast back before the weight; q/k/v projections
(biases only with `attention_bias`); per-head RMSNorms `q_norm`/`k_norm` over d_head BEFORE RoPE;
half-split RoPE with cos/sin computed in float32 and cast to the activation dtype (plain or YaRN,
`hooked.rotary.rotary_frequencies`); grouped-query attention with the softmax in float32; a
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
from jaxtyping import Float
from torch import Tensor, nn

from hooked.factored import ov_circuit, qk_circuit
from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import (
    AttentionMask,
    GatedMLP,
    Projection,
    RMSNorm,
    Split,
    add_bias,
    attend,
    attention_input,
    mlp_input,
    writable,
)
from hooked.models.base import HookedTransformer
from hooked.models.config import ModelConfig
from hooked.rotary import RotaryEmbedding, YarnScaling, apply_rotary


class RotaryRMSNames:
    """TransformerLens' names for a config with RMSNorm (`rms_norm_eps`) and RoPE over whole heads (`d_head`,
    `rope_theta`, `max_position_embeddings`), mixed into Qwen3's, Llama's and OLMo 2's configs."""

    @property
    def rotary_dim(self) -> int:
        return self.d_head  # RoPE turns every pair of a head's dimensions

    @property
    def n_ctx(self) -> int:
        """Where `to_tokens(truncate=True)` cuts: the config's length (TransformerLens caps some at 2048)."""
        return self.max_position_embeddings

    @property
    def eps(self) -> float:
        return self.rms_norm_eps

    @property
    def rotary_base(self) -> float:
        return self.rope_theta


@dataclass
class Qwen3Config(RotaryRMSNames, ModelConfig):
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

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")

    transformer_lens_shape = (
        "normalization_type='RMS', positional_embedding_type='rotary', act_fn='silu', gated_mlp=True,"
        " use_qk_norm=True, final_rms=True"
    )

    @classmethod
    def from_transformer_lens(cls, tl: dict) -> tuple[Qwen3Config | None, list[str] | None]:
        fields, problems = rms_rotary_fields(tl, "Qwen3", qk_norm=True)
        return (None, problems) if fields is None else (Qwen3Config(**fields), [])

    @classmethod
    def from_hf(cls, config: dict) -> Qwen3Config:
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


def rms_rotary_fields(tl: dict, family: str, qk_norm: bool) -> tuple[dict | None, list[str] | None]:
    """TransformerLens' fields for an RMSNorm, rotary, SiLU-gated model (Qwen3 with per-head q/k norms, Llama
    without) as this module's config fields: (fields, []), (None, problems naming each field) when the shape is
    RMS + rotary but something differs, (None, None) for another shape (hooked.transformer_lens.config)."""
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
    """Grouped-query attention with RoPE; `qk_norm=False` drops the per-head norms (Llama, Mistral:
    hooked/models/llama.py), and with them q_norm, k_norm and hook_q_normed / hook_k_normed."""

    def __init__(self, cfg: RotaryRMSNames, qk_norm: bool = True):  # Qwen3's, Llama's, OLMo 2's or Gemma's config
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        self.qk_norm = qk_norm
        self.scaling = cfg.d_head**-0.5
        self.softcap = None  # a tanh cap on the scaled scores (Gemma's attn_logit_softcapping): hooked.layers.attend
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=cfg.attention_bias)
        # Submodules with hooks are declared in forward order, so hook_names lists the forward order.
        self.hook_q = HookPoint("batch pos head_index d_head")  # q_proj output, before q_norm
        self.hook_k = HookPoint("batch pos kv_head_index d_head")  # k_proj output, before k_norm
        self.hook_v = HookPoint("batch pos kv_head_index d_head")
        if qk_norm:
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
        self,
        x: Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor, Tensor],
        cos: Tensor,
        sin: Tensor,
        mask: AttentionMask,
        kv: LayerKV | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if isinstance(x, tuple):  # per-head inputs [batch pos (kv_)head_index d_model] (hooked.layers.attention_input)
            q, k, v = (
                self._project_per_head(inputs, linear, heads)
                for inputs, linear, heads in zip(
                    x, (self.q_proj, self.k_proj, self.v_proj), (self.n_heads, self.n_kv_heads, self.n_kv_heads)
                )
            )
        else:
            batch, pos, _ = x.shape
            q = self.q_proj(x).view(batch, pos, self.n_heads, self.d_head)
            k = self.k_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)
            v = self.v_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)
        batch, pos = q.shape[:2]
        q = self.hook_q(q)
        k = self.hook_k(k)
        v = self.hook_v(v)
        if self.qk_norm:
            q, k = self.normed_qk(q, k)
        # In q's dtype: cos/sin come in it (a no-op cast), except OLMo 2's, kept float32 as transformers' (olmo2.py).
        q = self.hook_rot_q(apply_rotary(q, cos, sin).to(q.dtype))
        k = self.hook_rot_k(apply_rotary(k, cos, sin).to(k.dtype))
        if kv is not None:  # a KV cache: keys and values of every column so far (this call's included)
            k, v = kv.append(k, v)
        z = attend(
            q,
            k,
            v,
            mask,
            self.scaling,
            self.hook_attn_scores,
            self.hook_pattern,
            softmax_in_float32=True,
            softcap=self.softcap,
        )
        z = self.hook_z(writable(z) if self.hook_z.listening else z)
        if self.hook_result.listening:  # per-head writes, summed: differs from o_proj by rounding only
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return add_bias(self.o_proj, result.sum(2))
        return self.o_proj(z.reshape(batch, pos, -1))  # a view (z is contiguous): editing z edits o_proj's input

    def normed_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """`q_norm(q)` and `k_norm(k)` through their hooks, q's first (a subclass whose norms span the heads
        overrides it to all-reduce both norms' statistics at once under tensor parallelism)."""
        return self.hook_q_normed(self.q_norm(q)), self.hook_k_normed(self.k_norm(k))

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

    tp_counts = {"n_heads": "heads", "n_kv_heads": "kv_heads"}

    def tp_plan(self) -> dict[str, Split]:
        """Tensor parallelism: each rank holds some query heads, the key/value heads they read, and o_proj's columns."""
        plan = {}
        for child, axis in (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads")):
            plan[f"{child}.weight"] = Split(axis, 0, self.d_head)
            if getattr(self, child).bias is not None:
                plan[f"{child}.bias"] = Split(axis, 0, self.d_head)
        plan["o_proj.weight"] = Split("heads", 1, self.d_head, reduce=True)
        return plan

    # For weight processing (hooked.transformer_lens.processing): nn.Linear weights are [out, in], d_model the last axis of a reader.
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

    mlp_stage = ("hook_mlp_in", "ln2", "mlp", "hook_mlp_out", "hook_resid_post")  # what mlp_half computes

    def __init__(self, cfg: RotaryRMSNames, mlp: nn.Module, attn: nn.Module | None = None):  # Qwen3, Llama or Mixtral
        super().__init__()
        self.hook_resid_pre = HookPoint("batch pos d_model")
        self.hook_q_input = HookPoint(
            "batch pos head_index d_model"
        )  # each head's copy of resid_pre (see attention_input)
        self.hook_k_input = HookPoint("batch pos kv_head_index d_model")
        self.hook_v_input = HookPoint("batch pos kv_head_index d_model")
        self.ln1 = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.attn = Qwen3Attention(cfg) if attn is None else attn  # given: Llama's, without qk-norm
        self.hook_attn_out = HookPoint("batch pos d_model")
        self.hook_resid_mid = HookPoint("batch pos d_model")
        self.hook_mlp_in = HookPoint("batch pos d_model")  # what the MLP half reads, before ln2
        self.ln2 = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = mlp
        self.hook_mlp_out = HookPoint("batch pos d_model")
        self.hook_resid_post = HookPoint("batch pos d_model")

    def forward(
        self, resid_pre: Tensor, cos: Tensor, sin: Tensor, mask: AttentionMask, kv: LayerKV | None = None
    ) -> Tensor:
        return self.mlp_half(self.attn_half(resid_pre, cos, sin, mask, kv=kv))

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


_CHECKPOINT_RENAMES = (
    (r"model\.embed_tokens\.weight", r"embed_tokens.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.ln1.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.ln2.weight"),
    (
        r"model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.(weight|bias)",
        r"blocks.\1.attn.\2.\3",
    ),
    (r"model\.layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"model\.norm\.weight", r"ln_final.weight"),
)


class Qwen3(HookedTransformer):
    """Qwen3 dense with TransformerLens hook names. Load with `hooked.load("Qwen/Qwen3-0.6B")`."""

    family = "qwen3"
    # TransformerLens 3.9's official names (supported_models.py) of Qwen3 checkpoints -> its aliases (hooked.transformer_lens.aliases)
    transformer_lens_names = {
        f"Qwen/Qwen3-{size}": (f"qwen3-{size.lower()}",) for size in ("0.6B", "0.6B-Base", "1.7B", "4B", "8B", "14B")
    }
    random_sizes = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, d_vocab=64)

    title = "Qwen3"
    hook_docs = {  # what each hook holds here, for docs/hooks-reference.md (shared meanings live there)
        "hook_embed": "token embeddings `embed_tokens[tokens]`, which are block 0's `hook_resid_pre` (no position embedding: RoPE acts on q and k)",
        "blocks.{i}.ln1.hook_scale": "the RMSNorm's scale `sqrt(mean(x^2) + eps)`, before attention; always float32",
        "blocks.{i}.ln1.hook_normalized": "`x / scale` cast to the model dtype, before the norm's weight",
        "blocks.{i}.attn.hook_q": "`q_proj` output split by head, before `q_norm` and RoPE",
        "blocks.{i}.attn.hook_k": "`k_proj` output split by kv head, before `k_norm` and RoPE",
        "blocks.{i}.attn.hook_v": "`v_proj` output split by kv head",
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * d_head**-0.5`, kv heads repeated (query head h reads kv head h // (n_heads / n_kv_heads)), masked entries set to the dtype's minimum; listening switches the layer to the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the scores, computed in float32 and cast back",
        "blocks.{i}.attn.hook_z": "per-head attention output; a view of `o_proj`'s input, so an in-place edit changes what the projection reads",
        "blocks.{i}.mlp.hook_pre": "the gate's pre-activation `gate_proj(x)`",
        "blocks.{i}.mlp.hook_post": "the neurons, `silu(pre) * pre_linear` = `down_proj`'s input",
        "blocks.{i}.attn.q_norm.hook_scale": "the per-head RMSNorm's scale of q",
        "blocks.{i}.attn.q_norm.hook_normalized": "q divided by its per-head scale, before `q_norm`'s weight",
        "blocks.{i}.attn.hook_q_normed": "`q_norm(q)`: after the per-head RMSNorm and its weight, before RoPE",
        "blocks.{i}.attn.k_norm.hook_scale": "the per-head RMSNorm's scale of k",
        "blocks.{i}.attn.k_norm.hook_normalized": "k divided by its per-head scale, before `k_norm`'s weight",
        "blocks.{i}.attn.hook_k_normed": "`k_norm(k)`: after the per-head RMSNorm and its weight, before RoPE",
    }

    @classmethod
    def draw_sizes(cls, draw, st, n_layers: int, n_heads: int) -> dict:
        return dict(
            d_model=draw(st.sampled_from([16, 24, 32, 48])),
            n_kv_heads=draw(st.sampled_from([k for k in range(1, n_heads + 1) if n_heads % k == 0])),
            d_head=draw(st.sampled_from([4, 8, 16])),  # even (half-split rotary), not d_model / n_heads
            d_mlp=draw(st.sampled_from([32, 48])),
            tie_word_embeddings=draw(st.booleans()),
            attention_bias=draw(st.booleans()),
        )

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

    checkpoint_table = _CHECKPOINT_RENAMES
