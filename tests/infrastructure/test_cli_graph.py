"""`hooked graph`: one prompt's attribution graph on the bundled IOI model, its files read back and its options
passed through, and bad input refused in one line with nothing written."""

from __future__ import annotations

import json

import pytest
import torch

import hooked
import hooked.sae
from hooked import graphs
from hooked.cli import main
from hooked.graphs import Graph

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
