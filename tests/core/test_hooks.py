"""The hook algebra: names, shapes, replacement semantics, ownership and clean-up.

A hook that only reads, or an edit made in place and the same edit returned, leaves the forward on the same path
with the same shapes: the same kernels in the same order, so those compare exactly (torch.equal); a hook that
moves attention or a norm onto its step-by-step path compares to float32 rounding.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.families.parity import golden_hook_names

GPT2_BLOCK = [  # the hook points of one block, in forward order
    "hook_resid_pre",
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
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
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
]
GOLDEN_GPT2_HOOKS = golden_hook_names([GPT2_BLOCK] * 2, embed=("hook_embed", "hook_pos_embed"))

hypothesis_settings = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def test_golden_hook_names(gpt2):
    """Any rename or reordering is deliberate: this list changes only together with docs/hooks.md."""
    assert gpt2.hook_names == GOLDEN_GPT2_HOOKS


def test_hook_dict_is_in_forward_order(gpt2, tokens):
    fired = []
    with torch.no_grad():
        gpt2.run_with_hooks(tokens, fwd_hooks=[(lambda name: True, lambda x, hook: fired.append(hook.name))])
    assert fired == gpt2.hook_names


def test_declared_shapes_are_the_real_shapes(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens, names_filter=lambda name: True)  # the split inputs too
    declared = gpt2.hook_shapes(batch=tokens.shape[0], pos=tokens.shape[1])
    assert {name: tuple(t.shape) for name, t in cache.items()} == declared


def test_a_default_cache_leaves_out_the_split_inputs_and_results_as_transformer_lens(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    split = [
        name for name in gpt2.hook_names if name.endswith(("_input", "hook_mlp_in", "mlp.hook_in", "attn.hook_result"))
    ]
    assert len(split) == 6 * gpt2.cfg.n_layers
    assert set(cache.keys()) == set(gpt2.hook_names) - set(split)
    gpt2.set_use_attn_result(True)
    try:
        _, with_results = gpt2.run_with_cache(tokens)
    finally:
        gpt2.set_use_attn_result(False)
    assert set(with_results.keys()) - set(cache.keys()) == {
        f"blocks.{i}.attn.hook_result" for i in range(gpt2.cfg.n_layers)
    }


def test_hook_knows_its_layer_and_context(gpt2, tokens):
    seen = {}

    def record(activation, hook):
        hook.ctx["calls"] = hook.ctx.get("calls", 0) + 1
        seen[hook.name] = hook.layer()

    with torch.no_grad():
        gpt2.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_z"), record)])
    assert seen == {"blocks.0.attn.hook_z": 0, "blocks.1.attn.hook_z": 1}
    assert gpt2.hook_dict["blocks.1.attn.hook_z"].ctx.pop("calls") == 1
    gpt2.hook_dict["blocks.0.attn.hook_z"].ctx.clear()
    with pytest.raises(ValueError, match="not inside a block"):
        gpt2.hook_dict["hook_embed"].layer()


@hypothesis_settings
@given(data=st.data())
def test_identity_and_clone_hooks_leave_logits_unchanged(gpt2, tokens, data):
    names = data.draw(st.lists(st.sampled_from(GOLDEN_GPT2_HOOKS), min_size=1, max_size=6, unique=True))
    returns_clone = data.draw(st.booleans())
    fn = (lambda x, hook: x.clone()) if returns_clone else (lambda x, hook: None)
    # Listening to scores, pattern, result, a norm's scale or the split q/k/v inputs moves to an equivalent path
    # (eager attention, per-head sums, the norm step by step, per-head projections) that sums in another order:
    # float32 rounding. Every other hook point must leave the same kernels running in the same order: exact.
    path_changing = (
        *("hook_attn_scores", "hook_pattern", "hook_result", "hook_scale", "hook_normalized"),
        *("hook_q_input", "hook_k_input", "hook_v_input"),
    )
    changes_path = any(n.split(".")[-1] in path_changing for n in names)
    with torch.no_grad():
        clean = gpt2(tokens)
        hooked_logits = gpt2.run_with_hooks(tokens, fwd_hooks=[(names, fn)])
    if changes_path:
        torch.testing.assert_close(hooked_logits, clean, rtol=0, atol=1e-5)
    else:
        assert torch.equal(hooked_logits, clean)


@hypothesis_settings
@given(name=st.sampled_from(GOLDEN_GPT2_HOOKS))
def test_what_a_hook_sees_is_what_the_cache_stores(gpt2, tokens, name):
    seen = []
    with torch.no_grad():
        _, cache = gpt2.run_with_cache(tokens, names_filter=name)
        gpt2.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: seen.append(x.clone()))])
    assert list(cache.keys()) == [name]
    assert torch.equal(seen[0], cache[name])


@hypothesis_settings
@given(layer=st.integers(0, 1), head=st.integers(0, 3))
def test_zeroing_a_head_of_z_equals_zeroing_its_rows_of_the_output_projection(gpt2, gpt2_dir, tokens, layer, head):
    import hooked

    d_head = gpt2.cfg.d_head

    def zero_head(z, hook):
        z[:, :, head] = 0.0  # in place: z is a view of c_proj's input

    with torch.no_grad():
        ablated = gpt2.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])
        edited = hooked.load(gpt2_dir)
        edited.blocks[layer].attn.c_proj.weight[head * d_head : (head + 1) * d_head] = 0.0  # Conv1D: [in, out]
        expected = edited(tokens)
    assert torch.equal(ablated, expected)  # exact: the same matmul shapes, the zero as an input or as a weight


def test_replacing_z_by_return_equals_in_place_edit(gpt2, tokens):
    def in_place(z, hook):
        z[:, 3:, 1] *= 0.5

    def returned(z, hook):
        z = z.clone()
        z[:, 3:, 1] *= 0.5
        return z

    with torch.no_grad():
        a = gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", in_place)])
        b = gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", returned)])
    assert torch.equal(a, b)
    assert not torch.equal(a, gpt2(tokens))


def test_resid_post_edit_reaches_the_next_block_and_logits(gpt2, tokens):
    """Patching resid_post of the last block by a known vector shifts the final norm's input exactly."""
    delta = torch.zeros(gpt2.cfg.d_model)
    delta[0] = 3.0
    with torch.no_grad():
        _, clean = gpt2.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post")
        logits = gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: x + delta)])
        manual = torch.nn.functional.linear(gpt2.ln_final(clean["blocks.1.hook_resid_post"] + delta), gpt2.wte.weight)
    assert torch.equal(logits, manual)  # exact: GPT-2's own final norm and unembedding, the same ops and shapes


