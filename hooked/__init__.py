"""hooked: GPT-2, Qwen3, Qwen3-MoE, GPT-NeoX, Llama, Mistral, Mixtral, OLMo 2, Gemma 2 and Gemma 3 reimplemented
with a hook point on every activation, loaded from Hugging Face safetensors.

    import hooked
    from hooked import ablate, metrics, tasks
    model = hooked.load("gpt2")
    logits, cache = model.run_with_cache("When Mary and John went to the store, John gave a drink to")
    cache["pattern", 9].shape  # [batch head_index query_pos key_pos]
    model.run_with_hooks(tokens, fwd_hooks=[("blocks.9.attn.hook_z", ablate.zero(heads=9))])
    result = hooked.sweep(model, tokens, {"L9H9": ablate.hooks(model, "L9H9")}, metric)

The package is folders by wing: the hook core and the shared layers at the top (`hooks`, `rows`, `names`,
`layers`, `rotary`, `kv_cache`, `cache`, `generation`), `models/` (one file per family over a shared
decoder), `weights/` (reading checkpoints), `kernels/`, `interventions/` (ablate, patch, sweeps,
metrics, tasks), `circuits/`, `sae/` (sparse dictionaries: SAEs, transcoders and cross-layer transcoders,
their file formats, splicing, training), `graphs/` (attribution graphs through transcoders), `engines/`
(hooked's modules run by an inference engine: vLLM), and `transformer_lens/` (TransformerLens' API). The
README's "What is where" table lists every public module.
"""

import importlib
import sys
from pathlib import Path

import torch

from hooked import (
    circuits,
    plot,  # matplotlib and circuitsvis are imported by its functions only
)
from hooked.analysis import PositionAttention, attention_to_positions, logit_lens
from hooked.cache import ActivationCache, act_name
from hooked.engines.vllm.hooked_model import VllmModel
from hooked.factored import FactoredMatrix
from hooked.generation import generate_variants
from hooked.hooks import HookedRootModule, HookPoint
from hooked.interventions import ablate, metrics, patch, tasks
from hooked.interventions.results import SweepResult
from hooked.interventions.row_blocks import VariantError
from hooked.interventions.sweeps import sweep
from hooked.kv_cache import KVCache
from hooked.layers import attention_backend
from hooked.models import (
    GPT2,
    MODEL_CLASSES,
    Gemma2,
    Gemma3,
    GPTNeoX,
    HookedTransformer,
    Llama,
    Mistral,
    Mixtral,
    Olmo2,
    Qwen3,
    Qwen3Moe,
)
from hooked.transformer_lens import evals, patching, utils  # TransformerLens' evals, patching and utils modules
from hooked.transformer_lens.config import HookedTransformerConfig  # HookedTransformer(cfg) builds its family
from hooked.version import __version__  # noqa: F401  (hooked.__version__)
from hooked.weights import CheckpointError

# Short and earlier module paths, each the very module it names (not a copy): `import hooked.ablate`,
# `from hooked.utils import get_act_name` and `from hooked import patching` (as TransformerLens users type
# `from transformer_lens import patching`) keep working. The code lives in the wing folders.
MODULE_PATHS = {
    "ablate": "hooked.interventions.ablate",
    "patch": "hooked.interventions.patch",
    "sweeps": "hooked.interventions.sweeps",
    "results": "hooked.interventions.results",
    "metrics": "hooked.interventions.metrics",
    "tasks": "hooked.interventions.tasks",
    "addresses": "hooked.interventions.addresses",
    "positions": "hooked.interventions.positions",
    "patching": "hooked.transformer_lens.patching",
    "tl_patching": "hooked.transformer_lens.patching",
    "tl_config": "hooked.transformer_lens.config",
    "evals": "hooked.transformer_lens.evals",
    "utils": "hooked.transformer_lens.utils",
    "aliases": "hooked.transformer_lens.aliases",
    "transformer_lens.processing": "hooked.processing",
    "models.transformer_lens": "hooked.models.building",
    "models.views": "hooked.models.weight_views",
}
for _short, _module in MODULE_PATHS.items():
    _parent, _, _leaf = f"hooked.{_short}".rpartition(".")
    sys.modules[f"hooked.{_short}"] = importlib.import_module(_module)
    setattr(sys.modules[_parent], _leaf, sys.modules[_module])
