"""What a circuit study reaches for: ACDC with KL divergence, ACDC's signed criterion, per-prompt positions.

Every expected value comes from code in this file or in `tests/circuits/test_circuits.py`'s plain-hook
references (`brute_patch`: one forward of `run_with_hooks` adding (patched - current) at each receiver),
never from hooked.circuits:

- ACDC: a plain sequential ACDC, one edge at a time in ACDC's order, each trial a `brute_patch` forward;
  KL divergence to the clean model's logits (the ACDC paper's metric), the two-sided and the signed criterion;
- per-prompt positions: `patch_at_columns` (brute_patch adding the term at each prompt's own columns only) and
  test_circuits.brute_wang with `columns` (Wang et al.'s two forwards, the second replacing the receivers' inputs
  at those columns);
  attribution at positions from gradients taken by hand;
- experts as nodes (Qwen3-MoE, Mixtral): each expert's write computed by hand from the per-slot points
  (`expert_writes`), patched with plain hooks (`expert_patch`), and its EAP score from hand gradients.

Each test was seen to fail with a deliberate break (the signed direction flipped, per-prompt positions read as
the first prompt's, Wang's second forward patching every position, the position mask dropped from EAP's sum,
experts scattered to the wrong slot of hook_expert_result).
"""

from __future__ import annotations

import pytest
import torch

from hooked import circuits, metrics
from hooked.circuits import experiment as experiment_module
from hooked.testing import random_model
from tests.circuits.test_circuits import (
    answers_metric,
    brute_patch,
    brute_wang,
    direct_edges,
    hand_gradients,
    is_whole,
    layout,
    no_hooks,
    paired_prompts,
    receiver_point,
    ref_acdc_order,
    ref_edges,
    run_metric,
    score,
    shape,
    slot,
    small_model,
    source_point,
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
        # ranked by harm: the kept edges first, ahead of edges whose removal raised the metric however far
        ranking = found.ranking()
        assert {str(e) for e in ranking[: len(kept)]} == {str(e) for e in kept}, batch_edges
        signed = [found.scores[str(e)] for e in ranking]
        assert signed == sorted(signed, reverse=True)
    assert set(kept) != set(two_sided)  # the criteria differ on this model: the test tells them apart


@pytest.mark.unchecked
def test_eap_refuses_kl_naming_why():
    model = small_model("gpt2", seed=3)
    clean, corrupt, _ = paired_prompts(model, 2, 4, seed=4)
    with pytest.raises(ValueError, match="gradient is 0.*method='eap-ig'"):
        circuits.discover(model, clean, corrupt, metrics.kl_div(), method="eap", n_edges=5)
    with pytest.raises(ValueError, match="gradient is 0.*method='eap-ig'"):
        circuits.attribute(model, clean, corrupt, metrics.kl_div(), method="eap")
    with pytest.raises(ValueError, match="signed criterion"):
        circuits.discover(
            model, clean, corrupt, answers_metric(model, 2), method="eap", n_edges=5, abs_value_threshold=False
        )
    with pytest.raises(TypeError, match="abs_value_threshold"):
        circuits.discover(
            model, clean, corrupt, answers_metric(model, 2), method="acdc", threshold=0.1, abs_value_threshold="no"
        )
    assert no_hooks(model)


# ============================================================================= per-prompt positions
def columns_of(mask, positions):
    """Each prompt's columns for `positions` (a list of positions per prompt) in a left-padded batch."""
    pads, width = (~mask).sum(-1).tolist(), mask.shape[1]
    return [[pads[b] + p if p >= 0 else width + p for p in row] for b, row in enumerate(positions)]


def patch_at_columns(model, clean, corrupt, edges, metric, mask, columns):
    """`brute_patch` with each receiver's input changed at prompt b's `columns[b]` only: (corrupt - current) of
    each patched source there, `current` what the source wrote in this same forward."""
    n_layers = model.cfg.n_layers
    pairs = [e.split("->") for e in edges]
    points = {s: source_point(n_layers, s) for s, _ in pairs}
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt, attention_mask=mask, names_filter=[p for p, _ in points.values()])
    current = {}

    def capture(activation, hook):
        for source, (point, head) in points.items():
            if point == hook.name:
                current[source] = slot(activation, head).clone()

    at: dict[str, list] = {}
    for source, receiver in pairs:
        point, head = receiver_point(n_layers, receiver)
        at.setdefault(point, []).append((head, source))

    def receive(activation, hook):
        activation = activation.clone()
        for head, source in at[hook.name]:
            point, source_head = points[source]
            for b, row in enumerate(columns):
                for column in row:
                    delta = slot(cache[point], source_head)[b, column] - current[source][b, column]
                    slot(activation, head)[b, column] += delta
        return activation

    names = {p for p, _ in points.values()}
    with torch.no_grad():
        logits = model.run_with_hooks(
            clean, attention_mask=mask, fwd_hooks=[(n, capture) for n in names] + [(n, receive) for n in at]
        )
    return score(model, metric, logits, mask)


