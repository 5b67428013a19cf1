"""The strongest paths through a pruned attribution graph: which features carry one node (an input token) to
another (a logit).

An edge's strength is its share of its target's direct input, |adjacency[t, s]| / sum over s' of |adjacency[t, s']|
(the row normalisation circuit-tracer 0.5.0's `graph.py` weighs influence by), and a path's strength is the product
of its edges' shares: the part of the target's input that flows along that path, share of a share. Over the edges
pruning kept, the strongest path from `source` to `target` is found by dynamic programming layer by layer (an
attribution graph's edges run from tokens to features of later layers to logits, so it has no cycle), and so is,
for every node, the strongest path through it. Signs are not multiplied: a path of inhibitions counts as strong.

    p = g.prune()
    through = path_strengths(p, source=g.token_offset + 2, target=g.logit_offset)   # [N]
    nodes = strongest_path(p, g.token_offset + 2, g.logit_offset)                    # [source, ..., target]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hooked.graphs.graph import Graph
    from hooked.graphs.prune import PrunedGraph


def path_strengths(pruned: PrunedGraph, source: int, target: int) -> Tensor:
    """[N]: for each node, the strength of the strongest kept path from `source` to `target` through it (0 where
    no kept path passes); `source` and `target` hold the strongest path's own strength."""
    forward, backward = _best(pruned, source, target)
    return forward * backward


def strongest_path(pruned: PrunedGraph, source: int, target: int) -> list[int]:
    """The nodes of the strongest kept path from `source` to `target`, in order; [] when none connects them."""
    forward, _ = _best(pruned, source, target)
    if forward[target] == 0:
        return []
    rows, cols, shares = _kept_edges(pruned)
    path = [target]
    while path[-1] != source:
        into = rows == path[-1]
        best = torch.argmax(forward[cols[into]] * shares[into])
        path.append(int(cols[into][best]))
    return path[::-1]


def _best(pruned: PrunedGraph, source: int, target: int) -> tuple[Tensor, Tensor]:
    """(strongest path from `source` to each node, strongest path from each node to `target`)."""
    graph = pruned.graph
    for name, node in (("source", source), ("target", target)):
        if not 0 <= node < graph.n_nodes:
            raise IndexError(f"{name} node {node} is out of range: the graph has {graph.n_nodes} nodes")
        if not pruned.node_mask[node]:
            raise ValueError(f"{name} node {node} was pruned away; a path runs between kept nodes")
    rows, cols, shares = _kept_edges(pruned)
    depth = node_depths(graph)
    forward = torch.zeros(graph.n_nodes)
    backward = torch.zeros(graph.n_nodes)
    forward[source] = 1.0
    backward[target] = 1.0
    for d in range(1, int(depth.max()) + 1):  # targets of depth d take from sources of smaller depth, done
        into = depth[rows] == d
        forward.scatter_reduce_(0, rows[into], forward[cols[into]] * shares[into], "amax")
    for d in range(int(depth.max()) - 1, -1, -1):
        out_of = depth[cols] == d
        backward.scatter_reduce_(0, cols[out_of], backward[rows[out_of]] * shares[out_of], "amax")
    return forward, backward


def node_depths(graph: Graph) -> Tensor:
    """[N]: 0 for tokens, layer + 1 for features and error nodes, n_layers + 1 for logits: every edge runs to a
    larger depth."""
    depth = torch.empty(graph.n_nodes, dtype=torch.long)
    depth[: graph.n_features] = graph.active_features[graph.selected_features, 0] + 1
    depth[graph.error_offset : graph.token_offset] = torch.arange(graph.n_layers).repeat_interleave(graph.n_pos) + 1
    depth[graph.token_offset : graph.logit_offset] = 0
    depth[graph.logit_offset :] = graph.n_layers + 1
    return depth


def _kept_edges(pruned: PrunedGraph) -> tuple[Tensor, Tensor, Tensor]:
    """(target, source, share of the target's input) of every kept edge between kept nodes."""
    adjacency = pruned.graph.adjacency
    if adjacency.is_sparse:
        adjacency = adjacency.coalesce()
        row_sums = torch.zeros(adjacency.shape[0]).index_add_(0, adjacency.indices()[0], adjacency.values().abs())
    else:
        row_sums = adjacency.abs().sum(1)
    edges = pruned.edges()
    if not edges:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, torch.zeros(0)
    rows, cols, weights = (torch.tensor(column) for column in zip(*edges, strict=True))
    return rows, cols, weights.abs().float() / row_sums[rows].clamp(min=1e-10)
