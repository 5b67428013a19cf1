"""Triton FlashAttention-2 style causal GQA attention: launchers, autograd and ``flash_attention``.

``flash_attention(q, k, v, *, key_start=None, sm_scale=None, softcap=None, window=None)
-> out [b, q_pos, H * d]``::

    s_ij   = sm_scale * q_i . k_j, then softcap * tanh(s_ij / softcap) with a softcap (Gemma 2)
    out_i  = sum_{j visible} softmax_j(s_ij) v_j   (0 if none)
    visible: key_start[b] <= j <= i + k_pos - q_pos, and j > i + k_pos - q_pos - window with a window

The kernels live next to this file: ``forward`` (online softmax, saves ``lse``), ``backward``
(dq + delta, then dk/dv, with the gradient formulas) and ``common`` (run mode, jit helpers,
autotuning). This file checks inputs, allocates outputs, launches the kernels and wraps them in an
``autograd.Function``.

Inputs may have any strides (views into a fused qkv projection, a KV-cache buffer, ...). The
output is allocated once as ``[b, q, H * d]`` and written by the kernel through its strides, so
``out.view(b, q, H, d)`` is the per-head ``z`` sharing the same storage.

d_head: any size up to 256 (tiles are padded to a power of two >= 16 and masked when needed).
Dtypes: float32, float16, bfloat16, all accumulated in float32; float32 matmuls use "tf32x3" on
NVIDIA GPUs (float32-level accuracy on tensor cores), exact "ieee" under the interpreter / ROCm.

Runs under ``TRITON_INTERPRET=1`` on CPU tensors (fixed small blocks; bf16/fp16 operands are upcast
to fp32 before ``tl.dot`` because the interpreter's low-precision dot is wrong), and autotunes only
when a CUDA GPU is present and the interpreter is off. The decision is made at import time, so set
``TRITON_INTERPRET=1`` before importing ``hooked`` if you want the interpreter.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
import triton
from torch.autograd.function import once_differentiable

# The raw ``_attn_*`` kernels are re-exported here: tests compile them ahead of time through this module.
from hooked.kernels.attention.backward import (
    _attn_bwd_dkdv_kernel,  # noqa: F401  (the tests read each kernel's launch settings here)
    _attn_bwd_dq_kernel,  # noqa: F401
    _bwd_dkdv_kernel,
    _bwd_dq_kernel,
)
from hooked.kernels.attention.common import (
    _FIXED_META,
    _FP32_DOT_PRECISION,
    _INTERPRET,
    _INTERPRET_BLOCK_M,
    _INTERPRET_BLOCK_N,
    _USE_AUTOTUNE,
    _pow2_bucket,
)
from hooked.kernels.attention.forward import _attn_fwd_kernel, _fwd_kernel  # noqa: F401  (_attn_fwd_kernel: as above)

__all__ = ["flash_attention"]

_LOG2E = math.log2(math.e)
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256

# Allocation hook: every buffer the kernels must fully overwrite (out, lse, dq, dk, dv, delta) is
# allocated through this, so tests can swap in a NaN-filled allocator to catch unwritten elements.
_empty = torch.empty


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_start: torch.Tensor | None,
    softcap: float | None = None,
    window: int | None = None,
):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"expected q [batch, q_pos, n_heads, d_head] and k, v [batch, k_pos, n_kv_heads, d_head]; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or d_head")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"n_heads={q.shape[2]} must be a multiple of n_kv_heads={k.shape[2]}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"q, k, v must share one dtype among {_SUPPORTED_DTYPES}; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[3] > _MAX_HEAD_DIM:
        raise ValueError(f"d_head={q.shape[3]} > {_MAX_HEAD_DIM} is not supported")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda" and not _INTERPRET:
        raise RuntimeError(
            "hooked.kernels.flash_attention needs CUDA tensors (a GPU) or the Triton interpreter: set "
            "TRITON_INTERPRET=1 in the environment before importing hooked to run it on CPU tensors"
        )
    if key_start is not None:
        if key_start.device != q.device:
            raise ValueError(f"key_start is on {key_start.device} but q is on {q.device}")
        if key_start.shape != (q.shape[0],) or key_start.dtype.is_floating_point or key_start.dtype == torch.bool:
            raise ValueError(
                f"key_start must be an integer tensor of shape [batch]={q.shape[0]}; "
                f"got {key_start.dtype} {tuple(key_start.shape)}"
            )
    if softcap is not None and not (
        isinstance(softcap, numbers.Real) and not isinstance(softcap, bool) and 0 < softcap < math.inf
    ):
        raise ValueError(
            f"softcap must be a positive finite number (Gemma 2's attn_logit_softcapping, e.g. 50.0)"
            f" or None for no cap; got {softcap!r}"
        )
    if window is not None and not (
        isinstance(window, numbers.Integral) and not isinstance(window, bool) and window >= 1
    ):
        raise ValueError(
            f"window must be a whole number of key columns >= 1 (a sliding window: query i sees key j"
            f" iff i - window < j <= i) or None for none; got {window!r}"
        )


def _on_device_of(t: torch.Tensor):
    """Launch on the inputs' GPU, not the current one (a model on cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _strides4(t: torch.Tensor):
    return tuple(t.stride())


