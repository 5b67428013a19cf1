"""`positions=`: one position per prompt (a 1-D tensor, `ablate.per_prompt`) against a set for every
prompt (an int or a list), and positions a prompt does not have.

The references run each prompt alone with a hook written by hand that indexes z[:, pos], so they do not
go through `hooked.ablate`'s selection at all.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate, metrics, patch, tasks
from hooked.interventions.row_blocks import VariantError


def padded_batch(model, lengths, pos, seed):
    """Token ids [batch pos], left-padded to `pos`, and the mask (True = real token)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, model.cfg.d_vocab, (len(lengths), pos), generator=generator)
    mask = torch.arange(pos)[None] >= torch.tensor([pos - n for n in lengths])[:, None]
    return tokens, mask


def write_at(values: torch.Tensor, position: int, head: int):
    """A hand-written hook: z[:, position, head] = values (one prompt alone, unpadded)."""

    def hook(z, hook):
        z[:, position, head] = values

    return hook


def each_prompt_alone(model, tokens, mask, position_of, name, head, source_tokens=None):
    """Logits of each prompt run alone, with z[:, its position, head] replaced (zero, or the source prompt's)."""
    rows = []
    for row in range(tokens.shape[0]):
        real = tokens[row, mask[row]][None]
        position = position_of[row] % real.shape[1]  # negative: from the prompt's end
        if source_tokens is None:
            value = torch.zeros(())
        else:
            _, cache = model.run_with_cache(source_tokens[row, mask[row]][None], names_filter=[name])
            value = cache[name][:, position, head]
        rows.append(model.run_with_hooks(real, fwd_hooks=[(name, write_at(value, position, head))])[0])
    return rows


# ----------------------------------------------------------------------------- one position per prompt
@pytest.mark.parametrize("form", ["tensor", "per_prompt"])
def test_a_per_prompt_patch_equals_each_prompt_alone_at_its_own_position(gpt2, form):
    lengths, positions = [7, 4, 6, 5], [5, 0, -1, 2]
    corrupt, mask = padded_batch(gpt2, lengths, 7, seed=0)
    clean, _ = padded_batch(gpt2, lengths, 7, seed=1)
    given = torch.tensor(positions) if form == "tensor" else ablate.per_prompt(positions)
    name = "blocks.0.attn.hook_z"
    with torch.no_grad():
        _, clean_cache = gpt2.run_with_cache(clean, attention_mask=mask, names_filter=[name])
        batch = gpt2.run_with_hooks(
            corrupt, attention_mask=mask, fwd_hooks=[(name, patch.activation(clean_cache, heads=2, positions=given))]
        )
        alone = each_prompt_alone(gpt2, corrupt, mask, positions, name, 2, source_tokens=clean)
        for row, logits in enumerate(alone):
            torch.testing.assert_close(batch[row, mask[row]], logits, atol=1e-5, rtol=1e-5)
        # and it is not the set meaning: the same positions as a list would patch all four in every prompt
        as_set = gpt2.run_with_hooks(
            corrupt, attention_mask=mask, fwd_hooks=[(name, patch.activation(clean_cache, heads=2, positions=[0, 2]))]
        )
        assert not torch.allclose(as_set[0, mask[0]], alone[0], atol=1e-4)


def test_per_prompt_zero_through_addresses_and_a_sweep(gpt2):
    """ablate.hooks(positions=...), a sweep's row blocks and run_with_hooks all agree with the loop."""
    lengths, positions = [6, 6, 3], torch.tensor([4, -2, 1])
    tokens, mask = padded_batch(gpt2, lengths, 6, seed=2)
    name = "blocks.1.attn.hook_z"
    with torch.no_grad():
        hooks = ablate.hooks(gpt2, ["L1H3"], "zero", positions=positions)
        assert repr(hooks[0][1]) == "zero(heads=[3], positions=per_prompt[4, -2, 1])"
        batch = gpt2.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=hooks)
        alone = each_prompt_alone(gpt2, tokens, mask, positions.tolist(), name, 3)
        for row, logits in enumerate(alone):
            torch.testing.assert_close(batch[row, mask[row]], logits, atol=1e-5, rtol=1e-5)
        metric = metrics.kl_div()
        variants = {
            "set": ablate.hooks(gpt2, "L1H3@1", "zero"),
            "per_prompt": hooks,
            "other": ablate.hooks(gpt2, "L0H0", "zero"),
        }
        result = hooked.sweep(gpt2, tokens, variants, metric, attention_mask=mask, max_rows=6)
        base = gpt2(tokens, attention_mask=mask)
        torch.testing.assert_close(
            result["per_prompt"], metric(batch, base_logits=base, attention_mask=mask), atol=1e-5, rtol=1e-5
        )


