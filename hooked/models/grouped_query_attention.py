"""Grouped-query attention with rotary positions, the attention of every rotary decoder in `hooked` but GPT-NeoX's:
Qwen3, Qwen3-MoE, Llama, Mistral, Mixtral, OLMo 2 (with its own q/k norms), Gemma 2 and Gemma 3.

Numerics follow Hugging Face transformers 5.24's attention of those models (`models/qwen3/modeling_qwen3.py`,
`models/llama/modeling_llama.py`, `models/gemma2/modeling_gemma2.py`, ...) operation for operation: q/k/v
projections (biases with `attention_bias`); optionally a per-head norm of q and k before RoPE (Qwen3's and
Gemma 3's `q_norm` / `k_norm`); half-split RoPE with the cos/sin the model passes in; scores scaled by
d_head ** -0.5 (or the family's scale), optionally capped, masked; grouped key/value heads; the softmax in
float32 (`hooked.layers.attend` picks SDPA, the Triton kernel or the eager order); o_proj. Weights keep the
checkpoint's leaf names (`q_proj`, `q_norm`, ...) and `nn.Linear` layout. The module also declares what the
rest of the library reads from an attention: TransformerLens' weight views, the tensor-parallel cut and the
projections weight processing folds (docs/adding-a-model.md).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hooked.factored import ov_circuit, qk_circuit
from hooked.hooks import HookPoint
from hooked.kv_cache import LayerKV
from hooked.layers import (
    AttentionMask,
    Projection,
    QueryKeyPath,
    RMSNorm,
    Split,
    attend,
    heads_output,
)
from hooked.models.config import ModelConfig
from hooked.rotary import apply_rotary, turn_leading


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention with RoPE: `n_heads` query heads read `n_kv_heads` key/value heads.

    `qk_norm`: the norm class q and k go through per head before RoPE (`RMSNorm` for Qwen3, Gemma's for Gemma 3),
    which adds `q_norm`, `k_norm`, `hook_q_normed` and `hook_k_normed`; None (Llama, Mistral, Gemma 2) has none.
    `scaling` multiplies the scores (default d_head ** -0.5; Gemma's query_pre_attn_scalar ** -0.5), and
    `softcap` caps them at `cap * tanh(scores / cap)` before the mask (Gemma 2's attn_logit_softcapping).
    A sliding window is the mask's (`AttentionMask.windowed`), so it needs nothing here. The config gives
    d_model, n_heads, n_kv_heads, d_head, attention_bias and rms_norm_eps (the q/k norms').
    """

    # What the projections' hook points hold, for docs/hooks-reference.md: without q/k norms (Llama, Mistral, Mixtral),
    # and with per-head RMSNorms (`qk_norm=RMSNorm`: Qwen3, Qwen3-MoE).
    hook_docs: ClassVar[dict[str, str]] = {
        "blocks.{i}.attn.hook_q": "`q_proj` output (its bias included) split by head, before RoPE",
        "blocks.{i}.attn.hook_k": "`k_proj` output split by kv head, before RoPE",
    }
    rms_qk_norm_hook_docs: ClassVar[dict[str, str]] = {
        "blocks.{i}.attn.hook_q": "`q_proj` output split by head, before `q_norm` and RoPE",
        "blocks.{i}.attn.hook_k": "`k_proj` output split by kv head, before `k_norm` and RoPE",
        "blocks.{i}.attn.q_norm.hook_scale": "the per-head RMSNorm's scale of q",
        "blocks.{i}.attn.q_norm.hook_normalized": "q divided by its per-head scale, before `q_norm`'s weight",
        "blocks.{i}.attn.hook_q_normed": "`q_norm(q)`: after the per-head RMSNorm and its weight, before RoPE",
        "blocks.{i}.attn.k_norm.hook_scale": "the per-head RMSNorm's scale of k",
        "blocks.{i}.attn.k_norm.hook_normalized": "k divided by its per-head scale, before `k_norm`'s weight",
        "blocks.{i}.attn.hook_k_normed": "`k_norm(k)`: after the per-head RMSNorm and its weight, before RoPE",
    }
    # The same scores and pattern under a sliding window on every layer (Mistral, Mixtral)
    sliding_window_hook_docs: ClassVar[dict[str, str]] = {
        "blocks.{i}.attn.hook_attn_scores": "`rot_q @ rot_k^T * d_head**-0.5`, kv heads repeated, set to the dtype's"
        " minimum on future keys and on keys `sliding_window` or more columns back; listening switches the layer to"
        " the eager attention path",
        "blocks.{i}.attn.hook_pattern": "softmax of the scores (float32, cast back): exactly zero outside the sliding"
        " window",
    }

    def __init__(
        self,
        cfg: ModelConfig,
        qk_norm: type[RMSNorm] | None = None,
        scaling: float | None = None,
        softcap: float | None = None,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        self.qk_norm = qk_norm is not None
        self.scaling = cfg.d_head**-0.5 if scaling is None else scaling
        self.softcap = softcap  # a tanh cap on the scaled scores: hooked.layers.attend
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=cfg.attention_bias)
        # Submodules with hooks are declared in forward order, so hook_names lists the forward order.
        self.hook_q = HookPoint("batch pos head_index d_head")  # q_proj output, before q_norm
        self.hook_k = HookPoint("batch pos kv_head_index d_head")  # k_proj output, before k_norm
        self.hook_v = HookPoint("batch pos kv_head_index d_head")
        if qk_norm is not None:
            self.q_norm = qk_norm(cfg.d_head, cfg.rms_norm_eps, axes="batch pos head_index")
            self.hook_q_normed = HookPoint("batch pos head_index d_head")  # after q_norm, before RoPE
            self.k_norm = qk_norm(cfg.d_head, cfg.rms_norm_eps, axes="batch pos kv_head_index")
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
                    x,
                    (self.q_proj, self.k_proj, self.v_proj),
                    (self.n_heads, self.n_kv_heads, self.n_kv_heads),
                    strict=True,
                )
            )
        else:
            batch, pos, _ = x.shape
            q = self.q_proj(x).view(batch, pos, self.n_heads, self.d_head)
            k = self.k_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)
            v = self.v_proj(x).view(batch, pos, self.n_kv_heads, self.d_head)
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
        return heads_output(self, z, self.o_proj)

    def normed_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """`q_norm(q)` and `k_norm(k)` through their hooks, q's first (a subclass whose norms span the heads
        overrides it to all-reduce both norms' statistics at once under tensor parallelism)."""
        return self.hook_q_normed(self.q_norm(q)), self.hook_k_normed(self.k_norm(k))

    def query_key_path(self) -> QueryKeyPath:
        """q_norm / k_norm when the family has them, then RoPE over whole heads with forward's (cos, sin)."""
        norms = (self.q_norm, self.k_norm) if self.qk_norm else (None, None)
        return QueryKeyPath(*norms, "hook_rot_q", "hook_rot_k", rotary_arguments=(1, 2), rotate=turn_leading)

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

    # For weight processing (hooked.processing): nn.Linear weights are [out, in], d_model the
    # last axis of a reader.
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