def _flat_strides(t: torch.Tensor, d_head: int):
    """Strides of a [b, q, H*d] tensor seen as [b, q, H, d] (valid for any strides)."""
    sb, sm, se = t.stride()
    return sb, sm, d_head * se, se


def _common(
    q: torch.Tensor,
    k: torch.Tensor,
    key_start: torch.Tensor | None,
    sm_scale: float | None,
    softcap: float | None,
    window: int | None,
):
    batch, q_pos, n_heads, d_head = q.shape
    k_pos, n_kv_heads = k.shape[1], k.shape[2]
    group = n_heads // n_kv_heads
    if sm_scale is None:
        sm_scale = d_head**-0.5
    sm_scale = float(sm_scale)
    if softcap is None:  # the kernels' scores are base 2: qk_scale folds in log2(e) (see common._scores)
        qk_scale, cap_log2 = sm_scale * _LOG2E, 1.0
    else:
        qk_scale, cap_log2 = sm_scale / float(softcap), float(softcap) * _LOG2E
    # query i + k_pos - q_pos - j < k_pos for every visible key, so a window >= k_pos hides nothing
    has_window = window is not None and window < k_pos
    window = int(window) if has_window else 0
    block_d = max(16, triton.next_power_of_2(d_head))
    if key_start is not None:
        ks = key_start.to(device=q.device, dtype=torch.int32).contiguous()
    else:
        ks = None
    meta = dict(
        HEAD_DIM=d_head,
        BLOCK_D=block_d,
        CHECK_D=block_d != d_head,
        GROUP=group,
        HAS_KEY_START=ks is not None,
        HAS_WINDOW=has_window,
        SOFTCAP=softcap is not None,
        PRECISION=_FP32_DOT_PRECISION if q.dtype == torch.float32 else "tf32",  # ignored for 16-bit
        UPCAST=_INTERPRET,
        **_FIXED_META,
    )
    M_total = q_pos * group
    buckets = (min(_pow2_bucket(M_total), 1 << 14), min(_pow2_bucket(k_pos), 1 << 16))
    scalars = (window, sm_scale, qk_scale, cap_log2)
    return batch, q_pos, n_heads, d_head, k_pos, n_kv_heads, group, scalars, ks, meta, M_total, buckets


def _grid_rows(M_total: int, bh: int):
    if _USE_AUTOTUNE:
        return lambda meta: (triton.cdiv(M_total, meta["BLOCK_M"]), bh)
    return (triton.cdiv(M_total, _INTERPRET_BLOCK_M), bh)


def _grid_keys(k_pos: int, bh: int):
    if _USE_AUTOTUNE:
        return lambda meta: (triton.cdiv(k_pos, meta["BLOCK_N"]), bh)
    return (triton.cdiv(k_pos, _INTERPRET_BLOCK_N), bh)


