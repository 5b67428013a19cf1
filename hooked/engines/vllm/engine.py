"""The caller's side: a vLLM engine running hooked's modules, with variants of hooks per request.

`VllmEngine(path)` starts `vllm.LLM` on a checkpoint directory with the architecture swapped for hooked's
(`hf_overrides`), greedy, eager (Python hooks cannot run inside a captured graph). `add_variant(fwd_hooks)` ships the
hooks to every worker (cloudpickled through `collective_rpc`) and returns an id; `generate` queues one request per
(prompt, variant), the variant named in `SamplingParams.extra_args` and salting the prefix cache, and returns
each request's tokens and its raw logits at every generated position (vLLM's `logprobs_mode="raw_logits"` over
the whole vocabulary). A variant that hooks or caches attention scores or patterns forms them on each request's
prompt (hooked.engines.vllm.step.form_patterns): its requests generate one token and never share a prefix-cache
entry.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import torch

from hooked.engines.vllm import HOOKED_PREFIX, register
from hooked.engines.vllm.families import check_supported
from hooked.engines.vllm.worker import OUTPUT_KEY, PROMPT_KEY, TAG_KEY, VARIANT_KEY


@dataclass(frozen=True)
class Generation:
    tokens: list[int]  # the generated ids
    logits: torch.Tensor | None  # [new_tokens d_vocab] raw logits each generated id was chosen from
    cache: dict[str, torch.Tensor]  # the variant's cached points: [1, prompt + new_tokens - 1, ...]; scores and
    # patterns: [1, head_index, prompt, prompt]
    prompt_logits: torch.Tensor | None = None  # [positions d_vocab] (or [positions columns]): generate(prompt_logits=)


class VllmEngine:
    def __init__(self, path: str | Path, max_model_len: int = 128, dtype: str = "float32", **engine_args):
        from vllm import LLM

        config = json.loads((Path(path) / "config.json").read_text())
        architecture = config["architectures"][0]
        check_supported(
            path
        )  # before vLLM starts: its own refusal would reach us as "Engine core initialization failed"
        register()
        self.vocab_size = config["vocab_size"]
        self.llm = LLM(
            model=str(path),
            hf_overrides={"architectures": [HOOKED_PREFIX + architecture]},
            dtype=dtype,
            enforce_eager=True,
            skip_tokenizer_init=True,
            max_model_len=max_model_len,
            logprobs_mode="raw_logits",
            max_logprobs=self.vocab_size,
            worker_extension_cls="hooked.engines.vllm.worker.HookedWorkerExtension",
            **engine_args,
        )
        self.llm.collective_rpc("hooked_track_steps")
        self._ids = itertools.count()
        self._pattern_points: dict[str, list[str]] = {}  # variant -> the scores / pattern points it hooks or caches

    def add_variant(self, fwd_hooks=(), cache: list[str] = ()) -> str:
        """A variant: `fwd_hooks` [(hook name, fn)] run on each of its requests' rows; `cache` names the points whose
        activations each request brings back (`Generation.cache`)."""
        variant = f"v{next(self._ids)}"
        hooks = cloudpickle.dumps(list(fwd_hooks))
        replies = self.llm.collective_rpc("hooked_install_variant", args=(variant, hooks, list(cache)))
        failed = [reply for reply in replies if reply is not None]
        if failed:  # the user's own error (KeyError for an unknown name, ...), from the first worker that refused
            self.llm.collective_rpc("hooked_drop_variant", args=(variant,))
            raise cloudpickle.loads(failed[0])
        self._pattern_points[variant] = self.llm.collective_rpc("hooked_pattern_points", args=(variant,))[0]
        return variant

    def drop_variant(self, variant: str) -> None:
        self.llm.collective_rpc("hooked_drop_variant", args=(variant,))
        self._pattern_points.pop(variant, None)

    def generate(
        self,
        prompts: list[list[int]],
        variants: list[str | None],
        max_new_tokens: int,
        logits: bool = True,
        *,
        prompt_logits: str | None = None,
        columns: list[int] | None = None,
        sampling: dict | None = None,
        stop_token_ids: list[int] | None = None,
        prompt_indices: list[int] | None = None,
    ) -> list[Generation]:
        """One request per (prompt, variant), all queued at once (the scheduler batches them as it likes).

        `logits`: the raw logits each generated token was chosen from. `prompt_logits` ("all" | "last"): the
        logits at the prompt's positions (or its last), computed in the workers from the final norm's output
        (`Generation.prompt_logits`; `columns` keeps only those token ids). `sampling`: SamplingParams fields
        (greedy without). `stop_token_ids`: a request ends at the first of them (default: runs max_new_tokens).
        `prompt_indices`: each request's prompt in the caller's batch, which per-prompt selectors (one position per
        prompt, a paired source) read (`hook.rows.prompts`)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(variants):
            raise ValueError(f"{len(prompts)} prompts but {len(variants)} variants: give one variant per prompt")
        if prompt_logits not in (None, "all", "last"):
            raise ValueError(f"prompt_logits is None, 'all' or 'last', not {prompt_logits!r}")
        forming = {variant: self._pattern_points.get(variant) for variant in variants if variant is not None}
        forming = {variant: points for variant, points in forming.items() if points}
        if forming and max_new_tokens > 1:
            variant, points = next(iter(forming.items()))
            raise ValueError(
                f"variant {variant} hooks or caches {', '.join(points)}: on the engine, attention scores and patterns"
                f" are formed on a request's prompt only, so its requests generate max_new_tokens=1, not"
                f" {max_new_tokens}. For scores or patterns over generated tokens, run the generation on hooked's own"
                " engine (model.generate with fwd_hooks), or cache them over one forward on the full sequence"
                " (model.run_with_cache(prompt + generated tokens))"
            )
        tags = [f"r{next(self._ids)}" for _ in prompts]
        sampling = {"temperature": 0.0, **(sampling or {})}
        params = []
        indices = [None] * len(prompts) if prompt_indices is None else list(prompt_indices)
        for variant, tag, index in zip(variants, tags, indices, strict=True):
            extra = {TAG_KEY: tag}
            if index is not None:
                extra[PROMPT_KEY] = index
            if variant is not None:
                extra[VARIANT_KEY] = variant
            if prompt_logits is not None:
                extra[OUTPUT_KEY] = prompt_logits
            params.append(
                SamplingParams(
                    max_tokens=max_new_tokens,
                    ignore_eos=True,  # the caller's stop_token_ids decide (vLLM's EOS could differ)
                    stop_token_ids=list(stop_token_ids or ()),
                    detokenize=False,
                    logprobs=self.vocab_size if logits else None,
                    extra_args=extra,
                    **sampling,
                )
            )
        # vLLM's prefix cache reuses the keys and values of a prompt another request already computed; a variant's
        # hooks change them, so each variant gets its own cache (cache_salt), shared with its own requests only. A
        # request that forms patterns must compute its whole prompt (a hit would skip the rows its pattern needs):
        # a salt of its own.
        salts = [v if v not in forming else f"{v}/{tag}" for v, tag in zip(variants, tags, strict=True)]
        requests = [
            TokensPrompt(prompt_token_ids=list(p))
            if s is None
            else TokensPrompt(prompt_token_ids=list(p), cache_salt=s)
            for p, s in zip(prompts, salts, strict=True)
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        hooked_tags = [tag for tag, variant in zip(tags, variants, strict=True) if variant is not None]
        failed = self.llm.collective_rpc("hooked_take_errors", args=(hooked_tags,))[0] if hooked_tags else {}
        caches = self.llm.collective_rpc("hooked_take_cache", args=(hooked_tags,))[0] if hooked_tags else {}
        finals = {}
        if prompt_logits is not None:  # every rank runs it: the unembedding is a collective under TP
            finals = self.llm.collective_rpc("hooked_take_outputs", args=(tags, columns))[0]
        if failed:  # the first request whose hook raised, as the user's own exception
            tag = next(tag for tag in tags if tag in failed)
            error = cloudpickle.loads(failed[tag])
            error.add_note(f"(raised by a hook of request {tags.index(tag)}, variant {variants[tags.index(tag)]})")
            raise error
        results = []
        for output, tag in zip(outputs, tags, strict=True):
            completion = output.outputs[0]
            rows = None
            if logits:
                rows = torch.empty(len(completion.token_ids), self.vocab_size)
                for step, entries in enumerate(completion.logprobs or ()):
                    for token, entry in entries.items():
                        rows[step, token] = entry.logprob
            cache = cloudpickle.loads(caches[tag]) if tag in caches else {}
            final = cloudpickle.loads(finals[tag]) if tag in finals else None
            results.append(Generation(list(completion.token_ids), rows, cache, final))
        return results

    def step_history(self) -> list[tuple[int, int]]:
        """(requests, tokens) of each engine step since the last call (rank 0's view)."""
        return [tuple(step) for step in self.llm.collective_rpc("hooked_step_history")[0]]

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
