"""Tests for ``hooked.kernels.flash_attention`` (Triton, run on CPU through the Triton interpreter).

The spec is ``attention_reference`` (float32 torch): for query i and key j of batch b,
``out_i = sum_{key_start[b] <= j <= i + k_pos - q_pos} softmax_j(sm_scale * q_i . k_j) v_j``,
0 when no key is visible; with a sliding window also ``j > i + k_pos - q_pos - window``, with a softcap
the scores are ``softcap * tanh(scores / softcap)``. Forward and dq/dk/dv are compared against it with
relative-to-max error bounds per dtype; every buffer the kernels must overwrite is pre-filled with NaN.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton / hooked.kernels are imported

import contextlib
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooked.kernels import flash_attention
from hooked.kernels.attention import triton_attention as ta
from hooked.kernels.attention.reference import attention_reference, visible_mask

DEVICE = "cpu" if ta._INTERPRET else "cuda"

pytestmark = pytest.mark.skipif(
    not ta._INTERPRET and not torch.cuda.is_available(),
    reason="needs TRITON_INTERPRET=1 (set before importing triton) or a CUDA GPU",
)

# max |kernel - reference| / max(max |reference|, 1), reference computed in float32 from the same
# (already rounded) inputs. The floor of 1 (inputs and dout are standard normal, so gradients are
# O(1)) keeps gradients that are ~0 by cancellation (e.g. dq with a single visible key) from
# turning rounding noise into a huge relative error. Measured worst cases over 160 random cases:
# fp32 3e-7 / 1.2e-6, fp16 4.6e-4 / 8.4e-4, bf16 8.1e-3 / 1.2e-2 (out / grads); bounds are ~4x that
# and above (bf16: 8-bit mantissa, and the interpreter truncates rather than rounds fp32 -> bf16).
FWD_TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}
GRAD_TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 5e-2}


@contextlib.contextmanager
def poisoned_allocations():
    """Make every kernel-owned buffer (out, lse, delta, dq, dk, dv) start out as NaN."""
    allocated = []

    def nan_empty(shape, *, dtype, device):
        t = torch.full(shape, float("nan"), dtype=dtype, device=device)
        allocated.append(t)
        return t

    saved = ta._empty
    ta._empty = nan_empty
    try:
        yield allocated
    finally:
        ta._empty = saved


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), "non-finite values (unwritten or NaN) in kernel output"
    scale = max(expected.abs().max().item(), 1.0)
    return (actual.float() - expected.float()).abs().max().item() / scale


def make_inputs(batch, q_pos, k_pos, n_heads, n_kv_heads, d_head, dtype, layout, gen):
    """Leaf tensors plus a function building (q, k, v) views of them in the given memory layout."""

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype).to(DEVICE)

    if layout == "contiguous":
        leaves = [
            randn(batch, q_pos, n_heads, d_head),
            randn(batch, k_pos, n_kv_heads, d_head),
            randn(batch, k_pos, n_kv_heads, d_head),
        ]

        def build(ls):
            return ls[0], ls[1], ls[2]
    elif layout == "fused":  # one qkv projection output [b, p, H + 2*Hkv, d]; q = last q_pos positions
        leaves = [randn(batch, k_pos, n_heads + 2 * n_kv_heads, d_head)]

        def build(ls):
            buf = ls[0]
            return (
                buf[:, k_pos - q_pos :, :n_heads],
                buf[:, :, n_heads : n_heads + n_kv_heads],
                buf[:, :, n_heads + n_kv_heads :],
            )
    elif layout == "heads_first":  # [b, H, p, d] storage seen as [b, p, H, d]
        leaves = [
            randn(batch, n_heads, q_pos, d_head),
            randn(batch, n_kv_heads, k_pos, d_head),
            randn(batch, n_kv_heads, k_pos, d_head),
        ]

        def build(ls):
            return ls[0].transpose(1, 2), ls[1].transpose(1, 2), ls[2].transpose(1, 2)
    elif layout == "cache":  # KV-cache buffer longer than k_pos; q with a non-unit last stride
        leaves = [randn(batch, q_pos, n_heads, 2 * d_head), randn(batch, k_pos + 5, 2, n_kv_heads, d_head)]

        def build(ls):
            return ls[0][..., ::2], ls[1][:, :k_pos, 0], ls[1][:, :k_pos, 1]
    else:
        raise ValueError(layout)
    return leaves, build


def run_case(
    batch,
    q_pos,
    k_pos,
    n_heads,
    n_kv_heads,
    d_head,
    dtype,
    layout,
    key_start,
    strided_grad,
    seed,
    softcap=None,
    window=None,
):
    """Kernel (with NaN-poisoned buffers) vs reference: forward and gradients. Returns the errors."""
    gen = torch.Generator().manual_seed(seed)
    leaves, build = make_inputs(batch, q_pos, k_pos, n_heads, n_kv_heads, d_head, dtype, layout, gen)
    ks = None if key_start is None else torch.tensor(key_start, dtype=torch.int64, device=DEVICE)
    grad = torch.randn(batch, q_pos, 2 * n_heads * d_head, generator=gen).to(dtype).to(DEVICE)
    grad = grad[..., ::2] if strided_grad else grad[..., : n_heads * d_head].contiguous()

    kern_leaves = [x.clone().requires_grad_() for x in leaves]
    with poisoned_allocations():
        q, k, v = build(kern_leaves)
        out = flash_attention(q, k, v, key_start=ks, softcap=softcap, window=window)
        out.backward(grad)

    ref_leaves = [x.detach().float().requires_grad_() for x in leaves]
    ref = attention_reference(*build(ref_leaves), key_start=ks, softcap=softcap, window=window)
    ref.backward(grad.float())

    assert out.dtype == dtype and out.shape == (batch, q_pos, n_heads * d_head)
    errs = {"out": rel_err(out, ref)}
    for i, (a, b) in enumerate(zip(kern_leaves, ref_leaves, strict=True)):
        errs[f"grad{i}"] = rel_err(a.grad, b.grad)
    assert errs["out"] <= FWD_TOL[dtype], errs
    for name, e in errs.items():
        if name != "out":
            assert e <= GRAD_TOL[dtype], errs

    # rows that see no key (left padding) are exactly zero, and so are their gradients and the dk/dv of
    # keys no row sees (padding, behind every window)
    vis = visible_mask(batch, q_pos, k_pos, ks, DEVICE, window)
    empty_rows = ~vis.any(-1)  # [b, q]
    dead_keys = ~vis.any(1)  # [b, k]
    assert (out.detach()[empty_rows] == 0).all()
    q_, k_, v_ = build([x.grad for x in kern_leaves])
    assert (q_[empty_rows] == 0).all()
    assert (k_[dead_keys] == 0).all() and (v_[dead_keys] == 0).all()
    return errs


@pytest.mark.parametrize(
    "d_head, dtype", [(64, torch.float32), (128, torch.float32), (64, torch.bfloat16), (128, torch.float16)]
)
def test_model_head_dims_64_and_128(d_head, dtype):
    """The head sizes of GPT-2 (64) and Qwen3 (128), forward and gradients, GQA and left padding."""
    run_case(
        batch=2,
        q_pos=19,
        k_pos=19,
        n_heads=4,
        n_kv_heads=2,
        d_head=d_head,
        dtype=dtype,
        layout="fused",
        key_start=[0, 5],
        strided_grad=False,
        seed=d_head,
    )


@st.composite
def attention_cases(draw):
    group = draw(st.sampled_from([1, 2, 4]))
    n_kv_heads = draw(st.integers(1, 4 // group))
    batch = draw(st.integers(1, 2))
    k_pos = draw(st.integers(1, 40))
    q_pos = draw(st.integers(1, k_pos))
    padded = draw(st.booleans())
    key_start = [draw(st.integers(0, k_pos)) for _ in range(batch)] if padded else None
    return dict(
        batch=batch,
        q_pos=q_pos,
        k_pos=k_pos,
        n_heads=n_kv_heads * group,
        n_kv_heads=n_kv_heads,
        d_head=draw(st.sampled_from([16, 32])),
        dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
        layout=draw(st.sampled_from(["contiguous", "fused", "heads_first", "cache"])),
        key_start=key_start,
        strided_grad=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        softcap=draw(st.sampled_from([None, None, 0.5, 2.0])),  # scores are O(1): a cap of 0.5 bites hard
        window=draw(st.one_of(st.none(), st.integers(1, 20))),
    )


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=attention_cases())
def test_matches_reference(case):
    run_case(**case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gqa_padded_fused_per_dtype(dtype):
    # every dtype sees GQA + left padding + odd lengths + a fused-qkv layout at least once
    run_case(
        batch=2,
        q_pos=29,
        k_pos=35,
        n_heads=4,
        n_kv_heads=1,
        d_head=32,
        dtype=dtype,
        layout="fused",
        key_start=[0, 19],
        strided_grad=True,
        seed=1,
    )  # batch 1: a whole 16-key block is padding


def test_non_power_of_two_head_dim():
    run_case(
        batch=1,
        q_pos=19,
        k_pos=23,
        n_heads=3,
        n_kv_heads=1,
        d_head=24,
        dtype=torch.float32,
        layout="heads_first",
        key_start=[4],
        strided_grad=False,
        seed=2,
    )


def test_padded_rows_are_exactly_zero():
    gen = torch.Generator().manual_seed(3)
    b, p, H, d = 2, 21, 2, 16
    q, k, v = (torch.randn(b, p, H, d, generator=gen).to(DEVICE) for _ in range(3))
    ks = torch.tensor([0, 13], device=DEVICE)
    with poisoned_allocations():
        out = flash_attention(q, k, v, key_start=ks)
    assert torch.isfinite(out).all()
    assert (out[1, :13] == 0).all()  # rows 0..12 of batch 1 see only padding keys
    assert (out[1, 13:].abs().sum(-1) > 0).all() and (out[0].abs().sum(-1) > 0).all()
    torch.testing.assert_close(out, attention_reference(q, k, v, key_start=ks), rtol=1e-5, atol=1e-5)
    # a sequence that is all padding gives all zeros
    with poisoned_allocations():
        out = flash_attention(q, k, v, key_start=torch.tensor([p, p], device=DEVICE))
    assert (out == 0).all()


def test_output_storage_is_one_flat_buffer():
    gen = torch.Generator().manual_seed(4)
    b, p, H, Hkv, d = 2, 17, 4, 2, 16
    qkv = torch.randn(b, p, H + 2 * Hkv, d, generator=gen).to(DEVICE)
    q, k, v = qkv[:, :, :H], qkv[:, :, H : H + Hkv], qkv[:, :, H + Hkv :]
    with poisoned_allocations() as allocated:
        out = flash_attention(q, k, v)
    assert out.shape == (b, p, H * d)
    assert out.is_contiguous()
    z = out.view(b, p, H, d)
    assert z.data_ptr() == out.data_ptr()
    # the kernel wrote straight into the single [b, p, H*d] buffer it allocated (no copy afterwards)
    flat = [t for t in allocated if t.shape == (b, p, H * d)]
    assert len(flat) == 1 and flat[0].data_ptr() == out.data_ptr()
    ref_z = attention_reference(q, k, v).view(b, p, H, d)
    torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=1e-5)
    # an output projection can consume out directly
    w = torch.randn(H * d, 8, generator=gen).to(DEVICE)
    torch.testing.assert_close(out @ w, ref_z.reshape(b, p, H * d) @ w, rtol=1e-4, atol=1e-4)


def test_grad_through_z_view():
    gen = torch.Generator().manual_seed(5)
    b, p, H, d = 1, 18, 2, 16
    leaves = [torch.randn(b, p, H, d, generator=gen).to(DEVICE).requires_grad_() for _ in range(3)]
    out = flash_attention(*leaves)
    z = out.view(b, p, H, d)
    (z[:, :, 1] ** 2).sum().backward()  # loss on one head of z
    ref_leaves = [x.detach().clone().requires_grad_() for x in leaves]
    ref_z = attention_reference(*ref_leaves).view(b, p, H, d)
    (ref_z[:, :, 1] ** 2).sum().backward()
    for a, r in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-5)
    assert (leaves[0].grad[:, :, 0] == 0).all()  # head 0 got no gradient


def test_expanded_and_list_inputs():
    # out.sum().backward() hands the kernel an expanded (all-zero-stride) gradient; key_start as a list
    gen = torch.Generator().manual_seed(9)
    leaves = [torch.randn(2, 13, 2, 16, generator=gen).to(DEVICE).requires_grad_() for _ in range(3)]
    with poisoned_allocations():
        flash_attention(*leaves, key_start=[2, 0]).sum().backward()
    ref_leaves = [x.detach().clone().requires_grad_() for x in leaves]
    attention_reference(*ref_leaves, key_start=torch.tensor([2, 0])).sum().backward()
    for a, r in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-5)


def test_decode_and_chunked_prefill_match_full_prefill():
    gen = torch.Generator().manual_seed(6)
    b, p, H, Hkv, d = 2, 33, 4, 2, 16
    q = torch.randn(b, p, H, d, generator=gen).to(DEVICE)
    k = torch.randn(b, p, Hkv, d, generator=gen).to(DEVICE)
    v = torch.randn(b, p, Hkv, d, generator=gen).to(DEVICE)
    ks = torch.tensor([0, 5], device=DEVICE)
    full = attention_reference(q, k, v, key_start=ks)
    with poisoned_allocations():
        full_kernel = flash_attention(q, k, v, key_start=ks)
        decode = flash_attention(q[:, -1:], k, v, key_start=ks)  # one-token decode: q_pos=1, k_pos=33
        chunk = flash_attention(q[:, 20:27], k[:, :27], v[:, :27], key_start=ks)  # chunked prefill
    torch.testing.assert_close(full_kernel, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decode, full[:, -1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunk, full[:, 20:27], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decode, attention_reference(q[:, -1:], k, v, key_start=ks), rtol=1e-5, atol=1e-5)


def test_decode_gradients():
    run_case(
        batch=2,
        q_pos=1,
        k_pos=37,
        n_heads=4,
        n_kv_heads=2,
        d_head=16,
        dtype=torch.float32,
        layout="cache",
        key_start=[3, 0],
        strided_grad=False,
        seed=7,
    )


def test_custom_sm_scale_and_lse():
    gen = torch.Generator().manual_seed(8)
    b, qp, kp, H, Hkv, d = 1, 9, 26, 4, 2, 32
    q = torch.randn(b, qp, H, d, generator=gen).to(DEVICE)
    k = torch.randn(b, kp, Hkv, d, generator=gen).to(DEVICE)
    v = torch.randn(b, kp, Hkv, d, generator=gen).to(DEVICE)
    out, lse = ta._flash_attention_forward(q, k, v, None, 0.3)
    ref, ref_lse = attention_reference(q, k, v, sm_scale=0.3, return_lse=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ta.lse_per_head(lse, H), ref_lse, rtol=1e-5, atol=1e-5)
    assert rel_err(flash_attention(q, k, v, sm_scale=0.3), ref) < 1e-5
    assert rel_err(flash_attention(q, k, v), ref) > 1e-2  # the scale matters


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_window_and_softcap_per_dtype(dtype):
    # the window's edge crosses 16-key tiles at different columns per row block; GQA, left padding, a
    # chunked-prefill offset (k_pos > q_pos) and a whole padded key tile (batch 1)
    run_case(
        batch=2,
        q_pos=33,
        k_pos=45,
        n_heads=4,
        n_kv_heads=2,
        d_head=32,
        dtype=dtype,
        layout="fused",
        key_start=[0, 19],
        strided_grad=True,
        seed=11,
        softcap=1.5,
        window=7,
    )


@pytest.mark.parametrize("window", [1, 16, 17, 40])
def test_window_sizes_around_the_tile(window):
    # 1: each row sees only its own key; 16 / 17: the window exactly a tile / one key more; 40 >= k_pos - 1
    # hides nothing on the first rows but bites on the last
    run_case(
        batch=1,
        q_pos=41,
        k_pos=41,
        n_heads=2,
        n_kv_heads=1,
        d_head=16,
        dtype=torch.float32,
        layout="contiguous",
        key_start=[2],
        strided_grad=False,
        seed=window,
        window=window,
    )


def test_window_one_returns_each_rows_own_value():
    """An explicit computation, not the reference: with window 1 query i sees key i + k_pos - q_pos only, so
    z = v there (0 where that key is padding), whatever q and k are."""
    gen = torch.Generator().manual_seed(12)
    b, qp, kp, H, Hkv, d = 2, 20, 26, 4, 2, 16
    q, k, v = (torch.randn(b, n, h, d, generator=gen).to(DEVICE) for n, h in ((qp, H), (kp, Hkv), (kp, Hkv)))
    out = flash_attention(q, k, v, key_start=torch.tensor([0, 9], device=DEVICE), window=1).view(b, qp, H, d)
    expected = v[:, kp - qp :].repeat_interleave(H // Hkv, dim=2).clone()
    expected[1, : 9 - (kp - qp)] = 0
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_window_not_shorter_than_the_keys_is_plain_causal():
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 19, 2, 16, generator=gen).to(DEVICE) for _ in range(3))
    plain = flash_attention(q, k, v)
    # Exact: a window no shorter than the keys masks nothing, so the kernel sums the same blocks in the same order
    assert torch.equal(flash_attention(q, k, v, window=19), plain)
    assert torch.equal(flash_attention(q, k, v, window=1000), plain)
    assert rel_err(flash_attention(q, k, v, window=18), plain) > 1e-3  # the last row loses key 0


def test_window_skips_key_tiles_outside_it():
    """The point of the window: tiles no query sees are never read. Keys 0..31 (two whole 16-key tiles)
    lie behind every query's window here, so NaN there cannot reach the output or dq; their dk/dv are
    exactly 0 (their dk/dv programs visit no query rows, or NaN would reach them too)."""
    gen = torch.Generator().manual_seed(14)
    b, qp, kp, H, Hkv, d, window = 1, 16, 64, 4, 2, 16, 4  # queries sit at columns 48..63: keys 45..63
    q = torch.randn(b, qp, H, d, generator=gen).to(DEVICE)
    k, v = (torch.randn(b, kp, Hkv, d, generator=gen).to(DEVICE) for _ in range(2))
    clean = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = attention_reference(*clean, window=window, softcap=2.0)
    grad = torch.randn(ref.shape, generator=gen).to(DEVICE)
    ref.backward(grad)
    k[:, :32] = float("nan")
    v[:, :32] = float("nan")
    poisoned = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash_attention(*poisoned, window=window, softcap=2.0)
    out.backward(grad)
    assert rel_err(out, ref) < 1e-5
    for kernel_leaf, ref_leaf in zip(poisoned, clean, strict=True):
        assert rel_err(kernel_leaf.grad, ref_leaf.grad) < 2e-5
    assert (poisoned[1].grad[:, :45] == 0).all() and (poisoned[2].grad[:, :45] == 0).all()


def test_softcap_bounds_the_scores_and_matches_the_reference():
    gen = torch.Generator().manual_seed(15)
    b, qp, kp, H, Hkv, d, cap = 2, 18, 18, 2, 1, 32, 3.0
    q = 4 * torch.randn(b, qp, H, d, generator=gen).to(DEVICE)  # scores of size ~4: the cap bites
    k, v = (torch.randn(b, kp, Hkv, d, generator=gen).to(DEVICE) for _ in range(2))
    ks = torch.tensor([0, 5], device=DEVICE)
    out, lse = ta._flash_attention_forward(q, k, v, ks, None, cap)
    ref, ref_lse = attention_reference(q, k, v, key_start=ks, softcap=cap, return_lse=True)
    assert rel_err(out, ref) < 1e-5
    torch.testing.assert_close(ta.lse_per_head(lse, H), ref_lse, rtol=1e-5, atol=1e-5)
    # every capped score is below cap, so lse <= cap + log(number of visible keys)
    n_visible = visible_mask(b, qp, kp, ks, DEVICE).sum(-1)[:, None].float()  # [b, 1, q]
    kernel_lse = ta.lse_per_head(lse, H)
    finite = torch.isfinite(kernel_lse)
    assert (kernel_lse[finite] <= (cap + n_visible.log()).expand_as(kernel_lse)[finite] + 1e-5).all()
    assert rel_err(flash_attention(q, k, v, key_start=ks), ref) > 1e-2  # the cap matters here
    # a cap far above every score changes nothing but rounding
    assert (
        rel_err(flash_attention(q, k, v, key_start=ks, softcap=1e4), attention_reference(q, k, v, key_start=ks)) < 1e-5
    )


@pytest.mark.unchecked
def test_input_validation():
    q = torch.randn(1, 4, 3, 16, device=DEVICE)
    kv = torch.randn(1, 4, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="multiple"):
        flash_attention(q, kv, kv)
    with pytest.raises(ValueError, match="key_start"):
        flash_attention(q, q, q, key_start=torch.zeros(2, dtype=torch.int64, device=DEVICE))
    for softcap in (0.0, -1.0, float("inf"), float("nan"), True, "50"):
        with pytest.raises(ValueError, match="softcap must be a positive finite number"):
            flash_attention(q, q, q, softcap=softcap)
    for window in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window must be a whole number of key columns >= 1"):
            flash_attention(q, q, q, window=window)


@pytest.mark.skipif(DEVICE != "cpu", reason="checks the CPU-without-interpreter error")
def test_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setattr(ta, "_INTERPRET", False)
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        flash_attention(q, q, q)


AOT_CHECK = """
import os, re
try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:
    print("API-UNAVAILABLE"); raise SystemExit(0)
