"""hooked.engines.vllm.step without vLLM: an engine step's flat batch cut into requests, each request's hooks on its
own rows only, against each prompt run alone on hooked's own engine.

The attention core here is a plain-torch stand-in for vLLM's paged attention: causal SDPA within each request's
rows. The vLLM side (tests/engines/vllm_engine.py, `make test-vllm`) needs vLLM's own environment.
"""

import pytest
import torch
import torch.nn.functional as F

from hooked import ablate
from hooked.engines.vllm.step import Capture, Step, check_hooks, form_patterns, run_flat
from hooked.hooks import HookPoint
from hooked.layers.attention import EngineAttention
from hooked.testing import random_model

PROMPTS = ([3, 17, 40, 9, 22], [8, 8, 21])


class SegmentAttention(EngineAttention):
    """Causal attention within each request's rows of the flat batch (what paged attention computes for a
    prefill of whole prompts), then, as vLLM's core does, each request's scores and pattern where its hooks ask."""

    def __init__(self, starts):
        self.starts = starts

    def __call__(self, q, k, v, scaling, hook_attn_scores, hook_pattern, **eager):
        z = torch.empty_like(q)
        for start, end in zip(self.starts[:-1], self.starts[1:], strict=True):
            rows = [t[:, start:end].transpose(1, 2) for t in (q, k, v)]  # [1 head pos d_head]
            group = q.shape[2] // k.shape[2]  # grouped-query heads: SDPA's enable_gqa
            z[:, start:end] = F.scaled_dot_product_attention(
                *rows, is_causal=True, scale=scaling, enable_gqa=group > 1
            ).transpose(1, 2)
        if hook_attn_scores.listening or hook_pattern.listening:
            return form_patterns(q, k, v, z, scaling, hook_attn_scores, hook_pattern, **eager)
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
    class OnePoint:  # a model whose one point has no position axis (a user's own HookPoint("batch d_model"))
        hook_dict = {"pooled": HookPoint("batch d_model")}

        def resolve_hook_names(self, name):
            return [name]

    with pytest.raises(ValueError, match="no 'pos' axis"):
        check_hooks(OnePoint(), [("pooled", zero_head_0)])
    check_hooks(model, [("blocks.0.attn.hook_pattern", zero_head_0)])  # two position axes: formed per request
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


# Scores and patterns, formed per request on the prefill (form_patterns). Two families: GPT-2 (one key head per
# query head, softmax in the input dtype) and Qwen3 (grouped-query heads 4 -> 2, softmax in float32).
@pytest.fixture(scope="module", params=["gpt2", "qwen3"])
def family_model(request):
    if request.param == "gpt2":
        return random_model("gpt2", seed=1, n_layers=2, d_model=32, n_heads=4, d_mlp=64, d_vocab=64, n_ctx=32)
    return random_model("qwen3", seed=2)  # n_heads 4, n_kv_heads 2


def no_attention_to_position_1(pattern, hook):
    """Zero every query's attention to key 1, then renormalise each row (query 1 itself, which sees keys 0 and 1)."""
    if pattern.shape[0] != 1 or pattern.shape[2] != pattern.shape[3]:
        raise AssertionError(f"hook_pattern should see one request [1 head pos pos], got {tuple(pattern.shape)}")
    pattern = pattern.clone()
    pattern[..., 1] = 0.0
    return pattern / pattern.sum(-1, keepdim=True)


def double_scores(scores, hook):
    scores.mul_(2.0)  # in place: sharper attention (the masked entries stay at the dtype's minimum or below)


def flat_step(model, variants_of_requests, variants, errors=None, positions=None, tags=None):
    tokens = torch.tensor([t for prompt in PROMPTS for t in prompt])
    if positions is None:
        positions = torch.cat([torch.arange(len(prompt)) for prompt in PROMPTS])
    starts = (0, len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1]))
    step = Step(("a", "b"), starts, variants_of_requests, tuple(len(p) for p in PROMPTS), tags)
    with torch.no_grad():
        hidden = run_flat(model, tokens, positions, SegmentAttention(starts), step, variants, errors)
    logits = F.linear(hidden, model.unembed_weight)
    return logits[: starts[1]], logits[starts[1] :]


