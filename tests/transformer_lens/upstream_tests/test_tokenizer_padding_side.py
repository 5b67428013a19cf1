"""TransformerLens tests/unit/test_tokenizer_padding_side.py, ported.

Regression test for TransformerLens issue #801: a tokenizer reloaded inside `get_tokenizer_with_bos()` got
Hugging Face's default `padding_side` back, discarding the user's "left".

Changes to the upstream file:
- `AutoTokenizer.from_pretrained("gpt2")` -> the suite checkpoint's tokenizer (conftest.py).
- hooked has no `get_tokenizer_with_bos` (it never reloads a tokenizer: `set_tokenizer` copies the
  `tokenizers.Tokenizer` and adds BOS itself), so both tests go through the call that uses it in
  TransformerLens, `model.set_tokenizer(tokenizer)`, and check the model's tokenizer keeps "left" and pads
  on the left; the second also checks the caller's tokenizer object is left as it was.
No differences.
"""

import pytest
from transformers import AutoTokenizer

from hooked import HookedTransformer
from tests.transformer_lens.upstream_tests.conftest import checkpoint

DIFFERENCES: list[str] = []


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    """A fresh tokenizer of the checkpoint. add_bos_token defaults to False."""
    return AutoTokenizer.from_pretrained(checkpoint(1))


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained_no_processing(checkpoint(1))


def test_padding_side_left_is_preserved(gpt2_tokenizer, model):
    """User-set padding_side='left' must be preserved through set_tokenizer()."""
    gpt2_tokenizer.padding_side = "left"
    model.set_tokenizer(gpt2_tokenizer)
    result = model.tokenizer
    assert result.padding_side == "left", f"padding_side='left' was reset to '{result.padding_side}' after reload"
    tokens = model.to_tokens(["Hello world!", "Hi"])
    assert tokens[1, 0] == result.pad_token_id and tokens[1, -1] != result.pad_token_id


def test_padding_side_preserved_when_already_has_bos(model):
    """With add_bos_token already True, the caller's tokenizer keeps its padding side."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint(1), add_bos_token=True)
    tokenizer.padding_side = "left"
    model.set_tokenizer(tokenizer)
    assert tokenizer.padding_side == "left"
    assert model.tokenizer.padding_side == "left"
    assert model.to_tokens("Hello")[0, 0] == model.tokenizer.bos_token_id
    assert model.to_tokens("Hello")[0, 1] != model.tokenizer.bos_token_id
