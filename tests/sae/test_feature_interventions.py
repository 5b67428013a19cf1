"""Features as components: the ablations, sweeps, per-prompt positions, activation patching and generation of
hooked.interventions on a spliced dictionary's features (`L1.resid_post.F12`), each against a hook that edits
`hook_sae_acts_post` explicitly, or against running each variant alone."""

from __future__ import annotations

import pytest
import torch

import hooked
from hooked import ablate, metrics, patch
from hooked.testing import random_model
from tests.sae.dictionaries import random_dictionary, spliced_names

ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=3, n_layers=2)


def tokens_of(model, batch: int = 3, pos: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def sae_of(model, **kw):
    return random_dictionary(model.cfg.d_model, "blocks.1.hook_resid_post", d_sae=64, seed=11, **kw)


def transcoder_of(model, layer: int = 1):
    """A transcoder reading the attention half's output (stage 2L) and writing the MLP's (stage 2L + 1)."""
    return random_dictionary(
        model.cfg.d_model, f"blocks.{layer}.hook_resid_mid", hook_name_out=f"blocks.{layer}.hook_mlp_out", d_sae=64
    )


DICTIONARIES = {"sae": (sae_of, "L1.resid_post"), "transcoder": (transcoder_of, "L1.mlp_out")}


def features_point(d) -> str:
    return f"{d.hook_name_out}.hook_sae_acts_post"


def active(model, d, tokens, n: int = 2) -> list[int]:
    """The n features most active on `tokens` (an ablation of them changes something)."""
    _, cache = model.run_with_cache_with_saes(tokens, saes=[d], use_error_term=True)
    return cache[features_point(d)].sum((0, 1)).topk(n).indices.tolist()


def editing(d, edit) -> list[tuple[str, object]]:
    """The explicit intervention: a hook at the features point that edits a copy of them."""
    return [(features_point(d), lambda acts, hook: edit(acts.clone()))]


# ----------------------------------------------------------------------------- the four ablations
@pytest.mark.parametrize("which", DICTIONARIES)
@pytest.mark.parametrize("method", ["zero", "mean", "resample", "constant"])
def test_each_ablation_of_a_feature_equals_an_explicit_edit_of_the_features(model, which, method):
    make, part = DICTIONARIES[which]
    d = make(model)
    tokens, reference, source = tokens_of(model), tokens_of(model, 4, 9, seed=1), tokens_of(model, seed=2)
    first, second = active(model, d, tokens)
    with model.saes([d], use_error_term=True):
        _, ref_cache = model.run_with_cache(reference)
        _, src_cache = model.run_with_cache(source)
        written = {
            "zero": (torch.tensor(0.0), torch.tensor(0.0)),
            "mean": (ref_cache[features_point(d)][..., first].mean(), ref_cache[features_point(d)][..., second].mean()),
            "resample": (src_cache[features_point(d)][..., first], src_cache[features_point(d)][:, -1, second]),
            "constant": (torch.tensor(3.5), torch.tensor(3.5)),
        }[method]

        def edit(acts):
            acts[..., first] = written[0]
            acts[:, -1, second] = written[1]
            return acts

        options = {"mean": {"reference": reference}, "resample": {"source": source}, "constant": {"value": 3.5}}
        pairs = ablate.hooks(model, [f"{part}.F{first}", f"{part}.F{second}@-1"], method, **options.get(method, {}))
        ablated = model.run_with_hooks(tokens, fwd_hooks=pairs)
        explicit = model.run_with_hooks(tokens, fwd_hooks=editing(d, edit))
        plain = model(tokens)
    torch.testing.assert_close(ablated, explicit, atol=ATOL, rtol=0)
    assert (ablated - plain).abs().max() > 1e-4
    assert spliced_names(model) == [] and not model.hooks_attached()


def test_constant_writes_a_value_reads_like_itself_and_refuses_what_cannot_broadcast(model):
    assert repr(ablate.constant(2.5, features=3)) == "constant(2.5, features=[3])"
    assert repr(ablate.constant(1, neurons=[4, 5], positions=-1)) == "constant(1.0, neurons=[4, 5], positions=[-1])"
    assert repr(ablate.constant(torch.ones(32), positions=2)) == "constant(<tensor [32]>, positions=[2])"
    for bad in ("3", True, torch.ones(3, dtype=torch.long)):
        with pytest.raises(TypeError, match="constant"):
            ablate.constant(bad, neurons=1)
    with pytest.raises(ValueError, match=r"does not broadcast against the point's axes \(batch pos d_model\)"):
        model.run_with_hooks(tokens_of(model), fwd_hooks=[("blocks.0.hook_resid_post", ablate.constant(torch.ones(5)))])
    with pytest.raises(ValueError, match="method='constant' needs value="):
        ablate.hooks(model, "L1.N3", "constant")
    with pytest.raises(ValueError, match="value= belongs to method='constant', not 'zero'"):
        ablate.hooks(model, "L1.N3", "zero", value=1.0)
    assert not model.hooks_attached()

    tokens = tokens_of(model)
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))

    def steer(resid, hook):
        resid = resid.clone()
        resid[:, 2] = direction
        return resid

    # exact: both hooks write the same values at the same point, and the rest is the same forward on the same input
    torch.testing.assert_close(
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", ablate.constant(direction, positions=2))]),
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", steer)]),
        atol=0,
        rtol=0,
    )

    def clamp(post, hook):
        post = post.clone()
        post[..., 3] = 1.5
        return post

    torch.testing.assert_close(  # exact, as above
        model.run_with_hooks(tokens, fwd_hooks=ablate.hooks(model, "L1.N3", "constant", value=1.5)),
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.mlp.hook_post", clamp)]),
        atol=0,
        rtol=0,
    )


