"""Generation: greedy output against transformers' `generate`, the KV cache against full forwards, hooks
on every decode step, seeded sampling, variants as one batch, the cache of a generation, bad input.

The independent references: transformers' `generate(do_sample=False)` on the same checkpoint (GPT-2,
Qwen3, Qwen3-MoE; one prompt and left-padded batches), and a greedy loop of full forwards written
here, with the same hooks.

Token ids compare exactly (torch.equal) where the logits they are chosen from agree to float32 rounding (a KV
cache or another batch shape sums in another order): an id could differ only where the top two logits (or a
sampled draw and a step of the distribution) lie within that rounding, which these seeds avoid, and where the
property tests cannot rule it out they check the gap first.
"""

from __future__ import annotations

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate
from hooked.testing import ablatable_hook_names, empties_a_router, interventions, models, random_model
from hooked.testing import tokens as token_strategy
from tests.families.parity import build_checkpoint

VOCAB = 96
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def checkpoints(gpt2_dir, tmp_path_factory):
    """name -> (hooked model, transformers model) on the same files."""
    qwen3 = build_checkpoint(
        tmp_path_factory.mktemp("gen-qwen3"),
        transformers.Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=80,
            num_hidden_layers=2,
        ),
        transformers.Qwen3ForCausalLM,
        seed=3,
    )
    moe = build_checkpoint(
        tmp_path_factory.mktemp("gen-qwen3moe"),
        transformers.Qwen3MoeConfig(
            vocab_size=VOCAB,
            hidden_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_experts=6,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            norm_topk_prob=True,
        ),
        transformers.Qwen3MoeForCausalLM,
        seed=4,
    )
    pairs = {}
    for name, directory, hf_class in (
        ("gpt2", gpt2_dir, transformers.GPT2LMHeadModel),
        ("qwen3", qwen3, transformers.Qwen3ForCausalLM),
        ("qwen3_moe", moe, transformers.Qwen3MoeForCausalLM),
    ):
        hf = hf_class.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa").eval()
        pairs[name] = (hooked.load(directory), hf)
    return pairs


def prompts(model, batch: int, pos: int, padded: bool, seed: int = 0):
    """Token ids 1.. (0 is GPT-2's pad / eos id here) and a mask with left padding in rows 1.. when asked."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, min(model.cfg.d_vocab, VOCAB), (batch, pos), generator=generator)
    mask = torch.ones(batch, pos, dtype=torch.long)
    if padded:
        for row in range(1, batch):
            mask[row, : min(row * 2, pos - 1)] = 0
    return tokens, mask


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("batch,padded", [(1, False), (3, True)])
def test_greedy_equals_transformers_generate(checkpoints, arch, batch, padded):
    model, hf = checkpoints[arch]
    tokens, mask = prompts(model, batch, 7, padded, seed=batch)
    with torch.no_grad():
        reference = hf.generate(
            tokens, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ours = model.generate(tokens, 16, attention_mask=mask, stop_at_eos=False)
    assert torch.equal(ours, reference), (ours, reference)


@pytest.mark.parametrize("arch", ["gpt2", "qwen3_moe"])
def test_stopping_at_eos_equals_transformers(checkpoints, arch):
    model, hf = checkpoints[arch]
    tokens, mask = prompts(model, 3, 6, padded=True, seed=7)
    free = model.generate(tokens, 12, attention_mask=mask, stop_at_eos=False)
    eos = int(free[0, 6 + 3])  # row 0 emits it at step 3; the other rows may never
    ours = model.generate(tokens, 12, attention_mask=mask, eos_token_id=eos)
    with torch.no_grad():
        reference = hf.generate(
            tokens, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )
    assert torch.equal(ours, reference), (ours, reference)
    finished_at = (ours[0, 6:] == eos).nonzero()[0, 0]
    assert finished_at <= 3 and bool((ours[0, 6 + finished_at :] == eos).all())


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "qwen3_moe"])
def test_each_kv_cache_step_equals_a_full_forward(arch):
    model = random_model(arch, seed=1)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, :4] = False
    full = model(tokens, attention_mask=mask)
    cache = hooked.KVCache(model, batch_size=3, max_len=2)  # small: the buffers must grow, keeping what they hold
    parts = [model(tokens[:, :5], attention_mask=mask[:, :5], past_kv_cache=cache)]
    for column in range(5, 10):
        parts.append(model(tokens[:, column : column + 1], past_kv_cache=cache))
    parts.append(model(tokens[:, 10:], past_kv_cache=cache))  # two columns at once: a bottom-right causal mask
    assert len(cache) == 12 and cache.capacity >= 12
    stepped = torch.cat(parts, dim=1)
    real = mask[:, :, None].expand_as(full)
    torch.testing.assert_close(stepped[real], full[real], atol=2e-5, rtol=1e-5)


def test_a_failed_call_leaves_the_kv_cache_as_it_was():
    model = random_model("gpt2", seed=0)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6))
    cache = hooked.KVCache(model, batch_size=2)
    model(tokens[:, :4], past_kv_cache=cache)

    def boom(activation, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(tokens[:, 4:5], past_kv_cache=cache, fwd_hooks=[("blocks.1.hook_resid_post", boom)])
    assert len(cache) == 4
    rest = model(tokens[:, 4:], past_kv_cache=cache)
    torch.testing.assert_close(rest, model(tokens)[:, 4:], atol=2e-5, rtol=1e-5)


def greedy_loop(model, tokens, mask, new: int, fwd_hooks) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The reference: a full forward over the sequence so far for every new token, hooks on each."""
    sequence, logits_per_step = tokens, []
    with model.hooks(fwd_hooks=fwd_hooks):
        for _ in range(new):
            full_mask = torch.cat(
                [mask, torch.ones(mask.shape[0], sequence.shape[1] - mask.shape[1], dtype=mask.dtype)], 1
            )
            logits = model(sequence, attention_mask=full_mask)[:, -1]
            logits_per_step.append(logits)
            sequence = torch.cat([sequence, logits.argmax(-1, keepdim=True)], dim=1)
    return sequence, logits_per_step


