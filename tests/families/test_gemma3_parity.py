"""Gemma 3 (text) against transformers 5.24's Gemma3ForCausalLM and TransformerLens 3.9's Gemma 3, on tiny random
checkpoints.

Checkpoints are built here with every norm weight randomised (q_norm and k_norm included: transformers initialises
Gemma's to 0, gain 1, which would hide a dropped norm or a `1 +` left out) over GQA, multi-query and MHA attention,
head_dim != hidden_size / heads, tied and untied embeddings, attention_bias, a query_pre_attn_scalar that is not
d_head, a final softcap that bites and none, sliding windows of 3 and 4 with prompts longer than the window, local
and global layers in one model with different rotary bases (and a linear scaling on the global ones), an explicit
layer pattern, `sliding_window_pattern` 2 and transformers' default pattern of 6.

transformers 5.24 runs Gemma 3 on SDPA by default and on its eager path on request: hooked's default path (SDPA)
equals the first and hooked's eager path the second, both bit for bit (0.0: the same operations in the same order).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip

import hooked
from hooked.models.gemma3 import Gemma3Config as HookedGemma3Config
from hooked.rotary import LinearScaling
from tests.families.parity import (
    REORDERED_ULPS,
    TRANSFORMER_LENS_ULPS,
    UNEMBED_POINTS,
    bf16_spread,
    build_checkpoint,
    build_checkpoints,
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
    hooked_outputs,
    ln1_head_zero,
    random_tokens,
    tl_model,
    within_ulps_of_magnitude,
)
from tests.families.test_gemma2_parity import rms

VOCAB = 96
HF = transformers.Gemma3ForCausalLM
LOCAL_GLOBAL = ["sliding_attention", "full_attention", "sliding_attention"]

CASES = {
    # GQA 4 -> 2, explicit pattern, window 3, global base 1e4 scaled linearly by 8, local base 100, tied, final cap
    "linear_gqa": dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        num_hidden_layers=3,
        sliding_window=3,
        query_pre_attn_scalar=16,
        final_logit_softcapping=1.5,
        layer_types=LOCAL_GLOBAL,
        max_position_embeddings=64,
        initializer_range=0.3,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
    ),
    # multi-query, d_head 16 != 48 / 4, untied, biases, no cap, sliding_window_pattern 2 (local, global, local, global),
    # the hub's spelling of the bases (rope_theta, rope_local_base_freq)
    "pattern_mqa": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        num_hidden_layers=4,
        sliding_window=4,
        query_pre_attn_scalar=24,
        sliding_window_pattern=2,
        tie_word_embeddings=False,
        attention_bias=True,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        rope_theta=5e4,
        rope_local_base_freq=500.0,
    ),
    # MHA, d_head = d_model / heads, transformers' defaults: pattern 6 (five local, one global), bases 1e6 / 1e4
    "default_mha": dict(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=24,
        num_hidden_layers=6,
        sliding_window=4,
        query_pre_attn_scalar=8,
        max_position_embeddings=64,
    ),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    # Neutral directory names: TransformerLens' convert_hf_model_config reads family names out of paths.
    configs = {
        name: transformers.Gemma3TextConfig(vocab_size=VOCAB, pad_token_id=0, **kwargs)
        for name, kwargs in CASES.items()
    }
    return build_checkpoints(tmp_path_factory, configs, HF)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.fixture(scope="module")
def references(dirs):
    return {
        (name, path): hf_reference(directory, HF, path)
        for name, directory in dirs.items()
        for path in ("sdpa", "eager")
    }


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager"])
def test_float32_equals_transformers(models, references, case, path):
    """hooked's default path against transformers' SDPA, its eager path against transformers' eager: 0.0 on the
    logits, every block's residual stream and the final norm."""
    model = models[case]
    assert type(model) is hooked.models.Gemma3
    check_bit_exact(model, references[case, path], random_tokens(3, 13), eager=path == "eager")


