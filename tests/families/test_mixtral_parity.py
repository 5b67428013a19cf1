"""Mixtral against transformers 5.24's MixtralForCausalLM and TransformerLens 3.9's Mixtral, on tiny random checkpoints.

Cases cover top-1, top-2 and top-3 routing over 4, 8 and 6 experts, a sliding window shorter than the prompts
(4 and 6) and none, MHA, GQA and multi-query attention, head_dim != hidden_size / heads, tied and untied
embeddings, and an expert width (24) that is not a multiple of SiLU's SIMD block. Float32 is bit-exact
(max abs difference 0.0 for the logits, every resid_pre and the final norm) on the SDPA path, the eager path
and with the per-slot expert hooks listening: the same operations in the same order as transformers 5.24
models/mixtral/modeling_mixtral.py and its default "grouped_mm" experts kernel (integrations/moe.py).
Ablations are checked against transformers models edited to match (an expert removed, a neuron's down_proj
column zeroed), not against numbers hooked produced.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip
from safetensors.torch import load_file, save_file

import hooked
from hooked import ablate
from hooked.models.mixtral import MixtralConfig as HookedMixtralConfig
from tests.families.parity import (
    ON_REQUEST,
    SWITCHES,
    UNEMBED_POINTS,
    bf16_spread,
    build_checkpoints,
    check_bit_exact,
    check_greedy_generation,
    check_left_padded_batch,
    edited_checkpoint,
    golden_hook_names,
    hf_reference,
    last_token_kl,
    listening_to_expert_slots,
    random_tokens,
    tl_model,
)

VOCAB = 96
HF = transformers.MixtralForCausalLM

CASES = {
    # GQA 4 -> 2, d_head = d_model / n_heads, untied, top-2 of 8, window 4: the shape TransformerLens' converter reads
    "window_k2": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,
    ),
    # multi-query, d_head 16 != 48 / 4, tied, top-3 of 6, expert width 24, window 6, rope_theta 1e4
    "window_k3_mqa_tied": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=24,
        num_hidden_layers=3,
        num_local_experts=6,
        num_experts_per_tok=3,
        tie_word_embeddings=True,
        sliding_window=6,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    ),
    # MHA, top-1 of 4 (every weight renormalises to exactly 1), no window (the released 8x7B)
    "k1_no_window": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=32,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=1,
        sliding_window=None,
    ),
}


def hf_config(case: str, **changes) -> transformers.MixtralConfig:
    # A wider init than transformers' 0.02: routing decided by margins on a tiny model.
    return transformers.MixtralConfig(vocab_size=VOCAB, initializer_range=0.1, **{**CASES[case], **changes})


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    # Neutral directory names: TransformerLens 3.9's convert_hf_model_config takes any path containing a family
    # name ("mistral", "mixtral") for one of its named checkpoints and never reads its config.json.
    return build_checkpoints(tmp_path_factory, {name: hf_config(name) for name in CASES}, HF)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager", "expert_hooks"])
def test_float32_bit_exact(dirs, models, case, path):
    model = models[case]
    assert type(model) is hooked.models.Mixtral
    tokens = random_tokens(3, 17)
    reference = hf_reference(dirs[case], HF, "sdpa" if path == "sdpa" else "eager")
    if path == "expert_hooks":  # listening to the per-slot neurons takes the other branch of run_experts
        with listening_to_expert_slots(model):
            check_bit_exact(model, reference, tokens, eager=False)
    else:
        check_bit_exact(model, reference, tokens, eager=path == "eager")


def test_config_read_from_each_case(models):
    cfg = models["window_k3_mqa_tied"].cfg
    assert (cfg.n_experts, cfg.top_k, cfg.d_expert_mlp, cfg.n_kv_heads, cfg.d_head, cfg.sliding_window) == (
        6,
        3,
        24,
        1,
        16,
        6,
    )
    assert (cfg.rope_theta, cfg.tie_word_embeddings, cfg.norm_topk_prob, cfg.rms_norm_eps) == (1e4, True, True, 1e-5)
    assert all(cfg.is_sparse(layer) for layer in range(cfg.n_layers))
    assert (cfg.num_experts, cfg.experts_per_token) == (6, 3)  # TransformerLens' names
    assert models["k1_no_window"].cfg.sliding_window is None


def test_bfloat16_within_transformers_own_spread(dirs):
    """bf16: |hooked - transformers sdpa| <= transformers' own |eager - sdpa|. The routing weights stay float32
    (transformers' Mixtral never casts them), so each slot is weighted and summed in float32, then cast."""
    tokens = random_tokens(2, 13)
    for case in ("window_k2", "window_k3_mqa_tied"):
        model = hooked.load(dirs[case], dtype=torch.bfloat16)
        reference, spread = bf16_spread(dirs[case], HF, tokens)
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_expert_weights"))
        assert logits.dtype == torch.bfloat16 and cache["expert_weights", 0].dtype == torch.float32
        assert (logits.float() - reference).abs().max().item() <= spread, case
        # Measured: bit-equal. Casting the weights to bf16 first (Qwen3-MoE's order) measured 0.018 and 0.023
        # here, inside the spread, so only equality tells the two orders apart.
        assert torch.equal(logits.float(), reference), case


def test_left_padded_batch(dirs, models):
    """Prompts of 13, 5 and 9 tokens against windows of 4 and 6; padded rows route like the prompt alone."""
    for case in ("window_k2", "window_k3_mqa_tied"):
        check_left_padded_batch(models[case], hf_reference(dirs[case], HF, "sdpa"), [13, 5, 9])


@pytest.mark.parametrize("lengths", [[9], [13, 5, 9]])
@pytest.mark.parametrize("case", ["window_k2", "k1_no_window"])
def test_greedy_generation_equals_transformers(dirs, models, case, lengths):
    """Prompts longer than the window, 12 new tokens: with and without the KV cache, token for token."""
    check_greedy_generation(models[case], hf_reference(dirs[case], HF, "sdpa"), lengths)


# ----------------------------------------------------------------------------- TransformerLens 3.9
def tl_mixtral(directory):
    """TransformerLens' HookedTransformer on a saved checkpoint: its own config mapping (convert_hf_model_config
    reads the directory; its Mixtral entry pins dtype bfloat16, replaced here by float32) and converter, unfolded."""
    return tl_model(directory, HF, "convert_mixtral_weights")


# hooked's router logits, per-token, per-slot and per-expert points, and mlp.hook_in (ON_REQUEST, hooked's addition)
OURS_ONLY = (
    "mlp.hook_router_logits",
    "mlp.hook_expert_pre",
    "mlp.hook_expert_post",
    "mlp.hook_expert_result",
    *ON_REQUEST,
)
THEIRS_ONLY = ("hook_gate", "hook_pre", "hook_post")  # TransformerLens' per-expert points: ragged rows


def check_against_transformer_lens(model, tl, tokens):
    """Every hook point both have holds the same tensor (rtol = atol = 1e-5); the MoE points where the names
    mean different things are mapped explicitly (docs/mixtral.md lists them)."""
    for setting in SWITCHES:
        for each in (model, tl):
            getattr(each, setting)(True)
    try:
        with torch.no_grad():
            tl_logits, tl_cache = tl.run_with_cache(tokens)
            logits, cache = model.run_with_cache(tokens, names_filter=lambda name: ".ln1." not in name)
            _, ln1 = model.run_with_cache(
                tokens, names_filter=lambda name: ".ln1." in name
            )  # TL's ln1 is per head here
    finally:
        for setting in SWITCHES:
            for each in (model, tl):
                getattr(each, setting)(False)
    cfg, (batch, pos) = model.cfg, tokens.shape
    layers = range(cfg.n_layers)
    theirs_only = UNEMBED_POINTS | {
        f"blocks.{layer}.mlp.experts.{expert}.{name}"
        for layer in layers
        for expert in range(cfg.n_experts)
        for name in THEIRS_ONLY
    }
    assert set(tl_cache.keys()) - set(model.hook_names) == theirs_only
    assert set(model.hook_names) - set(tl_cache.keys()) == {
        f"blocks.{layer}.{name}" for layer in layers for name in OURS_ONLY
    }
    torch.testing.assert_close(logits, tl_logits, rtol=1e-5, atol=1e-5)
    for name in model.hook_names:
        if name not in tl_cache or ".hook_expert_" in name:
            continue
        ours, theirs = (ln1[name], tl_cache[name][:, :, 0]) if ".ln1." in name else (cache[name], tl_cache[name])
        if name.endswith("hook_attn_scores"):  # TransformerLens masks with -inf, hooked with the dtype's minimum
            visible = torch.isfinite(theirs)
            assert torch.equal(visible, ours > torch.finfo(ours.dtype).min), name
            ours, theirs = ours[visible], theirs[visible]
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=name)
    for layer in layers:
        # TransformerLens' mlp.hook_expert_weights: softmax over ALL experts, [batch*pos n_experts], before top-k
        probs = F.softmax(cache["router_logits", layer], dim=-1, dtype=torch.float32)
        torch.testing.assert_close(
            probs.view(-1, cfg.n_experts), tl_cache[f"blocks.{layer}.mlp.hook_expert_weights"], rtol=1e-5, atol=1e-6
        )
        indices = cache["expert_indices", layer]  # [batch pos top_k]; TransformerLens': [batch*pos top_k]
        assert torch.equal(indices.view(-1, cfg.top_k), tl_cache[f"blocks.{layer}.mlp.hook_expert_indices"])
        # TransformerLens' experts.{e}.hook_gate / hook_post: the rows of the slots holding e, slot-major then token
        # (torch.where over its [top_k tokens] mask) = hooked's per-slot hook_expert_pre / hook_expert_post there
        slot_major = indices.view(-1, cfg.top_k).T  # [top_k batch*pos]
        for expert in range(cfg.n_experts):
            held = slot_major == expert
            for ours_name, theirs_name in (("expert_pre", "hook_gate"), ("expert_post", "hook_post")):
                ours = cache[ours_name, layer].view(batch * pos, cfg.top_k, -1).transpose(0, 1)[held]
                theirs = tl_cache[f"blocks.{layer}.mlp.experts.{expert}.{theirs_name}"]
                torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"{layer} {expert} {theirs_name}")


