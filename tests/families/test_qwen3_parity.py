"""Qwen3 against transformers' Qwen3ForCausalLM: logits and every residual stream, bit for bit.

Tiny random checkpoints are built here (norm weights and biases randomised: HF initialises them to
1 and 0, which would hide a dropped norm) over MHA and GQA, head_dim != d_model / n_heads, tied and
untied embeddings, rope_theta 1e6, YaRN scaling and attention biases. Float32 is bit-exact on both
attention paths (SDPA when nothing reads the pattern, eager when something does): measured max abs
difference 0.0 for logits and every hidden state in every case.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip
from safetensors.torch import load_file, save_file

import hooked
from hooked.models.qwen3 import Qwen3Config as HookedQwen3Config
from tests.families.parity import (
    build_checkpoint,
    build_checkpoints,
    check_bit_exact,
    check_zero_heads_equals_zeroing_o_proj,
    copy_checkpoint,
    edited_checkpoint,
    golden_hook_names,
    hf_reference,
    left_padded,
    random_tokens,
)

VOCAB = 96

# name -> transformers Qwen3Config keyword arguments
DENSE_CASES = {
    # MHA, d_head = d_model / n_heads, untied, default rope_theta (1e4)
    "mha": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=96,
        num_hidden_layers=2,
    ),
    # GQA 8 -> 2, 8 * 16 = 128 != d_model 64, tied embeddings, rope_theta 1e6
    "gqa_tied": dict(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=80,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    # multi-query, d_head 32 > d_model / n_heads, YaRN x4, attention biases
    "yarn_bias": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=64,
        num_hidden_layers=2,
        attention_bias=True,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "original_max_position_embeddings": 16},
    ),
}


@pytest.fixture(scope="module")
def dense_dirs(tmp_path_factory):
    configs = {name: transformers.Qwen3Config(vocab_size=VOCAB, **kwargs) for name, kwargs in DENSE_CASES.items()}
    return build_checkpoints(tmp_path_factory, configs, transformers.Qwen3ForCausalLM)


@pytest.fixture(scope="module")
def dense_models(dense_dirs):
    return {name: hooked.load(directory) for name, directory in dense_dirs.items()}


@pytest.mark.parametrize("case", list(DENSE_CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager"])
def test_float32_bit_exact(dense_dirs, dense_models, case, path):
    model = dense_models[case]
    assert isinstance(model, hooked.models.Qwen3)
    reference = hf_reference(dense_dirs[case], transformers.Qwen3ForCausalLM, path)
    check_bit_exact(model, reference, random_tokens(3, 17), eager=path == "eager")


def test_single_token_and_single_prompt(dense_dirs, dense_models):
    reference = hf_reference(dense_dirs["gqa_tied"], transformers.Qwen3ForCausalLM, "sdpa")
    for tokens in (random_tokens(1, 1), random_tokens(1, 5)):
        with torch.no_grad():
            # exact as check_bit_exact: the same operations on the same layouts (no KV cache on transformers' side)
            assert torch.equal(dense_models["gqa_tied"](tokens), reference(tokens, use_cache=False).logits)


def test_config_reads_hub_and_transformers5_layouts(dense_dirs):
    """Hub configs carry rope_theta + rope_scaling; transformers 5 writes rope_parameters. Same model."""
    written = json.loads((dense_dirs["yarn_bias"] / "config.json").read_text())
    hub = {key: value for key, value in written.items() if key != "rope_parameters"}
    hub["rope_theta"] = 1e6
    hub["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    hub["torch_dtype"] = hub.pop("dtype")
    cfg = HookedQwen3Config.from_hf(written)
    assert HookedQwen3Config.from_hf(hub) == cfg
    assert (cfg.d_head, cfg.n_kv_heads, cfg.rope_theta, cfg.yarn.factor, cfg.yarn.original_max_positions) == (
        32,
        1,
        1e6,
        4.0,
        16,
    )
    assert HookedQwen3Config.from_hf({**hub, "rope_scaling": None}).yarn is None


def test_hook_shapes_match_declared_axes(dense_models):
    model = dense_models["gqa_tied"]
    _, cache = model.run_with_cache(random_tokens(2, 7))
    expected = model.hook_shapes(batch=2, pos=7)
    split = {
        name
        for name in model.hook_names
        if name.endswith(("hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in", "attn.hook_result"))
    }
    on_request = {name for name in model.hook_names if name.endswith("mlp.hook_in")}  # no switch caches it
    assert len(split) == 5 * model.cfg.n_layers and len(on_request) == model.cfg.n_layers
    # TransformerLens' default: no split inputs, no results; and not hooked's mlp.hook_in
    assert set(cache.keys()) == set(model.hook_names) - split - on_request
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    model.set_use_attn_result(True)
    try:
        _, split_cache = model.run_with_cache(random_tokens(2, 7))
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)
        model.set_use_attn_result(False)
    assert set(split_cache.keys()) == set(model.hook_names) - on_request
    _, requested = model.run_with_cache(random_tokens(2, 7), names_filter=lambda name: name in on_request)
    for name in model.hook_names:
        source = requested if name in on_request else split_cache if name in split else cache
        assert tuple(source[name].shape) == expected[name], name
    assert expected["blocks.0.attn.hook_k"] == (2, 7, 2, 16) and expected["blocks.0.attn.hook_q"] == (2, 7, 8, 16)


def test_hooks_hold_what_the_docs_say(dense_models):
    """q/k before the per-head norms, *_normed after, rot_* after RoPE, z = o_proj input, result sums to attn_out."""
    model = dense_models["yarn_bias"]
    tokens = random_tokens(2, 9)
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[1].attn
    q, k = cache["q", 1], cache["k", 1]
    rms = lambda x, w: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.cfg.rms_norm_eps))  # noqa: E731
    torch.testing.assert_close(cache["q_normed", 1], rms(q, attn.q_norm.weight), rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["k_normed", 1], rms(k, attn.k_norm.weight), rtol=0, atol=1e-5)
    # RoPE rotates pairs (i, i + d_head/2): it keeps their norms; position 0 is not rotated.
    half = model.cfg.d_head // 2
    pair_norm = lambda x: x[..., :half] ** 2 + x[..., half:] ** 2  # noqa: E731
    torch.testing.assert_close(
        pair_norm(cache["rot_q", 1]),
        pair_norm(cache["q_normed", 1]) * model.rotary.attention_factor**2,
        rtol=1e-5,
        atol=1e-5,
    )
    # Exact at position 0: cos = attention_factor and sin = 0 there, so RoPE is the same single product
    torch.testing.assert_close(
        cache["rot_k", 1][:, 0], cache["k_normed", 1][:, 0] * model.rotary.attention_factor, rtol=0, atol=0
    )
    z = cache["z", 1]
    torch.testing.assert_close(attn.o_proj(z.flatten(-2)), cache["attn_out", 1], rtol=0, atol=1e-6)
    _, results = model.run_with_cache(
        tokens, names_filter=lambda name: name.endswith("hook_result")
    )  # not cached by default
    torch.testing.assert_close(results["result", 1].sum(2) + attn.o_proj.bias, cache["attn_out", 1], rtol=0, atol=1e-5)
    pattern = cache["pattern", 1]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]), rtol=0, atol=1e-6)
    assert torch.all(pattern.triu(1) == 0)
    mlp = model.blocks[1].mlp
    torch.testing.assert_close(cache["post", 1], torch.nn.functional.silu(cache["pre", 1]) * cache["pre_linear", 1])
    torch.testing.assert_close(mlp.down_proj(cache["post", 1]), cache["mlp_out", 1], rtol=0, atol=1e-6)


def test_zeroing_a_head_at_z_equals_zeroing_its_o_proj_columns(dense_models):
    check_zero_heads_equals_zeroing_o_proj(dense_models["gqa_tied"], heads=[3], atol=0)  # bit for bit


def test_left_padded_batch_matches_each_prompt_alone(dense_models):
    model = dense_models["gqa_tied"]
    prompts, tokens, mask = left_padded([9, 4, 6])
    with torch.no_grad():
        batched = model(tokens, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            alone = model(prompt[None])
            torch.testing.assert_close(batched[row, -len(prompt) :], alone[0], rtol=0, atol=1e-5)


def test_sharded_checkpoint_loads_identically(tmp_path, dense_dirs, dense_models):
    config = transformers.Qwen3Config(vocab_size=VOCAB, **DENSE_CASES["gqa_tied"])
    directory = build_checkpoint(
        tmp_path / "sharded", config, transformers.Qwen3ForCausalLM, seed=1, max_shard_size="20KB"
    )
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    sharded = hooked.load(directory)
    tokens = random_tokens(2, 6)
    with torch.no_grad():
        assert torch.equal(sharded(tokens), dense_models["gqa_tied"](tokens))  # the same weights, the same forward


def test_bfloat16_matches_transformers_bit_for_bit(dense_dirs):
    model = hooked.load(dense_dirs["gqa_tied"], dtype=torch.bfloat16)
    reference = transformers.Qwen3ForCausalLM.from_pretrained(
        dense_dirs["gqa_tied"], attn_implementation="sdpa", dtype=torch.bfloat16
    ).eval()
    tokens = random_tokens(2, 11)
    with torch.no_grad():
        logits = model(tokens)
        assert logits.dtype == torch.bfloat16
        assert torch.equal(logits, reference(tokens, use_cache=False).logits)  # exact as check_bit_exact


QWEN3_BLOCK = [  # the hook points of one block, in forward order
    "hook_resid_pre",
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.q_norm.hook_scale",
    "attn.q_norm.hook_normalized",
    "attn.hook_q_normed",
    "attn.k_norm.hook_scale",
    "attn.k_norm.hook_normalized",
    "attn.hook_k_normed",
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
GOLDEN_DENSE_HOOK_NAMES = golden_hook_names([QWEN3_BLOCK] * 2)


def test_golden_hook_names(dense_models):
    assert dense_models["mha"].hook_names == GOLDEN_DENSE_HOOK_NAMES


# ----------------------------------------------------------------------------- bad input
def test_unknown_architecture_names_the_supported_ones(tmp_path, dense_dirs):
    directory = edited_checkpoint(
        dense_dirs["mha"], tmp_path / "unknown", architectures=["Qwen9ForCausalLM"], model_type="qwen9"
    )
    with pytest.raises(
        hooked.CheckpointError, match="Qwen9ForCausalLM.*supported.*Qwen3ForCausalLM.*Qwen3MoeForCausalLM"
    ):
        hooked.load(directory)


@pytest.mark.parametrize(
    "edit, message",
    [
        ("drop", "missing tensors.*blocks.1.attn.k_norm.weight"),
        ("reshape", "mis-shaped tensors: model.layers.1.self_attn.k_norm.weight"),
        ("extra", "unexpected tensors.*model.layers.7.self_attn.k_norm.weight"),
    ],
)
def test_bad_tensors_raise_checkpoint_error(tmp_path, dense_dirs, edit, message):
    directory = copy_checkpoint(dense_dirs["mha"], tmp_path / edit)
    tensors = load_file(directory / "model.safetensors")
    key = "model.layers.1.self_attn.k_norm.weight"
    if edit == "drop":
        del tensors[key]
    elif edit == "reshape":
        tensors[key] = torch.ones(7)
    else:
        tensors["model.layers.7.self_attn.k_norm.weight"] = tensors[key].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hooked.CheckpointError, match=message):
        hooked.load(directory)


def test_tied_checkpoint_lacks_lm_head_and_untied_needs_it(tmp_path, dense_dirs, dense_models):
    assert "lm_head.weight" not in load_file(dense_dirs["gqa_tied"] / "model.safetensors")
    assert dense_models["gqa_tied"].unembed_weight is dense_models["gqa_tied"].embed_tokens.weight
    directory = copy_checkpoint(dense_dirs["mha"], tmp_path / "no_head")
    tensors = load_file(directory / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hooked.CheckpointError, match="missing tensors.*lm_head.weight"):
        hooked.load(directory)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_sliding_window": True}, "sliding-window"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_type 'dynamic'"),
        ({"hidden_act": "gelu"}, "activation"),
        ({"head_dim": 7}, "head_dim 7 is odd"),  # half-split RoPE turns pairs of dimensions
    ],
)
def test_unsupported_config_is_refused(tmp_path, dense_dirs, change, message):
    directory = edited_checkpoint(dense_dirs["mha"], tmp_path / "unsupported", **change)
    with pytest.raises(ValueError, match=message):
        hooked.load(directory)


def test_token_id_out_of_vocabulary(dense_models):
    with pytest.raises(ValueError, match=f"token id {VOCAB} is out of range"):
        dense_models["mha"](torch.tensor([[1, 2, VOCAB]]))


def test_transformer_lens_weight_views_reproduce_the_activations(dense_models):
    """q = ln1(x) @ W_Q[h] (before q_norm), k/v with their kv heads, gate/up/down through W_gate/W_in/W_out."""
    model = dense_models["gqa_tied"]
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    _, cache = model.run_with_cache(tokens)
    block = model.blocks[1]
    with torch.no_grad():
        ln1_out = block.ln1(cache["resid_pre", 1])
        ln2_out = block.ln2(cache["resid_mid", 1])
        computed = {
            "q": torch.einsum("bpm,hmd->bphd", ln1_out, model.W_Q[1]),
            "k": torch.einsum("bpm,hmd->bphd", ln1_out, block.attn.W_K_grouped),
            "attn_out": torch.einsum("bphd,hdm->bpm", cache["z", 1], model.W_O[1]),
            "pre": ln2_out @ block.mlp.W_gate,
            "pre_linear": ln2_out @ model.W_in[1],
            "mlp_out": cache["post", 1] @ model.W_out[1],
        }
    for name, value in computed.items():
        torch.testing.assert_close(value, cache[name, 1], rtol=0, atol=1e-5, msg=name)
    assert torch.equal(model.W_E[tokens], cache["embed"])  # a lookup: the very rows
