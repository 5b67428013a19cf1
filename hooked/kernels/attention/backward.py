"""Backward kernels of the Triton causal GQA attention: dq (and delta), then dk/dv.

With ``p`` recomputed from the forward's saved ``lse`` (notation as in ``forward``; with a softcap,
``t_ij = tanh(sm_scale * q_i . k_j / softcap)`` and the capped score is ``softcap * t_ij``)::

    delta_i = sum_e out_ie * dout_ie
    dv_j    = sum_i p_ij dout_i
    ds_ij   = p_ij (dout_i . v_j - delta_i)              (times 1 - t_ij ** 2 with a softcap)
    dq_i    = sm_scale * sum_j ds_ij k_j
    dk_j    = sm_scale * sum_i ds_ij q_i

The dq kernel owns a block of packed rows (like the forward), computes and stores ``delta`` for it and
loops over the key blocks its rows see (``common._key_blocks``). The dk/dv kernel owns a block of keys of
one (batch, kv head) and loops over the packed rows that see them (``common._row_blocks``: with a window,
O(window) rows) of every query head in its group itself, so there are no atomics and no repeat of k/v.
Both split their loop into masked blocks (left-padding boundary, window edge, causal diagonal, ragged
tails) and mask-free ones.
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
    _row_blocks,
    _scores,
    _store,
    _visible,
)


@triton.jit
def _bwd_dq_inner(
    dq,
    q,
    do,
    lse2,
    delta,
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
        vT = _load(
            v_blk + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd,
            n_valid[None, :],
            d_valid[:, None],
            MASKED,
            CHECK_D,
        )
        qk, t = _scores(q, kT, qk_scale, cap_log2, SOFTCAP, PRECISION, UPCAST)
        if MASKED:
            visible = _visible(cols[None, :], q_idx[:, None], ks, k_pos, offset, window, HAS_WINDOW)
            qk = tl.where(visible, qk, float("-inf"))
        p = tl.math.exp2(qk - lse2[:, None])
        dp = _dot(do, vT, PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += _dot(ds.to(kT.dtype), tl.trans(kT), PRECISION, UPCAST)
    return dq


@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET"])
def _attn_bwd_dq_kernel(
    Q,
    K,
    V,
    Out,
    DO,
    DQ,
    LSE,
    Delta,
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
    stride_dob,
    stride_dom,
    stride_doh,
    stride_dod,
    stride_dqb,
    stride_dqm,
    stride_dqh,
    stride_dqd,
    n_kv_heads,
    q_pos,
    k_pos,
    M_total,
    window,
    sm_scale,
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
    q = _load(
        Q + off_b * stride_qb + off_g * GROUP * stride_qh + q_first + q_rel[:, None] + offs_d[None, :] * stride_qd,
        m_valid[:, None],
        d_valid[None, :],
        True,
        CHECK_D,
    )
    _, o_rel, o_first = _packed_rows(start_m, offs_m, GROUP, stride_om, stride_oh)
    o = _load(
        Out + off_b * stride_ob + off_g * GROUP * stride_oh + o_first + o_rel[:, None] + offs_d[None, :] * stride_od,
        m_valid[:, None],
        d_valid[None, :],
        True,
        CHECK_D,
    )
    _, do_rel, do_first = _packed_rows(start_m, offs_m, GROUP, stride_dom, stride_doh)
    do = _load(
        DO
        + off_b * stride_dob
        + off_g * GROUP * stride_doh
        + do_first
        + do_rel[:, None]
        + offs_d[None, :] * stride_dod,
        m_valid[:, None],
        d_valid[None, :],
        True,
        CHECK_D,
    )

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
    lo, a_end, b_end, hi = _key_blocks(start_m, M_total, ks, k_pos, q_pos, window, GROUP, HAS_WINDOW, BLOCK_M, BLOCK_N)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _bwd_dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
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
    dq = _bwd_dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
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
    dq = _bwd_dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
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
    dq = dq * sm_scale

    _, dq_rel, dq_first = _packed_rows(start_m, offs_m, GROUP, stride_dqm, stride_dqh)
    _store(
        DQ
        + off_b * stride_dqb
        + off_g * GROUP * stride_dqh
        + dq_first
        + dq_rel[:, None]
        + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty),
        m_valid[:, None],
        d_valid[None, :],
        CHECK_D,
    )


@triton.jit
def _bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    Q_base,
    DO_base,
    LSE_row,
    Delta_row,
    stride_qm,
    stride_qh,
    stride_qd,
    stride_dom,
    stride_doh,
    stride_dod,
    cols,
    offs_m,
    offs_d,
    d_valid,
    lo,
    hi,
    ks,
    k_pos,
    M_total,
    offset,
    window,
    qk_scale,
    cap_log2,
    MASKED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_D: tl.constexpr,
    GROUP: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        r_valid = rows < M_total
        q_idx, q_rel, q_first = _packed_rows(start_m, offs_m, GROUP, stride_qm, stride_qh)
        _, do_rel, do_first = _packed_rows(start_m, offs_m, GROUP, stride_dom, stride_doh)
        qT = _load(
            Q_base + q_first + q_rel[None, :] + offs_d[:, None] * stride_qd,
            r_valid[None, :],
            d_valid[:, None],
            MASKED,
            CHECK_D,
        )
        do = _load(
            DO_base + do_first + do_rel[:, None] + offs_d[None, :] * stride_dod,
            r_valid[:, None],
            d_valid[None, :],
            MASKED,
            CHECK_D,
        )
        if MASKED:
            lse2 = tl.load(LSE_row + rows, mask=r_valid, other=0.0) * 1.4426950408889634
            delta = tl.load(Delta_row + rows, mask=r_valid, other=0.0)
        else:
            lse2 = tl.load(LSE_row + rows) * 1.4426950408889634
            delta = tl.load(Delta_row + rows)
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
        qkT, tT = _scores(k, qT, qk_scale, cap_log2, SOFTCAP, PRECISION, UPCAST)  # [BLOCK_N, BLOCK_M]
        if MASKED:
            visible = _visible(cols[:, None], q_idx[None, :], ks, k_pos, offset, window, HAS_WINDOW) & r_valid[None, :]
            qkT = tl.where(visible, qkT, float("-inf"))
        pT = tl.math.exp2(qkT - lse2[None, :])
        dv += _dot(pT.to(do.dtype), do, PRECISION, UPCAST)
        dpT = _dot(v, tl.trans(do), PRECISION, UPCAST)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        dk += _dot(dsT.to(qT.dtype), tl.trans(qT), PRECISION, UPCAST)
    return dk, dv


@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET"])
def _attn_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    DK,
    DV,
    LSE,
    Delta,
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
    stride_dob,
    stride_dom,
    stride_doh,
    stride_dod,
    stride_dkb,
    stride_dkn,
    stride_dkh,
    stride_dkd,
    stride_dvb,
    stride_dvn,
    stride_dvh,
    stride_dvd,
    n_kv_heads,
    q_pos,
    k_pos,
    M_total,
    window,
    sm_scale,
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
    k = _load(
        K
        + off_b * stride_kb
        + off_g * stride_kh
        + k_first * stride_kn
        + offs_n[:, None] * stride_kn
        + offs_d[None, :] * stride_kd,
        n_valid[:, None],
        d_valid[None, :],
        True,
        CHECK_D,
    )
    v = _load(
        V
        + off_b * stride_vb
        + off_g * stride_vh
        + k_first * stride_vn
        + offs_n[:, None] * stride_vn
        + offs_d[None, :] * stride_vd,
        n_valid[:, None],
        d_valid[None, :],
        True,
        CHECK_D,
    )

    if HAS_KEY_START:
        ks = tl.maximum(tl.load(KeyStart + off_b), 0)
    else:
        ks = 0
    offset = k_pos - q_pos
    lo, a_end, b_end, end = _row_blocks(start_n, M_total, ks, k_pos, q_pos, window, GROUP, HAS_WINDOW, BLOCK_M, BLOCK_N)

    Q_base = Q + off_b * stride_qb + off_g * GROUP * stride_qh
    DO_base = DO + off_b * stride_dob + off_g * GROUP * stride_doh
    LSE_row = LSE + pid_bh.to(tl.int64) * M_total
    Delta_row = Delta + pid_bh.to(tl.int64) * M_total

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # (1) rows on the causal diagonal or the window's edge (masked), (2) rows seeing the whole block (no
    # mask), (3) the window's far edge and the ragged tail (masked).
    dk, dv = _bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        Q_base,
        DO_base,
        LSE_row,
        Delta_row,
        stride_qm,
        stride_qh,
        stride_qd,
        stride_dom,
        stride_doh,
        stride_dod,
        cols,
        offs_m,
        offs_d,
        d_valid,
        lo,
        a_end,
        ks,
        k_pos,
        M_total,
        offset,
        window,
        qk_scale,
        cap_log2,
        True,
        HAS_WINDOW,
        SOFTCAP,
        CHECK_D,
        GROUP,
        PRECISION,
        UPCAST,
        BLOCK_M,
    )
    dk, dv = _bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        Q_base,
        DO_base,
        LSE_row,
        Delta_row,
        stride_qm,
        stride_qh,
        stride_qd,
        stride_dom,
        stride_doh,
        stride_dod,
        cols,
        offs_m,
        offs_d,
        d_valid,
        a_end,
        b_end,
        ks,
        k_pos,
        M_total,
        offset,
        window,
        qk_scale,
        cap_log2,
        False,
        HAS_WINDOW,
        SOFTCAP,
        CHECK_D,
        GROUP,
        PRECISION,
        UPCAST,
        BLOCK_M,
    )
    dk, dv = _bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        Q_base,
        DO_base,
        LSE_row,
        Delta_row,
        stride_qm,
        stride_qh,
        stride_qd,
        stride_dom,
        stride_doh,
        stride_dod,
        cols,
        offs_m,
        offs_d,
        d_valid,
        b_end,
        end,
        ks,
        k_pos,
        M_total,
        offset,
        window,
        qk_scale,
        cap_log2,
        True,
        HAS_WINDOW,
        SOFTCAP,
        CHECK_D,
        GROUP,
        PRECISION,
        UPCAST,
        BLOCK_M,
    )
    dk = dk * sm_scale

    _store(
        DK
        + off_b * stride_dkb
        + off_g * stride_dkh
        + k_first * stride_dkn
        + offs_n[:, None] * stride_dkn
        + offs_d[None, :] * stride_dkd,
        dk.to(DK.dtype.element_ty),
        n_valid[:, None],
        d_valid[None, :],
        CHECK_D,
    )
    _store(
        DV
        + off_b * stride_dvb
        + off_g * stride_dvh
        + k_first * stride_dvn
        + offs_n[:, None] * stride_dvn
        + offs_d[None, :] * stride_dvd,
        dv.to(DV.dtype.element_ty),
        n_valid[:, None],
        d_valid[None, :],
        CHECK_D,
    )


_BWD_DQ_CONFIGS = _configs(
    [
        (64, 64, 4, 3),
        (128, 64, 8, 3),
        (64, 32, 4, 3),
        (128, 32, 4, 3),
        (32, 64, 4, 3),
        (16, 64, 4, 2),
        (32, 32, 4, 2),
        (16, 32, 4, 2),
    ]
)
_BWD_DKDV_CONFIGS = _configs(
    [
        (32, 64, 4, 3),
        (64, 64, 4, 3),
        (64, 128, 8, 3),
        (32, 128, 4, 3),
        (16, 64, 4, 3),
        (64, 64, 8, 2),
        (32, 128, 8, 2),
        (32, 32, 4, 2),
        (16, 32, 4, 2),
    ]
)
_bwd_dq_kernel = _autotune(_attn_bwd_dq_kernel, _BWD_DQ_CONFIGS)
_bwd_dkdv_kernel = _autotune(_attn_bwd_dkdv_kernel, _BWD_DKDV_CONFIGS)
