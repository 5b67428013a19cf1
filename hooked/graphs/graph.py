"""An attribution graph: the direct, linear effect of every active transcoder feature, error node and input token
on every feature and logit of one prompt, under the local replacement model (Ameisen et al. 2025, "Circuit
Tracing"; circuit-tracer 0.5.0, `graph.py`). `hooked.graphs.attribute` builds it.

Node order, as circuit-tracer's: the selected features (`selected_features`, indices into `active_features`, whose
rows are sorted by layer, position, feature), then the error nodes layer by layer and position by position
(`n_layers * n_pos`), then one token node per position, then the logit nodes by falling probability (or in the
order `attribute`'s `attribution_targets` gave them). The adjacency has rows as targets and columns as sources:
`adjacency[t, s]` is the direct effect of node s on node t. Error and token rows and logit columns are zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
from torch import Tensor

from hooked.graphs import prune
from hooked.graphs.files import LogitTarget
from hooked.graphs.prune import GraphScores, PrunedGraph
from hooked.interventions.kinds import FEATURE_POINTS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from hooked.graphs.page import GraphPage, QKSource


class GraphNode(NamedTuple):
    """What node i of a graph is: its kind, layer (None for tokens and logits), position (a logit's is the last)
    and index (the feature's id, the token's or the logit's vocabulary id; None for an error node)."""

    kind: Literal["feature", "error", "token", "logit"]
    layer: int | None
    position: int
    index: int | None


@dataclass
class Graph:
    """One prompt's attribution graph (module docstring: node order and what an entry means).

    `adjacency` is [N, N] float32 with N = n_features + n_layers * n_pos + n_pos + n_logits: dense (every edge, as
    circuit-tracer keeps it) or a coalesced sparse COO tensor when `attribute` kept only each row's largest edges
    (`edges_per_row`), so its memory grows with the edges kept, not with N squared."""

    input_tokens: Tensor  # [n_pos] int64
    input_string: str
    active_features: Tensor  # [n_active, 3] int64: (layer, position, feature), sorted by layer, position, feature
    activation_values: Tensor  # [n_active] float32: each active feature's activation
    selected_features: Tensor  # [n_features] int64, ascending: the active features that are nodes
    adjacency: Tensor  # [N, N] float32, rows targets, columns sources; dense or sparse COO
    logit_targets: list[LogitTarget]
    logit_probabilities: Tensor  # [n_logits]: each logit node's probability at the last position (a custom target's
    # weight: attribute's attribution_targets; its vocab_idx is vocab_size + its index)
    n_layers: int
    vocab_size: int
    feature_input_hook: str  # hooked's point name with {layer}: where the transcoders read
    feature_output_hook: str  # ... and where they write
    model_info: dict[str, Any] = field(default_factory=dict)  # the model's shape and names (save_circuit_tracer)
    scan: str | list[str] | None = None  # the transcoders' identifier for viewers (circuit-tracer's `scan`)

    @property
    def n_pos(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.selected_features.shape[0])

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_logits(self) -> int:
        return len(self.logit_targets)

    @property
    def n_nodes(self) -> int:
        return self.n_features + self.n_errors + self.n_pos + self.n_logits

    @property
    def error_offset(self) -> int:
        """Index of the first error node (layer 0, position 0); error (l, p) is at error_offset + l * n_pos + p."""
        return self.n_features

    @property
    def token_offset(self) -> int:
        """Index of the first token node; token p is at token_offset + p."""
        return self.n_features + self.n_errors

    @property
    def logit_offset(self) -> int:
        """Index of the first logit node (the most probable)."""
        return self.token_offset + self.n_pos

    # ------------------------------------------------------------------------- circuit-tracer's names
    @property
    def adjacency_matrix(self) -> Tensor:
        """circuit-tracer 0.5.0's name for `adjacency` (the same tensor)."""
        return self.adjacency

    @property
    def logit_token_ids(self) -> Tensor:
        """[n_logits] int64: each logit node's vocabulary index, circuit-tracer 0.5.0's `logit_token_ids` (a custom
        target's is vocab_size + its index)."""
        return torch.tensor([target.vocab_idx for target in self.logit_targets], dtype=torch.long)

    # ------------------------------------------------------------------------- nodes by name
    def node(self, i: int) -> GraphNode:
        """Node i's kind, layer, position and index (`GraphNode`)."""
        if not 0 <= i < self.n_nodes:
            raise IndexError(f"node {i} is out of range: the graph has {self.n_nodes} nodes (0..{self.n_nodes - 1})")
        if i < self.error_offset:
            layer, position, feature = self.active_features[self.selected_features[i]].tolist()
            return GraphNode("feature", layer, position, feature)
        if i < self.token_offset:
            layer, position = divmod(i - self.error_offset, self.n_pos)
            return GraphNode("error", layer, position, None)
        if i < self.logit_offset:
            position = i - self.token_offset
            return GraphNode("token", None, position, int(self.input_tokens[position]))
        return GraphNode("logit", None, self.n_pos - 1, self.logit_targets[i - self.logit_offset].vocab_idx)

    def node_label(self, i: int, tokenizer: Any = None) -> str:
        """A short name for node i: "L2 F17 @5", "error L1 @3", "token 'cat' @2" (or "token 123 @2" without a
        `tokenizer`: anything with `decode(ids)`, such as `model.tokenizer`), "logit 'dog' (p=0.42)" (a custom
        target: "logit 'dog - cat' (weight 1.00)")."""
        node = self.node(i)
        if node.kind == "feature":
            return f"L{node.layer} F{node.index} @{node.position}"
        if node.kind == "error":
            return f"error L{node.layer} @{node.position}"
        if node.kind == "token":
            text = node.index if tokenizer is None else repr(tokenizer.decode([node.index]))
            return f"token {text} @{node.position}"
        target = self.logit_targets[i - self.logit_offset]
        weight = float(self.logit_probabilities[i - self.logit_offset])
        if target.vocab_idx >= self.vocab_size:  # a custom target (attribute's attribution_targets): its weight
            return f"logit {target.token_str!r} (weight {weight:.2f})"
        return f"logit {target.token_str!r} (p={weight:.2f})"

    def feature_address(self, i: int) -> str:
        """hooked's component address of feature node i, `L{layer}.{part}.F{feature}@{position}` with the part
        the transcoders write to (`feature_output_hook` "blocks.{layer}.hook_mlp_out" -> "mlp_out"), for
        `hooked.sweep` and `ablate` with the transcoders spliced in (the `features` kind)."""
        node = self.node(i)
        if node.kind != "feature":
            raise ValueError(f"node {i} is a {node.kind} node, not a feature: only features have an address")
        return f"L{node.layer}.{self.feature_part}.F{node.index}@{node.position}"

    @property
    def feature_part(self) -> str:
        """The `features` kind's part for `feature_output_hook` ("mlp_out" for "blocks.{layer}.hook_mlp_out")."""
        return feature_part(self.feature_output_hook)

    # ------------------------------------------------------------------------- influence, pruning, scores
    def node_influence(self) -> Tensor:
        """[N]: each node's influence on the logits, through every path (hooked/graphs/prune.py)."""
        return prune.node_influence(self)

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
        """Keep the nodes holding `node_threshold` of the influence on the logits and the edges holding
        `edge_threshold` of the edge influence, as circuit-tracer 0.5.0's `prune_graph`; dense or sparse.

            p = g.prune(node_threshold=0.8, edge_threshold=0.98)
            [g.node_label(i) for i in p.nodes]
        """
        return prune.prune(self, node_threshold, edge_threshold)

    def scores(self) -> GraphScores:
        """The replacement and completeness scores (circuit-tracer 0.5.0's `compute_graph_scores`)."""
        return prune.scores(self)

    # ------------------------------------------------------------------------- files and pictures
    def save_circuit_tracer(self, path: str | Path) -> None:
        """Write the graph as circuit-tracer 0.5.0's `Graph.to_pt` does, for its `Graph.from_pt` (no hooked needed
        there); hooked/graphs/files.py says which `model_info` keys fill its config."""
        from hooked.graphs import files

        files.save_circuit_tracer(self, path)

    @classmethod
    def load_circuit_tracer(
        cls,
        path: str | Path,
        feature_input_hook: str = "blocks.{layer}.mlp.hook_in",
        feature_output_hook: str = "blocks.{layer}.hook_mlp_out",
    ) -> Graph:
        """Read a circuit-tracer graph file (`Graph.to_pt`, or `save_circuit_tracer`) without circuit-tracer. Its
        files do not say where the transcoders read and write: the hooks default to circuit-tracer's usual pair."""
        from hooked.graphs import files

        return cls(**files.read_circuit_tracer(path, feature_input_hook, feature_output_hook))

    def to_frontend(
        self,
        out_dir: str | Path,
        slug: str = "graph",
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        tokenizer: Any = None,
        scan: str | list[str] | None = None,
    ) -> Path:
        """Write `<out_dir>/<slug>.json` and update `<out_dir>/graph-metadata.json` as circuit-tracer 0.5.0's
        `create_graph_files` does, for its local viewer and Neuronpedia's; returns the graph file's path.
        hooked/graphs/frontend.py says what a missing tokenizer or scan becomes."""
        from hooked.graphs import frontend

        return frontend.write_graph_files(self, out_dir, slug, node_threshold, edge_threshold, tokenizer, scan)

    def plot(
        self,
        path: str | Path | None = None,
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        tokenizer: Any = None,
        title: str | None = None,
    ) -> Figure:
        """Draw the pruned graph: position across, layer up (tokens at the bottom, logits at the top), edges blue
        when positive and red when negative, wider when larger; save to `path` if given. Returns the Figure.
        Needs matplotlib (`pip install 'hooked[plot]'`)."""
        from hooked.graphs.plot import plot_graph

        return plot_graph(self.prune(node_threshold, edge_threshold), path, tokenizer, title)

    def show(
        self,
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        tokenizer: Any = None,
        qk: QKSource | None = None,
        title: str | None = None,
    ) -> GraphPage:
        """The graph as a page to explore (hooked/graphs/page.py): nodes by layer and position, pruned at the
        thresholds (sliders move them), a clicked node's edges and activations, a clicked logit's strongest path,
        pinned nodes. A notebook shows it inline; `.save(path)` and `.serve()` too. Offline: the page is one file.
        `qk`: QK pairs per node, {node index: [QKPair, ...]} or a function (graph, node index) -> pairs or None.

            g.show(tokenizer=model.tokenizer)        # the last line of a notebook cell
        """
        from hooked.graphs import page

        data = page.page_data(self, node_threshold, edge_threshold, tokenizer, qk, title=title)
        return page.GraphPage(page.page_html(data))

    def save_html(
        self,
        path: str | Path,
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        tokenizer: Any = None,
        qk: QKSource | None = None,
        title: str | None = None,
    ) -> Path:
        """Write `show`'s page to `path`: one self-contained HTML file (no network needed to open it)."""
        return self.show(node_threshold, edge_threshold, tokenizer, qk, title).save(path)


def feature_part(feature_output_hook: str) -> str:
    """The `features` kind's part of a transcoder's output point ("mlp_out" for "blocks.{layer}.hook_mlp_out"): what
    a feature's address (`Graph.feature_address`) names it by."""
    point = feature_output_hook.removeprefix("blocks.{layer}.")
    parts = {hook: part.lstrip(".") for part, hook in FEATURE_POINTS.items()}
    if point not in parts:
        raise ValueError(
            f"feature_output_hook {feature_output_hook!r} is not a point the features kind addresses: "
            f"expected blocks.{{layer}}. followed by one of {sorted(parts)}"
        )
    return parts[point]
