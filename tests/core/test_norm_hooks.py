"""A norm's hooks that only read change no number; an edit at them, in place or returned, always counts.

`hooked.layers.HookedNorm`: with listeners the hooks see the step-by-step intermediates, and the output stays
the unhooked kernel's (`F.layer_norm`, Qwen3's RMSNorm formula) unless a hook edits. The references are the
plain forward (for read-only hooks) and the same edit returned as a new tensor (for in-place edits).
"""

import pytest
import torch

from hooked.testing import random_model

NORM_POINTS = lambda name: ".ln" in name and name.endswith(("hook_scale", "hook_normalized"))  # noqa: E731


@pytest.fixture(scope="module", params=["gpt2", "qwen3"])
def model(request):
    return random_model(request.param)


@pytest.fixture(scope="module")
def tokens(model):
    return torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))


def test_caching_the_norms_leaves_the_logits_bit_identical(model, tokens):
    with torch.no_grad():
        plain = model(tokens)
    logits, cache = model.run_with_cache(tokens, names_filter=NORM_POINTS)
    assert any("hook_normalized" in name for name in cache.keys())
    assert torch.equal(logits, plain)


def test_a_pattern_is_the_same_tensor_whether_its_norm_is_cached_or_not(model, tokens):
    """TransformerLens' Main Demo asserts this with torch.equal: layer 0's pattern in a full cache against
    one cached alone. (A later layer's pattern also depends on whether earlier attention ran eager, for its
    hooks, or SDPA: docs/hooks.md, "Points that change the computation path".)"""
    _, full = model.run_with_cache(tokens)
    _, alone = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern"])
    assert torch.equal(full["pattern", 0], alone["pattern", 0])


@pytest.mark.parametrize("mode", [torch.no_grad, torch.enable_grad, torch.inference_mode])
@pytest.mark.parametrize("point", ["blocks.0.ln1.hook_normalized", "blocks.1.ln2.hook_scale"])
def test_an_in_place_edit_counts_as_a_returned_one(model, tokens, mode, point):
    def in_place(activation, hook):
        activation[:, 3:] *= 0.5

    def returned(activation, hook):
        activation = activation.clone()
        activation[:, 3:] *= 0.5
        return activation

    with mode():
        edited = model.run_with_hooks(tokens, fwd_hooks=[(point, in_place)])
        reference = model.run_with_hooks(tokens, fwd_hooks=[(point, returned)])
        plain = model(tokens)
    assert torch.equal(edited, reference)
    assert not torch.allclose(edited[:, 3:], plain[:, 3:], atol=1e-3)


def test_gradients_flow_through_the_hooked_intermediates(model, tokens):
    seen = {}

    def keep(grad, hook):
        seen[hook.name] = grad

    model.zero_grad()
    model.run_with_hooks(tokens, bwd_hooks=[("blocks.0.ln1.hook_normalized", keep)])[:, -1].sum().backward()
    hooked_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(tokens)[:, -1].sum().backward()
    assert seen["blocks.0.ln1.hook_normalized"].abs().sum() > 0
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(hooked_grads[name], parameter.grad, rtol=1e-5, atol=1e-6)
    model.zero_grad()
