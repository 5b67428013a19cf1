"""Weight processing (`hooked.processing`) against TransformerLens 3.9's on the same weights.

GPT-2: a random 2-layer checkpoint of GPT-2 small's widths (d_model 768, 12 heads, d_mlp 3072). For each
set of flags, TransformerLens' own `load_and_process_state_dict` processes its model of the checkpoint
(tests/transformer_lens/tl_reference.py) and every hook point, the logits and every cache helper must agree to float32
rounding. Qwen3 (RMSNorm) likewise, against TransformerLens' Qwen3. Qwen3-MoE is no TransformerLens
`HookedTransformer` architecture: there the processed model's hooks must equal the unprocessed model's
(folding an RMSNorm weight changes no activation) and its log-probs too. Memory: fresh processes load a
checkpoint with and without processing and compare their peak resident memory.

Parameters compare exactly (torch.equal) where no step touched them, or where the same processing ran the same
operations on the same weights twice (a method and a loader).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
import warnings

import pytest
import torch
import transformers

import hooked
from hooked.cache import Slice
from hooked.processing import FLAGS, changes_activations, process_weights
from hooked.testing import ARCHITECTURES, build_gpt2_checkpoint, random_model, randomize_norms
from tests.families.parity import TRANSFORMER_LENS_ULPS
from tests.transformer_lens.tl_reference import tl_gpt2, tl_qwen3

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformer_lens import HookedTransformer as TLHookedTransformer

# Small matrices: a second thread only waits (refactoring's batched SVDs ran 10x slower on two busy cores).
pytestmark = pytest.mark.usefixtures("one_thread")
# TransformerLens processes and runs the weights with other operations in another order: float32 rounding, which
# grows with the magnitudes (TRANSFORMER_LENS_ULPS of the largest; measured at most 19 ulps here over ATen's default,
# AVX2 and AVX-512 kernels and MKL_CBWR=COMPATIBLE, where 1e-5 broke on a projection of magnitude 6). ATOL is the floor
# for tensors near zero made of larger values (a centred mean, 0 in TransformerLens, 2e-6 here).
ATOL = 1e-5
TL_DEFAULTS = dict(
    fold_ln=True,
    center_writing_weights=True,
    center_unembed=True,
    fold_value_biases=True,
    refactor_factored_attn_matrices=False,
)
NONE = dict.fromkeys(FLAGS, False)
FLAG_SETS = {  # each step alone, TransformerLens' defaults, and those with refactoring
    "defaults": TL_DEFAULTS,
    **{flag: dict(NONE, **{flag: True}) for flag in FLAGS},
    "defaults+refactor": dict(TL_DEFAULTS, refactor_factored_attn_matrices=True),
}


def close(ours, theirs, atol=ATOL, msg=None):
    """Within `atol` or TRANSFORMER_LENS_ULPS float32 ulps of the largest magnitude in `theirs`, the larger."""
    assert ours.shape == theirs.shape, f"{msg}: {tuple(ours.shape)} != {tuple(theirs.shape)}"
    ulps = TRANSFORMER_LENS_ULPS * torch.finfo(torch.float32).eps * theirs.detach().abs().max().item()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=max(atol, ulps), msg=msg)


def tl_processed(tl, flags: dict):
    """TransformerLens' model processed by its own code: what its `from_pretrained(**flags)` loads."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        tl.load_and_process_state_dict(tl.state_dict(), **flags)
    return tl.eval()


def assert_hooks_match(ours, theirs, shapes=None, loose=(), loose_atol=None):
    """Every hook both caches hold, equal (masked attention scores compared at causal entries only: the
    dtype's minimum here, -inf there). `shapes` maps a name to the shape TransformerLens flattens it to."""
    shared = [name for name in ours.keys() if name in theirs.cache_dict]
    assert len(shared) > 20
    for name in shared:
        mine, tls = ours[name], theirs[name]
        if name.endswith("hook_attn_scores"):
            causal = torch.ones(mine.shape[-2:], dtype=torch.bool).tril()
            mine, tls = mine[..., causal], tls[..., causal]
        if mine.shape != tls.shape:  # TransformerLens' per-head norms run on [batch*pos*heads d_head]
            tls = tls.reshape(mine.shape)
        close(mine, tls, loose_atol if any(part in name for part in loose) else ATOL, msg=name)
    return shared


