"""Graph.prune, node_influence and scores on graphs small enough to work out by hand, and the sparse path against
the dense one. circuit-tracer 0.5.0 itself checks them in test_circuit_tracer_graphs.py (slow)."""

from __future__ import annotations

import pytest
import torch

from hooked.graphs import Graph, GraphScores, LogitTarget
from hooked.graphs.prune import find_threshold
from tests.graphs.random_graphs import random_graph, with_adjacency


def chain(adjacency_entries: dict[tuple[int, int], float], probability: float = 0.5) -> Graph:
    """One layer, one position: node 0 a feature, 1 the error, 2 the token, 3 the logit."""
    adjacency = torch.zeros(4, 4)
    for (target, source), weight in adjacency_entries.items():
        adjacency[target, source] = weight
    return Graph(
        input_tokens=torch.tensor([7]),
        input_string="x",
        active_features=torch.tensor([[0, 0, 5]]),
        activation_values=torch.tensor([1.0]),
        selected_features=torch.tensor([0]),
        adjacency=adjacency,
        logit_targets=[LogitTarget("y", 9)],
        logit_probabilities=torch.tensor([probability]),
        n_layers=1,
        vocab_size=16,
        feature_input_hook="blocks.{layer}.mlp.hook_in",
        feature_output_hook="blocks.{layer}.hook_mlp_out",
    )


# token -> feature (2), feature -> logit (3), error -> logit (-1), token -> logit (0.5), logit probability 1/2.
# The logit row normalised: feature 2/3, error 2/9, token 1/9; the feature row: token 1.
# Influence: feature 1/2 * 2/3 = 1/3, error 1/2 * 2/9 = 1/9, token 1/2 * 1/9 + 1/3 * 1 = 7/18, logit 0.
HAND = {(0, 2): 2.0, (3, 0): 3.0, (3, 1): -1.0, (3, 2): 0.5}


@pytest.mark.parametrize("sparse", [False, True])
def test_influence_and_scores_of_a_hand_worked_chain(sparse):
    graph = chain(HAND)
    if sparse:
        graph = with_adjacency(graph, graph.adjacency.to_sparse())
    torch.testing.assert_close(graph.node_influence(), torch.tensor([1 / 3, 1 / 9, 7 / 18, 0.0]))
    # replacement: tokens' share of tokens' and errors' influence, 7/18 / (7/18 + 2/18); completeness: each node's
    # non-error input share weighted by influence + logit weight (1/3, 1/9, 7/18, 1/2), only the logit's 7/9 < 1:
    # (1/3 + 1/9 + 7/18 + 1/2 * 7/9) / (4/3) = 11/12.
    assert graph.scores() == pytest.approx(GraphScores(7 / 9, 11 / 12), rel=1e-6)


@pytest.mark.parametrize("sparse", [False, True])
def test_pruning_a_hand_worked_chain(sparse):
    graph = chain(HAND)
    if sparse:
        graph = with_adjacency(graph, graph.adjacency.to_sparse())
    # Influences sorted: token 7/18, feature 6/18, error 2/18, logit 0; cumulative 7/15, 13/15, 1, 1: at 0.8 the
    # cut is the feature's 1/3, so the error goes. Without it the logit row is feature 6/7, token 1/7; edge scores
    # (weight share x (influence + logit weight)): feature -> logit 3/7, token -> feature 3/7, token -> logit 1/14,
    # cumulative 6/13, 12/13, 1: 0.98 keeps all three, 0.9 drops token -> logit.
    for edge_threshold, token_to_logit in ((0.98, True), (0.9, False)):
        pruned = graph.prune(node_threshold=0.8, edge_threshold=edge_threshold)
        assert pruned.node_mask.tolist() == [True, False, True, True]
        expected = torch.zeros(4, 4, dtype=torch.bool)
        expected[0, 2] = expected[3, 0] = True
        expected[3, 2] = token_to_logit
        edge_mask = pruned.edge_mask.to_dense() if sparse else pruned.edge_mask
        assert torch.equal(edge_mask, expected)  # boolean masks: no cumulative score lies near a threshold
        torch.testing.assert_close(pruned.cumulative_scores, torch.tensor([13 / 15, 1.0, 7 / 15, 1.0]))
        assert pruned.edges() == [(0, 2, 2.0), (3, 0, 3.0)] + ([(3, 2, 0.5)] if token_to_logit else [])


