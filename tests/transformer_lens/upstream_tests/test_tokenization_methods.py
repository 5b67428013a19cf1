"""TransformerLens tests/integration/test_tokenization_methods.py, ported.

Changes to the upstream file:
- model: `HookedTransformer.from_pretrained("solu-1l")` -> `hooked.HookedTransformer.from_pretrained` of a
  random one-layer GPT-2 checkpoint (conftest.py); imports from `hooked`. `reference` is TransformerLens 3.9's
  HookedTransformer on the same checkpoint and tokenizer (`tests.transformer_lens.tl_reference.tl_gpt2`).
- Numbers of solu-1l's tokenizer (token ids, `d_vocab` 48262, its `name_or_path`, the 1027 tokens of the
  untruncated text, `d_model` 512) are replaced by what `reference` gives for the same call.
- `test_set_tokenizer_lazy`: `AutoTokenizer.from_pretrained("gpt2")` -> the checkpoint's
  tokenizer, and `d_vocab` 50256 -> its vocabulary size. The glitch token " SolidGoldMagikarp" (43453) is not
  one token of that tokenizer; "biomolecules" (a single token there) is used instead, its id from `reference`.
- `test_to_string_multiple`: the ids of solu-1l's vocabulary -> ids of this one (the first row starts with
  BOS as upstream); the expected strings are `reference.to_string` of the same ids.
- `test_get_token_position_not_found`: see DIFFERENCES.
"""

import pytest
import torch
from torch import Size, equal, tensor
from transformers import AutoTokenizer

from hooked import HookedTransformer, HookedTransformerConfig
from tests.transformer_lens.tl_reference import tl_gpt2
from tests.transformer_lens.upstream_tests.conftest import checkpoint

DIFFERENCES = [
    "test_get_token_position_not_found: the error (an `AssertionError`, as there, and a `ValueError`) says "
    'TransformerLens\' message, "The token does not occur in the prompt", then which token '
    "(\": 'biomolecules' (id 1)\"); the port checks that the message begins with TransformerLens' one.",
]

model = HookedTransformer.from_pretrained(checkpoint(1))
reference = tl_gpt2(checkpoint(1), fold_ln=True)


def test_set_tokenizer_during_initialization():
    assert model.tokenizer is not None and model.tokenizer.name_or_path == str(checkpoint(1)), (
        "initialized with expected tokenizer"
    )
    assert model.cfg.d_vocab == reference.cfg.d_vocab, "expected d_vocab"


def test_set_tokenizer_lazy():
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=10, n_ctx=1024, d_head=1, act_fn="relu", d_vocab=reference.cfg.d_vocab
    )
    model2 = HookedTransformer(cfg)
    original_tokenizer = model2.tokenizer
    assert original_tokenizer is None, "initialize without tokenizer"
    model2.set_tokenizer(AutoTokenizer.from_pretrained(checkpoint(1)))
    tokenizer = model2.tokenizer
    assert tokenizer is not None and tokenizer.name_or_path == str(checkpoint(1)), "set tokenizer"
    assert model2.to_single_token("biomolecules") == reference.to_single_token("biomolecules"), (
        "Glitch token didn't tokenize properly"
    )
    assert model2.to_string([reference.to_single_token("biomolecules")]) == "biomolecules", (
        "Glitch token didn't detokenize properly"
    )


def test_to_tokens_default():
    s = "Hello, world!"
    tokens = model.to_tokens(s)
    assert equal(tokens, reference.to_tokens(s).to(model.cfg.device)), "creates a tensor of tokens with BOS"


def test_to_tokens_without_bos():
    s = "Hello, world!"
    tokens = model.to_tokens(s, prepend_bos=False)
    assert equal(tokens, reference.to_tokens(s, prepend_bos=False).to(model.cfg.device)), "creates a tensor without BOS"