@pytest.mark.parametrize(
    "name, hook",
    [("blocks.0.attn.hook_pattern", no_attention_to_position_1), ("blocks.1.attn.hook_attn_scores", double_scores)],
    ids=["pattern_replaced", "scores_in_place"],
)
@pytest.mark.parametrize("hooked", [0, 1], ids=["first_request", "second_request"])  # rows 0.. or rows 5..
def test_a_pattern_hook_on_one_request_equals_that_prompt_alone(family_model, name, hook, hooked):
    model = family_model
    capture = Capture()
    cached = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_attn_scores"]
    variant = [(name, hook)] + [(point, capture) for point in cached]
    errors = {}
    which = ("edit", None) if hooked == 0 else (None, "edit")
    logits = flat_step(model, which, {"edit": variant}, errors, tags=("t0", "t1"))
    assert errors == {}
    prompt, other = PROMPTS[hooked], PROMPTS[1 - hooked]
    with torch.no_grad():
        with model.hooks(fwd_hooks=[(name, hook)]):
            alone, reference = model.run_with_cache(torch.tensor([prompt]), names_filter=cached)
        clean = model(torch.tensor([prompt]))[0]
        other_alone = model(torch.tensor([other]))[0]
    # Logits O(1) in float32: the flat batch's linear layers may block their sums differently (measured 1.1e-6).
    torch.testing.assert_close(logits[hooked], alone[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1 - hooked], other_alone, atol=ATOL, rtol=0)  # the clean request: untouched
    assert (logits[hooked] - clean).abs().max() > 1e-2  # the edit did change the hooked request
    got = capture.take(f"t{hooked}")
    assert capture.store == {}  # the clean request cached nothing
    for point in cached:  # [1 head pos pos], after the edit where the edit is at the point itself
        assert got[point].shape == reference[point].shape == (1, 4, len(prompt), len(prompt))
        # Scores O(10), probabilities <= 1, from q and k that went through the same flat-batch layers (measured
        # equal); 1e-5 leaves room for BLAS blocking. Masked scores are the dtype's minimum on both sides.
        torch.testing.assert_close(got[point], reference[point], atol=ATOL, rtol=0)


def test_a_cached_pattern_leaves_the_request_as_the_engine_computed_it(family_model):
    capture = Capture()
    cached_a, _ = flat_step(family_model, ("cache", None), {"cache": [("blocks.0.attn.hook_pattern", capture)]}, {})
    clean_a, _ = flat_step(family_model, (None, None), {})
    # exact: no hook changed the pattern, so request a's z stays the core's own, the same kernels as the clean run
    assert torch.equal(cached_a, clean_a)
    assert capture.take("a")["blocks.0.attn.hook_pattern"].shape == (1, 4, len(PROMPTS[0]), len(PROMPTS[0]))


@pytest.mark.parametrize(
    "rows_of_a, holds",
    [([5], "a decode step (position 5"), ([2, 3, 4], "positions 2..4, not its whole prompt 0..4")],
    ids=["decode", "prefix_hit"],
)
def test_a_pattern_is_refused_on_a_step_without_the_whole_prompt(model, rows_of_a, holds):
    """Request a's rows are a decode step, or the end of its prompt after a prefix-cache hit; b is a clean prefill."""
    tokens = torch.tensor([*[PROMPTS[0][0]] * len(rows_of_a), *PROMPTS[1]])
    positions = torch.tensor([*rows_of_a, *range(len(PROMPTS[1]))])
    starts = (0, len(rows_of_a), len(rows_of_a) + len(PROMPTS[1]))
    step = Step(("a", "b"), starts, ("pattern", None), tuple(len(p) for p in PROMPTS), tags=("ta", None))
    errors = {}
    variants = {"pattern": [("blocks.0.attn.hook_pattern", no_attention_to_position_1)]}
    with torch.no_grad():
        hidden = run_flat(model, tokens, positions, SegmentAttention(starts), step, variants, errors)
        alone_b = model(torch.tensor([PROMPTS[1]]))[0]
    assert list(errors) == ["ta"] and isinstance(errors["ta"], NotImplementedError)
    message = str(errors["ta"])
    for needed in ("blocks.0.attn.hook_pattern", holds, "max_new_tokens=1", "model.generate", "run_with_cache"):
        assert needed in message, (needed, message)
    torch.testing.assert_close(F.linear(hidden[starts[1] :], model.unembed_weight), alone_b, atol=ATOL, rtol=0)
    with pytest.raises(NotImplementedError, match="formed on a request's prompt only"), torch.no_grad():
        run_flat(model, tokens, positions, SegmentAttention(starts), step, variants)  # no errors dict: raised


def attend_to_position_0_only(pattern, hook):
    return torch.zeros_like(pattern).index_fill_(-1, torch.tensor([0]), 1.0)


def test_two_requests_edit_the_same_pattern_each_their_own_way(family_model):
    model, name = family_model, "blocks.0.attn.hook_pattern"
    hooks = ([(name, no_attention_to_position_1)], [(name, attend_to_position_0_only)])
    logits = flat_step(model, ("a", "b"), {"a": hooks[0], "b": hooks[1]}, {})
    for got, prompt, fwd_hooks in zip(logits, PROMPTS, hooks, strict=True):
        with torch.no_grad():
            alone = model.run_with_hooks(torch.tensor([prompt]), fwd_hooks=fwd_hooks)[0]
        torch.testing.assert_close(got, alone, atol=ATOL, rtol=0)  # as the pattern test above


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
