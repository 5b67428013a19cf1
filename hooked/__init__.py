"""hooked: GPT-2, Qwen3 and Qwen3-MoE reimplemented with a hook point on every activation.

    import hooked
    from hooked import ablate, metrics, tasks
    model = hooked.load("gpt2")
    logits, cache = model.run_with_cache("When Mary and John went to the store, John gave a drink to")
    cache["pattern", 9].shape  # [batch head_index query_pos key_pos]
    model.run_with_hooks(tokens, fwd_hooks=[("blocks.9.attn.hook_z", ablate.zero(heads=9))])
    result = hooked.sweep(model, tokens, {"L9H9": ablate.hooks(model, "L9H9")}, metric)
"""

from pathlib import Path

import torch

from hooked.cache import ActivationCache, act_name
from hooked.factored import FactoredMatrix
from hooked.generation import generate_variants
from hooked.hooks import HookedRootModule, HookPoint
from hooked.kv_cache import KVCache
from hooked.layers import attention_backend
from hooked.models import GPT2, HookedTransformer, Qwen3, Qwen3Moe
from hooked.results import SweepResult
from hooked.sweeps import VariantError, sweep
from hooked.weights import CheckpointError
from hooked import ablate, circuits, metrics, patch, tasks, utils  # noqa: E402  (modules users import by name)
from hooked import plot  # noqa: E402  (matplotlib and circuitsvis are imported by its functions only)
from hooked.analysis import PositionAttention, attention_to_positions, logit_lens  # noqa: E402
from hooked import evals, tl_patching  # noqa: E402  (TransformerLens' evals and patching modules)
from hooked.tl_config import HookedTransformerConfig  # noqa: E402  (HookedTransformer(cfg) builds its family)

__version__ = "0.1.0"


def load(name_or_path: str | Path, dtype: torch.dtype | str = torch.float32, device: torch.device | str = "cpu",
         *, tp: int | None = None, timeout: float | None = None, fold_ln: bool = False,
         center_writing_weights: bool = False, center_unembed: bool = False, fold_value_biases: bool = False,
         refactor_factored_attn_matrices: bool = False) -> HookedTransformer:
    """Load a model from a local directory, a hub id or a TransformerLens model name (`"gpt2-small"`); the
    class is chosen from config.json.

    Reads the safetensors files straight into `dtype` on `device`; never builds a transformers model.
    The weights are the checkpoint's own unless a processing flag is set: `fold_ln`,
    `center_writing_weights`, `center_unembed`, `fold_value_biases`, `refactor_factored_attn_matrices`
    process them in place as TransformerLens does (`HookedTransformer.from_pretrained` sets its defaults;
    `hooked.processing`, docs/transformer-lens.md).

    `tp=N` (under `torchrun`, whose processes form groups of N consecutive ranks) splits the model over
    each group: heads, MLP columns, experts and the vocabulary, each rank reading only its slices of the
    files; hooks still see whole tensors. `tp=1` keeps a whole model per rank, for data-parallel sweeps.
    `timeout` (seconds) bounds every collective. See `hooked.distributed` and docs/scaling.md.
    """
    from hooked.weights import load_model

    processing = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                      fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)
    return load_model(name_or_path, dtype=dtype, device=device, tp=tp, timeout=timeout, processing=processing)


__all__ = [
    "ActivationCache", "CheckpointError", "GPT2", "HookPoint", "HookedRootModule", "HookedTransformer", "KVCache",
    "Qwen3", "Qwen3Moe", "SweepResult", "VariantError", "ablate", "act_name", "attention_backend", "generate_variants", "load", "circuits",
    "metrics", "patch", "sweep", "tasks", "utils",
    "PositionAttention", "attention_to_positions", "logit_lens", "plot",
    "FactoredMatrix", "HookedTransformerConfig", "evals", "tl_patching",
]
