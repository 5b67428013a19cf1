"""TransformerLens' own tests of its hook, cache, tokenization, padding and `prepend_bos` API, run on hooked.

One file per upstream file (TransformerLens' GitHub repository, the legacy `HookedTransformer` tests, at
commit 4cd36aa, whose `HookedTransformer` API is that of the installed transformer_lens 3.9). Only the model
construction is changed (conftest.py); each file's docstring lists every other change, and its `DIFFERENCES`
list each deliberate difference of hooked, with the reason (collected in docs/transformer-lens.md,
"TransformerLens' own tests").

Upstream files not ported, since their subject is not in hooked:
- tests/unit/utilities/test_cache.py: `utilities.cache.get_pos_offset` over TransformerLens'
  `TransformerLensKeyValueCache` / `...Entry` objects (hooked's `KVCache` is its own class).
- the `model_bridge` tests (`TransformerBridge`), and the bridge half of test_main_demo_pattern_hooks.py.
"""
