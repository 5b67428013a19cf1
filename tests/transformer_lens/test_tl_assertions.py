"""Where TransformerLens 3.9 fails an `assert`, hooked raises an error that is also an `AssertionError`.

Each case runs the same call on TransformerLens 3.9 and on hooked with the same GPT-2 weights
(tests/transformer_lens/tl_reference.py): TransformerLens raises `AssertionError`, and hooked an error that is
both that and its own type (`ValueError` for bad input, `KeyError` for a hook name it does not have), so code
written for TransformerLens (`except AssertionError`) and for hooked (`except ValueError`) both catch it.
Also `default_prepend_bos=False` (no BOS from `to_tokens`, `to_str_tokens`, `get_token_position`) and
`from hooked import patching`, each against TransformerLens.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import hooked
from tests.transformer_lens.tl_reference import tl_gpt2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import transformer_lens
    import transformer_lens.patching as tl_patching

PROMPT = "When John and Mary went to the shops, Mary gave the bag to John"


@pytest.fixture(scope="module")
def tl(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tl_gpt2(gpt2_dir)


def identity(tensor, hook):
    return tensor


def batch_cache(model):
    return model.run_with_cache(model.to_tokens([PROMPT, "Hello world"]))[1]


def unbatched_cache(model):
    return model.run_with_cache(model.to_tokens(PROMPT), remove_batch_dim=True)[1]


CASES = {
    "a token not in the prompt": (ValueError, lambda m: m.get_token_position(" John", "Hello world")),
    "get_token_position on ids [2 pos]": (
        ValueError,
        lambda m: m.get_token_position(" John", m.to_tokens([PROMPT, PROMPT])),
    ),
    "to_single_token of several tokens": (ValueError, lambda m: m.to_single_token(" John and Mary")),
    "remove_batch_dim on a batch of two": (ValueError, lambda m: batch_cache(m).remove_batch_dim()),
    "a batch slice of a cache without a batch axis": (
        ValueError,
        lambda m: unbatched_cache(m).apply_slice_to_batch_dim(0),
    ),
    "add_hook on hook_attn_in": (KeyError, lambda m: m.add_hook("blocks.0.hook_attn_in", identity)),
}


@pytest.mark.unchecked
@pytest.mark.parametrize("case", CASES)
def test_what_transformer_lens_asserts_is_an_assertion_error_here(gpt2, tl, case):
    own_type, call = CASES[case]
    with pytest.raises(AssertionError):
        call(tl)
    tl.reset_hooks()
    with pytest.raises(AssertionError) as caught:
        call(gpt2)
    assert isinstance(caught.value, own_type), type(caught.value).__mro__
    assert not any(point.has_hooks() for point in gpt2.hook_dict.values())  # nothing left attached


def factored(library, a=(3, 2), b=(2, 4)):
    generator = torch.Generator().manual_seed(0)
    return library.FactoredMatrix(torch.randn(a, generator=generator), torch.randn(b, generator=generator))


FACTORED_CASES = {
    "factors that do not meet": lambda lib: factored(lib, b=(3, 4)),
    "@ a matrix of another height": lambda lib: factored(lib) @ torch.ones(3, 2),
    "a matrix of another width @": lambda lib: torch.ones(2, 2) @ factored(lib),
    "* a tensor": lambda lib: factored(lib) * torch.ones(2),
    "BA of a non-square matrix": lambda lib: factored(lib).BA,
}


@pytest.mark.unchecked
@pytest.mark.parametrize("case", FACTORED_CASES)
def test_factored_matrix_shape_errors_are_assertion_errors(case):
    with pytest.raises(AssertionError):
        FACTORED_CASES[case](transformer_lens)
    with pytest.raises(AssertionError) as caught:
        FACTORED_CASES[case](hooked)
    assert isinstance(caught.value, ValueError)


@pytest.mark.unchecked
def test_messages_name_the_problem(gpt2):
    with pytest.raises(AssertionError, match=r"The token does not occur in the prompt: ' John' \(id \d+\)"):
        gpt2.get_token_position(" John", "Hello world")
    with pytest.raises(AssertionError, match="ln1.hook_normalized"):
        gpt2.add_hook("blocks.0.hook_attn_in", identity)
    # TransformerLens' run_with_hooks takes a hook on hook_attn_in without set_use_attn_in, and never calls it
    with pytest.raises(AssertionError, match="ln1.hook_normalized"):
        gpt2.run_with_hooks(PROMPT, fwd_hooks=[("blocks.1.hook_attn_in", identity)])
    with pytest.raises(AssertionError, match="batch of 1"):
        batch_cache(gpt2).remove_batch_dim()
    # TransformerLens keeps row 0 of a batch without a word here; hooked refuses it, with the same error type
    with pytest.raises(AssertionError, match="batch of 1"):
        gpt2.run_with_cache(gpt2.to_tokens([PROMPT, "Hello world"]), remove_batch_dim=True)
    tokens = gpt2.to_tokens(PROMPT)[0]
    no_tokenizer = hooked.HookedTransformer(gpt2.cfg)  # ids alone: the message gives the id
    with pytest.raises(AssertionError, match=r"prompt: \(id 7\)"):
        no_tokenizer.get_token_position(7, tokens[tokens != 7])


# ----------------------------------------------------------------------------- default_prepend_bos=False
@pytest.fixture(scope="module")
def without_bos(gpt2_dir, tl):
    """hooked loaded with `default_prepend_bos=False` (both ways), and TransformerLens with its config's flag off."""
    ours = [
        hooked.HookedTransformer.from_pretrained(gpt2_dir, default_prepend_bos=False),
        hooked.load(gpt2_dir),
    ]
    ours[1].cfg.default_prepend_bos = False
    tl.cfg.default_prepend_bos = False
    yield ours, tl
    tl.cfg.default_prepend_bos = True