def test_config_read_from_each_case(models):
    cfg = models["linear_gqa"].cfg
    assert cfg.layer_types == tuple(LOCAL_GLOBAL) and cfg.attn_types == ["local", "global", "local"]
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.rope_local_theta, cfg.rope_local_scaling) == (
        1e4,
        LinearScaling(8.0),
        100.0,
        None,
    )
    assert (cfg.rotary_base, cfg.rotary_base_local, cfg.rotary_scaling_factor) == (
        1e4,
        100.0,
        8.0,
    )  # TransformerLens' names
    assert (cfg.sliding_window, cfg.query_pre_attn_scalar, cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (
        3,
        16,
        None,
        1.5,
    )
    cfg = models["pattern_mqa"].cfg
    assert cfg.layer_types == ("sliding_attention", "full_attention") * 2
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling, cfg.final_logit_softcapping) == (
        5e4,
        500.0,
        None,
        None,
    )
    assert not cfg.tie_word_embeddings and models["pattern_mqa"].lm_head is not None
    cfg = models["default_mha"].cfg
    assert cfg.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1e6, 1e4)
    assert [block.sliding for block in models["default_mha"].blocks] == [True] * 5 + [False]


def test_rotary_tables_equal_transformers(models, references):
    """Each layer type's inverse frequencies are transformers' buffers bit for bit (the linear factor on the global
    table only), and the local and global tables differ."""
    for case in CASES:
        model, reference = models[case], references[case, "sdpa"].model.rotary_emb
        assert torch.equal(model.rotary.inv_freq, reference.full_attention_inv_freq), case
        assert torch.equal(model.rotary_local.inv_freq, reference.sliding_attention_inv_freq), case
        assert not torch.equal(model.rotary.inv_freq, model.rotary_local.inv_freq), case
    # A linear scaling on the local table too (no released model has one; TransformerLens scales the global one only)
    config = transformers.Gemma3TextConfig(
        **{
            **CASES["linear_gqa"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4},
                "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0},
            },
        }
    )
    model = hooked.models.Gemma3(HookedGemma3Config.from_hf(config.to_dict()))
    reference = transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(config)
    assert model.cfg.rope_local_scaling == LinearScaling(4.0)
    assert torch.equal(model.rotary.inv_freq, reference.full_attention_inv_freq)
    assert torch.equal(model.rotary_local.inv_freq, reference.sliding_attention_inv_freq)


