"""hooked's graph pruning, scores, graph files and viewer JSON against circuit-tracer 0.5.0 itself, in its own
venv (tests/circuit_tracer_venv.py), on random graphs (tests/graphs/random_graphs.py).

hooked writes each graph with `save_circuit_tracer`; circuit-tracer loads it with `Graph.from_pt`, runs its
`compute_node_influence`, `prune_graph`, `compute_graph_scores` and `create_graph_files` (with a tokenizer folder
built here), and writes what they return; hooked compares its own on the same graph. circuit-tracer also writes a
graph of its own with `to_pt`, which hooked reads with `load_circuit_tracer`.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from hooked.graphs import Graph
from tests.circuit_tracer_venv import run_circuit_tracer
from tests.graphs.random_graphs import random_graph

pytestmark = pytest.mark.slow

TOKENIZER = Path(__file__).resolve().parents[2] / "hooked" / "bundled" / "ioi-gpt2" / "tokenizer.json"
THRESHOLDS = [(0.8, 0.98), (0.5, 0.9), (0.95, 0.6)]
GRAPHS = {
    "dense": dict(seed=1),
    "wide": dict(seed=2, n_layers=4, n_pos=7, n_active=80, n_features=60, n_logits=5, density=0.7),
    "sparse": dict(seed=3, n_active=60, n_features=50, edges_per_row=6),  # written dense
}

CIRCUIT_TRACER_SIDE = textwrap.dedent(
    """
    import json, sys
    import torch
    from safetensors.torch import save_file
    from circuit_tracer.attribution.targets import LogitTarget
    from circuit_tracer.graph import Graph, compute_graph_scores, compute_node_influence, prune_graph
    from circuit_tracer.utils.create_graph_files import create_graph_files
    from circuit_tracer.utils.tl_nnsight_mapping import UnifiedConfig

    work = sys.argv[1]
    jobs = json.load(open(f"{work}/jobs.json"))
    out = {}
    for name in jobs["graphs"]:
        graph = Graph.from_pt(f"{work}/{name}.pt")
        assert type(graph.cfg) is UnifiedConfig and all(type(t) is LogitTarget for t in graph.logit_targets)
        weights = torch.zeros(graph.adjacency_matrix.shape[0])
        weights[-len(graph.logit_targets):] = graph.logit_probabilities
        tensors = {"influence": compute_node_influence(graph.adjacency_matrix, weights)}
        for k, (node_threshold, edge_threshold) in enumerate(jobs["thresholds"]):
            result = prune_graph(graph, node_threshold, edge_threshold)
            tensors |= {f"node_mask{k}": result.node_mask, f"edge_mask{k}": result.edge_mask,
                        f"cumulative{k}": result.cumulative_scores}
        save_file(tensors, f"{work}/{name}.out.safetensors")
        out[name] = {"scores": compute_graph_scores(graph), "cfg": vars(graph.cfg), "scan": graph.scan,
                     "targets": [list(t) for t in graph.logit_targets], "vocab_size": graph.vocab_size}
        create_graph_files(f"{work}/{name}.pt", name, f"{work}/frontend", node_threshold=0.8, edge_threshold=0.98)
    json.dump(out, open(f"{work}/out.json", "w"))

    cfg = UnifiedConfig(n_layers=2, d_model=8, d_head=4, n_heads=2, d_mlp=16, d_vocab=300, tokenizer_name="t",
                        model_name="m", original_architecture="LlamaForCausalLM", n_key_value_heads=1)
    adjacency = torch.randn(13, 13)
    own = Graph("own prompt", torch.tensor([5, 6, 7]), torch.tensor([[0, 1, 3], [1, 2, 4]]), adjacency, cfg,
                torch.tensor([0, 1]), torch.tensor([1.5, 2.5]), [LogitTarget("x", 3), LogitTarget("y", 9)],
                torch.tensor([0.6, 0.3]), scan="own-scan")
    own.to_pt(f"{work}/own.pt")
    save_file({"adjacency": adjacency}, f"{work}/own.safetensors")
    """
)


class _Decoder:
    """The bundled tokenizer's decode, as circuit-tracer's transformers tokenizer decodes one id."""

    def __init__(self, path: Path):
        self.tokenizer = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _tokenizer_folder(path: Path) -> Path:
    path.mkdir()
    (path / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory):
    """hooked's graphs, and what circuit-tracer computed on them."""
    work = tmp_path_factory.mktemp("graphs")
    tokenizer = _tokenizer_folder(work / "tokenizer")
    graphs = {}
    for name, settings in GRAPHS.items():
        graph = random_graph(**settings)
        graph.model_info["tokenizer_name"] = str(tokenizer)
        graph.save_circuit_tracer(work / f"{name}.pt")
        graphs[name] = graph
    (work / "jobs.json").write_text(json.dumps({"graphs": list(GRAPHS), "thresholds": THRESHOLDS}))
    run_circuit_tracer(CIRCUIT_TRACER_SIDE, str(work))
    return work, graphs, json.loads((work / "out.json").read_text())


