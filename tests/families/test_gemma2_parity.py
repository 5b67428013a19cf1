"""Gemma 2 against transformers 5.24's Gemma2ForCausalLM and TransformerLens 3.9's Gemma 2, on tiny random checkpoints.

Checkpoints are built here with every norm weight randomised (transformers initialises Gemma's to 0, gain 1,
which would hide a dropped or misplaced norm or a `1 +` left out) over MHA, GQA and multi-query attention,
head_dim != hidden_size / heads, tied and untied embeddings, attention_bias, a query_pre_attn_scalar that is not
d_head, small softcaps that bite (2.0 on the scores, 1.5 on the logits) and none, and sliding windows of 3 and 4
on alternating layers (transformers' default pattern and an explicit one) with prompts longer than the window.

transformers 5.24 refuses attn_implementation="sdpa" for Gemma 2 (`_supports_sdpa = False`: SDPA cannot cap the
scores), so its eager path is the reference; its flex_attention path gives the bf16 spread. Float32 on hooked's
eager path is bit-exact (0.0: transformers' operations in its order). Without a softcap hooked's default path is
SDPA, which sums in another order: logits <= 1e-6, residual streams (magnitude ~10) <= 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip

import hooked
from hooked.models.gemma2 import Gemma2Config as HookedGemma2Config
from tests.families.parity import (
    REORDERED_ULPS,
    TRANSFORMER_LENS_ULPS,
    UNEMBED_POINTS,
    build_checkpoints,
    check_greedy_generation,
    check_hook_shapes,
    check_left_padded_batch,
    check_post_norm_decomposition,
    check_sweep_equals_each_alone,
    check_zero_heads_equals_zeroing_o_proj,
    compare_with_transformer_lens,
    edited_checkpoint,
    golden_hook_names,
    hf_outputs,
    hf_reference,
    hooked_outputs,
    ln1_head_zero,
    max_diffs,
    random_tokens,
    tl_model,
    within_ulps_of_magnitude,
)

VOCAB = 96
HF = transformers.Gemma2ForCausalLM

CASES = {
    # GQA 4 -> 2, 3 layers in transformers' default pattern (sliding, full, sliding), window 3, tied, caps that bite
    "capped_gqa": dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        num_hidden_layers=3,
        sliding_window=3,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=1.5,
        initializer_range=0.3,
    ),  # wide weights: scores past the cap
    # multi-query, d_head 16 != 48 / 4, untied, biases, no caps (hooked's default path: SDPA), explicit layer types
    "uncapped_mqa": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        num_hidden_layers=2,
        sliding_window=4,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        layer_types=["full_attention", "sliding_attention"],
        tie_word_embeddings=False,
        attention_bias=True,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    # MHA, d_head = d_model / n_heads (TransformerLens' converter shape), released caps 50 / 30 scaled down to bite
    "mha": dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        intermediate_size=48,
        num_hidden_layers=2,
        sliding_window=4,
        query_pre_attn_scalar=8,
        attn_logit_softcapping=3.0,
        final_logit_softcapping=2.0,
        initializer_range=0.3,
    ),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    # Neutral directory names: TransformerLens' convert_hf_model_config reads family names out of paths.
    configs = {
        name: transformers.Gemma2Config(vocab_size=VOCAB, pad_token_id=0, **kwargs) for name, kwargs in CASES.items()
    }
    return build_checkpoints(tmp_path_factory, configs, HF)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.fixture(scope="module")
def references(dirs):
    return {name: hf_reference(directory, HF, "eager") for name, directory in dirs.items()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["default", "eager"])
def test_float32_equals_transformers(models, references, case, path):
    model = models[case]
    assert type(model) is hooked.models.Gemma2
    tokens = random_tokens(3, 13)
    diffs = max_diffs(hooked_outputs(model, tokens, eager=path == "eager"), hf_outputs(references[case], tokens))
    if path == "eager" or model.cfg.attn_logit_softcapping is not None:  # a softcap runs the eager path by default
        assert diffs == dict.fromkeys(diffs, 0.0), diffs
    else:  # SDPA: another summation order
        assert diffs["logits"] <= 1e-6 and max(diffs.values()) <= 1e-5, diffs


def test_config_read_from_each_case(models):
    cfg = models["capped_gqa"].cfg
    assert cfg.layer_types == ("sliding_attention", "full_attention", "sliding_attention")  # transformers' default
    assert (cfg.sliding_window, cfg.query_pre_attn_scalar, cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (
        3,
        16,
        2.0,
        1.5,
    )
    assert cfg.tie_word_embeddings and models["capped_gqa"].lm_head is None
    cfg = models["uncapped_mqa"].cfg
    assert cfg.layer_types == ("full_attention", "sliding_attention") and cfg.attn_types == ["global", "local"]
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping, cfg.rope_theta, cfg.d_head) == (
        None,
        None,
        1e6,
        16,
    )
    assert (cfg.attn_scores_soft_cap, cfg.output_logits_soft_cap) == (-1.0, -1.0)  # TransformerLens' "off"
    assert [block.sliding for block in models["capped_gqa"].blocks] == [True, False, True]


def test_caps_and_window_change_the_model(dirs, models):
    """Each of the softcaps, the window and query_pre_attn_scalar moves the logits at these sizes (none is a no-op)."""
    model = models["capped_gqa"]
    tokens = random_tokens(2, 12)
    with torch.no_grad():
        logits = model(tokens)
        assert logits.abs().max() < 1.5  # the final cap bounds every logit
        for change in (
            dict(attn_logit_softcapping=None),
            dict(final_logit_softcapping=None),
            dict(sliding_window=12),
            dict(query_pre_attn_scalar=8),
        ):
            config = json.loads((dirs["capped_gqa"] / "config.json").read_text())
            other = hooked.models.Gemma2(HookedGemma2Config.from_hf({**config, **change}))
            other.load_state_dict(model.state_dict())
            assert (other(tokens) - logits).abs().max() > 1e-4, change


def test_pattern_on_a_softcapped_layer_equals_transformers_eager_attention_weights(models, references):
    """hook_pattern (softmax of the capped, masked scores) equals transformers' eager `attentions` on every layer,
    the sliding ones zero outside the window; hook_attn_scores stays within the cap."""
    model, tokens = models["capped_gqa"], random_tokens(2, 9)
    with torch.no_grad():
        out = references["capped_gqa"](tokens, output_attentions=True, use_cache=False)
        _, cache = model.run_with_cache(
            tokens, names_filter=lambda name: name.endswith(("hook_pattern", "hook_attn_scores"))
        )
    query, key = torch.arange(9)[:, None], torch.arange(9)[None, :]
    # Exact: transformers' eager operations in its order, on keys of the same layout (no KV cache on its side)
    for layer, reference in enumerate(out.attentions):
        assert torch.equal(cache["pattern", layer], reference), layer
        visible = cache["attn_scores", layer] > torch.finfo(torch.float32).min
        assert torch.equal(visible[0, 0], (key <= query) & (key > query - 3 if layer % 2 == 0 else True))
        assert cache["attn_scores", layer][visible].abs().max() <= 2.0


def test_transformers_refuses_sdpa_for_gemma2(dirs):
    """What hooked's docs say: transformers 5.24 has no SDPA path for Gemma 2 (it cannot cap the scores)."""
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        HF.from_pretrained(dirs["mha"], attn_implementation="sdpa")


