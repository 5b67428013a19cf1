"""`hook_tokens`: TransformerLens 3.9's `HookedTransformerConfig(use_hook_tokens=True)` hook point on the token ids.

The reference is TransformerLens 3.9 built from the same config with the same weights (its acceptance test
tests/acceptance/test_hook_tokens.py: replacing an id by a hook equals running the replaced ids) and plain
runs of the replaced ids; generation, the KV cache and sweeps are checked against those.
"""

import warnings

import pytest
import torch

import hooked
from hooked import ablate
from tests.transformer_lens.test_attn_only import tl_state_dict

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import transformer_lens

FIELDS = dict(
    n_layers=2, d_model=32, n_ctx=32, d_head=8, d_vocab=40, act_fn=None, attn_only=True, normalization_type="LN"
)


@pytest.fixture(scope="module")
def models():
    ours = hooked.HookedTransformer(hooked.HookedTransformerConfig(**FIELDS, use_hook_tokens=True, seed=0)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformer_lens.HookedTransformer(
            transformer_lens.HookedTransformerConfig(**FIELDS, use_hook_tokens=True, device="cpu")
        ).eval()
    theirs.load_state_dict(tl_state_dict(ours), strict=False)
    return ours, theirs


def tokens_of(batch=2, pos=7, seed=0):
    return torch.randint(1, FIELDS["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(seed))


def replace_first(new_id: int):
    def hook(tokens, hook):
        assert tokens.dtype == torch.long
        tokens[:, 0] = new_id  # in place, as TransformerLens' acceptance test does
        return tokens

    return hook


def test_the_point_exists_only_when_asked_for(models):
    ours, theirs = models
    assert ours.cfg.use_hook_tokens and list(ours.hook_dict)[0] == "hook_tokens" and "hook_tokens" in theirs.hook_dict
    assert ours.hook_shapes(batch=2, pos=5)["hook_tokens"] == (2, 5)
    plain = hooked.HookedTransformer(hooked.HookedTransformerConfig(**FIELDS))
    assert not plain.cfg.use_hook_tokens and "hook_tokens" not in plain.hook_dict
    with pytest.raises(KeyError, match="hook_tokens"):
        plain.run_with_hooks(tokens_of(), fwd_hooks=[("hook_tokens", lambda t, hook: t)])
    copy = hooked.HookedTransformer(ours.cfg)  # a family config builds the same model, hook_tokens included
    assert copy.cfg.use_hook_tokens and "hook_tokens" in copy.hook_dict
    gpt2 = hooked.HookedTransformer(
        hooked.HookedTransformerConfig(
            n_layers=1, d_model=32, d_head=8, n_ctx=16, d_vocab=40, act_fn="gelu_new", use_hook_tokens=True
        )
    )
    assert list(gpt2.hook_dict)[:3] == ["hook_tokens", "hook_embed", "hook_pos_embed"]


def test_replacing_ids_equals_transformer_lens_and_the_replaced_run(models):
    ours, theirs = models
    tokens = tokens_of()
    edited = tokens.clone()
    edited[:, 0] = 5
    ours_logits, ours_loss = ours.run_with_hooks(
        tokens, return_type="both", fwd_hooks=[("hook_tokens", replace_first(5))]
    )
    their_logits, their_loss = theirs.run_with_hooks(
        tokens.clone(), return_type="both", fwd_hooks=[("hook_tokens", replace_first(5))]
    )
    torch.testing.assert_close(ours_logits, their_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_logits, ours(edited))
    torch.testing.assert_close(ours_loss, their_loss, atol=1e-5, rtol=1e-5)

    # the loss's targets are the hook's ids, as TransformerLens' forward (position 0 is never a target: edit 3)
    def replace_third(tokens, hook):
        tokens[:, 3] = 5

    edited = tokens.clone()
    edited[:, 3] = 5
    ours_loss = ours.run_with_hooks(tokens, return_type="loss", fwd_hooks=[("hook_tokens", replace_third)])
    their_loss = theirs.run_with_hooks(tokens.clone(), return_type="loss", fwd_hooks=[("hook_tokens", replace_third)])
    torch.testing.assert_close(ours_loss, their_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_loss, ours(edited, return_type="loss"))
    assert tokens[0, 0] != 5  # the hook edited a copy, not the caller's ids


def test_cache_keeps_the_ids(models):
    ours, theirs = models
    tokens = tokens_of(seed=1)
    _, cache = ours.run_with_cache(tokens)
    _, their_cache = theirs.run_with_cache(tokens)
    assert list(cache)[0] == "hook_tokens" and torch.equal(cache["hook_tokens"], tokens)
    assert torch.equal(their_cache["hook_tokens"], tokens)
    # the full cache's keys are TransformerLens', in its order, less its unembed.hook_in / hook_out (documented)
    assert list(cache) == [name for name in their_cache if not name.startswith("unembed.")]
    _, only = ours.run_with_cache(tokens, names_filter="hook_tokens")
    assert list(only) == ["hook_tokens"]


def test_bad_replacements_are_refused(models):
    ours, _ = models
    tokens = tokens_of()
    cases = [
        (lambda t, hook: t.float(), "torch.float32"),
        (lambda t, hook: t[:, :-1], "shape"),
        (lambda t, hook: t.int(), "torch.int32"),
        (lambda t, hook: t + FIELDS["d_vocab"], "vocabulary of 40"),
        (lambda t, hook: t - 100, "token id -"),
    ]
    for hook, message in cases:
        with pytest.raises(ValueError, match=message):
            ours.run_with_hooks(tokens, fwd_hooks=[("hook_tokens", hook)])


def test_generation_hooks_each_steps_new_ids(models):
    ours, theirs = models
    prompt = tokens_of(2, 4, seed=2)
    seen = []
    out = ours.generate(
        prompt,
        max_new_tokens=3,
        do_sample=False,
        verbose=False,
        fwd_hooks=[("hook_tokens", lambda t, hook: seen.append(t.clone()))],
    )
    assert [tuple(t.shape) for t in seen] == [(2, 4), (2, 1), (2, 1)]  # with the KV cache: the prompt, then each new id
    assert torch.equal(torch.cat(seen, dim=1), out[:, :-1])
    seen.clear()
    ours.generate(
        prompt,
        max_new_tokens=3,
        do_sample=False,
        verbose=False,
        use_past_kv_cache=False,
        fwd_hooks=[("hook_tokens", lambda t, hook: seen.append(t.clone()))],
    )
    assert [tuple(t.shape) for t in seen] == [(2, 4), (2, 5), (2, 6)]  # without: the whole sequence each step

    # Replacing position 0's id, with and without the cache, equals TransformerLens' (a full forward per step).
    # With the cache a step's ids are its new columns, so the hook finds position 0 by `hook.position_ids`.
    def first_position(tokens, hook):
        tokens[hook.position_ids == 0] = 7

    replaced = [
        ours.generate(
            prompt,
            max_new_tokens=4,
            do_sample=False,
            verbose=False,
            use_past_kv_cache=kv,
            fwd_hooks=[("hook_tokens", first_position)],
        )
        for kv in (True, False)
    ]
    # The reference: greedy decoding by hand with TransformerLens' forward on the replaced ids (its generate
    # under model.hooks() continued as if unhooked here, measured, so it is not the reference)
    their_out = prompt
    with torch.no_grad():
        for _ in range(4):
            # a copy in: TransformerLens hands the caller's own tensor to the hook, which edits it in place
            logits = theirs.run_with_hooks(their_out.clone(), fwd_hooks=[("hook_tokens", replace_first(7))])
            their_out = torch.cat([their_out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    # Token ids: argmaxes of logits equal to float32 rounding; equal unless two logits nearly tie (not here)
    assert torch.equal(replaced[0], their_out) and torch.equal(replaced[1], their_out)
    assert not torch.equal(replaced[0], ours.generate(prompt, max_new_tokens=4, do_sample=False, verbose=False))


def test_kv_cache_calls_hook_their_own_columns(models):
    ours, _ = models
    tokens = tokens_of(1, 6, seed=3)
    cache = hooked.KVCache(ours, 1)
    seen = []
    with ours.hooks(fwd_hooks=[("hook_tokens", lambda t, hook: seen.append((t.clone(), hook.position_ids.clone())))]):
        ours(tokens[:, :4], past_kv_cache=cache)
        last = ours(tokens[:, 4:], past_kv_cache=cache)
    assert torch.equal(seen[1][0], tokens[:, 4:]) and seen[1][1].tolist() == [[4, 5]]
    torch.testing.assert_close(last, ours(tokens)[:, 4:], atol=1e-5, rtol=1e-5)


def test_sweep_and_start_at_layer_see_the_hook(models):
    ours, _ = models
    tokens = tokens_of(3, 6, seed=4)
    variants = {"first id 3": [("hook_tokens", replace_first(3))], "L1H0": ablate.hooks(ours, "L1H0")}

    def metric(logits, base_logits=None, attention_mask=None):
        return logits[:, -1, 2] - logits[:, -1, 9]

    result = hooked.sweep(ours, tokens, variants, metric, progress=False)
    with torch.no_grad():
        for name, pairs in variants.items():
            torch.testing.assert_close(
                result[name], metric(ours.run_with_hooks(tokens, fwd_hooks=pairs)), atol=2e-6, rtol=0
            )
    edited = tokens.clone()
    edited[:, 0] = 3
    with torch.no_grad(), ours.hooks(fwd_hooks=[("hook_tokens", replace_first(3))]):
        resid = ours(tokens, stop_at_layer=1)
    torch.testing.assert_close(resid, ours(edited, stop_at_layer=1))


def test_generation_cache_holds_the_ids_of_one_forward(models):
    ours, _ = models
    prompt = tokens_of(2, 4, seed=5)
    out, cache = ours.generate(prompt, max_new_tokens=3, do_sample=False, verbose=False, return_cache=True)
    _, whole = ours.run_with_cache(out)
    assert set(cache) == set(whole) and torch.equal(cache["hook_tokens"], out)
    for name in whole:
        torch.testing.assert_close(cache[name], whole[name], atol=1e-5, rtol=1e-5, msg=name)


def test_from_pretrained_takes_use_hook_tokens(gpt2_dir):
    """`HookedTransformer.from_pretrained(path, use_hook_tokens=True)`, as TransformerLens' from_pretrained passes the
    field to the config: a hook replacing an id gives what the replaced ids give, on a model without the hook."""
    model = hooked.HookedTransformer.from_pretrained(gpt2_dir, use_hook_tokens=True)
    plain = hooked.HookedTransformer.from_pretrained(gpt2_dir)
    assert next(iter(model.hook_dict)) == "hook_tokens" and "hook_tokens" not in plain.hook_dict
    tokens = torch.randint(1, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    replaced = tokens.clone()
    replaced[0, 2] = 7

    def replace(ids, hook):
        ids[0, 2] = 7
        return ids

    with torch.no_grad():
        torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=[("hook_tokens", replace)]), plain(replaced))