def close(actual, expected):
    scale = max(1.0, float(expected.abs().max()))
    assert torch.allclose(actual, expected, atol=2e-5 * scale, rtol=0), (actual, expected)


@pytest.mark.parametrize("arch", ["gpt2", "qwen3"])
def test_patch_edges_at_each_prompts_own_position_equals_plain_hooks(arch):
    """`positions=` a [batch] tensor: prompt b's receivers read the patched term at its own position only."""
    model = small_model(arch, seed=61)
    clean, corrupt, mask = paired_prompts(model, 3, 6, seed=62, padded=True)
    metric = answers_metric(model, 3, position=None)  # reads every position, so any column's change shows
    kv = "L1KV0.k" if model.cfg.n_kv_heads != model.cfg.n_heads else "L1H0.k"
    variants = {"q": ["L0H0->L1H1.q"], "mlp and logits": ["input->L1.mlp", "L0.mlp->logits"], "kv": [f"L0H1->{kv}"]}
    per_prompt = torch.tensor([0, 1, -2])  # prompt 2 is the shortest (3 tokens): -2 is its second
    for positions, rows in ((per_prompt, [[0], [1], [-2]]), ([0, -1], [[0, -1]] * 3)):
        result = circuits.patch_edges(model, clean, corrupt, variants, metric, positions=positions, attention_mask=mask)
        everywhere = circuits.patch_edges(model, clean, corrupt, variants, metric, attention_mask=mask)
        for name, edges in variants.items():
            expected = patch_at_columns(model, clean, corrupt, edges, metric, mask, columns_of(mask, rows))
            close(result[name], expected)
            assert not torch.allclose(result[name], everywhere[name], atol=1e-5)  # positions are not all of them
    assert result.provenance["circuits"]["positions"] == [0, -1]
    assert no_hooks(model)


@pytest.mark.parametrize("method", ["direct", "wang"])
def test_path_patching_at_end_and_per_prompt_equals_plain_hooks(method):
    """Wang et al. patch the name movers' queries at END only: `path_patch(..., positions=-1)`."""
    model = small_model("gpt2", seed=71, n_layers=3)
    clean, corrupt, mask = paired_prompts(model, 3, 6, seed=72, padded=True)
    metric = answers_metric(model, 3, position=None)
    for senders, receivers in ((["L0H0", "L1H1"], ["L2H0.q"]), (["L0H1"], ["L2H1"]), (["L1.mlp"], ["logits"])):
        for positions, rows in ((-1, [[-1]] * 3), (torch.tensor([2, 0, 1]), [[2], [0], [1]])):
            result = circuits.path_patch(
                model,
                clean,
                corrupt,
                senders,
                receivers,
                metric,
                method=method,
                positions=positions,
                attention_mask=mask,
            )
            columns = columns_of(mask, rows)
            if method == "direct":
                edges = direct_edges(model, senders, receivers)
                expected = patch_at_columns(model, clean, corrupt, edges, metric, mask, columns)
            else:
                expected = brute_wang(model, clean, corrupt, senders, receivers, metric, mask, columns=columns)
            close(result.values[0], expected)
    assert no_hooks(model)