def test_bfloat16_within_transformers_own_spread(dirs):
    """bf16: hooked's eager path equals transformers' eager exactly; hooked's default path lands within the spread
    between transformers' two bf16 implementations (eager and flex_attention; it has no sdpa for Gemma 2)."""
    tokens = random_tokens(2, 11)
    for case in ("capped_gqa", "uncapped_mqa"):
        model = hooked.load(dirs[case], dtype=torch.bfloat16)
        outputs = {}
        for implementation in ("eager", "flex_attention"):
            reference = HF.from_pretrained(dirs[case], attn_implementation=implementation, dtype=torch.bfloat16).eval()
            with torch.no_grad():
                outputs[implementation] = reference(tokens, use_cache=False).logits.float()  # as hf_outputs
        spread = (outputs["flex_attention"] - outputs["eager"]).abs().max().item()
        with torch.no_grad():
            logits = model(tokens)
            with hooked.layers.attention_backend("eager"):
                eager = model(tokens)
        assert logits.dtype == torch.bfloat16
        assert torch.equal(eager.float(), outputs["eager"]), case  # transformers' eager operations in its order
        assert (logits.float() - outputs["eager"]).abs().max().item() <= spread, case


def test_left_padded_batch(models, references):
    """Prompts of 9, 4 and 6 tokens against windows of 3 and 4."""
    for case in ("capped_gqa", "uncapped_mqa"):
        check_left_padded_batch(models[case], references[case], [9, 4, 6])


