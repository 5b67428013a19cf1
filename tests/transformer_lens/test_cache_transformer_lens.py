"""The ActivationCache API compared with TransformerLens 3.9 on the same weights and tokens.

Both models load the tiny random GPT-2 of `conftest.gpt2_dir` unfolded (tests/transformer_lens/tl_reference.py), so each
analysis helper must give TransformerLens' shape exactly and its values to float32 rounding. Where
`hooked` differs by design (`logit_attrs` reads out through `ln_final`'s weight) the test states the
relation instead of equality.
"""

import warnings

import numpy as np
import pytest
import torch

from hooked.cache import Slice, accumulated_bias, act_name
from tests.transformer_lens.tl_reference import tl_gpt2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformer_lens.utilities import Slice as TLSlice
    from transformer_lens.utilities import get_act_name as tl_act_name

ATOL = 2e-5
PROMPTS = ["The cat sat on the mat and", "a dog", "hello there, world of tiny models"]


def close(ours, theirs, atol=ATOL):
    assert ours.shape == theirs.shape, f"{tuple(ours.shape)} != {tuple(theirs.shape)}"
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)


@pytest.fixture(scope="module")
def tl(gpt2_dir):
    return tl_gpt2(gpt2_dir)


@pytest.fixture(scope="module")
def tokens(gpt2):
    """Random ids after a BOS (id 0 = <|endoftext|>, which both libraries would read as left padding)."""
    ids = torch.randint(1, gpt2.cfg.d_vocab, (3, 10), generator=torch.Generator().manual_seed(1))
    return torch.cat([torch.zeros(3, 1, dtype=torch.long), ids], dim=1)


@pytest.fixture(scope="module")
def caches(gpt2, tl, tokens):
    logits, ours = gpt2.run_with_cache(tokens)
    tl_logits, theirs = tl.run_with_cache(tokens)
    close(logits, tl_logits, atol=1e-4)
    return ours, theirs


@pytest.fixture(scope="module")
def padded_caches(gpt2, tl):
    """A left-padded batch of prompts of different lengths, tokenized by each library."""
    tokens = gpt2.to_tokens(PROMPTS)
    assert torch.equal(tokens, tl.to_tokens(PROMPTS)) and (tokens[1] == 0).sum() > 1
    _, ours = gpt2.run_with_cache(tokens)
    _, theirs = tl.run_with_cache(tokens)
    return ours, theirs, tokens


# ----------------------------------------------------------------------------- Slice
SLICE_INPUTS = [
    None,
    0,
    3,
    -1,
    (4,),
    (1, 5),
    (1, 9, 3),
    (-3, None),
    slice(2, None),
    [0, 4, 4],
    [],
    torch.tensor([2, 1]),
    np.array([5, 0]),
    torch.tensor([True, False] * 5 + [True]),
]


@pytest.mark.parametrize("input_slice", SLICE_INPUTS, ids=repr)
def test_slice_matches_transformer_lens(input_slice):
    tensor = torch.arange(2 * 11 * 11 * 3).reshape(2, 11, 11, 3)
    ours, theirs = Slice(input_slice), TLSlice(input_slice)
    assert ours.mode == theirs.mode
    for dim in (1, 2, -2):
        assert torch.equal(ours.apply(tensor, dim), theirs.apply(tensor, dim))
    if isinstance(input_slice, list) and not input_slice:  # TransformerLens' numpy float array cannot index here
        assert ours.indices(11).tolist() == []
    else:
        assert ours.indices(11).tolist() == np.asarray(theirs.indices(11)).tolist()
    assert Slice.unwrap(input_slice).apply(tensor, 1).shape == TLSlice.unwrap(input_slice).apply(tensor, 1).shape
    assert torch.equal(Slice(ours).apply(tensor, 1), ours.apply(tensor, 1))


def test_slice_refuses_what_transformer_lens_refuses():
    for bad in ("last", 1.5):
        with pytest.raises(ValueError):
            TLSlice(bad)
        with pytest.raises(ValueError, match="Invalid input_slice"):
            Slice(bad)


