"""GPT-NeoX / Pythia against transformers' GPTNeoXForCausalLM and TransformerLens 3.9.

Tiny random checkpoints are built here (LayerNorm weights and every bias randomised) over the options
the family has: a parallel block with a quarter of each head rotary (Pythia's shape), a sequential block
with half of each head rotary, rope_theta 1e6, tied embeddings and the tanh GELU, and a fully rotary
model with 8 heads, no attention biases and ReLU. hooked runs transformers 5.24's operations in its
order (the fused per-head q|k|v view, the partial RoPE by slicing and concatenation, the float32
softmax, (mlp_out + attn_out) + resid_pre), so float32 logits, every hidden state and the final norm
are bit-identical on both attention paths: measured max abs difference 0.0 in every case.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers  # the reference implementation (the dev extra): a missing one is a failure, not a skip
from safetensors.torch import load_file, save_file

import hooked
from hooked import ablate
from hooked.interventions.metrics import kl_div
from hooked.models.gpt_neox import ACTIVATIONS
from hooked.models.gpt_neox import GPTNeoXConfig as HookedGPTNeoXConfig
from tests.families.parity import (
    REORDERED_ULPS,
    UNEMBED_POINTS,
    bf16_spread,
    build_checkpoint,
    build_checkpoints,
    check_bit_exact,
    check_hook_shapes,
    check_zero_heads_equals_zeroing_o_proj,
    copy_checkpoint,
    golden_hook_names,
    hf_reference,
    left_padded,
    random_tokens,
    tl_model,
    within_ulps_of_magnitude,
)

VOCAB = 96
HF = transformers.GPTNeoXForCausalLM

# name -> transformers GPTNeoXConfig keyword arguments
CASES = {
    # Pythia's shape: parallel residual, rotary_pct 0.25 (4 of 16 dims), exact GELU, biases, untied embed_out
    "pythia": dict(hidden_size=64, num_attention_heads=4, intermediate_size=96, num_hidden_layers=2, rotary_pct=0.25),
    # sequential block (hook_resid_mid), half of each head rotary, theta 1e6, tied, tanh GELU
    "sequential": dict(
        hidden_size=48,
        num_attention_heads=4,
        intermediate_size=64,
        num_hidden_layers=2,
        use_parallel_residual=False,
        tie_word_embeddings=True,
        hidden_act="gelu_new",
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
    ),
    # every dim rotary, 8 heads of 8, no attention biases, ReLU, 3 layers
    "full_rotary": dict(
        hidden_size=64,
        num_attention_heads=8,
        intermediate_size=80,
        num_hidden_layers=3,
        rotary_pct=1.0,
        attention_bias=False,
        hidden_act="relu",
    ),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    configs = {name: transformers.GPTNeoXConfig(vocab_size=VOCAB, **kwargs) for name, kwargs in CASES.items()}
    return build_checkpoints(tmp_path_factory, configs, HF)


@pytest.fixture(scope="module")
def models(dirs):
    return {name: hooked.load(directory) for name, directory in dirs.items()}


@pytest.fixture(scope="module")
def references(dirs):
    return {name: hf_reference(directory, HF, "sdpa") for name, directory in dirs.items()}


def test_configs_read_every_option(models):
    pythia, sequential, full = (models[name].cfg for name in CASES)
    assert (pythia.rotary_dim, pythia.d_head, pythia.use_parallel_residual, pythia.activation) == (4, 16, True, "gelu")
    assert (sequential.rotary_dim, sequential.rope_theta, sequential.tie_word_embeddings) == (6, 1e6, True)
    assert (sequential.use_parallel_residual, sequential.activation, full.rotary_dim, full.attention_bias) == (
        False,
        "gelu_new",
        8,
        False,
    )
    assert isinstance(models["pythia"], hooked.models.GPTNeoX)
    # TransformerLens' names for the same settings
    assert (pythia.parallel_attn_mlp, sequential.parallel_attn_mlp, pythia.rotary_base, sequential.rotary_base) == (
        True,
        False,
        1e4,
        1e6,
    )
    assert (pythia.normalization_type, pythia.positional_embedding_type, full.act_fn, pythia.n_kv_heads) == (
        "LN",
        "rotary",
        "relu",
        4,
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["sdpa", "eager"])
def test_float32_bit_exact(dirs, models, case, path):
    """Logits, resid_pre of every block and the final norm's output: 0.0 (the same operations in the same order)."""
    check_bit_exact(models[case], hf_reference(dirs[case], HF, path), random_tokens(3, 17), eager=path == "eager")


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_every_activation_bit_exact(tmp_path, activation):
    """Each `hidden_act` hooked accepts is transformers' function, bit for bit (a one-layer model)."""
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=40,
        num_hidden_layers=1,
        rotary_pct=0.5,
        hidden_act=activation,
    )
    directory = build_checkpoint(tmp_path, config, HF, seed=5)
    model = hooked.load(directory)
    assert model.cfg.activation == activation
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        reference = hf_reference(directory, HF, "sdpa")(tokens, use_cache=False).logits
        assert torch.equal(model(tokens), reference)  # exact as check_bit_exact (SDPA path)


