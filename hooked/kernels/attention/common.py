"""Shared pieces of the Triton attention kernels: the run mode, the small jit helpers (scores with the
optional logit softcap, the key and row ranges a program visits under the causal mask, left padding and
sliding window), the tuning set-up.

Run mode, decided once at import time and imported by every other attention module:

* ``_INTERPRET``: ``TRITON_INTERPRET=1`` was set, so ``triton.jit`` yields interpreted kernels that run
  on CPU tensors; they use fixed ``_INTERPRET_BLOCK_M x _INTERPRET_BLOCK_N`` blocks and upcast
  bf16/fp16 operands to fp32 before ``tl.dot`` (the interpreter's low-precision dot is wrong).
* ``_USE_AUTOTUNE``: compiled kernels on a CUDA GPU; :func:`_autotune` wraps each kernel in
  ``triton.autotune`` over its config list, pruned by :func:`_prune`. Otherwise the kernels launch
  with ``_FIXED_META``.

GQA packing (see :func:`_packed_rows`): a program owns one (batch, kv head) and a block of packed rows
``r = i * group + t``, i.e. query position ``i = r // group`` of query head ``g * group + t``, so all
the query heads sharing kv head ``g`` are processed against one read of K/V.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

try:  # the switch triton.jit consults when it decorates the kernels (in forward and backward)
    _INTERPRET: bool = bool(triton.knobs.runtime.interpret)
except AttributeError:  # older Triton without knobs
    _INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
_USE_AUTOTUNE: bool = (not _INTERPRET) and torch.cuda.is_available()
_INTERPRET_BLOCK_M = 16
_INTERPRET_BLOCK_N = 16
# float32 inputs must not silently drop to TF32 (10-bit mantissa). On NVIDIA use "tf32x3" (three TF32
# tensor-core products, hi*hi + hi*lo + lo*hi: float32-level accuracy, and it compiles in seconds where
# the FMA-based "ieee" dot takes minutes per 64x64-block config); exact "ieee" in the interpreter and on ROCm.
_FP32_DOT_PRECISION = "ieee" if (_INTERPRET or torch.version.hip) else "tf32x3"


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
def _tanh(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        # The interpreter has no libdevice. tanh from exp, with the odd series below |x| = 1/4 where
        # 1 - exp(-2|x|) cancels: within 2e-7 relative of torch.tanh (next series term < 1e-8).
        a = tl.abs(x)
        e = tl.exp(-2.0 * a)
        a2 = a * a
        series = a * (
            1.0
            + a2
            * (
                -0.3333333333333333
                + a2 * (0.13333333333333333 + a2 * (-0.05396825396825397 + a2 * 0.021869488536155203))
            )
        )
        t = tl.where(a < 0.25, series, (1.0 - e) / (1.0 + e))
        return tl.where(x < 0, -t, t)
    else:
        return libdevice.tanh(x)


@triton.jit
def _scores(a, b, qk_scale, cap_log2, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Scores in base 2 (``log2(e)`` folded in) of the product ``a @ b``, and ``t`` for the backward.

    Without SOFTCAP: ``qk_scale = sm_scale * log2(e)``, returns ``(s, s)``. With it (Gemma 2's
    ``softcap * tanh(sm_scale * q.k / softcap)``): ``qk_scale = sm_scale / softcap``, ``cap_log2 =
    softcap * log2(e)``, returns ``(t * cap_log2, t)`` with ``t = tanh(sm_scale * q.k / softcap)``, whose
    derivative ``1 - t**2`` the backward multiplies into dS. UPCAST is set exactly when interpreting."""
    s = _dot(a, b, PRECISION, UPCAST) * qk_scale
    if SOFTCAP:
        t = _tanh(s, UPCAST)
        return t * cap_log2, t
    else:
        return s, s


@triton.jit
def _visible(cols, q_idx, ks, k_pos, offset, window, HAS_WINDOW: tl.constexpr):
    """[rows, keys] mask from column and row index vectors shaped to broadcast: key j is visible to query
    i iff ``ks <= j < k_pos`` and ``i + offset - window < j <= i + offset`` (no lower bound without
    HAS_WINDOW)."""
    visible = (cols <= q_idx + offset) & (cols >= ks) & (cols < k_pos)
    if HAS_WINDOW:
        visible = visible & (cols > q_idx + offset - window)
    return visible


