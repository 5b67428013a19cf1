"""Drawing a circuit: `plot_circuit(circuit, "circuit.png")`, which `Circuit.plot` calls.

    c = circuits.discover(model, clean, corrupt, metric, method="eap-ig", n_edges=40)
    figure = c.plot("circuit.png", title="IOI circuit")      # a matplotlib Figure; the PNG if a path is given

The picture is layered by depth, bottom to top: `input`, then for each layer a row with its heads
(`L{l}H0` on the left) and, to the right of the row above it, the layer's MLP (`L{l}.mlp`), and
`logits` at the top; every layer's row is labelled on the left. Nodes of the circuit are filled,
the model's other heads and MLPs are drawn as faint outlines so the grid stays readable.

Edges:

- **where an edge ends says which input it feeds.** A head reads the residual stream three times, so
  it has three small input ports under it, left to right `q`, `k`, `v`; an edge into `L2H2.v` ends on
  the right-hand port of L2H2. Edges into an MLP or `logits` end on the node itself.
- **colour is the receiver's kind:** query blue, key green, value red, MLP input purple, logits grey
  (the legend repeats it);
- **width is sqrt(|score|)** scaled to the largest |score| of the circuit's edges, so edges a hundred
  times weaker are still visible;
- **line style is the sign** of an attribution score (EAP, EAP-IG: the estimated metric(patched) -
  metric(clean)): solid when patching the edge lowers the metric (the edge carries the behaviour),
  dashed when it raises it. ACDC's scores are |metric moves|, with no sign: every edge is solid.

Grouped-query models: a key or value input belongs to a key/value head shared by a group of query
heads (`L2KV0.k`). Its port sits under the middle of its group, a little lower than the query ports,
labelled `KV0`, and thin lines of the port's colour join it to each head of the group that the
circuit holds. So one k/v edge is drawn once, not once per head it reaches.

Post-norm layers (OLMo 2, Gemma: the layer's attention is one node `L{l}.attn`, see
`hooked.circuits.graph`): the row holds that one node, centred, above its heads' input ports, and each
port used is joined to it.

matplotlib and networkx come with the `plot` extra (`pip install 'hooked[plot]'`). With a `path`,
matplotlib is switched to the headless Agg backend (unless a backend is already in use) before
pyplot is imported, and the figure is saved at 130 dpi; it is returned open either way, so a notebook
shows it and a script can `plt.close(figure)`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hooked.circuits.graph import INPUT, LOGITS
from hooked.plot import _finish

if TYPE_CHECKING:
    from hooked.circuits.discovery import Circuit

COLOURS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#d62728", "mlp": "#9467bd", "logits": "#555555"}
KIND_LABELS = {
    "q": "query input (.q)",
    "k": "key input (.k)",
    "v": "value input (.v)",
    "mlp": "MLP input",
    "logits": "logits (unembedding)",
}
GHOST_LABEL = "#b0b0b0"  # labels of the model's nodes outside the circuit
NODE_FILL = {"head": "#cfe2f3", "mlp": "#f6dfc1", "end": "#dddddd"}
PORT_OFFSET = {"q": -0.24, "k": 0.0, "v": 0.24}  # x offset of a head's input ports
PORT_DROP = 0.42  # how far below its head a port sits
KV_DROP = 0.62  # grouped-query models: how far below the heads a key/value head's ports sit
MLP_SHIFT = 0.9  # how far right of the last head the MLP column sits
WIDTH_RANGE = (0.5, 6.0)  # line width (points) of the weakest and strongest edge


def _kind(receiver: str) -> str:
    if receiver == LOGITS:
        return "logits"
    if receiver.endswith(".mlp"):
        return "mlp"
    return receiver.rsplit(".", 1)[1]


def _layout(graph) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """Positions of every node and every head input port, and the y of each row (for the row labels)."""
    n_heads, n_layers = graph.n_heads, graph.n_layers
    centre = (n_heads - 1) / 2
    pos: dict[str, tuple[float, float]] = {INPUT: (centre, 0.0)}
    rows: dict[str, float] = {"input": 0.0}
    group = n_heads // graph.n_kv_heads
    for layer in range(n_layers):
        heads_y, mlp_y = 1.0 + 2 * layer, 2.0 + 2 * layer
        rows[f"L{layer} {'attn' if layer in graph.whole_attention else 'heads'}"], rows[f"L{layer} mlp"] = (
            heads_y,
            mlp_y,
        )
        if layer in graph.whole_attention:  # one attention node, centred over its heads' input ports
            pos[f"L{layer}.attn"] = (centre, heads_y)
        for head in range(n_heads):
            if layer not in graph.whole_attention:
                pos[f"L{layer}H{head}"] = (float(head), heads_y)
            pos[f"L{layer}H{head}.q"] = (head + PORT_OFFSET["q"], heads_y - PORT_DROP)
            if not graph.grouped:
                pos[f"L{layer}H{head}.k"] = (head + PORT_OFFSET["k"], heads_y - PORT_DROP)
                pos[f"L{layer}H{head}.v"] = (head + PORT_OFFSET["v"], heads_y - PORT_DROP)
        if graph.grouped:
            for kv in range(graph.n_kv_heads):
                middle = kv * group + (group - 1) / 2
                pos[f"L{layer}KV{kv}.k"] = (middle - 0.14, heads_y - KV_DROP)
                pos[f"L{layer}KV{kv}.v"] = (middle + 0.14, heads_y - KV_DROP)
        if graph.has_mlp(layer):
            pos[f"L{layer}.mlp"] = (n_heads - 1 + MLP_SHIFT, mlp_y)
    pos[LOGITS] = (centre, 1.0 + 2 * n_layers)
    rows["logits"] = 1.0 + 2 * n_layers
    return pos, rows


def _width(score: float, largest: float) -> float:
    low, high = WIDTH_RANGE
    return low + (high - low) * math.sqrt(abs(score) / largest) if largest > 0 else low


def plot_circuit(circuit: Circuit, path: str | Path | None = None, title: str | None = None):
    """Draw `circuit` layered by depth (see the module docstring); save a PNG to `path` if given.

    Returns the matplotlib Figure.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    pos, rows = _layout(circuit.graph)
    figure, axes = plt.subplots(figsize=_figure_size(circuit.graph))
    canvas = _Canvas.of(circuit, pos, axes)
    # Back to front: the model's other nodes, the links under the ports, the edges, the circuit's nodes.
    _draw_ghosts(canvas)
    _draw_port_links(canvas)
    _draw_edges(canvas)
    _draw_nodes(canvas)
    _draw_ports(canvas)
    _frame(canvas, rows)
    _legend(canvas)
    axes.set_title(_default_title(circuit) if title is None else title, fontsize=11)
    return _finish(figure, path, dpi=130)


