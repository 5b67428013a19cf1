"""Layers shared by every architecture: norms with scale hooks and the attention core.

Each layer reproduces the Hugging Face operation order so that float32 results are bit-identical
(REFERENCE §2), and computes the costly hook points (scores, pattern) only when something listens:
the branch is visible in `attend`.

Axis vocabulary (used in every hook declaration, see docs/hooks.md): batch, pos, d_model,
head_index, kv_head_index, d_head, query_pos, key_pos, d_mlp, n_experts, top_k, d_vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hooked.hooks import HookPoint


class LayerNorm(nn.Module):
    """LayerNorm with TransformerLens' hooks: `hook_scale` [batch pos 1], `hook_normalized`.

    `hook_normalized` holds (x - mean) / scale, before the weight and bias are applied. Without
    listeners it runs `F.layer_norm` (bit-identical to Hugging Face); with listeners it computes
    the same quantity step by step so the hooks see, and may replace, the real intermediates.
    """

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint("batch pos 1")
        self.hook_normalized = HookPoint("batch pos d_model")

    def forward(self, x: Tensor) -> Tensor:
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks):
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        centered = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((centered.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        normalized = self.hook_normalized(centered / scale)
        return normalized * self.weight + self.bias

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        """What this norm does to `x` given the scale it used in the real forward (no weight)."""
        return (x - x.mean(-1, keepdim=True)) / scale


class RMSNorm(nn.Module):
    """RMSNorm as Qwen3: normalise in float32, cast back, then multiply by the weight.

    `hook_scale` holds sqrt(mean(x^2) + eps) in float32 ([batch pos 1]); `hook_normalized` the
    normalised input in the model dtype, before the weight.
    """

    def __init__(self, d: int, eps: float, axes: str = "batch pos"):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.hook_scale = HookPoint(f"{axes} 1")
        self.hook_normalized = HookPoint(f"{axes} {'d_model' if axes == 'batch pos' else 'd_head'}")

    def forward(self, x: Tensor) -> Tensor:
        input_dtype = x.dtype
        h = x.float()
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks):
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(input_dtype)
        scale = self.hook_scale((h.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        normalized = self.hook_normalized((h / scale).to(input_dtype))
        return self.weight * normalized

    def normalize_with_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        return x / scale


@dataclass(frozen=True)
class AttentionMask:
    """How keys are masked for one forward: causal always, plus optional left padding.

    `key_valid` [batch key_pos] is None when no row is padded, which lets SDPA use `is_causal`.
    """

    key_valid: Tensor | None
    query_len: int
    key_len: int

    def boolean(self, device: torch.device) -> Tensor | None:
        """[batch 1 query_pos key_pos], True where a query may attend (None: plain causal).

        Bottom-right aligned causal mask (key j visible to query i iff j <= i + key_len - query_len).
        A padded query row sees no valid key; it is allowed its own position so that it stays
        finite (its output is meaningless and is never read by a valid row).
        """
        if self.key_valid is None:
            return None
        offset = self.key_len - self.query_len
        query = torch.arange(self.query_len, device=device)[:, None]
        key = torch.arange(self.key_len, device=device)[None, :]
        mask = self.causal(device)[0] & self.key_valid[:, None, :]
        mask = mask | (key == query + offset)[None]
        return mask[:, None]

    def causal(self, device: torch.device) -> Tensor:
        """[1 1 query_pos key_pos] bottom-right aligned causal mask."""
        offset = self.key_len - self.query_len
        query = torch.arange(self.query_len, device=device)[:, None]
        key = torch.arange(self.key_len, device=device)[None, :]
        return (key <= query + offset)[None, None]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: AttentionMask,
    scaling: float,
    hook_attn_scores: HookPoint,
    hook_pattern: HookPoint,
    softmax_in_float32: bool,
) -> Tensor:
    """Causal attention for q [batch pos head_index d_head], k/v [batch pos kv_head_index d_head].

    Returns z [batch pos head_index d_head], contiguous, so `z.view(batch, pos, -1)` is the output
    projection's input with no copy. Runs torch SDPA unless the scores or the pattern are hooked,
    in which case it runs Hugging Face's eager order: scores -> hook_attn_scores -> softmax ->
    hook_pattern -> pattern @ v. `softmax_in_float32` follows the architecture (GPT-2: input dtype;
    Qwen3: float32, cast back).
    """
    n_heads, n_kv_heads = q.shape[2], k.shape[2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch head pos d_head]
    boolean_mask = mask.boolean(q.device)
    if hook_attn_scores.has_hooks or hook_pattern.has_hooks:
        if n_kv_heads != n_heads:  # query head h reads kv head h // group
            k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
            v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
        if boolean_mask is None:
            boolean_mask = mask.causal(q.device)
        scores = hook_attn_scores(scores.masked_fill(~boolean_mask, torch.finfo(scores.dtype).min))
        if softmax_in_float32:
            pattern = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            pattern = F.softmax(scores, dim=-1)
        pattern = hook_pattern(pattern)
        z = torch.matmul(pattern, v)
    else:
        z = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=boolean_mask,
            is_causal=boolean_mask is None and mask.query_len > 1,
            scale=scaling,
            enable_gqa=n_kv_heads != n_heads,
        )
    return z.transpose(1, 2).contiguous()  # a no-op when SDPA already wrote [batch pos head d_head]


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's tanh GELU in Hugging Face's exact operation order (F.gelu(approximate='tanh') differs)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
