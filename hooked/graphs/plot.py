"""A static picture of a pruned attribution graph, for papers and the demo: position across, layer up.

Tokens sit on the bottom row under their positions, features and error nodes on the row of their layer (error
nodes grey squares, features circles labelled "L2 F17"), logits on the top row, one position apart and ending at
the last. Several nodes in one cell are spread across it. Edges run from source to target, blue when positive and
red when negative, their width and opacity growing with |weight| relative to the largest kept edge.

matplotlib comes with the `plot` extra (`pip install 'hooked[plot]'`); with a `path` it is switched to the
headless Agg backend (unless a backend is already in use) before pyplot is imported.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hooked.graphs.prune import PrunedGraph

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIDTH_RANGE = (0.4, 4.0)  # line width of the smallest and of the largest edge
CELL_SPREAD = 0.7  # the share of a position's width that a cell's nodes spread over
NODE_STYLE = {  # kind -> (marker, face colour)
    "feature": ("o", "#f2c14e"),
    "error": ("s", "#bbbbbb"),
    "token": ("s", "#9ecae1"),
    "logit": ("D", "#a1d99b"),
}


def _pyplot(path: str | Path | None):
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "Graph.plot draws with matplotlib, which is not installed: pip install 'hooked[plot]' "
            "(or pip install matplotlib)"
        ) from error
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def layout(pruned: PrunedGraph) -> dict[int, tuple[float, float]]:
    """(x, y) of each kept node: x its position (spread within a crowded cell), y 0 for tokens, layer + 1 for
    features and errors, n_layers + 1 for logits."""
    graph = pruned.graph
    cells: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in pruned.nodes:
        node = graph.node(i)
        row = {"token": 0, "logit": graph.n_layers + 1}.get(node.kind, (node.layer or 0) + 1)
        cells[(row, node.position)].append(i)
    positions = {}
    for (row, column), members in cells.items():
        if row == graph.n_layers + 1:  # logits: one position apart, ending at the last
            step = min(1.0, (graph.n_pos - 1) / max(len(members) - 1, 1))
            positions |= {i: (column - (len(members) - 1 - k) * step, float(row)) for k, i in enumerate(members)}
            continue
        for k, i in enumerate(members):
            offset = (k - (len(members) - 1) / 2) * CELL_SPREAD / max(len(members), 1)
            positions[i] = (column + offset, float(row))
    return positions


def plot_graph(
    pruned: PrunedGraph, path: str | Path | None = None, tokenizer: Any = None, title: str | None = None
) -> Figure:
    """Draw `pruned` (see the module docstring); save it to `path` (format from the suffix) if given.
    Returns the matplotlib Figure."""
    plt = _pyplot(path)
    from matplotlib.collections import LineCollection

    graph = pruned.graph
    positions = layout(pruned)
    edges = pruned.edges()
    figure, axes = plt.subplots(figsize=(max(6.0, 1.3 * graph.n_pos + 2), max(4.0, 0.9 * (graph.n_layers + 2) + 1)))
    largest = max((abs(weight) for _, _, weight in edges), default=0.0)
    if edges and largest > 0:
        low, high = WIDTH_RANGE
        segments, colours, widths = [], [], []
        for target, source, weight in sorted(edges, key=lambda edge: abs(edge[2])):  # the largest drawn last
            share = math.sqrt(abs(weight) / largest)
            segments.append([positions[source], positions[target]])
            colours.append(
                (0.13, 0.4, 0.75, 0.25 + 0.6 * share) if weight > 0 else (0.8, 0.15, 0.15, 0.25 + 0.6 * share)
            )
            widths.append(low + (high - low) * share)
        axes.add_collection(LineCollection(segments, colors=colours, linewidths=widths, zorder=1))
    for i, (x, y) in positions.items():
        kind = graph.node(i).kind
        marker, colour = NODE_STYLE[kind]
        axes.scatter([x], [y], marker=marker, s=160, c=colour, edgecolors="black", linewidths=0.6, zorder=2)
        label = _short_label(graph, i, tokenizer)
        below = kind == "token"
        axes.annotate(
            label,
            (x, y),
            xytext=(0, -14 if below else 9),
            textcoords="offset points",
            ha="center" if below else "left",
            rotation=0 if below else 25,
            rotation_mode="anchor",
            fontsize=7,
            zorder=3,
        )
    axes.set_yticks(range(graph.n_layers + 2), ["tokens", *(f"L{layer}" for layer in range(graph.n_layers)), "logits"])
    axes.set_xticks(range(graph.n_pos), [str(p) for p in range(graph.n_pos)])
    axes.set_xlim(-0.7, graph.n_pos - 0.3)
    axes.set_ylim(-0.7, graph.n_layers + 1.6)
    axes.set_xlabel("position")
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    kept = f"{len(positions)} nodes, {len(edges)} edges"
    axes.set_title(title or f"attribution graph of {graph.input_string!r} ({kept})", fontsize=10)
    figure.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=150, bbox_inches="tight")
    return figure


def _short_label(graph, i: int, tokenizer: Any) -> str:
    """The node's label without its position (the x axis shows it)."""
    node = graph.node(i)
    if node.kind == "feature":
        return f"L{node.layer} F{node.index}"
    if node.kind == "error":
        return f"err L{node.layer}"
    if node.kind == "token":
        return repr(tokenizer.decode([node.index])) if tokenizer is not None else str(node.index)
    return graph.node_label(i)[len("logit ") :]