def _figure_size(graph) -> tuple[float, float]:
    """Inches: wide enough for a row of heads and the MLP column, tall enough for two rows a layer."""
    width = min(40.0, max(8.0, 1.05 * (graph.n_heads + MLP_SHIFT + 1) + 4.2))
    height = min(40.0, max(6.0, 0.85 * (2 * graph.n_layers + 2) + 1.0))
    return width, height


@dataclass(frozen=True)
class _Canvas:
    """What every drawing step reads: the circuit, where each node sits, the axes, the sizes chosen for the model."""

    circuit: Circuit
    pos: dict[str, tuple[float, float]]  # every node and head input port (`_layout`)
    axes: Any
    network: Any  # a networkx DiGraph of every position: networkx's drawing functions take one
    nodes: frozenset[str]  # the circuit's nodes
    ports: list[str]  # the head input ports the circuit's edges end on
    scores: dict[str, float]  # str(edge) -> score, for the circuit's edges
    largest: float  # the largest |score| among them
    node_size: int
    label_size: int

    @classmethod
    def of(cls, circuit: Circuit, pos: dict[str, tuple[float, float]], axes) -> _Canvas:
        import networkx as nx

        network = nx.DiGraph()
        network.add_nodes_from(pos)
        scores = {str(edge): float(circuit.scores.get(str(edge), 0.0)) for edge in circuit.edges}
        ports = sorted({edge.receiver for edge in circuit.edges if _kind(edge.receiver) in "qkv"})
        small = circuit.graph.n_heads <= 16
        return cls(
            circuit,
            pos,
            axes,
            network,
            frozenset(circuit.nodes),
            ports,
            scores,
            max((abs(value) for value in scores.values()), default=0.0),
            node_size=1100 if small else 700,
            label_size=9 if small else 7,
        )

    @property
    def signed(self) -> bool:
        """Whether scores carry a sign (EAP, EAP-IG); ACDC's are |metric moves|."""
        return self.circuit.method != "acdc"


