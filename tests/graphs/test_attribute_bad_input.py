"""hooked.graphs.attribute refuses bad input before anything runs, naming the problem and the fix, and leaves
nothing attached: no hook on the model, every parameter's requires_grad and the model's mode as they were."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch

from hooked import graphs
from hooked.sae import CLTConfig, CrossLayerTranscoder
from hooked.testing import random_model
from tests.sae.dictionaries import random_dictionary

attribute_module = importlib.import_module("hooked.graphs.attribute")  # hooked.graphs.attribute is the function
TOKENS = torch.tensor([3, 17, 42, 8, 25])


def transcoders(model, n_layers: int | None = None, d_in: int | None = None, **kw):
    n_layers = model.cfg.n_layers if n_layers is None else n_layers
    d_in = model.cfg.d_model if d_in is None else d_in
    points = {"hook_name_out": "blocks.{layer}.hook_mlp_out", **kw.pop("points", {})}
    return [
        random_dictionary(
            d_in,
            kw.get("hook_name", "blocks.{layer}.mlp.hook_in").format(layer=layer),
            hook_name_out=points["hook_name_out"].format(layer=layer),
            d_sae=16,
            architecture=kw.get("architecture", "jumprelu"),
            seed=layer,
        )
        for layer in range(n_layers)
    ]


@pytest.fixture
def model():
    model = random_model("gpt2")  # n_ctx 32
    model.train()  # attribute evaluates in eval mode and must give the mode back
    yield model
    model.reset_hooks(including_permanent=True)


def refused(model, error: type[Exception], match: str, call: Callable[[], object], *, keep_hooks: bool = False):
    """`call` raises `error` matching `match`, and leaves the model's hooks (none, unless `keep_hooks`: the caller's
    own), its mode and every parameter's requires_grad as they were."""
    parameters = list(model.parameters())
    before = [p.requires_grad for p in parameters]
    hooks_before = {name for name, point in model.hook_dict.items() if point.listening}
    with pytest.raises(error, match=match):
        call()
    assert [p.requires_grad for p in parameters] == before
    assert model.training
    listening = {name for name, point in model.hook_dict.items() if point.listening}
    assert listening == (hooks_before if keep_hooks else set())


@pytest.mark.unchecked
def test_transcoders_for_a_wider_model(model):
    tc = transcoders(model, d_in=model.cfg.d_model + 8)
    refused(
        model,
        ValueError,
        r"cfg.d_in is 40, but blocks.0.mlp.hook_in of this model is 32 wide.*another model",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
@pytest.mark.parametrize("n_layers", [1, 3])
def test_transcoders_for_a_model_of_another_depth(model, n_layers):
    if n_layers > model.cfg.n_layers:  # a set's layer 2 names a block this model lacks: the depth is the problem
        tc = [*transcoders(model), *transcoders(random_model("gpt2", n_layers=3))[2:]]
    else:
        tc = transcoders(model, n_layers=n_layers)
    refused(
        model,
        ValueError,
        rf"has {n_layers} layers and the model 2.*load the transcoders trained for this model",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
def test_a_clt_for_another_model(model):
    deep = CrossLayerTranscoder(CLTConfig(n_layers=3, d_in=model.cfg.d_model, d_sae=8))
    refused(
        model,
        ValueError,
        r"cross-layer transcoder has 3 layers and the model 2",
        lambda: graphs.attribute(model, TOKENS, deep),
    )
    wide = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=model.cfg.d_model * 2, d_sae=8))
    refused(
        model,
        ValueError,
        r"cfg.d_in is 64, but blocks.0.mlp.hook_in of this model is 32 wide",
        lambda: graphs.attribute(model, TOKENS, wide),
    )