def test_each_rotary_setting_and_the_pattern_change_the_model(dirs, models):
    """The local base, the global base, the linear factor, the layer pattern and the final cap each move the logits
    at these sizes (none is a no-op that a test against transformers could miss)."""
    model = models["linear_gqa"]
    tokens = random_tokens(2, 12)
    config = json.loads((dirs["linear_gqa"] / "config.json").read_text())
    rope = config["rope_parameters"]
    with torch.no_grad():
        logits = model(tokens)
        assert logits.abs().max() < 1.5  # the final cap bounds every logit
        for change in (
            dict(rope_parameters={**rope, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
            dict(rope_parameters={**rope, "full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
            dict(rope_parameters={**rope, "full_attention": {**rope["full_attention"], "rope_theta": 100.0}}),
            dict(layer_types=["full_attention"] * 3),
            dict(final_logit_softcapping=None),
        ):
            other = hooked.models.Gemma3(HookedGemma3Config.from_hf({**config, **change}))
            other.load_state_dict(model.state_dict())
            assert (other(tokens) - logits).abs().max() > 1e-4, change


def test_hooks_pick_the_layer_types_table_and_mask(models, references):
    """hook_pattern equals transformers' eager `attentions` on every layer, zero outside the window on sliding layers;
    hook_rot_q turns q_normed by the layer's own table (checked against an explicit rotation, float64)."""
    model, tokens = models["linear_gqa"], random_tokens(2, 9)
    with torch.no_grad():
        out = references["linear_gqa", "eager"](tokens, output_attentions=True, use_cache=False)
        _, cache = model.run_with_cache(
            tokens, names_filter=lambda name: name.endswith(("hook_pattern", "hook_q_normed", "hook_rot_q"))
        )
    query, key = torch.arange(9)[:, None], torch.arange(9)[None, :]
    # Exact: transformers' eager operations in its order, on keys of the same layout (no KV cache on its side)
    for layer, reference in enumerate(out.attentions):
        assert torch.equal(cache["pattern", layer], reference), layer
        sliding = LOCAL_GLOBAL[layer] == "sliding_attention"
        visible = cache["pattern", layer][0, 0] > 0
        assert torch.equal(visible, (key <= query) & (key > query - 3 if sliding else True)), layer
        theta, factor = (100.0, 1.0) if sliding else (1e4, 8.0)
        inv_freq = 1.0 / (theta ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)) / factor
        angles = torch.arange(9, dtype=torch.float64)[:, None] * inv_freq
        cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
        q = cache["q_normed", layer].double()
        rotated = q * cos + torch.cat([-q[..., 4:], q[..., :4]], -1) * sin
        torch.testing.assert_close(cache["rot_q", layer].double(), rotated, rtol=0, atol=1e-5, msg=str(layer))


def test_bfloat16_within_transformers_own_spread(dirs):
    """bf16: hooked's embedding (sqrt(hidden_size) cast to bf16 before the product, as transformers' embed_scale
    buffer) equals transformers' exactly; its logits land within transformers' own sdpa-vs-eager spread."""
    tokens = random_tokens(2, 11)
    for case in ("linear_gqa", "pattern_mqa"):
        reference, spread = bf16_spread(dirs[case], HF, tokens)
        model = hooked.load(dirs[case], dtype=torch.bfloat16)
        hf = HF.from_pretrained(dirs[case], attn_implementation="sdpa", dtype=torch.bfloat16).eval()
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, names_filter="hook_embed")
            assert torch.equal(cache["hook_embed"], hf.model.embed_tokens(tokens)), case
        assert logits.dtype == torch.bfloat16
        assert (logits.float() - reference).abs().max().item() <= spread, case


def test_left_padded_batch(models, references):
    """Prompts of 9, 4 and 6 tokens against windows of 3 and 4, local and global layers."""
    for case in ("linear_gqa", "pattern_mqa"):
        check_left_padded_batch(models[case], references[case, "sdpa"], [9, 4, 6])


@pytest.mark.parametrize("lengths", [[7], [9, 4, 6]])
def test_greedy_generation_equals_transformers(models, references, lengths):
    """Prompts longer than the window of 3, 12 new tokens: sliding and full layers both run against the KV cache."""
    check_greedy_generation(models["linear_gqa"], references["linear_gqa", "sdpa"], lengths)


def test_generation_untied_multi_query(models, references):
    check_greedy_generation(models["pattern_mqa"], references["pattern_mqa", "sdpa"], [9, 4, 6])


# ----------------------------------------------------------------------------- TransformerLens 3.9
def tl_config_fields(c) -> dict:
    """TransformerLens' Gemma 3 config fields, as its loading_from_pretrained.py sets them for google/gemma-3-270m
    (rotary_base_local, rotary_scaling_factor, use_qk_norm, ...), built by hand from the checkpoint's config."""
    full, local = c.rope_parameters["full_attention"], c.rope_parameters["sliding_attention"]
    assert local["rope_type"] == "default"  # TransformerLens scales the global table only
    return dict(
        d_model=c.hidden_size,
        d_head=c.head_dim,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn="gelu_pytorch_tanh",
        normalization_type="RMS",
        rotary_base=full["rope_theta"],
        rotary_base_local=local["rope_theta"],
        rotary_scaling_factor=full.get("factor", 1.0),
        positional_embedding_type="rotary",
        use_attn_scale=True,
        attn_scale=c.query_pre_attn_scalar**0.5,
        n_key_value_heads=c.num_key_value_heads,
        gated_mlp=True,
        final_rms=True,
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        window_size=c.sliding_window,
        use_local_attn=True,
        attn_types=["local" if kind == "sliding_attention" else "global" for kind in c.layer_types],
        output_logits_soft_cap=c.final_logit_softcapping or -1.0,
        original_architecture="Gemma3ForCausalLM",
    )


def tl_gemma3(directory, **processing):
    """TransformerLens' HookedTransformer on a checkpoint's weights: the fields above and its own converter
    (pretrained/weight_conversions/gemma.py), processed as `processing` says (default: not at all)."""
    return tl_model(directory, HF, "convert_gemma_weights", tl_config_fields, **processing)


ONLY_HOOKED = {"hook_attn_out_pre_norm", "hook_mlp_out_pre_norm", "attn.hook_q_normed", "attn.hook_k_normed"}


def test_every_hook_equals_transformer_lens(models, dirs):
    """Every hook point both have holds the same tensor up to float32 rounding: hook_embed (the scaled embedding),
    the pre- and post-norms, the per-head q_norm / k_norm hooks (TransformerLens flattens batch, pos and head into
    one axis there), rot_q / rot_k from the local and the linearly scaled global tables, the scores on both kinds of
    layer, and the capped logits. TransformerLens normalises each head's copy of the split inputs: head 0's is
    compared for ln1."""
    model, tl = models["linear_gqa"], tl_gemma3(dirs["linear_gqa"])
    tokens = random_tokens(2, 11)

    # Wide weights (initializer_range 0.3, activations up to ~90) and TransformerLens' own operation order (rotary
    # angles as pos / (base ** (2i / d) * factor), not pos * inv_freq) differ from hooked's by float32 rounding that
    # grows through three layers: the tolerance is in ulps of each tensor's magnitude (tests/families/parity.py).
    def layouts(name, ours, theirs):
        ours, theirs = ln1_head_zero(name, ours, theirs)
        if "_norm." in name:  # [batch * pos * heads, ...] there
            theirs = theirs.reshape(ours.shape)
        return ours, theirs

    compare_with_transformer_lens(model, tl, tokens, ONLY_HOOKED, UNEMBED_POINTS, adjust=layouts)
    for name in ("q_norm", "k_norm"):  # TransformerLens' norm weights are the gains (its converter adds the one)
        torch.testing.assert_close(
            getattr(model.blocks[1].attn, name).w, getattr(tl.blocks[1].attn, name).w, rtol=0, atol=0
        )
    torch.testing.assert_close(model.W_E, tl.W_E, rtol=0, atol=0)


def test_transformer_lens_names_resolve():
    """Every Gemma 3 name TransformerLens 3.9 lists (supported_models.py), official or alias, resolves to its hub id."""
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    official = [name for name in OFFICIAL_MODEL_NAMES if name.startswith(("google/gemma-3-", "google/medgemma-"))]
    assert len(official) == 14
    for name in official:
        for spelling in (name, *MODEL_ALIASES.get(name, [])):
            assert hooked.aliases.hub_id(spelling) == name, spelling


def test_from_pretrained_equals_transformer_lens_processing(dirs, models):
    """fold_ln folds the pre-norms' gains (1 + weight) into q/k/v and gate/up and the final one into W_U; the post-norms
    and q_norm / k_norm (which act after the projections, per head) keep their weights. TransformerLens 3.9 turns
    center_unembed off for a logit softcap, so both are compared with it off. The processed weights and logits equal
    TransformerLens' processed model's; the processed logits equal the unprocessed ones."""
    case, tokens = "linear_gqa", random_tokens(2, 9)
    processed = hooked.HookedTransformer.from_pretrained(str(dirs[case]), center_unembed=False)
    tl = tl_gemma3(dirs[case], fold_ln=True, fold_value_biases=True)
    assert processed.processing["fold_ln"] and processed.cfg.normalization_type == "RMSPre"
    unprocessed = models[case]
    for layer, block in enumerate(processed.blocks):
        assert not block.ln1.weight.any() and not block.ln2.weight.any()
        for name in ("ln1_post", "ln2_post"):
            assert torch.equal(getattr(block, name).weight, getattr(unprocessed.blocks[layer], name).weight)
        for name in ("q_norm", "k_norm"):
            assert torch.equal(getattr(block.attn, name).weight, getattr(unprocessed.blocks[layer].attn, name).weight)
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            torch.testing.assert_close(
                getattr(block.attn, name), getattr(tl.blocks[layer].attn, name), rtol=1e-6, atol=1e-6
            )
        for name in ("W_gate", "W_in", "W_out"):
            torch.testing.assert_close(
                getattr(block.mlp, name), getattr(tl.blocks[layer].mlp, name), rtol=1e-6, atol=1e-6
            )
    torch.testing.assert_close(processed.W_U, tl.W_U, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        logits = processed(tokens)
        # Folded weights sum in another order than the unfolded ones (and TransformerLens' own operations):
        # float32 rounding of the magnitudes before the final cap (measured up to 57 ulps of the capped logits).
        within_ulps_of_magnitude(logits, tl(tokens), TRANSFORMER_LENS_ULPS, "TransformerLens")
        within_ulps_of_magnitude(logits, unprocessed(tokens), REORDERED_ULPS, "unprocessed")


# ----------------------------------------------------------------------------- hook names and shapes
GEMMA3_BLOCK = [  # the hook points of one block, in forward order
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
    "hook_attn_out_pre_norm",
    "ln1_post.hook_scale",
    "ln1_post.hook_normalized",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_in",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_in",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "hook_mlp_out_pre_norm",
    "ln2_post.hook_scale",
    "ln2_post.hook_normalized",
    "hook_mlp_out",
    "hook_resid_post",
]
GOLDEN_HOOK_NAMES = golden_hook_names([GEMMA3_BLOCK] * 3)


def test_golden_hook_names(models):
    assert models["linear_gqa"].hook_names == GOLDEN_HOOK_NAMES


def test_hook_shapes_match_declared_axes(models):
    model = models["pattern_mqa"]
    expected = check_hook_shapes(model)
    assert expected["blocks.0.attn.k_norm.hook_scale"] == (2, 7, 1, 1) and expected["blocks.0.attn.hook_q_normed"] == (
        2,
        7,
        4,
        16,
    )
    assert expected["blocks.0.ln1_post.hook_scale"] == (2, 7, 1) and expected["blocks.0.mlp.hook_post"] == (2, 7, 64)


def test_q_and_k_norms_hold_what_the_docs_say(models):
    """q = q_proj(ln1(resid_pre)) split by head; q_normed = Gemma's RMSNorm of each head over d_head; k likewise."""
    model = models["pattern_mqa"]
    tokens = random_tokens(2, 9)
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)
    attn, eps = model.blocks[1].attn, model.cfg.rms_norm_eps
    check = lambda ours, reference: torch.testing.assert_close(ours.double(), reference.double(), rtol=0, atol=1e-5)  # noqa: E731
    with torch.no_grad():
        ln1 = rms(cache["resid_pre", 1], model.blocks[1].ln1.weight, eps)
        check(cache["q", 1].flatten(-2), ln1 @ attn.q_proj.weight.double().T + attn.q_proj.bias.double())
        check(cache["q_normed", 1], rms(cache["q", 1], attn.q_norm.weight, eps))
        check(cache["k_normed", 1], rms(cache["k", 1], attn.k_norm.weight, eps))
        check(
            cache["blocks.1.attn.q_norm.hook_scale"],
            cache["q", 1].double().pow(2).mean(-1, keepdim=True).add(eps).sqrt(),
        )
        check(cache["embed"], model.embed_tokens.weight[tokens] * 48**0.5)


# ----------------------------------------------------------------------------- features on Gemma 3
def test_zero_heads_at_z_equals_zeroing_o_proj_columns(models):
    check_zero_heads_equals_zeroing_o_proj(models["linear_gqa"], heads=[0, 3])


def test_sweep_of_two_head_ablations_equals_each_alone(models):
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :5] = 0  # a left-padded row longer than the window
    check_sweep_equals_each_alone(models["linear_gqa"], random_tokens(3, 9), attention_mask=mask)


def test_run_with_cache_equals_the_forward(models):
    model = models["pattern_mqa"]
    tokens = random_tokens(2, 6)
    logits, cache = model.run_with_cache(tokens)  # caching the pattern runs the eager path
    with torch.no_grad(), hooked.layers.attention_backend("eager"):
        assert torch.equal(logits, model(tokens))  # exact: the same eager path on the same input; the cache only reads
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    torch.testing.assert_close(cache.accumulated_resid(apply_ln=False)[-1], cache[last], rtol=0, atol=0)


# ----------------------------------------------------------------------------- configs and bad input
def test_transformers_ignores_attn_logit_softcapping_so_hooked_refuses_it(dirs, tmp_path):
    """transformers 5.24's Gemma 3 never passes attn_logit_softcapping to its attention: the same weights give the
    same logits with a cap of 0.5 as without. hooked refuses the setting rather than pick a reading."""
    capped = edited_checkpoint(dirs["linear_gqa"], tmp_path / "capped", attn_logit_softcapping=0.5)
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        with_cap = HF.from_pretrained(capped, attn_implementation="eager", dtype=torch.float32).eval()(tokens).logits
        without = (
            HF.from_pretrained(dirs["linear_gqa"], attn_implementation="eager", dtype=torch.float32)
            .eval()(tokens)
            .logits
        )
    assert torch.equal(with_cap, without)  # exact: the cap is never read, so the same operations run
    with pytest.raises(
        ValueError, match="attn_logit_softcapping 0.5: transformers 5.24's Gemma3ForCausalLM never applies it"
    ):
        hooked.load(capped)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"sliding_window": 10**5},
            r"sliding_window 100000 must be a whole number in 1..max_position_embeddings \(64\)",
        ),
        ({"sliding_window": 0}, "sliding_window 0"),
        ({"sliding_window": None}, "sliding_window is null but layer_types has sliding_attention"),
        ({"final_logit_softcapping": 0}, "final_logit_softcapping 0 must be positive"),
        (
            {"attn_logit_softcapping": 0},
            "attn_logit_softcapping 0: transformers 5.24's Gemma3ForCausalLM never applies it",
        ),
        (
            {"layer_types": ["sliding_attention", "full_attention"]},
            r"layer_types \[.*\] must list one of .* per layer \(num_hidden_layers = 3\)",
        ),
        (
            {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
            "layer_types .*chunked_attention",
        ),
        (
            {"layer_types": None, "sliding_window_pattern": 0},
            "sliding_window_pattern 0 must be a positive whole number",
        ),
        ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar 0 must be positive"),
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'.*gelu_pytorch_tanh"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention is true .*EmbeddingGemma"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}},
            r"rope_parameters\['full_attention'\] rope_type 'yarn' is not supported for Gemma 3",
        ),
        (
            {"rope_parameters": {"sliding_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}},
            r"rope_parameters\['sliding_attention'\] rope_type 'dynamic'",
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e4}}},
            "rope_type 'linear' but no 'factor'",
        ),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
            "rope_parameters .* must be keyed by layer type",
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 0}}},
            "rope_theta 0.0 must be positive",
        ),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"head_dim": 7}, "head_dim 7 is odd"),
    ],
)
def test_contradictory_config_is_refused_naming_the_field(tmp_path, dirs, change, message):
    with pytest.raises(ValueError, match=message):
        hooked.load(edited_checkpoint(dirs["linear_gqa"], tmp_path / "edited", **change))