def test_every_hook_equals_transformer_lens(dirs, models):
    """TransformerLens 3.9 maps Mixtral's sliding_window to local attention (attn_types "local", window_size)."""
    for case in ("window_k2", "k1_no_window"):
        tl = tl_mixtral(dirs[case])
        assert tl.cfg.window_size == CASES[case]["sliding_window"] and tl.cfg.norm_topk_prob
        check_against_transformer_lens(models[case], tl, random_tokens(2, 15))


# ----------------------------------------------------------------------------- hook names, shapes, meanings
MIXTRAL_BLOCK = [  # the hook points of one block, in forward order
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
    "mlp.hook_router_logits",
    "mlp.hook_expert_weights",
    "mlp.hook_expert_indices",
    "mlp.hook_expert_pre",
    "mlp.hook_expert_post",
    "mlp.hook_expert_result",
    "hook_mlp_out",
    "hook_resid_post",
]
GOLDEN_HOOK_NAMES = golden_hook_names([MIXTRAL_BLOCK] * 2)


def test_golden_hook_names(models):
    assert models["window_k2"].hook_names == GOLDEN_HOOK_NAMES


def test_hook_shapes_and_routing_semantics(models):
    """Shapes match the declared axes; weights = top-k of the float32 softmax over all experts, renormalised;
    per slot, pre = the slot expert's gate pre-activation and post = silu(pre) * up (from the weight views)."""
    model = models["window_k3_mqa_tied"]
    _, cache = model.run_with_cache(random_tokens(2, 7), names_filter=lambda name: True)
    expected = model.hook_shapes(batch=2, pos=7)
    assert set(cache.keys()) == set(model.hook_names)
    for name in model.hook_names:
        assert tuple(cache[name].shape) == expected[name], name
    assert expected["blocks.1.mlp.hook_expert_post"] == (2, 7, 3, 24) and expected[
        "blocks.1.mlp.hook_router_logits"
    ] == (2, 7, 6)
    probs = torch.softmax(cache["router_logits", 1].double(), dim=-1)
    top = probs.topk(3, dim=-1)
    torch.testing.assert_close(
        cache["expert_weights", 1].double(), top.values / top.values.sum(-1, keepdim=True), rtol=0, atol=1e-6
    )
    # Integers: the softmax keeps the router logits' order, so top-k picks the same experts unless two logits lie
    # within float32 rounding (none here).
    assert torch.equal(cache["expert_indices", 1], top.indices)
    mlp, indices = model.blocks[1].mlp, cache["expert_indices", 1]
    x = model.blocks[1].ln2(cache["resid_mid", 1])
    pre = torch.einsum("bpd,bpkdi->bpki", x, mlp.W_gate[indices])
    up = torch.einsum("bpd,bpkdi->bpki", x, mlp.W_in[indices])
    torch.testing.assert_close(cache["expert_pre", 1], pre, rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["expert_post", 1], F.silu(pre) * up, rtol=0, atol=1e-5)
    _, top1 = models["k1_no_window"].run_with_cache(
        random_tokens(2, 7), names_filter=lambda name: "expert_weights" in name
    )
    assert torch.all(top1["expert_weights", 0] == 1.0)


