"""hooked.sae.attribute against the first-order formula computed with torch.autograd on the dictionaries' arithmetic
written out by hand, against finite differences of the patch it estimates, and against patching each feature."""

from __future__ import annotations

import inspect

import pytest
import torch

import hooked.sae
from hooked import metrics, patch
from hooked.sae.attribution import feature_names
from hooked.testing import random_model
from tests.sae.dictionaries import explicit_acts, random_dictionary, spliced_names


def tokens_of(model, batch: int = 4, pos: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def pair(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean prompts and corrupt ones that differ at position 2."""
    clean = tokens_of(model, seed=seed)
    corrupt = clean.clone()
    corrupt[:, 2] = tokens_of(model, pos=1, seed=seed + 100)[:, 0]
    return clean, corrupt


def dictionaries(model, dtype=torch.float32):
    """An SAE on block 0's output and a transcoder replacing block 1's MLP: the SAE's features reach the metric
    through the transcoder's input."""
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", d_sae=16, dtype=dtype, seed=1)
    tc = random_dictionary(
        model.cfg.d_model, "blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out", d_sae=16, dtype=dtype, seed=2
    )
    return sae, tc


def last_token_diff(logits, base_logits=None, attention_mask=None):
    """logit[1] - logit[5] at the last token, in the logits' own precision (finite differences need float64)."""
    return logits[:, -1, 1] - logits[:, -1, 5]


def explicit_products(model, sae, tc, clean, corrupt, metric, use_error_term: bool = True, mask=None) -> torch.Tensor:
    """[batch pos 2 * d_sae]: gradient x (corrupt - clean) per token (padding zeroed), from hooks that compute both
    dictionaries by hand. With the error term each dictionary's output is the activation it replaces plus
    (recons(a) - recons(a).detach()), the features a taken as leaves; without, the reconstruction itself."""

    def hooks(store: dict, grad: bool) -> list:
        def output(d, key, x, replaced):
            acts = explicit_acts(d, x)
            store[key] = acts.detach().requires_grad_(True) if grad and use_error_term else acts
            recons = store[key] @ d.W_dec + d.b_dec
            return replaced + recons - recons.detach() if use_error_term else recons

        def keep_input(x, hook):
            store["x"] = x

        return [
            (sae.hook_name, lambda x, hook: output(sae, "sae", x, x)),
            (tc.hook_name, keep_input),
            (tc.hook_name_out, lambda mlp_out, hook: output(tc, "tc", store.pop("x"), mlp_out)),
        ]

    corrupt_acts, clean_acts = {}, {}
    with torch.no_grad():
        model.run_with_hooks(corrupt, attention_mask=mask, fwd_hooks=hooks(corrupt_acts, grad=False))
    values = metric(
        model.run_with_hooks(clean, attention_mask=mask, fwd_hooks=hooks(clean_acts, grad=True)), attention_mask=mask
    )
    grads = torch.autograd.grad(values.sum(), [clean_acts["sae"], clean_acts["tc"]])
    products = [g * (corrupt_acts[k] - clean_acts[k].detach()) for g, k in zip(grads, ("sae", "tc"), strict=True)]
    products = torch.cat(products, -1)
    return products if mask is None else products * mask[..., None]


@pytest.mark.parametrize("use_error_term", [True, False])
def test_scores_equal_the_first_order_formula_on_the_explicit_arithmetic(use_error_term):
    model = random_model("gpt2", seed=2, n_layers=2)
    sae, tc = dictionaries(model)
    clean, corrupt = pair(model)
    metric = metrics.logit_diff(model, [1, 2, 3, 4], [5, 6, 7, 8])
    scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae, tc], use_error_term=use_error_term)
    expected = explicit_products(model, sae, tc, clean, corrupt, metric, use_error_term).sum(1)
    torch.testing.assert_close(scores.per_prompt, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scores.scores, expected.mean(0), atol=1e-5, rtol=1e-4)
    assert scores.features == feature_names(sae) + feature_names(tc)
    assert scores.features[:2] == ["L0.resid_post.F0", "L0.resid_post.F1"] and scores.features[16] == "L1.mlp_out.F0"
    assert expected[:, :16].abs().max() > 1e-2 and expected[:, 16:].abs().max() > 1e-2  # both dictionaries count
    with model.saes([sae, tc], use_error_term=use_error_term):
        torch.testing.assert_close(scores.clean, metric(model(clean)), atol=1e-5, rtol=0)
        torch.testing.assert_close(scores.corrupt, metric(model(corrupt)), atol=1e-5, rtol=0)
    assert spliced_names(model) == [] and not model.hooks_attached()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("use_error_term", [True, False])