@pytest.mark.parametrize("lengths", [[7], [9, 4, 6]])
def test_greedy_generation_equals_transformers(models, references, lengths):
    """Prompts longer than the window of 3, 12 new tokens: sliding and full layers both run against the KV cache."""
    check_greedy_generation(models["capped_gqa"], references["capped_gqa"], lengths)


def test_generation_without_caps(models, references):
    check_greedy_generation(models["uncapped_mqa"], references["uncapped_mqa"], [9, 4, 6])


def test_triton_kernel_serves_the_softcap_and_the_window(models, references):
    """The Triton kernel (interpreter on CPU) caps the scores and applies each layer's window: forced, a left-padded
    batch longer than the window gives transformers' eager logits within float32 rounding. SDPA, which cannot cap,
    is refused by name."""
    model = models["capped_gqa"]
    tokens = random_tokens(2, 11, seed=5)
    mask = torch.ones_like(tokens)
    mask[1, :4] = 0
    real = mask.bool()
    with torch.no_grad():
        reference = references["capped_gqa"](tokens, attention_mask=mask).logits
        with hooked.layers.attention_backend("triton"):
            logits = model(tokens, attention_mask=mask)
        with (
            hooked.layers.attention_backend("sdpa"),
            pytest.raises(RuntimeError, match="cannot apply this model's attention logit softcap"),
        ):
            model(tokens)
    torch.testing.assert_close(logits[real], reference[real], rtol=0, atol=3e-5)


# ----------------------------------------------------------------------------- TransformerLens 3.9
def tl_config_fields(c) -> dict:
    """TransformerLens' Gemma 2 config fields, as its loading_from_pretrained.py sets them for google/gemma-2-2b,
    built by hand from the checkpoint's sizes."""
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
        rotary_base=c.rope_parameters["rope_theta"],
        positional_embedding_type="rotary",
        use_attn_scale=True,
        attn_scale=c.query_pre_attn_scalar**0.5,
        n_key_value_heads=c.num_key_value_heads,
        window_size=c.sliding_window,
        use_local_attn=True,
        attn_types=["local" if kind == "sliding_attention" else "global" for kind in c.layer_types],
        attn_scores_soft_cap=c.attn_logit_softcapping,
        output_logits_soft_cap=c.final_logit_softcapping,
        gated_mlp=True,
        final_rms=True,
        use_normalization_before_and_after=True,
        original_architecture="Gemma2ForCausalLM",
    )


def tl_gemma2(directory, **processing):
    """TransformerLens' HookedTransformer on a checkpoint's weights: the fields above and its own converter
    (pretrained/weight_conversions/gemma.py), processed as `processing` says (default: not at all)."""
    return tl_model(directory, HF, "convert_gemma_weights", tl_config_fields, **processing)


ONLY_HOOKED = {"hook_attn_out_pre_norm", "hook_mlp_out_pre_norm"}


def test_every_hook_equals_transformer_lens(models, dirs):
    """Every hook point both have holds the same tensor up to float32 rounding (tests/families/parity.py): hook_embed
    (the scaled embedding), the pre-norms ln1 / ln2 and post-norms ln1_post / ln2_post, the capped scores on local and
    global layers, hook_attn_out / hook_mlp_out after the post-norms, and the capped logits. With split q/k/v inputs
    TransformerLens normalises each head's copy (its ln1 hooks are per head): head 0's is compared."""
    model, tl = models["mha"], tl_gemma2(dirs["mha"])
    tokens = random_tokens(2, 11)
    # The scores before the cap are O(100) here (wide weights, so that the cap bites): the two sum q.k in other
    # orders and scale before / after, the largest rounding of all the families (56 ulps of 3.0 after the cap).
    compare_with_transformer_lens(model, tl, tokens, ONLY_HOOKED, UNEMBED_POINTS, adjust=ln1_head_zero)
    # TransformerLens' norm weights are the gains: its converter adds the one; hooked's `w` is the same (exact: one
    # float32 addition of the same numbers).
    for name in ("ln1", "ln1_post", "ln2", "ln2_post"):
        torch.testing.assert_close(getattr(model.blocks[1], name).w, getattr(tl.blocks[1], name).w, rtol=0, atol=0)
    torch.testing.assert_close(model.W_E, tl.W_E, rtol=0, atol=0)


