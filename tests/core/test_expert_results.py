"""Per-expert writes of Qwen3-MoE blocks: `cache.get_expert_results`, `stack_expert_results` and the experts in
`get_full_resid_decomposition`.

Each expert's write is checked against a reference computed from the raw weights (routing weight x
down(silu(gate x) * up x)), its sum over experts against `mlp_out`, and every full decomposition's total
against the residual stream, at float32 tolerance. Models are tiny random ones (hooked.testing.random_model)
with dense and sparse blocks mixed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hooked
from hooked.interventions.addresses import parse_address
from hooked.testing import random_model

ATOL = 1e-5


def close(ours, theirs, atol=ATOL):
    assert ours.shape == theirs.shape, f"{tuple(ours.shape)} != {tuple(theirs.shape)}"
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)


# block 1 and 3 sparse (decoder_sparse_step=2), block 3 kept dense by mlp_only_layers in "mixed"
CASES = {
    "mixed": dict(n_layers=4, n_experts=6, top_k=2, decoder_sparse_step=2, mlp_only_layers=(3,)),
    "all_sparse_top3_norm": dict(n_layers=2, n_experts=5, top_k=3, norm_topk_prob=True),
    "top1": dict(n_layers=2, n_experts=4, top_k=1),
}


@pytest.fixture(scope="module", params=list(CASES))
def run(request):
    model = random_model("qwen3_moe", seed=7, **CASES[request.param])
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 9), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    return model, cache


def sparse_layers(model) -> list[int]:
    return [i for i in range(model.cfg.n_layers) if model.cfg.is_sparse(i)]


def reference_expert_results(model, cache, layer: int) -> torch.Tensor:
    """[batch pos n_experts d_model] from the raw stacked weights and the cached routing."""
    mlp = model.blocks[layer].mlp
    with torch.no_grad():
        x = model.blocks[layer].ln2(cache["resid_mid", layer])
        weights, indices = cache["expert_weights", layer], cache["expert_indices", layer]
        out = torch.zeros(*x.shape[:2], model.cfg.n_experts, model.cfg.d_model)
        for expert in range(model.cfg.n_experts):
            gate, up = mlp.experts.gate_up_proj[expert].chunk(2)
            write = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), mlp.experts.down_proj[expert])
            weight = (weights * (indices == expert)).sum(-1, keepdim=True)  # 0 where not routed
            out[:, :, expert] = weight * write
    return out


def test_each_expert_writes_its_routed_share_and_unrouted_experts_write_zero(run):
    model, cache = run
    for layer in sparse_layers(model):
        results = cache.get_expert_results(layer)
        assert results.shape == (3, 9, model.cfg.n_experts, model.cfg.d_model)
        close(results, reference_expert_results(model, cache, layer))
        routed = F.one_hot(cache["expert_indices", layer], model.cfg.n_experts).sum(-2).bool()  # [batch pos n_experts]
        assert torch.all(results[~routed] == 0)
        assert torch.all(results[routed].abs().sum(-1) > 0)
        assert torch.equal(cache.get_expert_results(layer - model.cfg.n_layers), results)  # one layer, two names


def test_experts_sum_to_the_mlp_output(run):
    model, cache = run
    for layer in sparse_layers(model):
        close(cache.get_expert_results(layer).sum(-2), cache["mlp_out", layer])


def test_stack_expert_results_orders_and_labels_like_stack_head_results(run):
    model, cache = run
    sparse, n_experts = sparse_layers(model), model.cfg.n_experts
    stack, labels = cache.stack_expert_results(return_labels=True)
    assert labels == [f"L{i}.E{e}" for i in sparse for e in range(n_experts)]
    assert stack.shape == (len(labels), 3, 9, model.cfg.d_model)
    for row, label in enumerate(labels):
        component = parse_address(model, label)  # a label is an address ablate and patch take
        layer, expert = int(component.hook_name.split(".")[1]), component.selectors["experts"][0]
        assert torch.equal(stack[row], cache.get_expert_results(layer)[:, :, expert])  # the stack copies them
    upto = sparse[0] + 1
    assert cache.stack_expert_results(upto, return_labels=True)[1] == [f"L{sparse[0]}.E{e}" for e in range(n_experts)]
    assert cache.stack_expert_results(0).shape == (0, 3, 9, model.cfg.d_model)
    with_remainder, remainder_labels = cache.stack_expert_results(upto, return_labels=True, incl_remainder=True)
    assert remainder_labels[-1] == "remainder"
    close(with_remainder.sum(0), cache["resid_pre", upto] if upto < model.cfg.n_layers else cache["resid_post", -1])


def test_stack_expert_results_slices_positions_and_applies_the_norm(run):
    model, cache = run
    whole = cache.stack_expert_results()
    close(cache.stack_expert_results(pos_slice=-1), whole[:, :, -1])
    close(cache.stack_expert_results(pos_slice=(2, 5)), whole[:, :, 2:5])
    normalized = cache.stack_expert_results(apply_ln=True)
    close(normalized, cache.apply_ln_to_stack(whole, -1))
    single = model.run_with_cache(torch.randint(0, model.cfg.d_vocab, (1, 6)), remove_batch_dim=True)[1]
    layer = sparse_layers(model)[0]
    close(single.get_expert_results(layer).sum(-2), single["mlp_out", layer])  # [pos n_experts d_model]


@pytest.mark.parametrize(
    "expand",
    [dict(), dict(expand_neurons=False), dict(expand_experts=False), dict(expand_neurons=False, expand_experts=True)],
)
def test_full_decomposition_with_experts_sums_to_the_residual_stream(run, expand):
    model, cache = run
    n_layers = model.cfg.n_layers
    for layer, mlp_input in [
        (None, False),
        (-1, False),
        (0, False),
        (0, True),
        (1, False),
        (1, True),
        (n_layers - 1, True),
    ]:
        full, labels = cache.get_full_resid_decomposition(layer, mlp_input, return_labels=True, **expand)
        upto = n_layers if layer in (None, -1) else layer
        resid = (
            cache["resid_mid", upto]
            if mlp_input
            else (cache["resid_post", -1] if upto == n_layers else cache["resid_pre", upto])
        )
        close(full.sum(0), resid)
        assert len(labels) == full.shape[0] and labels[-2:] == ["embed", "bias"]
        experts = expand.get("expand_experts", expand.get("expand_neurons", True))
        neurons = expand.get("expand_neurons", True)
        for i in range(upto):
            if model.cfg.is_sparse(i):
                assert (f"L{i}.E0" in labels) == experts and (f"{i}_mlp_out" in labels) != experts
            else:
                assert (f"L{i}N0" in labels) == neurons and (f"{i}_mlp_out" in labels) != neurons


def test_full_decomposition_keeps_block_order_and_each_blocks_experts_sum_to_its_mlp_output(run):
    model, cache = run
    full, labels = cache.get_full_resid_decomposition(return_labels=True)
    heads = model.cfg.n_layers * model.cfg.n_heads
    mlp_layers = [int(label[1:].split("N")[0].split(".")[0]) for label in labels[heads:-2]]
    assert mlp_layers == sorted(mlp_layers)  # block by block
    for layer in sparse_layers(model):
        rows = [i for i, label in enumerate(labels) if label.startswith(f"L{layer}.E")]
        close(full[rows].sum(0), cache["mlp_out", layer])
    projected = cache.get_full_resid_decomposition(apply_ln=True, project_output_onto=torch.ones(model.cfg.d_model))
    close(projected, cache.apply_ln_to_stack(full, None).sum(-1), atol=1e-4)


def test_experts_in_two_slots_of_a_token_accumulate():
    """A hook may route both slots of a token to one expert; that expert's write then holds both."""
    model = random_model("qwen3_moe", seed=7, **CASES["mixed"])
    layer = sparse_layers(model)[0]

    def same_expert(indices, hook):
        return torch.zeros_like(indices)

    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(3))
    with model.hooks(fwd_hooks=[(f"blocks.{layer}.mlp.hook_expert_indices", same_expert)]):
        _, cache = model.run_with_cache(tokens)
    assert torch.all(cache["expert_indices", layer] == 0)
    results = cache.get_expert_results(layer)
    close(results[:, :, 0], cache["mlp_out", layer])
    assert torch.all(results[:, :, 1:] == 0)


