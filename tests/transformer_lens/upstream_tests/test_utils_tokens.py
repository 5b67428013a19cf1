"""TransformerLens tests/integration/test_utils_tokens.py, ported.

Changes to the upstream file:
- model: `HookedTransformer.from_pretrained("solu-1l")` -> `hooked.HookedTransformer.from_pretrained` of a
  random one-layer GPT-2 checkpoint (conftest.py); `utils` is `hooked.utils`.
- `test_test_prompt`: the tokenized prompt and answer that solu-1l's tokenizer gives were hard-coded; they are
  replaced by what TransformerLens 3.9's `utils.test_prompt` prints for a HookedTransformer on the same
  checkpoint and tokenizer (`tests.transformer_lens.tl_reference.tl_gpt2`), and the answer's tokens are checked to
  rebuild the answer with, or without, the space.
No differences.
"""

from unittest import mock

import numpy as np
import pytest
import torch

import hooked.utils as utils
from hooked import HookedTransformer
from tests.transformer_lens.tl_reference import tl_gpt2
from tests.transformer_lens.upstream_tests.conftest import checkpoint

DIFFERENCES: list[str] = []

model = HookedTransformer.from_pretrained(checkpoint(1))
reference = tl_gpt2(checkpoint(1), fold_ln=True)


def tl_printed_tokens(prompt, answer, prepend_space_to_answer):
    """What TransformerLens 3.9's `utils.test_prompt` prints first: ("Tokenized prompt:", ...), ("Tokenized
    answer:", ...)."""
    import transformer_lens.utils as tl_utils

    with mock.patch("builtins.print") as printed:
        tl_utils.test_prompt(prompt, answer, reference, prepend_space_to_answer=prepend_space_to_answer)
    return printed.mock_calls[0].args[1], printed.mock_calls[1].args[1]


@pytest.fixture
def nested_list_1():
    return [1]


@pytest.fixture
def nested_list_1x1():
    return [[6]]


@pytest.fixture
def nested_list_1x3():
    return [[1, 2, 3]]


def test_to_str_tokens(nested_list_1, nested_list_1x1, nested_list_1x3):
    tensor_1_to_str_tokens = model.to_str_tokens(torch.tensor(nested_list_1))
    assert isinstance(tensor_1_to_str_tokens, list)
    assert len(tensor_1_to_str_tokens) == 1
    assert isinstance(tensor_1_to_str_tokens[0], str)

    tensor_1x1_to_str_tokens = model.to_str_tokens(torch.tensor(nested_list_1x1))
    assert isinstance(tensor_1x1_to_str_tokens, list)
    assert len(tensor_1x1_to_str_tokens) == 1
    assert isinstance(tensor_1x1_to_str_tokens[0], str)

    ndarray_1_to_str_tokens = model.to_str_tokens(np.array(nested_list_1))
    assert isinstance(ndarray_1_to_str_tokens, list)
    assert len(ndarray_1_to_str_tokens) == 1
    assert isinstance(ndarray_1_to_str_tokens[0], str)

    ndarray_1x1_to_str_tokens = model.to_str_tokens(np.array(nested_list_1x1))
    assert isinstance(ndarray_1x1_to_str_tokens, list)
    assert len(ndarray_1x1_to_str_tokens) == 1
    assert isinstance(ndarray_1x1_to_str_tokens[0], str)

    single_int_to_single_str_token = model.to_single_str_token(3)
    assert isinstance(single_int_to_single_str_token, str)

    squeezable_tensor_to_str_tokens = model.to_str_tokens(torch.tensor(nested_list_1x3))
    assert isinstance(squeezable_tensor_to_str_tokens, list)
    assert len(squeezable_tensor_to_str_tokens) == 3
    assert isinstance(squeezable_tensor_to_str_tokens[0], str)
    assert isinstance(squeezable_tensor_to_str_tokens[1], str)
    assert isinstance(squeezable_tensor_to_str_tokens[2], str)

    squeezable_ndarray_to_str_tokens = model.to_str_tokens(np.array(nested_list_1x3))
    assert isinstance(squeezable_ndarray_to_str_tokens, list)
    assert len(squeezable_ndarray_to_str_tokens) == 3
    assert isinstance(squeezable_ndarray_to_str_tokens[0], str)
    assert isinstance(squeezable_ndarray_to_str_tokens[1], str)
    assert isinstance(squeezable_ndarray_to_str_tokens[2], str)


@pytest.mark.parametrize(
    "prepend_space_to_answer, tokenized_prompt, tokenized_answer",
    [
        (
            True,
            *tl_printed_tokens("The circumference is the perimeter of the circ", "le.", True),
        ),
        (
            False,
            *tl_printed_tokens("The circumference is the perimeter of the circ", "le.", False),
        ),
    ],
)
@mock.patch("builtins.print")
def test_test_prompt(
    mocked_print,
    prepend_space_to_answer,
    tokenized_prompt,
    tokenized_answer,
):
    """
    Tests that utils.test_prompt produces the correct tokenization. In particular, when prepend_space_to_answer =
    False, the last token of the prompt
    and the first answer token should not be turned into one token (e.g. 'circ' and 'le' don't become 'circle'). See https://github.com/TransformerLensOrg/TransformerLens/issues/271
    for a more detailed explanation.
    """
    utils.test_prompt(
        "The circumference is the perimeter of the circ",
        "le.",
        model,
        prepend_space_to_answer=prepend_space_to_answer,
    )

    printed_tokenized_prompt = mock.call("Tokenized prompt:", tokenized_prompt)
    printed_tokenized_answer = mock.call("Tokenized answer:", tokenized_answer)

    assert mocked_print.mock_calls[0] == printed_tokenized_prompt
    assert mocked_print.mock_calls[1] == printed_tokenized_answer
    # added: the answer's tokens rebuild the answer, with the space only when asked for (as upstream's lists)
    assert "".join(tokenized_answer) == (" le." if prepend_space_to_answer else "le.")
    assert tokenized_prompt[0] == model.tokenizer.bos_token
