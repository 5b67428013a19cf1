#!/usr/bin/env python
"""Execute the notebooks under notebooks/ and write them back with their outputs, so they render on a code host.

    .venv/bin/python scripts/run_notebooks.py                          # every notebooks/*.ipynb
    .venv/bin/python scripts/run_notebooks.py notebooks/ablation.ipynb # some of them

Each notebook runs top to bottom in a fresh "python3" kernel (nbclient), with a temporary directory
as its working directory, so the run directories a notebook writes (`runs/...`) never land in the
repository. A cell that raises stops that notebook with the error, and the file is left as it was.

What is written back is what a reader needs and nothing that changes from run to run on its own:
outputs (text, HTML tables, PNG images of the plots) and execution counts are kept; per-cell
execution timing and other volatile metadata are removed, so re-running the notebooks on the same
machine gives the same files (and a clean diff when something really changed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "python3"
CELL_TIMEOUT = 300  # seconds per cell

# Notebook metadata worth keeping; everything else (widget state, papermill / nbclient bookkeeping) goes.
KEEP_NOTEBOOK_METADATA = ("kernelspec", "language_info")
# Cell metadata that changes on every run (nbclient's timing) or records a session (collapsed, scrolled).
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime")


def execute(path: Path, cwd: Path | None = None, timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """The notebook at `path`, run top to bottom in a fresh kernel; raises on the first cell error.

    `cwd` is the kernel's working directory (default: a new temporary directory, removed afterwards).
    """
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix=f"nb-{path.stem}-") as scratch:
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name=KERNEL,
            resources={"metadata": {"path": str(cwd or scratch)}},
            record_timing=False,
            allow_errors=False,
        )
        client.execute()
    return notebook


def strip_volatile(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove what differs between two runs of the same notebook on the same machine (in place)."""
    notebook.metadata = nbformat.NotebookNode(
        {key: notebook.metadata[key] for key in KEEP_NOTEBOOK_METADATA if key in notebook.metadata}
    )
    for cell in notebook.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if "outputs" not in cell:
            continue
        # A kernel flushes printed text in as many stream messages as timing makes it: join runs of the
        # same stream, so one cell's text is one output whatever the timing (the order of outputs is kept).
        merged = []
        for output in cell.outputs:
            output.get("metadata", {}).pop("execution", None)
            previous = merged[-1] if merged else None
            if (
                output.output_type == "stream"
                and previous is not None
                and previous.output_type == "stream"
                and previous.name == output.name
            ):
                previous.text += output.text
            else:
                merged.append(output)
        cell.outputs = merged
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: every notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help=f"seconds per cell (default {CELL_TIMEOUT})")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks under {NOTEBOOKS}", file=sys.stderr)
        return 1
    failed = []
    for path in paths:
        started = time.perf_counter()
        try:
            notebook = execute(path, timeout=args.timeout)
        except Exception as error:  # CellExecutionError, CellTimeoutError, DeadKernelError: report, go on with the rest
            print(f"FAILED {path} after {time.perf_counter() - started:.1f}s:\n{error}", file=sys.stderr)
            failed.append(path)
            continue
        nbformat.write(strip_volatile(notebook), path)
        print(f"{path}: {time.perf_counter() - started:.1f}s", flush=True)
    if failed:
        print(f"{len(failed)} notebook(s) failed, left unchanged: {', '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