# ----------------------------------------------------------------------------- errors
def test_neuron_stacks_of_a_sparse_block_point_to_the_expert_results(run):
    model, cache = run
    layer = sparse_layers(model)[0]
    with pytest.raises(
        ValueError,
        match=rf"blocks.{layer}.mlp is a mixture of experts.*get_expert_results\({layer}\).*stack_expert_results",
    ):
        cache.get_neuron_results(layer)
    with pytest.raises(ValueError, match="mixture of experts.*stack_expert_results"):
        cache.stack_neuron_results(-1)


def test_missing_hooks_and_dense_blocks_are_named(run):
    model, cache = run
    layer = sparse_layers(model)[0]
    tokens = torch.randint(0, model.cfg.d_vocab, (1, 4))
    _, partial = model.run_with_cache(tokens, names_filter=lambda name: not name.endswith("hook_expert_weights"))
    with pytest.raises(
        KeyError,
        match=rf"blocks.{layer}.mlp.hook_expert_post, blocks.{layer}.mlp.hook_expert_weights,"
        rf" blocks.{layer}.mlp.hook_expert_indices; this cache lacks blocks.{layer}.mlp.hook_expert_weights:",
    ):
        partial.get_expert_results(layer)
    dense = [i for i in range(model.cfg.n_layers) if not model.cfg.is_sparse(i)]
    if dense:
        with pytest.raises(ValueError, match=rf"blocks.{dense[0]}.mlp is dense.*get_neuron_results\({dense[0]}\)"):
            cache.get_expert_results(dense[0])


def test_a_model_without_experts_refuses_stack_expert_results(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    with pytest.raises(ValueError, match="GPT2 has no mixture-of-experts block.*stack_neuron_results"):
        cache.stack_expert_results()
    assert isinstance(cache, hooked.ActivationCache)