def test_position_ablation_fires_only_where_its_position_is():
    model = random_model("gpt2", seed=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(2))
    seen = []

    def spy(activation, hook):
        seen.append((hook.position_ids.tolist(), hook.rows.start))

    hooks = [("blocks.0.attn.hook_z", ablate.zero(heads=1, positions=[6])), ("blocks.0.hook_resid_pre", spy)]
    out = model.generate(tokens, 4, stop_at_eos=False, fwd_hooks=hooks)
    assert [start for _, start in seen] == [0, 5, 6, 7]  # the prompt, then one column per step
    assert seen[2][0] == [[6], [6]]

    def zero_column_6(z, hook):  # by hand: unpadded, column 6 is position 6 (a full forward has no position 6 before)
        if z.shape[1] > 6:
            z[:, 6, 1] = 0.0

    reference, _ = greedy_loop(model, tokens, torch.ones_like(tokens), 4, [("blocks.0.attn.hook_z", zero_column_6)])
    assert torch.equal(out, reference)
    assert not torch.equal(out, model.generate(tokens, 4, stop_at_eos=False))  # position 6 mattered


def test_negative_positions_count_from_the_end_of_the_prompt():
    model = random_model("qwen3", seed=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(3))
    written = []

    def record(activation, hook):
        written.append(hook.position_ids.tolist())

    class Spy(ablate.Zero):
        def replacement(self, activation, hook):
            record(activation, hook)
            return super().replacement(activation, hook)

    out = model.generate(tokens, 3, stop_at_eos=False, fwd_hooks=[("blocks.1.hook_mlp_out", Spy(positions=-1))])
    assert written == [[[0, 1, 2, 3, 4]] * 2]  # the prompt's call only: -1 is position 4 on every step
    explicit = model.generate(
        tokens, 3, stop_at_eos=False, fwd_hooks=[("blocks.1.hook_mlp_out", ablate.zero(positions=4))]
    )
    assert torch.equal(out, explicit)


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_generating_with_hooks_equals_a_greedy_loop_of_full_forwards(data):
    model = data.draw(models())
    padded = data.draw(st.booleans())
    tokens = data.draw(token_strategy(model, min_batch=2, max_batch=3, min_pos=2, max_pos=6))
    mask = torch.ones_like(tokens)
    if padded:
        mask[1:, : tokens.shape[1] // 2] = 0
    new = data.draw(st.integers(1, 4))
    reference_tokens = data.draw(
        token_strategy(model, min_batch=2, max_batch=2, min_pos=tokens.shape[1] + new, max_pos=tokens.shape[1] + new)
    )
    _, cache = model.run_with_cache(reference_tokens)  # a mean reference covering every generated position
    # Attention scores and patterns are left out: zeroing a score also unmasks future keys, which a
    # forward over the whole sequence sees and a decode step cannot (docs/generation.md).
    local = [name for name in ablatable_hook_names(model) if "key_pos" not in model.hook_dict[name].axes]
    # Positions in every prompt, counted from its start: the loop of full forwards counts -1 from each
    # sequence's end, and has no position past the prompt until that token is generated (it raises).
    shortest = int(mask.sum(-1).min())
    nonnegative = lambda pair: not any(p < 0 for p in (pair[1].positions or ()))  # noqa: E731
    pool = [
        interventions(model, cache, methods=["zero", "mean"], names=local, max_pos=shortest).filter(nonnegative),
        interventions(model, methods=["zero"], names=local, max_pos=shortest).filter(nonnegative),
    ]
    if not padded:
        pool.append(
            interventions(model, methods=["resample"], within_batch=True, names=local, max_pos=shortest).filter(
                nonnegative
            )
        )
    fwd_hooks = data.draw(st.lists(st.one_of(pool), min_size=1, max_size=3))
    assume(not empties_a_router(model, fwd_hooks))
    out = model.generate(tokens, new, attention_mask=mask, stop_at_eos=False, fwd_hooks=fwd_hooks)
    _, step_logits = greedy_loop(model, tokens, mask, new, fwd_hooks)
    # Teacher-forced on generate's own tokens, each of them is the loop's greedy choice (exact unless the
    # top two logits tie within float32 rounding).
    _, forced_logits = greedy_loop_on(model, out, mask, new, fwd_hooks)
    for step, logits in enumerate(forced_logits):
        chosen = out[:, tokens.shape[1] + step]
        best = logits.max(-1).values
        assert bool((logits.gather(-1, chosen[:, None])[:, 0] >= best - 1e-4 * (1 + best.abs())).all()), step
    if all(bool(((s.topk(2).values[:, 0] - s.topk(2).values[:, 1]) > 1e-3).all()) for s in step_logits):
        reference, _ = greedy_loop(model, tokens, mask, new, fwd_hooks)
        assert torch.equal(out, reference)
        # without the cache, full forwards of other shapes: the same ids where no two logits nearly tie
        assert torch.equal(
            out,
            model.generate(
                tokens, new, attention_mask=mask, stop_at_eos=False, fwd_hooks=fwd_hooks, use_past_kv_cache=False
            ),
        )


def greedy_loop_on(model, sequence, mask, new: int, fwd_hooks):
    """Full forwards over each prefix of `sequence` (the loop's logits at generate's own tokens)."""
    prompt_len = sequence.shape[1] - new
    logits_per_step = []
    with model.hooks(fwd_hooks=fwd_hooks):
        for step in range(new):
            prefix = sequence[:, : prompt_len + step]
            full_mask = torch.cat([mask, torch.ones(mask.shape[0], step, dtype=mask.dtype)], 1)
            logits_per_step.append(model(prefix, attention_mask=full_mask)[:, -1])
    return sequence, logits_per_step


@pytest.mark.parametrize("arch", ["gpt2", "qwen3_moe"])
def test_seeded_sampling_is_reproducible_and_follows_its_parameters(arch):
    model = random_model(arch, seed=5)
    tokens = torch.randint(0, model.cfg.d_vocab, (4, 5), generator=torch.Generator().manual_seed(5))
    kwargs = dict(do_sample=True, temperature=0.9, top_k=5, top_p=0.8, stop_at_eos=False)
    first = model.generate(tokens, 10, seed=11, **kwargs)
    assert torch.equal(first, model.generate(tokens, 10, seed=11, **kwargs))
    assert not torch.equal(first, model.generate(tokens, 10, seed=12, **kwargs))
    # top_k=1 is greedy whatever the draws
    assert torch.equal(
        model.generate(tokens, 6, do_sample=True, top_k=1, seed=3, stop_at_eos=False),
        model.generate(tokens, 6, stop_at_eos=False),
    )
    # every sampled token is among the top_k of the full forward over its prefix
    logits = model(first)[:, 4:-1]
    top5 = logits.topk(5, dim=-1).indices
    assert bool((top5 == first[:, 5:, None]).any(-1).all())


def test_sampling_draws_follow_the_distribution():
    model = random_model("gpt2", seed=6)
    tokens = torch.randint(0, model.cfg.d_vocab, (1, 4), generator=torch.Generator().manual_seed(6)).repeat(4000, 1)
    drawn = model.generate(tokens, 1, do_sample=True, temperature=1.3, seed=0, stop_at_eos=False)[:, -1]
    expected = torch.softmax(model(tokens[:1])[0, -1] / 1.3, -1)
    observed = torch.bincount(drawn, minlength=model.cfg.d_vocab).float() / len(drawn)
    assert (observed - expected).abs().max() < 0.03  # 4000 draws: a standard error of at most 0.008


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("sample", [False, True])
def test_variants_generated_as_one_batch_equal_each_alone(arch, sample):
    model = random_model(arch, seed=7)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    variants = {
        "clean": [],
        "L0H1": ablate.hooks(model, "L0H1"),
        "L1.mlp@2": ablate.hooks(model, "L1.mlp@2"),
        "L0.attn@6": ablate.hooks(model, "L0.attn@6"),  # a generated position
    }
    kwargs = dict(do_sample=True, seed=4, temperature=1.5) if sample else {}
    eos = int(model.generate(tokens, 8, attention_mask=mask, stop_at_eos=False, **kwargs)[0, 7])
    together = hooked.generate_variants(model, tokens, variants, 8, attention_mask=mask, eos_token_id=eos, **kwargs)
    assert list(together) == list(variants)
    for name, hooks in variants.items():
        alone = model.generate(tokens, 8, attention_mask=mask, eos_token_id=eos, fwd_hooks=hooks, **kwargs)
        assert torch.equal(together[name], alone), name
    if not sample:  # the ablations matter (under sampling, shared draws may hide a small change)
        assert len({tuple(output.flatten().tolist()) for output in together.values()}) > 1


def test_one_variant_generated_alone_equals_generate_with_its_hooks():
    model = random_model("qwen3", seed=7)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(8))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    hooks = ablate.hooks(model, "L0H1")
    (output,) = hooked.generate_variants(model, tokens, {"L0H1": hooks}, 6, attention_mask=mask).values()
    # token ids: one variant's rows are generate's rows (the same batch, the same forward, the same kernels in the
    # same order), so the same argmax at every step
    assert torch.equal(output, model.generate(tokens, 6, attention_mask=mask, fwd_hooks=hooks))


