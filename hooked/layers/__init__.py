"""The low floor every architecture is built from, one module per concept (rotary embeddings are in
hooked/rotary.py, the shared decoder blocks in hooked/models/):

| module | what |
|---|---|
| `norms` | `LayerNorm`, `RMSNorm` and their base `HookedNorm`, with `hook_scale` / `hook_normalized` |
| `attention` | each head's own input (`attention_input`), `AttentionMask`, `position_ids_for`, the path chosen (`attention_backend`, `choose_backend`) and `attend` |
| `mlp` | `mlp_input`, `GatedMLP`, `gelu_new`, and the router's `all_experts_removed` message |
| `linear` | GPT-2's `Conv1D`, and `add_bias` after per-head partial products |
| `declarations` | what a layer declares for generic code: `Split` (tensor parallelism), `Projection` (weight processing) |

Each layer reproduces the Hugging Face (transformers 5.24) operation order so that float32 results are
bit-identical, and computes the costly hook points (scores, pattern) only when something listens: the branch
is visible in `attend`. Every name is importable from `hooked.layers` itself.

Axis vocabulary (used in every hook declaration, see docs/hooks.md): batch, pos, d_model, head_index,
kv_head_index, d_head, query_pos, key_pos, d_mlp, n_experts, top_k, d_vocab.
"""  # noqa: E501  (a Markdown table: its rows cannot wrap)

from hooked.layers.attention import (
    MIN_TRITON_CAPABILITY,
    AttentionBackend,
    AttentionMask,
    attend,
    attention_backend,
    attention_input,
    choose_backend,
    heads_output,
    position_ids_for,
    softcap_,
    triton_available,
    triton_compiles_on,
    writable,
)
from hooked.layers.declarations import Projection, QueryKeyPath, Split
from hooked.layers.linear import Conv1D, add_bias
from hooked.layers.mlp import GatedMLP, all_experts_removed, gelu_new, mlp_input
from hooked.layers.norms import HookedNorm, LayerNorm, RMSNorm

__all__ = [
    "MIN_TRITON_CAPABILITY",
    "AttentionBackend",
    "AttentionMask",
    "Conv1D",
    "GatedMLP",
    "HookedNorm",
    "LayerNorm",
    "Projection",
    "QueryKeyPath",
    "RMSNorm",
    "Split",
    "add_bias",
    "all_experts_removed",
    "attend",
    "attention_backend",
    "attention_input",
    "choose_backend",
    "gelu_new",
    "mlp_input",
    "position_ids_for",
    "softcap_",
    "triton_available",
    "triton_compiles_on",
    "heads_output",
    "writable",
]
