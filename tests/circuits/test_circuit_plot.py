"""`Circuit.plot` / `hooked.circuits.plot.plot_circuit`: a layered picture of a circuit, saved as PNG."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import hooked  # noqa: E402
from hooked import circuits, metrics, tasks  # noqa: E402
from hooked.circuits import Circuit, graph_of_shape  # noqa: E402
from hooked.circuits.plot import COLOURS, GHOST_LABEL, plot_circuit  # noqa: E402


def _legend(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


def _texts(figure, faint: bool = False) -> list[str]:
    """The figure's texts: the dark ones (labels of circuit nodes, rows, ports), or the faint ones (the
    labels of the model's nodes outside the circuit)."""
    return [
        text.get_text()
        for text in figure.axes[0].texts
        if (matplotlib.colors.to_hex(text.get_color()) == GHOST_LABEL) == faint
    ]


@pytest.fixture(scope="module")
def ioi_circuit() -> Circuit:
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(n=16, seed=0)
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    return circuits.discover(model, task.clean, task.corrupt, metric, method="eap-ig", n_edges=40)


def test_a_discovered_circuit_plots_to_a_png(ioi_circuit, tmp_path):
    path = tmp_path / "plots" / "circuit.png"
    figure = ioi_circuit.plot(path)
    try:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 30_000  # a drawing, not an empty canvas
        image = matplotlib.image.imread(path)
        height, width = image.shape[:2]
        assert width > 800 and height > 800
        # Not one colour: many distinct pixels (nodes, edges in several colours, text).
        assert len({tuple(pixel) for pixel in image[::7, ::7, :3].reshape(-1, 3).round(2).tolist()}) > 50

        texts = _texts(figure)
        for node in ioi_circuit.nodes:  # every node of the circuit is labelled
            assert node in texts
        ghosts = _texts(figure, faint=True)  # and every other head and MLP, faintly
        assert sorted(ghosts) == sorted(set(ioi_circuit.graph.nodes) - set(ioi_circuit.nodes))
        for row in ("input", "L0 heads", "L0 mlp", "L3 heads", "logits"):  # the layers are labelled
            assert row in texts
        legend = _legend(figure)
        for kind in ("query input (.q)", "key input (.k)", "value input (.v)"):
            assert kind in legend
        assert any("score < 0" in label for label in legend)  # EAP-IG scores are signed
        title = figure.axes[0].get_title()
        assert "EAP-IG" in title and f"{len(ioi_circuit.edges)} of 479 edges" in title
    finally:
        plt.close(figure)


def test_edges_are_coloured_by_the_input_they_feed(ioi_circuit):
    figure = plot_circuit(ioi_circuit, title="custom title")
    try:
        assert figure.axes[0].get_title() == "custom title"
        patches = figure.axes[0].patches  # networkx draws each arrow as a FancyArrowPatch
        colours = {matplotlib.colors.to_hex(patch.get_edgecolor()) for patch in patches}
        kinds = {
            edge.receiver.rsplit(".", 1)[-1] if edge.receiver != "logits" else "logits" for edge in ioi_circuit.edges
        }
        for kind in kinds:
            assert COLOURS["mlp" if kind == "mlp" else kind] in colours, kind
        assert len(patches) >= len(ioi_circuit.edges)
    finally:
        plt.close(figure)


def test_grouped_query_ports_and_unsigned_acdc_scores(tmp_path):
    """A grouped-query graph (4 heads, 2 key/value heads): a k/v edge ends on its group's port, labelled KV0;
    an ACDC circuit has no sign legend. No model needed: a circuit is a graph and some edges."""
    g = graph_of_shape(2, 4, 2)
    edges = [
        g.edge(e)
        for e in (
            "input->L0KV0.v",
            "input->L0H1.q",
            "L0H1->L1KV1.k",
            "L0H0->L1.mlp",
            "L1H3->logits",
            "L1.mlp->logits",
            "L0H1->logits",
        )
    ]
    scores = {str(e): 0.0 for e in g.edges} | {str(e): 1.0 + i for i, e in enumerate(edges)}
    circuit = Circuit(g, edges, scores, "acdc")
    figure = circuit.plot(tmp_path / "gqa.png")
    try:
        assert (tmp_path / "gqa.png").stat().st_size > 10_000
        texts = _texts(figure)
        assert texts.count("KV0") == 1 and texts.count("KV1") == 1  # L0's group 0 and L1's group 1
        nodes = ["input", "L0H0", "L0H1", "L1H2", "L1H3", "L1.mlp", "logits"]  # L1KV1 feeds heads 2 and 3
        assert circuit.nodes == nodes
        assert {text for text in texts if text in g.nodes} == set(nodes)
        legend = _legend(figure)
        assert not any("score < 0" in label for label in legend)
        assert any(label.startswith("metric move") for label in legend)
    finally:
        plt.close(figure)


def test_a_post_norm_layer_is_one_attention_node_joined_to_its_ports(tmp_path):
    """Where a layer's attention is one node (OLMo 2, Gemma: `L{l}.attn`), the row holds it, not its heads; the
    ports its edges feed are joined to it, and the layer's heads are not drawn even as outlines."""
    g = graph_of_shape(2, 4, 2, whole_attention=(0, 1))
    edges = [
        g.edge(e)
        for e in (
            "input->L0H1.q",
            "input->L0KV0.v",
            "L0.attn->L1KV1.k",
            "L0.attn->L1.mlp",
            "L1.attn->logits",
            "L1.mlp->logits",
        )
    ]
    scores = {str(e): 0.0 for e in g.edges} | {str(e): -1.0 - i for i, e in enumerate(edges)}
    circuit = Circuit(g, edges, scores, "eap")
    figure = circuit.plot(tmp_path / "post-norm.png")
    try:
        assert (tmp_path / "post-norm.png").stat().st_size > 10_000
        assert circuit.nodes == ["input", "L0.attn", "L1.attn", "L1.mlp", "logits"]
        texts, faint = _texts(figure), _texts(figure, faint=True)
        assert {"L0.attn", "L1.attn", "L0 attn", "L1 attn"} <= set(texts) and "L0.mlp" in faint
        assert not any(text.startswith(("L0H", "L1H")) for text in texts + faint)
    finally:
        plt.close(figure)
