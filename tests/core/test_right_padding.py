"""Right padding (`padding_side="right"`), checked against TransformerLens 3.9 and against each prompt alone.

TransformerLens pads on the right by default and builds the mask with `utils.get_attention_mask`
(trailing pad ids masked). hooked pads on the left by default; with right padding every downstream
reader (loss, caches, ablations, metrics, sweeps, generation) must give each prompt what it gets alone.
"""

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate, metrics
from tests.transformer_lens.tl_reference import tl_gpt2

PROMPTS = ["When Mary and John went to the store", "Hi there", "A", "John gave a drink to Mary"]


@pytest.fixture(scope="module")
def tl(gpt2_dir):
    return tl_gpt2(gpt2_dir)


@pytest.fixture(scope="module")
def tl_utils():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import utils

    return utils


@pytest.fixture(scope="module")
def right(gpt2_dir):
    """The checkpoint's own weights (as tl_gpt2 has them), with a tokenizer that pads on the right."""
    model = hooked.HookedTransformer.from_pretrained_no_processing(gpt2_dir, default_padding_side="right")
    model.generate_defaults = {}  # greedy and quiet, as gpt2's: generation is compared token for token
    return model


def _tl_right(tl, tl_utils, prompts=PROMPTS):
    tokens = tl.to_tokens(prompts, padding_side="right")
    return tokens, tl_utils.get_attention_mask(tl.tokenizer, tokens, True, padding_side="right")


# ----------------------------------------------------------------------------- ids
def test_ids_as_transformer_lens(gpt2, right, tl, tl_utils):
    theirs, their_mask = _tl_right(tl, tl_utils)
    assert bool((their_mask[:, -1] == 0).any())  # the batch really is padded on the right
    assert torch.equal(gpt2.to_tokens(PROMPTS, padding_side="right"), theirs)
    assert torch.equal(right.to_tokens(PROMPTS), theirs)
    assert torch.equal(right.to_tokens(PROMPTS, padding_side="left"), tl.to_tokens(PROMPTS, padding_side="left"))
    batch = right.tokenizer(PROMPTS, return_tensors="pt")
    assert torch.equal(batch["input_ids"], theirs) and torch.equal(batch["attention_mask"], their_mask)
    batch = gpt2.tokenizer(PROMPTS, return_tensors="pt", padding_side="right")
    assert torch.equal(batch["input_ids"], theirs) and torch.equal(batch["attention_mask"], their_mask)
    assert right.to_str_tokens(PROMPTS) == tl.to_str_tokens(PROMPTS, padding_side="right")
    assert gpt2.to_str_tokens(PROMPTS, padding_side="right") == tl.to_str_tokens(PROMPTS, padding_side="right")


def test_set_tokenizer_and_padding_side_setter(gpt2_dir, tl, tl_utils):
    theirs, _ = _tl_right(tl, tl_utils)
    model = hooked.load(gpt2_dir)
    model.set_tokenizer(tl.tokenizer, default_padding_side="right")
    assert model.tokenizer.padding_side == "right" and torch.equal(model.to_tokens(PROMPTS), theirs)
    model.tokenizer.padding_side = "left"
    assert torch.equal(model.to_tokens(PROMPTS), tl.to_tokens(PROMPTS, padding_side="left"))
    with pytest.raises(ValueError, match="must be 'left'.*or 'right'"):
        model.set_tokenizer(tl.tokenizer, default_padding_side="both")