@pytest.fixture(scope="module")
def gpt2_small_dir(tmp_path_factory):
    return build_gpt2_checkpoint(tmp_path_factory.mktemp("gpt2-small-widths"), n_layer=2, n_embd=768, n_head=12)


@pytest.fixture(scope="module")
def unprocessed(gpt2_small_dir):
    return hooked.load(gpt2_small_dir)


@pytest.fixture(scope="module")
def tokens():
    """A BOS, then random ids (none the pad id 0, which would read as left padding)."""
    ids = torch.randint(1, 320, (3, 12), generator=torch.Generator().manual_seed(1))
    return torch.cat([torch.zeros(3, 1, dtype=torch.long), ids], dim=1)


@pytest.fixture(scope="module")
def defaults(gpt2_small_dir, tokens):
    """hooked's and TransformerLens' `from_pretrained` defaults on the same checkpoint, with their caches."""
    ours = hooked.HookedTransformer.from_pretrained(gpt2_small_dir)
    theirs = tl_processed(tl_gpt2(gpt2_small_dir), TL_DEFAULTS)
    with torch.no_grad():
        our_logits, our_cache = ours.run_with_cache(tokens)
        tl_logits, tl_cache = theirs.run_with_cache(tokens)
    return ours, theirs, our_logits, our_cache, tl_logits, tl_cache


# ----------------------------------------------------------------------------- defaults and records
def test_from_pretrained_takes_transformer_lens_defaults():
    ours = inspect.signature(hooked.HookedTransformer.from_pretrained).parameters
    theirs = inspect.signature(TLHookedTransformer.from_pretrained).parameters
    for flag in FLAGS:
        assert ours[flag].default == theirs[flag].default == TL_DEFAULTS[flag], flag
    assert all(inspect.signature(hooked.load).parameters[flag].default is False for flag in FLAGS)


def test_load_and_no_processing_keep_the_checkpoint_weights(gpt2_dir, gpt2):
    assert gpt2.processing == NONE and gpt2.cfg.normalization_type == "LN" and gpt2.lm_head is None
    model = hooked.HookedTransformer.from_pretrained_no_processing(gpt2_dir)
    assert model.processing == NONE
    for name, parameter in gpt2.named_parameters():
        assert torch.equal(model.get_parameter(name), parameter)


def test_processing_is_recorded(defaults, gpt2_dir):
    ours, theirs, *_ = defaults
    assert ours.processing == TL_DEFAULTS
    assert ours.cfg.normalization_type == theirs.cfg.normalization_type == "LNPre"
    assert "normalization_type" not in vars(
        dataclasses.replace(ours.cfg)
    )  # a copied config builds an unprocessed model
    from hooked.interventions.sweeps import sweep_provenance

    provenance = sweep_provenance(ours, [], None, None, torch.zeros(1, 2, dtype=torch.long))
    assert provenance["processing"] == TL_DEFAULTS and provenance["config"]["normalization_type"] == "LNPre"
    assert hooked.load(gpt2_dir).processing == NONE  # hooked.load keeps its unprocessed default