def test_config_reads_hub_layout(dirs):
    """A hub config.json (google/gemma-3-1b's and the 4B text_config's keys): rope_theta, rope_local_base_freq and a
    rope_scaling for the global layers at the top level, sliding_window_pattern and no layer_types, keys left at
    transformers' defaults left out. hooked reads the config transformers 5.24 builds from it."""
    written = json.loads((dirs["pattern_mqa"] / "config.json").read_text())
    hub = {
        key: value
        for key, value in written.items()
        if key not in ("rope_parameters", "layer_types", "attn_logit_softcapping")
    }
    hub.update(rope_theta=5e4, rope_local_base_freq=500.0, rope_scaling=None, sliding_window_pattern=2)
    assert HookedGemma3Config.from_hf(hub) == HookedGemma3Config.from_hf(written)
    scaled = {**hub, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 3}
    del scaled["num_key_value_heads"], scaled["max_position_embeddings"]
    reference = transformers.Gemma3TextConfig(**scaled)
    cfg = HookedGemma3Config.from_hf(scaled)
    assert (
        list(cfg.layer_types)
        == reference.layer_types
        == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    )
    assert (cfg.rope_scaling, cfg.rope_theta, cfg.rope_local_theta, cfg.rope_local_scaling) == (
        LinearScaling(8.0),
        5e4,
        500.0,
        None,
    )
    assert reference.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 5e4}
    assert (cfg.n_kv_heads, cfg.max_position_embeddings) == (
        reference.num_key_value_heads,
        reference.max_position_embeddings,
    )


