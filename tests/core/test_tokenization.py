"""Tokenization from the checkpoint's own files, BOS handling, left padding and the unknown token."""

import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooked
from hooked import utils


def test_to_tokens_prepends_bos_by_default(gpt2):
    tokens = gpt2.to_tokens("When Mary and John went to the store")
    assert tokens.shape[0] == 1
    assert tokens[0, 0].item() == gpt2.tokenizer.bos_token_id
    without = gpt2.to_tokens("When Mary and John went to the store", prepend_bos=False)
    assert torch.equal(without[0], tokens[0, 1:])


def test_round_trip_through_strings(gpt2):
    text = "When Mary and John went to the store, John gave a drink to"
    tokens = gpt2.to_tokens(text, prepend_bos=False)
    assert gpt2.to_string(tokens[0]) == text
    assert "".join(gpt2.to_str_tokens(text, prepend_bos=False)) == text
    assert gpt2.to_str_tokens(text)[0] == "<|endoftext|>"
    assert gpt2.to_str_tokens(tokens) == gpt2.to_str_tokens(
        text, prepend_bos=False
    )  # [1, pos] squeezes, as TransformerLens


def test_to_single_token(gpt2):
    mary = gpt2.to_single_token(" Mary")
    assert gpt2.to_string([mary]) == " Mary"
    with pytest.raises(ValueError, match="not one"):
        gpt2.to_single_token(" Mary and John")


def test_batches_are_left_padded_with_a_mask_the_model_finds(gpt2):
    prompts = ["Hi", "When Mary and John went to the store"]
    tokens = gpt2.to_tokens(prompts)
    assert tokens[0, 0] == gpt2.tokenizer.pad_token_id and tokens[1, 0] == gpt2.tokenizer.bos_token_id
    with torch.no_grad():
        from_tokens = gpt2(tokens)
        from_text = gpt2(prompts)
        alone = gpt2("Hi")
    assert torch.equal(from_tokens, from_text)
    torch.testing.assert_close(from_text[0, -alone.shape[1] :], alone[0], rtol=0, atol=1e-5)