# ----------------------------------------------------------------------------- GPT-2 against TransformerLens
@pytest.mark.parametrize("name", list(FLAG_SETS))
def test_every_hook_matches_transformer_lens(gpt2_small_dir, unprocessed, tokens, name):
    flags = FLAG_SETS[name]
    ours = hooked.load(gpt2_small_dir, **flags)
    theirs = tl_processed(tl_gpt2(gpt2_small_dir), flags)
    with torch.no_grad():
        logits, cache = ours.run_with_cache(tokens)
        tl_logits, tl_cache = theirs.run_with_cache(tokens)
        base = unprocessed(tokens)
    # Refactoring re-factors W_Q W_K^T by an SVD: q and k are the query and key in the singular basis, and
    # a singular vector moves with the rounding of its input by up to ~1 / (gap between singular values),
    # here ~1e-3 of q's scale. Their products (scores, pattern) and every other activation agree to 1e-5.
    loose = ("hook_q", "hook_k") if flags["refactor_factored_attn_matrices"] else ()
    assert_hooks_match(cache, tl_cache, loose=loose, loose_atol=2e-3)
    close(logits, tl_logits, msg="logits")
    close(logits.log_softmax(-1), base.log_softmax(-1), msg="log-probs against the unprocessed model")
    assert ours.cfg.normalization_type == ("LNPre" if flags["fold_ln"] else "LN") == theirs.cfg.normalization_type
    for tl_name, ours_weight in (("W_E", ours.W_E), ("W_U", ours.W_U), ("b_U", ours.b_U), ("W_pos", ours.W_pos)):
        close(ours_weight.detach(), getattr(theirs, tl_name).detach(), msg=tl_name)


def test_logits_shift_by_one_constant_per_position(defaults, unprocessed, tokens):
    """`center_unembed` subtracts W_U's (and b_U's) mean over the vocabulary: every logit of a position
    moves by the same amount, log-probs do not move."""
    _, _, logits, _, tl_logits, _ = defaults
    with torch.no_grad():
        base = unprocessed(tokens)
    shift = logits - base
    assert shift.abs().max() > 1e-2  # the centring did something
    close(shift - shift.mean(-1, keepdim=True), torch.zeros_like(shift), msg="shift differs within a position")
    close(logits.mean(-1), torch.zeros_like(base[..., 0]), msg="processed logits have mean 0 over the vocabulary")
    close(logits.log_softmax(-1), tl_logits.log_softmax(-1))


def test_weights_are_transformer_lens_processed_weights(defaults):
    ours, theirs, *_ = defaults
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "W_out", "b_in", "b_out"):
        close(getattr(ours, name).detach(), getattr(theirs, name).detach(), msg=name)
    assert ours.lm_head is not None and not torch.equal(ours.W_E, ours.W_U.T)  # untied: centred differently
    close(ours.W_E.mean(-1), torch.zeros(ours.cfg.d_vocab))
    close(ours.W_U.mean(-1), torch.zeros(ours.cfg.d_model))
    for block in ours.blocks:
        for norm in (block.ln1, block.ln2):
            assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and not norm.bias.any()
    for token in (5, torch.tensor([[3, 9]])):
        close(ours.tokens_to_residual_directions(token).detach(), theirs.tokens_to_residual_directions(token).detach())