# ----------------------------------------------------------------------------- ablations against edited transformers
# models
def test_expert_ablation_equals_transformers_without_the_expert(dirs, models):
    """zero(experts=e) at the router writes -inf: the softmax runs over the other experts, which is transformers'
    Mixtral with expert e deleted (its router row and its weights) in that layer."""
    case = "window_k2"
    removed = {0: 3, 1: 5}
    hf = hf_reference(dirs[case], HF, "sdpa")
    smaller = HF(hf_config(case, num_local_experts=CASES[case]["num_local_experts"] - 1)).eval()
    state = hf.state_dict()
    for layer, expert in removed.items():
        kept = [e for e in range(CASES[case]["num_local_experts"]) if e != expert]
        for key in ("mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            state[f"model.layers.{layer}.{key}"] = state[f"model.layers.{layer}.{key}"][kept]
    smaller.load_state_dict(state)
    tokens = random_tokens(3, 11, seed=3)
    fwd_hooks = [
        (f"blocks.{layer}.mlp.hook_router_logits", ablate.zero(experts=expert)) for layer, expert in removed.items()
    ]
    with torch.no_grad():
        ablated = models[case].run_with_hooks(tokens, fwd_hooks=fwd_hooks)
        torch.testing.assert_close(ablated, smaller(tokens).logits, rtol=0, atol=1e-5)
        assert (ablated - hf(tokens).logits).abs().max() > 1e-3  # the ablation did something


def test_expert_neuron_ablation_equals_zeroing_its_down_proj_column(dirs, models):
    case, layer, expert, neuron = "window_k2", 1, 2, 7
    hf = hf_reference(dirs[case], HF, "sdpa")
    with torch.no_grad():
        hf.model.layers[layer].mlp.experts.down_proj[expert, :, neuron] = 0.0
        tokens = random_tokens(3, 11, seed=4)
        ablated = models[case].run_with_hooks(
            tokens, fwd_hooks=[(f"blocks.{layer}.mlp.hook_expert_post", ablate.zero(experts=expert, neurons=neuron))]
        )
        torch.testing.assert_close(ablated, hf(tokens).logits, rtol=0, atol=1e-5)
        assert (ablated - models[case](tokens)).abs().max() > 1e-4


def test_sweep_on_a_left_padded_batch_equals_each_alone(models):
    """Head, expert and expert-neuron ablations in one sweep, each equal to its own run (the window read from the
    model)."""
    model = models["window_k2"]
    tokens = random_tokens(3, 11, seed=4)
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0
    mask[2, :6] = 0
    _, clean = model.run_with_cache(tokens, attention_mask=mask, names_filter="blocks.1.mlp.hook_expert_indices")
    last = int(clean["expert_indices", 1][0, -1, 0])  # an expert the metric's position reads
    variants = {
        "L0H1": [("blocks.0.attn.hook_z", ablate.zero(heads=1))],
        "L0E3": [("blocks.0.mlp.hook_router_logits", ablate.zero(experts=3))],
        f"L1E{last}.N7": [("blocks.1.mlp.hook_expert_post", ablate.zero(experts=last, neurons=7))],
    }
    result = hooked.sweep(model, tokens, variants, last_token_kl, attention_mask=mask, progress=False)
    with torch.no_grad():
        base = model(tokens, attention_mask=mask)
        for name, pairs in variants.items():
            alone = last_token_kl(model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=pairs), base_logits=base)
            assert alone.abs().max() > 1e-7, name  # the ablation does something
            torch.testing.assert_close(result[name], alone, rtol=0, atol=2e-6, msg=name)