from hooked.kernels.attention import triton_attention as ta
assert not ta._INTERPRET
PTRS = {"LSE": "*fp32", "Delta": "*fp32", "KeyStart": "*i32"}
POINTERS = {"Q", "K", "V", "Out", "DO", "DQ", "DK", "DV", "LSE", "Delta", "KeyStart"}
for dtype, d, group, ks, window, cap, prec, block in [  # window / softcap: the sliding window / logit softcap paths
        ("bf16", 64, 4, True, False, False, "tf32", 64), ("fp16", 80, 1, False, True, True, "tf32", 64),
        ("fp32", 32, 2, True, True, True, "tf32x3", 32)]:
    bd = triton.next_power_of_2(d)
    for fn in (ta._attn_fwd_kernel, ta._attn_bwd_dq_kernel, ta._attn_bwd_dkdv_kernel):
        ce = dict(HEAD_DIM=d, BLOCK_D=bd, CHECK_D=bd != d, GROUP=group, HAS_KEY_START=ks, HAS_WINDOW=window,
                  SOFTCAP=cap, PRECISION=prec, UPCAST=False, BLOCK_M=block, BLOCK_N=block)
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):  # mimic the JIT's specialization (unit d-stride, 16-divisible)
            if name.startswith("stride_") and name.endswith("d"):
                ce[name] = 1
            if name in ce:
                sig[name] = "constexpr"
            elif name in POINTERS:
                sig[name] = PTRS.get(name, "*" + dtype)
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif name in ("qk_scale", "sm_scale", "cap_log2"):
                sig[name] = "fp32"
            else:
                sig[name] = "i32"
                if name.startswith("stride_"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(fn, sig, constexprs=ce, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=4, num_stages=3))
        ptx = k.asm["ptx"]
        print(fn.__name__, dtype, d, "window", window, "softcap", cap, "wgmma", len(re.findall("wgmma.mma_async", ptx)),
              "spills", len(re.findall("st.local", ptx)), "smem", k.metadata.shared)
