"""Tokenization from the checkpoint's own files, BOS handling and left padding."""

import pytest
import torch


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
    assert gpt2.to_str_tokens(tokens) == gpt2.to_str_tokens(text, prepend_bos=False)  # [1, pos] squeezes, as TransformerLens


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
    torch.testing.assert_close(from_text[0, -alone.shape[1]:], alone[0], rtol=0, atol=1e-5)


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
    """The mask is read from the ids (leading pad ids), so a clone, a move, a slice or a saved copy of
    `to_tokens`' output gives every row the same logits as its prompt alone."""
    prompts = ["Hi", "When Mary and John went to the store", "The capital"]
    tokens = gpt2.to_tokens(prompts)
    torch.save(tokens, tmp_path / "tokens.pt")
    with torch.no_grad():
        alone = [gpt2(prompt)[0] for prompt in prompts]
        for travelled in (tokens.clone(), tokens.to("cpu", copy=True), torch.load(tmp_path / "tokens.pt"), tokens[[0, 2]].contiguous()):
            logits = gpt2(travelled)
            rows = range(3) if travelled.shape[0] == 3 else (0, 2)
            for row, prompt_logits in zip(range(travelled.shape[0]), [alone[i] for i in rows]):
                torch.testing.assert_close(logits[row, -prompt_logits.shape[0]:], prompt_logits, rtol=0, atol=1e-5)


def test_mask_from_ids_follows_transformer_lens_rules(gpt2):
    """TransformerLens 3.9 utils.get_attention_mask (left padding): the leading run of pad ids is padding,
    and where BOS is the pad id and BOS is prepended, the run's last id is the BOS (a real token)."""
    pad = gpt2.tokenizer.pad_token_id
    assert pad == gpt2.tokenizer.bos_token_id  # GPT-2: <|endoftext|> is both
    x, y = (pad + 5) % gpt2.cfg.d_vocab, (pad + 7) % gpt2.cfg.d_vocab
    tokens = torch.tensor([[pad, pad, pad, x, y], [pad, x, y, pad, x], [x, y, x, y, x]])
    with_bos = gpt2.tokenizer.mask_for(tokens, prepend_bos=True)
    assert with_bos.tolist() == [[False, False, True, True, True], [True] * 5, [True] * 5]
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