# ----------------------------------------------------------------------------- Gemma3ForConditionalGeneration
def multimodal_checkpoint(directory, tie_word_embeddings=True):
    """A tiny Gemma3ForConditionalGeneration (a one-layer SigLIP vision tower) saved by transformers 5.24, whose text
    model is linear_gqa's shape."""
    text = dict(
        CASES["linear_gqa"],
        vocab_size=VOCAB + 4,
        pad_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
        final_logit_softcapping=None,
    )
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=VOCAB + 1,
        eoi_token_index=VOCAB + 2,
        image_token_index=VOCAB + 3,
        tie_word_embeddings=tie_word_embeddings,
    )
    return build_checkpoint(directory, config, transformers.Gemma3ForConditionalGeneration, seed=5)


@pytest.mark.parametrize("tied", [True, False])
def test_multimodal_checkpoint_loads_its_text_model(tmp_path, tied):
    """The 4B+ models are saved as Gemma3ForConditionalGeneration: hooked loads the language model (text_config;
    weights under language_model.model.*) and skips the vision tower and projector, as TransformerLens does. On text
    the logits equal transformers' multimodal model's, bit for bit, on SDPA and eager."""
    directory = multimodal_checkpoint(tmp_path / "mm", tie_word_embeddings=tied)
    model = hooked.load(directory)
    assert type(model) is hooked.models.Gemma3 and model.cfg.multimodal_checkpoint
    assert model.cfg.tie_word_embeddings is tied and model.cfg.rope_scaling == LinearScaling(8.0)
    tokens = random_tokens(2, 9)
    for path in ("sdpa", "eager"):
        reference = hf_reference(directory, transformers.Gemma3ForConditionalGeneration, path)
        with torch.no_grad():
            logits = hooked_outputs(model, tokens, eager=path == "eager")[0]
            assert torch.equal(logits, reference(input_ids=tokens, use_cache=False).logits), path  # check_bit_exact


