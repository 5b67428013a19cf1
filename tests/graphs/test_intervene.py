"""graphs.intervene (hooked/graphs/intervene.py): features set on a tiny model against hooks written by hand from the
weights (no splice), a feature set to its own activation changing nothing, freeze="all" moving the logits by the
attribution graph's direct effects, and bad input refused with nothing left attached."""

from __future__ import annotations

import pytest
import torch

from hooked import graphs
from hooked.sae import CLTConfig, CrossLayerTranscoder
from hooked.testing import random_model
from tests.sae.dictionaries import random_dictionary, spliced_names

N_LAYERS, D_MODEL, D_SAE = 2, 32, 48
TOKENS = [5, 17, 3, 40, 22, 9, 61, 30]


def _model():
    return random_model("gpt2", seed=0, n_layers=N_LAYERS, d_model=D_MODEL)


def _transcoders(kind: str):
    if kind == "set":
        return [
            random_dictionary(
                D_MODEL,
                f"blocks.{layer}.mlp.hook_in",
                hook_name_out=f"blocks.{layer}.hook_mlp_out",
                d_sae=D_SAE,
                architecture="jumprelu",
                skip=True,
                seed=layer,
            )
            for layer in range(N_LAYERS)
        ]
    clt = CrossLayerTranscoder(CLTConfig(n_layers=N_LAYERS, d_in=D_MODEL, d_sae=D_SAE, architecture="jumprelu"))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in clt.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(
                0.05 * noise.abs() if name.endswith("threshold") else 0.3 * noise - 0.1 * (name[-5:] == "b_enc")
            )
    return clt