def test_a_plain_int_pos_slice_indexes_as_a_slice_does(caches):
    """In the analysis methods, as TransformerLens: `pos_slice=-1` is `Slice(-1)`, dropping the axis
    (run_with_cache(pos_slice=-1) keeps it, in both libraries)."""
    ours, theirs = caches
    plain = ours.decompose_resid(pos_slice=-1)
    indexed = ours.decompose_resid(pos_slice=Slice(-1))
    assert plain.ndim == 3 and torch.equal(plain, indexed)
    close(indexed, theirs.decompose_resid(pos_slice=-1))


# ----------------------------------------------------------------------------- keys
@pytest.mark.parametrize(
    "key",
    [
        "k1a",
        "k0",
        "scale1ln1",
        "scale0ln2",
        "normalized1ln2",
        "pre1",
        "post0",
        "q0",
        "pattern1",
        "z1",
        "v0a",
        "embed",
        "pos_embed",
        "scale",
        "blocks.0.hook_resid_pre",
    ],
)
def test_compact_keys_parse_as_transformer_lens(caches, key):
    ours, theirs = caches
    assert act_name(key) == tl_act_name(key)
    close(ours[key], theirs[key])


def test_compact_keys_with_an_underscore_name_a_layer(caches):
    """TransformerLens' get_act_name("resid_pre5") gives "hook_resid_pre5", which names no hook."""
    ours, theirs = caches
    assert tl_act_name("resid_pre1") == "hook_resid_pre1"
    for name in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "attn_scores"):
        full = tl_act_name(name, 1)
        assert act_name(f"{name}1") == full
        assert torch.equal(ours[f"{name}1"], ours.cache_dict[full])
        if name != "attn_scores":  # masked scores: -inf in TransformerLens, the dtype's minimum here
            close(ours[f"{name}1"], theirs[full])


# ----------------------------------------------------------------------------- positions
POS_SLICES = [None, Slice(-1), Slice(0), Slice((2, 7)), Slice([0, 5, 5]), Slice(torch.tensor([3, 1])), (2, 7), [4, 1]]


def tl_slice(pos_slice):
    if isinstance(pos_slice, Slice):
        return TLSlice(pos_slice.slice.numpy() if isinstance(pos_slice.slice, torch.Tensor) else pos_slice.slice)
    return pos_slice


@pytest.mark.parametrize("pos_slice", POS_SLICES, ids=repr)
def test_residual_stacks_match_with_every_pos_slice(caches, pos_slice):
    ours, theirs = caches
    theirs_slice = tl_slice(pos_slice)
    for layer in (None, 1, 0):
        for kwargs in (dict(incl_mid=True), dict(apply_ln=True), dict(mlp_input=True, apply_ln=True)):
            if layer is None and "mlp_input" in kwargs:
                continue
            a, labels = ours.accumulated_resid(layer, pos_slice=pos_slice, return_labels=True, **kwargs)
            b, tl_labels = theirs.accumulated_resid(layer, pos_slice=theirs_slice, return_labels=True, **kwargs)
            assert labels == tl_labels
            close(a, b)
        for kwargs in (dict(), dict(apply_ln=True), dict(mlp_input=True, apply_ln=True, mode="attn")):
            if layer is None and "mlp_input" in kwargs:
                continue
            a, labels = ours.decompose_resid(layer, pos_slice=pos_slice, return_labels=True, **kwargs)
            b, tl_labels = theirs.decompose_resid(layer, pos_slice=theirs_slice, return_labels=True, **kwargs)
            assert labels == tl_labels
            close(a, b)
    for layer in (-1, 1):
        a, labels = ours.stack_head_results(
            layer, pos_slice=pos_slice, incl_remainder=True, apply_ln=True, return_labels=True
        )
        b, tl_labels = theirs.stack_head_results(
            layer, pos_slice=theirs_slice, incl_remainder=True, apply_ln=True, return_labels=True
        )
        assert labels == tl_labels
        close(a, b)
    close(ours.stack_head_results(0, pos_slice=pos_slice), theirs.stack_head_results(0, pos_slice=theirs_slice))
    # Into block 0 nothing but the embeddings: TransformerLens' remainder reads resid_post of layer -1, the last block.
    close(
        ours.stack_head_results(0, pos_slice=pos_slice, incl_remainder=True)[0],
        ours._slice(ours["resid_pre", 0], pos_slice),
    )


