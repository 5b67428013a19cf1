"""What a circuit study reaches for: ACDC with KL divergence, ACDC's signed criterion, per-prompt positions.

Every expected value comes from code in this file or in `tests/circuits/test_circuits.py`'s plain-hook
references (`brute_patch`: one forward of `run_with_hooks` adding (patched - current) at each receiver),
never from hooked.circuits:

- ACDC: a plain sequential ACDC, one edge at a time in ACDC's order, each trial a `brute_patch` forward;
  KL divergence to the clean model's logits (the ACDC paper's metric), the two-sided and the signed criterion.
"""

from __future__ import annotations

import pytest
import torch

from hooked import circuits, metrics
from tests.circuits.test_circuits import (
    answers_metric,
    brute_patch,
    is_whole,
    layout,
    no_hooks,
    paired_prompts,
    ref_acdc_order,
    ref_edges,
    run_metric,
    shape,
    small_model,
)


class KLToClean:
    """KL(clean model || run) at the last position, as `brute_patch` calls a metric: `metric(logits)`."""

    position = -1

    def __init__(self, clean_logits):
        self.clean_logits = clean_logits

    def __call__(self, logits, **_):
        return metrics.kl_div()(logits, base_logits=self.clean_logits)


def sequential_acdc(model, clean, corrupt, metric, threshold, mask=None, signed_towards=None):
    """ACDC one trial at a time: an edge is removed for good when removing it gives
    `abs(new - current) < threshold`, or with `signed_towards` (+1: the metric rises towards the corrupt run,
    -1: it falls) `signed_towards * (new - current) < threshold`. Returns the kept edges and each trial's effect."""
    removed, kept, effects = [], [], {}
    current = float(run_metric(model, clean, metric, mask).mean())
    for edge in ref_acdc_order(*shape(model), whole=is_whole(model)):
        value = float(brute_patch(model, clean, corrupt, removed + [edge], metric, mask).mean())
        effect = abs(value - current) if signed_towards is None else signed_towards * (value - current)
        effects[edge] = effect
        if effect < threshold:
            removed.append(edge)
            current = value
        else:
            kept.append(edge)
    return kept, effects


def clear_threshold(model, clean, corrupt, metric, mask, candidates, signed_towards=None):
    """A threshold no trial's effect lies within rounding of, that keeps some edges and removes others."""
    n_edges = len(ref_edges(*shape(model), **layout(model)))
    for threshold in candidates:
        kept, effects = sequential_acdc(model, clean, corrupt, metric, threshold, mask, signed_towards)
        if min(abs(e - threshold) for e in effects.values()) > 1e-4 and 3 <= len(kept) <= n_edges - 3:
            return threshold, kept, effects
    pytest.fail("no threshold gave a clear decision on every edge")


@pytest.mark.parametrize(
    ("arch", "sizes", "thresholds"),
    [("gpt2", {}, (0.005, 0.01, 0.002)), ("qwen3", dict(n_heads=2, n_kv_heads=1, d_head=8), (0.02, 0.03, 0.01))],
)
def test_acdc_with_kl_divergence_equals_a_sequential_kl_acdc(arch, sizes, thresholds):
    """`discover(metric=metrics.kl_div(), method="acdc")`: KL to the clean run's logits, the ACDC paper's setting."""
    model = small_model(arch, seed=51, **sizes)
    clean, corrupt, mask = paired_prompts(model, 3, 5, seed=52, padded=arch != "gpt2")
    with torch.no_grad():
        reference_metric = KLToClean(model(clean, attention_mask=mask))
    g = circuits.graph(model)
    for signed_towards in (None, 1.0):  # KL is 0 at the clean run and rises towards the corrupt one
        threshold, kept, effects = clear_threshold(
            model, clean, corrupt, reference_metric, mask, thresholds, signed_towards
        )
        for batch_edges in (1, 16):
            found = circuits.discover(
                model,
                clean,
                corrupt,
                metrics.kl_div(),
                method="acdc",
                threshold=threshold,
                batch_edges=batch_edges,
                abs_value_threshold=signed_towards is None,
                attention_mask=mask,
            )
            assert set(found.edges) == set(circuits.prune(g, kept)), (signed_towards, batch_edges)
            for edge, effect in effects.items():
                assert abs(found.scores[edge] - effect) < 1e-4 * max(1.0, abs(effect)), edge
    assert no_hooks(model)


def test_signed_acdc_keeps_only_edges_whose_removal_does_harm():
    """With a logit difference (it falls towards the corrupt run) the signed criterion keeps an edge only when
    removing it lowers the metric by `threshold` or more; the two-sided one also keeps edges that raise it."""
    model = small_model("gpt2", seed=12)
    clean, corrupt, mask = paired_prompts(model, 3, 5, seed=13)
    metric = answers_metric(model, 3)
    threshold, kept, effects = clear_threshold(
        model, clean, corrupt, metric, mask, (0.05, 0.08, 0.12, 0.17, 0.03, 0.25), signed_towards=-1.0
    )
    two_sided, _ = sequential_acdc(model, clean, corrupt, metric, threshold, mask)
    g = circuits.graph(model)
    for batch_edges in (1, 7, 16):
        found = circuits.discover(
            model,
            clean,
            corrupt,
            metric,
            method="acdc",
            threshold=threshold,
            batch_edges=batch_edges,
            abs_value_threshold=False,
        )
        assert set(found.edges) == set(circuits.prune(g, kept)), batch_edges
        assert found.provenance["circuits"]["harm"] == "decrease"
        for edge, effect in effects.items():
            assert abs(found.scores[edge] - effect) < 1e-4 * max(1.0, abs(effect)), edge
    assert set(kept) != set(two_sided)  # the criteria differ on this model: the test tells them apart


@pytest.mark.unchecked
def test_attribution_methods_refuse_kl_naming_why():
    model = small_model("gpt2", seed=3)
    clean, corrupt, _ = paired_prompts(model, 2, 4, seed=4)
    for method in ("eap", "eap-ig"):
        with pytest.raises(ValueError, match="gradient is 0"):
            circuits.discover(model, clean, corrupt, metrics.kl_div(), method=method, n_edges=5)
        with pytest.raises(ValueError, match="gradient is 0"):
            circuits.attribute(model, clean, corrupt, metrics.kl_div(), method=method)
    with pytest.raises(ValueError, match="signed criterion"):
        circuits.discover(
            model, clean, corrupt, answers_metric(model, 2), method="eap", n_edges=5, abs_value_threshold=False
        )
    with pytest.raises(TypeError, match="abs_value_threshold"):
        circuits.discover(
            model, clean, corrupt, answers_metric(model, 2), method="acdc", threshold=0.1, abs_value_threshold="no"
        )
    assert no_hooks(model)