def test_run_with_cache_equals_the_forward_and_expert_results_sum_to_mlp_out(dirs, models):
    model = models["window_k3_mqa_tied"]
    tokens = random_tokens(2, 9)
    logits, cache = model.run_with_cache(tokens)  # caching the pattern runs the eager path
    with torch.no_grad(), hooked.layers.attention_backend("eager"):
        assert torch.equal(logits, model(tokens))  # exact: the same eager path on the same input; the cache only reads
    # each expert's write (weight * down_e(post), explicit from the cache), summed over experts, is the MLP's output
    torch.testing.assert_close(cache.get_expert_results(1).sum(-2), cache["mlp_out", 1], rtol=0, atol=1e-5)
    bf16 = hooked.load(dirs["window_k3_mqa_tied"], dtype=torch.bfloat16)  # float32 weights, bf16 writes
    _, cache = bf16.run_with_cache(tokens)
    results = cache.get_expert_results(1)
    assert results.dtype == torch.bfloat16
    torch.testing.assert_close(results.float().sum(-2), cache["mlp_out", 1].float(), rtol=0.02, atol=0.02)


# ----------------------------------------------------------------------------- checkpoint layouts
def write_layout(source, destination, rename):
    """A copy of `source` with its safetensors keys renamed (None drops a key)."""
    shutil.copytree(source, destination)
    tensors = load_file(source / "model.safetensors")
    renamed = {rename(key): tensor for key, tensor in tensors.items() if rename(key) is not None}
    save_file(renamed, destination / "model.safetensors", metadata={"format": "pt"})
    return destination


