"""hooked.engines.vllm.step without vLLM: an engine step's flat batch cut into requests, each request's hooks on its
own rows only, against each prompt run alone on hooked's own engine.

The attention core here is a plain-torch stand-in for vLLM's paged attention: causal SDPA within each request's
rows. The vLLM side (tests/engines/vllm_engine.py, `make test-vllm`) needs vLLM's own environment.
"""

import pytest
import torch
import torch.nn.functional as F

from hooked import ablate
from hooked.engines.vllm.step import Capture, Step, check_hooks, run_flat
from hooked.layers.attention import EngineAttention
from hooked.testing import random_model

PROMPTS = ([3, 17, 40, 9, 22], [8, 8, 21])


class SegmentAttention(EngineAttention):
    """Causal attention within each request's rows of the flat batch (what paged attention computes for a
    prefill of whole prompts)."""

    def __init__(self, starts):
        self.starts = starts

    def __call__(self, q, k, v, scaling, hook_attn_scores, hook_pattern):
        z = torch.empty_like(q)
        for start, end in zip(self.starts[:-1], self.starts[1:], strict=True):
            rows = [t[:, start:end].transpose(1, 2) for t in (q, k, v)]  # [1 head pos d_head]
            z[:, start:end] = F.scaled_dot_product_attention(*rows, is_causal=True, scale=scaling).transpose(1, 2)
        return z


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=1, n_layers=2, d_model=32, n_heads=4, d_mlp=64, d_vocab=64, n_ctx=32)


def flat_logits(model, variants_of_requests, variants):
    tokens = torch.tensor([t for prompt in PROMPTS for t in prompt])
    positions = torch.cat([torch.arange(len(prompt)) for prompt in PROMPTS])
    starts = (0, len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1]))
    step = Step(("a", "b"), starts, variants_of_requests, tuple(len(p) for p in PROMPTS))
    with torch.no_grad():
        hidden = run_flat(model, tokens, positions, SegmentAttention(starts), step, variants)
    logits = F.linear(hidden, model.unembed_weight)
    return logits[: starts[1]], logits[starts[1] :]


def zero_head_0(z, hook):
    z[:, :, 0] = 0.0


def halve(z, hook):
    return z * 0.5  # a replacement, not an in-place edit


# Float32 tolerance: the flat batch runs every linear layer on [1, 8, d] instead of [1, n, d], so BLAS may sum in
# another blocking; logits are O(1), so a few ulps of float32 (1e-7 relative) per layer stays far below 1e-5.
ATOL = 1e-5


@pytest.mark.parametrize(
    "hook", [zero_head_0, halve, ablate.zero(heads=[1])], ids=["in_place", "replacement", "ablate"]
)
def test_a_hook_on_one_request_leaves_the_other_clean(model, hook):
    hooked_a, clean_b = flat_logits(model, ("zero", None), {"zero": [("blocks.0.attn.hook_z", hook)]})
    with torch.no_grad():
        alone_a = model.run_with_hooks(torch.tensor([PROMPTS[0]]), fwd_hooks=[("blocks.0.attn.hook_z", hook)])[0]
        alone_b = model(torch.tensor([PROMPTS[1]]))[0]
        clean_a = model(torch.tensor([PROMPTS[0]]))[0]
    torch.testing.assert_close(hooked_a, alone_a, atol=ATOL, rtol=0)
    torch.testing.assert_close(clean_b, alone_b, atol=ATOL, rtol=0)
    assert (hooked_a - clean_a).abs().max() > 1e-2  # the hook did change request a


def test_hooks_see_their_request_in_hooked_layout(model):
    seen = []

    def record(activation, hook):
        seen.append((tuple(activation.shape), hook.position_ids.tolist(), hook.rows.lengths.tolist()))

    flat_logits(model, ("r", "r"), {"r": [("blocks.1.hook_resid_pre", record)]})
    assert seen == [
        ((1, 5, 32), [[0, 1, 2, 3, 4]], [[5]]),
        ((1, 3, 32), [[0, 1, 2]], [[3]]),
    ]