@pytest.mark.parametrize("arch", ["gpt2", "qwen3_moe"])
def test_cache_of_a_generation_equals_one_forward_over_the_final_sequence(arch):
    model = random_model(arch, seed=8)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(8))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    out, cache = model.generate(tokens, 4, attention_mask=mask, stop_at_eos=False, return_cache=True)
    full_mask = torch.cat([mask, torch.ones(2, 4, dtype=torch.bool)], 1)
    _, full = model.run_with_cache(out, attention_mask=full_mask)
    assert set(cache.keys()) == set(full.keys())
    for name in full.keys():
        assert cache[name].shape == full[name].shape, name
        torch.testing.assert_close(cache[name].float(), full[name].float(), atol=2e-5, rtol=1e-5, msg=name)
    assert torch.equal(cache.attention_mask, full.attention_mask)
    assert torch.equal(cache.position_ids, full.position_ids)
    only = model.generate(
        tokens, 4, attention_mask=mask, stop_at_eos=False, return_cache=True, names_filter="blocks.1.hook_resid_post"
    )[1]
    assert list(only.keys()) == ["blocks.1.hook_resid_post"]


def test_text_in_text_out(gpt2):
    prompt = "When Mary and John went to the store"
    text = gpt2.generate(prompt, 5)
    assert isinstance(text, str) and text.startswith(prompt)
    tokens = gpt2.generate(prompt, 5, return_type="tokens", stop_at_eos=False)
    assert tokens.shape == (1, len(gpt2.to_tokens(prompt)[0]) + 5)
    batch = gpt2.generate([prompt, "Hi"], 3, verbose=True)
    assert isinstance(batch, list) and len(batch) == 2 and batch[1].startswith("Hi")


