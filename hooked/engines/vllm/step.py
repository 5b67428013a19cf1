"""Which rows of an engine step belong to which request, and per-request hooks over them.

An inference engine runs one forward per step over a flat batch: every scheduled token of every request, one
after another ([num_tokens, ...]; a prefill contributes its prompt, a decode step one token). hooked's modules run
that batch as a single row, `[1, num_tokens, ...]`. A `Step` cuts it back into requests, and `step_hooks` turns each
request's hooks into one callback per hook point that hands every request its own rows, `[1, pos, ...]` in hooked's
layout, with `hook.position_ids` / `hook.rows` set for that request alone. This file knows nothing of vLLM.

The attention scores and pattern (`hook_attn_scores`, `hook_pattern`: [1, head_index, query_pos, key_pos]) have no
flat form: an engine's attention core never builds them. `form_patterns` builds them on request, one request at a
time, on hooked's own eager path over that request's q, k, v, and only on a step that holds the request's whole
prompt; the same dispatchers then hand each request its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hooked.hooks import HookPoint
from hooked.layers.attention import AttentionMask, EngineAttention, attend, attention_backend, engine_attention
from hooked.rows import Rows, running_rows

HookList = Sequence[tuple[str, Callable]]

_request: ContextVar[str | None] = ContextVar("hooked_engine_request", default=None)
_pattern_call: ContextVar[_PatternCall | None] = ContextVar("hooked_engine_pattern_call", default=None)


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
        # scores and pattern: one piece, the prompt's [1 head pos pos] (form_patterns refuses them on decode steps)
        self.pos_axis[hook.name] = hook.axes.index("query_pos") if _is_pattern(hook) else _pos_axis(hook)
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
            " (nor 'query_pos' and 'key_pos', the attention scores' and pattern's, formed per request)"
        )
    return point.axes.index("pos")


def _is_pattern(point: HookPoint) -> bool:
    """The attention scores' and pattern's points: two position axes, formed per request by `form_patterns`."""
    return "query_pos" in point.axes and "key_pos" in point.axes


def check_hooks(model, hooks: HookList) -> None:
    """Refuse, before any request is queued, a hook the engine could not run on a request's rows: an unknown name
    (KeyError naming the nearest ones), a point without a 'pos' axis (nor the scores' and pattern's two position
    axes), something not callable, or what the hook's own `validate_hook_point` refuses (an out-of-range head of
    `hooked.ablate.zero(heads=...)`)."""
    for name, fn in hooks:
        if not callable(fn):
            raise TypeError(f"the hook at {name} is a {type(fn).__name__}, not a callable fn(activation, hook)")
        validate = getattr(fn, "validate_hook_point", None)  # hooked.ablate's selectors (heads=, positions=, ...)
        for resolved in model.resolve_hook_names(name):
            if not _is_pattern(model.hook_dict[resolved]):
                _pos_axis(model.hook_dict[resolved])
            if validate is not None:
                validate(model.hook_dict[resolved], model)


def pattern_points(model, hooks: HookList) -> list[str]:
    """The scores and pattern points `hooks` resolve to: a request of a variant with any of them forms them on its
    prompt (`form_patterns`), so it must compute its whole prompt in one step (no shared prefix, no decode step)."""
    names = (resolved for name, _ in hooks for resolved in model.resolve_hook_names(name))
    return list(dict.fromkeys(name for name in names if _is_pattern(model.hook_dict[name])))


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
        if _is_pattern(hook):
            return self._one_request(activation, hook)
        axis = _pos_axis(hook)
        replaced = False
        for index, start, end, fn in self.segments:
            rows = activation.narrow(axis, start, end - start)  # a view: in-place edits reach the forward
            failed, result = self._call(fn, rows, hook, index)
            if failed or result is None:
                continue
            if not replaced:  # a replacement never edits the tensor other readers hold: copy once per step
                activation, replaced = activation.clone(), True
            activation.narrow(axis, start, end - start).copy_(result)
        return activation if replaced else None

    def _one_request(self, activation: Tensor, hook: HookPoint) -> Tensor | None:
        """Scores or pattern `activation` [1 head_index query_pos key_pos] of the request `form_patterns` is forming:
        that request's hooks here, in order; records on its `_PatternCall` whether they changed it."""
        call = _pattern_call.get()
        if call is None:
            raise RuntimeError(
                f"{hook.name} fired over an engine step's flat batch: its scores and pattern exist per request"
                " only (hooked.engines.vllm.step.form_patterns forms them)"
            )
        fns = [fn for index, _, _, fn in self.segments if index == call.index]
        if not fns:
            return None
        before, current = activation.clone(), activation  # what the hooks got: did they change it (in place too)?
        for fn in fns:
            failed, result = self._call(fn, current, hook, call.index)
            if failed:
                return None  # the request failed: its z is left as the engine's
            current = current if result is None else result
        call.changed = call.changed or not torch.equal(current, before)
        return None if current is activation else current

    def _call(self, fn: Callable, rows: Tensor, hook: HookPoint, index: int) -> tuple[bool, Tensor | None]:
        """`fn(rows, hook)` as request `index`'s hook: (whether it failed, what it returned). A failure is filed
        under the request's tag (or raised without an errors dict); a request that failed earlier is skipped."""
        tag = _tag(self.step, index)
        if self.errors is not None and tag in self.errors:
            return True, None  # an earlier hook of this request failed in this step
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
            return True, None
        finally:
            _request.reset(token)
        return False, result


