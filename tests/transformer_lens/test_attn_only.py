"""Attention-only toy models: `HookedTransformerConfig(attn_only=True, ...)` then `HookedTransformer(cfg)`.

The reference is TransformerLens 3.9 built from the same keyword arguments and given the same weights
(copied across by the explicit layout map below, not through hooked's weight views): the hook points, every
activation, the logits, the loss, weight processing and the cache helpers must agree. Generic features
(ablations, sweeps, addresses, generation) are checked against plain runs with hooks on the same model.
"""

import warnings

import pytest
import torch

import hooked
from hooked import ablate
from hooked.testing import ablatable_hook_names

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import transformer_lens

FIELDS = dict(
    n_layers=2,
    d_model=64,
    n_ctx=32,
    d_head=16,
    n_heads=4,
    d_vocab=50,
    attn_only=True,
    act_fn=None,
    normalization_type="LN",
    positional_embedding_type="standard",
)


def tl_state_dict(model: hooked.GPT2) -> dict[str, torch.Tensor]:
    """TransformerLens' parameter names and layouts for a hooked attention-only GPT-2, from the stored
    parameters (Conv1D [in, out]; c_attn's columns are q | k | v, each heads x d_head)."""
    cfg, state = model.cfg, {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_heads, d_head, d_model = cfg.n_heads, cfg.d_head, cfg.d_model
    out = {
        "embed.W_E": state["wte.weight"],
        "pos_embed.W_pos": state["wpe.weight"],
        "ln_final.w": state["ln_final.weight"],
        "ln_final.b": state["ln_final.bias"],
        "unembed.W_U": state["lm_head.weight"].T.contiguous(),
        "unembed.b_U": state.get("lm_head.bias", torch.zeros(cfg.d_vocab)),
    }
    for i in range(cfg.n_layers):
        block = f"blocks.{i}."
        out[block + "ln1.w"], out[block + "ln1.b"] = state[block + "ln1.weight"], state[block + "ln1.bias"]
        weight, bias = state[block + "attn.c_attn.weight"], state[block + "attn.c_attn.bias"]
        for index, part in enumerate("QKV"):
            columns = weight[:, index * d_model : (index + 1) * d_model]  # [d_model, heads * d_head]
            out[block + f"attn.W_{part}"] = columns.reshape(d_model, n_heads, d_head).permute(1, 0, 2).contiguous()
            out[block + f"attn.b_{part}"] = bias[index * d_model : (index + 1) * d_model].reshape(n_heads, d_head)
        out[block + "attn.W_O"] = state[block + "attn.c_proj.weight"].reshape(n_heads, d_head, d_model)
        out[block + "attn.b_O"] = state[block + "attn.c_proj.bias"]
    return out


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial norms and biases (a fresh model has weight 1, bias 0 there), so every weight matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                noise = torch.randn(parameter.shape, generator=generator) * 0.2
                parameter.copy_(noise + (1.0 if name.endswith(("ln1.weight", "ln_final.weight")) else 0.0))


def pair(seed: int = 0, **overrides):
    fields = {**FIELDS, **overrides}
    ours = hooked.HookedTransformer(hooked.HookedTransformerConfig(**fields, seed=seed))
    randomise(ours, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformer_lens.HookedTransformer(transformer_lens.HookedTransformerConfig(**fields, device="cpu"))
    state = tl_state_dict(ours)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith(("attn.mask", "attn.IGNORE")) for k in missing), (missing, unexpected)
    return ours.eval(), theirs.eval()


def tokens_of(batch=2, pos=9, seed=0, d_vocab=50):
    return torch.randint(0, d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models():
    return pair()


def test_config_and_blocks_are_transformer_lens_attn_only(models):
    ours, theirs = models
    assert type(ours) is hooked.GPT2 and ours.cfg.attn_only and theirs.cfg.attn_only
    for name in (
        "n_layers",
        "d_model",
        "n_heads",
        "d_head",
        "d_vocab",
        "n_ctx",
        "normalization_type",
        "positional_embedding_type",
        "attn_only",
    ):
        assert getattr(ours.cfg, name) == getattr(theirs.cfg, name), name
    for block in ours.blocks:
        assert block.mlp is None and block.ln2 is None
    assert not any("mlp" in name or "ln2" in name for name in ours.state_dict())
    assert "blocks.0.hook_resid_mid" not in ours.hook_dict and "blocks.0.hook_resid_mid" not in theirs.hook_dict


def test_hook_points_are_those_transformer_lens_fires(models):
    """Every hooked point fires in TransformerLens too; TransformerLens' extras are its unembed hooks and
    hook_attn_in (hooked has neither on any model) and its never-firing hook_mlp_in / hook_mlp_out."""
    ours, theirs = models
    tokens = tokens_of()
    theirs.cfg.use_attn_result = theirs.cfg.use_split_qkv_input = True
    try:
        _, their_split_cache = theirs.run_with_cache(tokens)
    finally:
        theirs.cfg.use_split_qkv_input = False
    try:  # without split inputs, TransformerLens' ln1 sees [batch pos d_model] (its split-input ln1 has a head axis)
        _, their_cache = theirs.run_with_cache(tokens)
    finally:
        theirs.cfg.use_attn_result = False
    _, our_cache = ours.run_with_cache(tokens, names_filter=lambda name: True)
    assert list(our_cache) == list(ours.hook_dict)  # every declared point fires, in declaration order
    assert set(their_split_cache) - set(our_cache) == {"unembed.hook_in", "unembed.hook_out"}
    assert set(our_cache) == set(their_split_cache) - {"unembed.hook_in", "unembed.hook_out"}
    dead = {name for name in theirs.hook_dict if name.endswith(("hook_mlp_in", "hook_mlp_out"))}
    assert dead and not dead & set(their_split_cache) and not dead & set(ours.hook_dict)
    for name in our_cache:
        reference = their_cache[name] if name in their_cache else their_split_cache[name]
        ours_value = our_cache[name]
        if name.endswith("hook_attn_scores"):  # masked entries: the dtype's minimum here, -inf there (docs/hooks.md)
            causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
            assert torch.all(reference[..., ~causal] == float("-inf"))
            ours_value, reference = ours_value[..., causal], reference[..., causal]
        torch.testing.assert_close(ours_value, reference, atol=1e-5, rtol=1e-5, msg=name)


def test_logits_and_loss_equal_transformer_lens(models):
    ours, theirs = models
    tokens = tokens_of(3, 11, seed=1)
    torch.testing.assert_close(ours(tokens), theirs(tokens), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        ours(tokens, return_type="loss"), theirs(tokens, return_type="loss"), atol=1e-5, rtol=1e-5
    )


def test_act_fn_is_kept_but_unused():
    ours, theirs = pair(seed=3, act_fn="gelu")  # no MLP reads it; TransformerLens keeps it on the config too
    assert ours.cfg.act_fn == theirs.cfg.act_fn == "gelu"
    tokens = tokens_of(seed=3)
    torch.testing.assert_close(ours(tokens), theirs(tokens), atol=1e-5, rtol=1e-5)


def test_a_toy_without_norms_is_refused_naming_the_field():
    """TransformerLens' normalization_type=None (identity norms) is no hooked family: refused, never ignored."""
    with pytest.raises(ValueError, match="normalization_type=None"):
        hooked.HookedTransformerConfig(**{**FIELDS, "normalization_type": None})


def test_every_hook_zeroed_equals_transformer_lens(models):
    """hooked.testing's hook enumeration on an attention-only model: each point ablated, against TransformerLens."""
    ours, theirs = models
    tokens = tokens_of(seed=2)
    names = ablatable_hook_names(ours)
    assert "blocks.1.hook_resid_post" in names and not any("mlp" in name for name in names)
    theirs.cfg.use_attn_result = theirs.cfg.use_split_qkv_input = True
    try:
        for name in names:
            zero = [(name, lambda activation, hook: torch.zeros_like(activation))]
            torch.testing.assert_close(
                ours.run_with_hooks(tokens, fwd_hooks=zero),
                theirs.run_with_hooks(tokens, fwd_hooks=zero),
                atol=1e-5,
                rtol=1e-5,
                msg=name,
            )
    finally:
        theirs.cfg.use_attn_result = theirs.cfg.use_split_qkv_input = False


def test_cache_helpers_equal_transformer_lens(models):
    ours, theirs = models
    tokens = tokens_of(seed=4)
    _, ours_cache = ours.run_with_cache(tokens)
    _, their_cache = theirs.run_with_cache(tokens)
    final = ours_cache["blocks.1.hook_resid_post"]
    for layer in (None, 1):
        ours_stack, ours_labels = ours_cache.decompose_resid(layer, return_labels=True)
        their_stack, their_labels = their_cache.decompose_resid(layer, return_labels=True)
        assert ours_labels == their_labels and not any("mlp" in label for label in ours_labels)
        torch.testing.assert_close(ours_stack, their_stack, atol=1e-5, rtol=1e-5)
        ours_stack, ours_labels = ours_cache.accumulated_resid(layer, return_labels=True)
        their_stack, their_labels = their_cache.accumulated_resid(layer, return_labels=True)
        assert ours_labels == their_labels
        torch.testing.assert_close(ours_stack, their_stack, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_cache.decompose_resid().sum(0), final, atol=1e-5, rtol=1e-5)
    # no resid_mid in an attention-only block: incl_mid adds nothing (TransformerLens raises a KeyError)
    assert ours_cache.accumulated_resid(incl_mid=True, return_labels=True)[1] == ["0_pre", "1_pre", "final_post"]
    heads, labels = ours_cache.stack_head_results(return_labels=True)
    assert labels == [f"L{layer}H{head}" for layer in range(2) for head in range(4)]
    their_cache.compute_head_results()
    torch.testing.assert_close(heads, their_cache.stack_head_results(), atol=1e-5, rtol=1e-5)
    # TransformerLens' get_full_resid_decomposition reads block.mlp.b_out through accumulated_bias, which an
    # attn_only model lacks, so the reference is the explicit sum: heads + embeddings + biases = resid_post.
    full, labels = ours_cache.get_full_resid_decomposition(return_labels=True)
    assert labels == [f"L{layer}H{head}" for layer in range(2) for head in range(4)] + ["embed", "pos_embed", "bias"]
    torch.testing.assert_close(full.sum(0), final, atol=1e-5, rtol=1e-5)
    biases = sum(ours.blocks[i].attn.c_proj.bias for i in range(2)).detach()
    torch.testing.assert_close(full[-1, 0, 0], biases)
    with pytest.raises(ValueError, match="block 1 is attention-only"):
        ours_cache.decompose_resid(1, mlp_input=True)
    with pytest.raises(ValueError, match="block 0 is attention-only"):
        ours_cache.get_neuron_results(0)
    assert ours_cache.stack_neuron_results(None).shape[0] == 0


def test_weight_processing_equals_transformer_lens():
    ours, theirs = pair(seed=5)
    tokens = tokens_of(seed=5)
    ours.process_weights_()  # from_pretrained's defaults: fold_ln, centre writing weights and unembed, fold b_V
    with torch.no_grad():  # load_and_process_state_dict's defaults fold the value biases too
        theirs.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    assert ours.cfg.normalization_type == theirs.cfg.normalization_type == "LNPre"
    for name in ("W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_U", "b_U"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), atol=1e-5, rtol=1e-5, msg=name)
    torch.testing.assert_close(ours(tokens), theirs(tokens), atol=1e-5, rtol=1e-5)


def test_head_ablation_and_sweep(models):
    ours, theirs = models
    tokens = tokens_of(3, 8, seed=6)
    assert ablate.components(ours, "layers") == ["L0.attn", "L1.attn"] and ablate.components(ours, "mlps") == []

    def zero_head(z, hook):
        z[:, :, 2] = 0.0

    with torch.no_grad():
        expected = theirs.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        torch.testing.assert_close(
            ours.run_with_hooks(tokens, fwd_hooks=ablate.hooks(ours, "L1H2")), expected, atol=1e-5, rtol=1e-5
        )
    variants = {
        address: ablate.hooks(ours, address) for address in ablate.components(ours, "heads") + ["L0.attn", "L1.attn"]
    }
    variants["resid_post"] = [("blocks.1.hook_resid_post", ablate.zero(positions=-1))]

    def metric(logits, base_logits=None, attention_mask=None):
        return logits[:, -1, 3] - logits[:, -1, 7]

    result = hooked.sweep(ours, tokens, variants, metric, progress=False)
    with torch.no_grad():
        for name, pairs in variants.items():
            torch.testing.assert_close(
                result[name], metric(ours.run_with_hooks(tokens, fwd_hooks=pairs)), atol=2e-6, rtol=0, msg=name
            )
    for address in ("L0.mlp", "L1.N3"):
        with pytest.raises(ValueError, match="attention-only"):
            ablate.hooks(ours, address)


def test_generation_with_and_without_kv_cache(models):
    ours, theirs = models
    prompt = tokens_of(2, 5, seed=7)
    cached = ours.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False)
    whole = ours.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False, use_past_kv_cache=False)
    # Token ids: argmaxes of logits equal to float32 rounding (other shapes with and without the cache, another
    # library); equal unless two logits nearly tie, which this seed avoids
    assert torch.equal(cached, whole)
    # The reference is TransformerLens' full forward at every step (use_past_kv_cache=False): its KV-cache path
    # on a model without a tokenizer continues differently from its own full forward (measured; a direct
    # forward with a cache there raises "Cannot compute attention mask without a tokenizer")
    theirs_out = theirs.generate(
        prompt, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False, use_past_kv_cache=False
    )
    assert torch.equal(cached, theirs_out)


