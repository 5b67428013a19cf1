"""A vLLM model class that runs hooked's own modules, with vLLM's paged attention as the attention core.

vLLM 0.32's model interface (vllm/model_executor/models/gpt2.py is the in-tree GPT-2): the class takes
`vllm_config` and `prefix`; `forward(input_ids, positions, intermediate_tensors, inputs_embeds)` runs the step's
flat batch `[num_tokens]`; `compute_logits(hidden_states)` unembeds the rows the sampler reads;
`load_weights(iterable of (checkpoint name, tensor))` returns the parameter names it filled. Attention goes
through `vllm.model_executor.layers.attention.Attention`, one per layer, which owns that layer's paged KV cache
and reads the step's attention metadata from the forward context.

hooked's blocks run the flat batch as one row `[1, num_tokens, ...]`; `attend` hands q, k, v to `_PagedCore`
(hooked.layers.attention.engine_attention), so every hook point fires as on hooked's own engine. Per-request hooks
(`hooked.engines.vllm.step`) cut the rows back into requests; the step's layout is set by the model runner
(`hooked.engines.vllm.worker`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from vllm.config import VllmConfig
from vllm.distributed.parallel_state import get_tp_group
from vllm.model_executor.layers.attention import Attention

from hooked.distributed import Parallel, parallelize
from hooked.engines.vllm.families import final_softcap, layer_window, logits_from_normed
from hooked.engines.vllm.step import HookList, Step, form_patterns, run_flat
from hooked.hooks import HookPoint
from hooked.layers.attention import EngineAttention
from hooked.weights.architecture import architecture_for, build_on_meta, read_config
from hooked.weights.state_dict import read_state_dict


class _PagedCore(EngineAttention):
    def __init__(self, layers: nn.ModuleList, softcaps: list[float | None], windows: list[int | None]):
        self.layers = layers
        self.softcaps = softcaps  # per layer: what each layer's vLLM Attention was built with
        self.windows = windows

    def check_layer(self, layer: int, softcap: float | None, window: int | None) -> None:
        # The layer's own softcap and (when the flat batch is longer than it) window, against what its Attention
        # applies: a family whose window or cap HookedForVllm read wrongly fails here instead of computing another
        # number.
        if softcap != self.softcaps[layer] or (window is not None and window != self.windows[layer]):
            raise ValueError(
                f"layer {layer} asks for attention softcap {softcap} and window {window}; its vLLM Attention was"
                f" built with softcap {self.softcaps[layer]} and window {self.windows[layer]}"
            )

    def __call__(
        self,
        q,
        k,
        v,
        scaling: float,
        hook_attn_scores: HookPoint,
        hook_pattern: HookPoint,
        *,
        softmax_in_float32: bool,
        softcap: float | None = None,
        window: int | None = None,
    ) -> Tensor:
        attention = self.layers[hook_attn_scores.layer()]
        if scaling != attention.impl.scale:
            raise ValueError(f"layer scaling {scaling} differs from the engine's {attention.impl.scale}")
        _, tokens, n_heads, d_head = q.shape
        # every row, hooked or not: the paged call is what fills the KV cache
        z = attention(q[0].reshape(tokens, -1), k[0].reshape(tokens, -1), v[0].reshape(tokens, -1))
        z = z.view(1, tokens, n_heads, d_head)
        if hook_attn_scores.listening or hook_pattern.listening:  # paged attention never forms them: per request
            z = form_patterns(
                q,
                k,
                v,
                z,
                scaling,
                hook_attn_scores,
                hook_pattern,
                softmax_in_float32=softmax_in_float32,
                softcap=softcap,
                window=window,
            )
        return z


class HookedForVllm(nn.Module):
    """A hooked family as a vLLM text-generation model, registered as `Hooked` + the checkpoint's architecture
    (`HookedGPT2LMHeadModel`); the family comes from the checkpoint's config, as `hooked.load` finds it."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        # hooked reads the checkpoint itself (its own config, names and tensor-parallel slices), as hooked.load does
        self.directory = Path(vllm_config.model_config.model)
        self.dtype = vllm_config.model_config.dtype
        # where vLLM builds the model (its model loader: the load config's device, else the device config's)
        self.load_device = torch.device(vllm_config.load_config.device or vllm_config.device_config.device)
        config = read_config(self.directory)
        self.model_class = architecture_for(config)
        model = build_on_meta(self.model_class, config)
        self.plan = None
        group = get_tp_group()
        if group.world_size > 1:  # hooked's own tensor parallelism over vLLM's tensor-parallel group
            model.parallel = Parallel(
                group.world_size, group.rank_in_group, list(group.ranks), group.device_group, 1, 0, None
            )
            self.plan = parallelize(model, model.parallel)
        self.model = model
        self.final_softcap = final_softcap(model)
        # Each layer's attention as hooked computes it: Gemma 2's score cap (GroupedQueryAttention.softcap, applied
        # to the scaled scores before the mask, as vLLM's logits_soft_cap), Mistral's / Gemma's sliding window.
        softcaps = [getattr(block.attn, "softcap", None) for block in model.blocks]
        windows = [layer_window(model.cfg, layer) for layer in range(len(model.blocks))]
        self.paged = nn.ModuleList(
            Attention(
                block.attn.n_heads,  # this rank's heads under tensor parallelism
                block.attn.d_head,
                num_kv_heads=getattr(block.attn, "n_kv_heads", block.attn.n_heads),
                scale=block.attn.scaling,  # Gemma: query_pre_attn_scalar ** -0.5
                cache_config=vllm_config.cache_config,
                logits_soft_cap=softcaps[layer],
                per_layer_sliding_window=windows[layer],
                prefix=f"{prefix + '.' if prefix else ''}blocks.{layer}.attn.paged",
            )
            for layer, block in enumerate(model.blocks)
        )
        for layer, attention in enumerate(self.paged):
            # per_layer_sliding_window=None does not mean "no window" to vLLM: Attention then takes the model-wide
            # cache_config.sliding_window (families.vllm_model_wide_window). families.check_supported refuses that
            # from the checkpoint before an engine starts; this is the worker's own check on what was built.
            if attention.sliding_window != windows[layer]:
                raise NotImplementedError(
                    f"layer {layer}: hooked's window is {windows[layer]} (None: every key), vLLM's Attention applies"
                    f" {attention.sliding_window}; run this checkpoint on hooked's own engine"
                )
        self.core = _PagedCore(self.paged, softcaps, windows)
        # Set by the model runner before each forward (hooked.engines.vllm.worker); None: no request has hooks.
        self.step: Step | None = None
        self.variants: dict[str, HookList] = {}  # variant id -> [(hook name, fn)], installed by the worker
        self.errors: dict[str, BaseException] = {}  # request tag -> its hook's error, until the caller takes it

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        if self.model.tensor_parallel:
            raise NotImplementedError("embed_input_ids under tensor parallelism: hooked embeds inside forward")
        return F.embedding(input_ids, self.model.token_embedding_weight)

    def forward(
        self,
        input_ids: Tensor | None,
        positions: Tensor,
        intermediate_tensors=None,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        if inputs_embeds is not None:
            raise NotImplementedError("prompt embeddings are not supported by hooked on vLLM")
        return run_flat(self.model, input_ids, positions, self.core, self.step, self.variants, self.errors)

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        """`model.logits_from_resid` after the final norm (`forward` returned its output): the unembedding, then the
        family's final logit cap (Gemma 2 and 3's final_logit_softcapping) with hooked's own `softcap_`."""
        return logits_from_normed(self.model, hidden_states, self.final_softcap)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        for _ in weights:  # vLLM's whole tensors: hooked reads its own (sliced under tensor parallelism) instead
            pass
        state = read_state_dict(self.directory, self.model, self.dtype, self.load_device, self.plan)
        self.model.load_state_dict(state, strict=True, assign=True)  # every key used, every shape checked
        self.model.requires_grad_(False).eval()
        return {f"model.{name}" for name, _ in self.model.named_parameters()}
