"""FlashAttention-2 style causal GQA attention in Triton (forward + backward), writing ``[b, q, H*d]``.

Math (per batch b, query head h, kv head g = h // group, query position i, key position j)::

    visible(i, j) = key_start[b] <= j <= i + (k_pos - q_pos)        # causal, bottom-right aligned
    s_ij   = sm_scale * q_i . k_j                                      # sm_scale = d_head ** -0.5
    lse_i  = log sum_{j visible} exp(s_ij)
    p_ij   = exp(s_ij - lse_i)
    out_i  = sum_j p_ij v_j                 (0 for a row that sees no key)

The forward streams key blocks with the online softmax (running max m, running sum l, base-2
exponentials with ``sm_scale * log2(e)`` folded into the scores) and saves ``lse`` per row.
The backward recomputes ``p`` from ``lse``::

    delta_i = sum_e out_ie * dout_ie
    dv_j    = sum_i p_ij dout_i
    ds_ij   = p_ij (dout_i . v_j - delta_i)
    dq_i    = sm_scale * sum_j ds_ij k_j
    dk_j    = sm_scale * sum_i ds_ij q_i

GQA is handled by *packing*: a program owns one (batch, kv head) and a block of "packed rows"
``r = i * group + t`` (query position ``i = r // group``, query head ``g * group + t``), so all the
query heads that share a kv head are processed against a single read of K/V, and the dk/dv kernel
loops over every query head of its group itself (no atomics, no repeat of k/v).

Each kernel splits its key (or query) loop into blocks that need masking (left-padding boundary,
causal diagonal, ragged tails) and blocks that need none, so the common case runs mask-free.

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

import math
import os

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

__all__ = ["flash_attention"]

try:  # the same switch triton.jit consults when it decorates the kernels below
    _INTERPRET: bool = bool(triton.knobs.runtime.interpret)
except AttributeError:  # older Triton without knobs
    _INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
_USE_AUTOTUNE: bool = (not _INTERPRET) and torch.cuda.is_available()
_INTERPRET_BLOCK_M = 16
_INTERPRET_BLOCK_N = 16
_LOG2E = math.log2(math.e)
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# float32 inputs must not silently drop to TF32 (10-bit mantissa). On NVIDIA use "tf32x3" (three TF32
# tensor-core products, hi*hi + hi*lo + lo*hi: float32-level accuracy, and it compiles in seconds where
# the FMA-based "ieee" dot takes minutes per 64x64-block config); exact "ieee" in the interpreter and on ROCm.
_FP32_DOT_PRECISION = "ieee" if (_INTERPRET or torch.version.hip) else "tf32x3"
_MAX_HEAD_DIM = 256

# Allocation hook: every buffer the kernels must fully overwrite (out, lse, dq, dk, dv, delta) is
# allocated through this, so tests can swap in a NaN-filled allocator to catch unwritten elements.
_empty = torch.empty


# ----------------------------------------------------------------------------------------------
# small device helpers
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # The interpreter multiplies raw bf16 bit patterns in tl.dot, so upcast when interpreting.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _load(ptrs, mask_a, mask_b, CHECK_A: tl.constexpr, CHECK_B: tl.constexpr):
    # Masked only where needed: mask_a / mask_b broadcast against ptrs.
    if CHECK_A:
        if CHECK_B:
            x = tl.load(ptrs, mask=mask_a & mask_b, other=0.0)
        else:
            x = tl.load(ptrs, mask=mask_a, other=0.0)
    else:
        if CHECK_B:
            x = tl.load(ptrs, mask=mask_b, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _store(ptrs, x, mask_a, mask_b, CHECK_B: tl.constexpr):
    if CHECK_B:
        tl.store(ptrs, x, mask=mask_a & mask_b)
    else:
        tl.store(ptrs, x, mask=mask_a)


@triton.jit
def _packed_rows(start_m, offs_m, GROUP: tl.constexpr, stride_m, stride_h):
    """Packed row r = i * GROUP + t -> (query position i, relative element offset).

    Returns (i, rel_off, base_off) where the address of row r is ``base + base_off + rel_off`` and
    ``base_off`` is int64 (large positions times large strides cannot overflow int32)."""
    rows = start_m + offs_m
    q_idx = rows // GROUP
    first = start_m // GROUP
    rel = (q_idx - first) * stride_m + (rows % GROUP) * stride_h
    return q_idx, rel, first.to(tl.int64) * stride_m


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
    q_idx, offs_n, offs_d, d_valid, lo, hi, ks, k_pos, offset, qk_scale,
    MASKED: tl.constexpr, CHECK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        n_valid = cols < k_pos
        k_blk = K_base + start_n.to(tl.int64) * stride_kn
        v_blk = V_base + start_n.to(tl.int64) * stride_vn
        kT = _load(k_blk + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                   n_valid[None, :], d_valid[:, None], MASKED, CHECK_D)
        qk = _dot(q, kT, PRECISION, UPCAST) * qk_scale
        if MASKED:
            visible = (cols[None, :] <= q_idx[:, None] + offset) & (cols[None, :] >= ks) & n_valid[None, :]
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = m_new
        p = tl.math.exp2(qk - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load(v_blk + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                  n_valid[:, None], d_valid[None, :], MASKED, CHECK_D)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET"])
def _attn_fwd_kernel(
    Q, K, V, Out, LSE, KeyStart,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_om, stride_oh, stride_od,
    n_kv_heads, q_pos, k_pos, M_total, qk_scale,
    M_BUCKET, N_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_D: tl.constexpr, GROUP: tl.constexpr,
    HAS_KEY_START: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // n_kv_heads).to(tl.int64)
    off_g = (pid_bh % n_kv_heads).to(tl.int64)
    start_m = pid_m * BLOCK_M

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    m_valid = start_m + offs_m < M_total

    q_idx, q_rel, q_first = _packed_rows(start_m, offs_m, GROUP, stride_qm, stride_qh)
    Q_base = Q + off_b * stride_qb + off_g * GROUP * stride_qh + q_first
    q = _load(Q_base + q_rel[:, None] + offs_d[None, :] * stride_qd, m_valid[:, None], d_valid[None, :],
              True, CHECK_D)
    K_base = K + off_b * stride_kb + off_g * stride_kh
    V_base = V + off_b * stride_vb + off_g * stride_vh

    if HAS_KEY_START:
        ks = tl.maximum(tl.load(KeyStart + off_b), 0)
    else:
        ks = 0
    offset = k_pos - q_pos
    first_q = start_m // GROUP
    last_q = (tl.minimum(start_m + BLOCK_M, M_total) - 1) // GROUP
    hi = tl.maximum(tl.minimum(k_pos, last_q + offset + 1), 0)  # keys visible to some row: [ks, hi)
    full_hi = tl.maximum(tl.minimum(k_pos, first_q + offset + 1), 0)  # visible to every row: [ks, full_hi)
    lo = (ks // BLOCK_N) * BLOCK_N
    ks_ceil = tl.cdiv(ks, BLOCK_N) * BLOCK_N
    a_end = tl.minimum(ks_ceil, hi)
    b_end = tl.maximum(ks_ceil, (full_hi // BLOCK_N) * BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # (A) the block holding key_start (masked), (B) fully visible blocks (no mask), (C) diagonal/tail.
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
                               q_idx, offs_n, offs_d, d_valid, lo, a_end, ks, k_pos, offset, qk_scale,
                               True, CHECK_D, PRECISION, UPCAST, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
                               q_idx, offs_n, offs_d, d_valid, ks_ceil, b_end, ks, k_pos, offset, qk_scale,
                               False, CHECK_D, PRECISION, UPCAST, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
                               q_idx, offs_n, offs_d, d_valid, b_end, hi, ks, k_pos, offset, qk_scale,
                               True, CHECK_D, PRECISION, UPCAST, BLOCK_N)

    empty = l_i == 0.0  # nothing visible (left-padded query): output exactly 0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + pid_bh.to(tl.int64) * M_total + start_m + offs_m, lse, mask=m_valid)

    o_idx, o_rel, o_first = _packed_rows(start_m, offs_m, GROUP, stride_om, stride_oh)
    O_base = Out + off_b * stride_ob + off_g * GROUP * stride_oh + o_first
    _store(O_base + o_rel[:, None] + offs_d[None, :] * stride_od, acc.to(Out.dtype.element_ty),
           m_valid[:, None], d_valid[None, :], CHECK_D)


# ----------------------------------------------------------------------------------------------
# backward: dq (+ delta), then dk/dv
# ----------------------------------------------------------------------------------------------


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
    q_idx, offs_n, offs_d, d_valid, lo, hi, ks, k_pos, offset, qk_scale,
    MASKED: tl.constexpr, CHECK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        n_valid = cols < k_pos
        k_blk = K_base + start_n.to(tl.int64) * stride_kn
        v_blk = V_base + start_n.to(tl.int64) * stride_vn
        kT = _load(k_blk + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                   n_valid[None, :], d_valid[:, None], MASKED, CHECK_D)
        vT = _load(v_blk + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd,
                   n_valid[None, :], d_valid[:, None], MASKED, CHECK_D)
        qk = _dot(q, kT, PRECISION, UPCAST) * qk_scale
        if MASKED:
            visible = (cols[None, :] <= q_idx[:, None] + offset) & (cols[None, :] >= ks) & n_valid[None, :]
            qk = tl.where(visible, qk, float("-inf"))
        p = tl.math.exp2(qk - lse2[:, None])
        dp = _dot(do, vT, PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kT.dtype), tl.trans(kT), PRECISION, UPCAST)
    return dq


@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET"])
def _attn_bwd_dq_kernel(
    Q, K, V, Out, DO, DQ, LSE, Delta, KeyStart,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_om, stride_oh, stride_od,
    stride_dob, stride_dom, stride_doh, stride_dod,
    stride_dqb, stride_dqm, stride_dqh, stride_dqd,
    n_kv_heads, q_pos, k_pos, M_total, sm_scale, qk_scale,
    M_BUCKET, N_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_D: tl.constexpr, GROUP: tl.constexpr,
    HAS_KEY_START: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // n_kv_heads).to(tl.int64)
    off_g = (pid_bh % n_kv_heads).to(tl.int64)
    start_m = pid_m * BLOCK_M

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    m_valid = start_m + offs_m < M_total

    q_idx, q_rel, q_first = _packed_rows(start_m, offs_m, GROUP, stride_qm, stride_qh)
    q = _load(Q + off_b * stride_qb + off_g * GROUP * stride_qh + q_first + q_rel[:, None]
              + offs_d[None, :] * stride_qd, m_valid[:, None], d_valid[None, :], True, CHECK_D)
    _, o_rel, o_first = _packed_rows(start_m, offs_m, GROUP, stride_om, stride_oh)
    o = _load(Out + off_b * stride_ob + off_g * GROUP * stride_oh + o_first + o_rel[:, None]
              + offs_d[None, :] * stride_od, m_valid[:, None], d_valid[None, :], True, CHECK_D)
    _, do_rel, do_first = _packed_rows(start_m, offs_m, GROUP, stride_dom, stride_doh)
    do = _load(DO + off_b * stride_dob + off_g * GROUP * stride_doh + do_first + do_rel[:, None]
               + offs_d[None, :] * stride_dod, m_valid[:, None], d_valid[None, :], True, CHECK_D)

    # delta_i = out_i . dout_i, consumed here and by the dk/dv kernel
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_ptrs = pid_bh.to(tl.int64) * M_total + start_m + offs_m
    tl.store(Delta + row_ptrs, delta, mask=m_valid)
    lse2 = tl.load(LSE + row_ptrs, mask=m_valid, other=0.0) * 1.4426950408889634
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # empty rows: p = 0 everywhere

    K_base = K + off_b * stride_kb + off_g * stride_kh
    V_base = V + off_b * stride_vb + off_g * stride_vh
    if HAS_KEY_START:
        ks = tl.maximum(tl.load(KeyStart + off_b), 0)
    else:
        ks = 0
    offset = k_pos - q_pos
    first_q = start_m // GROUP
    last_q = (tl.minimum(start_m + BLOCK_M, M_total) - 1) // GROUP
    hi = tl.maximum(tl.minimum(k_pos, last_q + offset + 1), 0)
    full_hi = tl.maximum(tl.minimum(k_pos, first_q + offset + 1), 0)
    lo = (ks // BLOCK_N) * BLOCK_N
    ks_ceil = tl.cdiv(ks, BLOCK_N) * BLOCK_N
    a_end = tl.minimum(ks_ceil, hi)
    b_end = tl.maximum(ks_ceil, (full_hi // BLOCK_N) * BLOCK_N)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       q_idx, offs_n, offs_d, d_valid, lo, a_end, ks, k_pos, offset, qk_scale,
                       True, CHECK_D, PRECISION, UPCAST, BLOCK_N)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       q_idx, offs_n, offs_d, d_valid, ks_ceil, b_end, ks, k_pos, offset, qk_scale,
                       False, CHECK_D, PRECISION, UPCAST, BLOCK_N)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       q_idx, offs_n, offs_d, d_valid, b_end, hi, ks, k_pos, offset, qk_scale,
                       True, CHECK_D, PRECISION, UPCAST, BLOCK_N)
    dq = dq * sm_scale

    _, dq_rel, dq_first = _packed_rows(start_m, offs_m, GROUP, stride_dqm, stride_dqh)
    _store(DQ + off_b * stride_dqb + off_g * GROUP * stride_dqh + dq_first + dq_rel[:, None]
           + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty), m_valid[:, None], d_valid[None, :], CHECK_D)


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row,
    stride_qm, stride_qh, stride_qd, stride_dom, stride_doh, stride_dod,
    cols, n_valid, offs_m, offs_d, d_valid, lo, hi, ks, M_total, offset, qk_scale,
    MASKED: tl.constexpr, CHECK_D: tl.constexpr, GROUP: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
):
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        r_valid = rows < M_total
        q_idx, q_rel, q_first = _packed_rows(start_m, offs_m, GROUP, stride_qm, stride_qh)
        _, do_rel, do_first = _packed_rows(start_m, offs_m, GROUP, stride_dom, stride_doh)
        qT = _load(Q_base + q_first + q_rel[None, :] + offs_d[:, None] * stride_qd,
                   r_valid[None, :], d_valid[:, None], MASKED, CHECK_D)
        do = _load(DO_base + do_first + do_rel[:, None] + offs_d[None, :] * stride_dod,
                   r_valid[:, None], d_valid[None, :], MASKED, CHECK_D)
        if MASKED:
            lse2 = tl.load(LSE_row + rows, mask=r_valid, other=0.0) * 1.4426950408889634
            delta = tl.load(Delta_row + rows, mask=r_valid, other=0.0)
        else:
            lse2 = tl.load(LSE_row + rows) * 1.4426950408889634
            delta = tl.load(Delta_row + rows)
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
        qkT = _dot(k, qT, PRECISION, UPCAST) * qk_scale  # [BLOCK_N, BLOCK_M]
        if MASKED:
            visible = ((cols[:, None] <= q_idx[None, :] + offset) & (cols[:, None] >= ks)
                       & n_valid[:, None] & r_valid[None, :])
            qkT = tl.where(visible, qkT, float("-inf"))
        pT = tl.math.exp2(qkT - lse2[None, :])
        dv += _dot(pT.to(do.dtype), do, PRECISION, UPCAST)
        dpT = _dot(v, tl.trans(do), PRECISION, UPCAST)
        dsT = pT * (dpT - delta[None, :])
        dk += _dot(dsT.to(qT.dtype), tl.trans(qT), PRECISION, UPCAST)
    return dk, dv


@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET"])
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, Delta, KeyStart,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_dob, stride_dom, stride_doh, stride_dod,
    stride_dkb, stride_dkn, stride_dkh, stride_dkd,
    stride_dvb, stride_dvn, stride_dvh, stride_dvd,
    n_kv_heads, q_pos, k_pos, M_total, sm_scale, qk_scale,
    M_BUCKET, N_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_D: tl.constexpr, GROUP: tl.constexpr,
    HAS_KEY_START: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // n_kv_heads).to(tl.int64)
    off_g = (pid_bh % n_kv_heads).to(tl.int64)
    start_n = pid_n * BLOCK_N

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    cols = start_n + offs_n
    n_valid = cols < k_pos

    k_first = start_n.to(tl.int64)
    k = _load(K + off_b * stride_kb + off_g * stride_kh + k_first * stride_kn + offs_n[:, None] * stride_kn
              + offs_d[None, :] * stride_kd, n_valid[:, None], d_valid[None, :], True, CHECK_D)
    v = _load(V + off_b * stride_vb + off_g * stride_vh + k_first * stride_vn + offs_n[:, None] * stride_vn
              + offs_d[None, :] * stride_vd, n_valid[:, None], d_valid[None, :], True, CHECK_D)

    if HAS_KEY_START:
        ks = tl.maximum(tl.load(KeyStart + off_b), 0)
    else:
        ks = 0
    offset = k_pos - q_pos
    # packed row r (query i = r // GROUP) sees key j iff j <= i + offset, i.e. r >= (j - offset) * GROUP
    first_row = tl.maximum(start_n - offset, 0) * GROUP  # first row seeing the block's first key
    full_row = tl.maximum(start_n + BLOCK_N - 1 - offset, 0) * GROUP  # rows >= this see the whole block
    lo = (first_row // BLOCK_M) * BLOCK_M
    full_m = tl.cdiv(full_row, BLOCK_M) * BLOCK_M
    m_full_end = (M_total // BLOCK_M) * BLOCK_M
    m_end = tl.cdiv(M_total, BLOCK_M) * BLOCK_M
    keys_ok = (start_n >= ks) & (start_n + BLOCK_N <= k_pos)
    mid = tl.where(keys_ok, tl.minimum(full_m, m_full_end), m_full_end)
    mid = tl.maximum(mid, lo)
    tail = tl.maximum(lo, m_full_end)
    if start_n + BLOCK_N <= ks:  # the whole key block is left padding: dk = dv = 0
        lo = m_end
        mid = m_end
        tail = m_end

    Q_base = Q + off_b * stride_qb + off_g * GROUP * stride_qh
    DO_base = DO + off_b * stride_dob + off_g * GROUP * stride_doh
    LSE_row = LSE + pid_bh.to(tl.int64) * M_total
    Delta_row = Delta + pid_bh.to(tl.int64) * M_total

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # (1) rows on the causal diagonal (masked), (2) rows seeing the whole block (no mask), (3) ragged tail.
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row,
                             stride_qm, stride_qh, stride_qd, stride_dom, stride_doh, stride_dod,
                             cols, n_valid, offs_m, offs_d, d_valid, lo, mid, ks, M_total, offset, qk_scale,
                             True, CHECK_D, GROUP, PRECISION, UPCAST, BLOCK_M)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row,
                             stride_qm, stride_qh, stride_qd, stride_dom, stride_doh, stride_dod,
                             cols, n_valid, offs_m, offs_d, d_valid, mid, m_full_end, ks, M_total, offset,
                             qk_scale, False, CHECK_D, GROUP, PRECISION, UPCAST, BLOCK_M)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row,
                             stride_qm, stride_qh, stride_qd, stride_dom, stride_doh, stride_dod,
                             cols, n_valid, offs_m, offs_d, d_valid, tail, m_end, ks, M_total, offset, qk_scale,
                             True, CHECK_D, GROUP, PRECISION, UPCAST, BLOCK_M)
    dk = dk * sm_scale

    _store(DK + off_b * stride_dkb + off_g * stride_dkh + k_first * stride_dkn + offs_n[:, None] * stride_dkn
           + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), n_valid[:, None], d_valid[None, :], CHECK_D)
    _store(DV + off_b * stride_dvb + off_g * stride_dvh + k_first * stride_dvn + offs_n[:, None] * stride_dvn
           + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), n_valid[:, None], d_valid[None, :], CHECK_D)


# ----------------------------------------------------------------------------------------------
# configs: autotuned on a CUDA GPU, fixed small blocks under the interpreter
# ----------------------------------------------------------------------------------------------


def _pow2_bucket(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _prune(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    m_cap = max(16, _pow2_bucket(int(args["M_total"])))
    n_cap = max(16, _pow2_bucket(int(args["k_pos"])))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= m_cap and c.kwargs["BLOCK_N"] <= n_cap]
    if args["Q"].dtype == torch.float32:  # 4-byte tiles: only the small 2-stage configs fit / pay off
        kept = [c for c in kept if c.num_stages <= 2 and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 64]
    if not kept:
        smallest = min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]))
        kept = [smallest]
    return kept


def _configs(entries):
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in entries
    ]


# (BLOCK_M, BLOCK_N, num_warps, num_stages). Configs that exceed shared memory for a given head_dim /
# dtype fail to compile and are skipped by the autotuner; the small 2-stage ones always fit
# (float32 with d_head 128 needs them). Configs with BLOCK_M / BLOCK_N larger than the problem are
# pruned (decode: q_pos * group rows only).
_FWD_CONFIGS = _configs([
    (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 4, 4), (64, 64, 4, 3), (64, 64, 4, 4),
    (64, 32, 4, 4), (64, 128, 4, 3), (32, 64, 4, 3), (16, 64, 4, 3), (16, 128, 4, 3), (64, 32, 4, 2),
    (32, 32, 4, 2), (16, 32, 4, 2),
])
_BWD_DQ_CONFIGS = _configs([
    (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 4, 3), (32, 64, 4, 3), (16, 64, 4, 2),
    (32, 32, 4, 2), (16, 32, 4, 2),
])
_BWD_DKDV_CONFIGS = _configs([
    (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 4, 3), (16, 64, 4, 3), (64, 64, 8, 2),
    (32, 128, 8, 2), (32, 32, 4, 2), (16, 32, 4, 2),
])
_TUNE_KEY = ["HEAD_DIM", "GROUP", "HAS_KEY_START", "M_BUCKET", "N_BUCKET"]

if _USE_AUTOTUNE:
    _fwd_kernel = triton.autotune(_FWD_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune})(
        _attn_fwd_kernel)
    _bwd_dq_kernel = triton.autotune(_BWD_DQ_CONFIGS, key=_TUNE_KEY,
                                     prune_configs_by={"early_config_prune": _prune})(_attn_bwd_dq_kernel)
    _bwd_dkdv_kernel = triton.autotune(_BWD_DKDV_CONFIGS, key=_TUNE_KEY,
                                       prune_configs_by={"early_config_prune": _prune})(_attn_bwd_dkdv_kernel)
    _FIXED_META: dict = {}
else:
    _fwd_kernel = _attn_fwd_kernel
    _bwd_dq_kernel = _attn_bwd_dq_kernel
    _bwd_dkdv_kernel = _attn_bwd_dkdv_kernel
    _FIXED_META = {"BLOCK_M": _INTERPRET_BLOCK_M, "BLOCK_N": _INTERPRET_BLOCK_N, "num_warps": 4, "num_stages": 1}


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_start: torch.Tensor | None):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"expected q [batch, q_pos, n_heads, d_head] and k, v [batch, k_pos, n_kv_heads, d_head]; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
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
            "TRITON_INTERPRET=1 in the environment before importing hooked to run it on CPU tensors")
    if key_start is not None:
        if key_start.shape != (q.shape[0],) or key_start.dtype.is_floating_point or key_start.dtype == torch.bool:
            raise ValueError(f"key_start must be an integer tensor of shape [batch]={q.shape[0]}; "
                             f"got {key_start.dtype} {tuple(key_start.shape)}")


def _strides4(t: torch.Tensor):
    return tuple(t.stride())


def _flat_strides(t: torch.Tensor, d_head: int):
    """Strides of a [b, q, H*d] tensor seen as [b, q, H, d] (valid for any strides)."""
    sb, sm, se = t.stride()
    return sb, sm, d_head * se, se


def _common(q: torch.Tensor, k: torch.Tensor, key_start: torch.Tensor | None, sm_scale: float | None):
    batch, q_pos, n_heads, d_head = q.shape
    k_pos, n_kv_heads = k.shape[1], k.shape[2]
    group = n_heads // n_kv_heads
    if sm_scale is None:
        sm_scale = d_head**-0.5
    sm_scale = float(sm_scale)
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
        PRECISION=_FP32_DOT_PRECISION if q.dtype == torch.float32 else "tf32",  # ignored for 16-bit
        UPCAST=_INTERPRET,
        **_FIXED_META,
    )
    M_total = q_pos * group
    buckets = (min(_pow2_bucket(M_total), 1 << 14), min(_pow2_bucket(k_pos), 1 << 16))
    return batch, q_pos, n_heads, d_head, k_pos, n_kv_heads, group, sm_scale, ks, meta, M_total, buckets


def _grid_rows(M_total: int, bh: int):
    if _USE_AUTOTUNE:
        return lambda meta: (triton.cdiv(M_total, meta["BLOCK_M"]), bh)
    return (triton.cdiv(M_total, _INTERPRET_BLOCK_M), bh)


def _grid_keys(k_pos: int, bh: int):
    if _USE_AUTOTUNE:
        return lambda meta: (triton.cdiv(k_pos, meta["BLOCK_N"]), bh)
    return (triton.cdiv(k_pos, _INTERPRET_BLOCK_N), bh)


def _flash_attention_forward(q, k, v, key_start=None, sm_scale=None):
    """Launch the forward kernel. Returns ``(out [b, q, H*d], lse [b, n_kv_heads, q_pos*group] fp32)``.

    ``lse`` is in the kernel's packed-row layout; see :func:`lse_per_head`."""
    _check(q, k, v, key_start)
    (batch, q_pos, n_heads, d_head, k_pos, n_kv_heads, group, sm_scale, ks, meta, M_total,
     buckets) = _common(q, k, key_start, sm_scale)
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
        q, k, v, out, lse, ks if ks is not None else q,
        *_strides4(q), *_strides4(k), *_strides4(v), *_flat_strides(out, d_head),
        n_kv_heads, q_pos, k_pos, M_total, sm_scale * _LOG2E,
        *buckets,
        **meta,
    )
    return out, lse