def test_points_without_positions_are_refused_up_front(model):
    with pytest.raises(ValueError, match="no 'pos' axis"):
        check_hooks(model, [("blocks.0.attn.hook_pattern", zero_head_0)])
    with pytest.raises(KeyError, match="hook_zz"):
        check_hooks(model, [("blocks.0.attn.hook_zz", zero_head_0)])
    with pytest.raises(IndexError, match="out of range"):  # 4 heads: hooked.ablate's own check runs
        check_hooks(model, [("blocks.0.attn.hook_z", ablate.zero(heads=[7]))])


def test_a_failing_hook_is_filed_for_its_request_and_the_step_goes_on(model):
    def boom(z, hook):
        raise ZeroDivisionError("the user's own error")

    tokens = torch.tensor([t for prompt in PROMPTS for t in prompt])
    positions = torch.cat([torch.arange(len(prompt)) for prompt in PROMPTS])
    starts = (0, len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1]))
    step = Step(("a", "b"), starts, ("bad", None), tuple(len(p) for p in PROMPTS), tags=("tag-a", None))
    errors = {}
    with torch.no_grad():
        hidden = run_flat(
            model, tokens, positions, SegmentAttention(starts), step, {"bad": [("hook_embed", boom)]}, errors
        )
        alone_b = model(torch.tensor([PROMPTS[1]]))[0]
    assert list(errors) == ["tag-a"] and isinstance(errors["tag-a"], ZeroDivisionError)
    torch.testing.assert_close(F.linear(hidden[starts[1] :], model.unembed_weight), alone_b, atol=ATOL, rtol=0)
    with pytest.raises(ZeroDivisionError), torch.no_grad():  # without an errors dict, the hook's error propagates
        run_flat(model, tokens, positions, SegmentAttention(starts), step, {"bad": [("hook_embed", boom)]})


def test_a_capture_keeps_each_request_apart(model):
    capture = Capture()
    tokens = torch.tensor([t for prompt in PROMPTS for t in prompt])
    positions = torch.cat([torch.arange(len(prompt)) for prompt in PROMPTS])
    starts = (0, len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1]))
    step = Step(("a", "b"), starts, ("cache", "cache"), tuple(len(p) for p in PROMPTS), tags=("ta", "tb"))
    with torch.no_grad():
        run_flat(model, tokens, positions, SegmentAttention(starts), step, {"cache": [("hook_embed", capture)]}, {})
        for tag, prompt in zip(("ta", "tb"), PROMPTS, strict=True):
            _, alone = model.run_with_cache(torch.tensor([prompt]), names_filter="hook_embed")
            assert torch.equal(capture.take(tag)["hook_embed"], alone["hook_embed"])  # a row lookup: exact
    assert capture.store == {}


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_a_core_that_applies_no_softcap_or_window_refuses_a_layer_with_one(family):
    """The stand-in core (EngineAttention's default `check_layer`) computes plain causal attention: a Gemma 2 layer
    (score cap) or a Mistral layer whose window is shorter than the flat batch is refused, never run without it."""
    model = random_model(family, seed=1, n_layers=1)
    if family == "gemma2":
        assert model.blocks[0].attn.softcap is not None
    else:
        assert model.cfg.sliding_window is not None and model.cfg.sliding_window < sum(map(len, PROMPTS))
    tokens = torch.tensor([t for prompt in PROMPTS for t in prompt])
    positions = torch.cat([torch.arange(len(prompt)) for prompt in PROMPTS])
    starts = (0, len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1]))
    with pytest.raises(NotImplementedError, match="applies no attention logit softcap or sliding window"):
        with torch.no_grad():
            run_flat(model, tokens, positions, SegmentAttention(starts), None, {})
