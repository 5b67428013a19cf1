"""OLMo 2 against transformers 5.24's Olmo2ForCausalLM and TransformerLens 3.9's OLMo 2, on tiny random checkpoints.

Checkpoints are built here (every norm weight and bias randomised: HF initialises them to 1 and 0, which would
hide a dropped or misplaced norm) over MHA, GQA and multi-query attention, head_dim != hidden_size / heads,
tied and untied embeddings, attention_bias, and RoPE bases 1e4 and 5e5. Float32 is bit-exact on both attention
paths: hooked runs transformers' operations in the same order (post-norms before the residual adds, q_norm /
k_norm over the whole projection computed on its flat view), so the measured max abs difference of the
logits, every resid_pre and the final norm's output is 0.0 in every case.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip

import hooked
from hooked.models.olmo2 import Olmo2Config as HookedOlmo2Config
from tests.families.parity import (
    UNEMBED_POINTS,
    build_checkpoints,
    check_bf16_within_spread,
    check_bit_exact,
    check_greedy_generation,
    check_hook_shapes,
    check_left_padded_batch,
    check_post_norm_decomposition,
    check_sweep_equals_each_alone,
    check_zero_heads_equals_zeroing_o_proj,
    compare_with_transformer_lens,
    edited_checkpoint,
    golden_hook_names,
    hf_reference,
    random_tokens,
    tl_model,
)

VOCAB = 96
HF = transformers.Olmo2ForCausalLM

# name -> transformers Olmo2Config keyword arguments
CASES = {
    # MHA, d_head = d_model / n_heads, untied, no biases: the shape TransformerLens 3.9's converter reads
    "mha": dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96, num_hidden_layers=2
    ),
    # GQA 8 -> 2, 8 * 16 = 128 != d_model 64 (q_norm 128 wide, k_norm 32), tied, every bias, OLMo 2's theta 5e5
    "gqa_bias_tied": dict(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=80,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5},
    ),
    # multi-query, d_head 32 > d_model / n_heads, eps 1e-6 (the released checkpoints')
    "mqa": dict(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=64,
        num_hidden_layers=2,
        rms_norm_eps=1e-6,
    ),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    # Neutral directory names: TransformerLens' convert_hf_model_config reads family names out of paths.
    configs = {
        name: transformers.Olmo2Config(vocab_size=VOCAB, pad_token_id=0, eos_token_id=1, **kwargs)
        for name, kwargs in CASES.items()
    }
    return build_checkpoints(tmp_path_factory, configs, HF)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager"])
def test_float32_bit_exact(dirs, models, case, path):
    model = models[case]
    assert type(model) is hooked.models.Olmo2
    check_bit_exact(model, hf_reference(dirs[case], HF, path), random_tokens(3, 17), eager=path == "eager")


def test_config_read_from_each_case(models):
    cfg = models["gqa_bias_tied"].cfg
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.rope_theta, cfg.tie_word_embeddings, cfg.attention_bias) == (
        8,
        2,
        16,
        5e5,
        True,
        True,
    )
    assert (cfg.rms_norm_eps, models["mqa"].cfg.rms_norm_eps) == (
        1e-5,
        1e-6,
    )  # transformers' default, then the config's
    assert models["mha"].cfg.d_head == 16 and models["mqa"].cfg.n_kv_heads == 1
    assert tuple(models["gqa_bias_tied"].blocks[0].attn.q_norm.weight.shape) == (128,)
    assert tuple(models["gqa_bias_tied"].blocks[0].attn.k_norm.weight.shape) == (32,)


def test_norms_over_the_whole_projection_differ_from_per_head_norms(models):
    """The q/k norms span every head: normalising each head on its own (Qwen3's q_norm) gives other logits."""
    model = models["mha"]
    tokens = random_tokens(2, 9)

    def per_head_q(q, hook):  # replace q_normed by a per-head RMSNorm of hook_q with the same weight
        block = model.blocks[int(hook.name.split(".")[1])]
        raw = cached[hook.name.replace("hook_q_normed", "hook_q").replace("hook_k_normed", "hook_k")]
        norm = block.attn.q_norm if "q_normed" in hook.name else block.attn.k_norm
        scaled = raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + norm.eps)
        return norm.weight.view(-1, raw.shape[-1]) * scaled

    with torch.no_grad():
        logits, cached = model.run_with_cache(tokens, names_filter=lambda name: name.endswith(("hook_q", "hook_k")))
        per_head_logits = model.run_with_hooks(
            tokens, fwd_hooks=[(lambda n: n.endswith(("hook_q_normed", "hook_k_normed")), per_head_q)]
        )
    assert (per_head_logits - logits).abs().max() > 1e-4


