"""`hooked graph`: one prompt's attribution graph on the bundled IOI model, its files read back and its options
passed through, and bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import torch

import hooked
import hooked.sae
from hooked import graphs
from hooked.cli import main
from hooked.graphs import Graph

ROOT = Path(__file__).resolve().parents[2]
MODEL, SET = "hooked/ioi-gpt2", "hooked/ioi-gpt2/saes/transcoders"
PROMPT = "When Mary and John went to the store, John gave a drink to"


def test_graph_writes_circuit_tracers_file_the_viewers_json_and_the_picture(tmp_path, capsys):
    out = tmp_path / "graph"
    options = ["--max-feature-nodes", "40", "--edges-per-row", "25", "--node-threshold", "0.7", "--top", "3"]
    assert main(["graph", MODEL, "--transcoders", SET, "--prompt", PROMPT, "--out", str(out), *options]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["graph-metadata.json", "graph.json", "graph.png", "graph.pt"]

    # the file holds the graph attribute computes with these settings (sparse rows of 25 edges, 40 feature nodes)
    model = hooked.load(MODEL)
    transcoders = hooked.sae.load(SET, model=model)
    expected = graphs.attribute(model, PROMPT, transcoders, max_feature_nodes=40, edges_per_row=25)
    saved = Graph.load_circuit_tracer(out / "graph.pt")
    assert saved.n_features == 40 and torch.equal(saved.input_tokens, expected.input_tokens)
    torch.testing.assert_close(saved.adjacency.to_dense(), expected.adjacency.to_dense())
    assert int((saved.adjacency.to_dense() != 0).sum(1).max()) <= 25

    pruned = expected.prune(node_threshold=0.7, edge_threshold=0.98)
    scores = expected.scores()
    assert f"{len(pruned.nodes)} nodes, {len(pruned.edges())} edges" in printed
    assert f"replacement score {scores.replacement:.3f}, completeness {scores.completeness:.3f}" in printed
    influence = pruned.node_influence[: expected.n_features]
    for i in influence.argsort(descending=True)[:3].tolist():
        assert f"  {expected.feature_address(i):<22} {float(influence[i]):.4f}" in printed
    viewer = json.loads((out / "graph.json").read_text())
    assert viewer["metadata"]["slug"] == "graph" and len(viewer["nodes"]) == len(pruned.nodes)


def test_graph_targets_name_the_logit_nodes(tmp_path, capsys):
    out = tmp_path / "graph"
    targets = ["--target", " John", "--target", " Mary"]
    assert main(["graph", MODEL, "--transcoders", SET, "--prompt", PROMPT, "--out", str(out), *targets]) == 0
    model = hooked.load(MODEL)
    ids = [model.tokenizer.encode(name, add_special_tokens=False)[0] for name in (" John", " Mary")]
    saved = Graph.load_circuit_tracer(out / "graph.pt")
    assert [t.vocab_idx for t in saved.logit_targets] == ids
    expected = graphs.attribute(model, PROMPT, hooked.sae.load(SET, model=model), attribution_targets=ids)
    torch.testing.assert_close(saved.adjacency, expected.adjacency)
    printed = capsys.readouterr().out
    assert f"logits: {saved.logit_targets[0].token_str!r} {float(saved.logit_probabilities[0]):.3f}, " in printed


@pytest.mark.parametrize(
    "change, message",
    [
        (["--node-threshold", "1.5"], "--node-threshold must be between 0 and 1, got 1.5"),
        (["--prompt", ""], "--prompt is empty"),
        (["--transcoders", "hooked/ioi-gpt2/saes/nothing-here"], "nothing-here"),
        (["--max-n-logits", "0"], "max_n_logits must be a positive integer"),
        (["--target", " Mary", "--max-n-logits", "3"], "attribution_targets names them, so these would be ignored"),
        (["--target", "Mary and John"], "attribution target 'Mary and John' is 3 tokens"),
    ],
)
def test_graph_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, change, message):
    args = {"--transcoders": SET, "--prompt": PROMPT, "--out": str(tmp_path / "out")}
    args.update(dict(zip(change[::2], change[1::2], strict=True)))
    assert main(["graph", MODEL, *[part for pair in args.items() for part in pair]]) == 2
    error = capsys.readouterr().err
    assert error.startswith("hooked graph: error: ") and message in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _page_data(path: Path) -> dict:
    """The data a graph page (hooked/graphs/page.py) carries, read back from its HTML."""
    text = path.read_text(encoding="utf-8")
    start = text.index('<script type="application/json" id="graph-data">') + len(
        '<script type="application/json" id="graph-data">'
    )
    return json.loads(text[start : text.index("</script>", start)])


def test_graph_html_writes_the_page_to_explore(tmp_path, capsys):
    out, html = tmp_path / "graph", tmp_path / "pages" / "ioi.html"
    options = ["--max-feature-nodes", "30", "--node-threshold", "0.7", "--edge-threshold", "0.9", "--html", str(html)]
    assert main(["graph", MODEL, "--transcoders", SET, "--prompt", PROMPT, "--out", str(out), *options]) == 0
    assert f"  {html}\n" in capsys.readouterr().out  # listed with what was written
    data = _page_data(html)
    model = hooked.load(MODEL)
    expected = graphs.attribute(model, PROMPT, hooked.sae.load(SET, model=model), max_feature_nodes=30)
    assert data["grid"]["node_thresholds"][data["start"]["node_threshold"]] == 0.7
    assert data["start"]["edge_threshold"] == 0.9
    assert set(expected.prune(0.7, 0.9).nodes) <= {node["i"] for node in data["nodes"]}
    assert data["tokens"] == [model.tokenizer.decode([t]) for t in expected.input_tokens.tolist()]


def test_graph_serve_prints_the_url_serves_the_page_and_ends_on_ctrl_c(tmp_path):
    out = tmp_path / "graph"
    command = [sys.executable, "-m", "hooked.cli", "graph", MODEL, "--transcoders", SET, "--prompt", PROMPT]
    command += ["--out", str(out), "--max-feature-nodes", "20", "--serve"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}  # stdout a buffered pipe
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        printed, found = [], None
        while found is None:  # until the URL (the graph is computed first); a URL never printed fails, not hangs
            try:
                printed.append(lines.get(timeout=120))
            except queue.Empty:
                pytest.fail("no URL printed within 120 s; printed so far:\n" + "".join(printed))
            found = re.search(r"serving the graph page at (http://127\.0\.0\.1:\d+/)", printed[-1])
        page = urllib.request.urlopen(found.group(1), timeout=30).read().decode("utf-8")
        assert "window.hookedGraphReady" in page and '<script type="application/json" id="graph-data">' in page
        process.send_signal(signal.SIGINT)  # Ctrl-C
        assert process.wait(timeout=30) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (out / "graph.json").exists()  # the files were written before serving


def test_graph_html_refuses_a_folder_and_writes_nothing(tmp_path, capsys):
    args = ["--transcoders", SET, "--prompt", PROMPT, "--out", str(tmp_path / "out"), "--html", str(tmp_path)]
    assert main(["graph", MODEL, *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith("hooked graph: error: --html ") and "is a directory" in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists()