@pytest.mark.parametrize("name", list(GRAPHS))
def test_pruning_and_scores_equal_circuit_tracers(exchanged, name):
    work, graphs, out = exchanged
    graph, theirs = graphs[name], load_file(work / f"{name}.out.safetensors")
    torch.testing.assert_close(graph.node_influence(), theirs["influence"], rtol=1e-5, atol=1e-7)
    for k, (node_threshold, edge_threshold) in enumerate(THRESHOLDS):
        pruned = graph.prune(node_threshold, edge_threshold)
        node_mask = theirs[f"node_mask{k}"]
        assert 0 < int(node_mask[: graph.token_offset].sum()) < graph.token_offset  # pruning kept some, not all
        # boolean masks, exact: thresholds on scores equal to float32 rounding (as above), none within it of a cut
        assert torch.equal(pruned.node_mask, node_mask)
        edge_mask = pruned.edge_mask.to_dense() if pruned.edge_mask.is_sparse else pruned.edge_mask
        assert torch.equal(edge_mask, theirs[f"edge_mask{k}"])
        torch.testing.assert_close(pruned.cumulative_scores, theirs[f"cumulative{k}"], rtol=1e-5, atol=1e-7)
    assert graph.scores() == pytest.approx(tuple(out[name]["scores"]), rel=1e-5)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_circuit_tracer_reads_the_file_with_its_own_config_and_targets(exchanged, name):
    _, graphs, out = exchanged
    graph, theirs = graphs[name], out[name]
    info = graph.model_info
    expected = {key: info[key] for key in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab")}
    assert {key: theirs["cfg"][key] for key in expected} == expected
    assert theirs["cfg"]["model_name"] == "random" and theirs["cfg"]["tokenizer_name"] == info["tokenizer_name"]
    assert theirs["targets"] == [[t.token_str, t.vocab_idx] for t in graph.logit_targets]
    assert theirs["scan"] == graph.scan and theirs["vocab_size"] == graph.vocab_size


@pytest.mark.parametrize("name", list(GRAPHS))
def test_to_frontend_writes_what_create_graph_files_writes(exchanged, tmp_path, name):
    work, graphs, _ = exchanged
    graph = graphs[name]
    path = graph.to_frontend(tmp_path, slug=name, tokenizer=_Decoder(TOKENIZER))
    ours, theirs = json.loads(path.read_text()), json.loads((work / "frontend" / f"{name}.json").read_text())
    assert len(theirs["nodes"]) > graph.n_pos + graph.n_logits and len(theirs["links"]) > 0
    assert ours["metadata"] == theirs["metadata"] and ours["qParams"] == theirs["qParams"]
    _assert_same_records(ours["nodes"], theirs["nodes"])
    _assert_same_records(ours["links"], theirs["links"])
    index = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert index == {"graphs": [theirs["metadata"]]}


def _assert_same_records(ours: list[dict], theirs: list[dict]) -> None:
    """Equal lists of records: same keys and order, strings and ints equal, floats to float32 rounding."""
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs, strict=True):
        assert list(mine) == list(reference)
        for key, value in reference.items():
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (key, mine, reference)
            else:
                assert mine[key] == value, (key, mine, reference)


def test_hooked_reads_circuit_tracers_own_file(exchanged):
    work, _, _ = exchanged
    graph = Graph.load_circuit_tracer(work / "own.pt")
    assert torch.equal(graph.adjacency, load_file(work / "own.safetensors")["adjacency"])  # a copy: the same tensor
    assert graph.input_string == "own prompt" and graph.input_tokens.tolist() == [5, 6, 7]
    assert graph.active_features.tolist() == [[0, 1, 3], [1, 2, 4]] and graph.selected_features.tolist() == [0, 1]
    assert [tuple(t) for t in graph.logit_targets] == [("x", 3), ("y", 9)]
    assert graph.n_layers == 2 and graph.vocab_size == 300 and graph.scan == "own-scan"
    assert (
        graph.model_info["original_architecture"] == "LlamaForCausalLM" and graph.model_info["n_key_value_heads"] == 1
    )
    assert graph.n_nodes == 13 and graph.node_label(0) == "L0 F3 @1"


def test_create_graph_files_takes_a_graph_of_transcoders_whose_files_name_no_scan(tmp_path):
    """circuit-tracer's create_graph_files refuses a graph without a scan ('Neither scan nor graph.scan was set').
    A graph hooked attributes through a transcoder set whose config.yaml names none carries the path the set was
    loaded from, which circuit-tracer's viewer files then name."""
    import yaml

    import hooked.sae
    from hooked import graphs
    from hooked.testing import random_model
    from tests.sae.dictionaries import random_dictionary

    model = random_model("gpt2", seed=1)
    transcoders = [
        random_dictionary(
            model.cfg.d_model, f"blocks.{layer}.mlp.hook_in", hook_name_out=f"blocks.{layer}.hook_mlp_out", d_sae=8,
            architecture="jumprelu", seed=layer,
        )
        for layer in range(model.cfg.n_layers)
    ]  # fmt: skip
    folder = tmp_path / "set"
    hooked.sae.save(transcoders, folder, format="circuit-tracer")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    del config["scan"]
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    graph = graphs.attribute(model, torch.tensor([3, 17, 42, 8, 25]), hooked.sae.load(folder), progress=False)
    graph.model_info["tokenizer_name"] = str(_tokenizer_folder(tmp_path / "tokenizer"))
    graph.save_circuit_tracer(tmp_path / "graph.pt")
    script = textwrap.dedent(
        """
        import json, sys
        from circuit_tracer.utils.create_graph_files import create_graph_files
        work = sys.argv[1]
        create_graph_files(f"{work}/graph.pt", "g", f"{work}/frontend", node_threshold=0.8, edge_threshold=0.98)
        """
    )
    run_circuit_tracer(script, str(tmp_path))
    written = json.loads((tmp_path / "frontend" / "g.json").read_text())
    assert written["metadata"]["scan"] == str(folder) == graph.scan
