"""What vLLM must be told about each hooked family, without importing vLLM (so the caller can refuse a checkpoint
before an engine starts, and tests run in hooked's own environment).

hooked's modules run unchanged inside vLLM; only the attention core and the logits leave them. So each layer's vLLM
`Attention` is told the sliding window hooked applies there (`layer_window`) and the score cap (`block.attn.softcap`),
and `compute_logits` repeats what `logits_from_resid` does after the final norm (`logits_from_normed`). See
docs/vllm.md, "Families".
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn

from hooked.engines.vllm import ARCHITECTURES
from hooked.layers.attention import softcap_


def layer_window(cfg, layer: int) -> int | None:
    """The sliding window hooked's model applies at `layer` (None: full attention), as its `block_inputs` and blocks
    pick the mask: every layer of a config with a `sliding_window` (Mistral, Mixtral; Llama's is None), only the
    "sliding_attention" layers of a sandwich decoder (Gemma 2 and 3: `is_sliding`)."""
    window = getattr(cfg, "sliding_window", None)
    if window is not None and hasattr(cfg, "is_sliding") and not cfg.is_sliding(layer):
        return None
    return window


def final_softcap(model: nn.Module) -> float | None:
    """The cap `model.logits_from_resid` puts on the unembedding's output (Gemma's final_logit_softcapping); refuses a
    family whose logits_from_resid does something else, which `logits_from_normed` would not reproduce."""
    from hooked.models.base import HookedTransformer
    from hooked.models.sandwich_decoder import SandwichDecoder

    method = type(model).logits_from_resid
    if method is HookedTransformer.logits_from_resid:
        return None
    if method is SandwichDecoder.logits_from_resid:
        return model.cfg.final_logit_softcapping
    raise NotImplementedError(
        f"{type(model).__name__}.logits_from_resid changes the logits in a way hooked on vLLM's compute_logits does"
        " not reproduce; run this family on hooked's own engine"
    )


def logits_from_normed(model: nn.Module, normed: Tensor, cap: float | None) -> Tensor:
    """`model.logits_from_resid` from the final norm's output: the unembedding (vocabulary-parallel under tensor
    parallelism: whole logits on every rank), then the final cap with hooked's own `softcap_`."""
    if model.tensor_parallel:
        from hooked.distributed import vocab_parallel_logits

        logits = vocab_parallel_logits(model.parallel, normed, model.unembed_weight, model.cfg.d_vocab, None)
    else:
        logits = nn.functional.linear(normed, model.unembed_weight, model.unembed_bias)
    return softcap_(logits, cap)


def vllm_model_wide_window(config: dict) -> int | None:
    """The window vLLM 0.32 gives every layer whose `per_layer_sliding_window` is None: the checkpoint's
    `sliding_window` unless `layer_types` mixes window and full layers (vllm/engine/arg_utils.py,
    `create_engine_config`: CacheConfig.sliding_window; vllm/model_executor/layers/attention/attention.py, Attention's
    fallback to it). A `sliding_window` of 0 is vLLM's "none" (vllm/config/model.py)."""
    layer_types = config.get("layer_types")
    if layer_types is None or all(kind == "sliding_attention" for kind in layer_types):
        return config.get("sliding_window") or None
    return None


def check_supported(path: str | Path) -> None:
    """Refuse, before vLLM starts, a checkpoint hooked on vLLM would not compute as hooked does: an architecture not
    checked on vLLM (ARCHITECTURES), a family whose logits this package does not reproduce, or a layer hooked runs
    without a window where vLLM would impose its model-wide one (`HookedForVllm` checks the same on the built
    `Attention` layers, in the worker)."""
    from hooked.weights.architecture import architecture_for, build_on_meta, read_config

    config = read_config(Path(path))
    architecture = (config.get("architectures") or [None])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"hooked on vLLM runs {sorted(ARCHITECTURES)}; {path} holds {architecture}")
    model = build_on_meta(architecture_for(config), config)
    final_softcap(model)
    imposed = vllm_model_wide_window(config)
    for layer in range(len(model.blocks)):
        if layer_window(model.cfg, layer) is None and imposed is not None:
            raise NotImplementedError(
                f"{path}: hooked runs layer {layer} of this {architecture} over every key (its family reads no"
                f" sliding_window), but vLLM would give it the checkpoint's sliding_window {imposed}; remove"
                " sliding_window from config.json if the model never used it, or run it on hooked's own engine"
            )