@dataclass(eq=False)
class _PatternCall:
    index: int  # the request whose scores and pattern the points hold now
    changed: bool = False  # whether its hooks replaced or edited them


def form_patterns(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    z: Tensor,
    scaling: float,
    hook_attn_scores: HookPoint,
    hook_pattern: HookPoint,
    *,
    softmax_in_float32: bool,
    softcap: float | None = None,
    window: int | None = None,
) -> Tensor:
    """An engine core's z [1 num_tokens head_index d_head] after the scores and pattern of one layer were formed for
    each request of the step that hooks them, on that request's own q, k, v rows (q [1 num_tokens head_index d_head],
    k, v [1 num_tokens kv_head_index d_head]) by hooked's own eager `attend` (its mask, scaling, softcap, grouped
    heads, softmax dtype), with the request's hooks run on them as [1 head_index query_pos key_pos]. Where a hook
    changed them, the request's rows of z are the eager z of the changed pattern; elsewhere z is the engine's.

    Only on a step that holds the request's whole prompt (rows at positions 0 .. prompt - 1): a decode step, a
    chunked prefill or a prefix-cache hit holds a part of the sequence, whose pattern alone would not be the
    request's; that request is refused (its error filed as a hook's would be)."""
    at = {point: [registration.fn for registration in point.fwd_hooks] for point in (hook_attn_scores, hook_pattern)}
    dispatchers = [dispatcher for listening in at.values() for dispatcher in listening]
    for dispatcher in dispatchers:
        if not isinstance(dispatcher, _Dispatch):
            raise RuntimeError(
                f"a hook at {hook_attn_scores.name} or {hook_pattern.name} was registered on an engine step's flat"
                " batch: on the engine they are formed per request, for the hooks of a request's variant only"
            )
    if not dispatchers:
        return z
    step, rows, errors = dispatchers[0].step, dispatchers[0].rows, dispatchers[0].errors
    requests = sorted({index: (start, end) for d in dispatchers for index, start, end, _ in d.segments}.items())
    overwritten = False
    for index, (start, end) in requests:
        tag = _tag(step, index)
        if errors is not None and tag in errors:
            continue
        refusal = _whole_prompt_refusal(step, rows[index], index)
        if refusal is not None:
            hooked_here = [
                point.name for point, ds in at.items() if any(i == index for d in ds for i, *_ in d.segments)
            ]
            refusal = NotImplementedError(f"{', '.join(hooked_here)}: {refusal}")
            if errors is None:
                raise refusal
            errors[tag] = refusal
            continue
        call, length = _PatternCall(index), end - start
        token = _pattern_call.set(call)
        try:  # hooked's own eager path: the request alone, the engine's core set aside
            with engine_attention(None), attention_backend("eager"):
                request_z = attend(
                    q[:, start:end],
                    k[:, start:end],
                    v[:, start:end],
                    AttentionMask(None, length, length).windowed(window),
                    scaling,
                    hook_attn_scores,
                    hook_pattern,
                    softmax_in_float32,
                    softcap,
                )
        finally:
            _pattern_call.reset(token)
        if call.changed and not (errors is not None and tag in errors):
            if not overwritten:  # the engine's output buffer is never edited in place
                z, overwritten = z.clone(), True
            z[:, start:end] = request_z
    return z


def _whole_prompt_refusal(step: Step, rows: Rows, index: int) -> str | None:
    """None when request `index`'s rows in this step are its whole prompt (positions 0 .. prompt - 1), else why
    its pattern cannot be formed here and where to get it instead."""
    positions, prompt = rows.position_ids[0], step.prompt_lengths[index]
    first, last = int(positions[0]), int(positions[-1])
    if first == 0 and len(positions) == prompt:  # an engine's positions run on by one within a request
        return None
    if first >= prompt:
        holds = f"a decode step (position {first}, after its {prompt}-token prompt)"
    else:
        holds = (
            f"positions {first}..{last}, not its whole prompt 0..{prompt - 1} (a chunked prefill: raise the engine's"
            " max_num_batched_tokens; a prefix-cache hit: give the request a cache_salt of its own; or a"
            " recomputation after preemption)"
        )
    return (
        "on the engine, attention scores and patterns are formed on a request's prompt only, in the step that"
        f" computes the whole prompt (generate with max_new_tokens=1); request {_tag(step, index)}'s step holds"
        f" {holds}. For scores or patterns over generated tokens, run the generation on hooked's own engine"
        " (model.generate with fwd_hooks), or cache them over one forward on the full sequence"
        " (model.run_with_cache(prompt + generated tokens))"
    )


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
