"""What `hooked circuit` and the demo write about a circuit: its faithfulness curve, its edges as CSV, JSON
and pictures.

    report = measure_circuit(circuit, curve_sizes(len(circuit.graph.edges)), (held_clean, held_corrupt, held_metric))
    write_circuit(circuit, report, Path("runs/circuit"))   # CIRCUIT_FILES
"""

from __future__ import annotations

from pathlib import Path

CURVE_SIZES = (5, 10, 20, 50, 100, 200)
CIRCUIT_FILES = (
    "circuit.json",
    "circuit-edges.csv",
    "circuit-faithfulness.csv",
    "circuit-faithfulness.json",
    "circuit-faithfulness.png",
    "circuit.png",
)


def curve_sizes(total: int, sizes=None) -> list[int]:
    """The curve's sizes: `sizes` (default 5, 10, 20, 50, 100, 200) capped at the graph's `total` edges,
    and `total` itself (the whole graph, faithfulness 1: the curve's anchor)."""
    return sorted({min(int(size), total) for size in (sizes or CURVE_SIZES)} | {total})


def measure_circuit(circuit, sizes: list[int], held_out=None) -> dict:
    """The circuit's faithfulness and its curve on the prompts it was found on and, with `held_out` =
    (clean, corrupt, metric), on those: {"faithfulness", "held_out_faithfulness", "curve": [...]}.

    The curve's rows: size (the top-k edges by |score| asked), edges (kept after pruning),
    faithfulness, held_out_faithfulness. An EAP / EAP-IG circuit of n_edges is the curve's point at
    size n_edges (the same ranking, pruned the same way), so when `sizes` holds n_edges its value is
    read off the curve instead of run again."""
    n_edges = circuit.provenance.get("circuits", {}).get("n_edges")
    on_curve = sizes.index(n_edges) if circuit.method != "acdc" and n_edges in sizes else None
    curve = circuit.curve(sizes)
    held_curve = circuit.curve(sizes, *held_out) if held_out is not None else None
    if on_curve is not None:
        report = {
            "faithfulness": curve[on_curve]["faithfulness"],
            "held_out_faithfulness": held_curve[on_curve]["faithfulness"] if held_curve else None,
        }
    else:
        report = {
            "faithfulness": circuit.faithfulness(),
            "held_out_faithfulness": circuit.faithfulness(*held_out) if held_out is not None else None,
        }
    if held_curve is not None:
        for row, other in zip(curve, held_curve, strict=True):
            row["held_out_faithfulness"] = other["faithfulness"]
    report["curve"] = curve
    return report


def circuit_edge_rows(circuit) -> list[dict]:
    """One row per circuit edge, largest |score| first: edge, source, receiver, score, and its rank by
    |score| among all the graph's edges (1 = largest; ties in graph order)."""
    rank = {edge: place + 1 for place, edge in enumerate(circuit.ranking())}
    return [
        {
            "edge": str(edge),
            "source": edge.source,
            "receiver": edge.receiver,
            "score": circuit.scores.get(str(edge), 0.0),
            "rank": rank[edge],
        }
        for edge in sorted(circuit.edges, key=rank.__getitem__)
    ]


def plot_faithfulness(report: dict, circuit, path: Path, title: str) -> None:
    """Faithfulness against circuit size (edges kept after pruning, log scale), discovery and held-out
    prompts, with the circuit itself marked."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    curve = report["curve"]
    edges = [max(row["edges"], 1) for row in curve]  # log axis: an empty circuit is drawn at 1
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    axes.plot(edges, [row["faithfulness"] for row in curve], "o-", color="tab:blue", label="discovery prompts")
    if report.get("held_out_faithfulness") is not None:
        axes.plot(
            edges, [row["held_out_faithfulness"] for row in curve], "s--", color="tab:orange", label="held-out prompts"
        )
    axes.plot(
        [max(len(circuit.edges), 1)],
        [report["faithfulness"]],
        "*",
        markersize=15,
        color="tab:red",
        label=f"the circuit ({len(circuit.edges)} edges)",
        zorder=5,
    )
    axes.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    axes.axhline(0.0, color="gray", linewidth=0.8, linestyle=":")
    axes.set_xscale("log")
    ticks = [
        tick
        for tick in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
        if min(edges) / 1.5 <= tick <= max(edges) * 1.5
    ]
    axes.set_xticks(ticks, [str(tick) for tick in ticks])
    axes.minorticks_off()
    axes.set_xlabel("edges in the circuit (top-k by |score|, pruned)")
    axes.set_ylabel("faithfulness")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_circuit(circuit, report: dict, directory: Path, title: str | None = None) -> tuple[list[Path], str | None]:
    """Write CIRCUIT_FILES into `directory` (which must exist): the circuit as JSON (with `report` in its
    provenance) and its edges as CSV, the faithfulness report as CSV and JSON, and, when matplotlib and
    networkx are installed, the curve and the circuit as PNGs. Returns the paths and a note when the
    PNGs were skipped."""
    import csv
    import json

    directory = Path(directory)
    circuit.provenance["faithfulness"] = {
        "discovery_prompts": report["faithfulness"],
        "held_out_prompts": report["held_out_faithfulness"],
    }
    files = [circuit.to_json(directory / "circuit.json")]
    path = directory / "circuit-edges.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["edge", "source", "receiver", "score", "rank"])
        writer.writeheader()
        writer.writerows(circuit_edge_rows(circuit))
    files.append(path)
    path = directory / "circuit-faithfulness.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["size", "edges", "faithfulness", "held_out_faithfulness"])
        writer.writeheader()
        writer.writerows({"held_out_faithfulness": "", **row} for row in report["curve"])
    files.append(path)
    path = directory / "circuit-faithfulness.json"
    path.write_text(
        json.dumps(
            {
                "method": circuit.method,
                "circuit_edges": len(circuit.edges),
                "graph_edges": len(circuit.graph.edges),
                **report,
                "held_out": circuit.provenance.get("held_out"),
            },
            indent=1,
        )
    )
    files.append(path)
    title = title or f"{circuit.method} circuit of {circuit.provenance.get('model', 'the model')}"
    try:
        plot_faithfulness(report, circuit, directory / "circuit-faithfulness.png", f"faithfulness: {title}")
        figure = circuit.plot(
            directory / "circuit.png", title=f"{title}: {len(circuit.edges)} of {len(circuit.graph.edges)} edges"
        )
    except ImportError as error:
        return files, f"{error.name or 'matplotlib'} is not installed, so no PNG was drawn (pip install 'hooked[plot]')"
    import matplotlib.pyplot as plt

    plt.close(figure)
    return files + [directory / "circuit-faithfulness.png", directory / "circuit.png"], None