def test_cache_helpers_match_transformer_lens(defaults):
    ours, theirs, _, cache, _, tl_cache = defaults
    direction = torch.randn(768, generator=torch.Generator().manual_seed(2))
    answers, wrong = torch.tensor([3, 7, 11]), torch.tensor([4, 8, 12])
    calls = [
        ("accumulated_resid", dict(incl_mid=True)),
        ("accumulated_resid", dict(apply_ln=True)),
        ("accumulated_resid", dict(layer=1, mlp_input=True, apply_ln=True)),
        ("decompose_resid", dict()),
        ("decompose_resid", dict(apply_ln=True)),
        ("decompose_resid", dict(layer=1, mlp_input=True, apply_ln=True, mode="attn")),
        ("stack_head_results", dict()),
        ("stack_head_results", dict(layer=-1, incl_remainder=True, apply_ln=True)),
        ("stack_neuron_results", dict(layer=1, apply_ln=True, neuron_slice=(0, 40))),
        # Expanded into neurons, a full decomposition is [6000 batch pos 768]: one position suffices.
        ("get_full_resid_decomposition", dict(expand_neurons=False)),
        ("get_full_resid_decomposition", dict(apply_ln=True, pos_slice=(-1, None))),
        ("get_full_resid_decomposition", dict(project_output_onto=direction, apply_ln=True, pos_slice=(-2, None))),
    ]
    for method, kwargs in calls:
        a, labels = getattr(cache, method)(return_labels=True, **kwargs)
        b, tl_labels = getattr(tl_cache, method)(return_labels=True, **kwargs)
        assert labels == tl_labels, method
        close(a, b, msg=f"{method}({kwargs})")
    stack = cache.decompose_resid()
    for layer, mlp_input in ((None, False), (1, True), (0, False)):
        close(cache.apply_ln_to_stack(stack, layer, mlp_input), tl_cache.apply_ln_to_stack(stack, layer, mlp_input))
    close(cache.apply_ln_to_stack(stack, recompute_ln=True), tl_cache.apply_ln_to_stack(stack, recompute_ln=True))
    final = cache.decompose_resid(pos_slice=-1, apply_ln=True)
    tl_final = tl_cache.decompose_resid(pos_slice=-1, apply_ln=True)
    close(cache.logit_attrs(final, answers, pos_slice=-1), tl_cache.logit_attrs(tl_final, answers, pos_slice=-1))
    close(
        cache.logit_attrs(cache.decompose_resid(pos_slice=-1), answers, incorrect_tokens=wrong, pos_slice=-1),
        tl_cache.logit_attrs(tl_cache.decompose_resid(pos_slice=-1), answers, incorrect_tokens=wrong, pos_slice=-1),
    )
    for name, layer, sublayer in (("scale", -1, "ln2"), ("normalized", 1, "ln1"), ("pattern", None, None)):
        close(cache.stack_activation(name, layer, sublayer), tl_cache.stack_activation(name, layer, sublayer))
    for layer in range(ours.cfg.n_layers + 1):
        close(ours.accumulated_bias(layer), theirs.accumulated_bias(layer).detach())


def test_attributions_add_up_to_the_logits(defaults, tokens):
    """A full decomposition, read out, is the logit less what no component writes (`logit_bias_terms`:
    after processing, b_U, which holds the final LayerNorm's folded bias)."""
    ours, _, logits, cache, _, _ = defaults
    answers = tokens[:, 5]
    attrs = cache.logit_attrs(cache.get_full_resid_decomposition(pos_slice=-1), answers, pos_slice=-1)
    expected = logits[torch.arange(3), -1, answers] - ours.logit_bias_terms(answers)
    close(attrs.sum(0), expected, atol=1e-4)


def test_padded_batch_matches_transformer_lens_at_real_positions(defaults):
    ours, theirs, *_ = defaults
    prompts = ["The cat sat on the mat and", "a dog", "hello there, world of tiny models"]
    tokens = ours.to_tokens(prompts)
    assert torch.equal(tokens, theirs.to_tokens(prompts)) and (tokens[1] == 0).sum() > 1
    with torch.no_grad():
        logits, cache = ours.run_with_cache(tokens)
        tl_logits, tl_cache = theirs.run_with_cache(tokens)
    close(logits[:, -1], tl_logits[:, -1])
    close(
        cache.decompose_resid(apply_ln=True, pos_slice=Slice(-1)), tl_cache.decompose_resid(apply_ln=True, pos_slice=-1)
    )
    close(
        cache.logit_attrs(cache.get_full_resid_decomposition(pos_slice=-1), tokens[:, -2], pos_slice=-1),
        tl_cache.logit_attrs(tl_cache.get_full_resid_decomposition(pos_slice=-1), tokens[:, -2], pos_slice=-1),
    )


def test_logits_of_some_columns_carry_the_unembedding_bias(defaults, tokens):
    """What sweeps and generation compute (only the logits a metric reads) includes b_U's entries."""
    ours, _, logits, cache, _, _ = defaults
    columns = torch.tensor([7, 2, 300])
    with torch.no_grad():
        some = ours.logits_from_resid(cache["resid_post", -1], columns)
    assert ours.unembed_bias is not None and ours.unembed_bias.abs().max() > 1e-3
    close(some, logits[..., columns])


