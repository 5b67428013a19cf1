"""hooked.sae.train(cross_layer=True): a cross-layer transcoder's loss and gradients equal explicit torch on its
weights; trained on the bundled IOI model it reconstructs every layer's MLP output on held-out prompts, splices
with a lower cross-entropy than zero-ablating the MLPs, and saves as circuit-tracer's folder with the same
outputs after loading."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hooked
import hooked.sae
from hooked.interventions import tasks
from hooked.sae import training
from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.training import CLTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/sae/conftest.py

READ, WRITE = "blocks.{layer}.mlp.hook_in", "blocks.{layer}.hook_mlp_out"
SMALL = dict(d_sae=64, batch_tokens=512, context_size=32, lr=3e-3, progress=False, dead_feature_window=20)
STEPS = 40
BANDWIDTH = 0.05


@pytest.fixture(scope="module")
def model(ioi_gpt2):
    return ioi_gpt2


@pytest.fixture(scope="module")
def heldout(model):
    """Token rows and validity of prompts training never saw, with every layer's MLP input and output there,
    stacked [n_layers tokens width]."""
    tokens, valid = model.tokens_and_mask(tasks.ioi(48, seed=99).clean, None, None)
    layers = range(model.cfg.n_layers)
    names = [READ.format(layer=m) for m in layers] + [WRITE.format(layer=m) for m in layers]
    _, cache = model.run_with_cache(tokens, attention_mask=valid, names_filter=names)
    xs = torch.stack([cache[READ.format(layer=m)][valid] for m in layers])
    ys = torch.stack([cache[WRITE.format(layer=m)][valid] for m in layers])
    return tokens, valid, xs, ys


@pytest.fixture(scope="module")
def trained(model):
    """architecture -> (the CLT after one step, after STEPS steps)."""
    texts = tasks.ioi(300).clean
    options = {"standard": dict(l1_coefficient=1e-3), "jumprelu": dict(l0_coefficient=1e-3)}
    return {
        architecture: tuple(
            hooked.sae.train(model, texts, cross_layer=True, architecture=architecture, n_tokens=n, **kw, **SMALL)
            for n in (512, STEPS * 512)
        )
        for architecture, kw in options.items()
    }


def explicit_features(clt: CrossLayerTranscoder, xs: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(pre-activations, features) of every layer from the weights in plain torch."""
    pres = [xs[layer] @ module.W_enc + module.b_enc for layer, module in enumerate(clt.layers)]
    acts = [
        pre.relu() if module.threshold is None else pre * (pre > module.threshold)
        for pre, module in zip(pres, clt.layers, strict=True)
    ]
    return pres, acts


