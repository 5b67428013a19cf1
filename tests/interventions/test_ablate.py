"""Ablation callbacks: what each writes, checked against explicit computations on the weights or on
cached activations, and the errors bad selectors and references get before any forward runs.

What an ablation writes (zeros, a cached activation, another row of the batch) is a copy, and the entries it
leaves come from the same forward on the same input as the clean run's: both compare exactly (torch.equal).
"""

from __future__ import annotations

import copy

import pytest
import torch

import hooked
from hooked import ablate


def tokens_of(model, batch=3, pos=7, seed=0):
    """Random unpadded ids: never the pad id, which at a row's end would read as right padding (refused unmasked)."""
    ids = torch.randint(0, model.cfg.d_vocab - 1, (batch, pos), generator=torch.Generator().manual_seed(seed))
    pad = model.tokenizer.pad_token_id if model.tokenizer is not None else None
    return ids if pad is None else ids + (ids >= pad).long()


def after_hook(model, tokens, name, callback, **kwargs):
    """The activation at `name` as the rest of the forward sees it, after `callback`."""
    seen = {}

    def read(activation, hook):
        seen["value"] = activation.detach().clone()

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(name, callback), (name, read)], **kwargs)
    return seen["value"]


def test_zero_head_equals_zeroing_its_rows_of_the_output_projection(gpt2):
    tokens = tokens_of(gpt2)
    d_head = gpt2.cfg.d_head
    with torch.no_grad():
        ablated = gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", ablate.zero(heads=2))])
        edited = copy.deepcopy(gpt2)
        edited.blocks[1].attn.c_proj.weight[2 * d_head : 3 * d_head] = 0  # Conv1D: [in, out]
        expected = edited(tokens)
        assert torch.allclose(ablated, expected, atol=1e-5)
        assert not torch.allclose(ablated, gpt2(tokens), atol=1e-3)  # the head mattered


def test_zero_neuron_equals_zeroing_its_row_of_the_down_projection(gpt2):
    tokens = tokens_of(gpt2)
    with torch.no_grad():
        ablated = gpt2.run_with_hooks(tokens, fwd_hooks=ablate.hooks(gpt2, ["L0.N5", "L0.N17"], "zero"))
        edited = copy.deepcopy(gpt2)
        edited.blocks[0].mlp.c_proj.weight[[5, 17]] = 0
        assert torch.allclose(ablated, edited(tokens), atol=1e-5)


def test_positions_are_positions_in_the_prompt_not_padded_columns(gpt2):
    """A left-padded row ablates the same token as the prompt alone, for positive and negative positions."""
    long, short = tokens_of(gpt2, 1, 8, seed=1)[0], tokens_of(gpt2, 1, 5, seed=2)[0]
    padded = torch.zeros(2, 8, dtype=torch.long)
    padded[0], padded[1, 3:] = long, short
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :3] = False
    for position in (0, 2, -1, -3):
        callback = ablate.zero(heads=[0, 3], positions=position)
        with torch.no_grad():
            batch = gpt2.run_with_hooks(padded, attention_mask=mask, fwd_hooks=[("blocks.0.attn.hook_z", callback)])
            alone = gpt2.run_with_hooks(short[None], fwd_hooks=[("blocks.0.attn.hook_z", callback)])
            untouched = gpt2(short[None])
        assert torch.allclose(batch[1, 3:], alone[0], atol=1e-5), position
        assert not torch.allclose(alone, untouched, atol=1e-4), position


def test_positions_select_exactly_those_tokens(gpt2):
    tokens = tokens_of(gpt2)
    value = after_hook(gpt2, tokens, "blocks.0.hook_resid_post", ablate.zero(positions=[1, -1]))
    clean = after_hook(gpt2, tokens, "blocks.0.hook_resid_post", lambda x, hook: None)
    zeroed = (value == 0).all(-1)  # [batch pos]
    expected = torch.zeros_like(zeroed)
    expected[:, [1, -1]] = True
    assert torch.equal(zeroed, expected)
    assert torch.equal(value[:, [0, 2, 3, 4, 5]], clean[:, [0, 2, 3, 4, 5]])