# ----------------------------------------------------------------------------- the forward
def test_logits_at_real_positions(gpt2, right, tl, tl_utils):
    tokens, mask = _tl_right(tl, tl_utils)
    with torch.no_grad():
        theirs = tl(tokens, attention_mask=mask)
        tl.tokenizer.padding_side = "right"
        try:
            theirs_unmasked = tl(tokens)  # TransformerLens builds no mask here; real positions do not need one
        finally:
            tl.tokenizer.padding_side = "left"
        ours_read = right(tokens)  # the mask read from the ids (trailing pad ids)
        ours_given = gpt2(tokens, attention_mask=mask)  # a left-padding model, told the mask
        ours_call = gpt2(tokens, padding_side="right")  # read on the side the call names
        for i, prompt in enumerate(PROMPTS):
            n = int(mask[i].sum())
            alone = gpt2(prompt)[0]
            for ours in (ours_read, ours_given, ours_call):
                torch.testing.assert_close(ours[i, :n], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ours_read[i, :n], theirs[i, :n], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(ours_read[i, :n], theirs_unmasked[i, :n], rtol=1e-4, atol=1e-4)


def test_positions_start_at_zero_in_every_row(right):
    tokens = right.to_tokens(PROMPTS)
    seen = {}

    def keep(activation, hook):
        seen["position_ids"], seen["mask"] = hook.position_ids.clone(), hook.attention_mask.clone()

    right.run_with_hooks(tokens, fwd_hooks=[("hook_embed", keep)])
    lengths = seen["mask"].sum(-1)
    for i in range(len(PROMPTS)):
        assert seen["position_ids"][i, : lengths[i]].tolist() == list(range(int(lengths[i])))
        assert not bool(seen["mask"][i, lengths[i] :].any()) and bool(seen["mask"][i, : lengths[i]].all())


def test_run_with_cache_as_transformer_lens(right, tl, tl_utils):
    tokens, mask = _tl_right(tl, tl_utils)
    names = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_z", "blocks.1.attn.hook_pattern"]
    with torch.no_grad():
        _, ours = right.run_with_cache(tokens, names_filter=names)
        _, theirs = tl.run_with_cache(tokens, attention_mask=mask, names_filter=names)
    assert torch.equal(ours.attention_mask.cpu(), mask.bool())
    for i in range(len(PROMPTS)):
        n = int(mask[i].sum())
        for name in names[:2]:
            torch.testing.assert_close(ours[name][i, :n], theirs[name][i, :n], rtol=1e-4, atol=1e-4)
        # Real queries attend to real keys only, in both.
        torch.testing.assert_close(ours[names[2]][i, :, :n, :n], theirs[names[2]][i, :, :n, :n], rtol=1e-4, atol=1e-5)
        assert float(ours[names[2]][i, :, :n, n:].abs().sum()) == 0.0


def test_loss_as_transformer_lens(gpt2, right, tl, tl_utils):
    tokens, mask = _tl_right(tl, tl_utils)
    with torch.no_grad():
        theirs = tl(tokens, attention_mask=mask, return_type="loss")
        theirs_per_token = tl(tokens, attention_mask=mask, return_type="loss", loss_per_token=True)
        for ours_model, kwargs in ((right, {}), (gpt2, {"attention_mask": mask}), (gpt2, {"padding_side": "right"})):
            torch.testing.assert_close(ours_model(tokens, return_type="loss", **kwargs), theirs, rtol=1e-5, atol=1e-5)
            per_token = ours_model(tokens, return_type="loss", loss_per_token=True, **kwargs)
            torch.testing.assert_close(per_token, theirs_per_token, rtol=1e-5, atol=1e-5)
        # Explicitly: the mean over each prompt's own next-token predictions, pads excluded.
        total, count = 0.0, 0
        for prompt in PROMPTS:
            alone = gpt2(prompt, return_type="loss", loss_per_token=True)
            total, count = total + float(alone.sum()), count + alone.numel()
        assert abs(float(right(tokens, return_type="loss")) - total / count) < 1e-5
        torch.testing.assert_close(right.loss_fn(right(tokens), tokens, mask), theirs, rtol=1e-5, atol=1e-5)


def test_ambiguous_ids_are_refused_as_on_the_left(right):
    """A prompt that ends with the pad id (GPT-2's <|endoftext|>) cannot be told from padding by its ids."""
    with pytest.raises(ValueError, match="prompt 1 of this batch ends with '<\\|endoftext\\|>', the pad token"):
        right.to_tokens(["When Mary and John went", "Hi<|endoftext|>"])
    batch = right.tokenizer(["When Mary and John went", "Hi<|endoftext|>"], return_tensors="pt")
    logits = right(batch["input_ids"], attention_mask=batch["attention_mask"])
    n = int(batch["attention_mask"][1].sum())
    assert batch["input_ids"][1, n - 1] == right.tokenizer.pad_token_id  # the prompt's own last token
    torch.testing.assert_close(logits[1, :n], right("Hi<|endoftext|>")[0], rtol=1e-5, atol=1e-5)
    tokens = right.to_tokens(PROMPTS)
    with pytest.raises(ValueError, match="every row ends with.*attention_mask="):
        right(tokens[1:3])  # no unpadded row left: padding or prompts that end with the pad id?
    one = right.to_tokens("Hello<|endoftext|>")
    assert right.tokenizer.mask_for(one, True) is None  # one row was never padded: its last id is real
    # A prompt of nothing but the BOS (= the pad id) keeps its BOS, as a leading run keeps it on the left.
    tokens = right.to_tokens(["", "Hi there"])
    assert right.tokenizer.mask_for(tokens, True)[0].tolist() == [True] + [False] * (tokens.shape[1] - 1)
    torch.testing.assert_close(right(tokens)[0, 0], right("")[0, 0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- ablations, metrics, sweeps
def test_mean_ablation_averages_real_tokens_only(right):
    tokens = right.to_tokens(PROMPTS)
    name = "blocks.0.hook_resid_post"
    _, cache = right.run_with_cache(tokens, names_filter=[name])
    real = torch.cat([cache[name][i, : int(cache.attention_mask[i].sum())] for i in range(len(PROMPTS))])
    expected = real.mean(0)  # explicit: every real token of every prompt, pads left out
    seen = {}

    def after(activation, hook):
        seen["value"] = activation.clone()

    right.run_with_hooks("Hi there", fwd_hooks=[(name, ablate.mean(reference=cache)), (name, after)])
    torch.testing.assert_close(seen["value"][0], expected.expand_as(seen["value"][0]), rtol=1e-5, atol=1e-6)
    # The same prompts padded on the left give the same mean.
    left_tokens = right.to_tokens(PROMPTS, padding_side="left")
    _, left_cache = right.run_with_cache(
        left_tokens,
        attention_mask=right.tokenizer(PROMPTS, return_tensors="pt", padding_side="left")["attention_mask"],
        names_filter=[name],
    )
    right.run_with_hooks("Hi there", fwd_hooks=[(name, ablate.mean(reference=left_cache)), (name, after)])
    torch.testing.assert_close(seen["value"][0], expected.expand_as(seen["value"][0]), rtol=1e-5, atol=1e-6)


def _both_sides(model, prompts):
    left = model.tokenizer(prompts, return_tensors="pt", padding_side="left")
    right_ = model.tokenizer(prompts, return_tensors="pt", padding_side="right")
    return (left["input_ids"], left["attention_mask"]), (right_["input_ids"], right_["attention_mask"])


def test_metrics_read_each_prompts_last_token(right):
    (left_ids, left_mask), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    metric = metrics.logit_diff(right, [" Mary"] * 4, [" John"] * 4)
    with torch.no_grad():
        left_logits, right_logits = (
            right(left_ids, attention_mask=left_mask),
            right(right_ids, attention_mask=right_mask),
        )
        expected = torch.stack([right(p)[0, -1] for p in PROMPTS])  # each prompt alone, its last token
    by_hand = expected[:, right.to_single_token(" Mary")] - expected[:, right.to_single_token(" John")]
    torch.testing.assert_close(metric(right_logits, attention_mask=right_mask), by_hand, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metric(left_logits, attention_mask=left_mask), by_hand, rtol=1e-5, atol=1e-5)
    for every in (metrics.kl_div(), metrics.kl_div(position=None)):  # a base run of the same prompts, padded alike
        torch.testing.assert_close(
            every(right_logits, base_logits=0.5 * right_logits, attention_mask=right_mask),
            every(left_logits, base_logits=0.5 * left_logits, attention_mask=left_mask),
            rtol=1e-4,
            atol=1e-5,
        )
    loss = metrics.loss(right, PROMPTS)
    torch.testing.assert_close(
        loss(right_logits), torch.stack([right(p, return_type="loss") for p in PROMPTS]), rtol=1e-5, atol=1e-5
    )


def test_sweep_on_right_padding_equals_left(right):
    (left_ids, left_mask), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    metric = metrics.logit_diff(right, [" Mary"] * 4, [" John"] * 4)
    variants = {
        "L1H0": ablate.hooks(right, "L1H0"),
        "L0.mlp": ablate.hooks(right, "L0.mlp"),
        "L1H2@-1": ablate.hooks(right, "L1H2@-1"),
        "L1.mlp": ablate.hooks(right, "L1.mlp"),
    }
    on_left = hooked.sweep(right, left_ids, variants, metric, attention_mask=left_mask)
    on_right = hooked.sweep(right, right_ids, variants, metric, attention_mask=right_mask)
    read = hooked.sweep(right, right_ids, variants, metric)  # the right-padding tokenizer reads the mask
    torch.testing.assert_close(on_right.values, on_left.values, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(read.values, on_left.values, rtol=1e-4, atol=1e-4)
    # ... and each variant is its own run_with_hooks on each prompt alone.
    one = metrics.logit_diff(right, [" Mary"], [" John"])
    for index, hooks in enumerate(variants.values()):
        alone = torch.stack([one(right.run_with_hooks(p, fwd_hooks=hooks))[0] for p in PROMPTS])
        torch.testing.assert_close(on_right.values[index], alone, rtol=1e-4, atol=1e-4)


def test_ablation_at_position_minus_one(right):
    (left_ids, left_mask), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    hooks = [("blocks.1.hook_resid_pre", ablate.zero(positions=-1))]
    out_right = right.run_with_hooks(right_ids, attention_mask=right_mask, fwd_hooks=hooks)
    out_left = right.run_with_hooks(left_ids, attention_mask=left_mask, fwd_hooks=hooks)
    for i, prompt in enumerate(PROMPTS):
        n = int(right_mask[i].sum())
        alone = right.run_with_hooks(prompt, fwd_hooks=hooks)[0]
        torch.testing.assert_close(out_right[i, :n], alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out_left[i, -n:], alone, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(alone[-1], right(prompt)[0, -1])  # the ablation did something


def test_get_token_position(right, tl):
    tokens = right.to_tokens(PROMPTS)
    john = right.to_single_token(" John")
    for i in range(len(PROMPTS)):
        row = tokens[i : i + 1]
        if bool((row == john).any()):
            assert right.get_token_position(" John", row) == tl.get_token_position(" John", row)
    assert right.get_token_position(" Mary", PROMPTS[0], padding_side="right") == tl.get_token_position(
        " Mary", PROMPTS[0]
    )


# ----------------------------------------------------------------------------- generation
def test_generation_per_prompt(gpt2, right):
    alone = [gpt2.generate(p, max_new_tokens=5, stop_at_eos=False, return_type="tokens")[0] for p in PROMPTS]
    (_, _), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    for model, kwargs in ((right, {}), (gpt2, {"attention_mask": right_mask}), (gpt2, {"padding_side": "right"})):
        for use_cache in (True, False):
            out = model.generate(right_ids, max_new_tokens=5, stop_at_eos=False, use_past_kv_cache=use_cache, **kwargs)
            for i, expected in enumerate(alone):  # right-padded again: the prompt, its continuation, then padding
                assert out[i, : len(expected)].tolist() == expected.tolist()
                assert bool((out[i, len(expected) :] == right.tokenizer.pad_token_id).all())
    texts = right.generate(PROMPTS, max_new_tokens=5, stop_at_eos=False)
    assert texts == [gpt2.generate(p, max_new_tokens=5, stop_at_eos=False) for p in PROMPTS]
    assert gpt2.generate(PROMPTS, max_new_tokens=5, stop_at_eos=False, padding_side="right") == texts
    variants = hooked.generate_variants(
        right, right_ids, {"none": [], "L1H0": ablate.hooks(right, "L1H0")}, max_new_tokens=4, stop_at_eos=False
    )
    for i, expected in enumerate(alone):
        assert variants["none"][i, : len(expected) - 1].tolist() == expected[:-1].tolist()
    with pytest.raises(ValueError, match="return_cache=True needs left-padded ids"):
        right.generate(right_ids, max_new_tokens=2, return_cache=True)


def test_kv_cache_continues_each_right_padded_prompt(right):
    """A KV cache keeps the padding mask: a continuation after a right-padded prompt is that prompt's next token."""
    (_, _), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    cache = hooked.KVCache(right, batch_size=len(PROMPTS), max_len=32)
    with torch.no_grad():
        right(right_ids, attention_mask=right_mask, past_kv_cache=cache)
        next_ids = torch.tensor([[5], [6], [7], [8]])
        step = right(next_ids, past_kv_cache=cache)[:, -1]
        for i, prompt in enumerate(PROMPTS):
            whole = torch.cat([right.to_tokens(prompt)[0], next_ids[i]])
            torch.testing.assert_close(step[i], right(whole)[0, -1], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- property
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 9), min_size=2, max_size=4), seed=st.integers(0, 2**16))
def test_right_and_left_padding_agree(right, lengths, seed):
    """Random prompts of random lengths: padded either side, every prompt gets the same per-prompt answers."""
    generator = torch.Generator().manual_seed(seed)
    pad = right.tokenizer.pad_token_id
    rows = [torch.randint(1, right.cfg.d_vocab, (n,), generator=generator) for n in lengths]
    rows = [torch.where(row == pad, pad + 1, row) for row in rows]  # no real token is the pad id
    width = max(lengths)
    left_ids = torch.stack([torch.cat([torch.full((width - len(r),), pad), r]) for r in rows])
    right_ids = torch.stack([torch.cat([r, torch.full((width - len(r),), pad)]) for r in rows])
    columns = torch.arange(width)
    lengths_t = torch.tensor(lengths)[:, None]
    left_mask, right_mask = columns >= width - lengths_t, columns < lengths_t
    metric = metrics.logit_diff(None, [3] * len(rows), [4] * len(rows))
    with torch.no_grad():
        left_logits, left_loss = right(left_ids, attention_mask=left_mask, return_type="both", loss_per_token=True)
        right_logits, right_loss = right(right_ids, attention_mask=right_mask, return_type="both", loss_per_token=True)
        read_logits = right(right_ids) if min(lengths) < width else None  # the tokenizer reads the trailing pads
    torch.testing.assert_close(
        metric(right_logits, attention_mask=right_mask),
        metric(left_logits, attention_mask=left_mask),
        rtol=1e-4,
        atol=1e-4,
    )
    for i, n in enumerate(lengths):
        torch.testing.assert_close(right_logits[i, :n], left_logits[i, width - n :], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(right_loss[i, : n - 1], left_loss[i, width - n :], rtol=1e-4, atol=1e-4)
        if read_logits is not None:
            torch.testing.assert_close(read_logits[i, :n], left_logits[i, width - n :], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(right_loss.sum(), left_loss.sum(), rtol=1e-4, atol=1e-4)


def test_logit_lens_reads_each_prompts_last_token(right):
    (left_ids, left_mask), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    metric = metrics.logit_diff(right, [" Mary"] * 4, [" John"] * 4)
    _, right_cache = right.run_with_cache(right_ids, attention_mask=right_mask)
    _, left_cache = right.run_with_cache(left_ids, attention_mask=left_mask)
    on_right, labels = hooked.logit_lens(right_cache, metric)
    on_left, _ = hooked.logit_lens(left_cache, metric)
    torch.testing.assert_close(on_right, on_left, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        on_right[-1],
        metric(right(right_ids, attention_mask=right_mask), attention_mask=right_mask),
        rtol=1e-4,
        atol=1e-4,
    )


def test_patching_grid_on_right_padding_equals_left(right):
    (left_ids, left_mask), (right_ids, right_mask) = _both_sides(right, PROMPTS)
    metric = metrics.logit_diff(right, [" Mary"] * 4, [" John"] * 4)
    results = []
    for ids, mask in ((left_ids, left_mask), (right_ids, right_mask)):
        corrupt = ids.clone()
        first = mask.long().argmax(-1)  # each prompt's BOS column
        corrupt[torch.arange(len(PROMPTS)), first + 1] = right.to_single_token(" John")  # its first word
        _, clean = right.run_with_cache(ids, attention_mask=mask)
        results.append(hooked.patch.resid_sweep(right, corrupt, clean, metric, attention_mask=mask))
    left, right_ = results
    assert list(right_.variants) == list(left.variants) and len(left.variants) > 2
    torch.testing.assert_close(right_.values, left.values, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(right_.base, left.base, rtol=1e-4, atol=1e-4)
    assert float((right_.values - right_.base).abs().max()) > 1e-3  # the patches changed something


@pytest.mark.parametrize("architecture", ["gpt2", "qwen3", "qwen3_moe"])
def test_every_architecture_with_an_explicit_right_padded_mask(architecture):
    """No tokenizer: `attention_mask=` with trailing padding alone gives each row what it gets alone."""
    from hooked.testing import random_model

    model = random_model(architecture, seed=1, n_layers=2)
    generator = torch.Generator().manual_seed(0)
    lengths = [6, 3, 1]
    ids = torch.randint(1, model.cfg.d_vocab, (len(lengths), max(lengths)), generator=generator)
    mask = torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]
    ids = torch.where(mask, ids, 0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=3, stop_at_eos=False)
        for i, n in enumerate(lengths):
            torch.testing.assert_close(logits[i, :n], model(ids[i, :n])[0], rtol=1e-4, atol=1e-5)
            alone = model.generate(ids[i, :n], max_new_tokens=3, stop_at_eos=False)
            assert out[i, : n + 3].tolist() == alone.reshape(-1).tolist()