@pytest.mark.unchecked
def test_positions_are_checked_before_anything_runs(monkeypatch):
    model = small_model("gpt2", seed=3)
    clean, corrupt, mask = paired_prompts(model, 3, 5, seed=4, padded=True)
    metric = answers_metric(model, 3)
    runs = []
    monkeypatch.setattr(experiment_module, "record", lambda *args: runs.append(args))  # the first forward
    with pytest.raises(ValueError, match="gives 2 positions, one per prompt"):
        circuits.patch_edges(
            model, clean, corrupt, ["input->logits"], metric, positions=torch.tensor([1, 2]), attention_mask=mask
        )
    with pytest.raises(ValueError, match="does not exist in prompt"):
        circuits.path_patch(model, clean, corrupt, ["L0H0"], ["L1H0"], metric, positions=4, attention_mask=mask)
    with pytest.raises(ValueError, match="carries its own position"):
        circuits.patch_edges(model, clean, corrupt, {"x": ["input->logits@-1"]}, metric, positions=-1)
    with pytest.raises(TypeError, match="1-D integer tensor"):
        circuits.patch_edges(model, clean, corrupt, ["input->logits"], metric, positions=torch.tensor([0.5] * 3))
    assert not runs
    assert no_hooks(model)


@pytest.mark.parametrize("arch", ["gpt2", "qwen3"])
def test_attribution_at_each_prompts_own_position_equals_hand_gradients(arch):
    """`attribute(..., positions=)`: (patched_S - clean_S) . d metric / d input_R summed over each prompt's own
    columns only, the gradient taken by hand (a zero tensor added at the receiver's input and differentiated)."""
    model = small_model(arch, seed=81)
    clean, corrupt, mask = paired_prompts(model, 3, 6, seed=82, padded=True)
    metric = answers_metric(model, 3, position=None)
    n_layers = model.cfg.n_layers
    kv = "L1KV0.v" if model.cfg.n_kv_heads != model.cfg.n_heads else "L1H0.v"
    edges = ["input->L0H1.q", "L0H0->L1H1.q", f"L0.mlp->{kv}", "L0H1->L1.mlp", "L1H0->logits", "input->logits"]
    sources = sorted({source_point(n_layers, e.split("->")[0])[0] for e in edges})
    points = sorted({receiver_point(n_layers, e.split("->")[1])[0] for e in edges})
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, attention_mask=mask, names_filter=sources)
        _, corrupt_cache = model.run_with_cache(corrupt, attention_mask=mask, names_filter=sources)
    start, end = clean_cache["blocks.0.hook_resid_pre"], corrupt_cache["blocks.0.hook_resid_pre"]
    rows = [[1], [3], [-1]]
    selected = torch.zeros(mask.shape)
    for b, row in enumerate(columns_of(mask, rows)):
        selected[b, row] = 1.0
    for method, alphas in (("eap", [0.0]), ("eap-ig", [0.25, 0.75])):
        grads = {p: 0.0 for p in points}
        for alpha in alphas:
            for point, grad in hand_gradients(
                model, clean, metric, mask, points, start + alpha * (end - start)
            ).items():
                grads[point] = grads[point] + grad / len(alphas)
        scores = circuits.attribute(
            model,
            clean,
            corrupt,
            metric,
            method=method,
            steps=2,
            positions=torch.tensor([1, 3, -1]),
            attention_mask=mask,
        )
        whole = circuits.attribute(model, clean, corrupt, metric, method=method, steps=2, attention_mask=mask)
        for edge in edges:
            source, receiver = edge.split("->")
            (s_point, s_head), (r_point, r_head) = source_point(n_layers, source), receiver_point(n_layers, receiver)
            delta = slot(corrupt_cache[s_point], s_head) - slot(clean_cache[s_point], s_head)
            expected = float((delta * slot(grads[r_point], r_head) * selected[..., None]).sum() / 3)
            assert abs(scores[edge] - expected) < 1e-4 * max(1.0, abs(expected)), (method, edge)
            assert abs(scores[edge] - whole[edge]) > 1e-6, (method, edge)  # one position per prompt is not all
    assert no_hooks(model)


# ============================================================================= experts as nodes
MOE = {
    "qwen3_moe": dict(
        n_layers=2,
        d_model=16,
        n_heads=2,
        n_kv_heads=1,
        d_head=8,
        d_mlp=32,
        d_vocab=32,
        n_experts=4,
        top_k=2,
        d_expert_mlp=8,
    ),
    "mixtral": dict(
        n_layers=2, d_model=16, n_heads=2, n_kv_heads=1, d_head=8, d_mlp=8, d_vocab=32, n_experts=4, top_k=2
    ),
}
SLOT_POINTS = ("hook_expert_post", "hook_expert_weights", "hook_expert_indices")


