"""A NaN metric value is an error naming the run (variant, edge set, ACDC trial) and the prompts; ACDC's threshold
is checked before anything runs.

The silent cases (issue 31): ACDC with a metric that returns NaN kept every edge (`|nan - x| < t` is false), and a
negative threshold kept every edge too; a sweep or an edge patching table held NaN rows without a word.
"""

from __future__ import annotations

import math

import pytest
import torch

import hooked
import hooked.sae
from hooked import circuits, metrics, patch
from hooked.circuits.discovery import acdc
from hooked.circuits.experiment import Experiment
from hooked.testing import random_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def no_hooks(model) -> bool:
    return all(not point.listening for point in model.hook_dict.values())


@pytest.fixture(scope="module")
def setup():
    model = random_model("gpt2", seed=3, n_layers=2, d_model=16)
    generator = torch.Generator().manual_seed(4)
    clean, corrupt = (torch.randint(0, model.cfg.d_vocab, (3, 5), generator=generator) for _ in range(2))
    with torch.no_grad():
        clean_logits = model(clean)
    return model, clean, corrupt, clean_logits


def nan_when_moved(clean_logits, rows=(1,)):
    """logit[3] - logit[5] at the last position, NaN at prompts `rows` of any run whose logits there are not the
    clean run's: finite on the clean run, NaN once something is patched."""

    def metric(logits, *, base_logits=None, attention_mask=None):
        values = logits[:, -1, 3] - logits[:, -1, 5]
        moved = (logits[:, -1] - clean_logits[:, -1].to(logits.device)).abs().amax(-1) > 1e-4
        chosen = torch.zeros_like(moved)
        chosen[list(rows)] = True
        return torch.where(moved & chosen, torch.nan, values)

    return metric


def always_nan(logits, *, base_logits=None, attention_mask=None):
    return logits[:, -1, 0] * torch.nan


def test_sweeps_name_the_variant_and_the_prompts(setup):
    model, clean, corrupt, clean_logits = setup
    variants = {"nothing": [], "L0H0": hooked.ablate.hooks(model, "L0H0")}
    with pytest.raises(ValueError, match=r"metric metric is NaN with variant 'L0H0' on prompt 1 \(of 3\)"):
        hooked.sweep(model, clean, variants, nan_when_moved(clean_logits))
    with pytest.raises(ValueError, match=r"NaN on the base run \(no variant\) on prompts 0, 1, 2 \(of 3\)"):
        hooked.sweep(model, clean, variants, always_nan)
    with pytest.raises(ValueError, match="NaN on the corrupt run"):
        patch.attribution(model, corrupt, clean, always_nan)
    assert no_hooks(model)


def test_edge_patching_and_path_patching_name_the_variant(setup):
    model, clean, corrupt, clean_logits = setup
    metric = nan_when_moved(clean_logits, rows=(0, 2))
    with pytest.raises(ValueError, match=r"NaN with variant 'a' on prompts 0, 2 \(of 3\)"):
        circuits.patch_edges(model, clean, corrupt, {"none": [], "a": ["L0H0->logits"]}, metric)
    for method in ("direct", "wang"):
        with pytest.raises(ValueError, match=r"NaN with pair 'L0H0->logits' on prompts 0, 2"):
            circuits.path_patch(model, clean, corrupt, ["L0H0"], ["logits"], metric, method=method)
    with pytest.raises(ValueError, match="NaN on the clean run"):
        circuits.patch_edges(model, clean, corrupt, {"a": ["L0H0->logits"]}, always_nan)
    assert no_hooks(model)


def test_acdc_with_a_nan_metric_is_an_error_not_every_edge_kept(setup):
    model, clean, corrupt, clean_logits = setup
    with pytest.raises(ValueError, match="NaN on the clean run"):
        circuits.discover(model, clean, corrupt, always_nan, method="acdc", threshold=0.1)
    # finite on the clean run, NaN in the first trial: the trial's edge is named
    with pytest.raises(ValueError, match=r"NaN with the ACDC trial removing \S+->logits on prompt 1"):
        circuits.discover(model, clean, corrupt, nan_when_moved(clean_logits), method="acdc", threshold=0.1)
    assert no_hooks(model)


def test_attribution_names_the_run_and_refuses_a_nan_gradient(setup):
    model, clean, corrupt, _ = setup
    with pytest.raises(ValueError, match="NaN on the clean run"):
        circuits.attribute(model, clean, corrupt, always_nan)
    with pytest.raises(ValueError, match=r"NaN at the EAP-IG point alpha=0.1 .* on prompts 0, 1, 2"):
        circuits.attribute(model, clean, corrupt, _nan_off_clean(model, clean), method="eap-ig", steps=5)

    def sqrt_at_zero(logits, *, base_logits=None, attention_mask=None):
        difference = logits[:, -1, 3] - logits[:, -1, 3].detach()  # 0, with gradient 1
        return torch.sqrt(difference) + logits[:, -1, 5] - logits[:, -1, 5].detach()  # 0; its gradient is inf

    with pytest.raises(ValueError, match="score of .* edges is NaN or infinite"):
        circuits.attribute(model, clean, corrupt, sqrt_at_zero)
    with pytest.raises(ValueError, match=r"estimate of .* variants is NaN or infinite \(L0H0, L0H1"):
        patch.attribution(model, corrupt, clean, sqrt_at_zero)
    with pytest.raises(ValueError, match=r"score of .* features is NaN or infinite \(L0.resid_post.F"):
        hooked.sae.attribute(model, clean, corrupt, sqrt_at_zero, saes=[_sae(model)])
    with pytest.raises(ValueError, match="NaN on the corrupt run"):  # the run it makes first
        hooked.sae.attribute(model, clean, corrupt, always_nan, saes=[_sae(model)])
    assert no_hooks(model)


def _nan_off_clean(model, clean):
    """NaN wherever the input embedding is not the clean one: the metric at EAP-IG's interpolated points."""
    with torch.no_grad():
        clean_logits = model(clean)
    return nan_when_moved(clean_logits, rows=(0, 1, 2))


def _sae(model):
    from tests.sae.dictionaries import random_dictionary

    return random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post")


@pytest.mark.unchecked
@pytest.mark.parametrize("threshold", [-0.1, 0, 0.0, math.nan, math.inf, -math.inf, True, "0.1", None])
def test_acdc_thresholds_are_checked_before_anything_runs(setup, threshold):
    model, clean, corrupt, _ = setup
    calls = []

    def counting(logits, *, base_logits=None, attention_mask=None):
        calls.append(1)
        return logits[:, -1, 3] - logits[:, -1, 5]

    with pytest.raises(ValueError, match="threshold"):
        circuits.discover(model, clean, corrupt, counting, method="acdc", threshold=threshold)
    assert not calls and no_hooks(model)
    if threshold is not None:
        experiment = Experiment.of(model, clean, corrupt, metrics.logit_diff(None, [3] * 3, [5] * 3))
        with pytest.raises(ValueError, match="threshold must be a finite number > 0"):
            acdc(experiment, threshold)


@pytest.mark.unchecked
@pytest.mark.parametrize("n_edges", [-1, True, 2.0])
def test_n_edges_is_checked(setup, n_edges):
    model, clean, corrupt, _ = setup
    with pytest.raises(ValueError, match="n_edges must be a non-negative int"):
        circuits.discover(
            model, clean, corrupt, metrics.logit_diff(None, [3] * 3, [5] * 3), method="eap", n_edges=n_edges
        )