def test_what_an_attention_only_model_has_not_is_refused(models):
    ours, _ = models
    with pytest.raises(KeyError, match="hook_mlp_out"):
        ours.run_with_hooks(tokens_of(), fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: x)])
    with pytest.raises(ValueError, match="attention-only"):
        ours.set_use_hook_mlp_in(True)
    with pytest.raises(ValueError, match="model.W_in: this model's blocks have no mlp"):
        _ = ours.W_in
    with pytest.raises(ValueError, match="attn_only=True"):
        hooked.HookedTransformerConfig(
            n_layers=1,
            d_model=32,
            d_head=8,
            n_ctx=16,
            d_vocab=50,
            attn_only=True,
            normalization_type="RMS",
            positional_embedding_type="rotary",
            act_fn="silu",
            gated_mlp=True,
            use_qk_norm=True,
            final_rms=True,
        )


def test_tl_patching_equals_transformer_lens(models):
    """The Activation Patching demo's induction section runs these on attn-only-2l."""
    import transformer_lens.patching as tl_patching

    from hooked import tl_patching as patching

    ours, theirs = models
    clean, corrupt = tokens_of(2, 8, seed=8), tokens_of(2, 8, seed=9)
    _, ours_cache = ours.run_with_cache(clean)
    _, their_cache = theirs.run_with_cache(clean)

    def metric(logits):
        return logits[:, -1, 3].mean()

    for name in ("get_act_patch_attn_head_all_pos_every", "get_act_patch_resid_pre", "get_act_patch_attn_out"):
        expected = getattr(tl_patching, name)(theirs, corrupt, their_cache, metric)
        torch.testing.assert_close(
            getattr(patching, name)(ours, corrupt, ours_cache, metric), expected, atol=1e-5, rtol=1e-5, msg=name
        )