def test_transformer_lens_names_resolve():
    for size in ("2b", "9b", "27b"):
        assert hooked.aliases.hub_id(f"gemma-2-{size}") == f"google/gemma-2-{size}"
        assert hooked.aliases.hub_id(f"gemma-2-{size}-it") == f"google/gemma-2-{size}-it"


# ----------------------------------------------------------------------------- weight processing
def test_from_pretrained_equals_transformer_lens_processing(dirs, models):
    """fold_ln folds the pre-norms' gains (1 + weight) into q/k/v and gate/up and the final one into W_U, leaving
    those weights at 0 (gain 1); the post-norms cannot be folded and keep their weights. TransformerLens 3.9 turns
    center_unembed off for a logit softcap (not shift-invariant), so both are compared with it off. The processed
    weights and logits equal TransformerLens' processed model's; the processed logits equal the unprocessed ones."""
    case, tokens = "capped_gqa", random_tokens(2, 9)
    processed = hooked.HookedTransformer.from_pretrained(str(dirs[case]), center_unembed=False)
    tl = tl_gemma2(dirs[case], fold_ln=True, fold_value_biases=True)
    assert processed.processing["fold_ln"] and processed.cfg.normalization_type == "RMSPre"
    unprocessed = models[case]
    for layer, block in enumerate(processed.blocks):
        assert not block.ln1.weight.any() and not block.ln2.weight.any()
        assert torch.equal(block.ln1.gain, torch.ones(processed.cfg.d_model))
        for name in ("ln1_post", "ln2_post"):  # untouched: the very values
            assert torch.equal(getattr(block, name).weight, getattr(unprocessed.blocks[layer], name).weight)
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


def test_center_unembed_is_refused_under_a_logit_softcap(dirs, models, monkeypatch):
    """A shift of every logit changes cap * tanh(logits / cap): centring the unembedding would move every
    probability, so it is refused (naming center_unembed=False) before any weight is read; nothing is changed
    on a model processed in place. Without a final cap it runs."""
    read = []
    monkeypatch.setattr(hooked.weights.loading, "read_state_dict", lambda *a, **k: read.append(1) or {})
    with pytest.raises(ValueError, match=r"center_unembed=True: this model caps its logits.*center_unembed=False"):
        hooked.HookedTransformer.from_pretrained(str(dirs["capped_gqa"]))
    assert not read
    monkeypatch.undo()
    model = models["capped_gqa"]
    before = model.unembed_weight.clone()
    with pytest.raises(ValueError, match="center_unembed=True"):
        model.process_weights_(
            fold_ln=False, center_writing_weights=False, center_unembed=True, fold_value_biases=False
        )
    assert torch.equal(model.unembed_weight, before) and not any(model.processing.values())


def test_direct_logit_attribution_sums_to_the_pre_cap_logits(models):
    """Direct logit attribution is linear, so it attributes the logits BEFORE final_logit_softcapping: the
    decomposed residual stream, through the final norm's cached scale, read out along the answer's unembedding
    direction sums to ln_final(resid) @ W_U[answer] computed from the weights, not to the capped logit."""
    model = models["capped_gqa"]
    tokens = random_tokens(2, 8)
    answers = torch.tensor([5, 17])
    logits, cache = model.run_with_cache(tokens)
    parts = cache.decompose_resid(pos_slice=-1)  # [component batch d_model]
    attributions = cache.logit_attrs(parts, answers, pos_slice=-1)  # [component batch]: final norm's scale and gain
    with torch.no_grad():
        resid = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][:, -1].double()
        normed = resid / resid.pow(2).mean(-1, keepdim=True).add(model.cfg.rms_norm_eps).sqrt()
        pre_cap = (normed * (1 + model.ln_final.weight.double())) @ model.embed_tokens.weight.double()[answers].T
        pre_cap = pre_cap.diagonal()
    torch.testing.assert_close(attributions.sum(0).double(), pre_cap, rtol=0, atol=1e-5)
    capped = logits[torch.arange(2), -1, answers].double()
    torch.testing.assert_close(capped, 1.5 * torch.tanh(pre_cap / 1.5), rtol=0, atol=1e-5)
    assert (capped - pre_cap).abs().max() > 1e-2  # the cap bites: the attributions do not sum to the capped logits


