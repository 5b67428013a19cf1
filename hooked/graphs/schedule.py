"""Which rows of an attribution graph are computed, in what order, and where they are kept: each prompt's logit rows,
then its feature rows, all of them or, under `max_feature_nodes`, the features not yet visited ranked by their
influence on the logits through the rows computed so far (circuit-tracer 0.5.0 `attribution/attribute.py` and
`graph.py` `compute_partial_influences`); each backward pass of the replacement model serves the next chunk of every
prompt. The rows are kept dense, as circuit-tracer's `edge_matrix`, or each row's `edges_per_row` largest entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm.auto import tqdm

from hooked.graphs.nodes import Nodes
from hooked.graphs.replacement import ReplacementRun

if TYPE_CHECKING:
    from hooked.graphs.settings import AttributionSettings


def attribute_rows(
    run: ReplacementRun, nodes: list[Nodes], settings: AttributionSettings, progress: bool | None
) -> list[Rows]:
    """Every prompt's rows: each prompt's targets come from its own schedule (`schedule`); each backward pass
    serves the next chunk of every prompt that has one."""
    max_feature_nodes, edges_per_row, update_interval = (
        settings.max_feature_nodes,
        settings.edges_per_row,
        settings.update_interval,
    )
    budgets = [n.n_active if max_feature_nodes is None else min(max_feature_nodes, n.n_active) for n in nodes]
    stores = [
        Rows(budget + len(n.logit_ids), size + len(n.logit_ids), size, edges_per_row)
        for n, budget, size in zip(nodes, budgets, run.row_sizes, strict=True)
    ]
    bar = tqdm(
        total=sum(budgets),
        desc="attribution graph: feature rows",
        disable=(not progress) if progress is not None else None,
    )
    schedules = [
        schedule(run, n, store, budget, update_interval, bar)
        for n, store, budget in zip(nodes, stores, budgets, strict=True)
    ]
    pending = [next(s, None) for s in schedules]
    while any(p is not None for p in pending):
        rows = run.rows([None if p is None else p[:3] for p in pending])
        for i, (p, r) in enumerate(zip(pending, rows, strict=True)):
            if p is not None:
                stores[i].add(r, p[3])
                pending[i] = next(schedules[i], None)
    bar.close()
    return stores


def schedule(run: ReplacementRun, nodes: Nodes, store: Rows, budget: int, update_interval: int, bar):
    """One prompt's targets, `run.copies` at a time, as (layers, positions, vectors, node ids): the logits, then
    the features, as circuit-tracer orders them: all of them, or, with fewer rows than active features, the ones
    not yet visited ranked by their influence through the rows computed so far, re-ranked every
    `update_interval * copies` rows. The caller stores each chunk's rows before asking for the next."""
    n_active, n_logits, size, c = nodes.n_active, len(nodes.logit_ids), store.row_size, run.copies
    for start in range(0, n_logits, c):
        vecs = nodes.logit_vectors[start : start + c]
        k = vecs.shape[0]
        yield (
            torch.full((k,), run.n_layers),
            torch.full((k,), run.n_pos - 1),
            vecs,
            torch.arange(start, start + k) + size,
        )

    layers, positions = nodes.active[:, 0], nodes.active[:, 1]
    visited = torch.zeros(n_active, dtype=torch.bool)
    n_visited = 0
    while n_visited < budget:
        if budget == n_active:
            pending = torch.arange(n_active)
        else:
            influence = store.partial_influences(nodes.logit_probabilities.float().cpu())
            rank = torch.argsort(influence[:n_active], descending=True)
            pending = rank[~visited[rank]][: min(update_interval * c, budget - n_visited)]
        for chunk in pending.split(c):
            n_visited += chunk.shape[0]
            yield layers[chunk], positions[chunk], nodes.encoder_vectors(chunk), chunk
            visited[chunk] = True
            bar.update(chunk.shape[0])
    store.selected = torch.where(visited)[0]


class Rows:
    """The rows computed so far, in the order computed, over every node as a column ([active features, errors,
    tokens, logits]); dense as circuit-tracer's `edge_matrix`, or each row's `edges_per_row` largest entries."""

    def __init__(self, n_rows: int, n_columns: int, row_size: int, edges_per_row: int | None):
        self.n_columns, self.row_size, self.keep = n_columns, row_size, edges_per_row
        self.node_of_row = torch.zeros(n_rows, dtype=torch.long)
        self.count = 0
        self.selected = torch.zeros(0, dtype=torch.long)
        if edges_per_row is None:
            self.matrix = torch.zeros(n_rows, n_columns)
        else:
            self.matrix = None
            self.row_index: list[Tensor] = []
            self.columns: list[Tensor] = []
            self.values: list[Tensor] = []

    def add(self, rows: Tensor, nodes: Tensor) -> None:
        rows = rows.float().cpu()
        k = rows.shape[0]
        row_ids = torch.arange(self.count, self.count + k)
        if self.matrix is not None:
            self.matrix[self.count : self.count + k, : self.row_size] = rows
        else:
            keep = min(self.keep, rows.shape[1])
            values, columns = rows.abs().topk(keep, dim=1)
            values = rows.gather(1, columns)
            nonzero = values != 0
            self.row_index.append(row_ids[:, None].expand(-1, keep)[nonzero])
            self.columns.append(columns[nonzero])
            self.values.append(values[nonzero])
        self.node_of_row[self.count : self.count + k] = nodes
        self.count += k

    def coo(self) -> tuple[Tensor, Tensor, Tensor]:
        """(row, column, value) of every entry kept, rows in computed order (the sparse store's)."""
        if not self.values:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty, torch.zeros(0)
        return torch.cat(self.row_index), torch.cat(self.columns), torch.cat(self.values)

    def partial_influences(self, logit_probabilities: Tensor, max_iter: int = 128) -> Tensor:
        """Each node's influence on the logits through the rows computed so far (circuit-tracer 0.5.0 `graph.py`
        `compute_partial_influences`: row-normalised |A|, the power series from the logit nodes)."""
        node_of_row = self.node_of_row[: self.count]
        if self.matrix is not None:  # as circuit-tracer: a dense product per step
            normalized = self.matrix[: self.count].abs()
            normalized /= normalized.sum(dim=1, keepdim=True).clamp(min=1e-8)
            step = lambda prod: prod[node_of_row] @ normalized  # noqa: E731
        else:  # the same sums over the entries kept
            rows, columns, values = self.coo()
            values = values.abs()
            values = values / torch.zeros(self.count).index_add_(0, rows, values).clamp(min=1e-8)[rows]
            step = lambda prod: torch.zeros(self.n_columns).index_add_(0, columns, values * prod[node_of_row][rows])  # noqa: E731
        influence = torch.zeros(self.n_columns)
        prod = torch.zeros(self.n_columns)
        prod[-logit_probabilities.shape[0] :] = logit_probabilities
        for _ in range(max_iter):
            prod = step(prod)
            if not prod.any():
                break
            influence += prod
        else:
            raise RuntimeError("the influence of the rows computed so far did not converge in 128 steps")
        return influence