def _flash_attention_backward(dout, q, k, v, out, lse, key_start=None, sm_scale=None):
    """Launch the backward kernels; returns ``(dq, dk, dv)`` (contiguous, in the inputs' dtype)."""
    (batch, q_pos, n_heads, d_head, k_pos, n_kv_heads, group, sm_scale, ks, meta, M_total,
     buckets) = _common(q, k, key_start, sm_scale)
    dq = _empty(q.shape, dtype=q.dtype, device=q.device)
    dk = _empty(k.shape, dtype=k.dtype, device=k.device)
    dv = _empty(v.shape, dtype=v.dtype, device=v.device)
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = _empty((batch, n_kv_heads, M_total), dtype=torch.float32, device=q.device)
    bh = batch * n_kv_heads
    ks_arg = ks if ks is not None else q
    _bwd_dq_kernel[_grid_rows(M_total, bh)](
        q, k, v, out, dout, dq, lse, delta, ks_arg,
        *_strides4(q), *_strides4(k), *_strides4(v), *_flat_strides(out, d_head),
        *_flat_strides(dout, d_head), *_strides4(dq),
        n_kv_heads, q_pos, k_pos, M_total, sm_scale, sm_scale * _LOG2E,
        *buckets,
        **meta,
    )
    _bwd_dkdv_kernel[_grid_keys(k_pos, bh)](
        q, k, v, dout, dk, dv, lse, delta, ks_arg,
        *_strides4(q), *_strides4(k), *_strides4(v), *_flat_strides(dout, d_head),
        *_strides4(dk), *_strides4(dv),
        n_kv_heads, q_pos, k_pos, M_total, sm_scale, sm_scale * _LOG2E,
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
    def forward(ctx, q, k, v, key_start, sm_scale):
        out, lse = _flash_attention_forward(q, k, v, key_start, sm_scale)
        ctx.save_for_backward(q, k, v, out, lse, key_start)
        ctx.sm_scale = sm_scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, key_start = ctx.saved_tensors
        dq, dk, dv = _flash_attention_backward(dout, q, k, v, out, lse, key_start, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, *, key_start=None, sm_scale=None):
    """Causal (bottom-right aligned) GQA attention with optional left padding.

    q: [batch, q_pos, n_heads, d_head]; k, v: [batch, k_pos, n_kv_heads, d_head], any strides.
    Query head h reads kv head ``h // (n_heads // n_kv_heads)``; key j is visible to query i iff
    ``key_start[b] <= j <= i + k_pos - q_pos``. Rows that see no key return exactly 0.
    Returns ``out`` [batch, q_pos, n_heads * d_head] (contiguous, written in place by the kernel);
    ``out.view(batch, q_pos, n_heads, d_head)`` is the per-head output z sharing its storage.
    Differentiable in q, k, v (Triton backward kernels; first order only).
    """
    if key_start is not None and not isinstance(key_start, torch.Tensor):
        key_start = torch.as_tensor(key_start, dtype=torch.int32, device=q.device)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FlashAttention.apply(q, k, v, key_start, sm_scale)
    return _flash_attention_forward(q, k, v, key_start, sm_scale)[0]
