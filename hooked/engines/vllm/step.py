"""Which rows of an engine step belong to which request, and per-request hooks over them.

An inference engine runs one forward per step over a flat batch: every scheduled token of every request, one
after another ([num_tokens, ...]; a prefill contributes its prompt, a decode step one token). hooked's modules run
that batch as a single row, `[1, num_tokens, ...]`. A `Step` cuts it back into requests, and `step_hooks` turns each
request's hooks into one callback per hook point that hands every request its own rows, `[1, pos, ...]` in hooked's
layout, with `hook.position_ids` / `hook.rows` set for that request alone. This file knows nothing of vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hooked.hooks import HookPoint
from hooked.layers.attention import AttentionMask, EngineAttention, engine_attention
from hooked.rows import Rows, running_rows

HookList = Sequence[tuple[str, Callable]]

_request: ContextVar[str | None] = ContextVar("hooked_engine_request", default=None)


def current_request() -> str:
    """The tag of the request whose rows the running hook holds (inside a hook on an engine step)."""
    tag = _request.get()
    if tag is None:
        raise RuntimeError("current_request() is known only inside a hook, while an engine step runs")
    return tag


@dataclass(eq=False)
class Capture:
    """A hook that keeps each request's activations at its point, step after step, in `store[tag][name]` (a list
    of `[1, pos, ...]` pieces along the point's pos axis: the prefill, then one per decode step)."""

    store: dict = field(default_factory=dict)
    pos_axis: dict = field(default_factory=dict)  # hook name -> its pos axis

    def __call__(self, activation: Tensor, hook: HookPoint) -> None:
        self.pos_axis[hook.name] = _pos_axis(hook)
        self.store.setdefault(current_request(), {}).setdefault(hook.name, []).append(activation.clone())

    def take(self, tag: str) -> dict[str, Tensor]:
        """The request's activations, each point's pieces joined along its pos axis; removed from the store."""
        pieces = self.store.pop(tag, {})
        return {name: torch.cat(parts, dim=self.pos_axis[name]) for name, parts in pieces.items()}


@dataclass(frozen=True)
class Step:
    """One engine step: request i owns flat rows `starts[i]:starts[i + 1]`."""

    request_ids: tuple[str, ...]
    starts: tuple[int, ...]  # query_start_loc: len(request_ids) + 1 offsets into the flat batch
    variants: tuple[str | None, ...]  # the hooked variant each request asked for (None: no hooks)
    prompt_lengths: tuple[int, ...]  # each request's prompt length (what -1 counts back from in generation)
    tags: tuple[str | None, ...] | None = None  # the caller's name for each request, which its hook errors go to
    prompts: tuple[int | None, ...] | None = None  # each request's prompt in its caller's batch (Rows.prompts)

    def __post_init__(self):
        n = len(self.request_ids)
        if len(self.starts) != n + 1 or len(self.variants) != n or len(self.prompt_lengths) != n:
            raise ValueError(f"a step of {n} requests needs {n + 1} starts and {n} variants and prompt lengths")
        if self.tags is not None and len(self.tags) != n:
            raise ValueError(f"a step of {n} requests needs {n} tags")
        if self.prompts is not None and len(self.prompts) != n:
            raise ValueError(f"a step of {n} requests needs {n} prompt indices")


def _pos_axis(point: HookPoint) -> int:
    if "pos" not in point.axes:
        raise ValueError(
            f"{point.name} has axes {' '.join(point.axes)!r}: no 'pos' axis to cut into requests on the engine"
            " (attention scores and patterns are not materialised by paged attention)"
        )
    return point.axes.index("pos")


def check_hooks(model, hooks: HookList) -> None:
    """Refuse, before any request is queued, a hook the engine could not run on a request's rows: an unknown name
    (KeyError naming the nearest ones), a point without a 'pos' axis (attention scores and patterns, which paged
    attention never forms), something not callable, or what the hook's own `validate_hook_point` refuses (an
    out-of-range head of `hooked.ablate.zero(heads=...)`)."""
    for name, fn in hooks:
        if not callable(fn):
            raise TypeError(f"the hook at {name} is a {type(fn).__name__}, not a callable fn(activation, hook)")
        validate = getattr(fn, "validate_hook_point", None)  # hooked.ablate's selectors (heads=, positions=, ...)
        for resolved in model.resolve_hook_names(name):
            _pos_axis(model.hook_dict[resolved])
            if validate is not None:
                validate(model.hook_dict[resolved], model)