def test_each_score_is_the_derivative_of_the_patch_it_estimates(use_error_term):
    """In float64: patching feature f to a + eps (a' - a) moves the metric by eps * score(f), to second order, for
    every feature of both dictionaries (with the error term: the SAE's error held, the transcoder's following its
    new input, as a patch in the spliced model does)."""
    model = random_model("gpt2", seed=3, n_layers=2).double()
    sae, tc = dictionaries(model, torch.float64)
    clean, corrupt = pair(model, seed=1)
    scores = hooked.sae.attribute(model, clean, corrupt, last_token_diff, saes=[sae, tc], use_error_term=use_error_term)
    eps = 1e-6
    with torch.no_grad(), model.saes([sae, tc], use_error_term=use_error_term):
        base = last_token_diff(model(clean))
        _, clean_cache = model.run_with_cache(clean)
        _, corrupt_cache = model.run_with_cache(corrupt)
        derivatives = []
        for d in (sae, tc):
            point = d.hook_sae_acts_post.name
            nudged = clean_cache[point] + eps * (corrupt_cache[point] - clean_cache[point])
            for feature in range(d.cfg.d_sae):
                out = model.run_with_hooks(clean, fwd_hooks=[(point, patch.activation(nudged, features=feature))])
                derivatives.append((last_token_diff(out) - base) / eps)
    derivatives = torch.stack(derivatives, dim=-1)
    torch.testing.assert_close(scores.per_prompt, derivatives, atol=1e-5, rtol=1e-4)
    assert derivatives.abs().max() > 1e-2


def test_a_float64_model_gets_float64_scores():
    """The scores, the metric values and the per-position table in the model's float64, through a library metric:
    equal to the explicit float64 formula (with the metric written in float64 too) to float64 rounding, far below
    what a float32 step anywhere (the metric's softmax-free difference, the products' sum) would leave."""
    model = random_model("gpt2", seed=4, n_layers=2).double()
    sae, tc = dictionaries(model, torch.float64)
    clean, corrupt = pair(model, seed=2)
    metric = metrics.logit_diff(model, [1, 2, 3, 4], [5, 6, 7, 8])
    scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae, tc], per_position=True)

    def diff64(logits, base_logits=None, attention_mask=None):
        rows = torch.arange(4)
        return logits[rows, -1, torch.tensor([1, 2, 3, 4])] - logits[rows, -1, torch.tensor([5, 6, 7, 8])]

    expected = explicit_products(model, sae, tc, clean, corrupt, diff64).sum(1)
    assert {scores.scores.dtype, scores.per_prompt.dtype, scores.clean.dtype, scores.per_position.dtype} == {
        torch.float64
    }
    torch.testing.assert_close(scores.per_prompt, expected, atol=1e-12, rtol=1e-10)
    with torch.no_grad(), model.saes([sae, tc], use_error_term=True):
        torch.testing.assert_close(scores.clean, diff64(model(clean)), atol=1e-12, rtol=0)
    assert expected.abs().max() > 1e-2


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    ranks = [torch.argsort(torch.argsort(x)).double() for x in (a, b)]
    return float(torch.corrcoef(torch.stack(ranks))[0, 1])


@pytest.mark.parametrize("seed", [0, 1])
def test_the_estimate_ranks_features_as_patching_each_one_does(seed):
    model = random_model("gpt2", seed=seed, n_layers=2)
    sae, tc = dictionaries(model)
    clean, corrupt = pair(model, seed=seed)
    metric = metrics.logit_diff(model, [1, 2, 3, 4], [5, 6, 7, 8])
    scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae, tc])
    with torch.no_grad(), model.saes([sae, tc], use_error_term=True):
        base = metric(model(clean))
        _, corrupt_cache = model.run_with_cache(corrupt)
        patched = {}
        for name in scores.features:
            hooks = patch.hooks(model, name, corrupt_cache)
            patched[name] = float((metric(model.run_with_hooks(clean, fwd_hooks=hooks)) - base).mean())
    actual = torch.tensor([patched[name] for name in scores.features])
    assert rank_correlation(scores.scores, actual) > 0.8
    for name, score in scores.top(5):
        assert score * patched[name] > 0, (name, score, patched[name])