# ----------------------------------------------------------------------------- hook names and shapes
GEMMA2_BLOCK = [  # the hook points of one block, in forward order
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
GOLDEN_HOOK_NAMES = golden_hook_names([GEMMA2_BLOCK] * 2)


def test_golden_hook_names(models):
    assert models["mha"].hook_names == GOLDEN_HOOK_NAMES


def test_hook_shapes_match_declared_axes(models):
    model = models["uncapped_mqa"]
    expected = check_hook_shapes(model)
    assert expected["blocks.0.attn.hook_k"] == (2, 7, 1, 16) and expected["blocks.0.attn.hook_q"] == (2, 7, 4, 16)
    assert expected["blocks.0.ln1_post.hook_scale"] == (2, 7, 1) and expected["blocks.0.mlp.hook_post"] == (2, 7, 64)


def rms(x, weight, eps):
    """An independent Gemma RMSNorm over the last axis, float64: x / sqrt(mean(x^2) + eps) * (1 + weight)."""
    x = x.double()
    return (1 + weight.double()) * x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def test_hooks_hold_what_the_docs_say(models):
    """embed = W[tokens] * sqrt(d_model); q = q_proj(ln1(resid_pre)); attn_out = ln1_post(o_proj(z)) is what the
    residual
    gains; the MLP reads ln2(resid_mid) through gelu_tanh(gate) * up; mlp_out = ln2_post(down_proj(post))."""
    model = models["uncapped_mqa"]
    tokens = random_tokens(2, 9)
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)
    block, eps = model.blocks[1], model.cfg.rms_norm_eps
    check = lambda ours, reference: torch.testing.assert_close(ours.double(), reference.double(), rtol=0, atol=1e-5)  # noqa: E731
    with torch.no_grad():
        check(cache["embed"], model.embed_tokens.weight[tokens] * 48**0.5)
        resid_pre = cache["resid_pre", 1]
        ln1 = rms(resid_pre, block.ln1.weight, eps)
        check(cache["blocks.1.ln1.hook_scale"], resid_pre.double().pow(2).mean(-1, keepdim=True).add(eps).sqrt())
        check(cache["q", 1].flatten(-2), ln1 @ block.attn.q_proj.weight.double().T + block.attn.q_proj.bias.double())
        pre_norm = cache["blocks.1.hook_attn_out_pre_norm"]
        check(pre_norm, block.attn.o_proj(cache["z", 1].flatten(-2)))
        check(cache["result", 1].sum(2) + block.attn.o_proj.bias, pre_norm)
        check(cache["attn_out", 1], rms(pre_norm, block.ln1_post.weight, eps))
        check(cache["resid_mid", 1], resid_pre + cache["attn_out", 1])
        ln2 = rms(cache["resid_mid", 1], block.ln2.weight, eps)
        check(cache["pre", 1], ln2 @ block.mlp.gate_proj.weight.double().T)
        pre = cache["pre", 1].double()
        gelu_tanh = 0.5 * pre * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (pre + 0.044715 * pre**3)))
        check(cache["post", 1], gelu_tanh * cache["pre_linear", 1])
        mlp_pre_norm = cache["blocks.1.hook_mlp_out_pre_norm"]
        check(cache["mlp_out", 1], rms(mlp_pre_norm, block.ln2_post.weight, eps))
        check(cache["resid_post", 1], cache["resid_mid", 1] + cache["mlp_out", 1])
    assert torch.equal(model.W_E[tokens], cache["embed"])  # a lookup: the very rows


# ----------------------------------------------------------------------------- features on Gemma 2
def test_zero_heads_at_z_equals_zeroing_o_proj_columns(models):
    check_zero_heads_equals_zeroing_o_proj(models["capped_gqa"], heads=[0, 3])


def test_sweep_of_two_head_ablations_equals_each_alone(models):
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :5] = 0  # a left-padded row longer than the window
    check_sweep_equals_each_alone(models["capped_gqa"], random_tokens(3, 9), attention_mask=mask)


