"""Every notebook under notebooks/ runs top to bottom, and the committed file carries its outputs.

Each notebook runs in a fresh "python3" Jupyter kernel (nbclient, as `scripts/run_notebooks.py` runs
them) with a temporary working directory, on the models bundled with hooked (`hooked/ioi-gpt2`,
`hooked/ioi-qwen3moe`): no download, no environment variable. A cell that raises fails the test with
the cell and its traceback.

The committed outputs are what a code host renders, so the files themselves are checked too: every
code cell executed, in order, by one kernel (execution counts 1, 2, ...), no error output, no
volatile metadata, and a PNG wherever a cell draws a plot. `scripts/run_notebooks.py` refreshes them.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow  # make test-fast leaves this file out

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PLOTS = re.compile(r"plt\.show\(\)|\.heatmap\(")  # a cell that draws a figure
REFRESH = "run `.venv/bin/python scripts/run_notebooks.py` and commit the result"


def _runner():
    """scripts/run_notebooks.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _has_png(cell) -> bool:
    return any("image/png" in output.get("data", {}) for output in cell.outputs)


def test_there_are_notebooks():
    assert {path.name for path in NOTEBOOKS} >= {
        "ablation.ipynb",
        "circuits.ipynb",
        "graphs.ipynb",
        "patching.ipynb",
        "quickstart.ipynb",
        "saes.ipynb",
        "sweeps.ipynb",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_committed_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    cells = _code_cells(notebook)
    counts = [cell.execution_count for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: execution counts {counts}; {REFRESH}"
    errors = [
        f"{output.ename}: {output.evalue}" for cell in cells for output in cell.outputs if output.output_type == "error"
    ]
    assert not errors, f"{path.name} was committed with errors: {errors}"
    assert all(cell.outputs for cell in cells), f"{path.name}: a code cell has no output; {REFRESH}"
    plotting = [cell for cell in cells if PLOTS.search(cell.source)]
    missing = [cell.source.splitlines()[0] for cell in plotting if not _has_png(cell)]
    assert not missing, f"{path.name}: cells that draw a plot have no PNG output (first lines: {missing}); {REFRESH}"
    assert not plotting or any(_has_png(cell) for cell in cells)
    volatile = [cell.metadata for cell in notebook.cells if "execution" in cell.metadata]
    assert not volatile, f"{path.name} carries execution timing; {REFRESH}"
    assert "HOOKED_NOTEBOOK_MODEL" not in path.read_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_runs(path, tmp_path):
    runner = _runner()
    executed = runner.strip_volatile(runner.execute(path, cwd=tmp_path))  # raises CellExecutionError on a cell error
    cells = _code_cells(executed)
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    assert not [output for cell in cells for output in cell.outputs if output.output_type == "error"]
    committed = _code_cells(nbformat.read(path, as_version=4))
    # the same cells draw plots now as in the committed file
    assert [_has_png(cell) for cell in cells] == [_has_png(cell) for cell in committed], REFRESH
