"""Debian's headless Chromium driven by Playwright, as the graph page's tests (test_page.py) and its benchmark
(benchmarks/graph_page.py) open it: never a downloaded browser (no `playwright install`), no network, no first-run
work, a profile directory of its own per launch (two xdist workers side by side)."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")  # `make test` installs Debian's package where it is missing
BROWSER_ARGS = [  # no network, no first-run work: the page is one local file
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY = "window.hookedGraphReady === true"  # the page sets it once Cytoscape's layout is done


def launch(playwright, profile: str | Path):
    """A persistent Chromium context in `profile`, 1280 x 800."""
    return playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=str(CHROMIUM),
        args=BROWSER_ARGS,
        headless=True,
        viewport={"width": 1280, "height": 800},
    )