def test_per_prompt_positions_while_generating(gpt2):
    """Decode steps compute other columns: position p of prompt i is written once, on the prompt's call."""
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (3, 6), generator=torch.Generator().manual_seed(3))
    pad = gpt2.tokenizer.pad_token_id
    tokens[tokens == pad] = (pad + 1) % gpt2.cfg.d_vocab  # unpadded prompts: no row begins with the pad id
    positions = [1, 5, -3]
    name = "blocks.0.attn.hook_z"
    out = gpt2.generate(
        tokens, 4, stop_at_eos=False, fwd_hooks=[(name, ablate.zero(heads=1, positions=torch.tensor(positions)))]
    )

    def by_hand(z, hook):  # unpadded: column = position, counted from the prompt (6 tokens)
        if z.shape[1] >= 6:
            for row, position in enumerate(positions):
                z[row, position % 6, 1] = 0.0

    sequence = tokens
    with torch.no_grad(), gpt2.hooks(fwd_hooks=[(name, by_hand)]):
        for _ in range(4):
            sequence = torch.cat([sequence, gpt2(sequence)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, sequence)


# ----------------------------------------------------------------------------- what is refused
def test_a_vector_of_another_length_names_both_numbers(gpt2):
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (3, 5))
    with pytest.raises(ValueError, match="gives 2 positions, one per prompt, but this forward runs 3 prompts"):
        gpt2.run_with_hooks(
            tokens, fwd_hooks=[("blocks.0.attn.hook_z", ablate.zero(heads=0, positions=torch.tensor([1, 2])))]
        )
    with pytest.raises(VariantError, match="gives 2 positions, one per prompt, but this forward runs 3 prompts"):
        hooked.sweep(gpt2, tokens, {"v": ablate.hooks(gpt2, "L0H0", positions=torch.tensor([1, 2]))}, metrics.kl_div())


def test_positions_a_prompt_does_not_have_raise_with_the_lengths(gpt2):
    tokens, mask = padded_batch(gpt2, [8, 5], 8, seed=4)
    for position in (100, -9, [1, 7]):
        with pytest.raises(
            ValueError, match=r"does not exist in prompt \d, which has \d tokens \(prompt lengths: \[8, 5\]\)"
        ):
            gpt2.run_with_hooks(
                tokens, attention_mask=mask, fwd_hooks=[("blocks.0.hook_resid_post", ablate.zero(positions=position))]
            )
    with pytest.raises(ValueError, match="position 5 does not exist in prompt 1, which has 5 tokens"):
        gpt2.run_with_hooks(
            tokens, attention_mask=mask, fwd_hooks=ablate.hooks(gpt2, "L0H1", positions=torch.tensor([5, 5]))
        )
    with pytest.raises(ValueError, match="position 99 does not exist"):
        gpt2.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=ablate.hooks(gpt2, "L1H2@99"))
    with pytest.raises(VariantError, match="position 99 does not exist"):
        hooked.sweep(gpt2, tokens, {"L1H2@99": ablate.hooks(gpt2, "L1H2@99")}, metrics.kl_div(), attention_mask=mask)
    # while generating, a position past the prompt is a generated token; one before its start is not
    with pytest.raises(ValueError, match="position -9 does not exist"):
        gpt2.generate(
            tokens[:1], 2, stop_at_eos=False, fwd_hooks=[("blocks.0.hook_resid_post", ablate.zero(positions=-9))]
        )
    gpt2.generate(tokens[:1], 2, stop_at_eos=False, fwd_hooks=[("blocks.0.hook_resid_post", ablate.zero(positions=9))])


@pytest.mark.unchecked
def test_bad_position_forms_are_refused_when_made(gpt2):
    with pytest.raises(ValueError, match=r"tensor of shape \[2, 3\]; give one position per prompt as a 1-D"):
        ablate.zero(positions=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="1-D integer tensor"):
        ablate.zero(positions=torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="one position per prompt"):
        ablate.per_prompt(3)
    with pytest.raises(TypeError, match="one int position per prompt"):
        ablate.per_prompt([])
    with pytest.raises(ValueError, match="names its position"):
        ablate.hooks(gpt2, "L0H0@1", positions=torch.tensor([1, 2]))


def test_a_list_keeps_its_meaning_a_set_for_every_prompt(gpt2):
    """A list as long as the batch is still a set: [1, 3] on 2 prompts selects 1 and 3 in both."""
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(5))
    seen = {}

    def read(activation, hook):
        seen["value"] = activation.clone()

    def zeroed(positions):
        with torch.no_grad():
            gpt2.run_with_hooks(
                tokens,
                fwd_hooks=[
                    ("blocks.0.hook_resid_post", ablate.zero(positions=positions)),
                    ("blocks.0.hook_resid_post", read),
                ],
            )
        return (seen["value"] == 0).all(-1)

    expected = torch.zeros(2, 6, dtype=torch.bool)
    expected[:, [1, 3]] = True
    assert torch.equal(zeroed([1, 3]), expected)
    assert torch.equal(zeroed((1, 3)), expected)
    assert torch.equal(zeroed(torch.tensor(3)), expected & torch.tensor([False, False, False, True, False, False]))
    per_prompt = torch.zeros(2, 6, dtype=torch.bool)
    per_prompt[0, 1] = per_prompt[1, 3] = True
    assert torch.equal(zeroed(torch.tensor([1, 3])), per_prompt)
    assert torch.equal(zeroed(ablate.per_prompt([1, 3])), per_prompt)