@pytest.mark.unchecked
def test_a_hook_pair_the_model_does_not_have(model):
    tc = transcoders(model, points={"hook_name_out": "blocks.{layer}.hook_mlp_output"})
    refused(
        model,
        KeyError,
        r"'blocks.0.hook_mlp_output' is not a hook point of this model.*hooked's name",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
def test_transcoders_out_of_layer_order(model):
    tc = transcoders(model)[::-1]
    refused(
        model,
        ValueError,
        r"layer 0 reads 'blocks.1.mlp.hook_in'.*layer order",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
def test_transcoders_of_another_dtype(model):
    tc = [d.to(torch.float64) for d in transcoders(model)]
    refused(
        model,
        ValueError,
        r"torch.float64 on cpu, the model torch.float32.*convert it first",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
def test_a_prompt_longer_than_the_context(model):
    long = torch.arange(model.cfg.n_ctx + 1) % model.cfg.d_vocab
    refused(
        model,
        ValueError,
        r"33 tokens.*longer than this model's context of 32; shorten it",
        lambda: graphs.attribute(model, long, transcoders(model)),
    )


@pytest.mark.unchecked
@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"max_n_logits": 0}, r"max_n_logits must be a positive integer"),
        ({"desired_logit_prob": 0}, r"desired_logit_prob must be in \(0, 1\]"),
        ({"desired_logit_prob": 1.5}, r"desired_logit_prob must be in \(0, 1\]"),
        ({"max_feature_nodes": -1}, r"max_feature_nodes must be None or an integer >= 0"),
        ({"batch_size": 0}, r"batch_size must be a positive integer"),
        ({"edges_per_row": 0}, r"edges_per_row must be None \(keep every edge\) or a positive integer"),
    ],
)
def test_settings_that_select_nothing(model, settings, match):
    refused(model, ValueError, match, lambda: graphs.attribute(model, TOKENS, transcoders(model), **settings))


VECTOR = torch.ones(32)  # the model's d_model
BAD_TARGETS = [
    ([], ValueError, r"attribution_targets is empty; leave it None"),
    (" Mary", TypeError, r"for the one token ' Mary', pass \[' Mary'\]"),
    (torch.tensor([[1, 2]]), TypeError, r"1-D token ids, not a torch.int64 tensor of shape \(1, 2\)"),
    (torch.tensor([0.5]), TypeError, r"1-D token ids, not a torch.float32 tensor"),
    ([1, 64], ValueError, r"target id 64 is outside this model's vocabulary \(0..63\)"),
    ([3, 5, 3], ValueError, r"names token 3 more than once"),
    ([3, " Mary"], TypeError, r"mixes id and str targets; give one kind"),
    ([3, ("diff", 1.0, VECTOR)], TypeError, r"mixes custom and id targets"),
    ([" Mary"], ValueError, r"' Mary' is text and this model has no tokenizer: give token ids"),
    ([("diff", 1.0)], TypeError, r"target 0 is tuple, not a CustomTarget\(label, weight, vector\)"),
    ([("diff", -1.0, VECTOR)], ValueError, r"target 0 \('diff'\) has weight -1.0: a finite number >= 0"),
    ([("diff", float("nan"), VECTOR)], ValueError, r"has weight nan"),
    ([(3, 1.0, VECTOR)], TypeError, r"target 0's label is int, not str"),
    ([("diff", 1.0, torch.ones(31))], ValueError, r"vector is a tensor of shape \(31,\), not a float tensor"),
    ([("diff", 1.0, torch.ones(32, dtype=torch.long))], ValueError, r"not a float tensor \[d_model=32\]"),
    ([("diff", 1.0, VECTOR * float("inf"))], ValueError, r"vector has non-finite entries"),
    ([("a", 0.0, VECTOR), ("b", 0, VECTOR)], ValueError, r"logit nodes asked for weigh 0 in all \(their weights\)"),
]


@pytest.mark.unchecked
@pytest.mark.parametrize(("targets", "error", "match"), BAD_TARGETS)
def test_attribution_targets_that_name_no_logit_node(model, targets, error, match):
    refused(
        model, error, match, lambda: graphs.attribute(model, TOKENS, transcoders(model), attribution_targets=targets)
    )
    refused(
        model,
        error,
        match,
        lambda: graphs.attribute_batch(model, [TOKENS, TOKENS[:3]], transcoders(model), attribution_targets=targets),
    )


@pytest.mark.unchecked
def test_attribution_targets_of_probability_zero(model, monkeypatch):
    """Tokens whose probability underflows to 0 would give every node zero influence: refused, not pruned to noise."""
    logits = torch.full((1, len(TOKENS), model.cfg.d_vocab), -1e4)
    logits[..., 0] = 0.0  # token 0 takes all the probability; 1 and 2 have exp(-1e4) = 0
    monkeypatch.setattr(model, "run_with_cache", lambda *a, **k: (logits, _real_cache(model, *a, **k)))
    refused(
        model,
        ValueError,
        r"weigh 0 in all \(their probabilities here\).* CustomTarget\(label, 1.0, W_U\[id\]",
        lambda: graphs.attribute(model, TOKENS, transcoders(model), attribution_targets=[1, 2]),
    )


