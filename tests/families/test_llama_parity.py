"""Llama against transformers 5.24's LlamaForCausalLM and TransformerLens 3.9's Llama, on tiny random checkpoints.

Checkpoints are built here (norm weights and biases randomised: HF initialises them to 1 and 0, which would
hide a dropped norm or bias) over MHA, GQA and multi-query attention, head_dim != hidden_size / heads, tied and
untied embeddings, plain, "llama3" (Llama 3.1 / 3.2) and "linear" RoPE scaling, attention_bias and mlp_bias,
and pretraining_tp = 2 (which transformers 5.24 never reads: accepted, and shown equal). Float32 is bit-exact
on both attention paths (SDPA when nothing reads the pattern, eager when a hook does): hooked runs the same
operations in the same order (transformers 5.24 models/llama/modeling_llama.py), so the measured max abs
difference of the logits, every resid_pre and the final norm's output is 0.0 in every case.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip

import hooked
from hooked.models.llama import LlamaConfig as HookedLlamaConfig
from hooked.rotary import LinearScaling, Llama3Scaling
from tests.families.parity import (
    UNEMBED_POINTS,
    build_checkpoints,
    check_bf16_within_spread,
    check_bit_exact,
    check_greedy_generation,
    check_hook_shapes,
    check_left_padded_batch,
    check_sweep_equals_each_alone,
    check_zero_heads_equals_zeroing_o_proj,
    compare_with_transformer_lens,
    edited_checkpoint,
    golden_hook_names,
    hf_reference,
    ln1_head_zero,
    random_tokens,
    tl_model,
)

VOCAB = 96
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 6.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 5e5,
}

# name -> transformers LlamaConfig keyword arguments
CASES = {
    # MHA, d_head = d_model / n_heads, untied, plain RoPE (theta 1e4): the shape TransformerLens' converter reads
    "mha": dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96, num_hidden_layers=2
    ),
    # GQA 8 -> 2, 8 * 16 = 128 != d_model 64, tied, Llama 3.1 "llama3" scaling that moves every frequency band
    "gqa_llama3_tied": dict(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=80,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        max_position_embeddings=64,
        rope_parameters=LLAMA3_ROPE,
    ),
    # multi-query, d_head 32 > d_model / n_heads, "linear" x2, every bias, pretraining_tp 2
    "mqa_bias_linear": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=64,
        num_hidden_layers=2,
        attention_bias=True,
        mlp_bias=True,
        pretraining_tp=2,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    ),
    # GQA with "llama3" scaling and d_head = d_model / n_heads, untied, no biases: compared with TransformerLens too
    "gqa_llama3": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=80,
        num_hidden_layers=2,
        max_position_embeddings=64,
        rope_parameters=LLAMA3_ROPE,
    ),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    # Directory names without "llama": TransformerLens 3.9's convert_hf_model_config takes any path containing
    # "llama" for one of its named Llama checkpoints and never reads its config.json.
    configs = {name: transformers.LlamaConfig(vocab_size=VOCAB, **kwargs) for name, kwargs in CASES.items()}
    return build_checkpoints(tmp_path_factory, configs, transformers.LlamaForCausalLM)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager"])
def test_float32_bit_exact(dirs, models, case, path):
    model = models[case]
    assert type(model) is hooked.models.Llama
    reference = hf_reference(dirs[case], transformers.LlamaForCausalLM, path)
    check_bit_exact(model, reference, random_tokens(3, 17), eager=path == "eager")


def test_config_read_from_each_case(models):
    cfg = models["gqa_llama3_tied"].cfg
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.rope_theta, cfg.tie_word_embeddings) == (8, 2, 16, 5e5, True)
    assert cfg.rope_scaling == Llama3Scaling(6.0, 1.0, 4.0, 16)
    cfg = models["mqa_bias_linear"].cfg
    assert (cfg.n_kv_heads, cfg.d_head, cfg.attention_bias, cfg.mlp_bias, cfg.rope_scaling) == (
        1,
        32,
        True,
        True,
        LinearScaling(2.0),
    )
    assert models["mha"].cfg.rope_scaling is None and models["mha"].cfg.d_head == 16


def test_rope_scaling_changes_the_model(dirs, models):
    """The scaled cases are not plain RoPE in disguise: without the scaling the logits move (by far more than
    the 0.0 the parity tests allow; the random weights are small, so the logits themselves are)."""
    tokens = random_tokens(2, 17)
    for case in ("gqa_llama3_tied", "mqa_bias_linear"):
        model = models[case]
        plain = hooked.models.Llama(dataclasses.replace(model.cfg, rope_scaling=None))
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert (plain(tokens) - model(tokens)).abs().max() > 1e-4, case


def test_bfloat16_within_transformers_own_spread(dirs):
    """bf16: |hooked - transformers sdpa| <= transformers' |eager - sdpa| (measured: bit-equal, 0.0)."""
    tokens = random_tokens(2, 11)
    for case in ("gqa_llama3_tied", "mqa_bias_linear"):
        check_bf16_within_spread(dirs[case], transformers.LlamaForCausalLM, tokens)


