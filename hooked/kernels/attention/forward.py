"""Forward kernel of the Triton causal GQA attention: ``out`` and the per-row logsumexp ``lse``.

Per batch b, query head h (kv head g = h // group), query position i, key position j::

    visible(i, j) = key_start[b] <= j <= i + (k_pos - q_pos)        # causal, bottom-right aligned
                    and j > i + (k_pos - q_pos) - window             # sliding window, if any
    s_ij   = sm_scale * q_i . k_j                                      # sm_scale = d_head ** -0.5
    s_ij   = softcap * tanh(s_ij / softcap)                            # logit softcap, if any
    lse_i  = log sum_{j visible} exp(s_ij)
    p_ij   = exp(s_ij - lse_i)
    out_i  = sum_j p_ij v_j                 (0 for a row that sees no key, with lse_i = -inf)

A program owns one (batch, kv head) and a block of packed rows (all query heads of the group, see
``common``) and streams key blocks with the online softmax: running max m, running sum l, base-2
exponentials with ``log2(e)`` folded into the scores (``common._scores``). The key loop visits only
the blocks some row sees (``common._key_blocks``: not the left padding, the future or what lies behind
the window), split into masked blocks (the left-padding boundary, the window's edge, the causal diagonal
and ragged tail) and blocks every row sees whole (no mask). ``lse`` is saved in natural log for the
backward.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hooked.kernels.attention.common import (
    _autotune,
    _configs,
    _dot,
    _key_blocks,
    _load,
    _packed_rows,
    _scores,
    _store,
    _visible,
)


@triton.jit
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    K_base,
    V_base,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    q_idx,
    offs_n,
    offs_d,
    d_valid,
    lo,
    hi,
    ks,
    k_pos,
    offset,
    window,
    qk_scale,
    cap_log2,
    MASKED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        n_valid = cols < k_pos
        k_blk = K_base + start_n.to(tl.int64) * stride_kn
        v_blk = V_base + start_n.to(tl.int64) * stride_vn
        kT = _load(
            k_blk + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
            n_valid[None, :],
            d_valid[:, None],
            MASKED,
            CHECK_D,
        )
        qk, _ = _scores(q, kT, qk_scale, cap_log2, SOFTCAP, PRECISION, UPCAST)
        if MASKED:
            visible = _visible(cols[None, :], q_idx[:, None], ks, k_pos, offset, window, HAS_WINDOW)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = m_new
        p = tl.math.exp2(qk - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load(
            v_blk + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            n_valid[:, None],
            d_valid[None, :],
            MASKED,
            CHECK_D,
        )
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET"])
def _attn_fwd_kernel(
    Q,
    K,
    V,
    Out,
    LSE,
    KeyStart,
    stride_qb,
    stride_qm,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_vd,
    stride_ob,
    stride_om,
    stride_oh,
    stride_od,
    n_kv_heads,
    q_pos,
    k_pos,
    M_total,
    window,
    qk_scale,
    cap_log2,
    M_BUCKET,
    N_BUCKET,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHECK_D: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_KEY_START: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
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
    q = _load(Q_base + q_rel[:, None] + offs_d[None, :] * stride_qd, m_valid[:, None], d_valid[None, :], True, CHECK_D)
    K_base = K + off_b * stride_kb + off_g * stride_kh
    V_base = V + off_b * stride_vb + off_g * stride_vh

    if HAS_KEY_START:
        ks = tl.maximum(tl.load(KeyStart + off_b), 0)
    else:
        ks = 0
    offset = k_pos - q_pos
    lo, a_end, b_end, hi = _key_blocks(start_m, M_total, ks, k_pos, q_pos, window, GROUP, HAS_WINDOW, BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # masked blocks (left-padding boundary, window edge), blocks every row sees whole, masked (diagonal, tail)
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        K_base,
        V_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        q_idx,
        offs_n,
        offs_d,
        d_valid,
        lo,
        a_end,
        ks,
        k_pos,
        offset,
        window,
        qk_scale,
        cap_log2,
        True,
        HAS_WINDOW,
        SOFTCAP,
        CHECK_D,
        PRECISION,
        UPCAST,
        BLOCK_N,
    )
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        K_base,
        V_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        q_idx,
        offs_n,
        offs_d,
        d_valid,
        a_end,
        b_end,
        ks,
        k_pos,
        offset,
        window,
        qk_scale,
        cap_log2,
        False,
        HAS_WINDOW,
        SOFTCAP,
        CHECK_D,
        PRECISION,
        UPCAST,
        BLOCK_N,
    )
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        K_base,
        V_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        q_idx,
        offs_n,
        offs_d,
        d_valid,
        b_end,
        hi,
        ks,
        k_pos,
        offset,
        window,
        qk_scale,
        cap_log2,
        True,
        HAS_WINDOW,
        SOFTCAP,
        CHECK_D,
        PRECISION,
        UPCAST,
        BLOCK_N,
    )

    empty = l_i == 0.0  # nothing visible (left-padded query): output exactly 0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + pid_bh.to(tl.int64) * M_total + start_m + offs_m, lse, mask=m_valid)

    o_idx, o_rel, o_first = _packed_rows(start_m, offs_m, GROUP, stride_om, stride_oh)
    O_base = Out + off_b * stride_ob + off_g * GROUP * stride_oh + o_first
    _store(
        O_base + o_rel[:, None] + offs_d[None, :] * stride_od,
        acc.to(Out.dtype.element_ty),
        m_valid[:, None],
        d_valid[None, :],
        CHECK_D,
    )


_FWD_CONFIGS = _configs(
    [
        (128, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 128, 8, 2),
        (128, 32, 4, 4),
        (64, 64, 4, 3),
        (64, 64, 4, 4),
        (64, 32, 4, 4),
        (64, 128, 4, 3),
        (32, 64, 4, 3),
        (16, 64, 4, 3),
        (16, 128, 4, 3),
        (64, 32, 4, 2),
        (32, 32, 4, 2),
        (16, 32, 4, 2),
    ]
)
_fwd_kernel = _autotune(_attn_fwd_kernel, _FWD_CONFIGS)