# ----------------------------------------------------------------------------- the arithmetic, written out
def _acts(tc, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Layer `layer`'s features of its input x, from the weights (JumpReLU: pre where pre > threshold, relu'd)."""
    module = tc.layers[layer] if isinstance(tc, CrossLayerTranscoder) else tc[layer]
    pre = x @ module.W_enc + module.b_enc
    return torch.where(pre > module.threshold, torch.relu(pre), torch.zeros_like(pre))


def _writes(tc, layer: int, feature: int, out: int) -> torch.Tensor | None:
    """What feature `feature` of layer `layer` writes to output layer `out` per unit of activation."""
    if isinstance(tc, CrossLayerTranscoder):
        return tc.layers[layer].W_dec[feature, out - layer] if out >= layer else None
    return tc[layer].W_dec[feature] if out == layer else None


def _skip(tc, layer: int, x: torch.Tensor) -> torch.Tensor:
    if isinstance(tc, CrossLayerTranscoder):
        return x @ tc.layers[layer].W_skip if tc.has_skip else torch.zeros_like(x)
    return x @ tc[layer].W_skip.T if tc[layer].W_skip is not None else torch.zeros_like(x)


def _by_hand(model, tokens, tc, edits, freeze):
    """(logits [pos d_vocab], features [n_layers pos d_sae]) with each (layer, position, feature, value) of `edits`
    set, by hooks on the model's own points: MLP output + (value - activation) * decoder row; frozen points written
    from a clean run_with_cache; freeze="all": the clean MLP output, the skip path's change, and the edits taken
    against the clean activations."""
    frozen = []
    if freeze != "none":
        frozen += [f"blocks.{layer}.attn.hook_pattern" for layer in range(N_LAYERS)]
    if freeze == "all":
        frozen += [name for name in model.hook_dict if name.endswith("hook_scale")]
    ins = [f"blocks.{layer}.mlp.hook_in" for layer in range(N_LAYERS)]
    outs = [f"blocks.{layer}.hook_mlp_out" for layer in range(N_LAYERS)]
    _, clean = model.run_with_cache(tokens[None], names_filter=[*frozen, *ins, *outs])
    x, acts = {}, {}

    def set_values(layer, a):
        a = a.clone()
        for edit_layer, position, feature, value in edits:
            if edit_layer == layer:
                a[slice(None) if position is None else position, feature] = value
        return a

    def read(activation, hook):
        layer = int(hook.name.split(".")[1])
        x[layer] = activation[0]
        acts[layer] = _acts(tc, layer, activation[0])

    def write(activation, hook):
        out = int(hook.name.split(".")[1])
        if freeze == "all":
            new = clean[hook.name][0] + _skip(tc, out, x[out]) - _skip(tc, out, clean[ins[out]][0])
        else:
            new = activation[0].clone()
        for layer, position, feature, value in edits:
            row = _writes(tc, layer, feature, out)
            if row is None:
                continue
            before = (_acts(tc, layer, clean[ins[layer]][0]) if freeze == "all" else acts[layer])[:, feature]
            delta = (value - before)[:, None] * row
            if position is None:
                new = new + delta
            else:
                new[position] += delta[position]
        return new[None]

    hooks = [(name, lambda a, hook: clean[hook.name]) for name in frozen]
    hooks += [(name, read) for name in ins] + [(name, write) for name in outs]
    with torch.no_grad():
        logits = model.run_with_hooks(tokens[None], fwd_hooks=hooks)[0]
    return logits, torch.stack([set_values(layer, acts[layer]) for layer in range(N_LAYERS)])


@pytest.mark.parametrize("kind", ["set", "clt"])
@pytest.mark.parametrize("freeze", ["none", "attention", "all"])
def test_intervene_equals_hooks_written_by_hand(kind, freeze):
    model, tc, tokens = _model(), _transcoders(kind), torch.tensor(TOKENS)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("mlp.hook_in"))
    first = _acts(tc, 0, cache["blocks.0.mlp.hook_in"][0])
    firing = first[3].nonzero().flatten()
    assert len(firing) >= 2 and 0.05 < (first > 0).float().mean() < 0.6  # some features fire, most do not
    # one ablated, one steered up, one held at every position (an address without @pos), one of the last layer
    quiet = int((first[:, :] == 0).all(0).nonzero()[0])
    interventions = {
        (0, 3, int(firing[0])): 0.0,
        (0, -2, int(firing[1])): 3.0,
        f"L0.mlp_out.F{quiet}": 1.5,
        f"L1.mlp_out.F7@{len(TOKENS) - 1}": 2.0,
    }
    result = graphs.intervene(model, tokens, tc, interventions, freeze=freeze)
    edits = [(0, 3, int(firing[0]), 0.0), (0, 6, int(firing[1]), 3.0), (0, None, quiet, 1.5), (1, 7, 7, 2.0)]
    assert result.interventions == edits and result.freeze == freeze
    logits, features = _by_hand(model, tokens, tc, edits, freeze)
    torch.testing.assert_close(result.logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.activations, features, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(result.clean_logits, model(tokens[None])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.clean_activations, _by_hand(model, tokens, tc, [], "none")[1])
    assert (result.logits - result.clean_logits).abs().max() > 1e-2  # the edits did something
    assert spliced_names(model) == []


@pytest.mark.parametrize("freeze", ["none", "attention", "all"])
def test_a_feature_set_to_its_own_activation_changes_nothing(freeze):
    model, tc, tokens = _model(), _transcoders("set"), torch.tensor(TOKENS)
    # The value comes from a clean run under the same `freeze`: a frozen pattern is a hooked pattern, so attention
    # takes the eager path, whose features differ from the SDPA path's in the last bits (on some CPUs' kernels).
    clean = graphs.intervene(model, tokens, tc, {(0, 1, 0): 0.0}, freeze=freeze).clean_activations
    layer, position, feature = (clean > 0).nonzero()[-1].tolist()
    value = float(clean[layer, position, feature])
    result = graphs.intervene(model, tokens, tc, {f"L{layer}.mlp_out.F{feature}@{position}": value}, freeze=freeze)
    if freeze == "all":  # a norm whose scale a hook wrote computes its output step by step: equal to rounding
        torch.testing.assert_close(result.logits, result.clean_logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(result.activations, result.clean_activations, rtol=0, atol=1e-5)
    else:  # exact: both runs take the same kernels in the same order, and the value written is the one computed
        assert torch.equal(result.logits, result.clean_logits)
        assert torch.equal(result.activations, result.clean_activations)


@pytest.mark.parametrize("kind", ["set", "clt"])
def test_freeze_all_moves_logits_and_features_by_the_graphs_direct_effects(kind):
    """Ablating feature node s with everything but direct paths frozen moves logit node t (minus the mean logit)
    by -adjacency[t, s], and a later feature that stays active by -adjacency[feature, s]."""
    model, tc, tokens = _model(), _transcoders(kind), torch.tensor(TOKENS)
    graph = graphs.attribute(model, tokens, tc, max_n_logits=3, desired_logit_prob=0.99)
    layers = graph.active_features[graph.selected_features, 0]
    checked = 0
    for node in torch.nonzero(layers == 0).flatten()[:4].tolist():
        layer, position, feature = graph.active_features[graph.selected_features[node]].tolist()
        result = graphs.intervene(model, tokens, tc, {(layer, position, feature): 0.0}, freeze="all")
        centred = lambda logits: logits[-1] - logits[-1].mean()  # noqa: E731
        change = centred(result.logits) - centred(result.clean_logits)
        for k, target in enumerate(graph.logit_targets):
            expected = -graph.adjacency[graph.logit_offset + k, node]
            torch.testing.assert_close(change[target.vocab_idx], expected, atol=1e-4, rtol=1e-4)
        for other in torch.nonzero(layers == 1).flatten().tolist():
            l2, p2, f2 = graph.active_features[graph.selected_features[other]].tolist()
            after = result.activations[l2, p2, f2]
            if after > 0:  # still active: its activation is its pre-activation
                expected = result.clean_activations[l2, p2, f2] - graph.adjacency[other, node]
                torch.testing.assert_close(after, expected, atol=1e-4, rtol=1e-4)
                checked += 1
    assert checked > 3


@pytest.mark.unchecked
@pytest.mark.parametrize(
    "interventions, freeze, error, message",
    [
        ({(0, 1, 2): 0.0}, "patterns", ValueError, r"freeze must be one of 'none', 'attention', 'all'"),
        ({}, "none", TypeError, r"interventions maps each feature"),
        ({(0, 1): 0.0}, "none", TypeError, r"three ints, or an address"),
        ({(2, 1, 2): 0.0}, "none", IndexError, r"layer 2 is out of range \(0..1\)"),
        ({(0, 1, 48): 0.0}, "none", IndexError, r"feature 48 is out of range \(0..47\)"),
        ({(0, 8, 2): 0.0}, "none", IndexError, r"position 8 is outside the prompt's 8 tokens"),
        ({(0, 1, 2): float("nan")}, "none", ValueError, r"a finite number"),
        ({"L0H1": 0.0}, "none", ValueError, r"'L0H1' is not a feature of these transcoders"),
        ({"L0.mlp_out.F48@1": 0.0}, "none", IndexError, r"48"),
        ({(0, 1, 2): 0.0, (0, -7, 2): 1.0}, "none", ValueError, r"set the same feature"),
    ],
)
def test_bad_input_is_refused_with_nothing_left_attached(interventions, freeze, error, message):
    model, tc = _model(), _transcoders("set")
    with pytest.raises(error, match=message):
        graphs.intervene(model, TOKENS, tc, interventions, freeze=freeze)
    assert spliced_names(model) == [] and not any(point.listening for point in model.hook_dict.values())


@pytest.mark.unchecked
def test_a_model_with_hooks_registered_is_refused():
    model, tc = _model(), _transcoders("set")
    model.add_hook("blocks.0.hook_resid_post", lambda a, hook: a)
    with pytest.raises(RuntimeError, match=r"hooks are registered at \['blocks.0.hook_resid_post'\]"):
        graphs.intervene(model, TOKENS, tc, {(0, 1, 2): 0.0})
    with pytest.raises(ValueError, match=r"transcoder set has 1 layers and the model 2"):
        model.reset_hooks()
        graphs.intervene(model, TOKENS, tc[:1], {(0, 1, 2): 0.0})