def _draw_ghosts(canvas: _Canvas) -> None:
    """The model's nodes outside the circuit: faint outlines, and faint labels while the grid is small enough."""
    import networkx as nx

    graph = canvas.circuit.graph
    every = [INPUT, LOGITS] + [source.name for source in graph.sources[1:]]
    ghosts = [node for node in every if node not in canvas.nodes]
    nx.draw_networkx_nodes(
        canvas.network,
        canvas.pos,
        nodelist=ghosts,
        node_size=canvas.node_size * 0.6,
        node_color="white",
        edgecolors="#d0d0d0",
        linewidths=0.8,
        ax=canvas.axes,
        hide_ticks=False,
    )
    if graph.n_heads * graph.n_layers <= 200:
        nx.draw_networkx_labels(
            canvas.network,
            canvas.pos,
            labels={node: node for node in ghosts},
            font_size=canvas.label_size - 2,
            font_color=GHOST_LABEL,
            ax=canvas.axes,
            hide_ticks=False,
        )


def _draw_port_links(canvas: _Canvas) -> None:
    """The short links from each port used to the head(s) of the circuit it feeds, in the port's colour."""
    import networkx as nx

    graph = canvas.circuit.graph
    links = [(port, head) for port in canvas.ports for head in graph.heads_reading(port) if head in canvas.nodes]
    for kind in "qkv":
        kind_links = [link for link in links if _kind(link[0]) == kind]
        if kind_links:
            nx.draw_networkx_edges(
                canvas.network,
                canvas.pos,
                edgelist=kind_links,
                edge_color=COLOURS[kind],
                width=1.2,
                arrows=False,
                ax=canvas.axes,
                hide_ticks=False,
            )


def _draw_edges(canvas: _Canvas) -> None:
    """The circuit's edges, weakest first so the strong ones lie on top."""
    import networkx as nx

    pos, largest = canvas.pos, canvas.largest
    sizes = {node: (canvas.node_size if node in canvas.nodes else 60) for node in pos}
    ordered = sorted(canvas.circuit.edges, key=lambda edge: abs(canvas.scores[str(edge)]))
    for edge in ordered:
        score = canvas.scores[str(edge)]
        (x0, y0), (x1, y1) = pos[edge.source], pos[edge.receiver]
        # Straight between neighbouring rows; bowed when the edge skips rows, so edges along one column
        # (MLP to MLP, input to logits) do not run through the nodes between them.
        skips = y1 - y0 > 1.5
        bend = 0.0 if not skips else (0.18 if x1 >= x0 else -0.18)
        nx.draw_networkx_edges(
            canvas.network,
            pos,
            edgelist=[(edge.source, edge.receiver)],
            width=_width(score, largest),
            edge_color=COLOURS[_kind(edge.receiver)],
            style="dashed" if canvas.signed and score > 0 else "solid",
            alpha=0.35 + 0.5 * math.sqrt(abs(score) / largest) if largest > 0 else 0.6,
            arrows=True,
            arrowstyle="-|>",
            arrowsize=9,
            connectionstyle=f"arc3,rad={bend}",
            nodelist=list(pos),
            node_size=[sizes[node] for node in pos],
            ax=canvas.axes,
            hide_ticks=False,
        )


def _draw_nodes(canvas: _Canvas) -> None:
    """The circuit's nodes, filled by kind (heads, MLPs, the two ends as squares), and their labels."""
    import networkx as nx

    kinds = {"head": [], "mlp": [], "end": []}
    for node in canvas.nodes:
        kinds["end" if node in (INPUT, LOGITS) else "mlp" if node.endswith(".mlp") else "head"].append(node)
    for kind, members in kinds.items():
        if members:
            nx.draw_networkx_nodes(
                canvas.network,
                canvas.pos,
                nodelist=members,
                node_size=canvas.node_size * (1.25 if kind == "end" else 1.0),
                node_color=NODE_FILL[kind],
                edgecolors="#333333",
                linewidths=1.2,
                node_shape="s" if kind == "end" else "o",
                ax=canvas.axes,
                hide_ticks=False,
            )
    nx.draw_networkx_labels(
        canvas.network,
        canvas.pos,
        labels={node: node for node in canvas.nodes},
        font_size=canvas.label_size,
        ax=canvas.axes,
        hide_ticks=False,
    )