def test_in_place_edit_at_resid_pre_does_not_corrupt_cached_resid_post(gpt2, tokens):
    """TransformerLens' aliasing footgun: resid_post of block 0 and resid_pre of block 1 are one tensor."""
    with torch.no_grad():
        _, reference = gpt2.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
        with gpt2.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x.mul_(0.0))]):
            _, cache = gpt2.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"])
    assert torch.equal(cache["blocks.0.hook_resid_post"], reference["blocks.0.hook_resid_post"])
    assert cache["blocks.1.hook_resid_pre"].abs().max() == 0


def test_hooks_run_in_registration_order_and_prepend(gpt2, tokens):
    order = []
    gpt2.add_hook("hook_embed", lambda x, h: order.append("first"))
    gpt2.add_hook("hook_embed", lambda x, h: order.append("second"))
    gpt2.add_hook("hook_embed", lambda x, h: order.append("prepended"), prepend=True)
    with torch.no_grad():
        gpt2(tokens)
    gpt2.reset_hooks()
    assert order == ["prepended", "first", "second"]


def test_permanent_hooks_survive_reset(gpt2, tokens):
    calls = []
    gpt2.add_hook("hook_embed", lambda x, h: calls.append("permanent"), is_permanent=True)
    gpt2.add_hook("hook_embed", lambda x, h: calls.append("temporary"))
    gpt2.reset_hooks()
    with torch.no_grad():
        gpt2(tokens)
    assert calls == ["permanent"]
    gpt2.reset_hooks(including_permanent=True)
    assert not gpt2.hook_dict["hook_embed"]._fwd


def test_nested_contexts_remove_only_their_own(gpt2, tokens):
    calls = []
    outer = ("hook_embed", lambda x, h: calls.append("outer"))
    inner = ("hook_embed", lambda x, h: calls.append("inner"))
    with torch.no_grad(), gpt2.hooks(fwd_hooks=[outer]):
        with gpt2.hooks(fwd_hooks=[inner]):
            gpt2(tokens)
        gpt2(tokens)
    gpt2(tokens)
    assert calls == ["outer", "inner", "outer"]


