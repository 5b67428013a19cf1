"""Which attention heads carry a graph's strongest cross-position edges, each explained by its QK attribution
(hooked/graphs/qk.py): the step from "this feature at position 3 drives that one at position 7" to "through head
L1.H2, which attends from 7 to 3 because of these feature pairs".

An edge between nodes at different positions can only pass through attention, in a block after the source writes
(a token: any block; a feature or error of layer l: blocks > l) and before the target reads (a feature of layer m:
blocks <= m, or < m where the MLP reads the block's input, GPT-NeoX's parallel blocks; a logit: any block). Each such
head's share of the edge is

    weight(head) = pattern[query = target's position, key = source's position] * |OV write of the source's vector|

(the source's residual piece at the key position through the frozen input norm, W_V and W_O of the head), over the
sum of that product for every candidate head of the edge. A head's score is the sum over the edges of |edge| times
its share. This is a first-order heuristic (Kamath et al. 2025's "head loadings" are the exact path attributions
through each head); the QK side of each head it picks is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from hooked.components import mlp_reads_attention
from hooked.graphs.graph import Graph
from hooked.graphs.qk import HeadMaps, QKAttribution, QKRun
from hooked.tables import ResultTable

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer
    from hooked.sae.clt import CrossLayerTranscoder
    from hooked.sae.dictionary import Dictionary
    from hooked.sae.transcoders import TranscoderSet


@dataclass
class HeadExplanation:
    """One head a graph's edges pass through: its score (module docstring), the edges it carries (labels,
    strongest share first), and the QK attribution of its strongest edge's (query, key) positions."""

    layer: int
    head: int
    score: float
    edges: list[tuple[str, str, float]]  # (source label, target label, |edge| * share)
    qk: QKAttribution
    target: int  # the graph's node index of the strongest edge's target (the query side of `qk`)

    @property
    def query(self) -> int:
        return self.qk.query

    @property
    def key(self) -> int:
        return self.qk.keys[0]


@dataclass
class HeadExplanations(ResultTable):
    """`explain_heads`' answer: the top heads, strongest first. `rows()` / `table()` / `to_csv()`: each head's top
    QK pairs (hooked/tables.py)."""

    table_index = ("head", "rank")  # ResultTable: table()'s index

    heads: list[HeadExplanation]

    def __getitem__(self, i: int) -> HeadExplanation:
        return self.heads[i]

    def __len__(self) -> int:
        return len(self.heads)

    def rows(self) -> list[dict]:
        rows = []
        for rank, h in enumerate(self.heads, start=1):
            for row in h.qk.rows():
                rows.append({"head": f"L{h.layer}.H{h.head}", "head_rank": rank, "head_score": h.score, **row})
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": [
                {
                    "layer": h.layer,
                    "head": h.head,
                    "score": h.score,
                    "edges": [{"source": s, "target": t, "share": w} for s, t, w in h.edges],
                    "qk": h.qk.to_dict(),
                }
                for h in self.heads
            ]
        }

    def page_qk(self, pairs: int | None = None) -> dict[int, list[tuple[str, str, float]]]:
        """The QK pairs `Graph.show(qk=...)` shows in a node's panel: the target node of each head's strongest edge
        (the query and key positions its `qk` attributes) gets that head's top `pairs` (default: as many as
        explain_heads listed), the query side named with the head ("L1.H2 q: L0 F12 @5"), strongest head first.

            heads = graphs.explain_heads(model, g, transcoders)
            g.show(tokenizer=model.tokenizer, qk=heads.page_qk())
        """
        shown: dict[int, list[tuple[str, str, float]]] = {}
        for h in self.heads:
            shown.setdefault(h.target, []).extend(
                (f"L{h.layer}.H{h.head} q: {query.label}", key.label, value)
                for query, key, value in h.qk.top_pairs(h.key, pairs)
            )
        return shown

    def __repr__(self) -> str:
        heads = ", ".join(f"L{h.layer}.H{h.head} ({h.query}->{h.key}, {h.score:.3g})" for h in self.heads)
        return f"HeadExplanations({heads})"