def test_mean_pooled_is_the_mean_over_real_tokens_of_the_reference(gpt2):
    reference = gpt2.to_tokens(["When Mary and John went to the store", "The capital of France is Paris"])
    _, cache = gpt2.run_with_cache(reference)
    assert cache.attention_mask is not None and not bool(cache.attention_mask.all())  # padded: the test's point
    z = cache["z", 1]  # [batch pos head d_head]
    real = cache.attention_mask
    expected = z[real].mean(0)[2]  # head 2, over real tokens only
    tokens = tokens_of(gpt2)
    value = after_hook(gpt2, tokens, "blocks.1.attn.hook_z", ablate.mean(cache, heads=2))
    clean = after_hook(gpt2, tokens, "blocks.1.attn.hook_z", lambda x, hook: None)
    assert torch.allclose(value[:, :, 2], expected.expand_as(value[:, :, 2]), atol=1e-6)
    assert torch.equal(value[:, :, [0, 1, 3]], clean[:, :, [0, 1, 3]])
    assert not torch.allclose(z.mean((0, 1))[2], expected, atol=1e-4)  # counting padding would differ


def test_mean_per_position_averages_each_prompt_position(gpt2):
    reference = gpt2.to_tokens(["When Mary and John went to the store", "The capital of France is Paris"])
    _, cache = gpt2.run_with_cache(reference)
    mlp_out, positions, real = cache["mlp_out", 0], cache.position_ids, cache.attention_mask
    tokens = tokens_of(gpt2, 2, 4)
    value = after_hook(gpt2, tokens, "blocks.0.hook_mlp_out", ablate.mean(cache, per_position=True))
    for position in range(4):
        rows = [
            mlp_out[b, c]
            for b in range(2)
            for c in range(reference.shape[1])
            if real[b, c] and positions[b, c] == position
        ]
        expected = torch.stack(rows).mean(0)
        assert torch.allclose(value[:, position], expected.expand(2, -1), atol=1e-6)


def test_mean_from_tokens_runs_the_reference_once_without_hooks(gpt2):
    reference = tokens_of(gpt2, 4, 6, seed=3)
    tokens = tokens_of(gpt2)
    _, cache = gpt2.run_with_cache(reference)
    from_cache = after_hook(gpt2, tokens, "blocks.1.attn.hook_z", ablate.mean(cache, heads=1))
    from_tokens = after_hook(gpt2, tokens, "blocks.1.attn.hook_z", ablate.mean(reference, heads=1, model=gpt2))
    assert torch.allclose(from_cache, from_tokens, atol=1e-6)
    with torch.no_grad():
        via_hooks = gpt2.run_with_hooks(tokens, fwd_hooks=ablate.hooks(gpt2, "L1H1", "mean", reference=reference))
        via_cache = gpt2.run_with_hooks(tokens, fwd_hooks=ablate.hooks(gpt2, "L1H1", "mean", reference=cache))
    assert torch.allclose(via_hooks, via_cache, atol=1e-6)
    with pytest.raises(ValueError, match="no model"):
        after_hook(gpt2, tokens, "blocks.1.attn.hook_z", ablate.mean(reference, heads=1))


def test_resample_writes_the_source_at_the_same_place(gpt2):
    tokens, source = tokens_of(gpt2), tokens_of(gpt2, seed=5)
    _, cache = gpt2.run_with_cache(source)
    value = after_hook(gpt2, tokens, "blocks.0.attn.hook_z", ablate.resample(cache, heads=3, positions=-1))
    clean = after_hook(gpt2, tokens, "blocks.0.attn.hook_z", lambda x, hook: None)
    assert torch.equal(value[:, -1, 3], cache["z", 0][:, -1, 3])
    expected = clean.clone()
    expected[:, -1, 3] = cache["z", 0][:, -1, 3]
    assert torch.equal(value, expected)