def test_bfloat16_within_transformers_own_spread(dirs):
    """bf16: |hooked - transformers sdpa| <= transformers' |eager - sdpa|."""
    tokens = random_tokens(2, 11)
    for case in ("gqa_bias_tied", "mqa"):
        check_bf16_within_spread(dirs[case], HF, tokens)


def test_left_padded_batch(dirs, models):
    for case in ("gqa_bias_tied", "mqa"):
        check_left_padded_batch(models[case], hf_reference(dirs[case], HF, "sdpa"), [9, 4, 6])


@pytest.mark.parametrize("lengths", [[7], [9, 4, 6]])
def test_greedy_generation_equals_transformers(dirs, models, lengths):
    check_greedy_generation(models["gqa_bias_tied"], hf_reference(dirs["gqa_bias_tied"], HF, "sdpa"), lengths)


# ----------------------------------------------------------------------------- TransformerLens 3.9
def tl_config_fields(c) -> dict:
    """TransformerLens' OLMo 2 config fields, built by hand from the checkpoint's config: TransformerLens 3.9 maps
    only its two named OLMo 2 checkpoints (loading_from_pretrained.get_pretrained_model_config)."""
    return dict(
        d_model=c.hidden_size,
        d_head=c.hidden_size // c.num_attention_heads,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_base=c.rope_parameters["rope_theta"],
        attn_types=["global"] * c.num_hidden_layers,
        gated_mlp=True,
        original_architecture="Olmo2ForCausalLM",
    )


def tl_olmo2(directory):
    """TransformerLens' HookedTransformer on a checkpoint's weights: the fields above and its own converter
    (pretrained/weight_conversions/olmo2.py, MHA only: it splits k/v by n_heads), unprocessed, float32."""
    return tl_model(directory, HF, "convert_olmo2_weights", tl_config_fields)


ONLY_HOOKED = {"attn.hook_q_normed", "attn.hook_k_normed", "hook_attn_out_pre_norm", "hook_mlp_out_pre_norm"}


def test_every_hook_equals_transformer_lens(dirs, models):
    """Every hook point both have holds the same tensor up to float32 rounding (tests/families/parity.py), among them
    TransformerLens' post-norm ln1 / ln2 and hook_attn_out / hook_mlp_out after them. TransformerLens holds
    q_norm / k_norm's hook_normalized flat [batch pos heads * d_head]; hooked splits it by head."""
    model, tl = models["mha"], tl_olmo2(dirs["mha"])
    tokens = random_tokens(2, 19)

    def flat(name, ours, theirs):  # TransformerLens holds the norms' hook_normalized flat
        return (ours.flatten(-2) if name.endswith("_norm.hook_normalized") else ours), theirs

    compare_with_transformer_lens(model, tl, tokens, ONLY_HOOKED, UNEMBED_POINTS, adjust=flat)


def test_transformer_lens_names_resolve():
    assert hooked.aliases.hub_id("olmo-2-1b") == "allenai/OLMo-2-0425-1B"
    assert hooked.aliases.hub_id("olmo-2-7b") == "allenai/OLMo-2-1124-7B"


# ----------------------------------------------------------------------------- hook names and shapes
OLMO2_BLOCK = [  # the hook points of one block, in forward order
    "hook_resid_pre",
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
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
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_in",
    "mlp.hook_in",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "hook_mlp_out_pre_norm",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "hook_mlp_out",
    "hook_resid_post",
]
GOLDEN_HOOK_NAMES = golden_hook_names([OLMO2_BLOCK] * 2)