def test_a_feature_left_without_inputs_or_outputs_is_dropped():
    """A feature whose only outgoing edge falls under the edge threshold goes, and then its own inputs' edges."""
    graph = chain({(0, 2): 1.0, (3, 0): 0.01, (3, 2): 5.0})
    pruned = graph.prune(node_threshold=1.0, edge_threshold=0.9)
    assert pruned.node_mask.tolist() == [False, False, True, True]
    assert pruned.edges() == [(3, 2, 5.0)]


# Not 1.0: there the float32 cumulative sum decides whether the cut lands on the zeros (keeping every pair) or on
# the smallest score, and the two paths round differently (so does circuit-tracer between runs on other hardware).
@pytest.mark.parametrize("thresholds", [(0.8, 0.98), (0.5, 0.9), (0.95, 0.6), (0.99, 0.99)])
@pytest.mark.parametrize("settings", [dict(seed=0), dict(seed=4, n_pos=8, n_active=90, n_features=70, density=0.8)])
def test_the_sparse_path_equals_the_dense_one_when_it_holds_every_edge(settings, thresholds):
    dense = random_graph(**settings)
    sparse = with_adjacency(dense, dense.adjacency.to_sparse())
    ours, reference = sparse.prune(*thresholds), dense.prune(*thresholds)
    assert 0 < int(reference.node_mask[: dense.token_offset].sum()) <= dense.token_offset
    # boolean masks, exact: thresholds on scores equal to float32 rounding, none within it of a cut (not 1.0, above)
    assert torch.equal(ours.node_mask, reference.node_mask)
    stored = dense.adjacency != 0  # the sparse mask has entries only where the adjacency does
    assert torch.equal(ours.edge_mask.to_dense(), reference.edge_mask & stored)
    torch.testing.assert_close(ours.cumulative_scores, reference.cumulative_scores)
    torch.testing.assert_close(ours.node_influence, reference.node_influence)
    assert ours.edges() == reference.edges()
    assert sparse.scores() == pytest.approx(dense.scores(), rel=1e-5)


def test_a_top_k_sparse_graph_prunes_as_its_dense_copy():
    sparse = random_graph(seed=5, n_active=60, n_features=50, edges_per_row=5)
    dense = with_adjacency(sparse, sparse.adjacency.to_dense())
    ours, reference = sparse.prune(), dense.prune()
    assert ours.edge_mask.is_sparse and ours.edge_mask._nnz() == sparse.adjacency._nnz()
    # boolean masks, exact: thresholds on scores equal to float32 rounding, none within it of a cut
    assert torch.equal(ours.node_mask, reference.node_mask)
    assert torch.equal(ours.edge_mask.to_dense(), reference.edge_mask)
    assert sparse.scores() == pytest.approx(dense.scores(), rel=1e-5)


@pytest.mark.unchecked
def test_bad_thresholds_and_cycles_are_refused_naming_the_problem():
    graph = random_graph()
    with pytest.raises(ValueError, match="node_threshold must be between 0.0 and 1.0"):
        graph.prune(node_threshold=1.5)
    with pytest.raises(ValueError, match="edge_threshold must be between 0.0 and 1.0"):
        graph.prune(edge_threshold=-0.1)
    cyclic = chain({(3, 0): 1.0, (0, 0): 1.0})  # a feature driving itself, its only input: influence never fades
    with pytest.raises(RuntimeError, match="the adjacency has a cycle"):
        cyclic.prune()
    weightless = chain(HAND, probability=0.0)  # e.g. a file whose logit probabilities underflowed
    for measure in (weightless.prune, weightless.scores, weightless.node_influence):
        with pytest.raises(ValueError, match=r"logit nodes weigh 0.0 in all .* pruning and scores mean nothing"):
            measure()


def test_a_cut_past_the_stored_scores_lands_on_the_implicit_zeros_as_the_dense_one_does():
    """At threshold 1.0 a float32 cumulative sum can stop short of 1, and the dense cut then falls on the zeros;
    the sparse cut, over the stored scores only, must fall there too when there are unstored zeros."""
    stored = torch.rand(50, generator=torch.Generator().manual_seed(0))
    dense_cut = find_threshold(torch.cat([stored, torch.zeros(50)]), 1.0)
    assert dense_cut == 0  # this vector's cumulative sum stops short of 1 (chosen so)
    assert find_threshold(stored, 1.0, n_total=100) == dense_cut
    assert find_threshold(stored, 1.0, n_total=50) == stored.min()  # no zeros: the smallest stored score