def test_resample_by_seed_is_a_seeded_derangement(gpt2):
    tokens = tokens_of(gpt2, batch=5)
    clean = after_hook(gpt2, tokens, "blocks.0.hook_mlp_out", lambda x, hook: None)
    first = after_hook(gpt2, tokens, "blocks.0.hook_mlp_out", ablate.resample(seed=0))
    again = after_hook(gpt2, tokens, "blocks.0.hook_mlp_out", ablate.resample(seed=0))
    other = after_hook(gpt2, tokens, "blocks.0.hook_mlp_out", ablate.resample(seed=1))
    assert torch.equal(first, again)
    donors = [next(j for j in range(5) if torch.equal(first[i], clean[j])) for i in range(5)]
    assert sorted(donors) == list(range(5)) and all(d != i for i, d in enumerate(donors))
    assert not torch.equal(first, other)
    for seed in range(50):
        permutation = ablate.derangement(3, seed)
        assert sorted(permutation.tolist()) == [0, 1, 2] and not bool((permutation == torch.arange(3)).any())


def test_addresses_map_to_points_and_selectors(gpt2):
    parse = lambda address: ablate.parse_address(gpt2, address)  # noqa: E731
    assert (parse("L1H2").hook_name, parse("L1H2").selectors) == ("blocks.1.attn.hook_z", {"heads": (2,)})
    assert parse("L-1H0@-1").selectors == {"heads": (0,), "positions": (-1,)} and parse("L-1H0").hook_name.startswith(
        "blocks.1."
    )
    assert parse("L0.attn").hook_name == "blocks.0.hook_attn_out"
    assert parse("L0.mlp@3").hook_name == "blocks.0.hook_mlp_out"
    assert parse("L1.N7") == ablate.Component("L1.N7", "blocks.1.mlp.hook_post", {"neurons": (7,)})
    assert parse("l1h2").hook_name == "blocks.1.attn.hook_z"
    pairs = ablate.hooks(gpt2, ["L1H2", "L1H0", "L0.mlp", "L1H1@-1"], "zero")
    assert [(name, repr(fn)) for name, fn in pairs] == [
        ("blocks.1.attn.hook_z", "zero(heads=[2, 0])"),
        ("blocks.0.hook_mlp_out", "zero()"),
        ("blocks.1.attn.hook_z", "zero(heads=[1], positions=[-1])"),
    ]
    assert ablate.components(gpt2, "heads")[:2] == ["L0H0", "L0H1"] and len(ablate.components(gpt2, "heads")) == 8


@pytest.mark.parametrize(
    "address, error, message",
    [
        ("L1.H1", ValueError, "did you mean 'L1H1'"),
        ("L1.att", ValueError, "did you mean 'L1.attn'"),
        ("L5H0", IndexError, "2 layers"),
        ("L1H9", IndexError, "heads 0..3"),
        ("L0.N999", IndexError, "neurons 0..255"),
        ("L1.E0", ValueError, "no experts"),
    ],
)
def test_bad_addresses_name_the_valid_forms(gpt2, address, error, message):
    with pytest.raises(error, match=message):
        ablate.hooks(gpt2, address)


# ----------------------------------------------------------------------------- query heads and key/value heads
@pytest.fixture(scope="module")
def grouped():
    """A grouped-query Qwen3: 4 query heads share 2 key/value heads (heads 0-1 read KV0, heads 2-3 KV1)."""
    from hooked.testing import random_model

    return random_model("qwen3", seed=0, n_heads=4, n_kv_heads=2)


def test_head_addresses_name_query_heads_and_key_value_heads(gpt2, grouped):
    from hooked.interventions.addresses import head_names

    parse = lambda model, address: ablate.parse_address(model, address)  # noqa: E731
    component = parse(grouped, "L1KV1.v@-1")
    assert (component.hook_name, component.selectors) == ("blocks.1.attn.hook_v", {"heads": (1,), "positions": (-1,)})
    assert (parse(grouped, "l0kv0.K").hook_name, parse(grouped, "l0kv0.K").selectors) == (
        "blocks.0.attn.hook_k",
        {"heads": (0,)},
    )
    assert (parse(grouped, "L0H3.q").hook_name, parse(grouped, "L0H3").hook_name) == (
        "blocks.0.attn.hook_q",
        "blocks.0.attn.hook_z",
    )
    # GPT-2's key/value head h is head h's own: named like it, as TransformerLens' head_index axis
    assert (parse(gpt2, "L1H3.v").hook_name, parse(gpt2, "L1H3.v").selectors) == (
        "blocks.1.attn.hook_v",
        {"heads": (3,)},
    )
    assert head_names(grouped, 1, "kv_head_index") == ["L1KV0", "L1KV1"]
    assert head_names(grouped, 1) == ["L1H0", "L1H1", "L1H2", "L1H3"]
    assert head_names(gpt2, 0, "kv_head_index") == head_names(gpt2, 0, "head_index") == ["L0H0", "L0H1", "L0H2", "L0H3"]


