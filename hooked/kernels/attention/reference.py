"""Plain-PyTorch reference for ``flash_attention`` (the specification the Triton kernel is tested against).

For batch b, query position i, query head h (kv head ``g = h // (n_heads // n_kv_heads)``)::

    s[j]    = sm_scale * <q[b, i, h], k[b, j, g]>            (sm_scale defaults to d_head ** -0.5)
    s[j]    = softcap * tanh(s[j] / softcap)                 (with a softcap: Gemma 2, before masking)
    visible = key_start[b] <= j <= i + (k_pos - q_pos)       (causal, aligned bottom-right; left padding)
              and j > i + (k_pos - q_pos) - window           (with a sliding window, in columns)
    lse     = log(sum_{j visible} exp(s[j]))                 (-inf when nothing is visible)
    z[b, i, h] = sum_{j visible} exp(s[j] - lse) * v[b, j, g]   (exactly 0 when nothing is visible)
    out[b, i, h * d_head + e] = z[b, i, h, e]

Everything is computed in float32 and the output is returned in the input dtype, with shape
``[batch, q_pos, n_heads * d_head]``. The function is differentiable with ordinary autograd.
"""

from __future__ import annotations

import torch

__all__ = ["attention_reference", "visible_mask"]


def visible_mask(
    batch: int,
    q_pos: int,
    k_pos: int,
    key_start: torch.Tensor | None,
    device: torch.device | str,
    window: int | None = None,
) -> torch.Tensor:
    """Boolean ``[batch, q_pos, k_pos]``: True where key j is visible to query i."""
    i = torch.arange(q_pos, device=device)[:, None]
    j = torch.arange(k_pos, device=device)[None, :]
    causal = j <= i + (k_pos - q_pos)
    if window is not None:
        causal = causal & (j > i + (k_pos - q_pos) - window)
    mask = causal.expand(batch, q_pos, k_pos)
    if key_start is not None:
        ks = key_start.to(device=device, dtype=torch.long).view(batch, 1, 1)
        mask = mask & (j[None] >= ks)
    return mask


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_start: torch.Tensor | None = None,
    sm_scale: float | None = None,
    softcap: float | None = None,
    window: int | None = None,
    return_lse: bool = False,
):
    """Causal (bottom-right aligned) GQA attention with optional left padding, logit softcap and sliding
    window, in float32.

    q: [batch, q_pos, n_heads, d_head]; k, v: [batch, k_pos, n_kv_heads, d_head].
    Returns ``out`` [batch, q_pos, n_heads * d_head] in q's dtype, and with ``return_lse=True``
    also the float32 logsumexp of the scaled scores, ``lse`` [batch, n_heads, q_pos]
    (-inf for rows that see no key).
    """
    batch, q_pos, n_heads, d_head = q.shape
    k_pos, n_kv_heads = k.shape[1], k.shape[2]
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    group = n_heads // n_kv_heads
    if sm_scale is None:
        sm_scale = d_head**-0.5

    qf = q.float().permute(0, 2, 1, 3)  # [b, H, q, d]
    kf = k.float().repeat_interleave(group, dim=2).permute(0, 2, 1, 3)  # [b, H, k, d]
    vf = v.float().repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * sm_scale  # [b, H, q, k]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    mask = visible_mask(batch, q_pos, k_pos, key_start, q.device, window)[:, None]  # [b, 1, q, k]
    scores = scores.masked_fill(~mask, float("-inf"))

    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    denom = e.sum(dim=-1, keepdim=True)
    empty = denom == 0
    probs = e / torch.where(empty, torch.ones_like(denom), denom)
    z = torch.matmul(probs, vf)  # [b, H, q, d]
    out = z.permute(0, 2, 1, 3).reshape(batch, q_pos, n_heads * d_head).to(q.dtype)
    if not return_lse:
        return out
    lse = (torch.log(denom) + row_max).squeeze(-1)  # log(0) = -inf for empty rows
    return out, lse
