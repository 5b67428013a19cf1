"""What runs inside vLLM's worker processes: `HookedWorkerExtension`, mixed into every worker by vLLM
(`worker_extension_cls`, vllm/config/parallel.py; applied in vllm/v1/worker/worker_base.py `init_worker`), whose
methods the caller reaches by name with `LLM.collective_rpc("hooked_...", args=...)`. Only names and bytes cross
the process boundary (a callable would need VLLM_ALLOW_INSECURE_SERIALIZATION=1); the hooks travel as
cloudpickle bytes, loaded here.

`hooked_track_steps` wraps the model runner's `_model_forward` (vllm/v1/worker/gpu_model_runner.py; the CPU runner
inherits it), which runs inside the step's forward context after `_prepare_inputs` filled `query_start_loc`, while
`input_batch.req_ids` holds the step's requests in row order; each request's `SamplingParams.extra_args` names its
variant. `hooked_install_variant` puts one variant's hooks on the model, checked against its hook names first.
"""

from __future__ import annotations

import cloudpickle
import torch

from hooked.engines.vllm.step import Capture, Step, check_hooks, pattern_points

VARIANT_KEY = "hooked_variant"  # SamplingParams.extra_args key naming the request's variant
TAG_KEY = "hooked_request"  # ... and the caller's name for the request, which its hook errors are filed under
# ... and which of its prompt's final hidden states (the final norm's output) the request brings back as logits:
# "all" (every prompt position) or "last" (the prompt's last position); absent: none (generation's own logits
# come from vLLM's sampler)
OUTPUT_KEY = "hooked_output"
PROMPT_KEY = "hooked_prompt"  # ... and its prompt's index in the caller's batch (what per-prompt selectors read)


class HookedWorkerExtension:
    def hooked_track_steps(self) -> None:
        runner = self.model_runner
        model = runner.model
        if getattr(runner, "_hooked_tracking", False):
            return
        forward = runner._model_forward

        def model_forward(*args, **kwargs):
            batch = runner.input_batch
            n = batch.num_reqs
            request_ids = tuple(batch.req_ids[:n])
            states = [runner.requests[request_id] for request_id in request_ids]
            extra = [(state.sampling_params.extra_args or {}) if state.sampling_params else {} for state in states]
            variants = tuple(args.get(VARIANT_KEY) for args in extra)
            tags = tuple(args.get(TAG_KEY) for args in extra)
            starts = tuple(int(x) for x in runner.query_start_loc.cpu[: n + 1])
            lengths = tuple(state.num_prompt_tokens for state in states)
            prompts = tuple(args.get(PROMPT_KEY) for args in extra)
            model.step = Step(request_ids, starts, variants, lengths, tags, prompts)
            steps = runner.__dict__.setdefault("_hooked_steps", [])
            if len(steps) < 10_000:  # what the steps held (requests, tokens): the spike's evidence of mixed batches
                steps.append((n, starts[-1]))
            try:
                hidden = forward(*args, **kwargs)
            finally:
                model.step = None
            wanted = [(index, args[OUTPUT_KEY]) for index, args in enumerate(extra) if args.get(OUTPUT_KEY)]
            if wanted:
                positions = kwargs.get("positions")
                _keep_outputs(model, hidden, positions, starts, tags, lengths, wanted)
            return hidden

        runner._model_forward = model_forward
        runner._hooked_tracking = True

    def hooked_install_variant(self, variant: str, hooks: bytes, cache: list[str] | None = None) -> bytes | None:
        """Install one variant's hooks, checked first; returns the error (cloudpickled) instead of raising it: under
        tensor parallelism vLLM's executor raises at the first worker's failure and leaves the other workers'
        replies queued, so the next call would read a stale failure (seen with vllm 0.32, TP=2)."""
        model = self.model_runner.model
        try:
            hooks = list(cloudpickle.loads(hooks))
            if cache:  # after the variant's own hooks: the cache holds what they left
                hooks += [(name, _capture(model)) for name in cache]
            check_hooks(model.model, hooks)  # before any request of this variant is queued
        except Exception as error:
            return _pickled(error)
        model.variants[variant] = hooks
        return None

    def hooked_pattern_points(self, variant: str) -> list[str]:
        """The attention scores and pattern points an installed variant hooks or caches: its requests form them on
        their prompt (hooked.engines.vllm.step.form_patterns), so the caller gives each its own prefix-cache salt
        and one new token."""
        model = self.model_runner.model
        return pattern_points(model.model, model.variants[variant])

    def hooked_take_cache(self, tags: list[str]) -> dict[str, bytes]:
        """Each request's cached activations ({hook name: [1, pos, ...]}, prefill and decode steps joined),
        cloudpickled, removed from the model."""
        capture = _capture(self.model_runner.model)
        return {tag: cloudpickle.dumps(capture.take(tag)) for tag in tags if tag in capture.store}

    def hooked_take_outputs(self, tags: list[str], columns: list[int] | None = None) -> dict[str, bytes]:
        """Each request's logits at the prompt positions it asked for ([positions d_vocab], or [positions columns]
        with `columns`), from the final hidden states its prefill kept, by the model's own `compute_logits` (the
        unembedding generation uses; under tensor parallelism a collective, which every rank runs for the same
        tags in the same order); cloudpickled, removed from the model."""
        model = self.model_runner.model
        outputs = model.__dict__.setdefault("hooked_outputs", {})
        taken = {}
        for tag in tags:
            pieces = outputs.pop(tag, None)
            if pieces is None:
                continue
            logits = model.compute_logits(torch.cat(pieces))
            if columns is not None:
                logits = logits[:, torch.as_tensor(columns, device=logits.device)]
            taken[tag] = cloudpickle.dumps(logits.float().cpu())
        return taken

    def hooked_drop_variant(self, variant: str) -> None:
        self.model_runner.model.variants.pop(variant, None)

    def hooked_take_errors(self, tags: list[str]) -> dict[str, bytes]:
        """The errors the hooks of these requests raised, cloudpickled (the caller re-raises the user's own
        exception), removed from the model."""
        errors = self.model_runner.model.errors
        taken = {tag: errors.pop(tag) for tag in tags if tag in errors}
        return {tag: _pickled(error) for tag, error in taken.items()}

    def hooked_step_history(self, clear: bool = True) -> list[tuple[int, int]]:
        runner = self.model_runner
        steps = list(runner.__dict__.get("_hooked_steps", []))
        if clear:
            runner.__dict__["_hooked_steps"] = []
        return steps


def _keep_outputs(model, hidden, positions, starts, tags, lengths, wanted) -> None:
    """Keep the final hidden states of the prompt positions each request in `wanted` [(index, "all" | "last")]
    asked for (a copy: vLLM reuses its buffers), until `hooked_take_outputs`. A prompt split over several steps
    (chunked prefill) adds one piece per step; decode steps add nothing."""
    outputs = model.__dict__.setdefault("hooked_outputs", {})
    for index, which in wanted:
        rows = slice(starts[index], starts[index + 1])
        at = positions[rows]
        keep = at < lengths[index] if which == "all" else at == lengths[index] - 1
        if bool(keep.any()):
            outputs.setdefault(tags[index], []).append(hidden[rows][keep].clone())


def _pickled(error: BaseException) -> bytes:
    try:
        return cloudpickle.dumps(error)
    except Exception:  # an exception that does not pickle: its type and message still reach the caller
        return cloudpickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))


def _capture(model) -> Capture:
    if not hasattr(model, "capture"):
        model.capture = Capture()
    return model.capture