@pytest.mark.unchecked
def test_default_prepend_bos_false_adds_no_bos(without_bos):
    models, tl = without_bos
    bos = tl.tokenizer.bos_token_id
    batch = [PROMPT, "Hello world"]
    for ours in models:
        assert ours.cfg.default_prepend_bos is False
        tokens = ours.to_tokens(PROMPT)
        assert tokens[0, 0] != bos and torch.equal(tokens, tl.to_tokens(PROMPT))
        assert torch.equal(ours.to_tokens(batch), tl.to_tokens(batch))
        assert ours.to_str_tokens(PROMPT) == tl.to_str_tokens(PROMPT)
        assert ours.to_str_tokens(batch) == tl.to_str_tokens(batch)
        for mode in ("first", "last"):
            for token in (" John", " Mary", "When"):
                assert ours.get_token_position(token, PROMPT, mode) == tl.get_token_position(token, PROMPT, mode)
        assert ours.get_token_position("When", PROMPT) == 0  # no BOS before the first word
        for model in (ours, tl):  # the BOS is not in the prompt
            with pytest.raises(AssertionError):
                model.get_token_position(bos, PROMPT)
        # prepend_bos=True still adds it, as there
        assert torch.equal(ours.to_tokens(PROMPT, prepend_bos=True), tl.to_tokens(PROMPT, prepend_bos=True))
        assert ours.get_token_position(bos, PROMPT, prepend_bos=True) == 0


def test_default_prepend_bos_false_forward_equals_transformer_lens(without_bos):
    (_, ours), tl = without_bos  # hooked.load: unprocessed weights, as the reference
    logits = ours(PROMPT)
    assert logits.shape[1] == len(tl.to_str_tokens(PROMPT))
    torch.testing.assert_close(logits, tl(PROMPT), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours(PROMPT, return_type="loss"), tl(PROMPT, return_type="loss"), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- from hooked import patching
def test_from_hooked_import_patching_has_transformer_lens_functions():
    from hooked import patching

    theirs = {
        name
        for name, value in vars(tl_patching).items()
        if inspect.isfunction(value) and value.__module__ == tl_patching.__name__ and not name.startswith("_")
    }
    assert len(theirs) > 10 and patching is hooked.tl_patching
    assert sorted(name for name in theirs if not callable(getattr(patching, name, None))) == []