def step_hooks(
    step: Step, positions: Tensor, variants: dict[str, HookList], errors: dict | None = None
) -> list[tuple[str, Callable]]:
    """One forward hook per hook point some request of `step` uses, each running every request's own hooks on
    that request's rows only (in the order the request registered them). `positions` [num_tokens] are the flat
    batch's positions; `variants` maps a variant id to its (hook name, fn) list.

    `errors` (tag -> exception): where a request's failing hook goes instead of ending the engine's step; the
    request's hooks then stop running (its output is meaningless: the caller raises the error instead). None: a
    hook's error propagates."""
    by_name: dict[str, list[tuple[int, int, int, Callable]]] = {}
    for index, variant in enumerate(step.variants):
        if variant is None or (errors is not None and _tag(step, index) in errors):
            continue
        for name, fn in variants[variant]:
            by_name.setdefault(name, []).append((index, step.starts[index], step.starts[index + 1], fn))
    rows = {  # each hooked request's Rows, built once per step and shared by every point's dispatcher
        index: _request_rows(step, positions, index) for segments in by_name.values() for index, *_ in segments
    }
    return [(name, _Dispatch(step, rows, segments, errors)) for name, segments in by_name.items()]


def _request_rows(step: Step, positions: Tensor, index: int) -> Rows:
    position_ids = positions[step.starts[index] : step.starts[index + 1]][None]
    lengths = torch.tensor([[step.prompt_lengths[index]]])
    prompt = None if step.prompts is None else step.prompts[index]
    prompts = None if prompt is None else torch.tensor([prompt])
    return Rows(position_ids, None, int(position_ids[0, 0]), lengths, prompts)


def _tag(step: Step, index: int) -> str:
    return step.request_ids[index] if step.tags is None or step.tags[index] is None else step.tags[index]


@dataclass(eq=False)
class _Dispatch:
    step: Step
    rows: dict[int, Rows]  # request index -> what its hooks' `hook.rows` report
    segments: list[tuple[int, int, int, Callable]]  # (request index, start row, end row, user fn)
    errors: dict | None

    def __call__(self, activation: Tensor, hook: HookPoint) -> Tensor | None:
        axis = _pos_axis(hook)
        replaced = False
        for index, start, end, fn in self.segments:
            tag = _tag(self.step, index)
            if self.errors is not None and tag in self.errors:
                continue  # an earlier hook of this request failed in this step
            rows = activation.narrow(axis, start, end - start)  # a view: in-place edits reach the forward
            token = _request.set(tag)
            try:
                with running_rows(self.rows[index]):
                    result = fn(rows, hook)
                if result is not None and (result.shape != rows.shape or result.dtype != rows.dtype):
                    raise ValueError(
                        f"hook {getattr(fn, '__qualname__', fn)} at {hook.name} returned {tuple(result.shape)}"
                        f" {result.dtype}; the request's rows are {tuple(rows.shape)} {rows.dtype}"
                    )
            except Exception as error:
                if self.errors is None:
                    raise
                self.errors[tag] = error  # the engine goes on; the caller raises it for this request
                continue
            finally:
                _request.reset(token)
            if result is None:
                continue
            if not replaced:  # a replacement never edits the tensor other readers hold: copy once per step
                activation, replaced = activation.clone(), True
            activation.narrow(axis, start, end - start).copy_(result)
        return activation if replaced else None


def run_flat(
    model,
    tokens: Tensor,
    positions: Tensor,
    core: EngineAttention,
    step: Step | None,
    variants: dict[str, HookList],
    errors: dict | None = None,
) -> Tensor:
    """hooked `model`'s blocks and final norm over an engine step's flat batch, `tokens` and `positions`
    [num_tokens], as one row `[1, num_tokens, ...]`: attention through `core`, each request's hooks on its rows.
    Returns the final norm's output [num_tokens d_model] (the unembedding is the engine's `compute_logits`).
    `errors` as in `step_hooks`."""
    fwd_hooks = [] if step is None else step_hooks(step, positions, variants, errors)
    tokens, position_ids = tokens[None], positions[None]
    mask = AttentionMask(None, tokens.shape[1], tokens.shape[1])  # unused: the core knows the requests' boundaries
    with running_rows(Rows(position_ids, None)), engine_attention(core), model.hooks(fwd_hooks=fwd_hooks):
        resid = model.resid_from_tokens(model.token_ids(tokens), position_ids)
        inputs = model.block_inputs(position_ids, mask, resid.dtype)
        for block in model.blocks:
            resid = block(resid, *inputs)
        return model.ln_final(resid)[0]  # the final norm's hooks see every row