@pytest.mark.parametrize(
    "model_name, address, error, message",
    [
        ("grouped", "L0H1.v", ValueError, "query heads L0H0, L0H1 share key/value head 0.*'L0KV0.v'"),
        ("grouped", "L0H2.k", ValueError, "query heads L0H2, L0H3 share key/value head 1.*'L0KV1.k'"),
        ("grouped", "L0KV1", ValueError, "key/value head 1, shared by query heads 'L0H2', 'L0H3'.*hook_z.*'L0KV1.v'"),
        ("grouped", "L0KV0.q", ValueError, "shared by query heads 'L0H0', 'L0H1'.*hook_q"),
        ("grouped", "L0KV2.v", IndexError, "key/value heads 0..1"),
        ("grouped", "L0KV2", IndexError, "key/value heads 0..1"),
        ("grouped", "L0H4.k", IndexError, "has 4 \\(heads 0..3\\)"),
        ("gpt2", "L0KV1.k", ValueError, "not grouped.*'L0H1.k'"),
        ("gpt2", "L0KV1", ValueError, "not grouped.*'L0H1.k'"),
    ],
)
def test_a_head_of_the_wrong_kind_is_refused_naming_the_right_one(request, model_name, address, error, message):
    with pytest.raises(error, match=message):
        ablate.hooks(request.getfixturevalue(model_name), address)


def test_a_sweep_over_key_value_heads_equals_zeroing_each_one_by_hand(grouped):
    """Each `L{l}KV{g}.v` variant is slot g of hook_v zeroed, run alone: it acts on both query heads of its group."""
    from hooked.interventions.addresses import head_names

    tokens = tokens_of(grouped, pos=6)
    names = [name for layer in range(2) for name in head_names(grouped, layer, "kv_head_index")]
    assert names == ["L0KV0", "L0KV1", "L1KV0", "L1KV1"]
    variants = {name: ablate.hooks(grouped, f"{name}.v", "zero") for name in names}
    result = hooked.sweep(grouped, tokens, variants, lambda logits, **_: logits[:, -1, :4].sum(-1))
    assert result.variants == names
    for name in names:
        layer, g = int(name[1]), int(name[-1])

        def zero_slot(v, hook, g=g):
            v = v.clone()
            v[:, :, g] = 0.0  # [batch pos kv_head_index d_head]
            return v

        with torch.no_grad():
            alone = grouped.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_v", zero_slot)])[
                :, -1, :4
            ].sum(-1)
        torch.testing.assert_close(result[name], alone, rtol=0, atol=1e-5)
    assert min(abs(change) for change in result.change.values()) > 1e-3  # each key/value head mattered


def test_bad_selectors_are_refused_before_any_forward(gpt2):
    tokens = tokens_of(gpt2)
    ran = []
    record = ("hook_embed", lambda x, hook: ran.append(hook.name))
    with pytest.raises(ValueError, match="heads= selects on a head_index"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[record, ("blocks.0.hook_resid_post", ablate.zero(heads=1))])
    with pytest.raises(IndexError, match="heads \\[7\\] out of range"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[record, ("blocks.0.attn.hook_z", ablate.zero(heads=7))])
    with pytest.raises(ValueError, match="neurons= selects"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[record, ("blocks.0.attn.hook_z", ablate.zero(neurons=1))])
    with pytest.raises(TypeError, match="int or a non-empty list"):
        ablate.zero(heads=[])
    with pytest.raises(ValueError, match="exactly one"):
        ablate.resample(heads=1)
    with pytest.raises(ValueError, match="needs reference"):
        ablate.hooks(gpt2, "L0H0", "mean")
    assert ran == []