def expert_writes(model, layer, values):
    """Each expert's routed write [batch pos n_experts d_model] from the per-slot hooks' values, by hand:
    sum over the slots holding expert e of weight * post @ W_out[e]."""
    post, weights, indices = (values[f"blocks.{layer}.mlp.{name}"] for name in SLOT_POINTS)
    w_out = model.blocks[layer].mlp.W_out.detach()  # [n_experts d_expert_mlp d_model]
    n_experts = w_out.shape[0]
    out = torch.zeros(*indices.shape[:2], n_experts, w_out.shape[-1])
    for e in range(n_experts):
        chosen = (indices == e).to(post.dtype) * weights  # [batch pos top_k]
        out[:, :, e] = torch.einsum("bpk,bpkm,md->bpd", chosen, post, w_out[e])
    return out


def expert_patch(model, clean, corrupt, edges, metric, mask):
    """Plain hooks: each receiver reads (corrupt - current) of each patched source added to its input, an expert's
    write computed by `expert_writes` from the per-slot hooks of the corrupt run and of this same forward."""
    n_layers = model.cfg.n_layers
    pairs = [e.split("->") for e in edges]
    slot_points = [f"blocks.{layer}.mlp.{name}" for layer in range(n_layers) for name in SLOT_POINTS]
    head_points = [source_point(n_layers, s)[0] for s, _ in pairs if ".E" not in s]
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt, attention_mask=mask, names_filter=slot_points + head_points)
    current: dict[str, torch.Tensor] = {}

    def capture(activation, hook):
        current[hook.name] = activation.clone()

    def value(source, values):
        if ".E" in source:
            layer, expert = (int(x) for x in source[1:].split(".E"))
            return expert_writes(model, layer, values)[:, :, expert]
        point, head = source_point(n_layers, source)
        return slot(values[point], head)

    at: dict[str, list] = {}
    for source, receiver in pairs:
        point, head = receiver_point(n_layers, receiver)
        at.setdefault(point, []).append((head, source))

    def receive(activation, hook):
        activation = activation.clone()
        for head, source in at[hook.name]:
            slot(activation, head)[...] += value(source, cache) - value(source, current)
        return activation

    hooks = [(n, capture) for n in set(slot_points + head_points)] + [(n, receive) for n in at]
    with torch.no_grad():
        logits = model.run_with_hooks(clean, attention_mask=mask, fwd_hooks=hooks)
    return score(model, metric, logits, mask)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_expert_edges_equal_plain_hooks(arch, tmp_path):
    """`experts=True`: each expert a source (its routed write); edge patching equals plain hooks that add the
    expert's corrupt-run write minus its write in this forward (the receivers' own routers recomputed)."""
    model = random_model(arch, seed=91, **MOE[arch])
    clean, corrupt, mask = paired_prompts(model, 3, 5, seed=92, padded=True)
    metric = answers_metric(model, 3)
    g = circuits.graph(model, experts=True)
    assert [s.name for s in g.sources if ".E" in s.name] == [f"L{layer}.E{e}" for layer in (0, 1) for e in range(4)]
    assert "L0.mlp" not in [s.name for s in g.sources] and "L0.mlp" in [r.name for r in g.receivers]
    variants = {
        "q": ["L0.E1->L1H0.q"],
        "v": ["L0.E2->L1KV0.v"],
        "mlp": ["L0.E0->L1.mlp"],
        "logits": ["L1.E3->logits"],
        "mixed": ["L0.E3->logits", "L0.E1->L1.mlp", "L0H1->L1.mlp", "input->L1.mlp", "L1.E0->logits"],
    }
    result = circuits.patch_edges(model, clean, corrupt, variants, metric, experts=True, attention_mask=mask)
    for name, edges in variants.items():
        close(result[name], expert_patch(model, clean, corrupt, edges, metric, mask))
    every = circuits.patch_edges(
        model, clean, corrupt, {"all": list(g.edges)}, metric, experts=True, attention_mask=mask
    )
    close(every["all"], run_metric(model, corrupt, metric, mask))  # every edge patched: the corrupt run
    found = circuits.discover(
        model, clean, corrupt, metric, method="acdc", threshold=0.05, experts=True, attention_mask=mask
    )
    assert any(".E" in node for node in found.nodes) or not found.edges
    back = circuits.Circuit.from_json(found.to_json(tmp_path / "c.json"), model=model)
    assert back.edges == found.edges and back.graph.expert_layers == g.expert_layers
    assert torch.isfinite(torch.tensor(found.faithfulness()))  # measured on the expert graph
    assert no_hooks(model)