@pytest.mark.skipif(
    torch.cuda.is_available() or torch.backends.mps.is_available(),
    reason="Test not relevant when running on GPU",
)
def test_to_tokens_device():
    s = "Hello, world!"
    tokens1 = model.to_tokens(s, move_to_device=False)
    tokens2 = model.to_tokens(s, move_to_device=True)
    assert equal(tokens1, tokens2), "move to device has no effect when running tests on CPU"


def test_to_tokens_truncate():
    assert model.cfg.n_ctx == 1024, "verify assumed context length"
    s = "@ " * 1025
    tokens1 = model.to_tokens(s)
    tokens2 = model.to_tokens(s, truncate=False)
    assert len(tokens1[0]) == 1024, "truncated by default"
    assert len(tokens2[0]) == len(reference.to_tokens(s, truncate=False)[0]) > 1024, "not truncated"


def test_to_string_from_to_tokens_without_bos():
    s = "Hello, world!"
    tokens = model.to_tokens(s, prepend_bos=False)
    s2 = model.to_string(tokens[0])
    assert s == s2, "same string when converted back to string"


def test_to_string_multiple():
    ids = tensor([[model.tokenizer.bos_token_id, 327], [365, 12]])
    s_list = model.to_string(ids)
    assert s_list == reference.to_string(ids) and len(s_list) == 2, "can handle list of lists"


def test_to_str_tokens_default():
    s_list = model.to_str_tokens(" SolidGoldMagikarp")
    assert s_list == reference.to_str_tokens(" SolidGoldMagikarp"), "not a glitch token"
    assert s_list[0] == "<|endoftext|>" and len(s_list) > 2


def test_to_str_tokens_without_bos():
    s_list = model.to_str_tokens(" SolidGoldMagikarp", prepend_bos=False)
    assert s_list == reference.to_str_tokens(" SolidGoldMagikarp", prepend_bos=False), "without BOS"
    assert "".join(s_list) == " SolidGoldMagikarp"


def test_to_single_token():
    token = model.to_single_token("biomolecules")
    assert token == reference.to_single_token("biomolecules"), "single token"


def test_to_single_str_tokent():
    s = model.to_single_str_token(reference.to_single_token("biomolecules"))
    assert s == "biomolecules"


def test_get_token_position_not_found():
    single = "biomolecules"
    input = "There were some biomolecules"
    with pytest.raises(AssertionError) as exc_info:
        model.get_token_position(single, input)
    assert str(exc_info.value).startswith("The token does not occur in the prompt"), "assertion error"  # DIFFERENCES
    assert "biomolecules" in str(exc_info.value)
    with pytest.raises(AssertionError, match="The token does not occur in the prompt"):
        reference.get_token_position(single, input)


def test_get_token_position_str():
    single = " some"
    input = "There were some biomolecules"
    pos = model.get_token_position(single, input)
    assert pos == 3, "first position"


def test_get_token_position_str_without_bos():
    single = " some"
    input = "There were some biomolecules"
    pos = model.get_token_position(single, input, prepend_bos=False)
    assert pos == 2, "without BOS"


def test_get_token_position_int_pos():
    single = 2
    input = tensor([2.0, 3, 4])
    pos1 = model.get_token_position(single, input)
    pos2 = model.get_token_position(single, input, prepend_bos=False)
    assert pos1 == 0, "first position"
    assert pos2 == 0, "no effect from BOS when using tensor as input"


def test_get_token_position_int_pos_last():
    single = 2
    input = tensor([2.0, 3, 4, 2, 5])
    pos1 = model.get_token_position(single, input, mode="last")
    assert pos1 == 3, "last position"


def test_get_token_position_int_1_pos():
    single = 2
    input = tensor([[2.0, 3, 4]])
    pos = model.get_token_position(single, input)
    assert pos == 0, "first position"


def test_tokens_to_residual_directions():
    res_dir = model.tokens_to_residual_directions(model.to_tokens(""))
    assert (
        res_dir.shape
        == reference.tokens_to_residual_directions(reference.to_tokens("")).shape
        == Size([model.cfg.d_model])
    ), ""
