"""The shortcuts taken for speed in hooked.sae compute what the plain way computes. In `Dictionary.forward`
(hooked/sae/dictionary.py): the bias added and the ReLU taken in place (the latter only when no hook holds the
pre-activations), and the error term's reference decoded from the features as first computed when hooks listen only
after them; that reference ignores every hook of the dictionary, in-place edits included. In the splice
(hooked/sae/splice.py): the width check sizes the one point the dictionary reads or writes, not every point.

References: explicit torch on the weights (bit for bit where the operations are the same), SAELens 6.54's own
`StandardSAE` / `TopKSAE` with the same tensors (`saes/sae.py` `SAE.forward` with `use_error_term`, which encodes a
second time with its hooks disabled), and `model.hook_shapes()`."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from hooked.sae import Dictionary, DictionaryConfig
from hooked.testing import random_model

K = 5
ARCHITECTURES = ("standard", "topk")


def dictionary(architecture: str, d_in: int = 16, hook_name: str = "blocks.0.hook_resid_post", **config) -> Dictionary:
    """3x wide, weights N(0, 0.3), encoder biases shifted down so that some features are off."""
    cfg = DictionaryConfig(
        d_in=d_in,
        d_sae=3 * d_in,
        hook_name=hook_name,
        architecture=architecture,
        k=K if architecture == "topk" else None,
        apply_b_dec_to_input=True,
        **config,
    )
    d = Dictionary(cfg)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in d.named_parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator) - (0.2 if name == "b_enc" else 0))
    return d


def inputs(d_in: int = 16) -> Tensor:
    return torch.randn(2, 5, d_in, generator=torch.Generator().manual_seed(1))


def pre_of(d: Dictionary, x: Tensor) -> Tensor:
    return (x - d.b_dec) @ d.W_enc + d.b_enc


def acts_of(d: Dictionary, pre: Tensor) -> Tensor:
    if d.cfg.architecture == "topk":
        values, indices = pre.topk(K, dim=-1)
        return torch.zeros_like(pre).scatter(-1, indices, torch.relu(values))
    return torch.relu(pre)


def decode(d: Dictionary, acts: Tensor) -> Tensor:
    return acts @ d.W_dec + d.b_dec


def saelens_twin(d: Dictionary):
    """SAELens' SAE of the same architecture and tensors, with the error term on."""
    from sae_lens import StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig

    common = dict(d_in=d.cfg.d_in, d_sae=d.cfg.d_sae, apply_b_dec_to_input=True)
    if d.cfg.architecture == "topk":
        twin = TopKSAE(TopKSAEConfig(k=K, **common), use_error_term=True)
    else:
        twin = StandardSAE(StandardSAEConfig(**common), use_error_term=True)
    twin.load_state_dict({name: getattr(d, name).detach().clone() for name in ("W_enc", "b_enc", "W_dec", "b_dec")})
    return twin


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_forward_and_encode_equal_the_arithmetic_bit_for_bit(architecture):
    d, x = dictionary(architecture), inputs()
    with torch.no_grad():
        acts = acts_of(d, pre_of(d, x))
        assert (acts == 0).any() and (acts > 0).any()
        # exact: the same matmuls, bias add and relu / topk on the same input (in place or not, the same values)
        assert torch.equal(d.encode(x), acts)
        assert torch.equal(d(x), decode(d, acts))
        torch.testing.assert_close(d(x, use_error_term=True), x)  # no hook: the output is the input


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_gradients_through_the_in_place_bias_and_relu(architecture):
    d, x = dictionary(architecture), inputs().requires_grad_(True)
    d(x).pow(2).sum().backward()
    ours = [x.grad.clone()] + [p.grad.clone() for p in (d.W_enc, d.b_enc, d.W_dec, d.b_dec)]
    x.grad = None
    d.zero_grad()
    decode(d, acts_of(d, pre_of(d, x))).pow(2).sum().backward()
    expected = [x.grad] + [p.grad for p in (d.W_enc, d.b_enc, d.W_dec, d.b_dec)]
    for got, want in zip(ours, expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_hook_keeping_the_pre_activations_keeps_their_negatives(architecture):
    """A hook may keep the tensor it is given (a cache alone in a call does not copy), so the ReLU must not write
    into a pre-activation a hook has seen."""
    model = random_model("gpt2")
    d = dictionary(architecture, d_in=model.cfg.d_model)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    point = d.cfg.hook_name
    kept = {}

    def keep(activation: Tensor, hook) -> None:
        kept[hook.name] = activation

    with torch.no_grad(), model.saes([d]):
        model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.startswith(f"{point}.hook_sae"), keep)])
        pre = pre_of(d, kept[f"{point}.hook_sae_input"])
    assert (pre < 0).any()
    # exact: what the hooks kept is what the dictionary computed, and pre_of / acts_of run its ops on its input
    assert torch.equal(kept[f"{point}.hook_sae_acts_pre"], pre)
    assert torch.equal(kept[f"{point}.hook_sae_acts_post"], acts_of(d, pre))


