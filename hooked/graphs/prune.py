"""Influence-based pruning and the replacement / completeness scores of an attribution graph, as circuit-tracer
0.5.0 `graph.py` computes them (`normalize_matrix`, `compute_influence`, `find_threshold`, `prune_graph`,
`compute_graph_scores`), on a dense adjacency or on a sparse COO one.

A node's influence is its total effect on the logits along every path, each edge weighted by its share of the
absolute input to its target: with A the row-normalised |adjacency| and w the logit probabilities on the logit
nodes, influence = w A + w A^2 + ... (the series ends: the graph has no cycle). Pruning keeps the most influential
nodes holding `node_threshold` of the total, then the edges holding `edge_threshold` of the total edge score
(normalised weight times the target's influence plus its logit weight), then drops, until nothing changes,
feature and error nodes left without an outgoing edge and features left without an incoming one.

On a sparse adjacency every step runs on the stored entries (row sums by index_add, w A by a scatter over the
entries, thresholds over the stored scores), so memory grows with the edges kept. Entries that are not stored
are zero, as in the dense matrix; the one place that shows is a threshold so high that it keeps zero-score
entries (`edge_threshold=1.0`, where circuit-tracer's float32 cumulative sum can stop short of 1): its dense mask
then marks every pair an edge, the sparse mask keeps every stored entry, and neither drops a node for want of an
edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hooked.graphs.graph import Graph

MAX_ITERATIONS = 1000  # circuit-tracer's compute_influence bound; a graph this deep has a cycle


class GraphScores(NamedTuple):
    """How much of the graph runs through features rather than error nodes (circuit-tracer's
    `compute_graph_scores`): `replacement` is the share of the tokens' and errors' influence on the logits that
    starts at the tokens; `completeness` is the influence-weighted share of each node's normalised input that comes
    from features and tokens rather than errors. 1.0 is a graph with no error influence."""

    replacement: float
    completeness: float


@dataclass
class PrunedGraph:
    """The nodes and edges of `graph` that pruning kept (`Graph.prune`).

    `node_mask` [N] bool; `edge_mask` [N, N] bool, dense or sparse COO like the graph's adjacency (sparse: the
    adjacency's own indices, each with True or False); `cumulative_scores` [N]: the share of total influence held by
    the nodes at least as influential as each (circuit-tracer's `cumulative_scores`, the viewer's `influence`);
    `node_influence` [N]: each node's influence on the logits before pruning."""

    graph: Graph
    node_mask: Tensor
    edge_mask: Tensor
    cumulative_scores: Tensor
    node_influence: Tensor
    node_threshold: float
    edge_threshold: float

    @property
    def nodes(self) -> list[int]:
        """The kept nodes' indices, ascending."""
        return self.node_mask.nonzero().flatten().tolist()

    def edges(self) -> list[tuple[int, int, float]]:
        """The kept edges between kept nodes as (target, source, weight), row by row (the viewer's links)."""
        adjacency = self.graph.adjacency
        if adjacency.is_sparse:
            rows, cols = adjacency.indices()
            keep = self.edge_mask.values() & self.node_mask[rows] & self.node_mask[cols]
            targets, sources, weights = rows[keep], cols[keep], adjacency.values()[keep]
        else:
            keep = self.edge_mask & self.node_mask[:, None] & self.node_mask[None, :]
            targets, sources = keep.nonzero().unbind(1)
            weights = adjacency[targets, sources]
        return list(zip(targets.tolist(), sources.tolist(), weights.tolist(), strict=True))


# ----------------------------------------------------------------------------- the shared steps
def logit_weights(graph: Graph) -> Tensor:
    """[N]: each logit node's probability, zero elsewhere (circuit-tracer's `logit_weights`). Weights summing to 0
    (a graph read from a file whose logit probabilities are all 0) are refused: every influence would be 0, so
    pruning would keep everything and the scores would be 0 / 0."""
    total = float(graph.logit_probabilities.sum()) if graph.n_logits else 0.0
    if not total > 0:
        raise ValueError(
            f"this graph's logit nodes weigh {total} in all (their probabilities, or custom targets' weights), so no"
            " node has influence on them and pruning and scores mean nothing; attribute with targets that weigh"
            " something"
        )
    adjacency = graph.adjacency
    weights = torch.zeros(adjacency.shape[0], device=adjacency.device)
    weights[graph.logit_offset :] = graph.logit_probabilities.to(weights)
    return weights


