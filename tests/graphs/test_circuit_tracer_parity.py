"""`hooked.graphs.attribute` against circuit-tracer 0.5.0's `attribute`, entry by entry, on tiny random Llama
checkpoints (multi-head and grouped-query attention) with a relu transcoder set, a JumpReLU set with skip matrices
and a JumpReLU cross-layer transcoder, every active feature a node or `max_feature_nodes` chosen by influence.

circuit-tracer runs in its own venv (tests/graphs/circuit_tracer_reference.py). Its model is checked first to be
the checkpoint (its logits are transformers' and hooked's), and its graph to be well formed, so that a difference
in the parity test is hooked's. Graphs are compared exactly where they are integers (the active features and their
order, the selected features, the logit tokens: chosen from activations, influences and probabilities equal to
float32 rounding on both sides, none within it of a threshold or a tie here) and to float32 rounding elsewhere:
each adjacency row within 1e-5 of its largest entry (+ 1e-6), a failure naming the node types of the entries that
differ.
"""

from __future__ import annotations

import pytest
import torch

import hooked
import hooked.sae
from tests.graphs.circuit_tracer_reference import (
    Job,
    as_targets,
    build_llama_checkpoint,
    circuit_tracer_graphs,
    prompt_tokens,
    random_clt,
    random_transcoder_set,
)

pytestmark = pytest.mark.slow

N_LAYERS, D_MODEL, D_SAE = 3, 32, 40
CHECKPOINTS = {"mha": 4, "gqa": 2}  # name -> key/value heads (of 4)
TRANSCODERS = {  # name -> (checkpoint it reads, circuit-tracer folder builder)
    "set": ("mha", lambda: random_transcoder_set(N_LAYERS, D_MODEL, D_SAE, skip=False, architecture="standard")),
    "set_skip": ("gqa", lambda: random_transcoder_set(N_LAYERS, D_MODEL, D_SAE, skip=True, seed=10)),
    "clt": ("mha", lambda: random_clt(N_LAYERS, D_MODEL, D_SAE, seed=20)),
}
SETTINGS = {
    # every active feature a node, rows in batches of 16; logits cut by desired_logit_prob before max_n_logits
    "all": dict(max_n_logits=8, desired_logit_prob=0.3, max_feature_nodes=None, batch_size=16),
    # 24 features chosen by influence, ranked again after each 4 * 4 rows (circuit-tracer's update_interval 4)
    "selected": dict(max_n_logits=5, desired_logit_prob=0.95, max_feature_nodes=24, batch_size=4),
}
# attribution_targets (JSON, as both sides read it: circuit_tracer_reference.as_targets): token ids in an order of
# their own, two words as text (one token each in the checkpoints' small BPE), and custom directions, a logit
# difference and a fixed direction (`with_targets`)
SETTINGS |= {
    "ids": dict(max_feature_nodes=None, batch_size=16, attribution_targets={"ids": [7, 250, 2]}),
    "strings": dict(max_feature_nodes=24, batch_size=4, attribution_targets={"strings": [" went", " the"]}),
    "custom": dict(max_feature_nodes=None, batch_size=16, attribution_targets={"custom": []}),
}
CASES = [(transcoders, settings) for transcoders in TRANSCODERS for settings in ("all", "selected")]
CASES += [("set", "ids"), ("set_skip", "strings"), ("clt", "custom")]


def with_targets(settings: dict, checkpoint) -> dict:
    """`settings` with custom targets made from the checkpoint's unembedding: logit(' went') - logit(' the'), and
    a fixed direction with its own weight."""
    if "custom" not in settings.get("attribution_targets", {}):
        return settings
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    went, the = (tokenizer.encode(word, add_special_tokens=False).ids for word in (" went", " the"))
    assert len(went) == len(the) == 1
    w_u = load_file(checkpoint / "model.safetensors")["lm_head.weight"]
    custom = [
        ["went - the", 1.0, (w_u[went[0]] - w_u[the[0]]).tolist()],
        ["fixed", 0.3, torch.linspace(-1, 1, w_u.shape[1]).tolist()],
    ]
    return {**settings, "attribution_targets": {"custom": custom}}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Checkpoints (name -> directory), transcoder folders (name -> directory) and the prompt's token ids."""
    root = tmp_path_factory.mktemp("graphs")
    checkpoints = {
        name: build_llama_checkpoint(root / name, n_layers=N_LAYERS, d_model=D_MODEL, n_kv_heads=kv, seed=i)
        for i, (name, kv) in enumerate(CHECKPOINTS.items())
    }
    folders = {
        name: hooked.sae.save(build(), root / name, format="circuit-tracer") for name, (_, build) in TRANSCODERS.items()
    }
    return checkpoints, folders, prompt_tokens(checkpoints["mha"])


