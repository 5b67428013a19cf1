"""The architectures `hooked` implements, one file each."""

from hooked.models.base import HookedTransformer
from hooked.models.gpt2 import GPT2, GPT2Config

MODEL_CLASSES = (GPT2,)

__all__ = ["GPT2", "GPT2Config", "HookedTransformer", "MODEL_CLASSES"]
