"""hooked.graphs.attribute against the local replacement model written out and differentiated by torch autograd, on
every family: the reference shares no code with hooked/graphs.

The reference runs the model once with hooks that (a) detach every attention pattern and every norm's scale, (b) at
each layer's output point put, in place of the MLP's output, skip(x_l) + sum_f s_f a_f W_dec[f] + s_err[l, p] e_l[p]
+ b_dec (a_f the active features' activations on the prompt, constants; e_l the real output minus that
reconstruction; position 0's features and error a constant, as circuit-tracer 0.5.0 zeroes them), and (c) multiply
the embedding at hook_embed by s_tok[p]. Every s is a leaf tensor of ones, so at s = 1 the run is the model's own
forward, and every adjacency entry is a derivative: d target / d s_source, a logit target being the final norm's
output at the last position along W_U[t] - mean(W_U), a feature target W_enc[:, f] . x_l[p].
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

import hooked.sae
from hooked import graphs
from hooked.sae import CLTConfig, CrossLayerTranscoder
from hooked.testing import random_model
from tests.sae.dictionaries import explicit_acts, random_dictionary

DTYPE = torch.float64  # the reference runs in float64; the graph's adjacency is float32 (circuit-tracer's)
TOKENS = torch.tensor([3, 17, 42, 8, 25, 11, 60])


# ----------------------------------------------------------------------------- models and transcoders
def tiny(architecture: str, seed: int = 1):
    """A 2-layer random model of `architecture` in float64 (every layer of an MoE family sparse)."""
    return random_model(architecture, seed=seed).to(DTYPE)


def transcoder_set(model, *, skip: bool, seed: int = 0, d_sae: int = 24, architecture: str = "jumprelu"):
    """One random transcoder per layer, reading blocks.l.mlp.hook_in and writing blocks.l.hook_mlp_out."""
    return [
        random_dictionary(
            model.cfg.d_model,
            f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            d_sae=d_sae,
            architecture=architecture,
            skip=skip,
            seed=seed + layer,
            dtype=DTYPE,
        )
        for layer in range(model.cfg.n_layers)
    ]


def random_clt(model, *, skip: bool, seed: int = 0, d_sae: int = 16) -> CrossLayerTranscoder:
    cfg = CLTConfig(n_layers=model.cfg.n_layers, d_in=model.cfg.d_model, d_sae=d_sae, dtype="float64")
    clt = CrossLayerTranscoder(cfg, skip=skip)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in clt.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=DTYPE)
            if name.endswith("b_enc"):
                parameter.copy_(0.1 * noise - 0.2)
            elif name.endswith("threshold"):
                parameter.copy_(0.05 * noise.abs())
            else:
                parameter.copy_(0.3 * noise)
    return clt


# ----------------------------------------------------------------------------- the transcoders' arithmetic, explicit
@dataclass
class Layer:
    """Layer l of a transcoder set or CLT, from its weights: where it reads and writes, its features of an input,
    its encoder, its decoders to each output layer m >= l, its decoder bias and skip matrix (applied as x @ skip)."""

    read: str
    write: str
    features: Callable[[Tensor], Tensor]  # x [pos, d_in] -> activations [pos, d_sae]
    W_enc: Tensor  # [d_in, d_sae]
    decoders: dict[int, Tensor]  # output layer m -> [d_sae, d_out]
    b_dec: Tensor
    skip: Tensor | None  # [d_in, d_out]


def explicit_layers(transcoders) -> list[Layer]:
    if isinstance(transcoders, CrossLayerTranscoder):
        cfg = transcoders.cfg
        return [
            Layer(
                cfg.hook_names()[layer],
                cfg.hook_names_out()[layer],
                # circuit-tracer 0.5.0's JumpReLU, pre * (pre > threshold)
                lambda x, m=module: (x @ m.W_enc + m.b_enc) * ((x @ m.W_enc + m.b_enc) > m.threshold),
                module.W_enc,
                {layer + k: module.W_dec[:, k] for k in range(cfg.n_layers - layer)},
                module.b_dec,
                module.W_skip,
            )
            for layer, module in enumerate(transcoders.layers)
        ]
    return [
        Layer(
            d.cfg.hook_name,
            d.cfg.hook_name_out,
            lambda x, d=d: explicit_acts(d, x),
            d.W_enc,
            {layer: d.W_dec},
            d.b_dec,
            None if d.W_skip is None else d.W_skip.T,
        )
        for layer, d in enumerate(transcoders)
    ]


# ----------------------------------------------------------------------------- the reference
@dataclass
class Reference:
    """The replacement model's nodes and its adjacency over every active feature, as derivatives (NaN rows: the
    feature rows not asked for)."""

    active: Tensor  # [n_active, 3] (layer, position, feature), sorted
    values: Tensor  # [n_active]
    logit_ids: Tensor  # [n_logits], by falling probability
    adjacency: Tensor  # [N, N] in the model's dtype, circuit-tracer's node order
    model_logits: Tensor  # [pos, d_vocab]: the model's own
    run: Callable  # (s_feat, s_err, s_tok) -> (replacement logits [pos, d_vocab], feature targets, logit targets)


def reference(
    model,
    tokens: Tensor,
    transcoders,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    feature_rows: list[int] | None = None,
    logit_ids: list[int] | None = None,
    logit_directions: Tensor | None = None,
) -> Reference:
    """The reference on `tokens` [pos] (no special token added); `feature_rows`: the active features (indices)
    whose rows to compute (None: all; the other feature rows are NaN). The logit targets: the most probable tokens
    by `max_n_logits` and `desired_logit_prob`, or the tokens `logit_ids`, or the directions `logit_directions`
    [n, d_model] (numbered d_vocab + i, as circuit-tracer numbers custom targets)."""
    layers = explicit_layers(transcoders)
    dtype = model.dtype
    n_layers, n_pos = len(layers), tokens.shape[0]
    frozen = [name for name in model.hook_dict if name.endswith(("attn.hook_pattern", "hook_scale"))]
    with torch.no_grad():
        model_logits, cache = model.run_with_cache(
            tokens[None], names_filter=[*frozen, *(name for layer in layers for name in (layer.read, layer.write))]
        )
        x = [cache[layer.read][0] for layer in layers]
        y = [cache[layer.write][0] for layer in layers]
        acts = [layer.features(x[index]) for index, layer in enumerate(layers)]
    for a in acts:
        a[0] = 0  # position 0 (BOS) has no features
    active = torch.cat(
        [
            torch.stack([torch.full_like(p, index), p, f], 1)
            for index, a in enumerate(acts)
            for p, f in [a.nonzero(as_tuple=True)]
        ]
    )
    values = torch.stack([acts[layer][pos, feature] for layer, pos, feature in active.tolist()])
    n_active = active.shape[0]

    probabilities = torch.softmax(model_logits[0, -1], -1)
    w_u = model.unembed_weight.detach()
    if logit_directions is not None:
        directions = logit_directions.to(dtype)
        logit_ids = torch.arange(w_u.shape[0], w_u.shape[0] + directions.shape[0])
    else:
        if logit_ids is None:
            order = probabilities.argsort(descending=True)
            reached = (probabilities[order].cumsum(0) >= desired_logit_prob).nonzero()
            n_logits = min(max_n_logits, int(reached[0]) + 1 if reached.numel() else probabilities.shape[0])
            logit_ids = order[:n_logits]
        logit_ids = torch.as_tensor(logit_ids)
        directions = w_u[logit_ids] - w_u.mean(0)
    n_logits = logit_ids.shape[0]

    def writes(m: int, scale: Tensor) -> Tensor:
        """What the features write to output layer m, feature i scaled by scale[i]: [pos, d_out]."""
        out = torch.zeros_like(y[m])
        for i, (layer, pos, feature) in enumerate(active.tolist()):
            if m in layers[layer].decoders:
                out[pos] += scale[i] * values[i] * layers[layer].decoders[m][feature]
        return out

    def skip(m: int, x_m: Tensor) -> Tensor:
        return 0 if layers[m].skip is None else x_m @ layers[m].skip

    with torch.no_grad():
        errors = [
            y[m] - writes(m, torch.ones(n_active, dtype=dtype)) - layers[m].b_dec - skip(m, x[m])
            for m in range(n_layers)
        ]

    def run(s_feat: Tensor, s_err: Tensor, s_tok: Tensor):
        live: dict[str, Tensor] = {}
        scale_err = torch.cat([torch.ones(n_layers, 1, dtype=dtype), s_err[:, 1:]], 1)  # position 0's is constant

        def freeze(activation, hook):  # the value on the prompt, whatever the sources
            return cache[hook.name]

        def embed(activation, hook):
            return activation * s_tok[None, :, None]

        def read(activation, hook):
            live[hook.name] = activation[0]

        def write(activation, hook):
            m = next(index for index, layer in enumerate(layers) if layer.write == hook.name)
            out = (
                writes(m, s_feat) + scale_err[m][:, None] * errors[m] + layers[m].b_dec + skip(m, live[layers[m].read])
            )
            return out[None]

        hooks = [("hook_embed", embed), *((name, freeze) for name in frozen)]
        hooks += [(layer.read, read) for layer in layers] + [(layer.write, write) for layer in layers]
        final = {}
        handle = model.ln_final.register_forward_hook(lambda module, args, output: final.setdefault("out", output))
        try:
            with model.hooks(fwd_hooks=hooks):
                logits = model(tokens[None])[0]
        finally:
            handle.remove()
        features = (
            torch.stack(
                [
                    live[layers[layer].read][pos] @ layers[layer].W_enc[:, feature]
                    for layer, pos, feature in active.tolist()
                ]
            )
            if n_active
            else torch.zeros(0, dtype=dtype)
        )
        return logits, features, directions @ final["out"][0, -1]

    leaves = [torch.ones(n, dtype=dtype, requires_grad=True) for n in (n_active, n_layers * n_pos, n_pos)]
    with torch.enable_grad():
        _, features, logit_values = run(leaves[0], leaves[1].view(n_layers, n_pos), leaves[2])
        targets = [*features, *logit_values]
        n_nodes = n_active + n_layers * n_pos + n_pos + n_logits
        adjacency = torch.zeros(n_nodes, n_nodes, dtype=dtype)
        adjacency[:n_active, :] = torch.nan if feature_rows is not None else 0
        rows = [*(range(n_active) if feature_rows is None else feature_rows), *range(n_nodes - n_logits, n_nodes)]
        for row in rows:
            target = targets[row if row < n_active else n_active + row - (n_nodes - n_logits)]
            grads = torch.autograd.grad(target, leaves, retain_graph=True, allow_unused=True)
            grads = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves, strict=True)]
            adjacency[row, : n_nodes - n_logits] = torch.cat(grads)
    return Reference(active, values.detach(), logit_ids, adjacency, model_logits[0], run)


def disagreements(graph, ref: Reference, rtol: float = 1e-5, atol: float = 1e-6) -> list[str]:
    """How `graph` differs from the reference (empty: it agrees) over the rows the reference computed, every active
    feature selected. An entry agrees within `rtol` of itself plus `atol` of the largest entry (the graph holds
    float32 contractions of the model's gradients). The active and selected features are integer indices, compared
    exactly: chosen from activations equal to rounding on both sides, none within rounding of its threshold here."""
    n_active = ref.active.shape[0]
    if not torch.equal(graph.active_features, ref.active):
        return [f"active features differ: {graph.active_features.shape[0]} vs the reference's {n_active}"]
    problems = []
    if not torch.equal(graph.selected_features, torch.arange(n_active)):
        problems.append("not every active feature is selected")
    if not torch.allclose(graph.activation_values.to(ref.values.dtype), ref.values, rtol=rtol, atol=atol):
        problems.append("activation values differ")
    ids = [target.vocab_idx for target in graph.logit_targets]
    if ids != ref.logit_ids.tolist():
        return [*problems, f"logit nodes {ids} vs the reference's {ref.logit_ids.tolist()}"]
    adjacency = graph.adjacency.to_dense() if graph.adjacency.is_sparse else graph.adjacency
    computed = ~ref.adjacency.isnan().any(1)
    expected, got = ref.adjacency[computed], adjacency.to(ref.adjacency.dtype)[computed]
    difference = (got - expected).abs()
    bad = difference > rtol * expected.abs() + atol * expected.abs().max()
    if bad.any():
        row, column = (int(i) for i in bad.nonzero()[0])
        row = int(computed.nonzero()[row])
        problems.append(
            f"{int(bad.sum())} adjacency entries differ, e.g. [{row}, {column}]: {float(adjacency[row, column])}"
            f" vs the reference's {float(ref.adjacency[row, column])} (largest difference {float(difference.max())})"
        )
    return problems


def transcoders_of(model, kind: str):
    """`kind`: "set" or "clt", "skip ..." with a skip path."""
    skip = kind.startswith("skip")
    return random_clt(model, skip=skip) if kind.endswith("clt") else transcoder_set(model, skip=skip)


def ones(ref: Reference, n_layers: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every source at its value: the multipliers (s_feat, s_err, s_tok) of the reference's `run`."""
    n_pos = ref.model_logits.shape[0]
    return (
        torch.ones(ref.active.shape[0], dtype=DTYPE),
        torch.ones(n_layers, n_pos, dtype=DTYPE),
        torch.ones(n_pos, dtype=DTYPE),
    )


# ----------------------------------------------------------------------------- the graph is the reference's
# Every family, every transcoder kind on Llama (grouped-query attention); the others spread over the families.
CASES = [
    *(("llama", kind) for kind in ("set", "skip set", "clt", "skip clt")),
    ("gpt2", "skip set"),  # learned positions
    ("gpt2", "clt"),
    ("qwen3_moe", "skip set"),  # a transcoder replacing the whole MoE block
    ("qwen3_moe", "clt"),
    ("mixtral", "skip set"),
    ("olmo2", "skip set"),  # post-norm: the block's norms come after attention and the MLP
    ("olmo2", "skip clt"),
    ("gemma2", "skip set"),  # pre- and post-norms, logit soft-capping
    ("gemma2", "clt"),
    ("gemma3", "skip set"),
    ("gpt_neox", "skip clt"),  # parallel attention and MLP
]


@pytest.mark.parametrize(("architecture", "kind"), CASES)
def test_every_entry_is_the_replacement_models_derivative(architecture, kind):
    model = tiny(architecture)
    transcoders = transcoders_of(model, kind)
    graph = graphs.attribute(model, TOKENS, transcoders)
    ref = reference(model, TOKENS, transcoders)
    assert ref.active.shape[0] > 20 and graph.n_logits > 1  # enough of both to mean something
    assert disagreements(graph, ref) == []


@pytest.mark.parametrize(("architecture", "kind"), [("llama", "skip set"), ("gemma2", "clt")])
def test_attribution_targets_rows_are_the_replacement_models_derivatives(architecture, kind):
    """Tokens asked for, and directions of one's own (a logit difference, a random direction), each a logit row
    the reference computes along that direction; their weights are the tokens' probabilities and the given ones."""
    model = tiny(architecture)
    transcoders = transcoders_of(model, kind)
    probabilities = torch.softmax(model(TOKENS[None])[0, -1].detach(), -1)
    least, middle = int(probabilities.argmin()), int(probabilities.argsort()[len(probabilities) // 2])
    ids = [least, middle, 5]  # not the salient ones, in an order of their own
    graph = graphs.attribute(model, TOKENS, transcoders, attribution_targets=torch.tensor(ids))
    assert disagreements(graph, reference(model, TOKENS, transcoders, logit_ids=ids)) == []
    torch.testing.assert_close(graph.logit_probabilities, probabilities[ids].float())

    w_u = model.unembed_weight.detach()
    directions = torch.stack([w_u[least] - w_u[middle], torch.randn(model.cfg.d_model, dtype=DTYPE)])
    custom = [graphs.CustomTarget("least - middle", 1.0, directions[0]), ("random", 0.25, directions[1])]
    graph = graphs.attribute(model, TOKENS, transcoders, attribution_targets=custom)
    assert disagreements(graph, reference(model, TOKENS, transcoders, logit_directions=directions)) == []
    d_vocab = model.cfg.d_vocab
    assert [tuple(t) for t in graph.logit_targets] == [("least - middle", d_vocab), ("random", d_vocab + 1)]
    assert graph.logit_probabilities.tolist() == [1.0, 0.25]  # exact: the weights given, copied


def test_attribution_targets_by_text_are_the_tokens_they_encode_to(ioi_graph_inputs):
    """On the bundled model (it has a tokenizer): the names as text give the graph the names' ids give, the rows of
    a logit difference are the difference of the two names' rows (each row is linear in its direction), and a
    custom target's node prints with its label."""
    model, transcoders, prompt = ioi_graph_inputs
    names = [" Mary", " John"]
    ids = [model.tokenizer.encode(name, add_special_tokens=False)[0] for name in names]
    by_text = graphs.attribute(model, prompt, transcoders, attribution_targets=names)
    by_id = graphs.attribute(model, prompt, transcoders, attribution_targets=ids)
    assert [tuple(t) for t in by_text.logit_targets] == [(model.tokenizer.decode([i]), i) for i in ids]
    # exact: the text encodes to the same ids, so the same attribution runs on the same input
    assert torch.equal(by_text.adjacency, by_id.adjacency)
    assert torch.equal(by_text.logit_probabilities, by_id.logit_probabilities)

    w_u = model.unembed_weight.detach()
    difference = graphs.CustomTarget("Mary - John", 1.0, w_u[ids[0]] - w_u[ids[1]])
    diff = graphs.attribute(model, prompt, transcoders, attribution_targets=[difference])
    rows = by_id.adjacency[by_id.logit_offset :, : by_id.logit_offset]
    expected = rows[0] - rows[1]
    got = diff.adjacency[diff.logit_offset, : diff.logit_offset]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))
    assert diff.node_label(diff.logit_offset) == "logit 'Mary - John' (weight 1.00)"
    p_mary = float(by_id.logit_probabilities[0])
    assert by_id.node_label(by_id.logit_offset) == f"logit {model.tokenizer.decode([ids[0]])!r} (p={p_mary:.2f})"


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
def test_moe_families_have_the_points_a_transcoder_replacing_the_block_reads_and_writes(architecture):
    """Every layer of the tiny MoE models is sparse (a router), and its transcoder reads the input of the whole MoE
    block and writes its output: the reference replaces that output, so the router never enters the graph, and the
    graph agrees with it (test above)."""
    model = tiny(architecture)
    for layer in range(model.cfg.n_layers):
        for point in ("mlp.hook_in", "mlp.hook_router_logits", "hook_mlp_out"):
            assert f"blocks.{layer}.{point}" in model.hook_dict


# ----------------------------------------------------------------------------- the replacement model's identities
@pytest.mark.parametrize(("architecture", "kind"), [("gemma2", "skip set"), ("llama", "skip clt"), ("gpt2", "set")])
def test_the_replacement_model_reproduces_the_logits_and_each_row_sums_to_its_targets_change(architecture, kind):
    """With every feature, error and token at its value (s = 1) the replacement model is the model; without the
    error nodes it is not. The frozen replacement model is affine in the sources, so a target's value with every
    source on minus with every source off is the sum of its row of the graph."""
    model = tiny(architecture)
    transcoders = transcoders_of(model, kind)
    ref = reference(model, TOKENS, transcoders, feature_rows=[])
    s_feat, s_err, s_tok = ones(ref, model.cfg.n_layers)
    with torch.no_grad():
        logits, features_on, logits_on = ref.run(s_feat, s_err, s_tok)
        # to rounding: a hook on the attention pattern takes the explicit attention path, whose softmax is float32
        assert torch.allclose(logits, ref.model_logits, rtol=0, atol=1e-5)
        without_errors, _, _ = ref.run(s_feat, torch.zeros_like(s_err), s_tok)
        assert (without_errors - ref.model_logits).abs().max() > 1e-2
        _, features_off, logits_off = ref.run(0 * s_feat, 0 * s_err, 0 * s_tok)

    graph = graphs.attribute(model, TOKENS, transcoders)
    sums = graph.adjacency.double().sum(1)
    change = torch.cat([features_on - features_off, logits_on - logits_off])
    got = torch.cat([sums[: graph.n_features], sums[graph.logit_offset :]])
    assert torch.allclose(got, change, rtol=1e-5, atol=1e-6 * change.abs().max())


def test_max_feature_nodes_keeps_the_full_graphs_rows_and_columns_of_the_features_it_selects():
    model = tiny("llama")
    transcoders = transcoder_set(model, skip=True)
    full = graphs.attribute(model, TOKENS, transcoders)
    k = full.n_features // 3
    small = graphs.attribute(model, TOKENS, transcoders, max_feature_nodes=k, batch_size=8, update_interval=1)
    # integer indices: the active features come from the same forward on the same input
    assert torch.equal(small.active_features, full.active_features)
    assert small.n_features == k and torch.equal(small.selected_features, small.selected_features.unique())
    keep = torch.cat([small.selected_features, torch.arange(full.n_features, full.n_nodes)])
    expected = full.adjacency[keep][:, keep]
    assert torch.allclose(small.adjacency, expected, rtol=1e-5, atol=1e-6 * expected.abs().max())


def test_edges_per_row_keeps_each_rows_largest_entries_of_the_reference():
    model = tiny("olmo2")
    transcoders = transcoder_set(model, skip=True)
    k = 6
    graph = graphs.attribute(model, TOKENS, transcoders, edges_per_row=k)
    ref = reference(model, TOKENS, transcoders)
    assert graph.adjacency.is_sparse
    assert disagreements(graph, ref, rtol=1e-5, atol=0) != []  # it dropped entries (0 where the reference is not)...
    kept = graph.adjacency.to_dense().double()
    on = kept != 0
    assert (on.sum(1) <= k).all()
    scale = ref.adjacency.abs().max()
    assert torch.allclose(kept[on], ref.adjacency[on], rtol=1e-5, atol=1e-6 * scale)  # ...and kept the rest exact
    smallest_kept = torch.where(on, ref.adjacency.abs(), torch.inf).min(1).values
    largest_dropped = torch.where(on, 0, ref.adjacency.abs()).max(1).values
    full = on.sum(1) == k
    assert (smallest_kept[full] >= largest_dropped[full] - 1e-6 * scale).all()


# ----------------------------------------------------------------------------- each convention matters
# the modules of hooked.graphs.attribute's steps, each after those it imports from
STEPS = ["targets", "settings", "prompts", "nodes", "replacement", "schedule", "assembly", "attribute"]


def mutant(monkeypatch, replacements: list[tuple[str, str, str]]):
    """hooked.graphs.attribute with one convention broken: each step's module (STEPS) run again from its source with
    the `replacements` (module, old, new) made, in sys.modules under its own name while the test runs, so the steps
    after it import the broken one."""
    for step, _, _ in replacements:
        assert step in STEPS, f"{step!r} is not one of the attribution steps {STEPS}"
    for step in STEPS:
        name = f"hooked.graphs.{step}"
        source = inspect.getsource(importlib.import_module(name))
        for where, old, new in replacements:
            if where == step:
                assert source.count(old) == 1, (
                    f"{old!r} is no longer in hooked/graphs/{step}.py once: update the mutant"
                )
                source = source.replace(old, new)
        module = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, module)
        exec(compile(source, name, "exec"), module.__dict__)
    return module.attribute


