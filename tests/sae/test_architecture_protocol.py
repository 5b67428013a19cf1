"""A dictionary architecture is one declaration in `hooked.sae.architectures.ARCHITECTURES`
(docs/adding-an-architecture.md).

A made-up architecture is declared here, as a new entry of hooked/sae/architectures.py would be: `shrinkage`, a
soft threshold, sign(pre) * max(|pre| - shrink, 0) with a learned `shrink` per feature (negative features too, which
no declared architecture has). With that declaration alone, `hooked.sae.load` reads it from a SAELens directory,
it splices into a model and computes what its weights say (compared with the arithmetic written out in plain
torch), `hooked.sae.train` trains it with the trainer the declaration names, an attribution graph runs through a
set of its transcoders (and refuses a copy declared non-linear, by name), and `hooked.sae.save` writes it back
bit-exact. The declarations are removed after each test (`shrinkage` fixture), so no other test sees them.

Then the rule behind it: no module of hooked/sae or hooked/graphs but the table compares an architecture's name.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

import hooked.sae
from hooked import graphs
from hooked.sae import architectures
from hooked.sae.architectures import Architecture, SAELensNames
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.training import DictionaryTrainer
from hooked.testing import random_model

HOOK = "blocks.0.hook_resid_post"
D_SAE = 24
ATOL = 1e-5  # float32: the same products summed in another order, on activations of order 1
INIT_SHRINK = 0.05


# ----------------------------------------------------------------------------- the architecture, as declared there
def soft_threshold(dictionary, pre: Tensor, x: Tensor | None, overwrite: bool) -> Tensor:
    return torch.sign(pre) * F.relu(pre.abs() - dictionary.shrink)


class ShrinkageTrainer(DictionaryTrainer):
    """The soft threshold with an L1 penalty on the features; `shrink` learns by autograd (it is differentiable
    wherever a feature is active) and is kept >= 0."""

    def __init__(self, spec, cfg, generator):
        super().__init__(spec, cfg, generator)
        with torch.no_grad():
            self.dictionary.shrink.fill_(INIT_SHRINK)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        with torch.no_grad():
            d.shrink.clamp_(min=0.0)
        acts = soft_threshold(d, x @ d.W_enc + d.b_enc, None, False)
        return acts, {"l1": self.spec.l1_coefficient * acts.abs().sum(-1).mean()}


SHRINKAGE = Architecture(
    name="shrinkage",
    parameters={"b_enc": ("d_sae",), "shrink": ("d_sae",)},
    activation=soft_threshold,
    scaled_with_feature=("b_enc", "shrink"),
    linear=True,  # active: pre - shrink, the encoder column read, shifted by a constant
    trainer=ShrinkageTrainer,
    saelens=SAELensNames(sae="shrinkage", transcoder="shrinkage_transcoder"),
)
# the same arithmetic, declared non-linear: an attribution graph must refuse it by its name
OPAQUE = Architecture(name="opaque_shrinkage", parameters=SHRINKAGE.parameters, activation=soft_threshold)


@pytest.fixture
def shrinkage():
    """Both declarations registered for one test, removed whatever happens."""
    for declaration in (SHRINKAGE, OPAQUE):
        architectures.register_architecture(declaration)
    try:
        yield SHRINKAGE
    finally:
        for declaration in (SHRINKAGE, OPAQUE):
            if declaration.name in architectures.ARCHITECTURES:
                architectures.unregister_architecture(declaration.name)


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=1, n_layers=2)


def explicit_features(tensors: dict[str, Tensor], x: Tensor, centre: bool = True) -> Tensor:
    """sign(pre) max(|pre| - shrink, 0) from the weights, written as its three cases."""
    pre = (x - tensors["b_dec"] if centre else x) @ tensors["W_enc"] + tensors["b_enc"]
    shrink = tensors["shrink"]
    return torch.where(pre > shrink, pre - shrink, torch.where(pre < -shrink, pre + shrink, torch.zeros_like(pre)))


def saelens_files(directory: Path, d_in: int, seed: int = 0) -> dict[str, Tensor]:
    """A SAELens directory of a shrinkage SAE, written by hand (not by hooked's writer); its tensors."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "W_enc": 0.3 * torch.randn(d_in, D_SAE, generator=generator),
        "W_dec": 0.3 * torch.randn(D_SAE, d_in, generator=generator),
        "b_dec": 0.1 * torch.randn(d_in, generator=generator),
        "b_enc": 0.1 * torch.randn(D_SAE, generator=generator),
        "shrink": 0.3 * torch.rand(D_SAE, generator=generator),
    }
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "sae_weights.safetensors"))
    config = {
        "architecture": "shrinkage",
        "d_in": d_in,
        "d_sae": D_SAE,
        "dtype": "float32",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "metadata": {"hook_name": HOOK, "sae_lens_version": "6.54.12"},
    }
    (directory / "cfg.json").write_text(json.dumps(config))
    return tensors