def explain_heads(
    model: HookedTransformer,
    graph: Graph,
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder,
    *,
    top: int = 3,
    edges: int = 20,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    pairs: int = 10,
) -> HeadExplanations:
    """The `top` heads the `edges` strongest cross-position edges of `graph`'s pruned graph pass through, each with
    the QK attribution (its `pairs` top pairs listed) of its strongest edge's query and key positions (module
    docstring: the weighting). `graph` is `graphs.attribute(model, prompt, transcoders)`'s, for this model and
    these transcoders.

        g = graphs.attribute(model, prompt, transcoders)
        heads = graphs.explain_heads(model, g, transcoders, top=3)
        heads.table()
    """
    for name, value in (("top", top), ("edges", edges), ("pairs", pairs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if graph.n_layers != model.cfg.n_layers:
        raise ValueError(f"the graph has {graph.n_layers} layers and the model {model.cfg.n_layers}: not its graph")
    tokenizer = getattr(model, "tokenizer", None)
    n_layers = model.cfg.n_layers
    crossing = []
    for target, source, weight in graph.prune(node_threshold, edge_threshold).edges():
        s, t = graph.node(source), graph.node(target)
        if s.position >= t.position or weight == 0:
            continue
        first = 0 if s.kind == "token" else s.layer + 1
        if t.kind == "logit":
            last = n_layers - 1
        else:
            last = t.layer if mlp_reads_attention(model, t.layer) else t.layer - 1
        if first <= last:
            crossing.append(
                (
                    abs(weight),
                    graph.node_label(source, tokenizer),
                    graph.node_label(target, tokenizer),
                    s,
                    t,
                    first,
                    last,
                    target,
                )
            )
    crossing.sort(key=lambda edge: -edge[0])
    crossing = crossing[:edges]
    if not crossing:
        raise ValueError(
            "the pruned graph has no edge between positions that attention could carry; lower node_threshold /"
            " edge_threshold, or attribute a prompt whose answer reads earlier tokens"
        )
    layers = sorted({layer for *_, first, last, _ in crossing for layer in range(first, last + 1)})
    run = QKRun(model, graph.input_tokens, transcoders, layers, caller="explain_heads")
    if run.n_pos != graph.n_pos or not torch.equal(run.tokens.cpu(), graph.input_tokens.cpu()):
        raise ValueError("the graph's tokens are not what the model reads them as: give the graph of this model")

    scores: dict[tuple[int, int], float] = {}
    carried: dict[tuple[int, int], list[tuple[float, str, str, int, int, int]]] = {}
    for weight, source_label, target_label, s, t, first, last, target in crossing:
        candidates: list[tuple[int, int, float]] = []
        for layer in range(first, last + 1):
            piece = run.pieces(layer, [s.position]).vector(0, source_label)
            if piece is None:  # a position-0 feature, not a piece here (the graph zeroes them)
                continue
            for head in range(model.blocks[layer].attn.n_heads):
                maps = run.head(layer, head)
                if not maps.visible(t.position)[s.position]:
                    continue
                candidates.append(
                    (
                        layer,
                        head,
                        _attention(run, maps, t.position, s.position) * _ov_write(run, maps, s.position, piece),
                    )
                )
        total = sum(c[2] for c in candidates)
        for layer, head, value in candidates:
            share = weight * value / total if total > 0 else 0.0
            scores[layer, head] = scores.get((layer, head), 0.0) + share
            carried.setdefault((layer, head), []).append(
                (share, source_label, target_label, t.position, s.position, target)
            )
    best = sorted(scores, key=lambda h: -scores[h])[:top]
    heads = []
    for layer, head in best:
        edges_of = sorted(carried[layer, head], key=lambda e: -e[0])
        _, _, _, query, key, _ = edges_of[0]
        qk = run.attribute(layer, head, query, key, top=pairs)
        listed = [(s, t, share) for share, s, t, *_ in edges_of]
        heads.append(HeadExplanation(layer, head, scores[layer, head], listed, qk, edges_of[0][-1]))
    return HeadExplanations(heads)


@torch.no_grad()
def _attention(run: QKRun, maps: HeadMaps, query: int, key: int) -> float:
    """The head's attention weight from `query` to `key` on the prompt (softmax of its visible scores)."""
    visible = maps.visible(query).nonzero().flatten().tolist()
    scores = run.model_scores(maps, query, visible).float()
    return float(torch.softmax(scores, dim=0)[visible.index(key)])


@torch.no_grad()
def _ov_write(run: QKRun, maps: HeadMaps, position: int, piece: Tensor) -> float:
    """|what the head writes when it reads `piece` at `position`|: the frozen input norm, W_V, then W_O (before any
    norm of the attention's output: OLMo 2's and Gemma's post-norms scale every head of a layer alike)."""
    attn = maps.attn
    weight = maps.input_weight_for(attn.W_V[maps.head])
    value = (piece.to(maps.dtype) @ weight) / maps.input_scale(torch.tensor([position]))[0]
    return float((value @ attn.W_O[maps.head].to(maps.dtype)).norm())