@pytest.mark.parametrize("case", ["pythia", "sequential"])
def test_bfloat16_bit_identical(dirs, case):
    """bf16 logits equal transformers' (SDPA) bit for bit, where transformers' own eager path is 2e-3 away
    (bf16_spread: the tolerance a bf16 reimplementation could otherwise be held to)."""
    tokens = random_tokens(2, 11)
    reference, spread = bf16_spread(dirs[case], HF, tokens)
    with torch.no_grad():
        logits = hooked.load(dirs[case], dtype=torch.bfloat16)(tokens)
    assert logits.dtype == torch.bfloat16 and spread > 0
    assert torch.equal(logits.float(), reference), ((logits.float() - reference).abs().max().item(), spread)


@pytest.mark.parametrize("case", ["pythia", "sequential"])
def test_left_padded_batch_matches_transformers_and_each_prompt_alone(models, references, case):
    """transformers (SDPA) is given the mask and the positions hooked derives from it (its own forward counts
    padding): equal bit for bit at every real position; each prompt alone to float32 rounding (measured 7e-8:
    SDPA with and without a mask)."""
    model = models[case]
    prompts, tokens, mask = left_padded([9, 4, 6])
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batched = model(tokens, attention_mask=mask)
        reference = references[case](tokens, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
        real = mask.bool()
        assert torch.equal(batched[real], reference[real])  # exact as check_bit_exact: the same batch, mask and path
        for row, prompt in enumerate(prompts):  # another matmul shape alone: float32 rounding
            alone = model(prompt[None])
            within_ulps_of_magnitude(batched[row, -len(prompt) :], alone[0], REORDERED_ULPS, f"prompt {row}")


@pytest.mark.parametrize("case", ["pythia", "sequential"])
@pytest.mark.parametrize("batch,padded", [(1, False), (3, True)])
def test_greedy_equals_transformers_generate(models, references, case, batch, padded):
    model, hf = models[case], references[case]
    tokens = torch.randint(1, VOCAB, (batch, 7), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones(batch, 7, dtype=torch.long)
    if padded:
        for row in range(1, batch):
            mask[row, : row * 2] = 0
    with torch.no_grad():
        reference = hf.generate(
            tokens, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ours = model.generate(tokens, 16, attention_mask=mask, stop_at_eos=False)
    assert torch.equal(ours, reference), (ours, reference)


# ----------------------------------------------------------------------------- TransformerLens 3.9
def tl_config_fields(c) -> dict:
    """TransformerLens' config fields for GPTNeoXForCausalLM (loading_from_pretrained.convert_hf_model_config),
    written out."""
    if not c.attention_bias:  # the converter reads the biases unconditionally
        raise ValueError("tl_neox needs a checkpoint with attention biases")
    d_head = c.hidden_size // c.num_attention_heads
    return dict(
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        d_head=d_head,
        d_mlp=c.intermediate_size,
        d_vocab=c.vocab_size,
        n_ctx=c.max_position_embeddings,
        eps=c.layer_norm_eps,
        act_fn=c.hidden_act,
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=round(c.rope_parameters["partial_rotary_factor"] * d_head),
        rotary_base=c.rope_parameters["rope_theta"],
        rotary_adjacent_pairs=False,
        parallel_attn_mlp=c.use_parallel_residual,
        original_architecture="GPTNeoXForCausalLM",
        default_prepend_bos=False,
    )


def tl_neox(directory):
    """TransformerLens' HookedTransformer on a GPT-NeoX checkpoint's weights: the fields above and its own
    converter (weight_conversions/neox.py), unfolded."""
    return tl_model(directory, HF, "convert_neox_weights", tl_config_fields)


def every_hook_cache(model, tokens, split_inputs: bool = True):
    """A cache of every hook point (TransformerLens' switches for results, mlp_in and, with `split_inputs`, the
    per-head q/k/v inputs turned on)."""
    switches = ["set_use_attn_result", "set_use_hook_mlp_in"] + (["set_use_split_qkv_input"] if split_inputs else [])
    for switch in switches:
        getattr(model, switch)(True)
    try:
        with torch.no_grad():
            return model.run_with_cache(tokens)
    finally:
        for switch in switches:
            getattr(model, switch)(False)


def assert_shared_hooks_equal(ours, theirs, atol: float) -> list[str]:
    shared = [name for name in ours.keys() if name in theirs.cache_dict]
    for name in shared:
        mine, tls = ours[name], theirs[name]
        if name.endswith("hook_attn_scores"):  # masked entries: the dtype's minimum here, -inf there
            causal = torch.ones(mine.shape[-2:], dtype=torch.bool).tril()
            mine, tls = mine[..., causal], tls[..., causal]
        torch.testing.assert_close(mine, tls, rtol=0, atol=atol, msg=name)
    return shared


@pytest.mark.parametrize("case", ["pythia", "sequential"])
def test_every_shared_hook_equals_transformer_lens(dirs, models, case):
    """Same weights, unfolded: every hook point both have agrees to 1e-5 (float32 rounding only, measured
    <= 6e-7: TransformerLens sums resid_pre + attn_out + mlp_out in another order, projects with einsum and
    computes its RoPE angles as pos / freq rather than pos * inv_freq). Masked attention scores are compared
    at causal entries only.

    One difference in what a hook holds: with the split q/k/v inputs on, TransformerLens runs ln1 on each
    head's copy, so its `ln1.hook_scale` / `hook_normalized` gain a head axis and hold the value inputs' (the
    last of three calls); hooked's ln1 hooks fire once on the unsplit stream (hooked.layers.attention_input).
    So the split inputs are compared in a second run, the ln1 hooks in the first."""
    model, tl = models[case], tl_neox(dirs[case])
    tokens = random_tokens(2, 9)
    logits, ours = every_hook_cache(model, tokens, split_inputs=False)
    tl_logits, theirs = every_hook_cache(tl, tokens, split_inputs=False)
    shared = assert_shared_hooks_equal(ours, theirs, atol=1e-5)
    torch.testing.assert_close(logits, tl_logits, rtol=0, atol=1e-5)
    assert {name for name in ours.keys() if name not in theirs.cache_dict} == set()
    # TransformerLens 3.9's unembedding hooks (its input is ln_final's output, its output the logits): not hook
    # points here
    assert {name for name in theirs.cache_dict if name not in ours.keys()} == UNEMBED_POINTS
    mids = {name for name in shared if name.endswith("hook_resid_mid")}
    assert len(mids) == (0 if model.cfg.use_parallel_residual else model.cfg.n_layers)  # none in a parallel block
    assert (
        "blocks.1.attn.hook_rot_q" in shared
        and "blocks.1.hook_mlp_in" in shared
        and "blocks.1.attn.hook_result" in shared
    )
    # the split inputs, and what the heads compute from them
    _, ours = every_hook_cache(model, tokens)
    _, theirs = every_hook_cache(tl, tokens)
    per_head = {name: value for name, value in ours.items() if ".ln1." not in name}
    split_shared = assert_shared_hooks_equal(per_head, theirs, atol=1e-5)
    assert {f"blocks.{i}.hook_{x}_input" for i in range(model.cfg.n_layers) for x in "qkv"} <= set(split_shared)
    assert set(theirs.cache_dict) - set(ours.keys()) == UNEMBED_POINTS


def test_transformer_lens_processing_gives_the_same_weights_and_activations(dirs):
    """`HookedTransformer.from_pretrained` (fold_ln, centring, value biases folded out of the interleaved
    q|k|v bias) against TransformerLens processing the same weights with its own code."""
    ours = hooked.HookedTransformer.from_pretrained(dirs["pythia"])
    theirs = tl_neox(dirs["pythia"])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        theirs.load_and_process_state_dict(
            theirs.state_dict(), fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
        )
    assert ours.cfg.normalization_type == "LNPre"
    for name in (
        "W_Q",
        "W_K",
        "W_V",
        "W_O",
        "b_Q",
        "b_K",
        "b_V",
        "b_O",
        "W_in",
        "b_in",
        "W_out",
        "b_out",
        "W_E",
        "W_U",
        "b_U",
    ):
        torch.testing.assert_close(
            getattr(ours, name).detach(), getattr(theirs, name).detach(), rtol=0, atol=1e-5, msg=name
        )
    assert not ours.b_V.any()
    tokens = random_tokens(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=2e-5)


def test_transformer_lens_config_builds_the_same_function(dirs, models, references):
    """`hooked.HookedTransformer(hooked.HookedTransformerConfig(...))` with TransformerLens' fields for a sequential
    GPT-NeoX builds `GPTNeoX`; on the checkpoint's weights it computes what TransformerLens does (1e-5)."""
    hf = references["sequential"].config
    fields = dict(
        n_layers=2,
        d_model=48,
        d_head=12,
        n_heads=4,
        d_mlp=64,
        d_vocab=VOCAB,
        n_ctx=hf.max_position_embeddings,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=6,
        rotary_base=1e6,
        eps=hf.layer_norm_eps,
    )
    ours = hooked.HookedTransformer(hooked.HookedTransformerConfig(**fields))
    assert type(ours) is hooked.models.GPTNeoX and not ours.cfg.use_parallel_residual
    assert ours.cfg.rotary_dim == 6 and ours.cfg.act_fn == "gelu_new"
    state = models["sequential"].state_dict()
    state["lm_head.weight"] = state["embed_in.weight"].clone()  # an unembedding of its own, as TransformerLens
    ours.load_state_dict(state)
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), tl_neox(dirs["sequential"])(tokens), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="GPTNeoX-shaped.*rotary_dim=5"):
        hooked.HookedTransformerConfig(**{**fields, "rotary_dim": 5})


# ----------------------------------------------------------------------------- hooks
PARALLEL_BLOCK = [  # the hook points of one parallel block (Pythia's), in forward order
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
    "hook_mlp_in",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_in",
    "mlp.hook_pre",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
]
SEQUENTIAL_BLOCK = [*PARALLEL_BLOCK[:16], "hook_resid_mid", *PARALLEL_BLOCK[16:]]  # after hook_attn_out
GOLDEN_HOOK_NAMES = {
    "pythia": golden_hook_names([PARALLEL_BLOCK] * 2),
    "sequential": golden_hook_names([SEQUENTIAL_BLOCK] * 2),
}


@pytest.mark.parametrize("case", ["pythia", "sequential"])
def test_golden_hook_names_and_shapes(models, case):
    model = models[case]
    assert model.hook_names == GOLDEN_HOOK_NAMES[case]
    expected = check_hook_shapes(model)
    assert expected["blocks.0.attn.hook_q"] == (2, 7, 4, model.cfg.d_head)
    assert expected["blocks.0.hook_q_input"] == (2, 7, 4, model.cfg.d_model)


def test_hooks_hold_what_the_docs_say(models):
    """q/k/v are head h's three slices of query_key_value; RoPE turns only the first rotary_dim dims; the
    parallel block's mlp_in is resid_pre and its resid_post the sum of the three."""
    model = models["pythia"]
    _, cache = every_hook_cache(model, random_tokens(2, 9))
    block = model.blocks[1]
    ln1 = block.ln1(cache["resid_pre", 1])
    qkv = block.attn.query_key_value(ln1).view(2, 9, 4, 3, model.cfg.d_head)
    for index, name in enumerate(("q", "k", "v")):
        torch.testing.assert_close(cache[name, 1], qkv[..., index, :], rtol=0, atol=1e-6, msg=name)
    rotary = model.cfg.rotary_dim
    assert torch.equal(cache["rot_q", 1][..., rotary:], cache["q", 1][..., rotary:])  # passed through: a copy
    assert not torch.allclose(cache["rot_q", 1][:, 1:, :, :rotary], cache["q", 1][:, 1:, :, :rotary])
    assert torch.equal(cache["rot_k", 1][:, 0], cache["k", 1][:, 0])  # position 0 is not turned (cos 1, sin 0)
    # Exact: the same tensor; the block's own sum in its order, (mlp_out + attn_out) + resid_pre; the same GELU
    assert torch.equal(cache["blocks.1.hook_mlp_in"], cache["resid_pre", 1])
    total = cache["mlp_out", 1] + cache["attn_out", 1] + cache["resid_pre", 1]
    assert torch.equal(cache["resid_post", 1], total)
    torch.testing.assert_close(cache["post", 1], torch.nn.functional.gelu(cache["pre", 1]), rtol=0, atol=0)
    torch.testing.assert_close(
        cache["result", 1].sum(2) + block.attn.dense.bias, cache["attn_out", 1], rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("case", ["pythia", "sequential"])
@pytest.mark.parametrize("mode", ["no_grad", "grad"])
def test_the_forward_never_edits_a_cached_activation_afterwards(models, case, mode):
    """`edits_hooked_tensors = False` audited: every point a cache keeps by reference, read after the forward,
    equals a copy taken when its hook fired; and q/k/v, views of the fused projection's output, are kept as
    compact copies (the cache holds exactly the bytes of its distinct tensors)."""
    model = models[case]
    assert not model.edits_hooked_tensors
    tokens = random_tokens(2, 7)
    store = {}

    def save(activation, hook):
        store[hook.name] = activation.detach().clone()

    context = torch.no_grad if mode == "no_grad" else torch.enable_grad
    with context():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)
        model.run_with_hooks(tokens, fwd_hooks=[(lambda name: True, save)])
    assert list(cache) == list(store)
    for name in cache:
        assert torch.equal(cache[name], store[name]), f"{name} changed after its hook fired"  # one forward, twice
    distinct = {tensor.untyped_storage().data_ptr(): tensor for tensor in cache.values()}
    assert cache.nbytes() == sum(tensor.numel() * tensor.element_size() for tensor in distinct.values())


def test_weight_views_reproduce_the_activations(models):
    model = models["sequential"]
    _, cache = model.run_with_cache(random_tokens(2, 7))
    block = model.blocks[1]
    with torch.no_grad():
        ln1 = block.ln1(cache["resid_pre", 1])
        computed = {
            "q": torch.einsum("bpm,hmd->bphd", ln1, model.W_Q[1]) + model.b_Q[1],
            "k": torch.einsum("bpm,hmd->bphd", ln1, model.W_K[1]) + model.b_K[1],
            "v": torch.einsum("bpm,hmd->bphd", ln1, model.W_V[1]) + model.b_V[1],
            "attn_out": torch.einsum("bphd,hdm->bpm", cache["z", 1], model.W_O[1]) + model.b_O[1],
            "pre": block.ln2(cache["resid_mid", 1]) @ model.W_in[1] + model.b_in[1],
            "mlp_out": cache["post", 1] @ model.W_out[1] + model.b_out[1],
        }
    for name, value in computed.items():
        torch.testing.assert_close(value, cache[name, 1], rtol=0, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------- features on the family
def test_zeroing_heads_at_z_equals_zeroing_their_dense_columns(models):
    check_zero_heads_equals_zeroing_o_proj(models["pythia"], heads=[0, 2], output_projection="dense", atol=0)


@pytest.mark.parametrize("case", ["pythia", "sequential"])
def test_sweep_equals_each_variant_alone(models, case):
    """Two head ablations and an MLP-neuron ablation in one sweep, each against its own run_with_hooks."""
    model = models[case]
    tokens = random_tokens(3, 8)
    variants = {
        "L0H1": ablate.hooks(model, "L0H1"),
        "L1H3": ablate.hooks(model, "L1H3"),
        "L1.N5": ablate.hooks(model, "L1.N5"),
    }
    metric = kl_div()
    result = hooked.sweep(model, tokens, variants, metric, progress=False)
    with torch.no_grad():
        base = model(tokens)
        for name, fwd_hooks in variants.items():
            alone = metric(model.run_with_hooks(tokens, fwd_hooks=fwd_hooks), base_logits=base)
            torch.testing.assert_close(result[name], alone, rtol=1e-5, atol=2e-6, msg=name)
            assert alone.abs().max() > 0, name


# ----------------------------------------------------------------------------- loading and bad input
def edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    for key in [key for key, value in changes.items() if value is None]:
        del config[key]
    (directory / "config.json").write_text(json.dumps(config))


def test_hub_layout_config_and_legacy_tensors_load_the_same_model(tmp_path, dirs, models):
    """A Pythia hub config (rotary_pct, rotary_emb_base, no rope_parameters) and older files' RoPE and mask
    buffers: the same model."""
    directory = copy_checkpoint(dirs["pythia"], tmp_path / "hub")
    edit_config(directory, rope_parameters=None, rotary_pct=0.25, rotary_emb_base=10000, torch_dtype="float32")
    tensors = load_file(directory / "model.safetensors")
    tensors["gpt_neox.layers.0.attention.bias"] = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    tensors["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)
    tensors["gpt_neox.layers.0.attention.rotary_emb.inv_freq"] = torch.ones(2)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    loaded = hooked.load(directory)
    assert loaded.cfg == models["pythia"].cfg
    tokens = random_tokens(2, 6)
    with torch.no_grad():
        assert torch.equal(loaded(tokens), models["pythia"](tokens))  # the same weights through the same forward


def test_unknown_architecture_names_the_families(tmp_path, dirs):
    directory = copy_checkpoint(dirs["pythia"], tmp_path / "unknown")
    edit_config(directory, architectures=["GPTNeoZForCausalLM"], model_type="gpt_neoz")
    with pytest.raises(hooked.CheckpointError, match="GPTNeoZForCausalLM.*supported.*GPTNeoXForCausalLM"):
        hooked.load(directory)


def test_untied_checkpoint_needs_embed_out(tmp_path, dirs):
    directory = copy_checkpoint(dirs["pythia"], tmp_path / "no_head")
    tensors = load_file(directory / "model.safetensors")
    del tensors["embed_out.weight"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hooked.CheckpointError, match="missing tensors.*lm_head.weight"):
        hooked.load(directory)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {
                "rope_parameters": {
                    "rope_type": "linear",
                    "factor": 2.0,
                    "rope_theta": 1e4,
                    "partial_rotary_factor": 0.25,
                }
            },
            "rope_type 'linear'",
        ),
        ({"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ({"hidden_act": "gelu_10"}, "hidden_act 'gelu_10'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.2}}, "rotary_pct"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.5}}, "rotary_pct"),
        ({"head_dim": 8}, "head_dim 8"),
        ({"num_attention_heads": 5}, "hidden_size 64 is not divisible by num_attention_heads 5"),
    ],
)
def test_unsupported_config_is_refused_naming_the_field(tmp_path, dirs, change, message):
    directory = copy_checkpoint(dirs["pythia"], tmp_path / "unsupported")
    edit_config(directory, **change)
    with pytest.raises(ValueError, match=message):
        hooked.load(directory)


