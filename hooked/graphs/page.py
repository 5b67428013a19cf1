"""An attribution graph as one self-contained, offline HTML page to explore: `Graph.show()` (inline in a notebook),
`Graph.save_html(path)`, `hooked graph ... --html FILE` / `--serve`. docs/graphs.md, "Exploring a graph".

Cytoscape.js 3.34.4 (MIT, static/cytoscape.min.js with its LICENSE) draws and lays out the graph; the hand-written
static/graph_page.js only fills the side panel, moves the sliders and traces a path. Both are inlined into the page,
with the data below as JSON, so the file opens from disk with no network.

What the page ships, and why its sliders agree with `Graph.prune` exactly. Pruning keeps the nodes holding
`node_threshold` of the influence, scores the edges among them (the scores depend on which nodes were kept), keeps
the edges holding `edge_threshold` of the total score, then drops nodes left without edges (hooked/graphs/prune.py).
So the page carries, for each node threshold of a grid (`node_thresholds`, the requested one included):

- the nodes the first step keeps, computed here by prune.py's own functions;
- for each edge that some edge threshold up to the slider's top keeps, its cut: the float32 cumulative share of the
  edges scoring above it (its tie group's first), so that `find_threshold` keeps it exactly when cut < t, t the
  threshold rounded to float32 as torch compares it. Edges and nodes no threshold in range keeps are left out.

The page then redoes the last step (dropping unconnected nodes) in the browser. The node slider steps through the
grid; the edge slider is continuous up to the largest threshold at which pruning still cuts somewhere (at most
0.99: above, the float32 total reaches the zero scores and every pair of nodes would be an edge). A path is
hooked/graphs/paths.py's: each edge weighs its share of the target's total |input|, a path the product.

A node may carry QK pairs (`qk`): for an attention head's node, the query-key pairs that make its pattern, each a
`QKPair` (query label, key label, contribution), listed in the panel when the node is selected.
"""

from __future__ import annotations

import base64
import html as html_escape
import http.server
import json
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from hooked.graphs import prune
from hooked.graphs.prune import cumulative_shares

if TYPE_CHECKING:
    from hooked.graphs.graph import Graph

STATIC = Path(__file__).parent / "static"
NODE_THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)  # the node slider's grid
EDGE_THRESHOLD_RANGE = (0.5, 0.99)  # the edge slider's range (its top lowered where pruning would stop cutting)
TOP_EDGES = 8  # incoming and outgoing edges listed per node (the largest |weight| of the whole adjacency)
COLUMN_GAP = 40.0  # page units between a position's column and the next
NODE_SPACING = 22.0  # between nodes sharing a cell
ROW_HEIGHT = 160.0  # between layers


class QKPair(NamedTuple):
    """One query-key pair of an attention head's node: what the query and key sides are, and how much the pair
    contributes. A plain (query, key, contribution) tuple or a dict with these keys is read as one; a side with a
    `label` (a term of hooked.graphs.qk_attribution's `top_pairs`) shows its label."""

    query: str
    key: str
    contribution: float


QKSource = Mapping[int, Sequence[Any]] | Callable[["Graph", int], Sequence[Any] | None]


