"""The architectures `hooked` implements, one file each."""

from hooked.models.base import HookedTransformer
from hooked.models.gpt2 import GPT2, GPT2Config

MODEL_CLASSES = (GPT2,)

__all__ = ["GPT2", "GPT2Config", "HookedTransformer", "MODEL_CLASSES"]

from hooked.models.qwen3 import Qwen3, Qwen3Config  # noqa: E402
from hooked.models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig  # noqa: E402

MODEL_CLASSES = (*MODEL_CLASSES, Qwen3, Qwen3Moe)
__all__ += ["Qwen3", "Qwen3Config", "Qwen3Moe", "Qwen3MoeConfig"]

from hooked.models.gpt_neox import GPTNeoX, GPTNeoXConfig  # noqa: E402

MODEL_CLASSES = (*MODEL_CLASSES, GPTNeoX)
__all__ += ["GPTNeoX", "GPTNeoXConfig"]

from hooked.models.llama import Llama, LlamaConfig, Mistral, MistralConfig  # noqa: E402

MODEL_CLASSES = (*MODEL_CLASSES, Llama, Mistral)
__all__ += ["Llama", "LlamaConfig", "Mistral", "MistralConfig"]

from hooked.models.mixtral import Mixtral, MixtralConfig  # noqa: E402

MODEL_CLASSES = (*MODEL_CLASSES, Mixtral)
__all__ += ["Mixtral", "MixtralConfig"]

from hooked.models.olmo2 import Olmo2, Olmo2Config  # noqa: E402

MODEL_CLASSES = (*MODEL_CLASSES, Olmo2)
__all__ += ["Olmo2", "Olmo2Config"]
