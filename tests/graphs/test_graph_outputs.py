"""Graph's node names and feature addresses, its circuit-tracer file read back, the viewer's JSON and the picture,
without circuit-tracer (test_circuit_tracer_graphs.py compares each with circuit-tracer 0.5.0 itself)."""

from __future__ import annotations

import json
import pickletools
import zipfile

import pytest
import torch

from hooked.graphs import Graph
from hooked.interventions.addresses import parse_address
from hooked.testing import random_model
from tests.graphs.random_graphs import random_graph, with_adjacency
from tests.sae.dictionaries import random_dictionary


class Letters:
    """A tokenizer stand-in: id i decodes to a letter."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_node_labels_follow_circuit_tracers_node_order():
    graph = random_graph()
    layer, position, feature = graph.active_features[graph.selected_features[3]].tolist()
    assert graph.node_label(3) == f"L{layer} F{feature} @{position}"
    assert graph.node_label(graph.error_offset + 2 * graph.n_pos + 1) == "error L2 @1"
    token = int(graph.input_tokens[2])
    assert graph.node_label(graph.token_offset + 2) == f"token {token} @2"
    assert graph.node_label(graph.token_offset + 2, tokenizer=Letters()) == f"token {Letters().decode([token])!r} @2"
    probability = float(graph.logit_probabilities[1])
    assert graph.node_label(graph.logit_offset + 1) == f"logit 'tok1' (p={probability:.2f})"
    assert graph.node(graph.logit_offset).kind == "logit" and graph.node(graph.logit_offset).position == graph.n_pos - 1
    with pytest.raises(IndexError, match="out of range"):
        graph.node(graph.n_nodes)


def test_a_feature_address_names_the_spliced_transcoders_feature():
    model = random_model("llama", n_layers=2)
    transcoder = random_dictionary(
        model.cfg.d_model, "blocks.1.mlp.hook_in", hook_name_out="blocks.1.hook_mlp_out", d_sae=64
    )
    graph = random_graph(n_layers=2, d_sae=64)
    i = next(i for i in range(graph.n_features) if graph.node(i).layer == 1)
    _, position, feature = graph.node(i)[1:]
    with model.saes([transcoder]):
        component = parse_address(model, graph.feature_address(i))
    assert component.hook_name == "blocks.1.hook_mlp_out.hook_sae_acts_post"
    assert component.selectors == {"features": (feature,), "positions": (position,)}
    with pytest.raises(ValueError, match="not a feature"):
        graph.feature_address(graph.error_offset)


@pytest.mark.unchecked
def test_an_output_hook_the_features_kind_cannot_address_is_named():
    graph = random_graph()
    graph.feature_output_hook = "blocks.{layer}.mlp.hook_post"
    with pytest.raises(ValueError, match="mlp.hook_post.*hook_mlp_out"):
        graph.feature_address(0)


@pytest.mark.parametrize("sparse", [False, True])
def test_the_circuit_tracer_file_reads_back_and_names_circuit_tracers_classes(tmp_path, sparse):
    graph = random_graph(seed=6, edges_per_row=6 if sparse else None)
    graph.save_circuit_tracer(tmp_path / "graph.pt")
    with zipfile.ZipFile(tmp_path / "graph.pt") as archive:
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    globals_named = {arg for op, arg, _ in pickletools.genops(pickled) if op.name == "GLOBAL"}
    assert "circuit_tracer.utils.tl_nnsight_mapping UnifiedConfig" in globals_named
    assert "circuit_tracer.attribution.targets LogitTarget" in globals_named
    assert not any(name.startswith("hooked") for name in globals_named)
    back = Graph.load_circuit_tracer(tmp_path / "graph.pt")
    adjacency = graph.adjacency.to_dense() if sparse else graph.adjacency
    # exact, here and below: the file holds copies of the tensors (a sparse adjacency's entries written into zeros)
    assert torch.equal(back.adjacency, adjacency) and not back.adjacency.is_sparse
    for name in ("input_tokens", "active_features", "activation_values", "selected_features", "logit_probabilities"):
        assert torch.equal(getattr(back, name), getattr(graph, name)), name
    assert back.logit_targets == graph.logit_targets and back.scan == graph.scan
    assert back.n_layers == graph.n_layers and back.vocab_size == graph.vocab_size
    assert {k: back.model_info[k] for k in ("d_model", "n_heads", "model_name")} == {
        "d_model": 16,
        "n_heads": 2,
        "model_name": "random",
    }
    assert back.prune().node_mask.tolist() == graph.prune().node_mask.tolist()


def test_to_frontend_writes_the_viewers_files(tmp_path):
    graph = random_graph(seed=7)
    pruned = graph.prune()
    path = graph.to_frontend(tmp_path, slug="one", tokenizer=Letters())
    record = json.loads(path.read_text())
    assert record["metadata"]["prompt_tokens"] == [Letters().decode([t]) for t in graph.input_tokens.tolist()]
    ids = {node["node_id"] for node in record["nodes"]}
    assert {link["source"] for link in record["links"]} | {link["target"] for link in record["links"]} <= ids
    assert len(record["links"]) == len(pruned.edges())
    kinds = [node["feature_type"] for node in record["nodes"]]
    assert kinds.count("embedding") == graph.n_pos and kinds.count("logit") == graph.n_logits
    assert [n["is_target_logit"] for n in record["nodes"] if n["feature_type"] == "logit"] == [True, False, False]
    graph.to_frontend(tmp_path, slug="two")
    graph.to_frontend(tmp_path, slug="one", node_threshold=0.5)  # replaces "one"
    index = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert [(g["slug"], g["node_threshold"]) for g in index["graphs"]] == [("two", 0.8), ("one", 0.5)]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["metadata"]["prompt_tokens"] == [str(t) for t in graph.input_tokens.tolist()]


@pytest.mark.parametrize("sparse", [False, True])
def test_plot_draws_the_pruned_graph_to_a_png(tmp_path, sparse):
    graph = random_graph(seed=8)
    if sparse:
        graph = with_adjacency(graph, graph.adjacency.to_sparse())
    import matplotlib.pyplot as plt

    figure = graph.plot(tmp_path / "graph.png", tokenizer=Letters())
    assert (tmp_path / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    texts = {text.get_text() for text in figure.axes[0].texts}
    pruned = graph.prune()
    features = [i for i in pruned.nodes if i < graph.n_features]
    assert features and all(graph.node_label(i).split(" @")[0] in texts for i in features)
    assert len(figure.axes[0].collections[0].get_segments()) == len(pruned.edges())
    plt.close(figure)


def test_every_graph_has_a_scan_the_transcoders_own_else_their_path(tmp_path):
    """circuit-tracer's create_graph_files refuses a graph without `scan` ('Neither scan nor graph.scan was set').
    A graph keeps the scan its transcoders' config.yaml names; where it names none, the path they were loaded from;
    transcoders made in memory give the model's name; and a Graph built without one is written with one."""
    import yaml

    import hooked.sae
    from hooked import graphs

    model = random_model("gpt2", seed=1)
    made = [
        random_dictionary(
            model.cfg.d_model, f"blocks.{layer}.mlp.hook_in", hook_name_out=f"blocks.{layer}.hook_mlp_out", d_sae=8,
            architecture="jumprelu", seed=layer,
        )
        for layer in range(model.cfg.n_layers)
    ]  # fmt: skip
    named, unnamed = tmp_path / "named", tmp_path / "unnamed"
    for folder, scan in ((named, "gpt2-tiny-transcoders"), (unnamed, None)):
        hooked.sae.save(made, folder, format="circuit-tracer")
        config = yaml.safe_load((folder / "config.yaml").read_text())
        config.pop("scan", None)
        (folder / "config.yaml").write_text(yaml.safe_dump(config | ({"scan": scan} if scan else {})))
    prompt = torch.tensor([3, 17, 42, 8, 25])
    for transcoders, scan in (
        (hooked.sae.load(named), "gpt2-tiny-transcoders"),
        (hooked.sae.load(str(unnamed)), str(unnamed)),
        (made, model.cfg.model_name),
    ):
        graph = graphs.attribute(model, prompt, transcoders, progress=False)
        assert graph.scan == scan
        graph.save_circuit_tracer(tmp_path / "graph.pt")
        assert Graph.load_circuit_tracer(tmp_path / "graph.pt").scan == scan
    bare = random_graph(seed=6)
    bare.scan = None
    bare.save_circuit_tracer(tmp_path / "bare.pt")
    assert Graph.load_circuit_tracer(tmp_path / "bare.pt").scan == "random"  # its model_info's model_name
