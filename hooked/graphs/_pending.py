"""TEMPORARY stand-ins for the Graph methods another branch adds (prune, scores, node_label, feature_address, plot,
save_circuit_tracer, to_frontend), so the demo and the CLI run before it is merged. Each is set only where Graph
lacks it. Delete this file (and its import in hooked/graphs/__init__.py) once that branch is in main."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from hooked.graphs.graph import Graph


@dataclass
class _Pruned:
    graph: Graph
    node_mask: Tensor
    edge_mask: Tensor
    cumulative_scores: Tensor
    node_influence: Tensor

    @property
    def nodes(self) -> list[int]:
        return self.node_mask.nonzero().flatten().tolist()

    def edges(self) -> list[tuple[int, int, float]]:
        a = self.graph.adjacency.to_dense()
        keep = self.edge_mask & self.node_mask[:, None] & self.node_mask[None, :] & (a != 0)
        t, s = keep.nonzero().unbind(1)
        return list(zip(t.tolist(), s.tolist(), a[t, s].tolist(), strict=True))


def _influence(a: Tensor, w: Tensor) -> Tensor:
    a = a.abs() / a.abs().sum(1, keepdim=True).clamp(min=1e-10)
    step = w @ a
    total = step.clone()
    while step.any():
        step = step @ a
        total += step
    return total


def _threshold(scores: Tensor, threshold: float) -> Tensor:
    s = torch.sort(scores, descending=True).values
    c = torch.cumsum(s, 0) / s.sum()
    return s[min(int(torch.searchsorted(c, threshold)), len(s) - 1)]


def _prune(self: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> _Pruned:
    a = self.adjacency.to_dense()
    w = torch.zeros(a.shape[0])
    w[self.logit_offset :] = self.logit_probabilities
    influence = _influence(a, w)
    node_mask = influence >= _threshold(influence, node_threshold)
    node_mask[self.token_offset :] = True
    p = a * node_mask[:, None] * node_mask[None, :]
    n = p.abs() / p.abs().sum(1, keepdim=True).clamp(min=1e-10)
    scores = n * (_influence(p, w) + w)[:, None]
    edge_mask = scores >= _threshold(scores.flatten(), edge_threshold)
    order = torch.argsort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[order] = torch.cumsum(influence[order], 0) / influence.sum()
    return _Pruned(self, node_mask, edge_mask, cumulative, influence)


def _scores(self: Graph) -> tuple[float, float]:
    a = self.adjacency.to_dense()
    w = torch.zeros(a.shape[0])
    w[self.logit_offset :] = self.logit_probabilities
    i = _influence(a, w)
    tok, err = i[self.token_offset : self.logit_offset].sum(), i[self.error_offset : self.token_offset].sum()
    n = a.abs() / a.abs().sum(1, keepdim=True).clamp(min=1e-10)
    share = n[:, self.error_offset : self.token_offset].sum(1)
    return float(tok / (tok + err)), float(((1 - share) * (i + w)).sum() / (i + w).sum())


def _feature_address(self: Graph, i: int) -> str:
    layer, position, feature = self.active_features[self.selected_features[i]].tolist()
    part = self.feature_output_hook.removeprefix("blocks.{layer}.hook_")
    return f"L{layer}.{part}.F{feature}@{position}"


def _node_label(self: Graph, i: int, tokenizer=None) -> str:
    if i < self.error_offset:
        layer, position, feature = self.active_features[self.selected_features[i]].tolist()
        return f"L{layer} F{feature} @{position}"
    if i < self.token_offset:
        layer, position = divmod(i - self.error_offset, self.n_pos)
        return f"error L{layer} @{position}"
    if i < self.logit_offset:
        return f"token {int(self.input_tokens[i - self.token_offset])} @{i - self.token_offset}"
    return f"logit {self.logit_targets[i - self.logit_offset].token_str!r}"


def _plot(self: Graph, path=None, node_threshold=0.8, edge_threshold=0.98, tokenizer=None, title=None):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots()
    axes.set_title(title or "attribution graph")
    if path is not None:
        figure.savefig(path)
    return figure


def _save_circuit_tracer(self: Graph, path) -> None:
    torch.save({"adjacency_matrix": self.adjacency.to_dense()}, path)


def _to_frontend(
    self: Graph, out_dir, slug="graph", node_threshold=0.8, edge_threshold=0.98, tokenizer=None, scan=None
):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{slug}.json").write_text(json.dumps({"metadata": {"slug": slug}}))
    return out / f"{slug}.json"


for _name, _method in {
    "prune": _prune,
    "scores": _scores,
    "feature_address": _feature_address,
    "node_label": _node_label,
    "plot": _plot,
    "save_circuit_tracer": _save_circuit_tracer,
    "to_frontend": _to_frontend,
}.items():
    if not hasattr(Graph, _name):
        setattr(Graph, _name, _method)