FROZEN = 'endswith(("attn.hook_q", "attn.hook_k", "hook_scale"))'
MUTANTS = {
    "patterns not frozen": [("replacement", FROZEN, 'endswith(("hook_scale",))')],
    "norm scales not frozen": [("replacement", FROZEN, 'endswith(("attn.hook_q", "attn.hook_k"))')],
    "error nodes dropped": [("nodes", "error[ZERO_POSITIONS] = 0", "error[:] = 0")],
    "skip path ignored": [
        ("replacement", "skip = tc.skip(layer, x) if tc.has_skip else x[..., :1] * 0", "skip = x[..., :1] * 0")
    ],
    "position 0 not zeroed": [("nodes", "ZERO_POSITIONS = slice(0, 1)", "ZERO_POSITIONS = slice(0, 0)")],
    "logit direction not centred": [("targets", "return w_u[ids] - w_u.mean(0)", "return w_u[ids]")],
    "feature targets scaled by their activation": [
        (
            "schedule",
            "nodes.encoder_vectors(chunk)",
            "nodes.encoder_vectors(chunk) * nodes.values[chunk][:, None]",
        )
    ],
}


@pytest.fixture(scope="module")
def gpt2_case():
    """GPT-2 (LayerNorm: its scales matter) with skip transcoders, and its reference."""
    model = tiny("gpt2")
    transcoders = transcoder_set(model, skip=True)
    return model, transcoders, reference(model, TOKENS, transcoders)


