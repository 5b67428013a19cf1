"""hooked/graphs/paths.py: the strongest path through a pruned graph against every path enumerated by brute force,
on random graphs with an attribution graph's zero structure, dense and sparse."""

from __future__ import annotations

import pytest
import torch

from hooked.graphs.paths import path_strengths, strongest_path
from tests.graphs.random_graphs import random_graph


def _all_paths(edges: dict[int, list[tuple[int, float]]], source: int, target: int) -> list[tuple[list[int], float]]:
    """Every path from source to target over `edges` (source -> [(target, share)]) with its product of shares."""
    found = []

    def walk(node, path, strength):
        if node == target:
            found.append((path, strength))
            return
        for nxt, share in edges.get(node, []):
            walk(nxt, [*path, nxt], strength * share)

    walk(source, [source], 1.0)
    return found


@pytest.mark.parametrize("edges_per_row", [None, 12])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_strongest_path_is_the_best_of_every_path_enumerated(seed, edges_per_row):
    graph = random_graph(seed=seed, n_layers=3, n_pos=4, n_active=30, n_features=20, edges_per_row=edges_per_row)
    pruned = graph.prune(node_threshold=0.9, edge_threshold=0.9)
    dense = graph.adjacency.to_dense()
    sums = dense.abs().sum(1)
    edges: dict[int, list[tuple[int, float]]] = {}
    for t, s, w in pruned.edges():
        edges.setdefault(s, []).append((t, abs(w) / float(sums[t])))
    target = graph.logit_offset
    checked = 0
    for position in range(graph.n_pos):
        source = graph.token_offset + position
        if not pruned.node_mask[source]:
            continue
        paths = _all_paths(edges, source, target)
        strengths = path_strengths(pruned, source, target)
        if not paths:
            assert strongest_path(pruned, source, target) == [] and not strengths.any()
            continue
        best_path, best = max(paths, key=lambda item: item[1])
        assert strongest_path(pruned, source, target) == best_path
        torch.testing.assert_close(strengths[source], torch.tensor(best))
        for node in range(graph.n_nodes):  # through each node: the best of the paths that visit it
            through = max((strength for path, strength in paths if node in path), default=0.0)
            torch.testing.assert_close(strengths[node], torch.tensor(through), atol=1e-7, rtol=1e-5)
        checked += 1
    assert checked >= 2


@pytest.mark.unchecked
def test_a_pruned_node_is_refused_as_an_end():
    graph = random_graph(seed=0)
    pruned = graph.prune(node_threshold=0.5, edge_threshold=0.9)
    dropped = int((~pruned.node_mask).nonzero()[0])
    with pytest.raises(ValueError, match=rf"source node {dropped} was pruned away"):
        path_strengths(pruned, dropped, graph.logit_offset)
    with pytest.raises(IndexError, match=r"target node .* is out of range"):
        strongest_path(pruned, graph.token_offset, graph.n_nodes)