def test_left_padded_batch(dirs, models):
    for case in ("gqa_llama3_tied", "mqa_bias_linear"):
        check_left_padded_batch(
            models[case], hf_reference(dirs[case], transformers.LlamaForCausalLM, "sdpa"), [9, 4, 6]
        )


@pytest.mark.parametrize("lengths", [[7], [9, 4, 6]])
def test_greedy_generation_equals_transformers(dirs, models, lengths):
    hf = hf_reference(dirs["gqa_llama3_tied"], transformers.LlamaForCausalLM, "sdpa")
    check_greedy_generation(models["gqa_llama3_tied"], hf, lengths)


# ----------------------------------------------------------------------------- TransformerLens 3.9
def check_against_transformer_lens(model, tl, tokens):
    """Every hook point both have holds the same tensor up to float32 rounding (tests/families/parity.py),
    TransformerLens' per-head ln1 at head 0."""
    compare_with_transformer_lens(model, tl, tokens, set(), UNEMBED_POINTS, adjust=ln1_head_zero)


def test_every_hook_equals_transformer_lens(dirs, models):
    for case in ("mha", "gqa_llama3"):
        tl = tl_model(dirs[case], transformers.LlamaForCausalLM, "convert_llama_weights")
        check_against_transformer_lens(models[case], tl, random_tokens(2, 19))


# ----------------------------------------------------------------------------- hook names and shapes
LLAMA_BLOCK = [  # the hook points of one block, in forward order
    "hook_resid_pre",
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_rot_q",
    "attn.hook_rot_k",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "attn.hook_result",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_in",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_in",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
]
GOLDEN_HOOK_NAMES = golden_hook_names([LLAMA_BLOCK] * 2)


def test_golden_hook_names(models):
    assert models["mha"].hook_names == GOLDEN_HOOK_NAMES


def test_hook_shapes_match_declared_axes(models):
    expected = check_hook_shapes(models["gqa_llama3_tied"])
    assert expected["blocks.0.attn.hook_k"] == (2, 7, 2, 16) and expected["blocks.0.attn.hook_q"] == (2, 7, 8, 16)
    assert expected["blocks.0.hook_k_input"] == (2, 7, 2, 64) and expected["blocks.0.mlp.hook_post"] == (2, 7, 80)


def test_hooks_hold_what_the_docs_say(models):
    """q = q_proj(ln1) before RoPE, rot_q after it; z = o_proj's input; the biased MLP's hooks; result sums to
    attn_out."""
    model = models["mqa_bias_linear"]
    tokens = random_tokens(2, 9)
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)
    block = model.blocks[1]
    with torch.no_grad():
        ln1 = block.ln1(cache["resid_pre", 1])
        torch.testing.assert_close(cache["q", 1].flatten(-2), block.attn.q_proj(ln1), rtol=0, atol=1e-6)
        half = model.cfg.d_head // 2
        pair_norm = lambda x: x[..., :half] ** 2 + x[..., half:] ** 2  # noqa: E731  RoPE keeps each pair's norm
        torch.testing.assert_close(pair_norm(cache["rot_q", 1]), pair_norm(cache["q", 1]), rtol=1e-5, atol=1e-5)
        assert torch.equal(cache["rot_k", 1][:, 0], cache["k", 1][:, 0])  # position 0 is not turned (cos 1, sin 0)
        torch.testing.assert_close(
            block.attn.o_proj(cache["z", 1].flatten(-2)), cache["attn_out", 1], rtol=0, atol=1e-6
        )
        torch.testing.assert_close(
            cache["result", 1].sum(2) + block.attn.o_proj.bias, cache["attn_out", 1], rtol=0, atol=1e-5
        )
        ln2 = block.ln2(cache["resid_mid", 1])
        torch.testing.assert_close(cache["pre", 1], ln2 @ block.mlp.W_gate + block.mlp.b_gate, rtol=0, atol=1e-5)
        torch.testing.assert_close(cache["pre_linear", 1], ln2 @ model.W_in[1] + block.mlp.b_in, rtol=0, atol=1e-5)
        torch.testing.assert_close(cache["post", 1], torch.nn.functional.silu(cache["pre", 1]) * cache["pre_linear", 1])
        torch.testing.assert_close(
            cache["post", 1] @ model.W_out[1] + block.mlp.b_out, cache["mlp_out", 1], rtol=0, atol=1e-5
        )
    assert torch.equal(model.W_E[tokens], cache["embed"])  # a lookup: the very rows