def zero_feature(feature: int):
    def hook(activation: Tensor, hook) -> None:
        activation[..., feature] = 0  # in place, as users write it

    return hook


def double(activation: Tensor, hook) -> Tensor:
    return 2 * activation


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("where", ["hook_sae_acts_post", "hook_sae_recons", "hook_sae_acts_pre", "hook_sae_input"])
def test_error_term_reference_ignores_every_hook(architecture, where):
    """output = what the hooks make of the reconstruction + (x - the reconstruction with no hook running); with
    hooks after the features only, the reference reuses the features, which an in-place edit must not reach."""
    d, x = dictionary(architecture), inputs()
    with torch.no_grad():
        acts = acts_of(d, pre_of(d, x))
        feature = int((acts > 0).sum(dim=(0, 1)).argmax())  # active somewhere, so zeroing it changes the output
        edit = double if where in ("hook_sae_input", "hook_sae_recons") else zero_feature(feature)
        with d.hooks(fwd_hooks=[(where, edit)]):
            ours = d(x.clone(), use_error_term=True)
        twin = saelens_twin(d)
        with twin.hooks(fwd_hooks=[(where, edit)]):
            theirs = twin(x.clone())

        clean = decode(d, acts)
        if where == "hook_sae_acts_post":
            edited_acts = acts.clone()
            edited_acts[..., feature] = 0
            hooked_recons = decode(d, edited_acts)
        elif where == "hook_sae_recons":
            hooked_recons = 2 * clean
        elif where == "hook_sae_acts_pre":
            pre = pre_of(d, x)
            pre[..., feature] = 0
            hooked_recons = decode(d, acts_of(d, pre))
        else:
            hooked_recons = decode(d, acts_of(d, pre_of(d, 2 * x)))
    expected = hooked_recons + (x - clean)
    assert not torch.allclose(expected, x, atol=1e-4)  # the edit mattered
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("point", ["blocks.0.hook_resid_post", "blocks.0.attn.hook_z", "blocks.0.attn.hook_pattern"])
def test_the_width_check_reads_the_shape_hook_shapes_gives(point):
    model = random_model("gpt2")
    tokens = torch.randint(0, model.cfg.d_vocab, (1, 4))
    shape = model.hook_shapes(batch=1, pos=1)[point][2:]
    z = point.endswith("hook_z")
    width = shape[0] * shape[1] if z else shape[0]
    reshape = {"reshape_activations": "hook_z"} if z else {}
    with torch.no_grad():
        if len(shape) == 2 and not z:
            with pytest.raises(ValueError, match="reads a vector per position"):
                model.run_with_saes(tokens, saes=[dictionary("standard", d_in=width, hook_name=point)])
            return
        assert model.run_with_saes(tokens, saes=[dictionary("standard", d_in=width, hook_name=point, **reshape)]).shape
        with pytest.raises(ValueError, match=f"cfg.d_in is {width + 1}, but {point} of this model is {width} wide"):
            model.run_with_saes(tokens, saes=[dictionary("standard", d_in=width + 1, hook_name=point, **reshape)])
