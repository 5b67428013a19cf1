"""Small consistency points of issue 31: `EdgeScores.values` is an attribute, as `SweepResult.values` (the old call
says so); a plain list of edges given to `patch_edges` is a variant named after its edges, not "edges"."""

from __future__ import annotations

import copy

import pytest
import torch

from hooked import circuits, metrics
from hooked.testing import random_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def setup():
    model = random_model("gpt2", seed=5, n_layers=2, d_model=16)
    generator = torch.Generator().manual_seed(6)
    clean, corrupt = (torch.randint(0, model.cfg.d_vocab, (2, 5), generator=generator) for _ in range(2))
    return model, clean, corrupt, metrics.logit_diff(None, [3, 4], [5, 6])


def test_edge_scores_values_is_an_attribute(setup):
    model, clean, corrupt, metric = setup
    scores = circuits.attribute(model, clean, corrupt, metric)
    values = scores.values
    expected = torch.tensor([scores[edge] for edge in scores.graph.edges])  # each edge looked up by name
    torch.testing.assert_close(values, expected, rtol=0, atol=0)  # the same numbers, read two ways
    with pytest.raises(TypeError, match=r"EdgeScores.values is an attribute .* write scores.values, not"):
        scores.values()
    # Everything done with it is a plain tensor, copies included.
    for derived in (values.abs(), values[0], values + 1, copy.deepcopy(values), torch.stack([values, values])):
        assert type(derived) is torch.Tensor
    assert repr(values).startswith("tensor(")
    assert scores.top(1)[0][1] == float(values[values.abs().argmax()])


def test_a_plain_list_of_edges_is_named_after_its_edges(setup):
    model, clean, corrupt, metric = setup
    edges = ["L0H0->logits", ("L0H1", "L1H0.v"), ("L0.mlp", "logits", -1)]
    listed = circuits.patch_edges(model, clean, corrupt, edges, metric)
    named = circuits.patch_edges(model, clean, corrupt, {"x": edges}, metric)
    assert listed.variants == ["L0H0->logits+L0H1->L1H0.v+L0.mlp->logits@-1"]
    torch.testing.assert_close(listed.values, named.values, rtol=0, atol=0)  # the same edges: the same runs
    one = circuits.patch_edges(model, clean, corrupt, "L0H0->logits", metric)  # one edge, not its characters
    assert one.variants == ["L0H0->logits"]
    torch.testing.assert_close(
        one.values, circuits.patch_edges(model, clean, corrupt, {"y": ["L0H0->logits"]}, metric).values
    )
    assert circuits.patch_edges(model, clean, corrupt, [], metric).variants == ["no edges"]
