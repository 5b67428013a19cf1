"""Shared pieces of the Triton attention kernels: the run mode, the small jit helpers, the tuning set-up.

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
        smallest = min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]))
        kept = [smallest]
    return kept


def _configs(entries):
    """Autotune configs from ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` entries.

    Configs that exceed shared memory for a given head_dim / dtype fail to compile and are skipped by
    the autotuner; the small 2-stage ones always fit (float32 with d_head 128 needs them). Configs with
    BLOCK_M / BLOCK_N larger than the problem are pruned by :func:`_prune` (decode: q_pos * group rows
    only)."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in entries
    ]


_TUNE_KEY = ["HEAD_DIM", "GROUP", "HAS_KEY_START", "M_BUCKET", "N_BUCKET"]


def _autotune(kernel, configs):
    """``kernel`` autotuned over ``configs`` on a CUDA GPU; ``kernel`` itself otherwise (launched with
    ``_FIXED_META``)."""
    if not _USE_AUTOTUNE:
        return kernel
    return triton.autotune(configs, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune})(kernel)


_FIXED_META: dict = (
    {} if _USE_AUTOTUNE
    else {"BLOCK_M": _INTERPRET_BLOCK_M, "BLOCK_N": _INTERPRET_BLOCK_N, "num_warps": 4, "num_stages": 1}
)