# ----------------------------------------------------------------------------- features on Llama
def test_zero_heads_at_z_equals_zeroing_o_proj_columns(models):
    check_zero_heads_equals_zeroing_o_proj(models["gqa_llama3_tied"], heads=[2, 5])


def test_sweep_of_two_head_ablations_equals_each_alone(models):
    check_sweep_equals_each_alone(models["gqa_llama3_tied"], random_tokens(3, 9))


def test_run_with_cache_equals_the_forward(models):
    model = models["mqa_bias_linear"]
    tokens = random_tokens(2, 6)
    logits, cache = model.run_with_cache(tokens)  # caching the pattern runs the eager path
    with torch.no_grad(), hooked.layers.attention_backend("eager"):
        assert torch.equal(logits, model(tokens))  # exact: the same eager path on the same input; the cache only reads
        assert torch.equal(model.ln_final(cache["blocks.1.hook_resid_post"]), model.ln_final(cache["resid_post", 1]))
        torch.testing.assert_close(cache.accumulated_resid(apply_ln=False)[-1], cache["resid_post", 1], rtol=0, atol=0)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'.*silu"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
            "rope_type 'dynamic'.*'default', 'linear' and 'llama3'",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "rope_type 'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}, "needs 'low_freq_factor'"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"head_dim": 15}, "head_dim 15 is odd"),
    ],
)
def test_unsupported_config_is_refused(tmp_path, dirs, change, message):
    with pytest.raises(ValueError, match=message):
        hooked.load(edited_checkpoint(dirs["mha"], tmp_path / "edited", **change))


def test_unknown_architecture_names_the_families(tmp_path, dirs):
    directory = edited_checkpoint(
        dirs["mha"], tmp_path / "unknown", architectures=["Llama9ForCausalLM"], model_type="llama9"
    )
    with pytest.raises(
        hooked.CheckpointError,
        match="Llama9ForCausalLM.*supported.*LlamaForCausalLM.*MistralForCausalLM.*Qwen3ForCausalLM",
    ):
        hooked.load(directory)


def test_config_reads_hub_and_transformers5_layouts(dirs):
    """Hub configs (Llama 3.1) carry rope_theta + rope_scaling; transformers 5 writes rope_parameters. Same config."""
    written = json.loads((dirs["gqa_llama3_tied"] / "config.json").read_text())
    hub = {key: value for key, value in written.items() if key not in ("rope_parameters", "head_dim")}
    hub.update(rope_theta=5e5, rope_scaling={k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}, head_dim=16)
    assert HookedLlamaConfig.from_hf(hub) == HookedLlamaConfig.from_hf(written)
    # Llama 2: rope_scaling null, no head_dim (hidden_size / heads)
    llama2 = {**hub, "rope_scaling": None, "rope_theta": 1e4}
    del llama2["head_dim"]
    cfg = HookedLlamaConfig.from_hf(llama2)
    assert (cfg.rope_scaling, cfg.rope_theta, cfg.d_head) == (None, 1e4, 8)


def test_transformer_lens_config_without_qk_norm_builds_a_llama():
    """TransformerLens' Llama fields (RMS, rotary, silu, gated, final RMS, no q/k norm) give a hooked Llama."""
    cfg = hooked.HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        d_head=8,
        n_heads=4,
        n_key_value_heads=2,
        d_mlp=48,
        n_ctx=64,
        d_vocab=50,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        gated_mlp=True,
        final_rms=True,
        rotary_base=5e5,
    )
    model = hooked.HookedTransformer(cfg)
    assert type(model) is hooked.models.Llama
    assert (model.cfg.n_kv_heads, model.cfg.rope_theta, model.cfg.max_position_embeddings) == (2, 5e5, 64)
    with pytest.raises(ValueError, match="final_rms=False"):
        hooked.HookedTransformerConfig(
            n_layers=1,
            d_model=32,
            d_head=8,
            n_ctx=16,
            d_vocab=50,
            act_fn="silu",
            normalization_type="RMS",
            positional_embedding_type="rotary",
            gated_mlp=True,
        )


def test_transformer_lens_weight_processing_keeps_the_function(dirs, models):
    """`HookedTransformer.from_pretrained` (RMS weights folded, value biases folded through grouped kv heads,
    unembedding centred) gives the same log-probabilities as the unprocessed model, to float32 rounding."""
    tokens = random_tokens(2, 9)
    processed = hooked.HookedTransformer.from_pretrained(str(dirs["mqa_bias_linear"]))
    assert processed.processing["fold_ln"] and processed.processing["fold_value_biases"]
    with torch.no_grad():
        torch.testing.assert_close(
            processed(tokens).log_softmax(-1), models["mqa_bias_linear"](tokens).log_softmax(-1), rtol=0, atol=1e-5
        )
