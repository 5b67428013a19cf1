"""The analyses that run their own forwards run the model in eval mode and give back the mode they found, also when
they raise: one context manager, `hooked.hooks.evaluating`, used by all four (docs/analysis.md)."""

from __future__ import annotations

import importlib

import pytest
import torch

import hooked
from hooked import circuits, graphs, patch
from hooked.hooks import evaluating
from hooked.testing import random_model
from tests.sae.dictionaries import random_dictionary

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
graphs_attribute = importlib.import_module("hooked.graphs.attribute")  # hooked.graphs.attribute is the function


class Broken(Exception):
    pass


def test_evaluating_restores_either_mode_also_when_the_block_raises():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    for mode in (True, False):
        model.train(mode)
        with evaluating(model) as inside:
            assert inside is model and not model.training and not model[1].training
        assert model.training is mode and model[1].training is mode
        with pytest.raises(Broken), evaluating(model):
            assert not model.training
            raise Broken
        assert model.training is mode and model[1].training is mode


def test_evaluating_gives_each_module_its_own_mode_back():
    """A model in eval mode with one submodule left training (a dropout a user switched on) gets exactly that back."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.Dropout(0.5)).eval()
    model[1].train()
    with evaluating(model):
        assert not any(module.training for module in model.modules())
    assert [module.training for module in model.modules()] == [False, False, True, False]


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=3, n_layers=2, d_model=32)


@pytest.fixture(scope="module")
def prompts(model):
    generator = torch.Generator().manual_seed(4)
    return tuple(torch.randint(0, model.cfg.d_vocab, (2, 5), generator=generator) for _ in range(2))


def logit_diff(seen: list[bool], model, fail: bool):
    """The logit difference of tokens 3 and 4 at the last position; it notes the model's mode at each call and,
    with `fail`, raises at the first call made in eval mode (inside the analysis' own forwards)."""

    def metric(logits, **kwargs):
        seen.append(model.training)
        if fail and not model.training:
            raise Broken("the metric failed")
        return logits[:, -1, 3] - logits[:, -1, 4]

    return metric


def run_patch(model, clean, corrupt, metric):
    _, clean_cache = model.run_with_cache(clean)
    return patch.attribution(model, corrupt, clean_cache, metric)


def run_circuits(model, clean, corrupt, metric):
    return circuits.attribute(model, clean, corrupt, metric)


def run_saes(model, clean, corrupt, metric):
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", d_sae=8)
    return hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae])


@pytest.mark.parametrize("run", [run_patch, run_circuits, run_saes])
@pytest.mark.parametrize("fail", [False, True])
def test_metric_analyses_run_in_eval_mode_and_give_the_mode_back(model, prompts, run, fail):
    seen: list[bool] = []
    model.train()
    try:
        metric = logit_diff(seen, model, fail)
        if fail:
            with pytest.raises(Broken, match="the metric failed"):
                run(model, *prompts, metric)
        else:
            run(model, *prompts, metric)
        assert False in seen  # the analysis' own forward ran in eval mode
        assert model.training and all(block.training for block in model.blocks)
    finally:
        model.eval()


@pytest.mark.parametrize("fail", [False, True])
def test_graphs_run_in_eval_mode_and_give_the_mode_back(model, monkeypatch, fail):
    transcoders = [
        random_dictionary(
            model.cfg.d_model,
            f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            d_sae=8,
            architecture="jumprelu",
            seed=layer,
        )
        for layer in range(model.cfg.n_layers)
    ]
    seen: list[bool] = []
    real_rows = graphs_attribute.attribute_rows

    def attribute_rows(*args, **kwargs):
        seen.append(model.training)
        if fail:
            raise Broken("the attribution failed")
        return real_rows(*args, **kwargs)

    monkeypatch.setattr(graphs_attribute, "attribute_rows", attribute_rows)
    model.train()
    try:
        if fail:
            with pytest.raises(Broken, match="the attribution failed"):
                graphs.attribute(model, torch.tensor([3, 17, 42, 8]), transcoders, max_n_logits=2)
        else:
            graphs.attribute(model, torch.tensor([3, 17, 42, 8]), transcoders, max_n_logits=2)
        assert seen == [False]
        assert model.training and all(block.training for block in model.blocks)
        assert all(p.requires_grad for p in model.parameters())  # the parameters graphs freeze, given back too
    finally:
        model.eval()