@pytest.mark.unchecked
@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0"),
        (dict(max_new_tokens=60), "at most"),  # the tiny GPT-2 has 64 positions
        (dict(temperature=0.5), "do_sample=True"),
        (dict(do_sample=True, temperature=-1.0), "temperature must be"),
        (dict(do_sample=True, top_k=0), "top_k must be"),
        (dict(do_sample=True, top_p=1.5), "top_p must be"),
        (dict(return_type="logits"), "return_type must be"),
        (dict(eos_token_id=10**6), "eos_token_id must be"),
    ],
)
def test_bad_arguments_are_refused_before_generating(gpt2, kwargs, message):
    tokens = torch.randint(1, gpt2.cfg.d_vocab, (1, 8))
    with pytest.raises(ValueError, match=message):
        gpt2.generate(tokens, **{"max_new_tokens": 4, **kwargs})


def test_an_empty_batch_is_refused(gpt2):
    with pytest.raises(ValueError, match="empty input"):
        gpt2.generate(torch.zeros(0, 4, dtype=torch.long), 3)
    with pytest.raises(TypeError, match="empty list"):
        gpt2.generate([], 3)


def test_a_hook_that_changes_a_decode_steps_shape_is_named_and_removed(gpt2):
    tokens = torch.randint(1, gpt2.cfg.d_vocab, (2, 6))

    def widen(activation, hook):
        if activation.shape[1] == 1:  # fine on the prompt, wrong on a decode step
            return torch.cat([activation, activation], dim=1)

    with pytest.raises(ValueError, match="keep the shape") as raised:
        gpt2.generate(tokens, 3, fwd_hooks=[("blocks.0.hook_mlp_out", widen)])
    assert "decode step 1" in "".join(getattr(raised.value, "__notes__", []))
    assert not any(point.listening for point in gpt2.hook_dict.values())