@triton.jit
def _key_blocks(
    start_m,
    M_total,
    ks,
    k_pos,
    q_pos,
    window,
    GROUP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The key blocks a program owning packed rows ``[start_m, start_m + BLOCK_M)`` visits: ``(lo, a_end,
    b_end, hi)``, masked blocks in ``[lo, a_end)`` and ``[b_end, hi)``, blocks every row sees whole in
    ``[a_end, b_end)``. Keys no row sees (left padding, the future, behind the window) are skipped, so a
    windowed row block costs O(BLOCK_M / GROUP + window) keys, not O(k_pos)."""
    offset = k_pos - q_pos
    first_q = start_m // GROUP
    last_q = (tl.minimum(start_m + BLOCK_M, M_total) - 1) // GROUP
    hi = tl.maximum(tl.minimum(k_pos, last_q + offset + 1), 0)  # keys visible to some row: [first, hi)
    full_hi = tl.maximum(tl.minimum(k_pos, first_q + offset + 1), 0)  # visible to every row: [full_lo, full_hi)
    first = ks
    full_lo = ks
    if HAS_WINDOW:
        first = tl.maximum(first, first_q + offset - window + 1)
        full_lo = tl.maximum(full_lo, last_q + offset - window + 1)
    lo = (first // BLOCK_N) * BLOCK_N
    a_end = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, lo), hi)
    b_end = tl.maximum(a_end, (full_hi // BLOCK_N) * BLOCK_N)
    return lo, a_end, b_end, hi


@triton.jit
def _row_blocks(
    start_n,
    M_total,
    ks,
    k_pos,
    q_pos,
    window,
    GROUP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The packed-row blocks the dk/dv program owning keys ``[start_n, start_n + BLOCK_N)`` visits: ``(lo,
    a_end, b_end, end)``, masked in ``[lo, a_end)`` and ``[b_end, end)``, rows that see the whole key block
    (and lie below M_total) in ``[a_end, b_end)``. Query i sees key j iff ``j - window < i + offset <= j``
    (packed row ``r = i * GROUP + t``), so with a window only O((BLOCK_N + window) * GROUP) rows."""
    offset = k_pos - q_pos
    last_key = tl.minimum(start_n + BLOCK_N, k_pos) - 1
    first_row = tl.maximum(start_n - offset, 0) * GROUP  # the first row seeing the block's first key
    full_row = tl.maximum(start_n + BLOCK_N - 1 - offset, 0) * GROUP  # rows from here see its last key
    end_row = M_total  # rows seeing some key of the block end here
    full_end_row = M_total  # rows seeing the block's first key (through the window) end here
    if HAS_WINDOW:
        end_row = tl.minimum(tl.maximum(last_key - offset + window, 0) * GROUP, M_total)
        full_end_row = tl.minimum(tl.maximum(start_n - offset + window, 0) * GROUP, M_total)
    lo = (first_row // BLOCK_M) * BLOCK_M
    end = tl.maximum(tl.cdiv(end_row, BLOCK_M) * BLOCK_M, lo)
    keys_ok = (start_n >= ks) & (start_n + BLOCK_N <= k_pos)  # no padding key and no key past k_pos
    a_end = tl.where(keys_ok, tl.minimum(tl.maximum(tl.cdiv(full_row, BLOCK_M) * BLOCK_M, lo), end), end)
    b_end = tl.maximum(a_end, (full_end_row // BLOCK_M) * BLOCK_M)
    if start_n + BLOCK_N <= ks:  # the whole key block is left padding: dk = dv = 0
        lo = end
        a_end = end
        b_end = end
    return lo, a_end, b_end, end


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
        smallest = min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])
        kept = [smallest]
    return kept


def _configs(entries):
    """Autotune configs from ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` entries.

    Configs that exceed shared memory for a given head_dim / dtype fail to compile and are skipped by
    the autotuner; the small 2-stage ones always fit (float32 with d_head 128 needs them). Configs with
    BLOCK_M / BLOCK_N larger than the problem are pruned by :func:`_prune` (decode: q_pos * group rows
    only)."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in entries]


_TUNE_KEY = ["HEAD_DIM", "GROUP", "HAS_KEY_START", "HAS_WINDOW", "SOFTCAP", "M_BUCKET", "N_BUCKET"]


def _autotune(kernel, configs):
    """``kernel`` autotuned over ``configs`` on a CUDA GPU; ``kernel`` itself otherwise (launched with
    ``_FIXED_META``)."""
    if not _USE_AUTOTUNE:
        return kernel
    return triton.autotune(configs, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune})(kernel)


_FIXED_META: dict = (
    {}
    if _USE_AUTOTUNE
    else {"BLOCK_M": _INTERPRET_BLOCK_M, "BLOCK_N": _INTERPRET_BLOCK_N, "num_warps": 4, "num_stages": 1}
)
