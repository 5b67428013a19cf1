"""TransformerLens' model names for the architectures hooked implements, and the hub ids they stand for.

TransformerLens 3.9's `HookedTransformer.from_pretrained` takes an official name or one of its aliases,
in any case, and loads the official name from the Hugging Face hub (`transformer_lens/supported_models.py`:
`OFFICIAL_MODEL_NAMES`, `MODEL_ALIASES`; `loading_from_pretrained.get_official_model_name`). This table
holds the names of that list whose checkpoints hooked can load, as each family's model class declares them
(`transformer_lens_names`). TransformerLens 3.9 lists no Qwen3-MoE model for `HookedTransformer`.

Left out, though TransformerLens lists them as GPT-2s: the Stanford CRFM (Mistral) GPT-2s, whose configs
set `reorder_and_upcast_attn` (which `GPT2Config.from_hf` refuses) and whose TransformerLens names pick
training checkpoints by revision (`checkpoint_index`, refused); and `ai-forever/mGPT` ("mGPT"), whose
checkpoint hooked has not been tried on. Their hub ids are still read as hub ids.

`hooked.load` consults the table only after a local directory of that name: `./gpt2-small` wins.
"""

from __future__ import annotations

import difflib

from hooked.models import MODEL_CLASSES

# Official name (TransformerLens' hub id) -> TransformerLens' aliases for it: each family declares its own
# (`transformer_lens_names` on its model class, next to the model).
TRANSFORMER_LENS_NAMES: dict[str, tuple[str, ...]] = {
    official: aliases
    for model_class in MODEL_CLASSES
    for official, aliases in model_class.transformer_lens_names.items()
}

# Every accepted spelling, lower-cased (TransformerLens compares names case-insensitively) -> hub id.
_HUB_IDS: dict[str, str] = {
    name.lower(): official for official, aliases in TRANSFORMER_LENS_NAMES.items() for name in (official, *aliases)
}
_NAMES: dict[str, str] = {  # lower-cased -> as written in the table
    name.lower(): name for official, aliases in TRANSFORMER_LENS_NAMES.items() for name in (official, *aliases)
}


def hub_id(name: str) -> str | None:
    """The hub id TransformerLens loads for `name` (an official name or alias, any case), or None.

    hub_id("gpt2-small")  # "gpt2"
    hub_id("QWEN3-0.6B")  # "Qwen/Qwen3-0.6B"
    """
    return _HUB_IDS.get(name.lower())


def nearest(name: str, n: int = 3) -> list[str]:
    """The accepted names closest to `name` (difflib), best first, for an error message."""
    return [_NAMES[match] for match in difflib.get_close_matches(name.lower(), list(_NAMES), n=n, cutoff=0.6)]