def test_per_prompt_positions_read_clearly_and_survive_provenance(gpt2):
    long = ablate.zero(heads=[9], positions=torch.arange(20))
    assert repr(long) == "zero(heads=[9], positions=per_prompt[0, 1, 2, 3, 4, 5, 6, 7, ... (20 prompts)])"
    assert long == ablate.zero(heads=9, positions=ablate.per_prompt(list(range(20))))  # a value, like the others
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(6))
    corrupt = torch.randint(0, gpt2.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(7))
    result = patch.head_sweep(gpt2, corrupt, tokens, metrics.kl_div(), positions=torch.tensor([3, -1]))
    saved = json.loads(json.dumps(result.to_dict()))
    assert saved["provenance"]["patch"]["positions"] == {"per_prompt": [3, -1]}
    assert saved["provenance"]["variants"]["L1H2"] == [
        "blocks.1.attn.hook_z: patch(source=<cache of 2 prompts>, heads=[2], positions=per_prompt[3, -1])"
    ]


def test_a_residual_grid_takes_per_prompt_positions_by_name(gpt2):
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(8))
    corrupt = torch.randint(0, gpt2.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(9))
    metric = metrics.kl_div()
    with pytest.raises(ValueError, match="name it"):
        patch.resid_sweep(gpt2, corrupt, tokens, metric, positions=torch.tensor([1, 2]))
    result = patch.resid_sweep(gpt2, corrupt, tokens, metric, positions={"A": torch.tensor([1, 2]), "last": -1})
    assert result.variants == ["L0@A", "L0@last", "L1@A", "L1@last"]
    assert result.provenance["patch"]["positions"] == {"A": {"per_prompt": [1, 2]}, "last": [-1]}
    with torch.no_grad():
        _, cache = gpt2.run_with_cache(tokens)
        logits = gpt2.run_with_hooks(
            corrupt,
            fwd_hooks=[("blocks.1.hook_resid_pre", patch.activation(cache, positions=ablate.per_prompt([1, 2])))],
        )
        torch.testing.assert_close(result["L1@A"], metric(logits, base_logits=gpt2(corrupt)), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- tasks know their positions
def test_task_positions_plug_into_a_per_prompt_patch():
    """Patch S2 of each IOI prompt (mixed templates: a left-padded batch) == each prompt alone by hand."""
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(8, seed=1, model=model)
    clean, mask = model.tokenizer(task.clean, return_tensors="pt").values()
    corrupt, corrupt_mask = model.tokenizer(task.corrupt, return_tensors="pt").values()
    mask = mask.bool()
    assert not mask.all() and torch.equal(mask, corrupt_mask.bool())  # padded; swap: the same token layout
    name, head = "blocks.2.attn.hook_z", 1
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(task.clean, names_filter=[name])
        batch = model.run_with_hooks(
            task.corrupt, fwd_hooks=[(name, patch.activation(clean_cache, heads=head, positions=task.positions["S2"]))]
        )
        alone = each_prompt_alone(model, corrupt, mask, task.positions["S2"].tolist(), name, head, source_tokens=clean)
    for row, logits in enumerate(alone):
        torch.testing.assert_close(batch[row, mask[row]], logits, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- properties
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_per_prompt_positions_equal_each_prompt_alone_or_raise(gpt2, data):
    """For any left-padded batch and any [batch] position tensor: either every position exists in its
    prompt and the batched zero equals each prompt alone at its own position, or it raises naming the lengths."""
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4), label="lengths")
    positions = data.draw(st.lists(st.integers(-8, 8), min_size=len(lengths), max_size=len(lengths)), label="positions")
    tokens, mask = padded_batch(gpt2, lengths, max(lengths), seed=data.draw(st.integers(0, 5), label="seed"))
    name, head = "blocks.1.attn.hook_z", data.draw(st.integers(0, gpt2.cfg.n_heads - 1), label="head")
    hook = ablate.zero(heads=head, positions=torch.tensor(positions))
    with torch.no_grad():
        if any(not -n <= p < n for p, n in zip(positions, lengths, strict=True)):
            with pytest.raises(ValueError, match=r"does not exist in prompt \d+, which has \d+ tokens"):
                gpt2.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[(name, hook)])
            return
        batch = gpt2.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[(name, hook)])
        for row, logits in enumerate(each_prompt_alone(gpt2, tokens, mask, positions, name, head)):
            torch.testing.assert_close(batch[row, mask[row]], logits, atol=1e-5, rtol=1e-5)
