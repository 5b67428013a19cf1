"""The architectures `hooked` implements, the shared parts they are built from, and the registry generic code knows
them by.

Each family is one file (`llama.py` serves Llama and Mistral): its config, the model assembled from the shared parts,
and its declarations. The shared parts are files named for what they are: `rotary_decoder.py` (the embedding ->
blocks -> unembedding skeleton of every rotary family, its pre-norm block and config names),
`grouped_query_attention.py`, `moe.py` (the sparse MLP of Qwen3-MoE and Mixtral) and `sandwich_decoder.py` (what
Gemma 2 and Gemma 3 share); `base.py` holds what every model shares. Generic code reaches a family only through
`MODEL_CLASSES` and what each class declares (docs/adding-a-model.md): adding a family is its model file and one
entry here.
"""

import sys

from hooked.models.base import HookedTransformer
from hooked.models.gemma2 import Gemma2, Gemma2Config
from hooked.models.gemma3 import Gemma3, Gemma3Config
from hooked.models.gpt2 import GPT2, GPT2Config
from hooked.models.gpt_neox import GPTNeoX, GPTNeoXConfig
from hooked.models.grouped_query_attention import GroupedQueryAttention
from hooked.models.llama import Llama, LlamaConfig, Mistral, MistralConfig
from hooked.models.mixtral import Mixtral, MixtralConfig
from hooked.models.moe import SparseMoeMLP, StackedExperts
from hooked.models.olmo2 import Olmo2, Olmo2Config
from hooked.models.qwen3 import Qwen3, Qwen3Config
from hooked.models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig
from hooked.models.rotary_decoder import PreNormBlock, RotaryRMSNames, rms_rotary_fields
from hooked.models.sandwich_decoder import LAYER_TYPES, GemmaPostNorm, GemmaRMSNorm, SandwichNormBlock

MODEL_CLASSES = (GPT2, Qwen3, Qwen3Moe, GPTNeoX, Llama, Mistral, Mixtral, Olmo2, Gemma2, Gemma3)

# The shared parts were once defined in a family's file under the family's name: each earlier name stays importable
# from its earlier place (`from hooked.models.qwen3 import Qwen3Attention` is GroupedQueryAttention, whose instances
# are the same attentions Qwen3Attention's were). (module, earlier name) -> what it names now.
_EARLIER_NAMES = {
    ("hooked.models.qwen3", "Qwen3Attention"): GroupedQueryAttention,
    ("hooked.models.qwen3", "Qwen3Block"): PreNormBlock,
    ("hooked.models.qwen3", "RotaryRMSNames"): RotaryRMSNames,
    ("hooked.models.qwen3", "rms_rotary_fields"): rms_rotary_fields,
    ("hooked.models.qwen3_moe", "Qwen3MoeExperts"): StackedExperts,
    ("hooked.models.qwen3_moe", "Qwen3MoeSparseMLP"): SparseMoeMLP,
    ("hooked.models.llama", "LlamaBlock"): PreNormBlock,
    ("hooked.models.mixtral", "MixtralBlock"): PreNormBlock,
    ("hooked.models.gemma2", "LAYER_TYPES"): LAYER_TYPES,
    ("hooked.models.gemma2", "Gemma2RMSNorm"): GemmaRMSNorm,
    ("hooked.models.gemma2", "Gemma2PostNorm"): GemmaPostNorm,
    ("hooked.models.gemma2", "Gemma2Attention"): GroupedQueryAttention,
    ("hooked.models.gemma2", "Gemma2Block"): SandwichNormBlock,
}
for (_module, _name), _value in _EARLIER_NAMES.items():
    setattr(sys.modules[_module], _name, _value)
del _module, _name, _value

__all__ = [
    "GPT2",
    "GPT2Config",
    "Gemma2",
    "Gemma2Config",
    "Gemma3",
    "Gemma3Config",
    "GPTNeoX",
    "GPTNeoXConfig",
    "HookedTransformer",
    "Llama",
    "LlamaConfig",
    "MODEL_CLASSES",
    "Mistral",
    "MistralConfig",
    "Mixtral",
    "MixtralConfig",
    "Olmo2",
    "Olmo2Config",
    "Qwen3",
    "Qwen3Config",
    "Qwen3Moe",
    "Qwen3MoeConfig",
]
