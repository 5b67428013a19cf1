"""How a graph is computed does not change it: `graphs.attribute_batch`'s graphs from shared passes each equal their
prompt attributed alone (`graphs.attribute` with the rows per backward pass the batch gives each prompt), and
features contracted a few positions at a time equal them contracted all at once."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from hooked import graphs
from tests.graphs.test_attribute import random_clt, tiny, transcoder_set

PROMPTS = [[3, 17, 42, 8, 25, 11, 60], [3, 9, 14, 2, 33, 50, 7], [3, 40, 41], [3, 5, 6, 7, 8, 9, 10], [3, 22, 23]]


def assert_same(batched: graphs.Graph, alone: graphs.Graph) -> None:
    """Tokens and feature indices are integers, compared exactly: the features are chosen from activations (and
    influences) equal to float64 rounding across batch shapes, none within rounding of a threshold or a tie here.
    The adjacency, sums in another order, to float64 rounding."""
    assert torch.equal(batched.input_tokens, alone.input_tokens)
    assert torch.equal(batched.active_features, alone.active_features)
    assert torch.equal(batched.selected_features, alone.selected_features)
    assert batched.logit_targets == alone.logit_targets
    a, b = batched.adjacency, alone.adjacency
    if a.is_sparse:
        a, b = a.to_dense(), b.to_dense()
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * float(b.abs().max()))


@pytest.mark.parametrize(
    "case",
    [
        dict(arch="gpt2", clt=False, settings={}),
        dict(arch="llama", clt=True, settings={}),
        dict(arch="gpt2", clt=False, settings=dict(max_feature_nodes=7)),  # influence-ranked, per prompt
        dict(arch="llama", clt=False, settings=dict(edges_per_row=5)),
        dict(arch="gpt2", clt=False, settings=dict(attribution_targets=[9, np.int64(2), torch.tensor(30)])),  # ints
        dict(arch="llama", clt=True, settings=dict(attribution_targets=[("up", 0.5, torch.linspace(-1, 1, 32))])),
    ],
    ids=["set", "clt", "max_feature_nodes", "edges_per_row", "token targets", "custom target"],
)
def test_each_graph_of_a_batch_equals_its_prompt_alone(case):
    model = tiny(case["arch"])
    transcoders = random_clt(model, skip=True) if case["clt"] else transcoder_set(model, skip=True)
    chosen = {} if "attribution_targets" in case["settings"] else dict(max_n_logits=3, desired_logit_prob=0.9)
    settings = dict(**chosen, **case["settings"])
    batch_size = 6
    batched = graphs.attribute_batch(model, PROMPTS, transcoders, batch_size=batch_size, **settings)
    assert len(batched) == len(PROMPTS)
    # prompts group by length: three of 7 tokens share a pass (2 copies each), two of 3 tokens (3 copies each)
    for prompt, graph in zip(PROMPTS, batched, strict=True):
        copies = batch_size // sum(len(p) == len(prompt) for p in PROMPTS)
        alone = graphs.attribute(model, torch.tensor(prompt), transcoders, batch_size=copies, **settings)
        assert_same(graph, alone)


def test_a_batch_shares_its_passes():
    """Three prompts of one length in one pass: fewer backward passes than three separate runs (counted at the
    injection), the point of batching."""
    model = tiny("gpt2")
    transcoders = transcoder_set(model, skip=False)
    prompts = [p for p in PROMPTS if len(p) == 7]
    calls = []
    original = torch.autograd.backward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.autograd.backward = counting
    try:
        graphs.attribute_batch(model, prompts, transcoders, batch_size=12, max_n_logits=2)
        together = len(calls)
        calls.clear()
        for prompt in prompts:
            graphs.attribute(model, torch.tensor(prompt), transcoders, batch_size=4, max_n_logits=2)
        apart = len(calls)
    finally:
        torch.autograd.backward = original
    assert together < apart


@pytest.mark.unchecked
def test_bad_batches_are_refused_naming_the_fix():
    model = tiny("gpt2")
    transcoders = transcoder_set(model, skip=False)
    with pytest.raises(TypeError, match="one prompt's token ids"):
        graphs.attribute_batch(model, [3, 4, 5], transcoders)
    with pytest.raises(TypeError, match="non-empty list"):
        graphs.attribute_batch(model, [], transcoders)
    with pytest.raises(ValueError, match=r"\[n_prompts, pos\]"):
        graphs.attribute_batch(model, torch.zeros(2, 3, 4, dtype=torch.long), transcoders)
    assert not any(point.listening for point in model.hook_dict.values())


def test_contracting_a_few_positions_at_a_time_changes_nothing(monkeypatch):
    """The contraction's [positions, slots, d] blocks are bounded (BLOCK_ELEMENTS); with a bound of one position's
    worth, every position is its own block, and the graph is the one computed in a single block."""
    model = tiny("llama")
    clt = random_clt(model, skip=True)
    whole = graphs.attribute(model, torch.tensor(PROMPTS[0]), clt, max_n_logits=3)
    module = importlib.import_module("hooked.graphs.nodes")
    monkeypatch.setattr(module, "BLOCK_ELEMENTS", 1)
    blocked = graphs.attribute(model, torch.tensor(PROMPTS[0]), clt, max_n_logits=3)
    assert_same(blocked, whole)