def normalize(adjacency: Tensor) -> Tensor:
    """|adjacency| with each row divided by its sum (at least 1e-10): the share of a target's input each source
    gives. Sparse in, sparse out (same indices)."""
    if not adjacency.is_sparse:
        normalized = adjacency.abs()
        return normalized / normalized.sum(dim=1, keepdim=True).clamp(min=1e-10)
    rows = adjacency.indices()[0]
    values = adjacency.values().abs()
    row_sums = torch.zeros(adjacency.shape[0], dtype=values.dtype, device=values.device).index_add_(0, rows, values)
    return _with_values(adjacency, values / row_sums.clamp(min=1e-10)[rows])


def influence(normalized: Tensor, weights: Tensor) -> Tensor:
    """w A + w A^2 + ... for the row vector w, until a product is exactly zero (circuit-tracer's
    `compute_influence`); A dense or sparse."""
    step = _times(weights, normalized)
    total = step.clone()
    for _ in range(MAX_ITERATIONS):
        if not step.any():
            return total
        step = _times(step, normalized)
        total += step
    raise RuntimeError(
        f"influence did not vanish after {MAX_ITERATIONS} steps: the adjacency has a cycle (an attribution graph's "
        "edges run from earlier layers and positions to later ones; check how it was built)"
    )