def test_golden_hook_names(models):
    assert models["mha"].hook_names == GOLDEN_HOOK_NAMES


def test_hook_shapes_match_declared_axes(models):
    model = models["gqa_bias_tied"]
    expected = check_hook_shapes(model)
    assert expected["blocks.0.attn.q_norm.hook_normalized"] == (2, 7, 8, 16)
    assert expected["blocks.0.attn.k_norm.hook_normalized"] == (2, 7, 2, 16)
    assert expected["blocks.0.attn.q_norm.hook_scale"] == (2, 7, 1) and expected["blocks.0.ln1.hook_scale"] == (2, 7, 1)


def rms(x, weight, eps):
    """An independent RMSNorm over the last axis, float64."""
    x = x.double()
    return weight.double() * x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def test_hooks_hold_what_the_docs_say(models):
    """q = q_proj(resid_pre) un-normalised; q_normed = RMSNorm over ALL heads of q; attn_out = ln1(o_proj(z)) is what
    the residual gains; mlp reads resid_mid itself; mlp_out = ln2(down_proj(post)); head results sum to the pre-norm
    write."""
    model = models["gqa_bias_tied"]
    tokens = random_tokens(2, 9)
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)
    block, eps = model.blocks[1], model.cfg.rms_norm_eps
    check = lambda ours, reference: torch.testing.assert_close(ours.double(), reference.double(), rtol=0, atol=1e-5)  # noqa: E731
    with torch.no_grad():
        resid_pre = cache["resid_pre", 1]
        check(cache["q", 1].flatten(-2), block.attn.q_proj(resid_pre))
        check(
            cache["blocks.1.attn.hook_q_normed"].flatten(-2),
            rms(cache["q", 1].flatten(-2), block.attn.q_norm.weight, eps),
        )
        check(
            cache["blocks.1.attn.hook_k_normed"].flatten(-2),
            rms(cache["k", 1].flatten(-2), block.attn.k_norm.weight, eps),
        )
        check(
            cache["blocks.1.attn.q_norm.hook_scale"],
            cache["q", 1].flatten(-2).double().pow(2).mean(-1, keepdim=True).add(eps).sqrt(),
        )
        pre_norm = cache["blocks.1.hook_attn_out_pre_norm"]
        check(pre_norm, block.attn.o_proj(cache["z", 1].flatten(-2)))
        check(cache["result", 1].sum(2) + block.attn.o_proj.bias, pre_norm)
        check(cache["attn_out", 1], rms(pre_norm, block.ln1.weight, eps))
        check(cache["resid_mid", 1], resid_pre + cache["attn_out", 1])
        check(cache["pre", 1], cache["resid_mid", 1] @ block.mlp.W_gate)
        mlp_pre_norm = cache["blocks.1.hook_mlp_out_pre_norm"]
        check(mlp_pre_norm, cache["post", 1] @ block.mlp.W_out)
        check(cache["mlp_out", 1], rms(mlp_pre_norm, block.ln2.weight, eps))
        check(cache["resid_post", 1], cache["resid_mid", 1] + cache["mlp_out", 1])
    assert torch.equal(model.W_E[tokens], cache["embed"])  # a lookup: the very rows


def test_one_heads_query_input_moves_every_heads_normalised_query(models):
    """q_norm's scale is shared by all heads: editing head 0's query input leaves head 1's q as it was and
    changes head 1's q after the norm."""
    model = models["mha"]
    tokens = random_tokens(1, 6)
    names = lambda name: name in ("blocks.0.attn.hook_q", "blocks.0.attn.hook_q_normed")  # noqa: E731

    def double_head_0(x, hook):
        x[:, :, 0] *= 2.0
        return x

    with torch.no_grad():
        _, base = model.run_with_cache(tokens, names_filter=names)
        with model.hooks(fwd_hooks=[("blocks.0.hook_q_input", double_head_0)]):
            _, edited = model.run_with_cache(tokens, names_filter=names)
    torch.testing.assert_close(
        edited["blocks.0.attn.hook_q"][:, :, 1], base["blocks.0.attn.hook_q"][:, :, 1], rtol=0, atol=1e-6
    )
    assert (
        edited["blocks.0.attn.hook_q_normed"][:, :, 1] - base["blocks.0.attn.hook_q_normed"][:, :, 1]
    ).abs().max() > 1e-3