def _draw_ports(canvas: _Canvas) -> None:
    """The ports used, small dots in their kind's colour; on a grouped-query model, each key/value head's name."""
    import networkx as nx

    for kind in "qkv":
        members = [port for port in canvas.ports if _kind(port) == kind]
        if members:
            nx.draw_networkx_nodes(
                canvas.network,
                canvas.pos,
                nodelist=members,
                node_size=48,
                node_color=COLOURS[kind],
                edgecolors="white",
                linewidths=0.6,
                ax=canvas.axes,
                hide_ticks=False,
            )
    if canvas.circuit.graph.grouped:
        _label_kv_ports(canvas)


def _label_kv_ports(canvas: _Canvas) -> None:
    """`KV{g}` beside each key/value head's ports used, once: by its k port, or by its v port alone."""
    for port in canvas.ports:
        if port.endswith(".k") or (port.endswith(".v") and port[:-2] + ".k" not in canvas.ports):
            x, y = canvas.pos[port]
            name = re.fullmatch(r"L\d+(KV\d+)\.[kv]", port)[1]
            canvas.axes.text(
                x + (0.14 if port.endswith(".k") else -0.14),
                y - 0.16,
                name,
                ha="center",
                va="top",
                fontsize=canvas.label_size - 2,
                color="#444444",
            )


def _frame(canvas: _Canvas, rows: dict[str, float]) -> None:
    """The frame around the grid: each row's label on the left, the axes' limits, no axis drawn."""
    graph, axes = canvas.circuit.graph, canvas.axes
    left = -0.6
    for label, y in rows.items():
        axes.text(left, y, label, ha="right", va="center", fontsize=canvas.label_size, color="#555555")
    axes.set_xlim(left - 1.2, graph.n_heads - 1 + MLP_SHIFT + 0.7)
    axes.set_ylim(-0.7, 2 * graph.n_layers + 1.7)
    axes.axis("off")


def _legend(canvas: _Canvas) -> None:
    """Right of the grid: the colour of each kind of input, the line styles of the signs, two widths, the outline."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    largest = canvas.largest
    shown = {_kind(edge.receiver) for edge in canvas.circuit.edges}
    handles = [
        Line2D([], [], color=COLOURS[kind], linewidth=2.5, label=KIND_LABELS[kind])
        for kind in ("q", "k", "v", "mlp", "logits")
        if kind in "qkv" or kind in shown
    ]
    if canvas.signed:
        handles += [
            Line2D([], [], color="black", linewidth=1.5, label="score < 0: patching it lowers the metric"),
            Line2D(
                [],
                [],
                color="black",
                linewidth=1.5,
                linestyle="dashed",
                label="score > 0: patching it raises the metric",
            ),
        ]
    what = "|score|" if canvas.signed else "metric move"  # ACDC's score: how far removing the edge moved the metric
    handles += [
        Line2D([], [], color="black", linewidth=WIDTH_RANGE[1], label=f"{what} {largest:.3g} (width ~ sqrt)"),
        Line2D([], [], color="black", linewidth=_width(largest / 100, largest), label=f"{what} {largest / 100:.3g}"),
        Patch(facecolor="white", edgecolor="#d0d0d0", label="not in the circuit"),
    ]
    canvas.axes.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
        title="edge colour: the input it feeds",
        title_fontsize=8,
        alignment="left",
    )


def _default_title(circuit: Circuit) -> str:
    """`EAP-IG circuit of gpt2: 40 of 1,000 edges, 20 nodes`."""
    model = circuit.provenance.get("model")
    return (
        f"{circuit.method.upper()} circuit"
        + (f" of {model}" if model else "")
        + f": {len(circuit.edges)} of {len(circuit.graph.edges)} edges, {len(circuit.nodes)} nodes"
    )


__all__ = ["plot_circuit"]