def _real_cache(model, *args, **kwargs):
    return type(model).run_with_cache(model, *args, **kwargs)[1]


@pytest.mark.unchecked
@pytest.mark.parametrize("settings", [dict(max_n_logits=3), dict(desired_logit_prob=0.5)])
def test_attribution_targets_with_settings_that_would_be_ignored(model, settings):
    refused(
        model,
        ValueError,
        r"choose the logit nodes when attribution_targets is None; .* would be ignored: leave them out",
        lambda: graphs.attribute(model, TOKENS, transcoders(model), attribution_targets=[1, 2], **settings),
    )


@pytest.mark.unchecked
def test_a_model_with_hooks_registered(model):
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: x)
    refused(
        model,
        RuntimeError,
        r"hooks are registered at \['blocks.0.hook_resid_pre'\].*model.reset_hooks\(\)",
        lambda: graphs.attribute(model, TOKENS, transcoders(model)),
        keep_hooks=True,
    )


@pytest.mark.unchecked
def test_a_model_with_saes_spliced(model):
    sae = random_dictionary(model.cfg.d_model, "blocks.0.hook_resid_post", d_sae=16)
    with model.saes([sae]):
        with pytest.raises(RuntimeError, match=r"dictionaries are spliced into it.*outside the `model.saes\(...\)`"):
            graphs.attribute(model, TOKENS, transcoders(model))
    assert not any(point.listening for point in model.hook_dict.values())


@pytest.mark.unchecked
def test_a_single_dictionary(model):
    refused(
        model,
        TypeError,
        r"one transcoder per layer: a list.*not one dictionary",
        lambda: graphs.attribute(model, TOKENS, transcoders(model)[0]),
    )


@pytest.mark.unchecked
def test_an_sae_in_the_list(model):
    tc = transcoders(model)
    tc[1] = random_dictionary(model.cfg.d_model, "blocks.1.hook_resid_post", d_sae=16)
    refused(
        model,
        ValueError,
        r"transcoders\[1\] is an SAE on blocks.1.hook_resid_post.*replaces each MLP by a transcoder",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
def test_a_nonlinear_dictionary(model):
    tc = transcoders(model, architecture="gated")
    refused(
        model,
        ValueError,
        r"architecture 'gated'.*pre-activation linear in the input",
        lambda: graphs.attribute(model, TOKENS, tc),
    )


@pytest.mark.unchecked
def test_inference_mode(model):
    tc = transcoders(model)
    with torch.inference_mode():
        refused(
            model,
            RuntimeError,
            r"needs gradients; call it outside torch.inference_mode\(\)",
            lambda: graphs.attribute(model, TOKENS, tc),
        )


def test_a_failure_part_way_leaves_nothing_attached(model, monkeypatch):
    """An error after the parameters are frozen and the replacement model has run still gives everything back."""

    def fail(*args, **kwargs):
        raise RuntimeError("part way")

    monkeypatch.setattr(attribute_module, "attribute_rows", fail)
    tc = transcoders(model)
    tc_flags = [p.requires_grad for d in tc for p in d.parameters()]
    refused(model, RuntimeError, "part way", lambda: graphs.attribute(model, TOKENS, tc))
    assert [p.requires_grad for d in tc for p in d.parameters()] == tc_flags


@pytest.mark.unchecked
@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        ("When Mary and John", ValueError, r"no tokenizer, so give the prompt as token ids"),
        (TOKENS[None].expand(2, -1), ValueError, r"explains one prompt.*call attribute for each"),
        (torch.tensor([3, 64]), ValueError, r"token id 64 is outside this model's vocabulary \(0..63\)"),
        (torch.zeros(0, dtype=torch.long), ValueError, r"the prompt is empty"),
    ],
)
def test_prompts_it_cannot_explain(model, prompt, error, match):
    refused(model, error, match, lambda: graphs.attribute(model, prompt, transcoders(model)))