def test_multimodal_checkpoint_in_the_model_language_model_layout(tmp_path):
    """Other transformers versions save the text weights as model.language_model.* and the vision tower as
    model.vision_tower.*: the same model loads."""
    from safetensors.torch import load_file, save_file

    directory = multimodal_checkpoint(tmp_path / "mm")
    state = load_file(directory / "model.safetensors")
    renamed = {
        (
            key.replace("language_model.model.", "model.language_model.", 1)
            if key.startswith("language_model.model.")
            else "model." + key
        ): value
        for key, value in state.items()
    }
    assert any(key.startswith("model.vision_tower.") for key in renamed)
    save_file(renamed, directory / "model.safetensors", metadata={"format": "pt"})
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        reference = hf_reference(directory, transformers.Gemma3ForConditionalGeneration, "sdpa")(
            input_ids=tokens, use_cache=False
        ).logits
        assert torch.equal(hooked.load(directory)(tokens), reference)  # exact as check_bit_exact (SDPA path)


def test_multimodal_checkpoint_with_a_final_softcap_is_refused(tmp_path):
    """transformers 5.24's Gemma3ForConditionalGeneration never applies final_logit_softcapping (its Gemma3ForCausalLM
    does: the same text weights give other logits), so hooked refuses the setting in a multimodal checkpoint."""
    directory = multimodal_checkpoint(tmp_path / "mm")
    config = json.loads((directory / "config.json").read_text())
    config["text_config"]["final_logit_softcapping"] = 0.5
    (directory / "config.json").write_text(json.dumps(config))
    tokens = random_tokens(1, 6)
    with torch.no_grad():
        capped = hf_reference(directory, transformers.Gemma3ForConditionalGeneration, "sdpa")(input_ids=tokens).logits
    assert capped.abs().max() > 0.5  # not capped
    with pytest.raises(
        ValueError,
        match="text_config.final_logit_softcapping 0.5: transformers 5.24's Gemma3ForConditionalGeneration never "
        "applies it",
    ):
        hooked.load(directory)