def test_every_layout_transformers_reads_loads_identically(tmp_path, dirs, models):
    """save_pretrained writes the hub's per-expert block_sparse_moe.experts.{e}.w1/w2/w3; transformers 5.24's
    conversion mapping also reads the `mlp.` prefix and the fused in-memory gate_up_proj / down_proj. Each loads
    into transformers and into hooked with the same logits."""
    case = "window_k3_mqa_tied"
    keys = load_file(dirs[case] / "model.safetensors").keys()
    assert any(".block_sparse_moe.experts.0.w1.weight" in key for key in keys)
    mlp_prefix = write_layout(dirs[case], tmp_path / "prefix", lambda key: key.replace(".block_sparse_moe.", ".mlp."))
    fused = tmp_path / "fused"
    shutil.copytree(dirs[case], fused)
    state = {
        key: tensor.contiguous()
        for key, tensor in hf_reference(dirs[case], HF, "sdpa").state_dict().items()
        if key != "lm_head.weight"
    }
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, fused / "model.safetensors", metadata={"format": "pt"})
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        expected = models[case](tokens)
        for directory in (mlp_prefix, fused):
            # exact as check_bit_exact (SDPA path); the same weights give hooked the same forward
            logits = hf_reference(directory, HF, "sdpa")(tokens, use_cache=False).logits
            assert torch.equal(logits, expected), directory.name
            assert torch.equal(hooked.load(directory)(tokens), expected), directory.name


