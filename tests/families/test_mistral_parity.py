"""Mistral against transformers 5.24's MistralForCausalLM and TransformerLens 3.9's Mistral: the sliding window.

Prompts are longer than the window (17 columns against windows of 4 and 6), so every query past the window
loses keys: the forward (SDPA and eager paths), a left-padded batch, and greedy generation with a KV cache
(prompts longer than the window, batches left-padded) must all mask exactly as transformers 5.24's
`masking_utils.sliding_window_causal_mask_function` (key j visible to query i iff i - window < j <= i, in
columns). Float32 is bit-exact (max abs difference 0.0: the same operations in the same order as
transformers 5.24 models/mistral/modeling_mistral.py, the window a boolean mask on both sides).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip

import hooked
from hooked import layers
from hooked.models.llama import MistralConfig as HookedMistralConfig
from tests.families.parity import (
    build_checkpoints,
    check_bf16_within_spread,
    check_bit_exact,
    check_greedy_generation,
    check_left_padded_batch,
    check_sweep_equals_each_alone,
    edited_checkpoint,
    hf_reference,
    random_tokens,
    tl_model,
)
from tests.families.test_llama_parity import GOLDEN_HOOK_NAMES, check_against_transformer_lens

VOCAB = 96

CASES = {
    # GQA 4 -> 2, d_head = d_model / n_heads, untied, window 4
    "window": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=80,
        num_hidden_layers=2,
        sliding_window=4,
    ),
    # multi-query, d_head 16 != 48 / 4, tied, rope_theta 1e6, window 6
    "window_mqa_tied": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        sliding_window=6,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    # no window (Mistral 7B v0.2 / v0.3): plain causal
    "no_window": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=80,
        num_hidden_layers=2,
        sliding_window=None,
    ),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    configs = {name: transformers.MistralConfig(vocab_size=VOCAB, **kwargs) for name, kwargs in CASES.items()}
    return build_checkpoints(tmp_path_factory, configs, transformers.MistralForCausalLM)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager"])
def test_float32_bit_exact(dirs, models, case, path):
    model = models[case]
    assert type(model) is hooked.models.Mistral
    assert model.cfg.sliding_window == CASES[case]["sliding_window"]
    reference = hf_reference(dirs[case], transformers.MistralForCausalLM, path)
    check_bit_exact(model, reference, random_tokens(3, 17), eager=path == "eager")


def test_pattern_is_zero_outside_the_window_only(models):
    """Explicit: query i gives weight to keys i - window < j <= i and to no other; without the window the
    same weights give other logits (the window is not a no-op at these lengths)."""
    model = models["window"]
    tokens = random_tokens(2, 12)
    logits, cache = model.run_with_cache(tokens)
    query, key = torch.arange(12)[:, None], torch.arange(12)[None, :]
    inside = (key <= query) & (key > query - 4)
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer]
        assert torch.all(pattern[..., ~inside] == 0) and torch.all(pattern[..., inside] > 0), layer
    unwindowed = hooked.models.Mistral(dataclasses.replace(model.cfg, sliding_window=None))
    unwindowed.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (unwindowed(tokens) - logits).abs().max() > 1e-4
        short = tokens[:, :4]  # no query reaches past the window: the same model
        assert torch.equal(unwindowed(short), model(short))


def test_bfloat16_within_transformers_own_spread(dirs):
    tokens = random_tokens(2, 13)
    for case in ("window", "window_mqa_tied"):
        check_bf16_within_spread(dirs[case], transformers.MistralForCausalLM, tokens)


def test_left_padded_batch(dirs, models):
    """Prompts of 13, 5 and 9 tokens against windows of 4 and 6: the window counts columns of the prompt."""
    for case in ("window", "window_mqa_tied"):
        check_left_padded_batch(
            models[case], hf_reference(dirs[case], transformers.MistralForCausalLM, "sdpa"), [13, 5, 9]
        )


@pytest.mark.parametrize("lengths", [[9], [13, 5, 9]])
@pytest.mark.parametrize("case", ["window", "no_window"])
def test_greedy_generation_equals_transformers(dirs, models, case, lengths):
    """Prompts longer than the window, 12 new tokens: every decode step's window slides over the KV cache."""
    hf = hf_reference(dirs[case], transformers.MistralForCausalLM, "sdpa")
    check_greedy_generation(models[case], hf, lengths)


def test_every_hook_equals_transformer_lens(dirs, models):
    """TransformerLens 3.9 maps Mistral's sliding_window to local attention (attn_types "local", window_size)."""
    for case in ("window", "no_window"):
        tl = tl_model(dirs[case], transformers.MistralForCausalLM, "convert_mistral_weights")
        assert tl.cfg.window_size == CASES[case]["sliding_window"]
        check_against_transformer_lens(models[case], tl, random_tokens(2, 15))


def test_golden_hook_names(models):
    assert models["window"].hook_names == GOLDEN_HOOK_NAMES


def test_sweep_on_a_left_padded_batch_equals_each_alone(models):
    """A sweep reads the window from the model (block_inputs), as the forward does."""
    tokens = random_tokens(3, 11, seed=4)
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0
    mask[2, :6] = 0
    check_sweep_equals_each_alone(models["window"], tokens, mask)


def test_triton_kernel_serves_the_window(models):
    """The Triton kernel (interpreter) applies the window: forced, a left-padded batch longer than the window
    gives SDPA's logits within float32 rounding; a forward no longer than the window leaves the mask unwindowed."""
    model = models["window"]
    tokens = random_tokens(2, 17, seed=5)
    mask = torch.ones_like(tokens)
    mask[1, :4] = 0
    real = mask.bool()
    with torch.no_grad():
        reference = model(tokens, attention_mask=mask)
        with layers.attention_backend("triton"):
            logits = model(tokens, attention_mask=mask)
    torch.testing.assert_close(logits[real], reference[real], rtol=0, atol=3e-5)
    mask = layers.AttentionMask(None, 4, 4)
    assert mask.windowed(4) is mask and mask.windowed(None) is mask and mask.windowed(3).window == 3


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize(
    "change, message",
    [
        ({"sliding_window": 0}, "sliding_window 0 must be a whole number in 1..max_position_embeddings"),
        ({"sliding_window": -2}, "sliding_window -2"),
        ({"sliding_window": 10**6}, r"sliding_window 1000000 .*max_position_embeddings \(131072\)"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope'"),
    ],
)
def test_unsupported_config_is_refused(tmp_path, dirs, change, message):
    with pytest.raises(ValueError, match=message):
        hooked.load(edited_checkpoint(dirs["window"], tmp_path / "edited", **change))


def test_a_config_without_the_key_gets_transformers_default_window(dirs):
    """config.json without "sliding_window": transformers' MistralConfig uses 4096, and so does hooked."""
    written = json.loads((dirs["window"] / "config.json").read_text())
    del written["sliding_window"]
    assert transformers.MistralConfig(**written).sliding_window == 4096
    assert HookedMistralConfig.from_hf(written).sliding_window == 4096
    assert HookedMistralConfig.from_hf({**written, "sliding_window": None}).sliding_window is None
    # transformers' Mistral has no biases whatever the config says; neither has hooked's
    assert not HookedMistralConfig.from_hf({**written, "attention_bias": True}).attention_bias
