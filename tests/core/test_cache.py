"""run_with_cache options and the ActivationCache analysis helpers, checked against the weights.

A cache holds the tensors its hooks saw: an entry read by another key, sliced, stacked or compared with the same
forward run again on the same input (the same path, the same shapes) is the same number, so these compare
exactly; sums recomputed from the weights compare to float32 rounding.
"""

import pytest
import torch

from hooked.cache import act_name


def test_shorthand_keys_expand_like_transformer_lens():
    assert act_name("z", 9) == "blocks.9.attn.hook_z"
    assert act_name("pattern", 1) == "blocks.1.attn.hook_pattern"
    assert act_name("resid_post", 3) == "blocks.3.hook_resid_post"
    assert act_name("post", 2) == "blocks.2.mlp.hook_post"
    assert act_name("scale", 4, "ln1") == "blocks.4.ln1.hook_scale"
    assert act_name("scale") == "ln_final.hook_scale"
    assert act_name("embed") == "hook_embed"
    assert act_name("blocks.0.hook_resid_pre") == "blocks.0.hook_resid_pre"
    from hooked import utils

    assert utils.get_act_name("pattern", 9) == "blocks.9.attn.hook_pattern"


def test_cache_keys_and_negative_layers(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    assert torch.equal(cache["resid_post", -1], cache["blocks.1.hook_resid_post"])
    assert torch.equal(cache["z", 0], cache["blocks.0.attn.hook_z"])
    assert ("pattern", 1) in cache
    assert cache["pattern", 1].shape == (3, 4, 11, 11)
    with pytest.raises(KeyError, match="resid_post"):
        cache["blocks.0.hook_resid_psot"]


def test_pattern_rows_are_causal_distributions(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["pattern", 0]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    assert pattern.triu(1).abs().max() == 0


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


def test_cache_holds_compact_buffers_shared_only_by_the_same_activation(gpt2, tokens):
    """Without other hooks the cache keeps the activations themselves: no view pins a bigger buffer (q, k, v
    are slices of c_attn's output and are copied), and the only names sharing a buffer are one tensor under
    two names, resid_post of block i and resid_pre of block i+1 (as in TransformerLens)."""
    _, cache = gpt2.run_with_cache(tokens)
    distinct = {_storage(t): t for t in cache.values()}
    assert cache.nbytes() == sum(t.numel() * t.element_size() for t in distinct.values())
    assert not any(t.requires_grad for t in cache.values())
    shared = {}
    for name, tensor in cache.items():
        shared.setdefault(_storage(tensor), []).append(name)
    pairs = [names for names in shared.values() if len(names) > 1]
    n_layers = gpt2.cfg.n_layers
    assert pairs == [[f"blocks.{i}.hook_resid_post", f"blocks.{i + 1}.hook_resid_pre"] for i in range(n_layers - 1)]


def _cloned_at_hook_time(model, tokens, names):
    store = {}

    def save(activation, hook):
        store[hook.name] = activation.detach().clone()

    model.run_with_hooks(tokens, fwd_hooks=[(names, save)])
    return store


@pytest.mark.parametrize("architecture", ["gpt2", "gpt2_attn_only", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad", "grad"])
def test_the_forward_never_edits_a_cached_activation_afterwards(architecture, mode):
    """The audit behind keeping references (`edits_hooked_tensors = False`): every point a cache keeps,
    read after the forward, equals a copy taken when its hook fired. A forward that edited a hooked tensor in
    place later (a residual add written `resid += out`, an in-place activation) fails here."""
    from hooked.testing import random_model

    sizes = {"n_layers": 2, "n_experts": 4, "top_k": 2} if architecture == "qwen3_moe" else {"n_layers": 2}
    if architecture == "gpt2_attn_only":
        architecture, sizes["attn_only"] = "gpt2", True
    model = random_model(architecture, seed=1, **sizes)
    assert not model.edits_hooked_tensors
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    names = lambda name: True  # noqa: E731  every point, the split inputs and hook_mlp_in included
    context = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "grad": torch.enable_grad}[mode]
    with context():
        _, cache = model.run_with_cache(tokens, names_filter=names)
        expected = _cloned_at_hook_time(model, tokens, names)
    assert list(cache) == list(expected)
    assert len({_storage(t) for t in cache.values()}) < len(
        cache
    )  # references were kept (resid_post i is resid_pre i+1)
    for name in cache:
        assert torch.equal(cache[name], expected[name]), f"{name} changed after its hook fired"


def test_a_later_hook_editing_in_place_leaves_the_cache_alone(gpt2, tokens):
    """With another hook in the call the cache copies: an in-place edit at blocks.1.hook_resid_pre, the same
    tensor as blocks.0.hook_resid_post, must not reach the cached resid_post (TransformerLens' cache would
    show it). Both kinds of registration: an enclosing hooks() block and add_hook."""
    # the same points listened to, so the same computation path (eager attention, step-by-step norms)
    clean = _cloned_at_hook_time(gpt2, tokens, gpt2.default_cache_names())["blocks.0.hook_resid_post"]

    def zero_in_place(activation, hook):
        activation.zero_()

    with gpt2.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", zero_in_place)]):
        _, cache = gpt2.run_with_cache(tokens)
    assert torch.equal(cache["resid_post", 0], clean)
    assert cache["resid_pre", 1].abs().max() == 0  # the edit happened, before the cache's own hook there
    gpt2.add_hook("blocks.1.hook_resid_pre", zero_in_place)
    try:
        _, cache = gpt2.run_with_cache(tokens)
    finally:
        gpt2.reset_hooks()
    assert torch.equal(cache["resid_post", 0], clean)
    assert _storage(cache["resid_post", 0]) != _storage(cache["resid_pre", 1])


def test_the_callers_tensors_are_copied(gpt2, tokens):
    """A start_at_layer input and a stop_at_layer output are the caller's: editing them in place afterwards
    must not change the cache, even when the cache otherwise keeps references."""
    _, full = gpt2.run_with_cache(tokens)
    resid = full["resid_pre", 1].clone()
    out, cache = gpt2.run_with_cache(
        resid, start_at_layer=1, names_filter=["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
    )
    resid.zero_()
    assert torch.equal(cache["resid_pre", 1], full["resid_pre", 1])
    resid_mid, cache = gpt2.run_with_cache(tokens, stop_at_layer=1, names_filter="blocks.0.hook_resid_post")
    expected = resid_mid.clone()
    resid_mid.zero_()
    assert torch.equal(cache["resid_post", 0], expected) and expected.abs().max() > 0


def test_names_filter_forms(gpt2, tokens):
    _, one = gpt2.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre")
    _, several = gpt2.run_with_cache(tokens, names_filter=["hook_embed", "blocks.1.attn.hook_z"])
    _, filtered = gpt2.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_mlp_out"))
    assert list(one) == ["blocks.0.hook_resid_pre"]
    assert list(several) == ["hook_embed", "blocks.1.attn.hook_z"]
    assert list(filtered) == ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
    with pytest.raises(KeyError, match="not cached"):
        one["blocks.1.hook_resid_pre"]


def test_stop_after_ends_the_forward_once_every_named_point_has_run(gpt2, tokens):
    names = ["hook_embed", "blocks.0.attn.hook_q", "blocks.0.attn.hook_k"]
    logits = gpt2(tokens)
    later = []  # points the forward reaches only after block 0's q and k
    watch = [
        (name, lambda t, hook: later.append(hook.name)) for name in ("blocks.0.attn.hook_z", "blocks.1.hook_resid_pre")
    ]
    with gpt2.hooks(fwd_hooks=watch):
        output, stopped = gpt2.run_with_cache(tokens, names_filter=names, stop_after=names[1:])
    assert output is None and later == []
    assert list(stopped) == names
    _, full = gpt2.run_with_cache(tokens, names_filter=names)
    for name in names:  # exact: the stop changes nothing before it, the same kernels ran in the same order
        assert torch.equal(stopped[name], full[name])
    assert not gpt2.hooks_attached()  # the stop's hook went with the call
    # and the model runs whole again: exact, the same forward (the same kernels in the same order) as before the stop
    assert torch.equal(gpt2(tokens), logits)
    # a named point the forward never reaches (stop_at_layer ends it first): it runs to its end
    output, cache = gpt2.run_with_cache(tokens, names_filter=names, stop_after="blocks.1.attn.hook_k", stop_at_layer=1)
    assert output is not None and list(cache) == names
    with pytest.raises(ValueError, match="stop_after"):
        gpt2.run_with_cache(tokens, incl_bwd=True, return_type="loss", stop_after="blocks.0.attn.hook_q")


def test_pos_slice_and_remove_batch_dim(gpt2, tokens):
    _, full = gpt2.run_with_cache(tokens[:1])
    _, last = gpt2.run_with_cache(tokens[:1], pos_slice=-1, remove_batch_dim=True)
    assert last["resid_post", 1].shape == (1, gpt2.cfg.d_model)
    assert torch.equal(last["resid_post", 1][0], full["resid_post", 1][0, -1])
    assert torch.equal(last["pattern", 0][:, 0], full["pattern", 0][0, :, -1])  # query_pos is sliced
    _, batch = gpt2.run_with_cache(tokens)
    _, window = gpt2.run_with_cache(tokens, pos_slice=(2, 5))
    assert torch.equal(window["z", 1], batch["z", 1][:, 2:5])
    with pytest.raises(ValueError, match="batch of 1"):
        gpt2.run_with_cache(tokens, remove_batch_dim=True)


def test_incl_bwd_caches_gradients(gpt2, tokens):
    loss, cache = gpt2.run_with_cache(tokens, incl_bwd=True, return_type="loss", names_filter=lambda n: "resid" in n)
    assert loss.ndim == 0
    grad = cache["blocks.1.hook_resid_post_grad"]
    assert grad.shape == cache["resid_post", 1].shape and grad.abs().sum() > 0
    with pytest.raises(ValueError, match="scalar"):
        gpt2.run_with_cache(tokens, incl_bwd=True)


def test_decompose_resid_sums_to_the_final_residual(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(stack.sum(0), cache["resid_post", -1], rtol=0, atol=1e-5)


def test_accumulated_resid_labels_and_values(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    stack, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    assert torch.equal(stack[3], cache["resid_mid", 1])
    assert torch.equal(stack[-1], cache["resid_post", 1])


def test_stack_head_results_sum_to_attention_output(gpt2, tokens):
    """Head results computed from z and W_O, plus c_proj's bias, equal what attention wrote."""
    _, cache = gpt2.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_z", "hook_attn_out")))
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels[:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"]
    for layer in range(2):
        heads = stack[layer * 4 : (layer + 1) * 4].sum(0) + gpt2.blocks[layer].attn.c_proj.bias
        torch.testing.assert_close(heads, cache["attn_out", layer], rtol=0, atol=1e-5)


def test_stack_head_results_prefers_cached_results(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens, names_filter=lambda name: "hook_result" in name or "hook_z" in name)
    from_results = cache.stack_head_results()
    del cache.cache_dict["blocks.0.attn.hook_result"], cache.cache_dict["blocks.1.attn.hook_result"]
    torch.testing.assert_close(cache.stack_head_results(), from_results, rtol=0, atol=1e-5)


def test_logit_attrs_of_a_full_decomposition_add_up_to_the_logits(gpt2, tokens):
    """Direct logit attribution: the components' attributions + the bias terms are the logit."""
    logits, cache = gpt2.run_with_cache(tokens)
    stack = cache.decompose_resid(pos_slice=-1)  # [component batch d_model]: an int indexes, as TransformerLens
    assert stack.shape[1:] == (tokens.shape[0], gpt2.cfg.d_model)
    answer = tokens[:, 0]
    wrong = tokens[:, 1]
    attrs = cache.logit_attrs(stack, answer, pos_slice=-1)  # [component batch]
    expected = logits[:, -1].gather(-1, answer[:, None])[:, 0]
    torch.testing.assert_close(attrs.sum(0) + gpt2.logit_bias_terms(answer), expected, rtol=0, atol=1e-4)
    diff = cache.logit_attrs(stack, answer, incorrect_tokens=wrong, pos_slice=-1)
    expected_diff = expected - logits[:, -1].gather(-1, wrong[:, None])[:, 0]
    bias_diff = gpt2.logit_bias_terms(answer) - gpt2.logit_bias_terms(wrong)
    torch.testing.assert_close(diff.sum(0) + bias_diff, expected_diff, rtol=0, atol=1e-4)


def test_apply_ln_to_stack_matches_the_norm_of_the_real_residual(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    resid = cache["resid_post", -1][None]
    torch.testing.assert_close(cache.apply_ln_to_stack(resid)[0], cache["ln_final.hook_normalized"], rtol=0, atol=1e-5)
    mid = cache["resid_mid", 0][None]
    torch.testing.assert_close(
        cache.apply_ln_to_stack(mid, layer=0, mlp_input=True)[0], cache["normalized", 0, "ln2"], rtol=0, atol=1e-5
    )


def test_cache_to_device_and_remove_batch_dim(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens[:1], device="cpu")
    single = cache.remove_batch_dim()
    assert single["resid_pre", 0].shape == (11, gpt2.cfg.d_model)


def test_layer_minus_one_means_every_layer_and_the_final_residual(gpt2, tokens):
    """As TransformerLens 3.9 (ActivationCache.accumulated_resid / decompose_resid / apply_ln_to_stack):
    layer=None and layer=-1 both cover every block and the final residual, normalised by ln_final."""
    _, cache = gpt2.run_with_cache(tokens)
    n_layers = gpt2.cfg.n_layers
    for method in (cache.accumulated_resid, cache.decompose_resid):
        every, labels = method(layer=None, return_labels=True)
        minus_one, minus_one_labels = method(layer=-1, return_labels=True)
        assert labels == minus_one_labels and torch.equal(every, minus_one)
        last_block, _ = method(layer=n_layers - 1, return_labels=True)
        assert torch.equal(method(layer=-2), last_block)
    assert cache.accumulated_resid(layer=-1, return_labels=True)[1][-1] == "final_post"
    resid = cache["resid_post", -1][None]
    torch.testing.assert_close(
        cache.apply_ln_to_stack(resid, layer=-1)[0], cache["ln_final.hook_normalized"], rtol=0, atol=1e-5
    )
    with pytest.raises(IndexError, match="out of range"):
        cache.accumulated_resid(layer=n_layers + 1)


def test_attn_alias_is_the_pattern(gpt2, tokens):
    _, cache = gpt2.run_with_cache(tokens)
    assert cache["attn", 1] is cache["blocks.1.attn.hook_pattern"]
