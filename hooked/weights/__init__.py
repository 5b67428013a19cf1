"""Loading checkpoints: Hugging Face `config.json` + `.safetensors`, never a transformers model.

One module per step, in the order `load_model` runs them:

| module | what it holds |
|---|---|
| `sources` | `resolve`: a name to a checkpoint directory (bundled, local, the hub cache, TransformerLens names) |
| `architecture` | config.json to a model skeleton: `read_config`, `architecture_for`, `build_on_meta` |
| `safetensors` | the file format: `SafetensorsFile` (header checks, streamed reads), `safetensors_files` (shards) |
| `allocation` | `empty_weight`: destinations on huge pages |
| `state_dict` | `read_state_dict`: renames, stacked experts, tensor-parallel slices, the checks |
| `loading` | `load_model` (what `hooked.load` calls): device and dtype checks, processing flags, tensor parallelism |
| `sharding` | `shard_bytes`: bytes per tensor-parallel rank, from config.json alone |
| `errors` | `CheckpointError` |

Every name below is importable from `hooked.weights` itself.
"""

from __future__ import annotations

from hooked.weights.allocation import HUGE_PAGE, MADV_HUGEPAGE, empty_weight
from hooked.weights.architecture import architecture_for, build_on_meta, read_config
from hooked.weights.errors import CheckpointError
from hooked.weights.loading import check_device, load_model
from hooked.weights.safetensors import MAX_HEADER_BYTES, SafetensorsFile, safetensors_files
from hooked.weights.sharding import shard_bytes
from hooked.weights.sources import (
    BUNDLED_DIR,
    BUNDLED_MODELS,
    BUNDLED_PREFIX,
    bundled_models,
    from_the_hub,
    hub_name_for,
    resolve,
)
from hooked.weights.state_dict import read_state_dict

__all__ = [
    "BUNDLED_DIR",
    "BUNDLED_MODELS",
    "BUNDLED_PREFIX",
    "HUGE_PAGE",
    "MADV_HUGEPAGE",
    "MAX_HEADER_BYTES",
    "CheckpointError",
    "SafetensorsFile",
    "architecture_for",
    "build_on_meta",
    "bundled_models",
    "check_device",
    "empty_weight",
    "from_the_hub",
    "hub_name_for",
    "load_model",
    "read_config",
    "read_state_dict",
    "resolve",
    "safetensors_files",
    "shard_bytes",
]
