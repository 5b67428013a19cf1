"""Qwen3-MoE against transformers' Qwen3MoeForCausalLM, and the meaning of the router and expert hooks.

Parity covers top-k 1, 2 and 3, norm_topk_prob on and off, decoder_sparse_step 2 with an mlp_only
layer, tied and untied embeddings, on both attention paths and with the per-slot expert hooks
listening. Float32 is bit-exact in every case (max abs difference 0.0, logits and every hidden
state), also at expert width 24, where SiLU's vectorised kernel would round a row tail differently
if the gate half were not read as a strided view of the fused gate_up output, as transformers does
(see docs/qwen3.md).

Router and neuron semantics are checked against references written here from the raw safetensors
weights, not from the model code.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip
from safetensors.torch import load_file, save_file

import hooked
from hooked.models.qwen3_moe import Qwen3MoeConfig as HookedQwen3MoeConfig
from tests.families.parity import (
    build_checkpoint,
    build_checkpoints,
    check_bit_exact,
    copy_checkpoint,
    golden_hook_names,
    hf_reference,
    left_padded,
    listening_to_expert_slots,
    random_tokens,
)
from tests.families.test_qwen3_parity import QWEN3_BLOCK, VOCAB

COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    initializer_range=0.1,
)  # a wider init than HF's 0.02 makes routing decisive on a tiny model
MOE_CASES = {
    # all layers sparse, top-2, renormalised, tied embeddings
    "k2_norm": dict(
        COMMON,
        num_hidden_layers=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        tie_word_embeddings=True,
    ),
    # sparse every 2nd layer, layer 3 forced dense: only layer 1 is sparse; top-3 of 6, not renormalised
    "k3_step2": dict(
        COMMON,
        num_hidden_layers=4,
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
        norm_topk_prob=False,
    ),
    # layer 0 dense, layer 1 sparse, top-1 of 4, weights = the top probability; head_dim 32 != 64 / 4
    "k1": dict(
        COMMON | dict(head_dim=32),
        num_hidden_layers=2,
        num_experts=4,
        num_experts_per_tok=1,
        moe_intermediate_size=64,
        decoder_sparse_step=2,
        norm_topk_prob=False,
    ),
    # top-1 renormalised: every weight is exactly 1
    "k1_norm": dict(
        COMMON,
        num_hidden_layers=2,
        num_experts=4,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    # expert width 24: not a multiple of SiLU's SIMD block (the fused gate_up layout keeps it bit-exact)
    "width24": dict(
        COMMON, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True
    ),
}


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    configs = {name: transformers.Qwen3MoeConfig(vocab_size=VOCAB, **kwargs) for name, kwargs in MOE_CASES.items()}
    return build_checkpoints(tmp_path_factory, configs, transformers.Qwen3MoeForCausalLM)


@pytest.fixture(scope="module")
def moe_models(moe_dirs):
    return {name: hooked.load(directory) for name, directory in moe_dirs.items()}


def sparse_layers(model) -> list[int]:
    return [i for i in range(model.cfg.n_layers) if model.cfg.is_sparse(i)]


@pytest.mark.parametrize("case", list(MOE_CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager", "expert_hooks"])
def test_float32_parity(moe_dirs, moe_models, case, path):
    model = moe_models[case]
    tokens = random_tokens(3, 17)
    reference = hf_reference(moe_dirs[case], transformers.Qwen3MoeForCausalLM, "sdpa" if path == "sdpa" else "eager")
    if path == "expert_hooks":  # listening to the per-slot neurons takes the other branch of run_experts
        with listening_to_expert_slots(model):
            check_bit_exact(model, reference, tokens, eager=False)
    else:
        check_bit_exact(model, reference, tokens, eager=path == "eager")


def test_layer_kinds_follow_decoder_sparse_step_and_mlp_only_layers(moe_models):
    assert sparse_layers(moe_models["k3_step2"]) == [1]
    assert sparse_layers(moe_models["k1"]) == [1]
    assert sparse_layers(moe_models["k2_norm"]) == [0, 1]
    blocks = moe_models["k3_step2"].blocks
    assert blocks[1].mlp.experts.gate_up_proj.shape == (6, 64, 64) and blocks[1].mlp.experts.down_proj.shape == (
        6,
        64,
        32,
    )
    assert blocks[3].mlp.gate_proj.weight.shape == (96, 64)


def test_config_accepts_num_experts_and_num_local_experts(moe_dirs):
    written = json.loads((moe_dirs["k3_step2"] / "config.json").read_text())
    assert "num_local_experts" in written  # what transformers 5 writes
    hub = {key: value for key, value in written.items() if key not in ("num_local_experts", "rope_parameters")}
    hub.update(num_experts=6, rope_theta=10000.0, rope_scaling=None)
    cfg = HookedQwen3MoeConfig.from_hf(written)
    assert HookedQwen3MoeConfig.from_hf(hub) == cfg
    assert (cfg.n_experts, cfg.top_k, cfg.d_expert_mlp, cfg.mlp_only_layers, cfg.norm_topk_prob) == (
        6,
        3,
        32,
        (3,),
        False,
    )


def test_hook_shapes_dtypes_and_weights(moe_models):
    model = moe_models["k3_step2"]
    _, cache = model.run_with_cache(random_tokens(2, 7), names_filter=lambda name: True)  # the split inputs too
    expected = model.hook_shapes(batch=2, pos=7)
    assert set(cache.keys()) == set(model.hook_names)
    for name in model.hook_names:
        assert tuple(cache[name].shape) == expected[name], name
    assert expected["blocks.1.mlp.hook_expert_post"] == (2, 7, 3, 32)
    assert expected["blocks.1.mlp.hook_router_logits"] == (2, 7, 6)
    assert cache["expert_indices", 1].dtype == torch.long
    probs = F.softmax(cache["router_logits", 1], dim=-1)
    top = probs.topk(3, dim=-1)
    torch.testing.assert_close(cache["expert_weights", 1], top.values)  # not renormalised
    assert torch.equal(cache["expert_indices", 1], top.indices)  # the model's softmax and top-k on its own logits
    # per slot: pre = the gate pre-activation of the expert the slot holds, post = silu(pre) * up
    mlp, indices = model.blocks[1].mlp, cache["expert_indices", 1]
    x = model.blocks[1].ln2(cache["resid_mid", 1])
    pre = torch.einsum("bpd,bpkdi->bpki", x, mlp.W_gate[indices])
    up = torch.einsum("bpd,bpkdi->bpki", x, mlp.W_in[indices])
    torch.testing.assert_close(cache["expert_pre", 1], pre, rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["expert_post", 1], F.silu(pre) * up, rtol=0, atol=1e-5)
    _, normed_cache = moe_models["k1_norm"].run_with_cache(
        random_tokens(2, 7), names_filter=lambda n: "expert_weights" in n
    )
    assert torch.all(normed_cache["expert_weights", 0] == 1.0)


# ----------------------------------------------------------------------------- references from raw weights
def reference_rms_norm(x, weight, eps):
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


def reference_moe(x, tensors, layer, n_experts, top_k, norm_topk_prob, excluded=(), zero_neuron=None):
    """The sparse MLP from the file's tensors, computed densely per slot: route over the experts
    not in `excluded`, optionally with `zero_neuron = (expert, j)` ablated. x: [batch pos d_model]."""
    prefix = f"model.layers.{layer}.mlp."
    router = tensors[prefix + "gate.weight"]
    gate = torch.stack([tensors[f"{prefix}experts.{e}.gate_proj.weight"] for e in range(n_experts)])
    up = torch.stack([tensors[f"{prefix}experts.{e}.up_proj.weight"] for e in range(n_experts)])
    down = torch.stack([tensors[f"{prefix}experts.{e}.down_proj.weight"] for e in range(n_experts)])
    kept = torch.tensor([e for e in range(n_experts) if e not in excluded])
    probs = torch.softmax((x @ router.T)[..., kept].float(), dim=-1)  # a softmax over the kept experts only
    weights, positions = probs.topk(top_k, dim=-1)
    experts = kept[positions]  # [batch pos top_k]
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    hidden = F.silu(torch.einsum("bpd,bpkid->bpki", x, gate[experts])) * torch.einsum("bpd,bpkid->bpki", x, up[experts])
    if zero_neuron is not None:
        expert, neuron = zero_neuron
        hidden[..., neuron] = torch.where(experts == expert, 0.0, hidden[..., neuron])
    out = torch.einsum("bpki,bpkdi->bpkd", hidden, down[experts])
    return (out * weights[..., None]).sum(2), experts


def most_used_expert(indices: torch.Tensor) -> int:
    return int(torch.bincount(indices.flatten()).argmax())


@pytest.mark.parametrize("case", ["k2_norm", "k3_step2", "k1"])
def test_masking_an_expert_at_router_logits_routes_over_the_others(moe_dirs, moe_models, case):
    model, cfg = moe_models[case], moe_models[case].cfg
    layer = sparse_layers(model)[-1]
    tokens = random_tokens(3, 13, seed=5)
    _, clean = model.run_with_cache(
        tokens, names_filter=[f"blocks.{layer}.mlp.hook_expert_indices", f"blocks.{layer}.hook_mlp_out"]
    )
    expert = most_used_expert(clean["expert_indices", layer])

    def mask_expert(logits, hook):
        logits[..., expert] = float("-inf")

    with model.hooks(fwd_hooks=[(f"blocks.{layer}.mlp.hook_router_logits", mask_expert)]):
        _, masked = model.run_with_cache(tokens, names_filter=lambda n: n.startswith(f"blocks.{layer}."))
    assert not (masked["expert_indices", layer] == expert).any()
    tensors = load_file(moe_dirs[case] / "model.safetensors")
    x = reference_rms_norm(
        masked["resid_mid", layer], tensors[f"model.layers.{layer}.post_attention_layernorm.weight"], cfg.rms_norm_eps
    )
    expected, experts = reference_moe(
        x, tensors, layer, cfg.n_experts, cfg.top_k, cfg.norm_topk_prob, excluded={expert}
    )
    # Integers: the same experts unless two router logits lie within float32 rounding (none here)
    assert torch.equal(experts, masked["expert_indices", layer])
    torch.testing.assert_close(masked["mlp_out", layer], expected, rtol=0, atol=1e-5)
    assert (masked["mlp_out", layer] - clean["mlp_out", layer]).abs().max() > 1e-2  # the mask did something


def test_removing_every_expert_of_a_layer_is_refused_not_nan(moe_models):
    """With every router logit at -inf the softmax is 0 / 0: refused, naming the way to remove the layer, both for
    an ablation selecting every expert (at registration, before any forward) and for hooks that together mask
    them all (at the router, for the rows they empty); nothing stays registered. One expert left routes as usual."""
    model = moe_models["k1"]
    layer, n_experts = sparse_layers(model)[-1], model.cfg.n_experts
    tokens = random_tokens(2, 5, seed=3)
    point = f"blocks.{layer}.mlp.hook_router_logits"
    message = (
        rf"{point}: every one of the layer's {n_experts} experts is ablated.*'L{layer}.mlp', or"
        rf" blocks.{layer}.hook_mlp_out"
    )
    with pytest.raises(ValueError, match=message):
        hooked.ablate.hooks(model, [f"L{layer}.E{e}" for e in range(n_experts)], "zero")
    with pytest.raises(ValueError, match=message):
        model.run_with_hooks(tokens, fwd_hooks=[(point, hooked.ablate.zero(experts=list(range(n_experts))))])

    def mask(expert):
        def hook(logits, hook):
            logits[1:, 2:, expert] = float("-inf")  # rows 1.., positions 2..: those rows end with no expert

        return hook

    with pytest.raises(ValueError, match=message):
        model.run_with_hooks(tokens, fwd_hooks=[(point, mask(e)) for e in range(n_experts)])
    assert not any(p.has_hooks() for p in model.hook_dict.values())  # the refused call left nothing registered
    with torch.no_grad():
        kept = model.run_with_hooks(tokens, fwd_hooks=[(point, mask(e)) for e in range(1, n_experts)])
    assert torch.isfinite(kept).all()


@pytest.mark.parametrize("case", ["k2_norm", "k3_step2"])
def test_ablating_an_expert_neuron_equals_zeroing_its_down_proj_column(moe_dirs, moe_models, case):
    model, cfg = moe_models[case], moe_models[case].cfg
    layer, neuron = sparse_layers(model)[-1], 5
    tokens = random_tokens(3, 13, seed=6)
    _, clean = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.mlp.hook_expert_indices")
    expert = most_used_expert(clean["expert_indices", layer])
    seen = {}

    def keep_indices(indices, hook):
        seen["indices"] = indices

    def ablate(post, hook):
        post[..., neuron] = torch.where(seen["indices"] == expert, 0.0, post[..., neuron])

    with torch.no_grad():
        ablated = model.run_with_hooks(
            tokens,
            fwd_hooks=[
                (f"blocks.{layer}.mlp.hook_expert_indices", keep_indices),
                (f"blocks.{layer}.mlp.hook_expert_post", ablate),
            ],
        )
        edited = copy.deepcopy(model)
        edited.blocks[layer].mlp.experts.down_proj[expert, :, neuron] = 0.0
        # Exact: the same matmuls of the same shapes, a zero entering as an activation or as a weight
        assert torch.equal(ablated, edited(tokens))
        assert (ablated - model(tokens)).abs().max() > 1e-4
    # and against the reference from the file, at the layer
    with model.hooks(
        fwd_hooks=[
            (f"blocks.{layer}.mlp.hook_expert_indices", keep_indices),
            (f"blocks.{layer}.mlp.hook_expert_post", ablate),
        ]
    ):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith(f"blocks.{layer}."))
    tensors = load_file(moe_dirs[case] / "model.safetensors")
    x = reference_rms_norm(
        cache["resid_mid", layer], tensors[f"model.layers.{layer}.post_attention_layernorm.weight"], cfg.rms_norm_eps
    )
    expected, _ = reference_moe(
        x, tensors, layer, cfg.n_experts, cfg.top_k, cfg.norm_topk_prob, zero_neuron=(expert, neuron)
    )
    torch.testing.assert_close(cache["mlp_out", layer], expected, rtol=0, atol=1e-5)


def test_unrouted_experts_are_never_computed(moe_models):
    """An expert no token is routed to never runs: NaN weights in it (masked out of routing) stay invisible."""
    model = moe_models["k2_norm"]
    tokens = random_tokens(2, 9)

    def mask(logits, hook):
        logits[..., 3] = float("-inf")

    with torch.no_grad():
        poisoned = copy.deepcopy(model)
        for layer in sparse_layers(model):
            poisoned.blocks[layer].mlp.experts.gate_up_proj[3] = float("nan")
        logits = poisoned.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_router_logits"), mask)])
        assert torch.isfinite(logits).all()
        assert torch.equal(  # exact: the masked expert never runs, so the same operations run on the same numbers
            logits, model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_router_logits"), mask)])
        )


def test_expert_hooks_carry_gradients(moe_models):
    model = moe_models["k1"]
    tokens = random_tokens(2, 6)
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda n: "expert_post" in n or "router_logits" in n, incl_bwd=True, return_type="loss"
    )
    assert cache["blocks.1.mlp.hook_expert_post_grad"].shape == (2, 6, 1, 64)
    assert cache["blocks.1.mlp.hook_router_logits_grad"].abs().sum() > 0  # the weights depend on the router


def test_replacing_expert_indices_reroutes(moe_models):
    model = moe_models["k1"]
    tokens = random_tokens(2, 6)

    def force_expert_2(indices, hook):
        return torch.full_like(indices, 2)

    def bad_index(indices, hook):
        return torch.full_like(indices, 4)

    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.1."))
    with model.hooks(fwd_hooks=[("blocks.1.mlp.hook_expert_indices", force_expert_2)]):
        _, forced = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.1."))
    mlp = model.blocks[1].mlp
    x = model.blocks[1].ln2(forced["resid_mid", 1])
    expected = (F.silu(x @ mlp.W_gate[2]) * (x @ mlp.W_in[2])) @ mlp.W_out[2]
    torch.testing.assert_close(forced["mlp_out", 1], expected * forced["expert_weights", 1], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="expert ids in 0..3"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.mlp.hook_expert_indices", bad_index)])


def test_left_padded_batch_matches_each_prompt_alone(moe_models):
    model = moe_models["k2_norm"]
    prompts, tokens, mask = left_padded([10, 3, 7], seed=20)
    with torch.no_grad():
        batched = model(tokens, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(batched[row, -len(prompt) :], model(prompt[None])[0], rtol=0, atol=1e-5)


def test_sharded_checkpoint_loads_identically(tmp_path, moe_models):
    config = transformers.Qwen3MoeConfig(vocab_size=VOCAB, **MOE_CASES["k3_step2"])
    directory = build_checkpoint(
        tmp_path / "sharded", config, transformers.Qwen3MoeForCausalLM, seed=1, max_shard_size="20KB"
    )
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    expert_shards = {file for key, file in index["weight_map"].items() if ".experts." in key}
    assert len(expert_shards) > 1  # one layer's experts are spread over several shards
    sharded = hooked.load(directory)
    tokens = random_tokens(2, 6)
    with torch.no_grad():
        assert torch.equal(sharded(tokens), moe_models["k3_step2"](tokens))  # the same weights, the same forward


QWEN3_MOE_SPARSE_BLOCK = [  # the hook points of a sparse block, in forward order
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
    "mlp.hook_router_logits",
    "mlp.hook_expert_weights",
    "mlp.hook_expert_indices",
    "mlp.hook_expert_pre",
    "mlp.hook_expert_post",
    "mlp.hook_expert_result",
    "hook_mlp_out",
    "hook_resid_post",
]
# Layer 0 dense (a Qwen3 block), layer 1 sparse (decoder_sparse_step 2)
GOLDEN_MOE_HOOK_NAMES = golden_hook_names([QWEN3_BLOCK, QWEN3_MOE_SPARSE_BLOCK])


def test_golden_hook_names(moe_models):
    """Layer 0 dense, layer 1 sparse (decoder_sparse_step 2)."""
    assert moe_models["k1"].hook_names == GOLDEN_MOE_HOOK_NAMES


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "edit, message",
    [
        ("drop_expert", r"missing tensors: \['blocks.1.mlp.experts.gate_up_proj\[2\] \(part 2 of 2\)'\]"),
        ("drop_down", r"missing tensors: \['blocks.1.mlp.experts.down_proj\[0\]'\]"),
        ("reshape_expert", r"mis-shaped tensors: model.layers.1.mlp.experts.2.up_proj.weight: \(64, 63\)"),
        ("extra_expert", "unexpected tensors.*model.layers.1.mlp.experts.4.up_proj.weight"),
        ("drop_router", r"missing tensors: \['blocks.1.mlp.gate.weight'\]"),
        ("expert_on_dense_layer", "unexpected tensors.*model.layers.0.mlp.experts.0.up_proj.weight"),
    ],
)
def test_bad_expert_tensors_raise_checkpoint_error(tmp_path, moe_dirs, edit, message):
    directory = copy_checkpoint(moe_dirs["k1"], tmp_path / edit)
    tensors = load_file(directory / "model.safetensors")
    key = "model.layers.1.mlp.experts.2.up_proj.weight"
    if edit == "drop_expert":
        del tensors[key]
    elif edit == "drop_down":
        del tensors["model.layers.1.mlp.experts.0.down_proj.weight"]
    elif edit == "reshape_expert":
        tensors[key] = tensors[key][:, :63].clone()
    elif edit == "extra_expert":
        tensors["model.layers.1.mlp.experts.4.up_proj.weight"] = tensors[key].clone()
    elif edit == "drop_router":
        del tensors["model.layers.1.mlp.gate.weight"]
    else:
        tensors["model.layers.0.mlp.experts.0.up_proj.weight"] = tensors[key].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hooked.CheckpointError, match=message):
        hooked.load(directory)


def test_unknown_architecture_and_bad_tokens(tmp_path, moe_dirs, moe_models):
    directory = copy_checkpoint(moe_dirs["k1"], tmp_path / "unknown")
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next")
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(hooked.CheckpointError, match="Qwen3NextForCausalLM.*supported.*Qwen3MoeForCausalLM"):
        hooked.load(directory)
    with pytest.raises(ValueError, match="out of range"):
        moe_models["k1"](torch.tensor([[0, VOCAB + 3]]))