def test_multimodal_hub_config_reads_as_transformer_lens_4b():
    """google/gemma-3-4b's config.json lists in text_config only what differs from Gemma3TextConfig's defaults: hooked
    fills in the rest as transformers does, and gets the config TransformerLens 3.9 hard-codes for that model
    (loading_from_pretrained.py, google/gemma-3-4b: 8 heads, 4 kv heads, d_head 256, vocab 262208, window 1024,
    global RoPE 1e6 scaled linearly by 8, local 1e4, five local layers then one global)."""
    from transformer_lens.loading_from_pretrained import get_pretrained_model_config

    text = {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    }
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model"},
        "mm_tokens_per_image": 256,
    }
    cfg = HookedGemma3Config.from_hf(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl = get_pretrained_model_config("google/gemma-3-4b-it")
    assert (cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_kv_heads, cfg.d_mlp, cfg.n_layers, cfg.d_vocab) == (
        tl.d_model,
        tl.d_head,
        tl.n_heads,
        tl.n_key_value_heads,
        tl.d_mlp,
        tl.n_layers,
        tl.d_vocab,
    )
    assert (cfg.rotary_base, cfg.rotary_base_local, cfg.rotary_scaling_factor, cfg.window_size, cfg.attn_types) == (
        tl.rotary_base,
        tl.rotary_base_local,
        tl.rotary_scaling_factor,
        tl.window_size,
        tl.attn_types,
    )
    assert (cfg.query_pre_attn_scalar**0.5, cfg.rms_norm_eps, cfg.use_qk_norm) == (
        tl.attn_scale,
        tl.eps,
        tl.use_qk_norm,
    )
    reference = transformers.Gemma3Config(text_config=text).text_config
    assert (
        list(cfg.layer_types) == reference.layer_types
        and cfg.max_position_embeddings == reference.max_position_embeddings
    )


@pytest.mark.parametrize("pattern", [1, 2, 3, 6])
def test_default_layer_pattern_equals_transformers(pattern):
    """Without layer_types, sliding_window_pattern gives transformers 5.24 Gemma3TextConfig's pattern, for 1-13
    layers."""
    for n_layers in range(1, 14):
        sizes = dict(
            hidden_size=16,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=16,
            vocab_size=32,
            num_hidden_layers=n_layers,
            sliding_window_pattern=pattern,
        )
        reference = transformers.Gemma3TextConfig(**sizes).layer_types
        assert list(HookedGemma3Config.from_hf(sizes).layer_types) == reference, (pattern, n_layers)
        assert "full_attention" in reference or n_layers < pattern