def page_data(
    graph: Graph,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    tokenizer: Any = None,
    qk: QKSource | None = None,
    node_thresholds: Sequence[float] = NODE_THRESHOLDS,
    title: str | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (the module docstring says what and why)."""
    grid = sorted({float(t) for t in node_thresholds} | {float(node_threshold)})
    for name, values in (("node_threshold", [node_threshold, *grid]), ("edge_threshold", [edge_threshold])):
        bad = [v for v in values if not 0.0 <= v <= 1.0]
        if bad:
            raise ValueError(f"{name} must be between 0.0 and 1.0 (a share of the total influence), not {bad[0]}")
    if qk is not None and not (callable(qk) or isinstance(qk, Mapping)):
        raise TypeError(
            f"qk must map node indices to lists of QKPair, or be a function (graph, node index) -> such a list or "
            f"None; got {type(qk).__name__}"
        )

    if isinstance(qk, Mapping):
        outside = [i for i in qk if not (isinstance(i, int) and 0 <= i < graph.n_nodes)]
        if outside:
            raise ValueError(f"qk names node {outside[0]!r}, not a node index of this graph (0..{graph.n_nodes - 1})")

    adjacency = prune.coalesced(graph.adjacency)
    weights = prune.logit_weights(graph)
    influences = prune.influence(prune.normalize(adjacency), weights)
    n = graph.n_nodes
    if adjacency.is_sparse:
        rows, cols = adjacency.indices()
        values = adjacency.values()
    else:
        rows, cols = torch.arange(n).repeat_interleave(n), torch.arange(n).repeat(n)
        values = adjacency.flatten()

    # one pass per node threshold: the nodes kept, every edge's cut, and the highest edge threshold still cutting
    masks, cuts, tops = [], [], []
    for t in grid:
        mask = prune.influential_nodes(graph, influences, t)
        edge_cuts, top = _edge_cuts(prune.edge_scores(adjacency, mask, weights).flatten())
        masks.append(mask)
        cuts.append(edge_cuts)
        tops.append(top)
    edge_max = _edge_slider_top(min(tops))
    if edge_threshold > edge_max:
        raise ValueError(
            f"edge_threshold {edge_threshold} is above {edge_max}, the highest at which this graph's pruning still "
            "drops edges (above it every pair of kept nodes is an edge); pick one at most that"
        )
    edge_min = min(EDGE_THRESHOLD_RANGE[0], edge_threshold)

    # the edges some slider position keeps (cut < the slider's top), and their nodes
    reachable = torch.stack(cuts).lt(_f32(edge_max)).any(0)
    entries = reachable.nonzero().flatten()
    shipped = torch.zeros(n, dtype=torch.bool)
    shipped[rows[entries]] = True
    shipped[cols[entries]] = True
    shipped[graph.token_offset :] = True
    node_ids = shipped.nonzero().flatten().tolist()

    labels = {i: graph.node_label(i, tokenizer) for i in node_ids}
    incoming, outgoing = _top_edges(rows, cols, values, shipped)
    for i in {j for lists in (incoming, outgoing) for edges in lists.values() for j, _ in edges} - set(labels):
        labels[i] = graph.node_label(i, tokenizer)
    row_input = torch.zeros(n).index_add_(0, rows, values.abs().float())  # paths.py's share denominators
    depth = _depths(graph)
    activations = _activations_by_feature(graph)
    positions = _layout(graph, node_ids)
    nodes = []
    for i in node_ids:
        node = graph.node(i)
        record = {
            "i": i,
            "label": labels[i],
            "kind": node.kind,
            "layer": node.layer,
            "pos": node.position,
            "x": positions[i][0],
            "y": positions[i][1],
            "depth": depth[i],
            "influence": float(influences[i]),
            "input": float(row_input[i]),
            "in": incoming.get(i, []),
            "out": outgoing.get(i, []),
        }
        if node.kind == "feature":
            record["activation"] = float(graph.activation_values[graph.selected_features[i]])
            record["acts"] = activations[(node.layer, node.index)]
        pairs = _qk_pairs(qk, graph, i)
        if pairs is not None:
            record["qk"] = pairs
        nodes.append(record)

    tokens = graph.input_tokens.tolist()
    return {
        "title": title or f"attribution graph of {graph.input_string!r}",
        "prompt": graph.input_string,
        "tokens": [str(t) if tokenizer is None else tokenizer.decode([t]) for t in tokens],
        "n_layers": graph.n_layers,
        "labels": {str(i): label for i, label in labels.items() if not shipped[i]},
        "nodes": nodes,
        "edges": {
            "source": cols[entries].tolist(),
            "target": rows[entries].tolist(),
            "weight": values[entries].float().tolist(),
        },
        "grid": {
            "node_thresholds": grid,
            "nodes": [mask[shipped].nonzero().flatten().tolist() for mask in masks],  # indices into `nodes`
            "cuts": [_base64_f32(c[entries]) for c in cuts],  # per shipped edge, float32
        },
        "edge_range": [edge_min, edge_max],
        "start": {"node_threshold": grid.index(float(node_threshold)), "edge_threshold": float(edge_threshold)},
        "token_offset": graph.token_offset,
        "n_features": graph.n_features,
    }


def page_html(data: dict[str, Any]) -> str:
    """The page: cytoscape, the page script and `data` inlined into one HTML file."""
    template = (STATIC / "graph_page.html").read_text(encoding="utf-8")
    template = template.replace("{{title}}", html_escape.escape(data["title"]))
    inlined = {
        "{{style}}": (STATIC / "graph_page.css").read_text(encoding="utf-8"),
        "{{cytoscape}}": (STATIC / "cytoscape.min.js").read_text(encoding="utf-8"),
        "{{script}}": (STATIC / "graph_page.js").read_text(encoding="utf-8"),
        # "</" inside a <script> would end it; JSON reads "<\/" as "</"
        "{{data}}": json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/"),
    }
    for key, value in inlined.items():
        before, _, after = template.partition(key)
        template = before + value + after  # not str.replace: the inlined code may hold "{{...}}" itself
    return template


class GraphPage:
    """An attribution graph's page (`Graph.show`): `html` is the whole file; a notebook shows it inline (an
    iframe), `save(path)` writes it, `serve()` serves it on 127.0.0.1 until Ctrl-C.

        page = g.show(tokenizer=model.tokenizer)   # the last value of a notebook cell: drawn inline
        page.save("graph.html")
    """

    def __init__(self, html: str, height: int = 720) -> None:
        self.html = html
        self.height = height

    def _repr_html_(self) -> str:
        source = html_escape.escape(self.html, quote=True)
        return (
            f'<iframe srcdoc="{source}" style="width: 100%; height: {self.height}px; border: 1px solid #ddd" '
            'sandbox="allow-scripts"></iframe>'
        )

    def __repr__(self) -> str:
        return f"GraphPage({len(self.html):,} characters of HTML; .save(path) writes it, .serve() serves it)"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"{path} is a folder; give the HTML file's path, such as {path / 'graph.html'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path

    def serve(self, port: int = 0, announce: Callable[[str], None] | None = None) -> None:
        """Serve the page at http://127.0.0.1:PORT/ (port 0: a free one) until Ctrl-C; the URL is printed (or given
        to `announce`)."""
        server = page_server(self.html, port)
        message = f"serving the graph page at http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)"
        if announce is None:
            print(message, flush=True)  # flushed: a pipe reading the URL must not wait for the server to end
        else:
            announce(message)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def page_server(html: str, port: int = 0) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 (not yet serving) that answers every GET with the page."""
    body = html.encode("utf-8")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass  # quiet: the command line prints the URL once

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def serve_in_background(html: str, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve the page from a daemon thread; returns (server, url). `server.shutdown()` stops it."""
    server = page_server(html, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/"


# ----------------------------------------------------------------------------- the pieces of page_data
def _f32(value: float) -> float:
    """`value` rounded to float32, as torch compares a Python float with a float32 tensor."""
    return float(torch.tensor(value, dtype=torch.float32))


def _edge_cuts(scores: Tensor) -> tuple[Tensor, float]:
    """Per score, the cut c with `score >= find_threshold(scores, t)` exactly when c < float32(t) (inf for a zero
    score), and the highest t at which find_threshold's cut stays above zero (the cumulative share at the last
    positive score). prune.cumulative_shares, as find_threshold's: the same float32 values."""
    sorted_scores, order, cumulative = cumulative_shares(scores)
    # find_threshold's index is #{cumulative < t}; rank r is kept when its tie group's first rank f has f <= index,
    # that is when cumulative[f - 1] < t (rank 0 always)
    before = torch.cat([cumulative.new_full((1,), -math.inf), cumulative[:-1]])
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)
    firsts = (counts.cumsum(0) - counts).repeat_interleave(counts)
    sorted_cuts = torch.where(sorted_scores > 0, before[firsts], math.inf)
    cuts = torch.empty_like(sorted_cuts)
    cuts[order] = sorted_cuts
    n_positive = int((sorted_scores > 0).sum())
    top = float(cumulative[n_positive - 1]) if n_positive else 0.0
    return cuts, top


