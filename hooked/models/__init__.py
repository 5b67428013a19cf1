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

from hooked.models.base import HookedTransformer
from hooked.models.gemma2 import Gemma2, Gemma2Config
from hooked.models.gemma3 import Gemma3, Gemma3Config
from hooked.models.gpt2 import GPT2, GPT2Config
from hooked.models.gpt_neox import GPTNeoX, GPTNeoXConfig
from hooked.models.llama import Llama, LlamaConfig, Mistral, MistralConfig
from hooked.models.mixtral import Mixtral, MixtralConfig
from hooked.models.olmo2 import Olmo2, Olmo2Config
from hooked.models.qwen3 import Qwen3, Qwen3Config
from hooked.models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

MODEL_CLASSES = (GPT2, Qwen3, Qwen3Moe, GPTNeoX, Llama, Mistral, Mixtral, Olmo2, Gemma2, Gemma3)

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