@pytest.fixture(scope="module")
def references(built):
    checkpoints, folders, tokens = built
    jobs = {
        (tc, setting): Job(
            checkpoints[TRANSCODERS[tc][0]],
            folders[tc],
            tokens,
            with_targets(SETTINGS[setting], checkpoints[TRANSCODERS[tc][0]]),
        )
        for tc, setting in CASES
    }
    return circuit_tracer_graphs(jobs)


def close(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Where `actual` equals `expected` to float32 rounding, row by row: within 1e-5 of the row's largest
    entry, + 1e-6."""
    scale = expected.abs().amax(dim=-1, keepdim=True) if expected.ndim > 1 else expected.abs().max()
    return (actual - expected).abs() <= 1e-5 * scale + 1e-6


# ----------------------------------------------------------------------------- the reference itself
def test_reference_model_is_the_checkpoint(built, references):
    """circuit-tracer's TransformerLens model, built offline, computes the checkpoint's logits: equal to
    transformers 4.57.3's LlamaForCausalLM (in circuit-tracer's venv) and to hooked's model (here) to float32
    rounding, on both checkpoints."""
    checkpoints, _, tokens = built
    for tc, (checkpoint, _) in TRANSCODERS.items():
        reference = references[(tc, "all")]
        assert reference.hf_logits.shape == (len(tokens), 300)
        assert close(reference.tl_logits, reference.hf_logits).all(), tc
        with torch.no_grad():
            ours = hooked.load(checkpoints[checkpoint])(torch.tensor([tokens]))[0]
        assert close(ours, reference.hf_logits).all(), tc
        assert reference.hf_logits.std() > 0.5  # not a flat distribution: the logit targets are clear


def node_kind(reference, index: int) -> str:
    n_features, n_pos = reference.selected_features.shape[0], reference.input_tokens.shape[0]
    bounds = [("feature", n_features), ("error", reference.n_layers * n_pos), ("token", n_pos)]
    for kind, size in bounds:
        if index < size:
            return kind
        index -= size
    return "logit"


@pytest.mark.parametrize("tc, setting", CASES)
def test_reference_graph_is_well_formed(built, references, tc, setting):
    """circuit-tracer's graph has its documented layout (graph.py): features sorted by layer, position, feature,
    none at the BOS position; the selected features ascending, as many as asked; error and token rows and logit
    columns zero; the logit targets the most probable tokens by falling probability, cut where their summed
    probability reaches desired_logit_prob; and each active feature's activation is what hooked.sae's transcoders
    give on hooked's model at that layer and position (so the two sides read the same features)."""
    checkpoints, folders, tokens = built
    reference, settings = references[(tc, setting)], SETTINGS[setting]
    n_pos, n_layers = len(tokens), N_LAYERS
    active, selected = reference.active_features, reference.selected_features
    assert reference.input_tokens.tolist() == tokens
    order = active[:, 0] * n_pos * D_SAE + active[:, 1] * D_SAE + active[:, 2]
    assert bool((order[1:] > order[:-1]).all()) and bool((active[:, 1] > 0).all())
    assert 0.05 < active.shape[0] / (n_layers * (n_pos - 1) * D_SAE) < 0.5  # sparse, not empty
    expected_features = settings["max_feature_nodes"] or active.shape[0]
    assert selected.shape == (expected_features,) and bool((selected[1:] > selected[:-1]).all())

    n_logits = len(reference.logit_targets)
    n_nodes = expected_features + n_layers * n_pos + n_pos + n_logits
    adjacency = reference.adjacency
    assert adjacency.shape == (n_nodes, n_nodes)
    assert not adjacency[expected_features:-n_logits].any() and not adjacency[:, -n_logits:].any()
    assert adjacency[:expected_features].abs().sum() > 0 and adjacency[-n_logits:].abs().sum() > 0

    probabilities = reference.hf_logits[-1].softmax(-1)
    spec = with_targets(settings, checkpoints[TRANSCODERS[tc][0]]).get("attribution_targets")
    if spec is None:
        top = probabilities.topk(settings["max_n_logits"])
        cut = min(int((top.values.cumsum(0) < settings["desired_logit_prob"]).sum()) + 1, settings["max_n_logits"])
        ids, weights = top.indices[:cut].tolist(), top.values[:cut]
        if setting == "all":
            assert cut < settings["max_n_logits"]  # the cut by probability is exercised
    elif "custom" in spec:  # numbered after the vocabulary, weighted as given
        ids = [probabilities.shape[0] + i for i in range(len(spec["custom"]))]
        weights = torch.tensor([weight for _, weight, _ in spec["custom"]])
    else:  # the tokens asked for, in that order, with their probabilities
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(checkpoints[TRANSCODERS[tc][0]] / "tokenizer.json"))
        ids = spec.get("ids") or [tokenizer.encode(s, add_special_tokens=False).ids[0] for s in spec["strings"]]
        weights = probabilities[ids]
    assert [vocab for _, vocab in reference.logit_targets] == ids
    assert close(reference.logit_probabilities, weights).all()

    model = hooked.load(checkpoints[TRANSCODERS[tc][0]])
    transcoders = hooked.sae.load(folders[tc], model=model)
    _, cache = model.run_with_cache(torch.tensor([tokens]), names_filter=lambda name: name.endswith("mlp.hook_in"))
    with torch.no_grad():
        if isinstance(transcoders, list):
            acts = torch.stack([t.encode(cache[f"blocks.{i}.mlp.hook_in"][0]) for i, t in enumerate(transcoders)])
        else:
            inputs = torch.stack([cache[f"blocks.{i}.mlp.hook_in"][0] for i in range(n_layers)])
            acts = transcoders.encode(inputs)
    acts[:, 0] = 0  # circuit-tracer zeroes the BOS position's features
    assert torch.equal(acts.nonzero(), active)  # integer indices (see the module's docstring)
    assert close(acts[tuple(active.T)], reference.activation_values).all()