def _flash_attention_forward(q, k, v, key_start=None, sm_scale=None, softcap=None, window=None):
    """Launch the forward kernel. Returns ``(out [b, q, H*d], lse [b, n_kv_heads, q_pos*group] fp32)``.

    ``lse`` is in the kernel's packed-row layout; see :func:`lse_per_head`."""
    _check(q, k, v, key_start, softcap, window)
    (batch, q_pos, n_heads, d_head, k_pos, n_kv_heads, group, scalars, ks, meta, M_total, buckets) = _common(
        q, k, key_start, sm_scale, softcap, window
    )
    window_arg, _, qk_scale, cap_log2 = scalars
    out = _empty((batch, q_pos, n_heads * d_head), dtype=q.dtype, device=q.device)
    lse = _empty((batch, n_kv_heads, M_total), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if k_pos == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    bh = batch * n_kv_heads
    _fwd_kernel[_grid_rows(M_total, bh)](
        q,
        k,
        v,
        out,
        lse,
        ks if ks is not None else q,
        *_strides4(q),
        *_strides4(k),
        *_strides4(v),
        *_flat_strides(out, d_head),
        n_kv_heads,
        q_pos,
        k_pos,
        M_total,
        window_arg,
        qk_scale,
        cap_log2,
        *buckets,
        **meta,
    )
    return out, lse


def _flash_attention_backward(dout, q, k, v, out, lse, key_start=None, sm_scale=None, softcap=None, window=None):
    """Launch the backward kernels; returns ``(dq, dk, dv)`` (contiguous, in the inputs' dtype)."""
    (batch, q_pos, n_heads, d_head, k_pos, n_kv_heads, group, scalars, ks, meta, M_total, buckets) = _common(
        q, k, key_start, sm_scale, softcap, window
    )
    dq = _empty(q.shape, dtype=q.dtype, device=q.device)
    dk = _empty(k.shape, dtype=k.dtype, device=k.device)
    dv = _empty(v.shape, dtype=v.dtype, device=v.device)
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = _empty((batch, n_kv_heads, M_total), dtype=torch.float32, device=q.device)
    bh = batch * n_kv_heads
    ks_arg = ks if ks is not None else q
    _bwd_dq_kernel[_grid_rows(M_total, bh)](
        q,
        k,
        v,
        out,
        dout,
        dq,
        lse,
        delta,
        ks_arg,
        *_strides4(q),
        *_strides4(k),
        *_strides4(v),
        *_flat_strides(out, d_head),
        *_flat_strides(dout, d_head),
        *_strides4(dq),
        n_kv_heads,
        q_pos,
        k_pos,
        M_total,
        *scalars,
        *buckets,
        **meta,
    )
    _bwd_dkdv_kernel[_grid_keys(k_pos, bh)](
        q,
        k,
        v,
        dout,
        dk,
        dv,
        lse,
        delta,
        ks_arg,
        *_strides4(q),
        *_strides4(k),
        *_strides4(v),
        *_flat_strides(dout, d_head),
        *_strides4(dk),
        *_strides4(dv),
        n_kv_heads,
        q_pos,
        k_pos,
        M_total,
        *scalars,
        *buckets,
        **meta,
    )
    return dq, dk, dv


def lse_per_head(lse: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Packed-row logsumexp [b, n_kv_heads, q_pos*group] -> [b, n_heads, q_pos] (natural log)."""
    batch, n_kv_heads, M_total = lse.shape
    group = n_heads // n_kv_heads
    q_pos = M_total // group
    return lse.view(batch, n_kv_heads, q_pos, group).permute(0, 1, 3, 2).reshape(batch, n_heads, q_pos)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_start, sm_scale, softcap, window):
        with _on_device_of(q):
            out, lse = _flash_attention_forward(q, k, v, key_start, sm_scale, softcap, window)
        ctx.save_for_backward(q, k, v, out, lse, key_start)
        ctx.sm_scale, ctx.softcap, ctx.window = sm_scale, softcap, window
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, key_start = ctx.saved_tensors
        with _on_device_of(q):
            dq, dk, dv = _flash_attention_backward(
                dout, q, k, v, out, lse, key_start, ctx.sm_scale, ctx.softcap, ctx.window
            )
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, *, key_start=None, sm_scale=None, softcap=None, window=None):
    """Causal (bottom-right aligned) GQA attention with optional left padding, logit softcap and sliding window.

    q: [batch, q_pos, n_heads, d_head]; k, v: [batch, k_pos, n_kv_heads, d_head], any strides.
    Query head h reads kv head ``h // (n_heads // n_kv_heads)``; key j is visible to query i iff
    ``key_start[b] <= j <= i + k_pos - q_pos`` and, with ``window`` (Mistral's ``sliding_window``, in
    columns), ``j > i + k_pos - q_pos - window``. Scores are ``sm_scale * q . k`` (default
    ``d_head ** -0.5``), then ``softcap * tanh(scores / softcap)`` with ``softcap`` (Gemma 2's
    ``attn_logit_softcapping``). Rows that see no key return exactly 0.
    Returns ``out`` [batch, q_pos, n_heads * d_head] (contiguous, written in place by the kernel);
    ``out.view(batch, q_pos, n_heads, d_head)`` is the per-head output z sharing its storage.
    Differentiable in q, k, v (Triton backward kernels; first order only).

        out = flash_attention(q, k, v, key_start=torch.tensor([0, 3]), softcap=50.0, window=4096)
    """
    if key_start is not None and not isinstance(key_start, torch.Tensor):
        key_start = torch.as_tensor(key_start, dtype=torch.int32, device=q.device)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FlashAttention.apply(q, k, v, key_start, sm_scale, softcap, window)
    with _on_device_of(q):
        return _flash_attention_forward(q, k, v, key_start, sm_scale, softcap, window)[0]