def test_a_reference_from_another_model_is_refused(gpt2, tmp_path):
    from hooked.testing import build_gpt2_checkpoint

    wider = hooked.load(build_gpt2_checkpoint(tmp_path / "wide", n_embd=96, n_head=4))
    _, cache = wider.run_with_cache(tokens_of(gpt2))
    with pytest.raises(ValueError, match="another model"):
        gpt2.run_with_hooks(tokens_of(gpt2), fwd_hooks=[("blocks.0.attn.hook_z", ablate.mean(cache, heads=0))])
    _, narrow = gpt2.run_with_cache(tokens_of(gpt2), names_filter="blocks.0.hook_mlp_out")
    with pytest.raises(KeyError, match="has no blocks.0.attn.hook_z"):
        ablate.hooks(gpt2, "L0H0", "resample", source=narrow)


def test_a_resample_source_of_another_shape_is_a_clear_error(gpt2):
    _, cache = gpt2.run_with_cache(tokens_of(gpt2, batch=2))
    with pytest.raises(
        ValueError, match="the source holds 2 prompts of 7 tokens, but this run has 3 prompts of 7 tokens"
    ):
        with torch.no_grad():
            gpt2.run_with_hooks(
                tokens_of(gpt2, batch=3), fwd_hooks=ablate.hooks(gpt2, "L0H0", "resample", source=cache)
            )
    with pytest.raises(ValueError, match="at least 2 prompts"):
        with torch.no_grad():
            gpt2.run_with_hooks(tokens_of(gpt2, batch=1), fwd_hooks=ablate.hooks(gpt2, "L0H0", "resample", seed=0))


def test_repr_reads_like_what_it_does(gpt2):
    _, cache = gpt2.run_with_cache(tokens_of(gpt2))
    assert repr(ablate.zero(heads=9)) == "zero(heads=[9])"
    assert repr(ablate.mean(cache, neurons=[1, 2], per_position=True)) == "mean(neurons=[1, 2], per_position=True)"
    assert repr(ablate.resample(seed=0, heads=9, positions=-1)) == "resample(seed=0, heads=[9], positions=[-1])"
    assert repr(ablate.resample(cache, heads=1)) == "resample(source=<cache of 3 prompts>, heads=[1])"


def test_expert_slots_against_the_expert_weights():
    """At the per-slot points, experts= picks the slots holding that expert: zeroing its routing weight
    or all its neurons removes its contribution, as zeroing its down projection does; one neuron of an
    expert equals zeroing that column of its down projection."""
    from hooked.testing import random_model

    model = random_model("qwen3_moe", seed=3, n_layers=1, n_experts=4, top_k=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    layer = model.blocks[0].mlp
    with torch.no_grad():
        routed = torch.zeros(4, dtype=torch.bool)
        model.run_with_hooks(
            tokens,
            fwd_hooks=[("blocks.0.mlp.hook_expert_indices", lambda x, hook: routed.__setitem__(x.unique(), True))],
        )
        expert = int(routed.nonzero()[0])
        removed = copy.deepcopy(model)
        removed.blocks[0].mlp.experts.down_proj[expert] = 0
        one_neuron = copy.deepcopy(model)
        one_neuron.blocks[0].mlp.experts.down_proj[expert, :, 5] = 0
        for name, callback, reference in [
            ("blocks.0.mlp.hook_expert_weights", ablate.zero(experts=expert), removed),
            ("blocks.0.mlp.hook_expert_post", ablate.zero(experts=expert), removed),
            ("blocks.0.mlp.hook_expert_post", ablate.zero(experts=expert, neurons=5), one_neuron),
        ]:
            ablated = model.run_with_hooks(tokens, fwd_hooks=[(name, callback)])
            assert torch.allclose(ablated, reference(tokens), atol=1e-5), (name, callback)
            assert not torch.allclose(ablated, model(tokens), atol=1e-6), (name, callback)
        assert ablate.hooks(model, f"L0.E{expert}.N5")[0] == (
            "blocks.0.mlp.hook_expert_post",
            ablate.zero(experts=expert, neurons=5),
        )
    with pytest.raises(ValueError, match="does not know which expert each slot holds"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.mlp.hook_expert_indices", ablate.zero(experts=0))])
    assert layer.hook_expert_weights.slot_experts is None  # not left behind after the forward