print("AOT OK")
"""


def _run_without_interpreter(script: str, timeout: int):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_kernels_compile_for_sm90_without_a_gpu():
    """The interpreter does not type-check like the compiler: compile all three kernels to PTX/cubin
    for sm_90 (Triton's frontend + bundled ptxas; no GPU needed) to cover the real-compilation path."""
    res = _run_without_interpreter(AOT_CHECK, timeout=600)
    if "API-UNAVAILABLE" in res.stdout:
        pytest.skip("this Triton build lacks the NVIDIA ahead-of-time compile API")
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    assert "AOT OK" in res.stdout


GPU_CHECK = """
import torch
from hooked.kernels import flash_attention
from hooked.kernels.attention import triton_attention as ta
from hooked.kernels.attention.reference import attention_reference
assert not ta._INTERPRET and ta._USE_AUTOTUNE
torch.manual_seed(0)
TOL = {torch.bfloat16: (2e-2, 4e-2), torch.float16: (4e-3, 1e-2), torch.float32: (1e-4, 2e-4)}
cases = [(torch.bfloat16, d, *shape, None, None) for d in (64, 128) for shape in [
    (2, 1000, 1000, 8, 2, [0, 77]), (2, 257, 1031, 4, 4, None), (3, 1, 999, 8, 1, [5, 0, 0])]]
cases += [(torch.float16, 128, 2, 300, 300, 4, 2, [0, 3], None, None),
          (torch.float32, 64, 2, 200, 333, 4, 1, [0, 40], None, None)]
# sliding window (Mistral) and logit softcap (Gemma 2: d_head 256, softcap 50)
cases += [(torch.bfloat16, 128, 2, 1000, 1000, 8, 2, [0, 77], 129, None),
          (torch.bfloat16, 256, 2, 600, 600, 4, 2, [0, 30], 100, 50.0),
          (torch.float32, 64, 2, 200, 333, 4, 1, [0, 40], 37, 5.0)]
for dtype, d, b, qp, kp, H, Hkv, ks, window, softcap in cases:
    qkv = torch.randn(b, kp, H + 2 * Hkv, d, device="cuda").to(dtype)  # fused projection output
    leaf = qkv.clone().requires_grad_()
    ref_leaf = qkv.float().requires_grad_()
    kst = None if ks is None else torch.tensor(ks, device="cuda")
    split = lambda t: (t[:, kp - qp:, :H], t[:, :, H:H + Hkv], t[:, :, H + Hkv:])
    out = flash_attention(*split(leaf), key_start=kst, window=window, softcap=softcap)
    ref = attention_reference(*split(ref_leaf), key_start=kst, window=window, softcap=softcap)
    g = torch.randn_like(ref)
    out.backward(g.to(dtype)); ref.backward(g)
    assert out.is_contiguous() and out.shape == (b, qp, H * d)
    parts = [("out", out, ref)] + list(zip(("dq", "dk", "dv"), split(leaf.grad), split(ref_leaf.grad)))
    for name, a, r in parts:
        assert torch.isfinite(a).all(), name
        err = ((a.float() - r).abs().max() / r.abs().max().clamp_min(1e-6)).item()
        tol = TOL[dtype][name != "out"]
        print(dtype, d, b, qp, kp, H, Hkv, window, softcap, name, f"{err:.2e}")
        assert err < tol, (dtype, d, qp, kp, name, err)
print("GPU OK")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to compile Triton for real")
def test_real_gpu_compilation_bf16_d64_d128():
    # Run in a fresh interpreter with TRITON_INTERPRET=0 so the compiled (autotuned) path is used
    # even when this test session runs under the interpreter.
    res = _run_without_interpreter(GPU_CHECK, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GPU OK" in res.stdout
