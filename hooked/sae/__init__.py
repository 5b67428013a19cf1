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

from hooked.sae.architectures import ARCHITECTURES, Architecture, register_architecture
from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.fits import check_fits
from hooked.sae.splice import (
    add_sae,
    reset_saes,
    run_with_cache_with_saes,
    run_with_hooks_with_saes,
    run_with_saes,
    saes,
    spliced,
)
from hooked.sae.transcoders import TranscoderSet

# name -> the module that defines it ("module:name" where it is defined under another name), imported when first
# asked for
_LAZY = {
    "load": "hooked.sae.formats",
    "bundled_saes": "hooked.sae.formats",
    "save": "hooked.sae.formats",
    "from_saelens": "hooked.sae.formats",
    "attribute": "hooked.sae.attribution",
    "train": "hooked.sae.training",
    "TrainingConfig": "hooked.sae.training",
    "evaluate": "hooked.sae.evaluation",
    # SAELens' model class: every hooked model splices dictionaries, so it is hooked's HookedTransformer
    "HookedSAETransformer": "hooked.models.base:HookedTransformer",
    "SAE": "hooked.sae.formats",  # SAELens' loaders, SAE.from_pretrained and SAE.load_from_disk
}

_DICTIONARY = (
    "hooked.sae.Dictionary, one class for every architecture and for transcoders (DictionaryConfig(architecture="
    " one of hooked.sae.ARCHITECTURES, hook_name_out= for a transcoder)); from files: hooked.sae.load(path)"
)
# SAELens 6.54's names (sae_lens/__init__.py) that hooked.sae spells otherwise: what to write instead
_SAELENS = {
    "SAEConfig": "hooked.sae.DictionaryConfig (sae.cfg of a loaded dictionary)",
    **{
        name: _DICTIONARY
        for name in (
            "StandardSAE",
            "GatedSAE",
            "TopKSAE",
            "JumpReLUSAE",
            "Transcoder",
            "SkipTranscoder",
            "JumpReLUTranscoder",
            "BatchTopKTrainingSAE",
            "MatryoshkaBatchTopKTrainingSAE",
        )
    },
    **{
        name: "hooked.sae.train(model, data, hook_name=..., architecture=..., d_sae=...), which trains on the model's"
        " own forward (docs/saes.md, 'Coming from SAELens', maps the config's fields)"
        for name in (
            "LanguageModelSAETrainingRunner",
            "LanguageModelSAERunnerConfig",
            "SAETrainingRunner",
            "MultiSAETrainingRunner",
        )
    },
    "run_evals": "hooked.sae.evaluate(model, [sae], tokens)",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        instead = _SAELENS.get(name)
        raise AttributeError(
            f"module 'hooked.sae' has no attribute {name!r}" + (f"; SAELens' {name} is {instead}" if instead else "")
        )
    module, _, attribute = module.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "CLTConfig",
    "CrossLayerTranscoder",
    "Dictionary",
    "DictionaryConfig",
    "TranscoderSet",
    "add_sae",
    "check_fits",
    "register_architecture",
    "reset_saes",
    "run_with_cache_with_saes",
    "run_with_hooks_with_saes",
    "run_with_saes",
    "saes",
    "spliced",
    *_LAZY,
]