def test_explicit_attention_mask_gives_the_same_as_the_prompt_alone(gpt2):
    alone = gpt2.to_tokens("John gave a drink to", prepend_bos=False)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), alone], dim=1)
    mask = torch.cat([torch.zeros(1, 4), torch.ones_like(alone)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(gpt2(padded, attention_mask=mask)[:, 4:], gpt2(alone), rtol=0, atol=1e-5)


def test_loss_ignores_padding(gpt2):
    prompts = ["Hi there", "When Mary and John went to the store"]
    with torch.no_grad():
        per_prompt = [gpt2(p, return_type="loss") for p in prompts]
        logits, loss = gpt2(prompts[1], return_type="both")
    assert torch.equal(loss, per_prompt[1])
    assert logits.shape[-1] == gpt2.cfg.d_vocab


def test_a_padded_batch_keeps_its_mask_however_the_tensor_travels(gpt2, tmp_path):
    """The mask is read from the ids (leading pad ids), so a clone, a move, a slice that keeps the longest
    row or a saved copy of `to_tokens`' output gives every row the same logits as its prompt alone."""
    prompts = ["Hi", "When Mary and John went to the store", "The capital"]
    tokens = gpt2.to_tokens(prompts)
    torch.save(tokens, tmp_path / "tokens.pt")
    with torch.no_grad():
        alone = [gpt2(prompt)[0] for prompt in prompts]
        for travelled in (
            tokens.clone(),
            tokens.to("cpu", copy=True),
            torch.load(tmp_path / "tokens.pt"),
            tokens[[2, 1]].contiguous(),
        ):
            logits = gpt2(travelled)
            rows = range(3) if travelled.shape[0] == 3 else (2, 1)
            for row, prompt_logits in zip(range(travelled.shape[0]), [alone[i] for i in rows], strict=True):
                torch.testing.assert_close(logits[row, -prompt_logits.shape[0] :], prompt_logits, rtol=0, atol=1e-5)


def test_mask_from_ids_follows_transformer_lens_rules(gpt2):
    """TransformerLens 3.9 utils.get_attention_mask (left padding): the leading run of pad ids is padding,
    and where BOS is the pad id and BOS is prepended, the run's last id is the BOS (a real token)."""
    pad = gpt2.tokenizer.pad_token_id
    assert pad == gpt2.tokenizer.bos_token_id  # GPT-2: <|endoftext|> is both
    x, y = (pad + 5) % gpt2.cfg.d_vocab, (pad + 7) % gpt2.cfg.d_vocab
    tokens = torch.tensor([[pad, pad, pad, x, y], [pad, x, y, pad, x], [x, y, x, y, x]])
    with_bos = gpt2.tokenizer.mask_for(tokens, prepend_bos=True, strict=False)
    assert with_bos.tolist() == [[False, False, True, True, True], [True] * 5, [True] * 5]
    # hooked's strict reading: a row without the BOS beside padded rows could be ids made without BOS, whose
    # pads are all padding (the last not a BOS), so the ids cannot say; rows that all begin with it read as above
    with pytest.raises(ValueError, match="row 2 does not begin with the BOS"):
        gpt2.tokenizer.mask_for(tokens, prepend_bos=True)
    assert gpt2.tokenizer.mask_for(tokens[:2], prepend_bos=True).tolist() == with_bos[:2].tolist()
    without_bos = gpt2.tokenizer.mask_for(tokens, prepend_bos=False)
    assert without_bos.tolist() == [[False, False, False, True, True], [False, True, True, True, True], [True] * 5]
    assert gpt2.tokenizer.mask_for(tokens[2:], prepend_bos=True) is None  # unpadded: no mask at all


def test_loss_of_a_padded_batch_counts_each_prompt_real_tokens_only(gpt2):
    prompts = ["Hi there", "When Mary and John went to the store"]
    with torch.no_grad():
        per_prompt = [gpt2(p, return_type="loss") for p in prompts]
        padded = gpt2(prompts, return_type="loss")
    lengths = torch.tensor([gpt2.to_tokens(p).shape[1] - 1 for p in prompts], dtype=torch.float32)  # targets per prompt
    expected = (torch.stack(per_prompt) * lengths).sum() / lengths.sum()
    torch.testing.assert_close(padded, expected, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- a leading BOS is not padding
# GPT-2's BOS, EOS and pad are one id: a prompt that begins with <|endoftext|> starts with it twice. Only a
# padded batch has padding, so those ids are real; transformers attends to both with an all-ones mask.
@pytest.fixture(scope="module")
def hf_gpt2(gpt2_dir):
    import transformers

    return transformers.GPT2LMHeadModel.from_pretrained(
        gpt2_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def assert_matches_transformers(model, hf, tokens: torch.Tensor) -> None:
    """Logits and 8 greedy tokens of the ids without a mask equal transformers' with an all-ones mask."""
    ones = torch.ones_like(tokens)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens, attention_mask=ones).logits, rtol=0, atol=1e-5)
        reference = hf.generate(
            tokens,
            attention_mask=ones,
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=model.tokenizer.pad_token_id,
        )
    assert torch.equal(model.generate(tokens, 8, stop_at_eos=False), reference)


def test_a_prompt_that_begins_with_the_bos_token_matches_transformers(gpt2, hf_gpt2):
    bos = gpt2.tokenizer.bos_token_id
    tokens = gpt2.to_tokens("<|endoftext|>Hello")
    assert tokens[0, :2].tolist() == [bos, bos]
    assert_matches_transformers(gpt2, hf_gpt2, tokens)
    with torch.no_grad():
        assert torch.equal(gpt2("<|endoftext|>Hello"), gpt2(tokens))  # the text and its ids agree


def test_retokenized_to_string_matches_transformers(gpt2, hf_gpt2):
    """TransformerLens' Patchscopes demo: `to_tokens(to_string(tokens))` begins with the BOS twice."""
    tokens = gpt2.to_tokens("When Mary and John went to the store")
    again = gpt2.to_tokens(gpt2.to_string(tokens[0]))
    assert again.shape[1] == tokens.shape[1] + 1 and torch.equal(again[:, 1:], tokens)
    assert_matches_transformers(gpt2, hf_gpt2, again)
    # A batch of such prompts, all as long as the longest: nothing is padding either.
    texts = gpt2.to_string(gpt2.to_tokens(["When Mary and John", "When John and Mary"]))
    batch = gpt2.to_tokens(texts)
    assert batch.shape[0] == 2 and (batch[:, :2] == gpt2.tokenizer.bos_token_id).all()
    assert_matches_transformers(gpt2, hf_gpt2, batch)


def test_padding_is_read_from_ids_only_where_the_batch_was_padded(gpt2):
    pad = gpt2.tokenizer.pad_token_id
    x, y = (pad + 5) % gpt2.cfg.d_vocab, (pad + 7) % gpt2.cfg.d_vocab
    mask_for = gpt2.tokenizer.mask_for
    for prepend_bos in (True, False):
        assert mask_for(torch.tensor([[pad, pad, pad, x, y]]), prepend_bos) is None  # one row: never padded
        assert mask_for(torch.tensor([[pad, pad, x, y], [pad, pad, y, x]]), prepend_bos) is None  # equal runs
    # Runs that differ, and one row with none but the BOS: a padded batch, read as TransformerLens does.
    padded = torch.tensor([[pad, pad, pad, x], [pad, x, y, x]])
    assert mask_for(padded, True).tolist() == [[False, False, True, True], [True] * 4]
    # Every row begins with more pad ids than the BOS: no row is unpadded, so the ids cannot tell.
    unsure = torch.tensor([[pad, pad, pad, x], [pad, pad, y, x]])
    with pytest.raises(ValueError, match=r"leading runs of \[3, 2\].*pass attention_mask="):
        mask_for(unsure, True)
    with pytest.raises(ValueError, match="pass attention_mask="):
        gpt2(unsure)
    assert mask_for(unsure, True, strict=False).tolist() == [[False, False, True, True], [False, True, True, True]]
    assert utils.get_attention_mask(gpt2.tokenizer, unsure, True).tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert utils.get_attention_mask(gpt2.tokenizer, torch.tensor([[pad, pad, x]]), True).tolist() == [[1, 1, 1]]
    with torch.no_grad():  # an explicit mask decides
        explicit = gpt2(unsure, attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
        torch.testing.assert_close(explicit[0, 2:], gpt2(unsure[0, 2:])[0], rtol=0, atol=1e-5)


def test_a_slice_of_a_padded_batch_without_its_longest_row_needs_its_mask(gpt2):
    prompts = ["Hi", "When Mary and John went to the store", "The capital of France"]
    tokens = gpt2.to_tokens(prompts)
    mask = gpt2.tokenizer(prompts, return_tensors="pt")["attention_mask"]
    with torch.no_grad():
        alone = [gpt2(prompt)[0] for prompt in prompts]
        with pytest.raises(ValueError, match="pass attention_mask="):  # rows 0 and 2, padded unequally
            gpt2(tokens[[0, 2]])
        logits = gpt2(tokens[[0, 2]], attention_mask=mask[[0, 2]])
        for row, prompt_logits in zip(range(2), (alone[0], alone[2]), strict=True):
            torch.testing.assert_close(logits[row, -prompt_logits.shape[0] :], prompt_logits, rtol=0, atol=1e-5)
        # One padded row alone reads as a prompt of pad ids, as a real one would: only its mask can say.
        torch.testing.assert_close(
            gpt2(tokens[0]), gpt2(tokens[0], attention_mask=torch.ones_like(tokens[0])), rtol=0, atol=0
        )
        row = gpt2(tokens[0], attention_mask=mask[0])[0]
        torch.testing.assert_close(row[-alone[0].shape[0] :], alone[0], rtol=0, atol=1e-5)


def test_to_tokens_refuses_a_batch_whose_ids_would_lose_their_mask(gpt2):
    """A prompt that begins with the pad token, in a batch: its ids read as padding (or hide another
    row's), so `to_tokens` says how to keep the tokenizer's mask instead of handing out ids that lie."""
    for texts, named in (
        (["When Mary and John went", "<|endoftext|>Hi"], "prompt 1 "),
        (["<|endoftext|>When Mary and John", "When Mary and John"], "prompt 0 "),
    ):
        with pytest.raises(ValueError) as raised:
            gpt2.to_tokens(texts)
        message = str(raised.value)
        assert (
            named in message
            and "'<|endoftext|>', the pad token" in message
            and "attention_mask=batch['attention_mask']" in message
        )
        batch = gpt2.tokenizer(texts, return_tensors="pt")  # the fix the message gives
        with torch.no_grad():
            logits = gpt2(batch["input_ids"], attention_mask=batch["attention_mask"])
            assert torch.equal(logits, gpt2(texts))
            for row, text in enumerate(texts):
                prompt_logits = gpt2(text)[0]
                torch.testing.assert_close(logits[row, -prompt_logits.shape[0] :], prompt_logits, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- the unknown token
def test_the_unknown_token_is_the_one_the_tokenizer_model_emits(gpt2, gpt2_dir, tmp_path):
    from tokenizers import Tokenizer, models

    from hooked.tokenizer import HookedTokenizer

    ioi = hooked.load("hooked/ioi-gpt2")  # a word-level tokenizer with <|unk|>
    assert ioi.tokenizer.unk_token == "<|unk|>" and ioi.tokenizer.unk_token_id == ioi.tokenizer.convert_tokens_to_ids(
        "<|unk|>"
    )
    assert ioi.tokenizer.encode(" Paris", add_special_tokens=False) == [ioi.tokenizer.unk_token_id]
    # GPT-2's byte-level BPE has none, though its special_tokens_map names <|endoftext|> the unk_token.
    assert gpt2.tokenizer.unk_token_id is None and gpt2.tokenizer.unk_token is None
    shutil.copy(gpt2_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "special_tokens_map.json").write_text(
        json.dumps({"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})
    )
    assert HookedTokenizer.from_directory(tmp_path, {}).unk_token_id is None
    vocab = {"[UNK]": 0, "hello": 1}
    for model in (
        models.WordPiece(vocab, unk_token="[UNK]"),
        models.WordLevel(vocab, unk_token="[UNK]"),
        models.Unigram([("[UNK]", 0.0), ("hello", -1.0)], 0, False),
    ):
        assert HookedTokenizer(Tokenizer(model), None, None, None).unk_token_id == 0, type(model).__name__
    assert (
        HookedTokenizer(Tokenizer(models.WordLevel(vocab, unk_token="<missing>")), None, None, None).unk_token_id
        is None
    )


def test_to_single_token_refuses_a_word_the_tokenizer_does_not_know():
    model = hooked.load("hooked/ioi-gpt2")
    unknown = model.tokenizer.unk_token_id
    with pytest.raises(ValueError) as raised:
        model.to_single_token(" Paris")
    message = str(raised.value)
    assert (
        "' Paris' is not in this tokenizer's vocabulary" in message
        and f"'<|unk|>' (id {unknown}) is the unknown token" in message
    )
    assert "model.tokenizer.get_vocab()" in message and f"pass the id {unknown} itself" in message
    with pytest.raises(ValueError, match="unknown token"):
        model.get_token_position(" Paris", "When Mary and John went to the store")
    assert model.to_single_token("<|unk|>") == unknown  # the unknown token written out is that token
    with pytest.raises(ValueError, match="' Paris' is not in this tokenizer's vocabulary"):
        utils.test_prompt("The capital of France is", "Paris", model, print_details=False)
    assert model.to_single_token(" Mary") == model.tokenizer.convert_tokens_to_ids("Mary")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 4), min_size=1, max_size=4), extra=st.integers(0, 2), seed=st.integers(0, 9))
def test_any_leading_pad_runs_are_read_as_the_rule_says(gpt2, lengths, extra, seed):
    """Rows of `lengths[i]` non-pad tokens after a run of pad ids (GPT-2: BOS = EOS = pad), all as wide as
    the longest plus `extra`: equal runs (or one row) are never masked; runs that differ with a row of one
    pad id are a left-padded batch whose BOS is the last id of each run (TransformerLens' rule); runs that
    all exceed one id cannot be told apart from prompts that begin with pad ids, and a row of none (no BOS)
    from ids made without BOS, whose last pad is padding: both raise."""
    pad = gpt2.tokenizer.pad_token_id
    width = max(lengths) + extra
    tokens = torch.randint(0, gpt2.cfg.d_vocab, (len(lengths), width), generator=torch.Generator().manual_seed(seed))
    tokens[tokens == pad] = (pad + 1) % gpt2.cfg.d_vocab
    runs = [width - n for n in lengths]
    for row, run in enumerate(runs):
        tokens[row, :run] = pad
    with torch.no_grad():
        if len(set(runs)) == 1:
            torch.testing.assert_close(
                gpt2(tokens), gpt2(tokens, attention_mask=torch.ones_like(tokens)), rtol=0, atol=0
            )
        elif min(runs) != 1:
            with pytest.raises(ValueError, match="pass attention_mask="):
                gpt2(tokens)
        else:
            real = torch.arange(width)[None] >= (torch.tensor(runs)[:, None] - 1).clamp(min=0)
            torch.testing.assert_close(gpt2(tokens), gpt2(tokens, attention_mask=real), rtol=0, atol=0)