def test_the_unbroken_module_run_as_a_mutant_agrees(monkeypatch, gpt2_case):
    """The mutants' harness itself changes nothing: with no replacement the reference agrees."""
    model, transcoders, ref = gpt2_case
    assert disagreements(mutant(monkeypatch, [])(model, TOKENS, transcoders), ref) == []


@pytest.mark.parametrize("convention", MUTANTS)
def test_breaking_a_convention_makes_the_reference_disagree(monkeypatch, gpt2_case, convention):
    model, transcoders, ref = gpt2_case
    assert disagreements(mutant(monkeypatch, MUTANTS[convention])(model, TOKENS, transcoders), ref) != []


# ----------------------------------------------------------------------------- the bundled IOI model
@pytest.fixture(scope="module")
def ioi_graph_inputs():
    """hooked/ioi-gpt2, its bundled transcoders and an IOI prompt."""
    model = hooked.load("hooked/ioi-gpt2")
    transcoders = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders", model=model)
    return model, transcoders, "When Mary and John went to the store, John gave a drink to"


def test_the_bundled_ioi_graph_agrees_with_the_reference_on_sampled_rows(ioi_graph_inputs):
    """hooked/ioi-gpt2 (4 layers, d_model 128) with its bundled transcoders, in float32, on an IOI prompt: the logit
    rows and every 25th feature row (each layer's included)."""
    model, transcoders, prompt = ioi_graph_inputs
    graph = graphs.attribute(model, prompt, transcoders)
    tokenizer = model.tokenizer
    assert graph.input_tokens.tolist() == [tokenizer.bos_token_id, *tokenizer.encode(prompt, add_special_tokens=False)]
    n_active = graph.active_features.shape[0]
    rows = sorted(
        {*range(0, n_active, 25), *(int(i) for i in graph.active_features[:, 0].diff().nonzero()), n_active - 1}
    )
    ref = reference(model, graph.input_tokens, transcoders, feature_rows=rows)
    assert graph.logit_targets[0].token_str.strip() == "Mary"
    assert disagreements(graph, ref, rtol=1e-3, atol=1e-4) == []