def test_reset_hooks_end_false_keeps_hooks_until_reset(gpt2, tokens):
    calls = []
    with torch.no_grad():
        gpt2.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, h: calls.append(1))], reset_hooks_end=False)
        gpt2(tokens)
    gpt2.reset_hooks()
    assert calls == [1, 1]


class Boom(Exception):
    pass


def test_hooks_are_removed_when_a_hook_raises(gpt2, tokens):
    def explode(x, hook):
        raise Boom

    with pytest.raises(Boom):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, h: None), ("blocks.1.hook_mlp_out", explode)])
    with pytest.raises(Boom), gpt2.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, h: None)]):
        raise Boom
    with pytest.raises(Boom), gpt2.hooks(fwd_hooks=[("blocks.0.attn.hook_z", explode)]):
        gpt2.run_with_cache(tokens)
    # the autouse fixture asserts that nothing is left registered


def test_a_failing_registration_leaves_nothing_behind(gpt2):
    with pytest.raises(KeyError):
        with gpt2.hooks(fwd_hooks=[("hook_embed", lambda x, h: None), ("blocks.0.hook_resid_psot", lambda x, h: None)]):
            pass


def test_unknown_hook_name_suggests_the_nearest(gpt2, tokens):
    with pytest.raises(KeyError, match="blocks.0.hook_resid_post"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_psot", lambda x, h: None)])
    with pytest.raises(KeyError, match="attn.hook_pattern"):
        gpt2.add_hook("blocks.1.attn.hook_patern", lambda x, h: None)


def test_filter_matching_nothing_raises(gpt2, tokens):
    with pytest.raises(ValueError, match="matches no hook point"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("hook_rot_q"), lambda x, h: None)])
    with pytest.raises(ValueError, match="matches no hook point"):
        gpt2.run_with_cache(tokens, names_filter=lambda name: "nothing" in name)


def test_wrong_shape_replacement_names_the_hook_and_both_shapes(gpt2, tokens):
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.hook_z.*\(3, 11, 4\).*\(3, 11, 4, 16\)"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, h: z[..., 0])])
    with pytest.raises(ValueError, match="returned torch.float64 on cpu, but the activation is torch.float32"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, h: x.double())])
    with pytest.raises(ValueError, match="meta"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, h: x.to("meta"))])
    with pytest.raises(TypeError, match="return a Tensor"):
        gpt2.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, h: 0.0)])


def test_backward_hooks_receive_the_activation_gradient(gpt2, tokens):
    grads = {}
    name = "blocks.0.hook_resid_mid"
    with torch.enable_grad():
        kept = {}

        def keep(x, hook):
            x.retain_grad()
            kept["x"] = x

        loss = gpt2.run_with_hooks(
            tokens,
            fwd_hooks=[(name, keep)],
            bwd_hooks=[(name, lambda g, hook: grads.__setitem__(hook.name, g.clone()))],
            return_type="loss",
        )
        loss.backward()
    assert torch.equal(grads[name], kept["x"].grad)
    assert grads[name].abs().sum() > 0


def test_backward_hook_can_replace_the_gradient(gpt2, tokens):
    with torch.enable_grad():
        embed = {}
        loss = gpt2.run_with_hooks(
            tokens,
            fwd_hooks=[("hook_embed", lambda x, h: embed.__setitem__("x", x) or x.retain_grad())],
            bwd_hooks=[("blocks.0.hook_resid_pre", lambda g, hook: torch.zeros_like(g))],
            return_type="loss",
        )
        loss.backward()
    assert embed["x"].grad.abs().max() == 0


def test_backward_hook_without_gradients_is_an_error(gpt2, tokens):
    with torch.no_grad(), pytest.raises(RuntimeError, match="without gradients"):
        gpt2.run_with_hooks(tokens, bwd_hooks=[("hook_embed", lambda g, h: None)])


def test_unhooked_point_is_an_identity_that_skips_module_machinery(gpt2):
    from hooked.hooks import HookPoint

    point = HookPoint("batch pos d_model")
    x = torch.randn(2, 3, 4)
    assert point(x) is x
    with pytest.raises(TypeError, match="add_hook"):  # torch's module hooks would never fire
        point.register_forward_hook(lambda *args: None)