def test_experts_on_a_dense_model_are_refused():
    with pytest.raises(ValueError, match="no such layer"):
        circuits.graph(small_model("gpt2"), experts=True)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_eap_scores_of_expert_edges_equal_hand_gradients(arch):
    """EAP of `L{l}.E{e} -> R`: (corrupt - clean write of the expert, by hand from the per-slot points) . the
    gradient at R's input, taken by hand, summed over positions, averaged over prompts."""
    model = random_model(arch, seed=93, **MOE[arch])
    clean, corrupt, mask = paired_prompts(model, 3, 5, seed=94, padded=True)
    metric = answers_metric(model, 3)
    n_layers = model.cfg.n_layers
    edges = ["L0.E1->L1H0.q", "L0.E2->logits", "L1.E3->logits", "L0.E0->L1.mlp", "L0.E3->L1KV0.v"]
    slot_points = [f"blocks.{layer}.mlp.{name}" for layer in range(n_layers) for name in SLOT_POINTS]
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, attention_mask=mask, names_filter=slot_points)
        _, corrupt_cache = model.run_with_cache(corrupt, attention_mask=mask, names_filter=slot_points)
    points = sorted({receiver_point(n_layers, e.split("->")[1])[0] for e in edges})
    grads = hand_gradients(model, clean, metric, mask, points)
    scores = circuits.attribute(model, clean, corrupt, metric, experts=True, attention_mask=mask)
    for edge in edges:
        source, receiver = edge.split("->")
        layer, expert = (int(x) for x in source[1:].split(".E"))
        delta = (expert_writes(model, layer, corrupt_cache) - expert_writes(model, layer, clean_cache))[:, :, expert]
        r_point, r_head = receiver_point(n_layers, receiver)
        expected = float((delta * slot(grads[r_point], r_head)).sum() / 3)
        assert abs(scores[edge] - expected) < 1e-4 * max(1.0, abs(expected)), (edge, scores[edge], expected)
    assert max(abs(scores[e]) for e in edges) > 1e-3
    assert no_hooks(model)


def test_acdc_at_each_prompts_own_position_equals_a_sequential_acdc(tmp_path):
    """`discover(positions=)`: every trial patches the edges at each prompt's own position only; the sequential
    reference patches them with plain hooks there (`patch_at_columns`), and so does faithfulness's formula."""
    model = small_model("gpt2", seed=101)
    clean, corrupt, mask = paired_prompts(model, 3, 6, seed=102, padded=True)
    metric = answers_metric(model, 3, position=None)
    positions, rows = torch.tensor([2, 0, -1]), [[2], [0], [-1]]
    columns = columns_of(mask, rows)

    def value(edges):
        return float(patch_at_columns(model, clean, corrupt, edges, metric, mask, columns).mean())

    current = float(run_metric(model, clean, metric, mask).mean())
    order = ref_acdc_order(*shape(model))
    for threshold in (0.02, 0.04, 0.01, 0.08):
        removed, kept, moves, now = [], [], {}, current
        for edge in order:
            trial = value(removed + [edge])
            moves[edge] = abs(trial - now)
            if moves[edge] < threshold:
                removed.append(edge)
                now = trial
            else:
                kept.append(edge)
        if min(abs(m - threshold) for m in moves.values()) > 1e-4 and 3 <= len(kept) <= len(order) - 3:
            break
    else:
        pytest.fail("no threshold gave a clear decision on every edge")
    g = circuits.graph(model)
    found = circuits.discover(
        model, clean, corrupt, metric, method="acdc", threshold=threshold, positions=positions, attention_mask=mask
    )
    assert set(found.edges) == set(circuits.prune(g, kept))
    empty = value([str(e) for e in g.edges])
    outside = [str(e) for e in g.edges if e not in set(found.edges)]
    expected = (value(outside) - empty) / (current - empty)
    assert abs(found.faithfulness() - expected) < 1e-4
    back = circuits.Circuit.from_json(found.to_json(tmp_path / "c.json"), model=model)
    assert (
        back.positions == found.positions
        and abs(back.faithfulness(clean, corrupt, metric, attention_mask=mask, positions=positions) - expected) < 1e-4
    )
    with pytest.raises(ValueError, match="give\\s+theirs, positions="):
        back.faithfulness(clean, corrupt, metric, attention_mask=mask)
    assert no_hooks(model)