# ----------------------------------------------------------------------------- a new architecture: one declaration
def test_a_declared_architecture_loads_splices_and_saves_bit_exact(shrinkage, model, tmp_path):
    tensors = saelens_files(tmp_path / "sae", model.cfg.d_model)
    sae = hooked.sae.load(tmp_path / "sae", model=model)
    assert sae.cfg.architecture == "shrinkage" and sae.hook_name == HOOK
    for name, stored in tensors.items():  # a copy of the file's values: equal to the bit
        assert torch.equal(getattr(sae, name).detach(), stored), name

    def reconstruction(x, hook):
        return explicit_features(tensors, x) @ tensors["W_dec"] + tensors["b_dec"]

    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    spliced = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
    explicit = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, reconstruction)])
    torch.testing.assert_close(spliced, explicit, atol=ATOL, rtol=0)
    assert (spliced - model(tokens)).abs().max() > 1e-2  # the reconstruction is not the activation: a real test
    _, cache = model.run_with_cache_with_saes(tokens, saes=[sae], use_error_term=False)
    features = cache[f"{HOOK}.hook_sae_acts_post"]
    assert bool((features < 0).any()) and bool((features > 0).any())  # both signs: not a relu in disguise

    written = hooked.sae.save(sae, tmp_path / "out", format="saelens")
    assert json.loads((written / "cfg.json").read_text())["architecture"] == "shrinkage"
    again = hooked.sae.load(written, model=model)
    assert again.cfg.architecture == "shrinkage"
    for name, stored in tensors.items():  # written and read back as bytes: equal to the bit
        assert torch.equal(getattr(again, name).detach(), stored), name

    with torch.no_grad():  # fold_W_dec_norm scales what the declaration says scales with the feature
        folded = hooked.sae.load(written, model=model)
        norms = folded.fold_W_dec_norm()
        torch.testing.assert_close(folded.shrink, tensors["shrink"] * norms, atol=0, rtol=1e-6)
        x = torch.randn(5, model.cfg.d_model, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(folded(x), again(x), atol=ATOL, rtol=0)


def test_a_declared_architecture_trains_with_the_trainer_it_names(shrinkage, model, tmp_path):
    ids = torch.randint(8, model.cfg.d_vocab, (48, 16), generator=torch.Generator().manual_seed(3))
    options = dict(hook_name=HOOK, architecture="shrinkage", d_sae=D_SAE, batch_tokens=64, buffer_batches=2)
    options |= dict(lr=3e-3, l1_coefficient=1e-3, progress=False, seed=0)
    first = hooked.sae.train(model, ids, n_tokens=64, **options)  # one step
    trained = hooked.sae.train(model, ids, n_tokens=64 * 40, checkpoint_dir=tmp_path / "run", **options)
    assert trained.cfg.architecture == "shrinkage"
    assert all(bool(torch.isfinite(parameter).all()) for parameter in trained.parameters())
    assert not torch.allclose(trained.shrink, torch.full_like(trained.shrink, INIT_SHRINK))  # the declared one learnt

    _, cache = model.run_with_cache(ids[40:], names_filter=[HOOK])
    x = cache[HOOK].flatten(0, 1)

    def fvu(d: Dictionary) -> float:
        weights = {name: parameter.detach() for name, parameter in d.named_parameters()}
        out = explicit_features(weights, x) @ weights["W_dec"] + weights["b_dec"]
        return float((out - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())

    assert fvu(trained) < 0.8 * fvu(first), (fvu(first), fvu(trained))
    saved = hooked.sae.load(tmp_path / "run" / f"final_{64 * 40}")  # its checkpoint, in SAELens' format
    for name, parameter in trained.named_parameters():
        assert torch.equal(getattr(saved, name), parameter), name


def shrinkage_transcoders(model, architecture: str, seed: int = 0) -> list[Dictionary]:
    generator = torch.Generator().manual_seed(seed)
    transcoders = []
    for layer in range(model.cfg.n_layers):
        points = {"hook_name": f"blocks.{layer}.mlp.hook_in", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
        d_model = model.cfg.d_model
        transcoder = Dictionary(DictionaryConfig(d_in=d_model, d_sae=D_SAE, architecture=architecture, **points))
        with torch.no_grad():
            for parameter in transcoder.parameters():
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
            transcoder.shrink.abs_()
        transcoders.append(transcoder)
    return transcoders


def test_an_attribution_graph_runs_through_a_linear_one_and_refuses_another_by_name(shrinkage, model):
    tokens = torch.tensor([3, 17, 42, 8, 25, 11])
    transcoders = shrinkage_transcoders(model, "shrinkage")
    graph = graphs.attribute(model, tokens, transcoders, max_n_logits=3, progress=False)

    names = [t.hook_name for t in transcoders]
    _, cache = model.run_with_cache(graph.input_tokens[None], names_filter=names)
    expected = []
    for layer, transcoder in enumerate(transcoders):
        weights = {name: parameter.detach() for name, parameter in transcoder.named_parameters()}
        acts = explicit_features(weights, cache[names[layer]][0], centre=False)
        acts[0] = 0  # position 0's features are zeroed, as circuit-tracer's
        expected.append(acts)
    expected = torch.stack(expected)  # [n_layers pos d_sae]
    layer, position, feature = graph.active_features.T
    assert len(layer) == int((expected != 0).sum()) and bool((graph.activation_values < 0).any())
    torch.testing.assert_close(graph.activation_values, expected[layer, position, feature], atol=ATOL, rtol=0)
    assert torch.isfinite(graph.adjacency).all()

    with pytest.raises(ValueError, match=r"architecture 'opaque_shrinkage' \(one of standard, topk, jumprelu, shr"):
        graphs.attribute(model, tokens, shrinkage_transcoders(model, "opaque_shrinkage"), progress=False)


def test_without_its_declaration_the_architecture_is_unknown(model, tmp_path):
    saelens_files(tmp_path / "sae", model.cfg.d_model)
    with pytest.raises(ValueError, match=r"architecture 'shrinkage' is not one hooked\.sae reads"):
        hooked.sae.load(tmp_path / "sae")
    with pytest.raises(ValueError, match=r"architecture 'shrinkage' is not one hooked\.sae knows"):
        DictionaryConfig(d_in=4, d_sae=4, hook_name=HOOK, architecture="shrinkage")


def test_a_declaration_that_contradicts_itself_or_the_table_is_refused(shrinkage):
    with pytest.raises(ValueError, match="is declared already"):
        architectures.register_architecture(SHRINKAGE)
    with pytest.raises(ValueError, match=r"file name\(s\) \['shrinkage'\] belong to another"):
        architectures.register_architecture(
            Architecture(name="other", parameters={}, activation=soft_threshold, saelens=SAELensNames(sae="shrinkage"))
        )
    with pytest.raises(ValueError, match="scaled_with_feature names"):
        Architecture(name="x", parameters={}, activation=soft_threshold, scaled_with_feature=("b_enc",))
    with pytest.raises(ValueError, match="beyond W_enc, W_dec, b_dec"):
        Architecture(name="x", parameters={"W_enc": ("d_in", "d_sae")}, activation=soft_threshold)


# ----------------------------------------------------------------------------- no name is compared outside the table
ROOT = Path(__file__).resolve().parents[2]
# (file, literal) pairs that are a file format's own spelling of something, kept where the format reads it:
ALLOWED = {
    ("hooked/sae/formats/sparsify.py", "topk"): "eai-sparsify's config names its activation 'topk' (or 'groupmax')",
    ("hooked/sae/formats/saelens.py", "topk"): "SAELens before 6 named the TopK activation activation_fn='topk'",
}


def architecture_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string constant in `source` that is exactly an architecture's name (docstrings aside)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings
    ]


def test_no_module_but_the_table_names_an_architecture():
    names = set(architectures.ARCHITECTURES)
    files = sorted([*(ROOT / "hooked" / "sae").rglob("*.py"), *(ROOT / "hooked" / "graphs").rglob("*.py")])
    found = [
        f"{path.relative_to(ROOT)}:{line} {name!r}"
        for path in files
        if path != ROOT / "hooked" / "sae" / "architectures.py"
        for line, name in architecture_literals(path.read_text(), names)
        if (str(path.relative_to(ROOT)), name) not in ALLOWED
    ]
    assert not found, "compares an architecture's name; read its declaration (hooked/sae/architectures.py):\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    "snippet",
    [
        "if cfg.architecture == 'topk': pass",
        "LINEAR = ('standard', 'jumprelu')",
        "TRAINERS = {'batchtopk': BatchTopKTrainer}",
        "def f(a='gated'):\n    '''a docstring naming jumprelu alone passes'''",
    ],
)
def test_the_name_checker_catches_a_name_in_code(snippet):
    assert architecture_literals(snippet, set(architectures.ARCHITECTURES))
    assert not architecture_literals("'''standard'''\nx = 'standard SAE'", set(architectures.ARCHITECTURES))
