"""`hooked.tl_patching` against TransformerLens 3.9's `patching` on the same random weights.

Every function runs on both libraries with the same corrupted tokens, the clean run's cache from each
library and the same TransformerLens-style metric (logits -> scalar); outputs must have TransformerLens'
shape and values (float32 rounding). GPT-2 (tests/transformer_lens/tl_reference.py) and a grouped-query Qwen3, where k
and v patches index key/value heads.
"""

import warnings

import pytest
import torch

import hooked
from hooked import tl_patching
from tests.transformer_lens.tl_reference import grouped_qwen3_pair, tl_gpt2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformer_lens import patching as tl_patching_reference

SIMPLE = [
    "get_act_patch_resid_pre",
    "get_act_patch_resid_mid",
    "get_act_patch_attn_out",
    "get_act_patch_mlp_out",
    "get_act_patch_attn_head_out_by_pos",
    "get_act_patch_attn_head_q_by_pos",
    "get_act_patch_attn_head_k_by_pos",
    "get_act_patch_attn_head_v_by_pos",
    "get_act_patch_attn_head_pattern_by_pos",
    "get_act_patch_attn_head_out_all_pos",
    "get_act_patch_attn_head_q_all_pos",
    "get_act_patch_attn_head_k_all_pos",
    "get_act_patch_attn_head_v_all_pos",
    "get_act_patch_attn_head_pattern_all_pos",
]
EVERY = ["get_act_patch_block_every", "get_act_patch_attn_head_all_pos_every", "get_act_patch_attn_head_by_pos_every"]


def logit_diff(logits):
    """A TransformerLens metric: one number for the batch, nonlinear in the rows (a mean of a product)."""
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean() * logits[:, -2, 7].mean()