# ----------------------------------------------------------------------------- sweeps
def answers(model, batch: int):
    generator = torch.Generator().manual_seed(5)
    return torch.randint(0, model.cfg.d_vocab, (2, batch), generator=generator)


@pytest.mark.parametrize("which", DICTIONARIES)
def test_a_sweep_over_fifty_features_equals_each_feature_alone(model, which):
    make, part = DICTIONARIES[which]
    d = make(model)
    tokens = tokens_of(model, 3, 6)
    correct, incorrect = answers(model, 3)
    metric = metrics.logit_diff(model, correct, incorrect)  # the last position only: the sweep trims to it
    with model.saes([d], use_error_term=True):
        variants = {f"{part}.F{i}": ablate.hooks(model, f"{part}.F{i}", "zero") for i in range(50)}
        if which == "transcoder":  # variants of the stages around the transcoder's two points, in small chunks
            variants |= {
                "L1.N3": ablate.hooks(model, "L1.N3", "zero"),
                "L1.mlp": ablate.hooks(model, "L1.mlp", "zero"),
                "L1H0": ablate.hooks(model, "L1H0", "zero"),
                "L0.mlp": ablate.hooks(model, "L0.mlp", "zero"),
            }
        result = hooked.sweep(model, tokens, variants, metric, max_rows=12 if which == "transcoder" else None)
        base = metric(model(tokens))
        alone = torch.stack([metric(model.run_with_hooks(tokens, fwd_hooks=pairs)) for pairs in variants.values()])
    assert result.variants == list(variants)
    torch.testing.assert_close(result.base, base, atol=ATOL, rtol=0)
    torch.testing.assert_close(result.values, alone, atol=ATOL, rtol=0)
    assert int(((alone - base).abs() > 1e-4).any(-1).sum()) >= 5  # several features matter
    assert spliced_names(model) == []


def test_a_feature_sweep_trims_to_the_last_position_only_where_the_transcoder_allows():
    """The last block's transcoder reads hook_resid_mid (attention half) and writes hook_mlp_out (MLP half, which
    a sweep reading only the last position runs on that position alone): the sweep must keep every position."""
    model = random_model("qwen3", seed=4, n_layers=2)
    tc = transcoder_of(model)
    tokens = tokens_of(model, 2, 6)
    correct, incorrect = answers(model, 2)
    metric = metrics.logit_diff(model, correct, incorrect)
    with model.saes([tc], use_error_term=False):
        variants = {f"L1.mlp_out.F{i}": ablate.hooks(model, f"L1.mlp_out.F{i}", "zero") for i in range(8)}
        result = hooked.sweep(model, tokens, variants, metric)
        alone = torch.stack([metric(model.run_with_hooks(tokens, fwd_hooks=pairs)) for pairs in variants.values()])
    torch.testing.assert_close(result.values, alone, atol=ATOL, rtol=0)


