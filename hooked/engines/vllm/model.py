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

import re
from collections.abc import Iterable

import torch.nn.functional as F
from torch import Tensor, nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention

from hooked.engines.vllm import HOOKED_PREFIX
from hooked.engines.vllm.step import HookList, Step, run_flat
from hooked.hooks import HookPoint
from hooked.layers.attention import EngineAttention
from hooked.weights.architecture import architecture_for


class _PagedCore(EngineAttention):
    def __init__(self, layers: nn.ModuleList):
        self.layers = layers

    def __call__(self, q, k, v, scaling: float, hook_attn_scores: HookPoint, hook_pattern: HookPoint) -> Tensor:
        if hook_attn_scores.listening or hook_pattern.listening:
            raise NotImplementedError(
                f"{hook_attn_scores.name} / {hook_pattern.name}: vLLM's paged attention does not form the scores"
                " or the pattern; run this hook on hooked's own engine"
            )
        attention = self.layers[hook_attn_scores.layer()]
        if scaling != attention.impl.scale:
            raise ValueError(f"layer scaling {scaling} differs from the engine's {attention.impl.scale}")
        _, tokens, n_heads, d_head = q.shape
        z = attention(q[0].reshape(tokens, -1), k[0].reshape(tokens, -1), v[0].reshape(tokens, -1))
        return z.view(1, tokens, n_heads, d_head)


class HookedForVllm(nn.Module):
    """A hooked family as a vLLM text-generation model, registered as `Hooked` + the checkpoint's architecture
    (`HookedGPT2LMHeadModel`); the family comes from the checkpoint's config, as `hooked.load` finds it."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        hf_config = vllm_config.model_config.hf_config.to_dict()
        hf_config["architectures"] = [name.removeprefix(HOOKED_PREFIX) for name in hf_config["architectures"]]
        self.model_class = architecture_for(hf_config)
        cfg = self.model_class.config_class.from_hf(hf_config)
        self.model = self.model_class(cfg)
        self.model.requires_grad_(False)
        self.paged = nn.ModuleList(
            Attention(
                cfg.n_heads,
                cfg.d_head,
                num_kv_heads=cfg.n_kv_heads,
                scale=block.attn.scaling,
                cache_config=vllm_config.cache_config,
                prefix=f"{prefix + '.' if prefix else ''}blocks.{layer}.attn.paged",
            )
            for layer, block in enumerate(self.model.blocks)
        )
        self.core = _PagedCore(self.paged)
        # Set by the model runner before each forward (hooked.engines.vllm.worker); None: no request has hooks.
        self.step: Step | None = None
        self.variants: dict[str, HookList] = {}  # variant id -> [(hook name, fn)], installed by the worker
        self.errors: dict[str, BaseException] = {}  # request tag -> its hook's error, until the caller takes it

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
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
        return F.linear(hidden_states, self.model.unembed_weight, self.model.unembed_bias)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        renames = [(re.compile(pattern), replacement) for pattern, replacement in self.model.checkpoint_renames]
        ignored = [re.compile(pattern) for pattern in self.model.checkpoint_ignored]
        parameters = dict(self.model.named_parameters())
        loaded = set()
        for key, tensor in weights:
            name = next((p.fullmatch(key).expand(r) for p, r in renames if p.fullmatch(key)), None)
            if name is None:
                if any(p.fullmatch(key) for p in ignored):
                    continue
                raise ValueError(f"checkpoint key {key!r} has no place in hooked's {self.model_class.__name__}")
            if parameters[name].shape != tensor.shape:
                raise ValueError(f"{key}: checkpoint shape {tuple(tensor.shape)} != {tuple(parameters[name].shape)}")
            parameters[name].data.copy_(tensor)
            loaded.add(f"model.{name}")
        missing = {f"model.{name}" for name in parameters} - loaded
        if missing:
            raise ValueError(f"the checkpoint lacks {sorted(missing)}")
        return loaded