def test_what_generation_leaves_behind_works_with_gradients():
    """Generation runs under torch.inference_mode; its tokens and the references an ablation computed
    during it must still serve a later forward that records gradients."""
    model = random_model("gpt2", seed=9)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 4), generator=torch.Generator().manual_seed(9))
    reference = torch.randint(0, model.cfg.d_vocab, (3, 6), generator=torch.Generator().manual_seed(10))
    hooks = [("blocks.0.hook_mlp_out", ablate.mean(reference, model=model, per_position=True))]
    out = model.generate(tokens, 2, stop_at_eos=False, fwd_hooks=hooks)
    loss = model.run_with_hooks(out, fwd_hooks=hooks, return_type="loss")
    loss.backward()
    assert model.wte.weight.grad is not None


def test_hooks_fire_on_every_call_whichever_way_they_were_registered():
    model = random_model("qwen3", seed=11)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 4), generator=torch.Generator().manual_seed(11))
    calls = {"context": [], "add_hook": [], "fwd_hooks": []}

    def counter(route):
        def record(activation, hook):
            calls[route].append(activation.shape[1])

        return record

    model.add_hook("blocks.0.attn.hook_z", counter("add_hook"))
    try:
        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", counter("context"))]):
            model.generate(tokens, 3, stop_at_eos=False, fwd_hooks=[("blocks.0.mlp.hook_post", counter("fwd_hooks"))])
    finally:
        model.reset_hooks()
    assert calls == {route: [4, 1, 1] for route in calls}  # the prompt, then one column per decode step
    assert not any(point.listening for point in model.hook_dict.values())
