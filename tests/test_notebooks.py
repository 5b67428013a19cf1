"""Every notebook runs top to bottom (code cells executed in order in one namespace)."""

import json
from pathlib import Path

import pytest
import torch

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, gpt2_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("HOOKED_NOTEBOOK_MODEL", str(gpt2_dir))
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__notebook__"}
    with torch.enable_grad():  # restores the grad mode a notebook's set_grad_enabled(False) changes
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    assert "model" in namespace