# ----------------------------------------------------------------------------- features on OLMo 2
def test_zero_heads_at_z_equals_zeroing_o_proj_columns(models):
    check_zero_heads_equals_zeroing_o_proj(models["gqa_bias_tied"], heads=[2, 5])


def test_sweep_of_two_head_ablations_equals_each_alone(models):
    check_sweep_equals_each_alone(models["gqa_bias_tied"], random_tokens(3, 9))


def test_run_with_cache_equals_the_forward(models):
    model = models["mqa"]
    tokens = random_tokens(2, 6)
    logits, cache = model.run_with_cache(tokens)  # caching the pattern runs the eager path
    with torch.no_grad(), hooked.layers.attention_backend("eager"):
        assert torch.equal(logits, model(tokens))  # exact: the same eager path on the same input; the cache only reads
    torch.testing.assert_close(cache.accumulated_resid(apply_ln=False)[-1], cache["resid_post", 1], rtol=0, atol=0)
    # Into the unembedding the final norm (a true pre-norm) applies: the logit lens, ln_final run on the last row.
    final = cache.accumulated_resid(apply_ln=True)[-1]
    with torch.no_grad():
        torch.testing.assert_close(final, model.ln_final(cache["resid_post", 1]), rtol=0, atol=0)


def test_apply_ln_before_a_block_is_refused(models):
    """No norm reads the residual stream before an OLMo 2 block, so no cached scale applies there (ln1.hook_scale
    is the attention output's): refused, not computed with the wrong scale."""
    _, cache = models["mqa"].run_with_cache(random_tokens(2, 6))
    with pytest.raises(ValueError, match="no norm before attention or the MLP.*apply_ln=False"):
        cache.accumulated_resid(layer=1, apply_ln=True)
    with pytest.raises(ValueError, match="no norm before attention or the MLP"):
        cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True)


# ----------------------------------------------------------------------------- weight processing
def test_from_pretrained_refuses_fold_ln_naming_the_post_norms(dirs):
    """TransformerLens 3.9 turns fold_ln off for OLMo 2 with a warning; hooked refuses it, naming why and the fix."""
    with pytest.raises(ValueError, match="fold_ln=True: OLMo 2 has no norm before attention.*fold_ln=False"):
        hooked.HookedTransformer.from_pretrained(str(dirs["gqa_bias_tied"]))
    model = hooked.load(dirs["mha"])
    tokens = random_tokens(2, 7)
    with torch.no_grad():
        before = model(tokens)
        with pytest.raises(ValueError, match="fold_ln=True"):
            model.process_weights_()
        assert torch.equal(model(tokens), before) and not any(model.processing.values())


def test_processing_without_fold_ln_keeps_the_function(dirs, models):
    """fold_ln=False: the unembedding centred and the value biases folded into o_proj's bias (exact before the
    post-norm: the pattern sums to 1); writing weights are not centred (RMSNorm). Log-probs unchanged."""
    tokens = random_tokens(2, 9)
    processed = hooked.HookedTransformer.from_pretrained(str(dirs["gqa_bias_tied"]), fold_ln=False)
    assert processed.processing == dict(
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=True,
        fold_value_biases=True,
        refactor_factored_attn_matrices=False,
    )
    assert not processed.blocks[0].attn.v_proj.bias.any()
    with torch.no_grad():
        torch.testing.assert_close(
            processed(tokens).log_softmax(-1), models["gqa_bias_tied"](tokens).log_softmax(-1), rtol=0, atol=1e-5
        )


