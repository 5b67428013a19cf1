"""Sparse dictionaries (SAEs, transcoders, cross-layer transcoders): load them from SAELens, Gemma Scope,
eai-sparsify and circuit-tracer files, splice them into any `hooked` model, attribute and ablate their features,
train and evaluate them. docs/saes.md walks through it.

    sae = hooked.sae.load("path/to/saelens_dir")
    logits, cache = model.run_with_cache_with_saes(tokens, saes=[sae])
    cache["blocks.3.hook_resid_post.hook_sae_acts_post"]

The splice (hooked/sae/splice.py) and the dictionary (hooked/sae/dictionary.py) stand on the hook core alone, so a
model's `run_with_saes` needs nothing above it; what builds on interventions (attribution, training, evaluation)
is imported on first use.
"""

from __future__ import annotations

import importlib

from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.splice import add_sae, reset_saes, run_with_cache_with_saes, run_with_saes, saes, spliced

# name -> the module that defines it, imported when first asked for
_LAZY = {
    "load": "hooked.sae.formats",
    "bundled_saes": "hooked.sae.formats",
    "save": "hooked.sae.formats",
    "from_saelens": "hooked.sae.formats",
    "attribute": "hooked.sae.attribution",
    "train": "hooked.sae.training",
    "evaluate": "hooked.sae.evaluation",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hooked.sae' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "CLTConfig",
    "CrossLayerTranscoder",
    "Dictionary",
    "DictionaryConfig",
    "add_sae",
    "reset_saes",
    "run_with_cache_with_saes",
    "run_with_saes",
    "saes",
    "spliced",
    *_LAZY,
]