def test_run_with_cache_equals_the_forward(models):
    model = models["uncapped_mqa"]
    tokens = random_tokens(2, 6)
    logits, cache = model.run_with_cache(tokens)  # caching the pattern runs the eager path
    with torch.no_grad(), hooked.layers.attention_backend("eager"):
        assert torch.equal(logits, model(tokens))  # exact: the same eager path on the same input; the cache only reads
    torch.testing.assert_close(cache.accumulated_resid(apply_ln=False)[-1], cache["resid_post", 1], rtol=0, atol=0)
    with torch.no_grad():  # the logit lens: ln_final with the cached scale and the gain 1 + weight
        # divides by the cached scale where ln_final runs its own formula: a few float32 ulps of the magnitude
        lens, final = cache.accumulated_resid(apply_ln=True)[-1], model.ln_final(cache["resid_post", 1])
        within_ulps_of_magnitude(lens, final, 8, "logit lens")


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_head_and_neuron_writes_through_the_post_norms_sum_to_what_the_block_added(family):
    """`through_post_norm=True`: each head's and neuron's write carried through ln1_post / ln2_post at the cached
    scale; with o_proj biases, so the bias row goes through the norm too (tests/families/parity.py)."""
    from hooked.testing import random_model

    model = random_model(family, seed=5, attention_bias=True)
    check_post_norm_decomposition(model, random_tokens(2, 6, vocab=model.cfg.d_vocab), ("ln1_post", "ln2_post"))


def test_per_head_writes_are_refused_and_circuits_take_each_layers_attention_whole(models):
    """A head's hook_result is not what a Gemma 2 block adds (ln1_post normalises the sum of all heads first):
    per-head stacks are refused, and the circuits graph's attention nodes are whole layers
    (tests/circuits/test_circuits.py checks their edges against plain hooks)."""
    from hooked import circuits

    model = models["capped_gqa"]
    _, cache = model.run_with_cache(random_tokens(2, 5))
    for call in (lambda: cache.stack_head_results(), lambda: cache.stack_neuron_results(1)):
        with pytest.raises(ValueError, match=r"normalises its sublayer outputs \(ln1_post, ln2_post\)"):
            call()
    graph = circuits.graph(model)
    assert [s.name for s in graph.sources[:3]] == ["input", "L0.attn", "L0.mlp"]
    assert graph.sources[1].hook_name == "blocks.0.hook_attn_out" and graph.whole_attention == tuple(
        range(model.cfg.n_layers)
    )
    with pytest.raises(KeyError, match=r"'L0H1' is not a node.*'L0.attn'"):
        graph.source_index("L0H1")
    parts = cache.decompose_resid(model.cfg.n_layers)
    torch.testing.assert_close(
        parts.sum(0), cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"], rtol=0, atol=1e-5
    )


# ----------------------------------------------------------------------------- configs and bad input
@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"sliding_window": 10**5},
            r"sliding_window 100000 must be a whole number in 1..max_position_embeddings \(8192\)",
        ),
        ({"sliding_window": 0}, "sliding_window 0"),
        ({"sliding_window": None}, "sliding_window is null but layer_types has sliding_attention"),
        ({"attn_logit_softcapping": 0}, "attn_logit_softcapping 0 must be positive"),
        ({"final_logit_softcapping": -30.0}, r"final_logit_softcapping -30.0 must be positive"),
        (
            {"layer_types": ["sliding_attention", "full_attention"]},
            r"layer_types \[.*\] must list one of .* per layer \(num_hidden_layers = 3\)",
        ),
        (
            {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
            "layer_types .*chunked_attention",
        ),
        ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar 0 must be positive"),
        ({"query_pre_attn_scalar": -4}, "query_pre_attn_scalar -4 must be positive"),
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'.*gelu_pytorch_tanh"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rope_type 'linear'"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"head_dim": 7}, "head_dim 7 is odd"),
        # transformers' default RoPE turns only this share of each head; hooked's turns whole heads
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ],
)
def test_contradictory_config_is_refused_naming_the_field(tmp_path, dirs, change, message):
    with pytest.raises(ValueError, match=message):
        hooked.load(edited_checkpoint(dirs["capped_gqa"], tmp_path / "edited", **change))


def test_config_reads_hub_layout(dirs):
    """A hub config.json (google/gemma-2-2b's keys): rope_theta at the top level, hidden_act beside
    hidden_activation (transformers 5.24 reads only the latter), and no layer_types: transformers' alternation."""
    written = json.loads((dirs["capped_gqa"] / "config.json").read_text())
    hub = {key: value for key, value in written.items() if key not in ("rope_parameters", "layer_types")}
    hub.update(rope_theta=10000.0, hidden_act="gelu_pytorch_tanh")
    assert HookedGemma2Config.from_hf(hub) == HookedGemma2Config.from_hf(written)
    assert transformers.Gemma2Config(**{k: v for k, v in hub.items() if k != "hidden_act"}).layer_types == list(
        HookedGemma2Config.from_hf(hub).layer_types
    )
    assert HookedGemma2Config.from_hf({**hub, "hidden_act": "relu"}).act_fn == "gelu_pytorch_tanh"