def test_process_weights_in_place_equals_loading_processed(gpt2_dir, tokens):
    model = hooked.load(gpt2_dir)
    model.process_weights_()  # TransformerLens' method and defaults
    loaded = hooked.HookedTransformer.from_pretrained(gpt2_dir)
    assert model.processing == loaded.processing == TL_DEFAULTS
    assert dict(model.named_parameters()).keys() == dict(loaded.named_parameters()).keys()
    for name, parameter in loaded.named_parameters():
        assert torch.equal(model.get_parameter(name), parameter), name


# ----------------------------------------------------------------------------- log-probs, every architecture
def padded(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and their mask: rows of 9, 4 and 6 real tokens."""
    ids = torch.randint(1, vocab, (3, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.arange(9)[None] >= torch.tensor([[0], [5], [3]])
    return ids, mask


@pytest.mark.parametrize(
    "architecture, sizes",
    [
        ("gpt2", {}),
        ("qwen3", {}),
        ("qwen3", dict(attention_bias=True, tie_word_embeddings=True)),
        ("qwen3_moe", dict(n_layers=3, decoder_sparse_step=2)),
    ],
)
def test_processing_keeps_log_probs_on_a_padded_batch(architecture, sizes):
    model, reference = random_model(architecture, seed=4, **sizes), random_model(architecture, seed=4, **sizes)
    process_weights(model)
    ids, mask = padded(model.cfg.d_vocab)
    with torch.no_grad():
        ours, base = model(ids, attention_mask=mask), reference(ids, attention_mask=mask)
    close(ours.log_softmax(-1)[mask], base.log_softmax(-1)[mask])
    assert (ours - base)[mask].abs().max() > 1e-3  # centred: the logits themselves moved


@pytest.mark.parametrize("architecture", ["gpt2", "qwen3"])
def test_a_float64_model_is_processed_in_float64(architecture):
    """`.double()` then processing: every step in float64, so the log-probs keep float64's precision."""
    model = random_model(architecture, seed=5).double()
    reference = random_model(architecture, seed=5).double()
    process_weights(model)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    ids, mask = padded(model.cfg.d_vocab)
    with torch.no_grad():
        ours, base = model(ids, attention_mask=mask), reference(ids, attention_mask=mask)
    torch.testing.assert_close(ours.log_softmax(-1)[mask], base.log_softmax(-1)[mask], rtol=0, atol=1e-10)


@pytest.mark.parametrize("architecture", [a for a in ARCHITECTURES if a != "olmo2"])  # OLMo 2 refuses fold_ln
def test_fold_ln_changes_no_activation_outside_its_declared_points(architecture):
    """hooked.processing.CHANGED_POINTS["fold_ln"], which the splice's processing check reads, against both models
    run: every hook point it does not name (the residual stream, ln*.hook_normalized, q/k/v, every output) holds
    what the unprocessed model's holds, to float32 rounding of the refolded products."""
    model, reference = (random_model(architecture, seed=6, n_layers=2) for _ in range(2))
    randomize_norms(model, seed=1)
    randomize_norms(reference, seed=1)
    process_weights(model, fold_ln=True, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(6))
    every = lambda name: True  # noqa: E731  (the points cached only on request, mlp.hook_in among them, too)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=every)
        _, base_cache = reference.run_with_cache(tokens, names_filter=every)
    kept = [name for name in base_cache.keys() if not changes_activations("fold_ln", name)]
    assert "blocks.0.hook_resid_post" in kept and len(kept) > 20
    for name in kept:
        scale = 1 + float(base_cache[name].float().abs().max())
        close(cache[name].float() / scale, base_cache[name].float() / scale, msg=name)
    changed = [name for name in base_cache.keys() if changes_activations("fold_ln", name)]
    moved = [name for name in changed if (cache[name] - base_cache[name]).abs().max() > 1e-3]
    assert moved  # and the point it names does move: the gain is in it


def test_qwen3_moe_activations_are_unchanged_by_rms_processing():
    """Folding an RMSNorm's weight into its readers changes no activation (the normalised input is taken
    before the weight), and Qwen3 has no writing weights to centre: every hook equals the unprocessed
    model's, the router's logits included, and the logits move by a constant per position."""
    model, reference = random_model("qwen3_moe", seed=5, n_layers=2), random_model("qwen3_moe", seed=5, n_layers=2)
    process_weights(model)
    assert model.processing == dict(TL_DEFAULTS, center_writing_weights=False)
    assert model.cfg.normalization_type == "RMSPre"
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        base, base_cache = reference.run_with_cache(tokens)
    for name in cache.keys():
        close(cache[name].float(), base_cache[name].float(), msg=name)
    shift = logits - base
    close(shift - shift.mean(-1, keepdim=True), torch.zeros_like(shift))
    sparse = model.blocks[0].mlp
    close(
        sparse.gate.weight, reference.blocks[0].mlp.gate.weight * reference.blocks[0].ln2.weight
    )  # the router, folded


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
    directories = {}
    for name, kwargs in {
        "mha_untied": dict(num_key_value_heads=4),
        "gqa_tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
    }.items():
        directory = tmp_path_factory.mktemp(f"qwen3-{name}")
        torch.manual_seed(0)
        config = transformers.Qwen3Config(
            vocab_size=64,
            hidden_size=32,
            num_attention_heads=4,
            head_dim=8,
            intermediate_size=48,
            num_hidden_layers=2,
            **kwargs,
        )
        hf = transformers.Qwen3ForCausalLM(config).eval()
        randomize_norms(hf)
        hf.save_pretrained(directory)
        directories[name] = (directory, hf)
    return directories


@pytest.mark.parametrize("name", ["mha_untied", "gqa_tied"])
def test_qwen3_matches_transformer_lens(qwen3_dirs, name):
    """TransformerLens 3.9 folds RMSNorm weights only (RMSPre: no centring, no bias), skips centring the
    writing weights and centres the unembedding; hooked does the same."""
    directory, hf = qwen3_dirs[name]
    ours = hooked.HookedTransformer.from_pretrained(directory)
    theirs = tl_processed(tl_qwen3(directory, hf), TL_DEFAULTS)
    assert ours.cfg.normalization_type == theirs.cfg.normalization_type == "RMSPre"
    assert ours.processing["center_writing_weights"] is False
    tokens = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = ours.run_with_cache(tokens)
        tl_logits, tl_cache = theirs.run_with_cache(tokens)
    shared = assert_hooks_match(cache, tl_cache)
    assert "blocks.1.attn.q_norm.hook_normalized" in shared
    close(logits, tl_logits)
    close(ours.W_U.detach(), theirs.W_U.detach())
    assert torch.equal(ours.W_E, hooked.load(directory).W_E)  # RMSNorm: the embedding is not centred


def test_value_biases_fold_into_the_output_bias():
    """Qwen3 with attention biases and grouped key/value heads: b_O gains sum_h b_V[kv(h)] @ W_O[h], b_V is 0."""
    model, reference = (random_model("qwen3", seed=7, attention_bias=True) for _ in range(2))
    process_weights(model, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=True)
    for block, before in zip(model.blocks, reference.blocks, strict=True):
        assert not block.attn.v_proj.bias.any()
        expected = before.attn.o_proj.bias + torch.einsum("hd,hdm->m", before.attn.b_V, before.attn.W_O)
        close(block.attn.o_proj.bias, expected)
    tokens = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        close(model(tokens), reference(tokens))


def test_steps_that_do_not_apply_change_nothing():
    """As TransformerLens: no value biases (Qwen3 without attention_bias) leaves nothing to fold; an RMSNorm
    model's writing weights are not centred. Both are recorded."""
    model, reference = (random_model("qwen3", seed=9, tie_word_embeddings=True) for _ in range(2))
    process_weights(model, fold_ln=False, center_writing_weights=True, center_unembed=False, fold_value_biases=True)
    assert model.processing == dict(NONE, fold_value_biases=True)
    assert model.lm_head is None  # nothing touched W_E or W_U: still tied
    for name, parameter in reference.named_parameters():
        assert torch.equal(model.get_parameter(name), parameter), name


def test_reduced_precision_is_processed_in_float32(gpt2_dir, tokens):
    model = hooked.HookedTransformer.from_pretrained(gpt2_dir, dtype=torch.bfloat16)
    reference = hooked.HookedTransformer.from_pretrained(gpt2_dir)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for name, parameter in reference.named_parameters():  # each step in float32, rounded to bfloat16
        close(model.get_parameter(name).float(), parameter.to(torch.bfloat16).float(), atol=0.02, msg=name)


def test_reduced_precision_blocks_give_the_whole_tensor_result(gpt2_dir, monkeypatch):
    """A bfloat16 weight is processed in float32 a block of rows at a time (no float32 copy of a whole
    embedding): blocks of a few rows give what one block gives, to bfloat16 rounding."""
    whole = hooked.HookedTransformer.from_pretrained(gpt2_dir, dtype=torch.bfloat16)
    monkeypatch.setattr(hooked.processing, "BLOCK_ELEMENTS", 200)  # 3 rows of a 64-wide weight, 1 of c_fc
    blocked = hooked.HookedTransformer.from_pretrained(gpt2_dir, dtype=torch.bfloat16)
    for name, parameter in whole.named_parameters():
        close(blocked.get_parameter(name).float(), parameter.float(), atol=4e-3, msg=name)


# ----------------------------------------------------------------------------- refused
def test_refactoring_a_rotary_model_is_refused(qwen3_dirs):
    directory, _ = qwen3_dirs["mha_untied"]
    with pytest.raises(ValueError, match="rotary model's QK circuit depends on"):
        hooked.HookedTransformer.from_pretrained(directory, refactor_factored_attn_matrices=True)


@pytest.mark.unchecked
def test_bad_processing_requests_are_refused(gpt2_dir):
    model = hooked.HookedTransformer.from_pretrained(gpt2_dir)
    with pytest.raises(ValueError, match=r"already processed \(fold_ln, center_writing_weights"):
        model.process_weights_()
    process_weights(model, **NONE)  # nothing asked: nothing done, the record kept
    assert model.processing == TL_DEFAULTS
    with pytest.raises(TypeError, match="fold_ln must be True or False, not 'yes'"):
        hooked.load(gpt2_dir, fold_ln="yes")
    from hooked.weights import load_model

    with pytest.raises(ValueError, match="not supported under tensor parallelism"):
        load_model(gpt2_dir, tp=2, processing=dict(fold_ln=True))
    with pytest.raises(TypeError, match=r"unknown processing flag\(s\) \['fold_layer_norm'\]"):
        load_model(gpt2_dir, processing=dict(fold_layer_norm=True))


# ----------------------------------------------------------------------------- memory
MEMORY_WORKER = r"""
import json, sys
import hooked

def status():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) * 1024
    return fields

baseline = status()["VmRSS"]
model = hooked.load(sys.argv[1], **json.loads(sys.argv[2]))
weights = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
print(json.dumps({"peak": status()["VmHWM"] - baseline, "weights": weights}))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="measures peak memory from /proc/self/status, which only Linux has"
)
def test_processing_makes_no_second_copy_of_the_weights(tmp_path):
    """Peak resident memory of a load, in a fresh process each, over the RSS after the imports: processing
    adds at most the weights it creates (the untied unembedding and its bias) and small temporaries,
    never a second copy of the state dict (which would add the whole weights again)."""
    directory = build_gpt2_checkpoint(tmp_path / "gpt2", n_layer=4, n_embd=512, n_head=8)

    def measure(flags):
        run = subprocess.run(
            [sys.executable, "-c", MEMORY_WORKER, str(directory), json.dumps(flags)],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(run.stdout.strip().splitlines()[-1])

    plain, processed = measure({}), measure(TL_DEFAULTS)
    added = processed["weights"] - plain["weights"]
    assert 0 < added < 0.02 * plain["weights"]  # the unembedding (a 320-token vocabulary) and its bias
    assert plain["peak"] < 1.2 * plain["weights"]
    assert processed["peak"] < plain["peak"] + added + 0.2 * plain["weights"], (plain, processed)