def _edge_slider_top(top: float) -> float:
    """The largest two-decimal threshold, at most EDGE_THRESHOLD_RANGE's top, whose float32 is at most `top`."""
    value = math.floor(min(EDGE_THRESHOLD_RANGE[1], top) * 100) / 100
    while value > 0 and _f32(value) > top:
        value = round(value - 0.01, 2)
    return value


def _base64_f32(values: Tensor) -> str:
    return base64.b64encode(values.to(torch.float32).contiguous().numpy().tobytes()).decode("ascii")


def _top_edges(
    rows: Tensor, cols: Tensor, values: Tensor, shipped: Tensor
) -> tuple[dict[int, list[list[float]]], dict[int, list[list[float]]]]:
    """Per shipped node, its TOP_EDGES largest |weight| incoming [[source, weight], ...] and outgoing [[target,
    weight], ...] edges over the whole adjacency (pruned or not)."""
    nonzero = values != 0
    rows, cols, values = rows[nonzero], cols[nonzero], values[nonzero].float()
    found = []
    for node, other in ((rows, cols), (cols, rows)):
        keep = shipped[node]
        node, other, weight = node[keep], other[keep], values[keep]
        order = torch.argsort(weight.abs(), descending=True, stable=True)
        order = order[torch.argsort(node[order], stable=True)]  # grouped by node, largest |weight| first
        node, other, weight = node[order], other[order], weight[order]
        starts = torch.searchsorted(node, node)  # each entry's group start (node is sorted)
        first = (torch.arange(len(node)) - starts) < TOP_EDGES
        lists: dict[int, list[list[float]]] = defaultdict(list)
        for i, j, w in zip(node[first].tolist(), other[first].tolist(), weight[first].tolist(), strict=True):
            lists[i].append([j, w])
        found.append(dict(lists))
    return found[0], found[1]