def explicit_outputs(clt: CrossLayerTranscoder, acts: list[torch.Tensor], xs: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's output in plain torch: layer m's is b_dec_m plus, for every l <= m, layer l's features times
    slice m - l of W_dec_l (plus x_m W_skip_m)."""
    outs = []
    for m, module in enumerate(clt.layers):
        out = module.b_dec + sum(acts[source] @ clt.layers[source].W_dec[:, m - source, :] for source in range(m + 1))
        outs.append(out + (xs[m] @ module.W_skip if module.W_skip is not None else 0))
    return outs


def fvu(y: torch.Tensor, y_hat: torch.Tensor) -> float:
    return float((y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum())


# ----------------------------------------------------------------------------- one step against explicit torch
def make_trainer(architecture: str, skip: bool, n_layers: int = 3, d_in: int = 12, d_sae: int = 32) -> CLTTrainer:
    spec = training.DictionarySpec(
        hook_name=READ, architecture=architecture, d_sae=d_sae, k=None, hook_name_out=WRITE, skip=skip,
        l1_coefficient=0.7, l0_coefficient=0.3, aux_coefficient=0.0, lr=1e-3, dead_feature_window=10,
        resample_dead=False, seed=0, cross_layer=True,
    )  # fmt: skip
    cfg = CLTConfig(n_layers=n_layers, d_in=d_in, d_sae=d_sae, architecture=architecture, d_out=d_in + 2)
    return CLTTrainer(spec, cfg, torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("architecture", "skip"), [("standard", False), ("standard", True), ("jumprelu", False)])
def test_loss_and_gradients_equal_explicit_torch(architecture, skip):
    trainer = make_trainer(architecture, skip)
    clt, cfg = trainer.clt, trainer.clt.cfg
    generator = torch.Generator().manual_seed(1)
    n = 50
    xs = torch.randn(cfg.n_layers, n, cfg.d_in, generator=generator) * 2 + 0.5
    ys = torch.randn(cfg.n_layers, n, cfg.d_out, generator=generator) + 1
    batch = {READ.format(layer=m): xs[m] for m in range(cfg.n_layers)}
    batch |= {WRITE.format(layer=m): ys[m] for m in range(cfg.n_layers)}
    trainer.initialize(batch)
    with torch.no_grad():
        for module in clt.layers:
            module.b_enc.add_(torch.randn(cfg.d_sae, generator=generator) * 0.05)
            if module.threshold is not None:  # thresholds where some pre-activations fall within the kernel
                module.threshold.copy_(torch.rand(cfg.d_sae, generator=generator) * 0.1)
            if module.W_skip is not None:
                module.W_skip.copy_(torch.randn(cfg.d_in, cfg.d_out, generator=generator) * 0.1)
    out = trainer.forward(batch, None)
    out.loss.backward()
    ours = {name: p.grad.clone() for name, p in clt.named_parameters()}
    clt.zero_grad()

    pres, acts = explicit_features(clt, xs)
    outs = explicit_outputs(clt, acts, xs)
    mse = sum((o - y).pow(2).sum(-1).mean() for o, y in zip(outs, ys, strict=True))
    if architecture == "standard":
        penalty = sum(
            (a * module.W_dec.norm(dim=-1).sum(-1)).sum(-1).mean() for a, module in zip(acts, clt.layers, strict=True)
        )
        loss = mse + 0.7 * penalty
    else:
        loss = mse + 0.3 * sum((a != 0).float().sum(-1).mean() for a in acts)
    torch.testing.assert_close(out.loss, loss)
    torch.testing.assert_close(out.parts["mse"], mse)
    torch.testing.assert_close(out.recons, torch.stack(outs).detach())
    torch.testing.assert_close(out.recons, clt(xs).detach(), rtol=1e-5, atol=1e-5)  # hooked/sae/clt.py's forward
    loss.backward()
    for name, p in clt.named_parameters():
        if not name.endswith("threshold"):
            torch.testing.assert_close(ours[name], p.grad, msg=name)
    if architecture == "jumprelu":  # the straight-through estimate, by hand (SAELens 6.54 `jumprelu_sae.py`)
        leaves = [a.detach().requires_grad_() for a in acts]
        error = sum((o - y).pow(2).sum(-1).mean() for o, y in zip(explicit_outputs(clt, leaves, xs), ys, strict=True))
        grads = torch.autograd.grad(error, leaves)
        for layer, (pre, grad, module) in enumerate(zip(pres, grads, clt.layers, strict=True)):
            t = module.threshold.detach()
            kernel = (((pre.detach() - t) / BANDWIDTH).abs() < 0.5).float() / BANDWIDTH
            expected = -(t * kernel * grad).sum(0) - 0.3 * kernel.sum(0) / n
            assert bool((kernel.sum(0) > 0).sum() > 3), "some pre-activations fall within the kernel"
            torch.testing.assert_close(ours[f"layers.{layer}.threshold"], expected)
    assert out.fired.shape == (cfg.n_layers, cfg.d_sae)
    torch.testing.assert_close(out.fired, torch.stack([(a > 0).any(0) for a in acts]))


# ----------------------------------------------------------------------------- training on the IOI model
@pytest.mark.parametrize(("architecture", "bound"), [("standard", 0.6), ("jumprelu", 0.6)])
def test_training_lowers_every_layers_fvu(trained, heldout, architecture, bound):
    """On held-out prompts, from the weights in plain torch: every layer's output FVU after STEPS steps is under
    `bound` and under half its value after one step; per-layer dead counts are recorded."""
    _, _, xs, ys = heldout
    start, end = trained[architecture]
    assert isinstance(end, CrossLayerTranscoder) and end.cfg.n_layers == 4
    with torch.no_grad():
        before = [
            fvu(y, o) for y, o in zip(ys, explicit_outputs(start, explicit_features(start, xs)[1], xs), strict=True)
        ]
        after = [fvu(y, o) for y, o in zip(ys, explicit_outputs(end, explicit_features(end, xs)[1], xs), strict=True)]
    assert all(a < bound for a in after), (before, after)
    assert all(a < 0.5 * b for a, b in zip(after, before, strict=True)), (before, after)
    metadata = end.cfg.metadata
    assert metadata["n_training_tokens"] == STEPS * 512
    assert len(metadata["num_dead_features_per_layer"]) == 4
    assert sum(metadata["num_dead_features_per_layer"]) == metadata["num_dead_features"]


def cross_entropy(model, tokens, valid, hooks=(), saes=()) -> float:
    """Mean next-token cross-entropy over the positions whose token and next token are real, by hand."""
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)), model.saes(list(saes)):
        logits = model(tokens, attention_mask=valid)
    pairs = valid[:, :-1] & valid[:, 1:]
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    return float(losses[pairs.flatten()].mean())


@pytest.mark.parametrize("architecture", ["standard", "jumprelu"])
def test_spliced_clt_beats_zero_ablating_the_mlps(model, trained, heldout, architecture):
    """Spliced (no error term), the CLT replaces every MLP's output; its cross-entropy recovers most of what
    zeroing them all loses, and the spliced outputs are the CLT's own."""
    tokens, valid, xs, _ = heldout
    clt = trained[architecture][1]
    names = [WRITE.format(layer=m) for m in range(4)]
    clean = cross_entropy(model, tokens, valid)
    zeroed = cross_entropy(model, tokens, valid, hooks=[(names, lambda a, hook: torch.zeros_like(a))])
    spliced = cross_entropy(model, tokens, valid, saes=[clt])
    recovered = (zeroed - spliced) / (zeroed - clean)
    assert zeroed > clean + 0.5, (clean, zeroed)
    assert recovered > 0.5, (clean, spliced, zeroed)


@pytest.mark.parametrize("skip", [False, True])
def test_saves_as_circuit_tracer_and_loads_back_with_the_same_outputs(model, trained, heldout, tmp_path, skip):
    _, _, xs, _ = heldout
    if skip:
        clt = hooked.sae.train(
            model, tasks.ioi(40).clean, cross_layer=True, architecture="jumprelu", skip=True, n_tokens=1024, **SMALL
        )
        assert clt.has_skip and bool(clt.layers[2].W_skip.abs().sum() > 0)
        with pytest.warns(UserWarning, match="skip"):
            hooked.sae.save(clt, tmp_path / "clt", format="circuit-tracer")
    else:
        clt = trained["jumprelu"][1]
        hooked.sae.save(clt, tmp_path / "clt", format="circuit-tracer")
    loaded = hooked.sae.load(tmp_path / "clt")
    assert isinstance(loaded, CrossLayerTranscoder)
    assert (loaded.cfg.hook_name, loaded.cfg.hook_name_out) == (READ, WRITE)
    with torch.no_grad():
        torch.testing.assert_close(loaded(xs), clt(xs))


def test_checkpoints_are_circuit_tracer_folders(model, tmp_path):
    clt = hooked.sae.train(
        model, tasks.ioi(40).clean, cross_layer=True, architecture="standard", n_tokens=1024,
        checkpoint_dir=tmp_path, checkpoint_every=512, **SMALL,
    )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1024", "512", "final_1024"]
    loaded = hooked.sae.load(tmp_path / "final_1024")
    x = torch.randn(4, 5, 128)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), clt(x))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(architecture="topk", k=4), ValueError, "'standard' .* or 'jumprelu'"),
        (dict(hook_name="blocks.0.mlp.hook_in"), ValueError, "template with \\{layer\\}"),
        (dict(hook_name="blocks.{layer}.hook_nothing"), KeyError, "hook_name"),
        (dict(hook_name=WRITE, hook_name_out=READ), ValueError, "reads a point before the one it writes"),
        (dict(resample_dead=True), ValueError, "resample_dead"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(model, kwargs, error, match):
    settings = {**SMALL, "architecture": "standard", **kwargs}
    with pytest.raises(error, match=match):
        hooked.sae.train(model, [object()], cross_layer=True, n_tokens=512, **settings)
