"""Properties of ablations and sweeps, over random tiny GPT-2, Qwen3 and Qwen3-MoE models (hypothesis).

Each property is an equivalence with a computation that does not go through the code under test:
- a sweep equals running each variant alone with `run_with_hooks` (chunking, row blocks, the stages
  variants join at, the metric's reduced logits);
- zeroing a head's z equals zeroing its slice of the output projection, done on the weights;
- resampling from the run's own activations, or patching them back in, changes nothing;
- mean ablation over one prompt, per position, equals patching that prompt in;
- masking an expert at the router equals a model built without that expert;
- an ablation at a position of a left-padded row equals the same ablation on the prompt alone.

Models, tokens and interventions come from `hooked.testing`, so a failure prints the model as a
`random_model(...)` call that rebuilds it.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate, metrics
from hooked.models import Qwen3Moe
from hooked.testing import (
    ablatable_hook_names,
    addresses,
    empties_a_router,
    interventions,
    models,
    random_model,
    selectors,
    tokens,
)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, relative: float = 1e-5) -> None:
    """Equal within float32 rounding: an absolute tolerance `relative` times the values' magnitude."""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=0, atol=relative * scale)


def left_padded(data, model, batch: int, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [batch pos] and a left-padding mask [batch pos] (True = real), one full-length row."""
    ids = data.draw(tokens(model, min_batch=batch, max_batch=batch, min_pos=pos, max_pos=pos))
    lengths = [pos] + data.draw(st.lists(st.integers(1, pos), min_size=batch - 1, max_size=batch - 1))
    lengths = data.draw(st.permutations(lengths))
    mask = torch.arange(pos)[None] >= torch.tensor([pos - n for n in lengths])[:, None]
    return ids, mask


def same_shape_tokens(data, model, like: torch.Tensor) -> torch.Tensor:
    batch, pos = like.shape
    return data.draw(tokens(model, min_batch=batch, max_batch=batch, min_pos=pos, max_pos=pos))


# ----------------------------------------------------------------------------- random models
def test_random_model_is_a_function_of_its_seed():
    first, again, other = (random_model("qwen3_moe", seed=seed, mlp_only_layers=[0]) for seed in (1, 1, 2))
    for name, parameter in first.state_dict().items():
        assert torch.equal(parameter, again.state_dict()[name]), name  # the same seeded draws
        assert not torch.equal(parameter, other.state_dict()[name]), name  # every tensor drawn, none left at its init
    assert first.cfg.is_sparse(1) and not first.cfg.is_sparse(0)


# ----------------------------------------------------------------------------- metrics
def position_weighted_log_prob(logits, *, base_logits=None, attention_mask=None):
    """A plain callable on full logits (no `compute`): the sweep must hand it every position."""
    log_probs = logits.float().log_softmax(-1)
    weights = (
        torch.arange(1, logits.shape[1] + 1, dtype=torch.float32) * torch.linspace(1, 2, logits.shape[-1])[:, None]
    )
    per_position = (log_probs * weights.T[None]).sum(-1)  # a different weighting per position and token
    if attention_mask is None:
        return per_position.mean(-1)
    return torch.where(attention_mask, per_position, 0.0).sum(-1) / attention_mask.sum(-1)


def draw_metric(data, model, batch: int, kind: str):
    if kind == "plain":
        return position_weighted_log_prob
    if kind == "kl_div":
        return metrics.kl_div()
    answers = st.lists(st.integers(0, model.cfg.d_vocab - 1), min_size=batch, max_size=batch)
    return metrics.logit_diff(None, data.draw(answers), data.draw(answers))


# ----------------------------------------------------------------------------- sweep == sequential
def draw_variant(data, model, cache, within_batch: bool, max_pos: int) -> list:
    """Hooks of one variant: drawn interventions, or an `ablate.hooks` call on drawn addresses.

    Positions stay within the shortest prompt (`max_pos`): a position a prompt lacks raises."""
    if data.draw(st.booleans()):
        hooks = data.draw(st.lists(interventions(model, cache, within_batch=within_batch, max_pos=max_pos), max_size=3))
        assume(not empties_a_router(model, hooks))
        return hooks
    picked = data.draw(st.lists(addresses(model, max_pos=max_pos), min_size=1, max_size=3))
    method = data.draw(st.sampled_from(["zero", "mean", "resample"]))
    if method == "mean":
        return ablate.hooks(model, picked, "mean", reference=cache, per_position=data.draw(st.booleans()))
    if method == "resample":
        if within_batch and data.draw(st.booleans()):
            return ablate.hooks(model, picked, "resample", seed=data.draw(st.integers(0, 100)))
        return ablate.hooks(model, picked, "resample", source=cache)
    try:
        hooks = ablate.hooks(model, picked, "zero")
    except ValueError as refused:  # every expert of a layer picked: no expert left to route to (test_qwen3_moe.py)
        assert "every one of the layer's" in str(refused)
        assume(False)
    # Addresses at different positions ('L0.E0', 'L0.E1@0') are separate ablations, each valid alone, that together
    # can empty a router at a position: the model refuses that when it runs (CI drew it on a 2-expert Mixtral).
    assume(not empties_a_router(model, hooks))
    return hooks


@pytest.mark.parametrize("metric_kind", ["logit_diff", "kl_div", "plain"])
@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_sweep_equals_each_variant_run_alone(metric_kind, data):
    model = data.draw(models())
    batch = data.draw(st.integers(2, 4))
    pos = data.draw(st.integers(1, 6))
    padded = data.draw(st.booleans())
    if padded:
        clean, mask = left_padded(data, model, batch, pos)
    else:
        clean, mask = same_shape_tokens(data, model, torch.zeros(batch, pos)), None
    with torch.no_grad():
        _, cache = model.run_with_cache(same_shape_tokens(data, model, clean), attention_mask=mask)
    within_batch = cache.attention_mask is None  # seeded resampling needs unpadded rows
    shortest = pos if mask is None else int(mask.sum(-1).min())
    variants = {
        f"v{i}": draw_variant(data, model, cache, within_batch, shortest) for i in range(data.draw(st.integers(1, 4)))
    }
    metric = draw_metric(data, model, batch, metric_kind)
    max_rows = data.draw(st.none() | st.integers(batch, 4 * batch))

    result = hooked.sweep(model, clean, variants, metric, attention_mask=mask, max_rows=max_rows, progress=False)

    key_valid = cache.attention_mask
    with torch.no_grad():
        base_logits = model(clean, attention_mask=mask)
        assert_close_to_scale(result.base, metric(base_logits, base_logits=base_logits, attention_mask=key_valid))
        for index, (name, hooks) in enumerate(variants.items()):
            logits = model.run_with_hooks(clean, attention_mask=mask, fwd_hooks=hooks)
            expected = metric(logits, base_logits=base_logits, attention_mask=key_valid)
            assert result.variants[index] == name
            assert_close_to_scale(result.values[index], expected)


@settings(max_examples=15, **SETTINGS)
@given(data=st.data())
def test_a_sweep_with_one_variant_per_hook_point_equals_running_each_alone(data):
    """Every point once, as the only hook of its variant: each joins the batch at its own stage."""
    model = data.draw(models())
    clean = data.draw(tokens(model, min_batch=2, max_pos=5))
    with torch.no_grad():
        _, cache = model.run_with_cache(same_shape_tokens(data, model, clean))
    variants = {
        name: [data.draw(interventions(model, cache, names=[name], max_pos=clean.shape[1]))]
        for name in ablatable_hook_names(model)
    }
    max_rows = data.draw(st.none() | st.integers(clean.shape[0], 6 * clean.shape[0]))
    metric = metrics.kl_div()
    result = hooked.sweep(model, clean, variants, metric, max_rows=max_rows, progress=False)
    with torch.no_grad():
        base_logits = model(clean)
        for index, hooks in enumerate(variants.values()):
            logits = model.run_with_hooks(clean, fwd_hooks=hooks)
            assert_close_to_scale(result.values[index], metric(logits, base_logits=base_logits))


# ----------------------------------------------------------------------------- heads and weights
@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_zeroing_heads_at_z_equals_zeroing_their_output_projection_weights(data):
    model = data.draw(models())
    cfg = model.cfg
    clean = data.draw(tokens(model))
    layers = data.draw(st.lists(st.integers(0, cfg.n_layers - 1), min_size=1, max_size=cfg.n_layers, unique=True))
    heads = {
        layer: data.draw(st.lists(st.integers(0, cfg.n_heads - 1), min_size=1, max_size=cfg.n_heads, unique=True))
        for layer in layers
    }
    fwd_hooks = [(f"blocks.{layer}.attn.hook_z", ablate.zero(heads=chosen)) for layer, chosen in heads.items()]

    edited = copy.deepcopy(model)
    with torch.no_grad():
        for layer, chosen in heads.items():
            attn = edited.blocks[layer].attn
            for head in chosen:
                inputs = slice(head * cfg.d_head, (head + 1) * cfg.d_head)  # head h's part of the projection's input
                (writer,) = attn.residual_writers()  # the output projection, as each family declares it
                writer.weight.narrow(1 - writer.axis, inputs.start, cfg.d_head).zero_()  # its other axis is the input
        ablated = model.run_with_hooks(clean, fwd_hooks=fwd_hooks)
        assert_close_to_scale(ablated, edited(clean))


# ----------------------------------------------------------------------------- no-ops
@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_resampling_from_the_run_itself_and_patching_clean_into_clean_change_nothing(data):
    model = data.draw(models())
    batch = data.draw(st.integers(1, 4))
    clean, mask = left_padded(data, model, batch, data.draw(st.integers(1, 6)))
    names = data.draw(st.lists(st.sampled_from(model.hook_names), min_size=1, max_size=3, unique=True))
    with torch.no_grad():
        # Listening at the same points in every run keeps the same code paths (eager attention, per-head results).
        clean_logits, cache = model.run_with_cache(clean, attention_mask=mask, names_filter=names)
        listening = [(name, lambda activation, hook: None) for name in names]
        ablatable = [name for name in names if name in ablatable_hook_names(model)]
        if ablatable:
            shortest = int(mask.sum(-1).min())
            resampled = data.draw(
                st.lists(
                    interventions(
                        model, cache, methods=["resample"], within_batch=False, names=ablatable, max_pos=shortest
                    ),
                    min_size=1,
                    max_size=3,
                )
            )
            logits = model.run_with_hooks(clean, attention_mask=mask, fwd_hooks=resampled + listening)
            assert_close_to_scale(logits, clean_logits)

        def patch_clean(activation, hook):
            return cache[hook.name]

        patched = [(name, patch_clean) for name in names]  # every point, integer expert ids and norm scales included
        # Within rounding, not bit for bit: an equal but contiguous copy of a strided activation (the
        # experts' gate half) can round differently in the next vectorised op.
        assert_close_to_scale(model.run_with_hooks(clean, attention_mask=mask, fwd_hooks=patched), clean_logits)
    # and in a sweep, next to a variant that does change the run
    # zeroed at a point the interventions draw from: a zeroed norm scale divides by 0, a NaN the sweep refuses
    zeroed_at = next((name for name in names if name in ablatable_hook_names(model)), ablatable_hook_names(model)[0])
    result = hooked.sweep(
        model, clean, {"clean": patched, "zeroed": [(zeroed_at, ablate.zero())]}, metrics.kl_div(), attention_mask=mask
    )
    assert_close_to_scale(result.values[0], torch.zeros(batch))


# ----------------------------------------------------------------------------- mean of one prompt
@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_mean_over_one_prompt_per_position_equals_patching_that_prompt_in(data):
    model = data.draw(models())
    clean = data.draw(tokens(model, max_pos=6))
    batch, pos = clean.shape
    prompt = data.draw(tokens(model, min_batch=1, max_batch=1, min_pos=pos, max_pos=pos))
    name = data.draw(st.sampled_from(ablatable_hook_names(model)))
    chosen = data.draw(selectors(model, name, max_pos=pos))
    with torch.no_grad():
        _, one = model.run_with_cache(prompt, names_filter=[name])
        _, repeated = model.run_with_cache(prompt.repeat(batch, 1), names_filter=[name])
        averaged = model.run_with_hooks(clean, fwd_hooks=[(name, ablate.mean(one, **chosen, per_position=True))])
        patched = model.run_with_hooks(clean, fwd_hooks=[(name, ablate.resample(repeated, **chosen))])
    assert_close_to_scale(averaged, patched)


# ----------------------------------------------------------------------------- experts
def without_experts(model: Qwen3Moe, removed: dict[int, int]) -> Qwen3Moe:
    """A copy of `model` with expert removed[layer] deleted from each sparse layer: router rows and stacked weights."""
    cfg = dataclasses.replace(model.cfg, n_experts=model.cfg.n_experts - 1)
    state = model.state_dict()
    for layer, expert in removed.items():
        kept = [e for e in range(model.cfg.n_experts) if e != expert]
        for key in ("gate.weight", "experts.gate_up_proj", "experts.down_proj"):  # all [n_experts, ...]
            full = f"blocks.{layer}.mlp.{key}"
            state[full] = state[full][kept]
    smaller = Qwen3Moe(cfg)
    smaller.load_state_dict(state)
    return smaller.eval()


@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_masking_an_expert_at_the_router_equals_a_model_without_it(data):
    model = data.draw(models(["qwen3_moe"]))
    cfg = model.cfg
    assert cfg.n_experts - 1 >= cfg.top_k  # models() draws top_k <= 3 < 4 <= n_experts
    sparse = [layer for layer in range(cfg.n_layers) if cfg.is_sparse(layer)]
    removed = {layer: data.draw(st.integers(0, cfg.n_experts - 1)) for layer in sparse}
    clean = data.draw(tokens(model))
    fwd_hooks = [
        (f"blocks.{layer}.mlp.hook_router_logits", ablate.zero(experts=expert)) for layer, expert in removed.items()
    ]
    with torch.no_grad():
        masked = model.run_with_hooks(clean, fwd_hooks=fwd_hooks)
        assert_close_to_scale(masked, without_experts(model, removed)(clean))


# ----------------------------------------------------------------------------- left padding
@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_ablating_a_position_of_a_padded_row_equals_ablating_the_prompt_alone(data):
    model = data.draw(models())
    batch = data.draw(st.integers(2, 4))
    pos = data.draw(st.integers(2, 6))
    clean, mask = left_padded(data, model, batch, pos)
    # Zeroed scores would unmask the padding (and the future): no counterpart on the prompt alone.
    name = data.draw(st.sampled_from([n for n in ablatable_hook_names(model) if not n.endswith("hook_attn_scores")]))
    chosen = data.draw(selectors(model, name, positions=False))
    shortest = int(mask.sum(-1).min())  # a position every prompt has (one a prompt lacks raises)
    chosen["positions"] = (data.draw(st.integers(-shortest, shortest - 1)),)
    if "key_pos" in model.hook_dict[name].axes or data.draw(st.booleans()):
        fn = ablate.zero(**chosen)
    else:
        with torch.no_grad():
            _, reference = model.run_with_cache(same_shape_tokens(data, model, clean), names_filter=[name])
        fn = ablate.mean(reference, **chosen, per_position=data.draw(st.booleans()))
    with torch.no_grad():
        padded = model.run_with_hooks(clean, attention_mask=mask, fwd_hooks=[(name, fn)])
        for row in range(batch):
            real = mask[row]
            alone = model.run_with_hooks(clean[row, real][None], fwd_hooks=[(name, fn)])
            assert_close_to_scale(padded[row, real], alone[0])