@pytest.fixture(scope="module")
def gpt2_pair(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hooked.load(gpt2_dir), tl_gpt2(gpt2_dir, with_tokenizer=False)


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    return grouped_qwen3_pair(tmp_path_factory.mktemp("qwen3-gqa-patching"))


def _tokens(vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(1, vocab, (2, 5), generator=torch.Generator().manual_seed(seed))


def _both(pair, name: str):
    ours, theirs = pair
    clean, corrupted = _tokens(ours.cfg.d_vocab, 0), _tokens(ours.cfg.d_vocab, 1)
    _, our_cache = ours.run_with_cache(clean)
    _, their_cache = theirs.run_with_cache(clean)
    got = getattr(tl_patching, name)(ours, corrupted, our_cache, logit_diff)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = getattr(tl_patching_reference, name)(theirs, corrupted, their_cache, logit_diff)
    return got, want


@pytest.mark.parametrize("name", SIMPLE + EVERY)
def test_gpt2_equals_transformer_lens(gpt2_pair, name):
    got, want = _both(gpt2_pair, name)
    assert got.shape == want.shape
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "name",
    [
        "get_act_patch_attn_head_k_by_pos",
        "get_act_patch_attn_head_v_all_pos",
        "get_act_patch_attn_head_q_all_pos",
        "get_act_patch_attn_head_out_by_pos",
        "get_act_patch_block_every",
        "get_act_patch_attn_head_all_pos_every",
    ],
)
def test_grouped_qwen3_equals_transformer_lens(qwen3_pair, name):
    got, want = _both(qwen3_pair, name)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_dest_src_pattern_and_index_df(gpt2_pair):
    ours, theirs = gpt2_pair
    clean, corrupted = _tokens(ours.cfg.d_vocab, 0)[:, :3], _tokens(ours.cfg.d_vocab, 1)[:, :3]
    _, our_cache = ours.run_with_cache(clean)
    _, their_cache = theirs.run_with_cache(clean)
    got = tl_patching.get_act_patch_attn_head_pattern_dest_src_pos(ours, corrupted, our_cache, logit_diff)
    want = tl_patching_reference.get_act_patch_attn_head_pattern_dest_src_pos(
        theirs, corrupted, their_cache, logit_diff
    )
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    index_df = tl_patching.make_df_from_ranges([2, 3], ["layer", "pos"]).iloc[[5, 0, 2]]
    flat, df = tl_patching.get_act_patch_resid_pre(
        ours, corrupted, our_cache, logit_diff, index_df=index_df, return_index_df=True
    )
    want = tl_patching_reference.get_act_patch_resid_pre(
        theirs, corrupted, their_cache, logit_diff, index_df=index_df, index_axis_names=None
    )  # TransformerLens asserts on its default
    assert df is index_df and flat.shape == (3,)
    torch.testing.assert_close(flat, want, atol=1e-4, rtol=1e-4)
    grid, grid_df = tl_patching.get_act_patch_resid_pre(ours, corrupted, our_cache, logit_diff, return_index_df=True)
    _, want_df = tl_patching_reference.get_act_patch_resid_pre(
        theirs, corrupted, their_cache, logit_diff, return_index_df=True
    )
    assert grid.shape == (2, 3) and grid_df.equals(want_df)


def test_one_entry_is_the_patched_run(gpt2):
    """Entry [layer, pos, head] is the metric of the corrupted run with that head's clean z written at pos."""
    clean, corrupted = _tokens(gpt2.cfg.d_vocab, 0), _tokens(gpt2.cfg.d_vocab, 1)
    _, cache = gpt2.run_with_cache(clean)
    got = tl_patching.get_act_patch_attn_head_out_by_pos(gpt2, corrupted, cache, logit_diff)
    assert got.shape == (gpt2.cfg.n_layers, clean.shape[1], gpt2.cfg.n_heads)

    def write(z, hook):
        z[:, 4, 1] = cache["blocks.1.attn.hook_z"][:, 4, 1]

    want = logit_diff(gpt2.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.attn.hook_z", write)]))
    torch.testing.assert_close(got[1, 4, 1], want, atol=1e-5, rtol=1e-5)
    unpatched = logit_diff(gpt2(corrupted))  # layer 1 at position 0 reaches no logit the metric reads
    torch.testing.assert_close(got[1, 0, 1], unpatched, atol=1e-5, rtol=1e-5)
    assert not torch.isclose(got[1, 4, 1], unpatched)


def test_per_prompt_metric_is_refused(gpt2):
    tokens = _tokens(gpt2.cfg.d_vocab, 0)
    _, cache = gpt2.run_with_cache(tokens)
    with pytest.raises(ValueError, match="one number for the batch"):
        tl_patching.get_act_patch_resid_pre(gpt2, tokens, cache, lambda logits: logits[:, -1, 0])


@pytest.mark.parametrize(
    "name",
    [
        "get_act_patch_resid_pre",
        "get_act_patch_attn_head_out_by_pos",
        "get_act_patch_attn_head_out_all_pos",
        "get_act_patch_attn_head_pattern_by_pos",
    ],
)
def test_a_left_padded_batch_equals_transformer_lens(gpt2_dir, name):
    """Prompts of different lengths, padded on the left by `to_tokens` in both libraries, whose forwards read
    the mask from the ids: the corrupted run swaps two real tokens of each prompt, so the padding is the same."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = hooked.load(gpt2_dir), tl_gpt2(gpt2_dir)
    prompts = ["When Mary and John went to the store, John gave a drink to", "The cat sat on the mat"]
    clean = ours.to_tokens(prompts)
    assert torch.equal(clean, theirs.to_tokens(prompts)) and bool((clean[1, :3] == ours.tokenizer.pad_token_id).all())
    corrupted = clean.clone()
    corrupted[:, [-3, -2]] = clean[:, [-2, -3]]
    _, our_cache = ours.run_with_cache(clean)
    _, their_cache = theirs.run_with_cache(clean)
    got = getattr(tl_patching, name)(ours, corrupted, our_cache, logit_diff)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = getattr(tl_patching_reference, name)(theirs, corrupted, their_cache, logit_diff)
    assert got.shape == want.shape and want.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