# ----------------------------------------------------------------------------- logit attributions
@pytest.fixture(scope="module")
def tl_folded(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tl_gpt2(gpt2_dir, fold_ln=True)


def test_logit_attrs_with_a_batch_of_answers_and_an_int_pos_slice(caches, tl_folded, tokens):
    """TransformerLens' shapes; values equal TransformerLens' with `fold_ln=True`, whose W_U carries
    ln_final's weight, as hooked's readout does (unfolded TransformerLens leaves the weight out)."""
    ours, theirs = caches
    _, folded = tl_folded.run_with_cache(tokens)
    answers, wrong = tokens[:, 3], tokens[:, 4]
    stack = folded.decompose_resid(pos_slice=-1)  # [component batch d_model]
    expected = folded.logit_attrs(stack, answers, pos_slice=-1)
    expected_diff = folded.logit_attrs(stack, answers, incorrect_tokens=wrong, pos_slice=-1)
    assert expected.shape == (stack.shape[0], 3)
    for our_stack, our_slice in (
        (ours.decompose_resid(pos_slice=-1), -1),  # [component batch d_model]
        (ours.decompose_resid(pos_slice=Slice(-1)), Slice(-1)),
        (ours.decompose_resid(pos_slice=Slice(-1)), -1),
    ):
        close(ours.logit_attrs(our_stack, answers, pos_slice=our_slice), expected)
        close(ours.logit_attrs(our_stack, answers, incorrect_tokens=wrong, pos_slice=our_slice), expected_diff)
    for answer, batch_slice in ((7, None), ("a", None), (answers[:1], (0, 1))):  # one token; a batch of one
        want = folded.logit_attrs(stack, answer, pos_slice=-1, batch_slice=batch_slice)
        close(ours.logit_attrs(ours.decompose_resid(pos_slice=-1), answer, pos_slice=-1, batch_slice=batch_slice), want)
    unfolded = theirs.logit_attrs(theirs.decompose_resid(pos_slice=-1), answers, pos_slice=-1)
    assert (unfolded - expected).abs().max() > 1e-2  # the weight matters: this is a real difference
    with pytest.raises(ValueError, match="same shape"):
        ours.logit_attrs(ours.decompose_resid(pos_slice=-1), answers, incorrect_tokens=wrong[:2], pos_slice=-1)


def test_logit_attrs_of_every_position_and_one_token(caches, tl_folded, tokens):
    ours, _ = caches
    _, folded = tl_folded.run_with_cache(tokens)
    for answer in (7, tokens[:, 1:]):
        expected = folded.logit_attrs(folded.decompose_resid()[..., 1:, :], answer, pos_slice=(1, None))
        close(ours.logit_attrs(ours.decompose_resid()[..., 1:, :], answer, pos_slice=(1, None)), expected)


# ----------------------------------------------------------------------------- norms
@pytest.mark.parametrize("batch_slice", [None, Slice(1), Slice((0, 2)), Slice([2, 0]), (1, 3)], ids=repr)
def test_apply_ln_to_stack(caches, batch_slice):
    ours, theirs = caches
    stack = ours.decompose_resid()
    tl_batch_slice = tl_slice(batch_slice)
    for layer, mlp_input in ((None, False), (-1, False), (1, True), (0, False)):
        for recompute_ln in (False, True):
            a = ours.apply_ln_to_stack(stack, layer, mlp_input, batch_slice=batch_slice, recompute_ln=recompute_ln)
            b = theirs.apply_ln_to_stack(stack, layer, mlp_input, batch_slice=tl_batch_slice, recompute_ln=recompute_ln)
            close(a, b)


def test_recompute_ln_is_the_final_norm_itself(caches, gpt2):
    ours, _ = caches
    resid = ours["resid_post", -1]
    close(ours.apply_ln_to_stack(resid[None], recompute_ln=True)[0], gpt2.ln_final(resid))


# ----------------------------------------------------------------------------- stacks
@pytest.mark.parametrize(
    "name, layer, sublayer_type",
    [("scale", -1, "ln2"), ("pattern", None, None), ("z", 1, None), ("resid_pre", 2, None), ("normalized", -1, "ln1")],
)
def test_stack_activation(caches, name, layer, sublayer_type):
    ours, theirs = caches
    close(ours.stack_activation(name, layer, sublayer_type), theirs.stack_activation(name, layer, sublayer_type))


def test_compute_head_results(gpt2, tl, tokens):
    _, ours = gpt2.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_result"))
    _, mine = gpt2.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
    _, theirs = tl.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
    mine.compute_head_results()
    theirs.compute_head_results()
    for layer in range(gpt2.cfg.n_layers):
        close(mine["result", layer], theirs["result", layer])
        close(mine["result", layer], ours["result", layer])  # what the forward's own hook saw


@pytest.mark.parametrize("neuron_slice", [None, Slice((3, 9)), 5, [1, 2, 60]], ids=repr)
@pytest.mark.parametrize("pos_slice", [None, Slice(-1), (1, 4)], ids=repr)
def test_get_neuron_results(caches, neuron_slice, pos_slice):
    ours, theirs = caches
    direction = torch.randn(64, generator=torch.Generator().manual_seed(2))
    for project in (None, direction, direction[:, None].repeat(1, 3)):
        a = ours.get_neuron_results(1, neuron_slice, pos_slice, project_output_onto=project)
        if isinstance(neuron_slice, int) and project is not None:
            # One neuron, its axis dropped: [batch pos (k)]. TransformerLens gives [batch pos 1] for a
            # direction and broadcasts k against pos for a matrix.
            close(a, (theirs.get_neuron_results(1, neuron_slice, tl_slice(pos_slice)) @ project))
            continue
        b = theirs.get_neuron_results(1, tl_slice(neuron_slice), tl_slice(pos_slice), project_output_onto=project)
        close(a, b)


@pytest.mark.parametrize("layer", [None, 1, 0])
def test_stack_neuron_results(caches, layer):
    ours, theirs = caches
    direction = torch.randn(64, generator=torch.Generator().manual_seed(3))
    for kwargs in (
        dict(),
        dict(incl_remainder=True, apply_ln=True),
        dict(pos_slice=Slice(-1), neuron_slice=Slice((0, 7))),
        dict(project_output_onto=direction, incl_remainder=True),
        dict(project_output_onto=direction[:, None].repeat(1, 2), apply_ln=True, pos_slice=(2, 5)),
    ):
        if layer == 0 and kwargs.get("incl_remainder"):  # TransformerLens' remainder into block 0 reads the last block
            kwargs.pop("incl_remainder")
        a, labels = ours.stack_neuron_results(layer, return_labels=True, **kwargs)
        b, tl_labels = theirs.stack_neuron_results(
            layer, return_labels=True, **{k: tl_slice(v) for k, v in kwargs.items()}
        )
        assert labels == tl_labels
        close(a, b)


def test_layer_zero_remainder_is_the_stream_into_block_zero(caches, gpt2):
    """The documented difference: with `layer=L, incl_remainder=True` a stack sums to the stream entering block L
    in both libraries for L >= 1; for L = 0 TransformerLens 3.9 takes `resid_post` of layer 0 - 1 = -1, the final
    stream, and hooked the stream entering block 0."""
    ours, theirs = caches
    for method in ("stack_head_results", "stack_neuron_results"):
        for layer in range(1, gpt2.cfg.n_layers + 1):
            for cache in (ours, theirs):
                close(
                    getattr(cache, method)(layer, incl_remainder=True).sum(0), cache["resid_post", layer - 1], atol=1e-4
                )
        close(getattr(theirs, method)(0, incl_remainder=True)[0], theirs["resid_post", -1])
        close(getattr(ours, method)(0, incl_remainder=True)[0], theirs["resid_pre", 0])


def test_stack_neuron_results_sum_to_the_mlp_output(caches, gpt2):
    ours, _ = caches
    neurons = ours.stack_neuron_results(2)[gpt2.cfg.d_mlp :]
    close(neurons.sum(0) + gpt2.blocks[1].mlp.c_proj.bias, ours["mlp_out", 1], atol=1e-4)


@pytest.mark.parametrize("layer, mlp_input", [(None, False), (-1, False), (1, False), (1, True), (0, True), (0, False)])
def test_get_full_resid_decomposition(caches, layer, mlp_input):
    ours, theirs = caches
    direction = torch.randn(64, generator=torch.Generator().manual_seed(4))
    for kwargs in (
        dict(),
        dict(expand_neurons=False),
        dict(apply_ln=True, pos_slice=Slice(-1)),
        dict(project_output_onto=direction, apply_ln=True),
        dict(pos_slice=(3, 6), expand_neurons=False, apply_ln=True),
    ):
        a, labels = ours.get_full_resid_decomposition(layer, mlp_input, return_labels=True, **kwargs)
        b, tl_labels = theirs.get_full_resid_decomposition(
            layer, mlp_input, return_labels=True, **{k: tl_slice(v) for k, v in kwargs.items()}
        )
        if mlp_input and "project_output_onto" in kwargs:
            # TransformerLens normalises the neurons (only) by ln1's scale on this path; every row here uses ln2's,
            # as TransformerLens does without a projection.
            b = theirs.get_full_resid_decomposition(layer, mlp_input, apply_ln=True) @ direction
        assert labels == tl_labels
        close(a, b)
    full = ours.get_full_resid_decomposition(layer, mlp_input)
    upto = 2 if layer in (None, -1) else layer
    resid = ours["resid_mid", upto] if mlp_input else ours.accumulated_resid(upto)[-1]
    close(full.sum(0), resid, atol=1e-4)


def test_accumulated_bias(gpt2, tl):
    for layer in range(gpt2.cfg.n_layers + 1):
        for mlp_input in (False, True) if layer < gpt2.cfg.n_layers else (False,):
            for include_mlp_biases in (True, False):
                close(
                    accumulated_bias(gpt2, layer, mlp_input, include_mlp_biases),
                    tl.accumulated_bias(layer, mlp_input, include_mlp_biases).detach(),
                )
    with pytest.raises(ValueError, match="beyond the final layer"):
        accumulated_bias(gpt2, gpt2.cfg.n_layers, mlp_input=True)


# ----------------------------------------------------------------------------- batch
@pytest.mark.parametrize("batch_slice", [1, Slice(-1), (0, 2), [2, 0], None], ids=repr)
def test_apply_slice_to_batch_dim(caches, batch_slice):
    ours, theirs = caches
    mine, tls = ours.apply_slice_to_batch_dim(batch_slice), theirs.apply_slice_to_batch_dim(tl_slice(batch_slice))
    assert mine.has_batch_dim == tls.has_batch_dim
    for name in ("blocks.1.attn.hook_pattern", "hook_embed", "ln_final.hook_scale", "blocks.0.mlp.hook_post"):
        close(mine[name], tls[name])
    close(mine.decompose_resid(apply_ln=True, pos_slice=Slice(-2)), tls.decompose_resid(apply_ln=True, pos_slice=-2))
    close(mine.accumulated_resid(apply_ln=True), tls.accumulated_resid(apply_ln=True))


def test_toggle_autodiff(caches):
    ours, _ = caches
    try:
        ours.toggle_autodiff(False)
        assert not torch.is_grad_enabled()
        ours.toggle_autodiff(True)
        assert torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)


# ----------------------------------------------------------------------------- padding
def test_padded_batch_matches_transformer_lens(padded_caches, tl_folded):
    """Left padding: every helper agrees at the real positions of each prompt, the last one above all."""
    ours, theirs, tokens = padded_caches
    real = tokens[1] != 0
    real[torch.argmax(real.int())] = True
    close(ours.decompose_resid(apply_ln=True)[:, 1][:, real], theirs.decompose_resid(apply_ln=True)[:, 1][:, real])
    close(
        ours.accumulated_resid(apply_ln=True, pos_slice=Slice(-1)),
        theirs.accumulated_resid(apply_ln=True, pos_slice=-1),
    )
    close(
        ours.get_full_resid_decomposition(apply_ln=True, pos_slice=Slice(-1)),
        theirs.get_full_resid_decomposition(apply_ln=True, pos_slice=-1),
    )
    _, folded = tl_folded.run_with_cache(tokens)
    answers = tokens[:, -2]
    close(
        ours.logit_attrs(ours.get_full_resid_decomposition(pos_slice=-1), answers, pos_slice=-1),
        folded.logit_attrs(folded.get_full_resid_decomposition(pos_slice=-1), answers, pos_slice=-1),
    )
