"""The graph page (hooked/graphs/page.py): how long a page of 1,000 nodes, and of a larger graph, takes to get
ready in headless Chromium, and what building it costs in Python.

    .venv/bin/python benchmarks/graph_page.py [--repeats 5]

Synthetic graphs (tests/graphs/random_graphs.py: an attribution graph's zero structure, dense adjacency, random
weights), 1,000 nodes (12 layers, 20 positions, 730 features, 10 logits) and 3,030 (12 layers, 40 positions, 2,500
features). For each: `Graph.show()` (Python: influence, the ten node thresholds' edge scores and cuts, the HTML)
timed once; then the page, opened from disk in Debian's Chromium (`make test` installs it) through Playwright, timed
from navigation start to ready (`window.hookedGraphReady`: the data parsed, Cytoscape's elements built and its
layout done), and to the first frame painted after that; the median of `--repeats` loads in one browser. Then the
edge slider moved one step (0.98 -> 0.97: the page re-prunes and redraws), median of as many moves. Target: a
1,000-node page ready in under 2 s (docs/benchmarks.md, "The graph page").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.graphs.browser import READY, launch  # noqa: E402
from tests.graphs.random_graphs import random_graph  # noqa: E402

SIZES = {  # name: random_graph's arguments
    "1,000 nodes": dict(n_layers=12, n_pos=20, n_active=780, n_features=730, n_logits=10, d_sae=4000, density=0.2),
    "3,030 nodes": dict(n_layers=12, n_pos=40, n_active=2550, n_features=2500, n_logits=10, d_sae=8000, density=0.1),
}
PAINTED = "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now()))))"
SLIDER_STEP = """() => {
    const slider = document.getElementById('edge-threshold');
    slider.value = 0.98; slider.dispatchEvent(new Event('input'));
    const start = performance.now();
    slider.value = 0.97; slider.dispatchEvent(new Event('input'));
    return new Promise(done => requestAnimationFrame(() => done(performance.now() - start)));
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="graph-page-bench."))
    rows = []
    with sync_playwright() as playwright:
        browser = launch(playwright, folder / "profile")
        tab = browser.new_page()
        for name, shape in SIZES.items():
            graph = random_graph(seed=0, **shape)
            start = time.perf_counter()
            page = graph.show()
            build = time.perf_counter() - start
            path = page.save(folder / f"{graph.n_nodes}.html")
            pruned = graph.prune()
            ready, painted, moves = [], [], []
            for _ in range(args.repeats):
                tab.goto(path.as_uri())
                tab.wait_for_function(READY, timeout=120_000)
                ready.append(tab.evaluate("window.hookedGraphTimes.ready"))
                painted.append(tab.evaluate(PAINTED))
                moves.append(tab.evaluate(SLIDER_STEP))
            shown = tab.evaluate("document.getElementById('status').textContent")
            rows.append(
                (
                    name,
                    f"{len(pruned.nodes)} nodes / {len(pruned.edges())} edges shown",
                    f"{path.stat().st_size / 1e6:.1f} MB",
                    f"{build:.2f} s",
                    f"{statistics.median(ready) / 1000:.2f} s",
                    f"{statistics.median(painted) / 1000:.2f} s",
                    f"{statistics.median(moves):.0f} ms",
                )
            )
            print(f"{name}: page status {shown!r}; ready {[round(r) for r in ready]} ms", flush=True)
        browser.close()
    header = ("graph", "pruned at 0.8 / 0.98", "page", "show() in Python", "ready", "first paint", "slider step")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