@pytest.mark.unchecked
def test_config_dataclass_refuses_inconsistent_sizes():
    with pytest.raises(ValueError, match="rotary_dim 3"):
        HookedGPTNeoXConfig(n_layers=1, d_model=32, n_heads=4, d_mlp=16, d_vocab=8, rotary_dim=3)
    with pytest.raises(ValueError, match="d_model .* not divisible by n_heads"):
        HookedGPTNeoXConfig(n_layers=1, d_model=30, n_heads=4, d_mlp=16, d_vocab=8, rotary_dim=2)
    with pytest.raises(ValueError, match="hidden_act 'tanh'"):
        HookedGPTNeoXConfig(n_layers=1, d_model=32, n_heads=4, d_mlp=16, d_vocab=8, rotary_dim=2, activation="tanh")


# ----------------------------------------------------------------------------- the residual stream an MLP reads
def test_a_parallel_blocks_mlp_input_decomposes_into_what_came_before_the_block(models):
    """In a parallel block the MLP reads resid_pre (ln2 of it), not resid_pre + attn_out: the decompositions
    `mlp_input=True` leave the block's own attention out (TransformerLens 3.9 puts it in; docs/transformer-lens.md)."""
    model = models["pythia"]
    model.set_use_hook_mlp_in(True)
    try:
        _, cache = model.run_with_cache(random_tokens(2, 7))
    finally:
        model.set_use_hook_mlp_in(False)
    layer = 1
    read = cache[f"blocks.{layer}.hook_mlp_in"]
    torch.testing.assert_close(read, cache[f"blocks.{layer}.hook_resid_pre"], rtol=0, atol=0)  # the same tensor
    parts, labels = cache.decompose_resid(layer, mlp_input=True, return_labels=True)
    assert f"{layer}_attn_out" not in labels
    torch.testing.assert_close(parts.sum(0), read, rtol=0, atol=1e-5)
    accumulated, labels = cache.accumulated_resid(layer, mlp_input=True, return_labels=True)
    assert labels[-1] == f"{layer}_pre"
    full, labels = cache.get_full_resid_decomposition(layer, mlp_input=True, expand_neurons=True, return_labels=True)
    assert not any(label.startswith(f"L{layer}H") for label in labels)
    torch.testing.assert_close(full.sum(0), read, rtol=0, atol=1e-4)
    # The bias the MLP reads: the biases written before the block, none of the block's own attention (exact: the
    # same biases summed in the same order).
    torch.testing.assert_close(
        model.accumulated_bias(layer, mlp_input=True), model.accumulated_bias(layer), rtol=0, atol=0
    )


def test_transformer_lens_parallel_config_builds_a_parallel_block():
    fields = dict(
        n_layers=2,
        d_model=32,
        d_head=8,
        d_mlp=64,
        d_vocab=VOCAB,
        n_ctx=32,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=2,
    )
    model = hooked.HookedTransformer(hooked.HookedTransformerConfig(**fields, parallel_attn_mlp=True))
    assert model.cfg.parallel_attn_mlp and "blocks.0.hook_resid_mid" not in model.hook_dict
    with pytest.raises(ValueError, match="parallel_attn_mlp=True"):
        hooked.HookedTransformerConfig(
            **{**fields, "positional_embedding_type": "standard", "rotary_dim": None}, parallel_attn_mlp=True
        )