del _short, _module, _parent, _leaf
# Names that moved to another module, kept at their earlier place too: (module, name) -> where it lives now.
MOVED_NAMES = {("hooked.distributed", "shard_bytes"): "hooked.weights"}
for (_module, _name), _home in MOVED_NAMES.items():
    setattr(importlib.import_module(_module), _name, getattr(importlib.import_module(_home), _name))
del _module, _name, _home


def load(
    name_or_path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    *,
    tp: int | None = None,
    timeout: float | None = None,
    fold_ln: bool = False,
    center_writing_weights: bool = False,
    center_unembed: bool = False,
    fold_value_biases: bool = False,
    refactor_factored_attn_matrices: bool = False,
    engine: str | None = None,
    **engine_args,
) -> HookedTransformer | VllmModel:
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

    `engine="vllm"` serves the model from a vLLM engine running hooked's own modules (`tensor_parallel_size=N`
    and vLLM's other engine arguments as keywords): `run_with_hooks`, `run_with_cache`, `model.hooks`,
    `generate`, `hooked.sweep` and `hooked.generate_variants` run as requests in vLLM's scheduler
    (hooked.engines.vllm, docs/vllm.md).
    """
    from hooked.processing import flags_of
    from hooked.weights import load_model

    if engine is not None or engine_args:
        return _load_on_engine(name_or_path, engine, dtype, device, tp, _processing_asked(locals()), engine_args)

    processing = flags_of(locals())
    return load_model(name_or_path, dtype=dtype, device=device, tp=tp, timeout=timeout, processing=processing)


def _processing_asked(arguments: dict) -> list[str]:
    from hooked.processing import flags_of

    return [flag for flag, asked in flags_of(arguments).items() if asked]


def _load_on_engine(name_or_path, engine, dtype, device, tp, processing: list[str], engine_args: dict):
    if engine != "vllm":
        if engine is None:
            raise TypeError(
                f"hooked.load got unexpected keyword argument(s) {sorted(engine_args)}; engine arguments go with"
                " engine='vllm'"
            )
        raise ValueError(f"engine={engine!r}: hooked runs on its own engine (engine=None) or on 'vllm'")
    if tp is not None:
        raise ValueError("tp= is hooked's own tensor parallelism under torchrun; on vLLM pass tensor_parallel_size=N")
    if processing:
        raise ValueError(
            f"{', '.join(processing)}: weight processing is not supported on vLLM (the engine reads the checkpoint's"
            " own weights); load with hooked.load(path, ...) for processed weights"
        )
    if str(device) != "cpu":
        raise ValueError(f"device={device!r}: vLLM places the model itself (its own device); leave device= out")
    return VllmModel(name_or_path, dtype=dtype, **engine_args)


__all__ = [
    # the model families (hooked.models.MODEL_CLASSES) and their base class
    "GPT2",
    "Gemma2",
    "Gemma3",
    "GPTNeoX",
    "HookedTransformer",
    "Llama",
    "MODEL_CLASSES",
    "Mistral",
    "Mixtral",
    "Olmo2",
    "Qwen3",
    "Qwen3Moe",
    # loading, hooks, caches
    "ActivationCache",
    "CheckpointError",
    "FactoredMatrix",
    "HookPoint",
    "HookedRootModule",
    "KVCache",
    "act_name",
    "attention_backend",
    "load",
    # interventions and circuits
    "SweepResult",
    "VariantError",
    "ablate",
    "circuits",
    "generate_variants",
    "metrics",
    "patch",
    "sweep",
    "tasks",
    # analysis and pictures
    "PositionAttention",
    "attention_to_positions",
    "logit_lens",
    "plot",
    # TransformerLens' modules and config
    "HookedTransformerConfig",
    "evals",
    "patching",
    "tl_patching",
    "utils",
]