# ----------------------------------------------------------------------------- the result and its faces
def test_per_position_scores_table_and_ranking():
    model = random_model("gpt2", seed=4, n_layers=2)
    sae, tc = dictionaries(model)
    clean, corrupt = pair(model, seed=2)
    mask = torch.ones_like(clean, dtype=torch.bool)
    mask[0, :2] = False  # prompt 0 is 4 tokens long, left-padded
    metric = metrics.logit_diff(model, [1, 2, 3, 4], [5, 6, 7, 8])
    scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae, tc], per_position=True, attention_mask=mask)
    products = explicit_products(model, sae, tc, clean, corrupt, metric, mask=mask)  # [batch pos n_features]
    torch.testing.assert_close(scores.per_prompt, products.sum(1), atol=1e-5, rtol=1e-4)
    positions = mask.long().cumsum(-1) - 1
    for position in range(clean.shape[1]):
        at = (positions == position) & mask
        torch.testing.assert_close(scores.per_position[:, position], products[at].mean(0), atol=1e-5, rtol=1e-4)
    table = scores.table()
    assert list(table.index) == scores.ranking()
    assert table["score"].abs().is_monotonic_decreasing
    assert table.loc[scores.features[3], "point"] == "L0.resid_post" and table.loc[scores.features[3], "index"] == 3
    name, value = scores.top(1)[0]
    assert scores[name] == value and abs(value) == float(scores.scores.abs().max())  # exact: the stored score, read
    assert repr(scores).startswith(f"FeatureScores(32 features; top: {name}")
    with pytest.raises(KeyError, match="is not a scored feature"):
        scores["L0.resid_post.F99"]


# ----------------------------------------------------------------------------- bad input
def test_refusals_name_the_fix_and_leave_nothing_attached():
    model = random_model("gpt2", seed=5, n_layers=2)
    sae, tc = dictionaries(model)
    clean, corrupt = pair(model)
    metric = metrics.logit_diff(model, [1, 2, 3, 4], [5, 6, 7, 8])
    with pytest.raises(ValueError, match="compares with the clean run"):
        hooked.sae.attribute(model, clean, corrupt, metrics.kl_div(), saes=[sae])
    with pytest.raises(ValueError, match="give at least one dictionary"):
        hooked.sae.attribute(model, clean, corrupt, metric, saes=[])
    with pytest.raises(ValueError, match="token for token"):
        hooked.sae.attribute(model, clean, corrupt[:, :-1], metric, saes=[sae])
    with pytest.raises(RuntimeError, match="outside torch.inference_mode"), torch.inference_mode():
        hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae])
    with pytest.raises(ValueError, match="no gradient"):
        hooked.sae.attribute(model, clean, corrupt, lambda logits, **kw: logits[:, -1, 0].detach(), saes=[sae])

    def failing(logits, **kwargs):
        raise ArithmeticError("the metric failed")

    with pytest.raises(ArithmeticError, match="the metric failed"):
        hooked.sae.attribute(model, clean, corrupt, failing, saes=[sae, tc])
    with pytest.raises(KeyError, match="did you mean"):
        hooked.sae.attribute(model, clean, corrupt, metric, saes=[random_dictionary(32, "blocks.0.hook_resid_pst")])
    clt = hooked.sae.CrossLayerTranscoder(hooked.sae.CLTConfig(n_layers=2, d_in=model.cfg.d_model, d_sae=8))
    unchecked = inspect.unwrap(hooked.sae.attribute)  # as users call it: the suite's annotation check refuses first
    with pytest.raises(TypeError, match="not CrossLayerTranscoder; a cross-layer transcoder's features are patched"):
        unchecked(model, clean, corrupt, metric, saes=[sae, clt])
    assert spliced_names(model) == [] and not model.hooks_attached()
    assert all(p.grad is None for p in model.parameters())
    assert not model.training