def test_a_checkpoint_with_both_expert_layouts_is_refused_in_either_order(tmp_path, dirs):
    """The fused gate_up_proj in one shard and the per-expert w1/w3 in the next would fill the same parameter
    twice: refused as unexpected tensors, whichever shard comes first (the later never overwrites the earlier)."""
    case = "window_k3_mqa_tied"
    per_expert = load_file(dirs[case] / "model.safetensors")
    fused = {
        key: tensor.contiguous()
        for key, tensor in hf_reference(dirs[case], HF, "sdpa").state_dict().items()
        if ".mlp.experts." in key
    }
    for order in ("fused first", "per-expert first"):
        directory = tmp_path / order.replace(" ", "-")
        shutil.copytree(dirs[case], directory)
        (directory / "model.safetensors").unlink()
        shards = {"model-00001-of-00002.safetensors": fused, "model-00002-of-00002.safetensors": per_expert}
        if order != "fused first":
            shards = dict(zip(shards, reversed(list(shards.values())), strict=True))
        for name, tensors in shards.items():
            save_file(tensors, directory / name, metadata={"format": "pt"})
        weight_map = {key: name for name, tensors in shards.items() for key in tensors}
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        with pytest.raises(hooked.CheckpointError, match="unexpected tensors"):
            hooked.load(directory)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda key: None if key == "model.layers.1.block_sparse_moe.experts.2.w3.weight" else key,
            r"missing tensors: \['blocks.1.mlp.experts.gate_up_proj\[2\] \(part 2 of 2\)'\]",
        ),
        (
            lambda key: None if key == "model.layers.0.block_sparse_moe.gate.weight" else key,
            r"missing tensors: \['blocks.0.mlp.gate.weight'\]",
        ),
        (lambda key: key.replace("experts.1.w2", "experts.9.w2"), "unexpected tensors.*experts.9.w2.weight"),
    ],
)
def test_bad_expert_tensors_raise_checkpoint_error(tmp_path, dirs, edit, message):
    directory = write_layout(dirs["window_k2"], tmp_path / "edited", edit)
    with pytest.raises(hooked.CheckpointError, match=message):
        hooked.load(directory)


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_experts_per_tok": 9}, r"num_experts_per_tok 9 must lie in 1..num_local_experts \(8\)"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok 0 must lie in 1..num_local_experts"),
        ({"num_local_experts": 0}, "num_local_experts 0 must be a whole number >= 1"),
        ({"sliding_window": 0}, "sliding_window 0 must be a whole number in 1..max_position_embeddings"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope'"),
    ],
)
def test_unsupported_config_is_refused(tmp_path, dirs, change, message):
    with pytest.raises(ValueError, match=message):
        hooked.load(edited_checkpoint(dirs["window_k2"], tmp_path / "edited", **change))


def test_config_defaults_and_hub_layout_equal_transformers(dirs):
    """Keys left out get transformers' MixtralConfig defaults (rope_theta 1e6, no window, eps 1e-5: not Mistral's);
    the hub's config (rope_theta, no rope_parameters) reads as transformers 5's."""
    written = json.loads((dirs["window_k2"] / "config.json").read_text())
    bare = {
        key: value for key, value in written.items() if key not in ("rope_parameters", "sliding_window", "rms_norm_eps")
    }
    reference, cfg = transformers.MixtralConfig(**bare), HookedMixtralConfig.from_hf(bare)
    assert (
        (cfg.rope_theta, cfg.sliding_window, cfg.rms_norm_eps)
        == (reference.rope_parameters["rope_theta"], reference.sliding_window, reference.rms_norm_eps)
        == (1e6, None, 1e-5)
    )
    hub = {**bare, "rope_theta": 1e6, "sliding_window": 4, "rms_norm_eps": 1e-5}
    assert HookedMixtralConfig.from_hf(hub) == dataclasses.replace(HookedMixtralConfig.from_hf(written), rope_theta=1e6)


def test_router_jitter_noise_is_ignored_as_transformers_does_at_inference(tmp_path, dirs, models):
    """router_jitter_noise scales the MLP input by U(1 - noise, 1 + noise) in transformers only when training;
    hooked computes the inference forward, equal to transformers' eval forward."""
    directory = edited_checkpoint(dirs["window_k2"], tmp_path / "jitter", router_jitter_noise=0.5)
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        reference = hf_reference(directory, HF, "sdpa")(tokens, use_cache=False).logits
        assert torch.equal(hooked.load(directory)(tokens), reference)  # exact as check_bit_exact (SDPA path)


def test_transformer_lens_names_resolve_to_the_hub_ids():
    from hooked.transformer_lens.aliases import hub_id

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens.supported_models import MODEL_ALIASES

    for official in ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"):
        assert hooked.models.Mixtral.transformer_lens_names[official] == tuple(MODEL_ALIASES[official])
        for name in (official, *MODEL_ALIASES[official]):
            assert hub_id(name.upper()) == official


def test_transformer_lens_weight_processing_keeps_the_function(dirs, models):
    """`HookedTransformer.from_pretrained` (RMS weights folded into the router, every expert and q/k/v, unembedding
    centred) gives the same log-probabilities as the unprocessed model, to float32 rounding."""
    tokens = random_tokens(2, 9)
    processed = hooked.HookedTransformer.from_pretrained(str(dirs["window_k3_mqa_tied"]))
    assert processed.processing["fold_ln"]
    with torch.no_grad():
        torch.testing.assert_close(
            processed(tokens).log_softmax(-1), models["window_k3_mqa_tied"](tokens).log_softmax(-1), rtol=0, atol=1e-5
        )