def cumulative_shares(scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(scores sorted descending, their order, each rank's share of the total with every larger one): the one
    arithmetic `find_threshold` and the graph page's edge cuts (hooked/graphs/page.py) both read, so their float32
    values agree to the bit."""
    sorted_scores, order = torch.sort(scores, descending=True)
    return sorted_scores, order, torch.cumsum(sorted_scores, dim=0) / torch.sum(sorted_scores)


def find_threshold(scores: Tensor, threshold: float, n_total: int | None = None) -> Tensor:
    """The smallest score among the largest ones holding `threshold` of the total (circuit-tracer's
    `find_threshold`). `n_total`: the number of scores when `scores` holds only the stored entries of a sparse
    matrix, the rest being zeros (a threshold that reaches into them is 0)."""
    sorted_scores, _, cumulative = cumulative_shares(scores)
    index = int(torch.searchsorted(cumulative, threshold).item())
    if n_total is not None and index >= len(cumulative) and n_total > len(cumulative):
        return sorted_scores.new_zeros(())
    return sorted_scores[min(index, len(cumulative) - 1)]


def _times(vector: Tensor, matrix: Tensor) -> Tensor:
    """vector @ matrix; for a sparse matrix a scatter over its stored entries."""
    if not matrix.is_sparse:
        return vector @ matrix
    rows, cols = matrix.indices()
    return torch.zeros_like(vector).index_add_(0, cols, vector[rows] * matrix.values())


def _with_values(sparse: Tensor, values: Tensor) -> Tensor:
    return torch.sparse_coo_tensor(sparse.indices(), values, sparse.shape, is_coalesced=True, check_invariants=False)


def coalesced(adjacency: Tensor) -> Tensor:
    """The adjacency as pruning reads it: a sparse one coalesced (COO only), a dense one as it is."""
    if adjacency.is_sparse and adjacency.layout != torch.sparse_coo:
        raise ValueError(f"a sparse adjacency must be COO (torch.sparse_coo), not {adjacency.layout}: .to_sparse_coo()")
    return adjacency.coalesce() if adjacency.is_sparse else adjacency


# ----------------------------------------------------------------------------- the public computations
def node_influence(graph: Graph) -> Tensor:
    """[N]: each node's influence on the logits (the module docstring), logit nodes 0."""
    return influence(normalize(coalesced(graph.adjacency)), logit_weights(graph))


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
    """circuit-tracer 0.5.0's `prune_graph` on `graph` (the module docstring); see `Graph.prune`."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be between 0.0 and 1.0 (a share of the total influence), not {value}")
    adjacency = coalesced(graph.adjacency)
    weights = logit_weights(graph)
    influences = influence(normalize(adjacency), weights)
    node_mask = influential_nodes(graph, influences, node_threshold)

    scores = edge_scores(adjacency, node_mask, weights)
    n_total = adjacency.shape[0] * adjacency.shape[1] if adjacency.is_sparse else None
    cut = find_threshold(scores.flatten(), edge_threshold, n_total)
    edge_mask = scores >= cut  # dense [N, N], or one per stored entry
    if cut > 0:  # at a zero cut every pair is an edge and no node lacks one
        _drop_unconnected(graph, adjacency, node_mask, edge_mask)
    if adjacency.is_sparse:
        edge_mask = _with_values(adjacency, edge_mask)

    _, order, shares = cumulative_shares(influences)
    cumulative_scores = torch.zeros_like(influences)
    cumulative_scores[order] = shares
    return PrunedGraph(graph, node_mask, edge_mask, cumulative_scores, influences, node_threshold, edge_threshold)


def influential_nodes(graph: Graph, influences: Tensor, node_threshold: float) -> Tensor:
    """[N] bool: the most influential nodes holding `node_threshold` of the total, and every token and logit (the
    first step of `prune`, before edges are scored)."""
    node_mask = influences >= find_threshold(influences, node_threshold)
    node_mask[graph.token_offset :] = True  # tokens and logits stay
    return node_mask


def edge_scores(adjacency: Tensor, node_mask: Tensor, weights: Tensor) -> Tensor:
    """Each edge's score among the nodes `node_mask` keeps (normalised weight times the target's influence plus its
    logit weight): dense [N, N], or one per stored entry of a coalesced sparse adjacency. `prune` keeps the edges
    whose score reaches `find_threshold` of these; hooked/graphs/page.py ships them to the page's sliders."""
    if adjacency.is_sparse:
        rows, cols = adjacency.indices()
        kept = node_mask[rows] & node_mask[cols]
        pruned = _with_values(adjacency, adjacency.values() * kept)  # the dense path's zeroed rows and columns
        normalized = normalize(pruned)
        return normalized.values() * (influence(normalized, weights) + weights)[rows]
    pruned = adjacency.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    normalized = normalize(pruned)
    return normalized * (influence(normalized, weights) + weights)[:, None]


def _drop_unconnected(graph: Graph, adjacency: Tensor, node_mask: Tensor, edge_mask: Tensor) -> None:
    """Drop feature and error nodes without an outgoing kept edge and features without an incoming one, and the
    edges of dropped nodes, until nothing changes (at most about n_layers + 1 rounds); in place. `edge_mask`: dense
    [N, N], or for a sparse adjacency one bool per stored entry."""
    n_features, token_offset = graph.n_features, graph.token_offset
    rows, cols = adjacency.indices() if adjacency.is_sparse else (None, None)
    while True:
        before = node_mask.clone()
        if adjacency.is_sparse:
            edge_mask &= node_mask[rows] & node_mask[cols]
            has_out = torch.zeros_like(node_mask).index_fill_(0, cols[edge_mask], True)
            has_in = torch.zeros_like(node_mask).index_fill_(0, rows[edge_mask], True)
        else:
            edge_mask[~node_mask] = False
            edge_mask[:, ~node_mask] = False
            has_out, has_in = edge_mask.any(0), edge_mask.any(1)
        node_mask[:token_offset] &= has_out[:token_offset]
        node_mask[:n_features] &= has_in[:n_features]
        if torch.equal(node_mask, before):
            return


def scores(graph: Graph) -> GraphScores:
    """circuit-tracer 0.5.0's `compute_graph_scores` on `graph`; see `Graph.scores`."""
    adjacency = coalesced(graph.adjacency)
    weights = logit_weights(graph)
    normalized = normalize(adjacency)
    influences = influence(normalized, weights)
    errors = slice(graph.error_offset, graph.token_offset)
    token_influence = influences[graph.token_offset : graph.logit_offset].sum()
    error_influence = influences[errors].sum()
    replacement = token_influence / (token_influence + error_influence)
    if adjacency.is_sparse:
        rows, cols = normalized.indices()
        from_errors = (cols >= graph.error_offset) & (cols < graph.token_offset)
        error_share = torch.zeros_like(weights).index_add_(0, rows[from_errors], normalized.values()[from_errors])
    else:
        error_share = normalized[:, errors].sum(dim=-1)
    output_influence = influences + weights
    completeness = ((1 - error_share) * output_influence).sum() / output_influence.sum()
    return GraphScores(replacement.item(), completeness.item())