@pytest.mark.parametrize("case", ["mha", "mqa"])
def test_tensor_parallelism_cuts_the_qk_norms_with_their_heads(models, case):
    """hooked.load(tp=2) splits q_norm / k_norm's weights with the heads; a kv head held by both ranks is counted
    by the first only. The numbers at tp=2 (logits, every hook, generation) are
    tests/infrastructure/test_distributed.py's."""
    from hooked.distributed import Parallel, parallelize

    cfg = models[case].cfg
    q_width, k_width = cfg.n_heads * cfg.d_head // 2, max(cfg.n_kv_heads // 2, 1) * cfg.d_head
    for rank in (0, 1):
        with torch.device("meta"):  # as hooked.load(tp=N) builds it, before reading any weight
            model = hooked.models.Olmo2(dataclasses.replace(cfg))
        plan = parallelize(model, Parallel(2, rank, [0, 1], None, 1, 0, None))
        attn = model.blocks[0].attn
        assert plan["blocks.0.attn.q_norm.weight"][:2] == (0, [(rank * q_width, (rank + 1) * q_width)])
        k_start = rank * k_width if cfg.n_kv_heads >= 2 else 0
        assert plan["blocks.0.attn.k_norm.weight"][:2] == (0, [(k_start, k_start + k_width)])
        assert attn.q_norm.weight.shape == (q_width,) and attn.k_norm.weight.shape == (k_width,)
        assert attn.q_norm.tp_share == 1.0 and attn.k_norm.tp_share == (
            1.0 if cfg.n_kv_heads >= 2 or rank == 0 else 0.0
        )
        # Run on one rank's heads alone, outside its attention, the norm over every head is refused, not wrong.
        with pytest.raises(RuntimeError, match="Olmo2Attention.normed_qk"):
            attn.q_norm.unhooked(torch.ones(1, 3, cfg.n_heads // 2, cfg.d_head))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'.*silu"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            "rope_type 'linear'.*'default'",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"head_dim": 15}, "head_dim 15 is odd"),
        (
            {"num_attention_heads": 5, "num_key_value_heads": 5},
            "hidden_size 64 is not a multiple of num_attention_heads 5",
        ),
    ],
)
def test_unsupported_config_is_refused(tmp_path, dirs, change, message):
    with pytest.raises(ValueError, match=message):
        hooked.load(edited_checkpoint(dirs["mha"], tmp_path / "edited", **change))


def test_config_reads_hub_layout(dirs):
    """Hub configs of the released checkpoints carry rope_theta at the top level; transformers 5 writes
    rope_parameters."""
    written = json.loads((dirs["gqa_bias_tied"] / "config.json").read_text())
    hub = {key: value for key, value in written.items() if key != "rope_parameters"}
    hub.update(rope_theta=5e5, rope_scaling=None)
    assert HookedOlmo2Config.from_hf(hub) == HookedOlmo2Config.from_hf(written)


def test_per_head_and_per_neuron_writes_go_through_the_post_norm_or_are_refused():
    """A head's hook_result is not what an OLMo 2 block adds (ln1 normalises the sum of all heads first): the
    stacks that treat it as an additive write refuse instead of returning pre-norm numbers, unless asked for
    the writes carried through the norm (`through_post_norm=True`, which then sum to what the block added);
    decompose_resid (post-norm, per sublayer) sums to the residual stream; circuits take the layer's attention
    as one node."""
    from hooked import circuits
    from hooked.testing import random_model

    model = random_model("olmo2", seed=2)
    _, cache = model.run_with_cache(
        torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(3))
    )
    message = "normalises its sublayer outputs"
    for call in (
        lambda: cache.stack_head_results(),
        lambda: cache.get_full_resid_decomposition(),
        lambda: cache.stack_neuron_results(1),
        lambda: cache.get_neuron_results(0),
        lambda: model.accumulated_bias(1),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    check_post_norm_decomposition(
        random_model("olmo2", seed=5, attention_bias=True),
        torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(4)),
        ("ln1", "ln2"),
    )
    # each layer's attention is one node (tests/circuits/test_circuits.py checks its edges)
    graph = circuits.graph(model)
    assert (
        "L1.attn" in graph.nodes
        and "L1H0" not in graph.nodes
        and graph.sources[1].hook_name == "blocks.0.hook_attn_out"
    )
    parts = cache.decompose_resid(model.cfg.n_layers)
    torch.testing.assert_close(
        parts.sum(0), cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"], rtol=0, atol=1e-5
    )