# ----------------------------------------------------------------------------- hooked against the reference
def differences(ours: torch.Tensor, reference) -> str:
    """The adjacency entries that differ, by (target kind, source kind): how many, the largest difference and
    one example (row, column, ours, circuit-tracer's)."""
    expected = reference.adjacency
    wrong = (~close(ours, expected)).nonzero().tolist()
    groups: dict[tuple[str, str], list] = {}
    for row, column in wrong:
        groups.setdefault((node_kind(reference, row), node_kind(reference, column)), []).append((row, column))
    lines = []
    for (target, source), entries in sorted(groups.items()):
        rows, columns = torch.tensor(entries).T
        gap = (ours[rows, columns] - expected[rows, columns]).abs()
        row, column = entries[int(gap.argmax())]
        lines.append(
            f"{target} <- {source}: {len(entries)} entries, max |diff| {gap.max():.3g}; e.g. [{row}, {column}]"
            f" ours {ours[row, column]:.6g}, circuit-tracer {expected[row, column]:.6g}"
        )
    return "\n".join(lines)


@pytest.mark.parametrize("tc, setting", CASES)
def test_attribute_equals_circuit_tracer(built, references, tc, setting):
    from hooked import graphs

    checkpoints, folders, tokens = built
    checkpoint = checkpoints[TRANSCODERS[tc][0]]
    reference, settings = references[(tc, setting)], dict(with_targets(SETTINGS[setting], checkpoint))
    if "attribution_targets" in settings:
        settings["attribution_targets"] = as_targets(settings["attribution_targets"])
    model = hooked.load(checkpoint)
    transcoders = hooked.sae.load(folders[tc], model=model)
    graph = graphs.attribute(model, torch.tensor(tokens), transcoders, **settings)

    assert graph.input_tokens.tolist() == tokens and graph.input_string == reference.input_string
    assert (graph.n_layers, graph.vocab_size) == (reference.n_layers, reference.vocab_size)
    assert torch.equal(graph.active_features.cpu(), reference.active_features)
    assert close(graph.activation_values.cpu(), reference.activation_values).all()
    assert torch.equal(graph.selected_features.cpu(), reference.selected_features)
    assert [tuple(target) for target in graph.logit_targets] == reference.logit_targets
    # circuit-tracer's names for two fields (its graph's logit_token_ids and adjacency_matrix are the reference's)
    assert graph.logit_token_ids.tolist() == [vocab for _, vocab in reference.logit_targets]
    assert graph.adjacency_matrix is graph.adjacency
    assert close(graph.logit_probabilities.cpu().float(), reference.logit_probabilities).all()
    adjacency = graph.adjacency.to_dense() if graph.adjacency.is_sparse else graph.adjacency
    adjacency = adjacency.cpu().float()
    assert adjacency.shape == reference.adjacency.shape
    assert close(adjacency, reference.adjacency).all(), differences(adjacency, reference)
