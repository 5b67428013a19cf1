"""Sliding windows and logit softcaps through `hooked.layers.attend`: which path serves them, and that each
path computes them (the Triton kernel under TRITON_INTERPRET=1, set by conftest).

The window is Mistral's `sliding_window` (query column i sees key column j iff i - window < j <= i, as
transformers 5.24 `masking_utils.sliding_window_causal_mask_function`); the softcap is Gemma 2's
`attn_logit_softcapping` (scores -> softcap * tanh(scores / softcap) before the mask, as transformers 5.24
`models/gemma2/modeling_gemma2.eager_attention_forward`). The reference is the kernel's plain-torch spec,
`hooked.kernels.attention.reference.attention_reference`, and SDPA for whole models.
"""

from types import SimpleNamespace

import pytest
import torch

import hooked
from hooked import layers
from hooked.kernels.attention.reference import attention_reference
from hooked.layers import AttentionMask, attend, choose_backend
from hooked.testing import random_model

CAP = 2.0


def qkv_and_mask(window=None, batch=2, pos=21, n_heads=4, n_kv_heads=2, d_head=16, seed=0):
    """q [batch pos head d_head] with scores of size ~3 (the cap bites), k, v, and a left-padded mask."""
    gen = torch.Generator().manual_seed(seed)
    q = 3 * torch.randn(batch, pos, n_heads, d_head, generator=gen)
    k, v = (torch.randn(batch, pos, n_kv_heads, d_head, generator=gen) for _ in range(2))
    key_valid = torch.ones(batch, pos, dtype=torch.bool)
    key_valid[1, :5] = False
    return q, k, v, AttentionMask(key_valid, pos, pos).windowed(window)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("backend", [None, "eager", "triton"])
def test_softcap_through_attend_matches_the_reference(backend, window):
    """The automatic path on CPU is eager (SDPA cannot cap); eager and the kernel equal the spec on every
    real row, with and without a window; the cap changes the result."""
    q, k, v, mask = qkv_and_mask(window)
    scores, pattern = (
        hooked.HookPoint("batch head_index query_pos key_pos"),
        hooked.HookPoint("batch head_index query_pos key_pos"),
    )
    scaling = q.shape[-1] ** -0.5
    if backend is None:
        assert choose_backend(q, mask, scores, pattern, softcap=CAP) == "eager"
        assert choose_backend(q, mask, scores, pattern) == "sdpa"
    with hooked.attention_backend(backend) if backend else torch.no_grad():
        z = attend(q, k, v, mask, scaling, scores, pattern, softmax_in_float32=True, softcap=CAP)
    key_start = mask.left_padding_starts
    expected = attention_reference(q, k, v, key_start=key_start, sm_scale=scaling, softcap=CAP, window=window)
    uncapped = attention_reference(q, k, v, key_start=key_start, sm_scale=scaling, window=window)
    real = mask.key_valid  # the padded rows' outputs are never read (eager lets them see themselves)
    z = z.reshape(*q.shape[:2], -1)
    torch.testing.assert_close(z[real], expected[real], rtol=0, atol=2e-6)
    assert (z[real] - uncapped[real]).abs().max() > 1e-2


def test_hook_attn_scores_sees_the_capped_scores():
    """TransformerLens 3.9 (components/abstract_attention.py) caps before the mask and `hook_attn_scores`:
    the hooked scores are softcap * tanh(q.k * scale / softcap) on visible keys, computed here by hand."""
    q, k, v, mask = qkv_and_mask(window=6)
    scores_point, pattern_point = (
        hooked.HookPoint("batch head_index query_pos key_pos"),
        hooked.HookPoint("batch head_index query_pos key_pos"),
    )
    seen = {}
    scores_point.add_hook(lambda scores, hook: seen.__setitem__("scores", scores.clone()))
    scaling = q.shape[-1] ** -0.5
    with torch.no_grad():
        attend(q, k, v, mask, scaling, scores_point, pattern_point, softmax_in_float32=True, softcap=CAP)
    scores_point.remove_hooks()
    raw = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, dim=2)) * scaling
    visible = mask.boolean.expand_as(raw)
    # einsum and attend's matmul sum q.k in other orders: float32 rounding of the raw scores (a few ulps of their
    # magnitude, which the cap's slope <= 1 does not grow)
    atol = 16 * torch.finfo(torch.float32).eps * raw[visible].abs().max().item()
    torch.testing.assert_close(seen["scores"][visible], (CAP * torch.tanh(raw / CAP))[visible], rtol=0, atol=atol)
    assert seen["scores"][visible].abs().max() <= CAP and raw[visible].abs().max() > 2 * CAP
    assert (seen["scores"][~visible] == torch.finfo(torch.float32).min).all()


@pytest.mark.unchecked
def test_softcap_refuses_sdpa_and_the_kernel_serves_windows_on_a_gpu(monkeypatch):
    q, k, v, mask = qkv_and_mask(window=6)
    point = hooked.HookPoint("batch head_index query_pos key_pos")
    with (
        hooked.attention_backend("sdpa"),
        pytest.raises(
            RuntimeError, match=r"cannot apply .* softcap \(2.0\): use attention_backend\('eager'\) or 'triton'"
        ),
    ):
        attend(q, k, v, mask, 0.25, point, point, softmax_in_float32=True, softcap=CAP)
    # pretending a GPU: windows and softcaps go to the kernel; a softcapped decode step goes to eager
    monkeypatch.setattr(layers.attention, "triton_compiles_on", lambda device: True)
    gpu_q = SimpleNamespace(is_cuda=True, device=torch.device("cuda:0"))
    assert choose_backend(gpu_q, mask, point, point) == "triton"
    assert choose_backend(gpu_q, mask, point, point, softcap=CAP) == "triton"
    decode = AttentionMask(None, 1, 30).windowed(6)
    assert choose_backend(gpu_q, decode, point, point, softcap=CAP) == "eager"
    assert choose_backend(gpu_q, decode, point, point) == "sdpa"


def test_mistral_with_the_kernel_forced_matches_sdpa():
    """A sliding window of 3 against 21 columns (two 16-key tiles), left-padded: logits and z gradients
    through the kernel equal SDPA's (a boolean mask) within float32 rounding; the window matters."""
    model = random_model("mistral", seed=7, sliding_window=3)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 21), generator=torch.Generator().manual_seed(8))
    attention_mask = torch.ones_like(tokens)
    attention_mask[1, :5] = 0
    real = attention_mask.bool()

    def run(model):
        grads = {}
        with torch.enable_grad():
            logits = model.run_with_hooks(
                tokens,
                attention_mask=attention_mask,
                bwd_hooks=[("blocks.0.attn.hook_z", lambda g, hook: grads.__setitem__("z", g))],
            )
            logits[real].logsumexp(-1).sum().backward()
        return logits.detach(), grads["z"]

    reference_logits, reference_grad = run(model)
    with hooked.attention_backend("triton"):
        logits, grad = run(model)
    torch.testing.assert_close(logits[real], reference_logits[real], rtol=0, atol=3e-5)
    torch.testing.assert_close(grad[real], reference_grad[real], rtol=0, atol=3e-5)
    unwindowed_logits, _ = run(random_model("mistral", seed=7, sliding_window=None))  # the same weights
    assert (unwindowed_logits[real] - logits[real]).abs().max() > 1e-3
