"""hooked.sae.TranscoderSet and CrossLayerTranscoder answer the per-layer questions of hooked/sae/transcoders.py
(what an attribution graph asks) the same way: each answer against the weights read directly, and what the set
refuses when it is made. `check_fits` against a model: the splice's refusals, also for a set."""

from __future__ import annotations

import pytest
import torch

from hooked.sae import CLTConfig, CrossLayerTranscoder, TranscoderSet, check_fits
from hooked.testing import random_model
from tests.sae.dictionaries import random_dictionary

D_MODEL, D_SAE, N_LAYERS = 32, 16, 2  # hooked.testing's random gpt2: d_model 32, 2 layers
FEATURES = torch.tensor([3, 0, 11])


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2")


def transcoders(*, skip: bool = False, n_layers: int = N_LAYERS, **points) -> list:
    return [
        random_dictionary(
            D_MODEL,
            points.get("hook_name", "blocks.{layer}.mlp.hook_in").format(layer=layer),
            hook_name_out=points.get("hook_name_out", "blocks.{layer}.hook_mlp_out").format(layer=layer),
            d_sae=D_SAE,
            architecture="jumprelu",
            skip=skip,
            seed=layer,
        )
        for layer in range(n_layers)
    ]


def clt(*, skip: bool = False) -> CrossLayerTranscoder:
    clt = CrossLayerTranscoder(CLTConfig(n_layers=N_LAYERS, d_in=D_MODEL, d_sae=D_SAE), skip=skip)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in clt.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return clt


def test_a_set_answers_from_each_layers_weights():
    dictionaries = transcoders(skip=True)
    tc = TranscoderSet(dictionaries)
    x = torch.randn(5, D_MODEL, generator=torch.Generator().manual_seed(1))
    assert (tc.n_layers, tc.d_in, tc.d_sae, tc.d_out, tc.has_skip) == (N_LAYERS, D_MODEL, D_SAE, D_MODEL, True)
    assert tc.hook_names() == ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"]
    assert tc.hook_names_out() == ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
    assert (tc.feature_input_hook, tc.feature_output_hook) == (
        "blocks.{layer}.mlp.hook_in",
        "blocks.{layer}.hook_mlp_out",
    )
    for layer, d in enumerate(dictionaries):
        # the same products in the same order as the dictionary's own: exact
        pre = x @ d.W_enc + d.b_enc
        assert torch.equal(tc.pre_activations(layer, x), pre)
        assert torch.equal(tc.activate(layer, pre), torch.relu(pre) * (pre > d.threshold))
        assert torch.equal(tc.encoder_vectors(layer, FEATURES), torch.stack([d.W_enc[:, f] for f in FEATURES]))
        assert list(tc.source_layers(layer)) == [layer]
        assert torch.equal(tc.decoder_rows(layer, FEATURES, layer), torch.stack([d.W_dec[f] for f in FEATURES]))
        assert torch.equal(tc.decoder_bias(layer), d.b_dec)
        torch.testing.assert_close(tc.skip(layer, x), x @ d.W_skip.T)
    with pytest.raises(ValueError, match="of layer 0 writes to layer 0, not 1"):
        tc.decoder_rows(0, FEATURES, 1)
    assert list(tc) == dictionaries and tc[1] is dictionaries[1] and len(tc) == N_LAYERS
    assert len(list(tc.parameters())) == sum(len(list(d.parameters())) for d in dictionaries)


def test_a_clt_answers_the_same_questions_from_its_layers():
    c = clt()
    x = torch.randn(5, D_MODEL, generator=torch.Generator().manual_seed(1))
    assert (c.n_layers, c.d_in, c.d_sae, c.d_out, c.has_skip) == (N_LAYERS, D_MODEL, D_SAE, D_MODEL, False)
    assert c.hook_names() == ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"]
    assert (c.feature_input_hook, c.feature_output_hook) == (
        "blocks.{layer}.mlp.hook_in",
        "blocks.{layer}.hook_mlp_out",
    )
    for layer, module in enumerate(c.layers):
        pre = x @ module.W_enc + module.b_enc
        assert torch.equal(c.pre_activations(layer, x), pre)
        assert torch.equal(c.encoder_vectors(layer, FEATURES), torch.stack([module.W_enc[:, f] for f in FEATURES]))
        assert list(c.source_layers(layer)) == list(range(layer + 1))  # every layer up to it writes to it
        for out_layer in range(layer, N_LAYERS):
            expected = torch.stack([module.W_dec[f, out_layer - layer] for f in FEATURES])
            assert torch.equal(c.decoder_rows(layer, FEATURES, out_layer), expected)
        assert torch.equal(c.decoder_bias(layer), module.b_dec)
    with pytest.raises(ValueError, match="layer 1's features write to layers 1..1, not 0"):
        c.decoder_rows(1, FEATURES, 0)


@pytest.mark.unchecked  # the annotations would refuse the wrong types first, without naming the fix
@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: transcoders()[0], TypeError, "one transcoder per layer.*not one dictionary"),
        (lambda: [], TypeError, "not list"),
        (lambda: transcoders()[::-1], ValueError, r"layer 0 reads 'blocks.1.mlp.hook_in'.*layer order"),
        (
            lambda: [*transcoders(n_layers=1), random_dictionary(D_MODEL, "blocks.1.hook_resid_post", d_sae=D_SAE)],
            ValueError,
            r"transcoders\[1\] is an SAE on blocks.1.hook_resid_post",
        ),
        (lambda: [transcoders()[0], transcoders(skip=True)[1]], ValueError, "a set is all or none"),
        (
            lambda: [transcoders()[0], *transcoders(hook_name="blocks.{layer}.hook_resid_mid")[1:]],
            ValueError,
            "different points in different layers",
        ),
    ],
    ids=["one dictionary", "empty", "out of order", "an SAE", "skip in some", "points differ"],
)
def test_a_set_is_refused_when_made(make, error, message):
    with pytest.raises(error, match=message):
        TranscoderSet(make())


def test_check_fits_returns_the_points_and_refuses_another_depth(model):
    assert check_fits(model, TranscoderSet(transcoders())) == (
        ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"],
        ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"],
    )
    assert check_fits(model, transcoders()[1]) == (["blocks.1.mlp.hook_in"], ["blocks.1.hook_mlp_out"])
    with pytest.raises(ValueError, match="transcoder set has 1 layers and the model 2"):
        check_fits(model, TranscoderSet(transcoders(n_layers=1)))
    wide = [
        random_dictionary(D_MODEL + 1, f"blocks.{i}.mlp.hook_in", hook_name_out=f"blocks.{i}.hook_mlp_out")
        for i in range(2)
    ]
    with pytest.raises(ValueError, match="cfg.d_in is 33, but blocks.0.mlp.hook_in of this model is 32 wide"):
        check_fits(model, TranscoderSet(wide))


def test_a_spliced_set_splices_each_transcoder(model):
    dictionaries = transcoders()
    tokens = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        expected = model.run_with_saes(tokens, saes=dictionaries)
        assert torch.equal(model.run_with_saes(tokens, saes=TranscoderSet(dictionaries)), expected)
        assert not torch.equal(expected, model(tokens))  # the transcoders were in the forward