def test_transformer_lens_weight_views_reproduce_the_activations(gpt2, tokens):
    """q = ln1(x) @ W_Q[h] + b_Q[h], attn_out = sum_h z_h @ W_O[h] + b_O, mlp pre = ln2(x) @ W_in + b."""
    _, cache = gpt2.run_with_cache(tokens)
    block = gpt2.blocks[1]
    with torch.no_grad():
        ln1_out = block.ln1(cache["resid_pre", 1])
        q = torch.einsum("bpm,hmd->bphd", ln1_out, gpt2.W_Q[1]) + block.attn.b_Q
        v = torch.einsum("bpm,hmd->bphd", ln1_out, block.attn.W_V) + block.attn.b_V
        attn_out = torch.einsum("bphd,hdm->bpm", cache["z", 1], gpt2.W_O[1]) + block.attn.b_O
        pre = block.ln2(cache["resid_mid", 1]) @ gpt2.W_in[1] + block.mlp.c_fc.bias
        mlp_out = cache["post", 1] @ gpt2.W_out[1] + block.mlp.c_proj.bias
    for computed, name in [(q, "q"), (v, "v"), (attn_out, "attn_out"), (pre, "pre"), (mlp_out, "mlp_out")]:
        torch.testing.assert_close(computed, cache[name, 1], rtol=0, atol=1e-5, msg=name)
    assert torch.equal(gpt2.W_E[tokens], cache["embed"])
    assert torch.equal(gpt2.W_pos[: tokens.shape[1]].expand_as(cache["pos_embed"]), cache["pos_embed"])
    assert gpt2.W_U.shape == (gpt2.cfg.d_model, gpt2.cfg.d_vocab)


@pytest.mark.unchecked
def test_reset_hooks_clears_contexts_and_keeps_a_direction(gpt2, tokens):
    """As TransformerLens 3.9 HookedRootModule.reset_hooks(clear_contexts=True, direction=...,
    including_permanent=...)."""
    point = gpt2.hook_dict["blocks.0.hook_mlp_out"]
    gpt2.add_hook("blocks.0.hook_mlp_out", lambda x, hook: hook.ctx.__setitem__("seen", True))
    with torch.no_grad():
        gpt2(tokens)
    gpt2.add_hook("blocks.0.hook_mlp_out", lambda grad, hook: None, dir="bwd")
    assert point.ctx == {"seen": True}
    gpt2.reset_hooks(direction="fwd", clear_contexts=False)
    assert not point._fwd and len(point._bwd) == 1 and point.ctx == {"seen": True}
    gpt2.reset_hooks()
    assert not point._bwd and point.ctx == {}
    with pytest.raises(ValueError, match="direction"):
        gpt2.reset_hooks(direction="sideways")


def test_module_backward_hooks_on_a_hook_point_are_refused(gpt2):
    point = gpt2.hook_dict["blocks.0.hook_mlp_out"]
    for register in (
        point.register_full_backward_pre_hook,
        point.register_backward_hook,
        point.register_full_backward_hook,
    ):
        with pytest.raises(TypeError, match="never run"):
            register(lambda *args: None)


def test_inserted_hook_points_sit_after_their_point_and_come_out_again():
    """The registry edit a spliced dictionary makes (hooked.sae.splice): its points right after the one named, in
    forward order, refused where a name is taken, and removed by name."""
    from hooked.hooks import HookPoint
    from hooked.testing import random_model

    model = random_model("gpt2", seed=0, n_layers=2, d_model=16)
    before = list(model.hook_dict)
    after = "blocks.0.hook_resid_post"
    added = {f"{after}.a": HookPoint(), f"{after}.b": HookPoint()}
    model.insert_hook_points(after, added)
    at = before.index(after) + 1
    assert list(model.hook_dict) == [*before[:at], *added, *before[at:]]
    with pytest.raises(ValueError, match="already in the model"):
        model.insert_hook_points("blocks.1.hook_resid_post", {f"{after}.a": HookPoint()})
    assert list(model.hook_dict) == [*before[:at], *added, *before[at:]]  # the refused call changed nothing
    model.remove_hook_points(added)
    assert list(model.hook_dict) == before