def test_sweeping_inside_a_splice_refuses_outside_hooks_and_gradient_methods_refuse_the_splice(model):
    d = sae_of(model)
    tokens = tokens_of(model)
    metric = metrics.logit_diff(model, *answers(model, 3))
    with model.saes([d]), model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: None)]):
        with pytest.raises(RuntimeError, match=r"hooks are registered at \['blocks\.0\.hook_resid_post'\]"):
            hooked.sweep(model, tokens, {"F0": ablate.hooks(model, "L1.resid_post.F0", "zero")}, metric)
    with model.saes([d]):
        with pytest.raises(RuntimeError, match=r"dictionaries are spliced into it \(hooked\.sae\)"):
            hooked.circuits.attribute(model, tokens, tokens_of(model, seed=1), metric)
        with pytest.raises(RuntimeError, match=r"patch\.attribution runs the model's own components"):
            patch.attribution(model, tokens, tokens_of(model, seed=1), metric)
    assert not model.hooks_attached()


# ----------------------------------------------------------------------------- positions, patching, generation
def test_per_prompt_positions_select_one_position_of_each_prompt(model):
    d = sae_of(model)
    tokens = tokens_of(model, 3, 7)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, :2] = False  # prompt 1 is left-padded: its position p sits in column p + 2
    positions = [1, 4, 2]
    (feature,) = active(model, d, tokens, 1)

    def edit(acts):
        for row, position in enumerate(positions):
            acts[row, position + 2 * (row == 1), feature] = 0.0
        return acts

    with model.saes([d], use_error_term=True):
        pairs = ablate.hooks(model, f"L1.resid_post.F{feature}", "zero", positions=ablate.per_prompt(positions))
        ablated = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=pairs)
        explicit = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=editing(d, edit))
        plain = model(tokens, attention_mask=mask)
    torch.testing.assert_close(ablated, explicit, atol=ATOL, rtol=0)
    assert (ablated - plain).abs().max() > 1e-4


@pytest.mark.parametrize("which", DICTIONARIES)
def test_patching_a_feature_from_the_corrupt_run_equals_writing_its_corrupt_activation(model, which):
    make, part = DICTIONARIES[which]
    d = make(model)
    clean, corrupt = tokens_of(model), tokens_of(model, seed=7)
    feature = active(model, d, clean, 1)[0]
    with model.saes([d], use_error_term=True):
        _, corrupt_cache = model.run_with_cache(corrupt)
        corrupt_acts = corrupt_cache[features_point(d)]

        def edit(acts):
            acts[..., feature] = corrupt_acts[..., feature]
            return acts

        explicit = model.run_with_hooks(clean, fwd_hooks=editing(d, edit))
        from_cache = model.run_with_hooks(clean, fwd_hooks=patch.hooks(model, f"{part}.F{feature}", corrupt_cache))
        from_tokens = model.run_with_hooks(clean, fwd_hooks=patch.hooks(model, f"{part}.F{feature}", corrupt))
        one = patch.activation(corrupt_cache, features=feature)
        by_callback = model.run_with_hooks(clean, fwd_hooks=[(features_point(d), one)])
        plain = model(clean)
    assert repr(one) == f"patch(source=<cache of 3 prompts>, features=[{feature}])"
    for patched in (from_cache, from_tokens, by_callback):
        torch.testing.assert_close(patched, explicit, atol=ATOL, rtol=0)
    assert (explicit - plain).abs().max() > 1e-4


@pytest.mark.parametrize("which", DICTIONARIES)
def test_generating_with_a_feature_held_equals_a_loop_of_full_forwards(model, which):
    make, part = DICTIONARIES[which]
    d = make(model)
    tokens, new = tokens_of(model, 2, 5), 5
    feature = active(model, d, tokens, 1)[0]
    address = f"{part}.F{feature}"
    with model.saes([d], use_error_term=True), model.hooks(ablate.hooks(model, address, "constant", value=8.0)):
        generated = model.generate(tokens, new, stop_at_eos=False)
        sequence, steps = tokens, []
        for _ in range(new):
            logits = model(sequence)[:, -1]
            steps.append(logits)
            sequence = torch.cat([sequence, logits.argmax(-1, keepdim=True)], 1)
    assert all(bool(((s.topk(2).values[:, 0] - s.topk(2).values[:, 1]) > 1e-3).all()) for s in steps)  # no ties
    # Token ids: the argmax of logits equal to float32 rounding (the KV cache sums in another order), no near-tie
    assert torch.equal(generated, sequence)
    with model.saes([d], use_error_term=True):
        assert not torch.equal(model.generate(tokens, new, stop_at_eos=False), generated)  # holding it matters
    assert spliced_names(model) == [] and not model.hooks_attached()
