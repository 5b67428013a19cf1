"""TransformerLens tests/integration/test_cache_hook_names.py, ported.

Changes to the upstream file:
- model: `HookedTransformer.from_pretrained("solu-1l")` -> `hooked.HookedTransformer.from_pretrained` of a
  random one-layer GPT-2 checkpoint (conftest.py). GPT-2 has no SoLU, so the SoLU model's
  `blocks.0.mlp.hook_mid`, `blocks.0.mlp.ln.hook_scale` and `blocks.0.mlp.ln.hook_normalized` are not in the
  expected list (a model change, not a difference); the list is also checked against TransformerLens 3.9's
  own cache keys for a GPT-2 of the same weights (`tl_gpt2`), less the DIFFERENCES.
- see DIFFERENCES.
"""

from hooked import HookedTransformer
from tests.transformer_lens.tl_reference import tl_gpt2
from tests.transformer_lens.upstream_tests.conftest import checkpoint

DIFFERENCES = [
    "`unembed.hook_in` and `unembed.hook_out` are not hook points in hooked (documented: the unembedding reads "
    "`ln_final.hook_normalized`, and its output is the returned logits).",
]

MODEL_DIFFERENCES = {"blocks.0.mlp.hook_mid", "blocks.0.mlp.ln.hook_scale", "blocks.0.mlp.ln.hook_normalized"}
NOT_HOOK_POINTS_IN_HOOKED = {"unembed.hook_in", "unembed.hook_out"}

prompt = "Hello World!"
model = HookedTransformer.from_pretrained(checkpoint(1))

upstream_act_names_in_cache = [
    "hook_embed",
    "hook_pos_embed",
    "blocks.0.hook_resid_pre",
    "blocks.0.ln1.hook_scale",
    "blocks.0.ln1.hook_normalized",
    "blocks.0.attn.hook_q",
    "blocks.0.attn.hook_k",
    "blocks.0.attn.hook_v",
    "blocks.0.attn.hook_attn_scores",
    "blocks.0.attn.hook_pattern",
    "blocks.0.attn.hook_z",
    "blocks.0.hook_attn_out",
    "blocks.0.hook_resid_mid",
    "blocks.0.ln2.hook_scale",
    "blocks.0.ln2.hook_normalized",
    "blocks.0.mlp.hook_pre",
    "blocks.0.mlp.hook_mid",
    "blocks.0.mlp.ln.hook_scale",
    "blocks.0.mlp.ln.hook_normalized",
    "blocks.0.mlp.hook_post",
    "blocks.0.hook_mlp_out",
    "blocks.0.hook_resid_post",
    "ln_final.hook_scale",
    "ln_final.hook_normalized",
    "unembed.hook_in",
    "unembed.hook_out",
]


def hooked_names(names: list[str]) -> list[str]:
    """The list as hooked caches it: without the unembedding's points."""
    return [name for name in names if name not in NOT_HOOK_POINTS_IN_HOOKED]


act_names_in_cache = hooked_names([n for n in upstream_act_names_in_cache if n not in MODEL_DIFFERENCES])


def test_cache_hook_names():
    _, cache = model.run_with_cache(prompt)
    assert list(cache.keys()) == act_names_in_cache


def test_cache_hook_names_match_transformer_lens_gpt2():
    """Added: TransformerLens 3.9's default cache of a GPT-2 on the same weights, less the DIFFERENCES."""
    reference = tl_gpt2(checkpoint(1))
    _, reference_cache = reference.run_with_cache(prompt)
    _, cache = model.run_with_cache(prompt)
    assert list(cache.keys()) == hooked_names(list(reference_cache.keys()))
    assert [n for n in upstream_act_names_in_cache if n not in MODEL_DIFFERENCES] == list(reference_cache.keys())