def _depths(graph: Graph) -> list[int]:
    from hooked.graphs.paths import node_depths

    return node_depths(graph).tolist()


def _activations_by_feature(graph: Graph) -> dict[tuple[int, int], list[list[float]]]:
    """(layer, feature) -> [[position, activation], ...] over the active features: a feature's activation per token
    (a position missing is one where it is not active, activation 0)."""
    found: dict[tuple[int, int], list[list[float]]] = defaultdict(list)
    for (layer, position, feature), value in zip(
        graph.active_features.tolist(), graph.activation_values.tolist(), strict=True
    ):
        found[(layer, feature)].append([position, value])
    return found


def _layout(graph: Graph, node_ids: list[int]) -> dict[int, tuple[float, float]]:
    """(x, y) per node: tokens on the bottom row, then a row per layer, logits on top (y grows downwards on the
    page); each position a column as wide as its most crowded cell, nodes of one cell side by side."""
    cells: dict[tuple[int, int], list[int]] = defaultdict(list)
    logits = []
    for i in node_ids:
        node = graph.node(i)
        if node.kind == "logit":
            logits.append(i)
            continue
        row = 0 if node.kind == "token" else (node.layer or 0) + 1
        cells[(row, node.position)].append(i)
    widths = [NODE_SPACING] * graph.n_pos
    for (_, position), members in cells.items():
        widths[position] = max(widths[position], len(members) * NODE_SPACING)
    centres, left = [], 0.0
    for width in widths:
        centres.append(left + width / 2)
        left += width + COLUMN_GAP
    positions = {}
    for (row, position), members in cells.items():
        for k, i in enumerate(members):
            positions[i] = (centres[position] + (k - (len(members) - 1) / 2) * NODE_SPACING, -row * ROW_HEIGHT)
    top = -(graph.n_layers + 1) * ROW_HEIGHT
    for k, i in enumerate(logits):  # the top row, ending above the last position, the most probable rightmost
        positions[i] = (centres[-1] - (len(logits) - 1 - k) * 2 * NODE_SPACING, top)
    return positions


def _qk_pairs(qk: QKSource | None, graph: Graph, i: int) -> list[dict[str, Any]] | None:
    if qk is None:
        return None
    pairs = qk(graph, i) if callable(qk) else qk.get(i)
    if pairs is None:
        return None
    read = []
    for pair in pairs:
        if isinstance(pair, Mapping):
            missing = {"query", "key", "contribution"} - set(pair)
            if missing:
                raise ValueError(f"node {i}'s QK pair {pair!r} lacks {sorted(missing)}: give query, key, contribution")
            pair = QKPair(pair["query"], pair["key"], pair["contribution"])
        elif not isinstance(pair, QKPair):
            if not (isinstance(pair, Sequence) and len(pair) == 3):
                raise ValueError(
                    f"node {i}'s QK pair {pair!r} is not a QKPair, a (query, key, contribution) tuple or a dict "
                    "with those keys"
                )
            pair = QKPair(*pair)
        read.append({"query": _term(pair.query), "key": _term(pair.key), "contribution": float(pair.contribution)})
    return read


def _term(side: Any) -> str:
    """A pair's query or key as the panel shows it: its `label` where it has one (a term of
    hooked.graphs.qk_attribution's pairs, named like the graph's nodes), else its text."""
    label = getattr(side, "label", side)
    return label if isinstance(label, str) else str(label)
