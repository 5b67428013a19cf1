"""A TransformerLens notebook, run unchanged on `hooked`: only the import differs.

The notebook below is written the way TransformerLens 3.9 notebooks are (its exploratory-analysis
demo on indirect-object identification: logit difference, logit lens, per-layer and per-head direct
logit attribution, attention patterns, activation patching of the residual stream and of each head's
z with `functools.partial` hooks, `utils.get_act_name`, `utils.test_prompt`). It runs once with
`from transformer_lens import utils` on a TransformerLens `HookedTransformer` and once with
`from hooked import utils` on a `hooked` model, both on the same weights, and every number it computes
must agree. TransformerLens folds the final norm's weight into `W_U` by default (`fold_ln=True`), and
`hooked` reads out through it (docs/hooks.md, "Differences from TransformerLens"), so the reference
is built folded: the residual stream is the same either way.
"""

from __future__ import annotations

import contextlib
import io

import torch

from tests.transformer_lens.tl_reference import tl_gpt2

NOTEBOOK = """
import torch
from functools import partial
from transformer_lens import utils

prompts = ["When Mary and John went to the store, John gave a drink to",
           "When Mary and John went to the store, Mary gave a drink to",
           "When Tom and Anna went to the park, Anna gave a ball to",
           "When Tom and Anna went to the park, Tom gave a ball to"]
answers = [(" Mary", " John"), (" John", " Mary"), (" Tom", " Anna"), (" Anna", " Tom")]
corrupted_prompts = [prompts[i ^ 1] for i in range(len(prompts))]

tokens = model.to_tokens(prompts)
answer_tokens = torch.tensor([[model.to_single_token(a) for a in pair] for pair in answers])
original_logits, cache = model.run_with_cache(tokens)

def logits_to_ave_logit_diff(logits, answer_tokens=answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    return answer_logit_diff if per_prompt else answer_logit_diff.mean()

out["logit_diff"] = logits_to_ave_logit_diff(original_logits, per_prompt=True)

answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
final_token_residual_stream = cache["resid_post", -1][:, -1, :]
scaled = cache.apply_ln_to_stack(final_token_residual_stream, layer=-1, pos_slice=-1)
out["direct_logit_diff"] = (scaled * logit_diff_directions).sum(-1).mean()

accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
scaled_residual_stack = cache.apply_ln_to_stack(accumulated_residual, layer=-1, pos_slice=-1)
out["logit_lens"] = (scaled_residual_stack * logit_diff_directions).sum(-1).mean(-1)
out["logit_lens_labels"] = labels

per_layer_residual, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
per_layer_residual = cache.apply_ln_to_stack(per_layer_residual, layer=-1, pos_slice=-1)
out["per_layer"] = (per_layer_residual * logit_diff_directions).sum(-1).mean(-1)
out["per_layer_labels"] = labels

per_head_residual, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
per_head_residual = cache.apply_ln_to_stack(per_head_residual, layer=-1, pos_slice=-1)
per_head_logit_diffs = (per_head_residual * logit_diff_directions).sum(-1).mean(-1)
out["per_head"] = per_head_logit_diffs.reshape(model.cfg.n_layers, model.cfg.n_heads)
out["per_head_labels"] = labels

out["pattern"] = cache["pattern", 1, "attn"][:, :, -1]  # the last query: a real token in every row
out["str_tokens"] = model.to_str_tokens(tokens[0])

corrupted_tokens = model.to_tokens(corrupted_prompts)
corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens)
out["corrupted_logit_diff"] = logits_to_ave_logit_diff(corrupted_logits)

def patch_residual_component(corrupted_residual_component, hook, pos, clean_cache):
    corrupted_residual_component[:, pos, :] = clean_cache[hook.name][:, pos, :]
    return corrupted_residual_component

patched_residual_stream_diff = torch.zeros(model.cfg.n_layers, tokens.shape[1])
for layer in range(model.cfg.n_layers):
    for position in range(tokens.shape[1]):
        hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens, fwd_hooks=[(utils.get_act_name("resid_pre", layer), hook_fn)], return_type="logits")
        patched_residual_stream_diff[layer, position] = logits_to_ave_logit_diff(patched_logits)
out["patched_resid"] = patched_residual_stream_diff

def patch_head_vector(corrupted_head_vector, hook, head_index, clean_head_vector):
    corrupted_head_vector[:, :, head_index, :] = clean_head_vector[:, :, head_index, :]
    return corrupted_head_vector

patched_head_z_diff = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
for layer in range(model.cfg.n_layers):
    for head_index in range(model.cfg.n_heads):
        hook_fn = partial(patch_head_vector, head_index=head_index, clean_head_vector=cache["z", layer])
        patched_logits = model.run_with_hooks(
            corrupted_tokens, fwd_hooks=[(utils.get_act_name("z", layer, "attn"), hook_fn)], return_type="logits")
        patched_head_z_diff[layer, head_index] = logits_to_ave_logit_diff(patched_logits)
out["patched_heads"] = patched_head_z_diff

model.add_hook(utils.get_act_name("mlp_out", 0), lambda mlp_out, hook: mlp_out * 0.0)
out["mlp0_zeroed"] = logits_to_ave_logit_diff(model(tokens))
model.reset_hooks()
out["after_reset"] = logits_to_ave_logit_diff(model(tokens))

utils.test_prompt(prompts[0], answers[0][0], model, prepend_space_to_answer=False)
"""


def run_notebook(model, library: str) -> dict:
    """Run NOTEBOOK with `transformer_lens` meaning `library`; the values it put into `out`."""
    source = (
        NOTEBOOK
        if library == "transformer_lens"
        else NOTEBOOK.replace("from transformer_lens import", "from hooked import")
    )
    namespace = {"model": model, "out": {}}
    printed = io.StringIO()
    with torch.no_grad(), contextlib.redirect_stdout(printed):
        exec(compile(source, f"notebook on {library}", "exec"), namespace)
    namespace["out"]["printed"] = printed.getvalue()
    return namespace["out"]


def test_a_transformer_lens_notebook_runs_unchanged_and_agrees(gpt2, gpt2_dir):
    theirs = run_notebook(tl_gpt2(gpt2_dir, fold_ln=True), "transformer_lens")
    ours = run_notebook(gpt2, "hooked")
    assert set(ours) == set(theirs)
    for key, expected in theirs.items():
        got = ours[key]
        if isinstance(expected, torch.Tensor):
            assert got.shape == expected.shape, key
            torch.testing.assert_close(got.float(), expected.float(), rtol=1e-4, atol=1e-4, msg=key)
        elif key == "printed":  # test_prompt's report; TransformerLens wraps long lines
            assert "".join(got.split()) == "".join(expected.split())
        else:
            assert got == expected, key
    assert not torch.allclose(ours["patched_heads"], ours["corrupted_logit_diff"].expand_as(ours["patched_heads"]))
