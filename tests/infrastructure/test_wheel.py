"""The wheel carries the bundled IOI models and their sparse dictionaries, and a wheel installed outside the checkout
loads them offline.

Built with `python -m build --wheel --no-isolation` (the `build` package of the dev extra, with the
setuptools already installed, so nothing is fetched), installed with `pip install --no-deps --target`
into a temporary directory, and imported from there by a fresh interpreter whose working directory is
not the checkout.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # make test-fast leaves this file out

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ("ioi-gpt2", "ioi-qwen3moe")


def test_an_installed_wheel_loads_the_bundled_models(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    wheel = next(dist.glob("hooked-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for model in BUNDLED:
        for file in ("config.json", "model.safetensors", "tokenizer.json"):
            assert f"hooked/bundled/{model}/{file}" in names, (model, file)
    shipped = [p.relative_to(ROOT).as_posix() for p in (ROOT / "hooked" / "bundled").glob("*/saes/**/*") if p.is_file()]
    assert len(shipped) >= 2 * 4 * 2 + 2 and set(shipped) <= names, sorted(set(shipped) - names)
    # the graph page's template, script, styles and the Cytoscape.js build it inlines, with its licence
    static = [p.relative_to(ROOT).as_posix() for p in (ROOT / "hooked" / "graphs" / "static").iterdir()]
    assert "hooked/graphs/static/cytoscape.min.js" in static and "hooked/graphs/static/cytoscape.LICENSE" in static
    assert set(static) <= names, sorted(set(static) - names)
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    script = (
        "import json, sys, torch, hooked\n"
        "from hooked import metrics, tasks\n"
        "task = tasks.ioi(n=8, seed=5)\n"
        "out = {'file': hooked.__file__}\n"
        f"for name in {[f'hooked/{m}' for m in BUNDLED]!r}:\n"
        "    model = hooked.load(name)\n"
        "    with torch.no_grad():\n"
        "        out[name] = metrics.logit_diff(model, task.correct, "
        "task.incorrect)(model(model.to_tokens(task.clean))).mean().item()\n"
        "import hooked.sae\n"
        "sae = hooked.sae.load('hooked/ioi-gpt2/saes/blocks.2.hook_resid_post')\n"
        "out['sae_dir'] = str(hooked.sae.bundled_saes()['hooked/ioi-gpt2/saes/blocks.2.hook_resid_post'])\n"
        "out['transcoders'] = len(hooked.sae.load('hooked/ioi-qwen3moe/saes/transcoders'))\n"
        "from hooked.graphs import page\n"
        "out['page_static'] = str(page.STATIC)\n"
        "out['page_files'] = sorted(p.name for p in page.STATIC.iterdir())\n"
        "print(json.dumps(out))\n"
    )
    env = {"PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).is_relative_to(target), out["file"]  # the installed copy, not the checkout
    assert Path(out["sae_dir"]).is_relative_to(target) and out["transcoders"] == 4, out
    assert Path(out["page_static"]).is_relative_to(target), out  # the page inlines the installed copy's files
    assert out["page_files"] == sorted(p.rsplit("/", 1)[1] for p in static), out
    for model in BUNDLED:
        assert out[f"hooked/{model}"] > 1.0, out  # a trained model: the right name is clearly preferred