def test_circuits_graph_has_no_mlp_nodes_and_edges_patch_as_brute_force(models, tmp_path):
    from hooked import circuits, metrics
    from tests.circuits.test_circuits import brute_patch, run_metric

    ours, _ = models
    g = circuits.graph(ours)
    n_heads = ours.cfg.n_heads
    assert [s.name for s in g.sources] == ["input"] + [f"L{layer}H{h}" for layer in range(2) for h in range(n_heads)]
    assert not any(".mlp" in r.name for r in g.receivers)
    # layer l's 3 * n_heads inputs read the 1 + l * n_heads writers before it; logits read all of them
    assert len(g.edges) == sum(3 * n_heads * (1 + layer * n_heads) for layer in range(2)) + 1 + 2 * n_heads
    clean, corrupt = tokens_of(3, 6, seed=10), tokens_of(3, 6, seed=11)
    metric = metrics.logit_diff(None, [3, 4, 3], [5, 6, 7])
    edges = [str(e) for e in g.edges[::7]]
    result = circuits.patch_edges(ours, clean, corrupt, {e: [e] for e in edges}, metric)
    torch.testing.assert_close(result.base, run_metric(ours, clean, metric), atol=1e-4, rtol=0)
    expected = torch.stack([brute_patch(ours, clean, corrupt, [e], metric) for e in edges])
    torch.testing.assert_close(result.values, expected, atol=1e-4, rtol=0)
    found = circuits.discover(ours, clean, corrupt, metric, method="eap", n_edges=10)
    found.to_json(tmp_path / "circuit.json")
    again = circuits.Circuit.from_json(tmp_path / "circuit.json")
    assert again.graph.mlp_layers == () and set(map(str, again.edges)) == set(map(str, found.edges))
    found.plot(tmp_path / "circuit.png")


def test_testing_strategies_draw_only_what_an_attention_only_model_has(models):
    """hooked.testing's address and intervention strategies, as property tests use them, on attn_only."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from hooked.testing import addresses, selectors

    ours, _ = models
    with pytest.raises(ValueError, match=r"offers heads, attn$"):
        addresses(ours, kinds=("mlps", "neurons"))
    tokens = tokens_of(2, 8, seed=12)

    @settings(max_examples=40, deadline=None, database=None)
    @given(st.data())
    def check(data):
        address = data.draw(addresses(ours, max_pos=8))
        assert ".mlp" not in address and ".N" not in address
        ablate.hooks(ours, address)  # parses: every drawn address exists
        name = data.draw(st.sampled_from(ablatable_hook_names(ours)))
        selected = data.draw(selectors(ours, name, max_pos=8))
        with torch.no_grad():
            ours.run_with_hooks(tokens, fwd_hooks=[(name, ablate.zero(**selected))])

    check()
