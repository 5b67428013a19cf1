"""Hook points and the hook registry every `hooked` model inherits.

A `HookPoint` is an identity module placed on one tensor of the forward pass. Its name comes from
the module tree (`blocks.3.attn.hook_z`), as in TransformerLens, and it declares the axes of the
tensor it carries (`"batch pos head_index d_head"`), so shapes can be listed, checked and sliced
without running the model.

Hook functions follow the TransformerLens contract: `fn(activation, hook) -> Tensor | None`. A
returned tensor replaces the activation (it must keep the shape and dtype); `None` keeps it, and
in-place edits stay. Backward hooks receive the gradient of the activation and may return a
replacement gradient.

With no hook attached a point costs one attribute test: `HookPoint.__call__` bypasses
`nn.Module.__call__` entirely (see `benchmarks/hook_overhead.py`).

Registration is owned: every hook belongs to the context (`hooks()`, `run_with_hooks`,
`run_with_cache`) or `add_hook` call that made it, and leaving a context removes exactly its own
hooks, also when the forward or a hook raised.

Per-call hooks belong to the caller. A context's hooks live in a `contextvars` scope, not on the
points, so they run only in the thread or asyncio task that entered the context (and in tasks it
starts inside the block): two threads running `run_with_hooks` on one model never see each other's
hooks. Hooks added to the model itself (`add_hook`, `add_perma_hook`, `reset_hooks_end=False`) stay on
the points and run for every caller. Each point merges the two in registration order.

A hook can ask which tokens its rows hold: `hook.position_ids` [batch pos] is each column's position
in its own prompt (left padding skipped) and `hook.attention_mask` [batch pos] marks real tokens (None
when no row is padded), for the forward that is running. A callback that defines
`validate_hook_point(point, model)` is checked when it is registered, before any forward runs.

A callback with `part_of_model = True` is part of the model's computation while it is registered (a spliced
dictionary, hooked/sae/splice.py): `hooks_suspended()` keeps it running, and batched interventions (sweeps,
generation variants) run every row through it instead of refusing it as an outside hook. One that also names
`reads_from` (a hook name) takes that point's activation from earlier in the same forward (a transcoder's input),
so a forward may not start between the two points.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from hooked.rows import Rows, current_rows

HookFn = Callable[[Tensor, "HookPoint"], Tensor | None]
NameFilter = str | Sequence[str] | Callable[[str], bool]
Direction = Literal["fwd", "bwd"]


def needs_gradients(model, caller: str) -> None:
    """The check every analysis that backpropagates makes first (attribution, EAP / EAP-IG, graphs, dictionary
    training): gradients must be on, and the model must be one that computes them (a model served by an inference
    engine runs under inference mode: `hooked.engines`)."""
    engine = getattr(model, "engine_name", None)
    if engine is not None:
        raise RuntimeError(
            f"{caller} needs gradients, but this model runs on {engine}, which computes none (it runs under"
            " torch.inference_mode()); load the model with hooked.load(path) (hooked's own engine) for it"
        )
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"{caller} needs gradients; call it outside torch.inference_mode()")


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode (no dropout) inside the block, and back in the mode it was in after it, also when the
    block raises: what every analysis that runs its own forwards does (attribution, EAP, graphs).

        with evaluating(model):
            logits = model(tokens)
    """
    training = [module for module in model.modules() if module.training]  # each module's own mode comes back
    for module in training:  # what model.eval() does, on only the modules it changes: an analysis called often on a
        module.training = False  # model already in eval mode (qk_attribution per head) pays one walk, not two
    try:
        yield model
    finally:
        for module in training:
            module.training = True


def refuse_level(level: object) -> None:
    """TransformerLens' `level=` of its hook methods: context bookkeeping hooked has no use for, refused when given."""
    if level is not None:
        raise ValueError(
            "hook levels are TransformerLens' context bookkeeping; hooked's `with model.hooks(...)` owns its hooks"
        )


class AssertionValueError(ValueError, AssertionError):
    """Bad input where TransformerLens 3.9 fails an `assert` (a token not in the prompt, `remove_batch_dim` on a
    batch of several): a ValueError as all bad input in hooked, and an AssertionError, so that code written for
    TransformerLens (`except AssertionError`, `pytest.raises(AssertionError)`) still catches it."""


class AssertionKeyError(KeyError, AssertionError):
    """A hook name that TransformerLens 3.9 refuses with an `assert` (`hook_attn_in` before `set_use_attn_in`)
    and hooked does not have: a KeyError as every unknown hook name here, and an AssertionError as there."""


_owner_ids = itertools.count(1)
_order = itertools.count(1)  # registration order across shared and per-call hooks (prepend counts down)


@dataclass(eq=False)
class _Registration:
    fn: HookFn
    owner: int  # id of the context or add_hook call that registered it
    permanent: bool = False
    order: int = 0  # where it runs among a point's hooks; negative for prepend=True
    live: bool = True  # False once its context has ended (a task that outlived the block must not run it)
    part_of_model: bool = False  # the callback's `part_of_model` (see the module docstring)
    context_level = None  # TransformerLens' LensHandle field: hooked has no hook levels

    @property
    def is_permanent(self) -> bool:
        """TransformerLens' name for `permanent` (`hook_point.fwd_hooks[0].is_permanent`)."""
        return self.permanent


def _registration(fn: HookFn, owner: int, permanent: bool = False, prepend: bool = False) -> _Registration:
    order = -next(_order) if prepend else next(_order)
    return _Registration(fn, owner, permanent, order, part_of_model=bool(getattr(fn, "part_of_model", False)))


@dataclass(eq=False)
class _Scope:
    """The per-call hooks visible in one thread or asyncio task: those of every enclosing `hooks()` block.

    `points` maps a point to its (forward, backward) registrations, the enclosing blocks' included, so a
    point looks itself up once. `shared_from` hides the hooks added to the model itself before
    `hooks_suspended()` began (registrations whose owner id is lower), but those that are part of the model.
    """

    points: dict = field(default_factory=dict)
    shared_from: int = 0

    def child(self) -> _Scope:
        return _Scope({point: (list(fwd), list(bwd)) for point, (fwd, bwd) in self.points.items()}, self.shared_from)

    def suspended(self) -> _Scope:
        """The scope of a `hooks_suspended()` block inside this one: only the hooks that are part of the model."""
        kept = {
            point: ([r for r in fwd if r.part_of_model], [r for r in bwd if r.part_of_model])
            for point, (fwd, bwd) in self.points.items()
        }
        return _Scope({point: lists for point, lists in kept.items() if lists[0] or lists[1]}, next(_owner_ids))


_scope: ContextVar[_Scope | None] = ContextVar("hooked_hook_scope", default=None)
_NO_HOOKS: tuple[list, list] = ([], [])


def _merged(shared: list[_Registration], scoped: list[_Registration], shared_from: int) -> list[_Registration]:
    """Shared and per-call registrations in registration order (callers skip those no longer `live`)."""
    if shared_from:
        shared = [r for r in shared if r.owner >= shared_from or r.part_of_model]
    if not scoped:
        return shared
    return sorted([*shared, *scoped], key=_order_of) if shared else scoped


def _order_of(registration: _Registration) -> int:
    return registration.order


EMBED_STAGE = -1  # HookPoint.stage of the points before block 0 (the embedding)


class HookPoint(nn.Module):
    """An identity point on one activation, where hooks can read or replace it.

    `axes` names the tensor's axes from the fixed vocabulary documented in `docs/hooks.md`
    (e.g. `"batch pos d_model"`); `name` is filled in by the root model. `HookPoint()` (no axes, as
    TransformerLens writes it in a user's own module) leaves them unknown: hooks and caching work, and
    what selects by axis (ablations' heads= / positions=) finds none.
    """

    def __init__(self, axes: str = ""):
        super().__init__()
        self.axes: tuple[str, ...] = tuple(axes.split())
        self.name: str = ""
        self.ctx: dict = {}
        # Qwen3-MoE's per-slot points: the expert id of each slot [batch pos top_k], set by the
        # sparse MLP just before the call (None everywhere else).
        self.slot_experts: Tensor | None = None
        self.knows_slot_experts = False  # True at the points whose slot_experts the model sets
        # The first stage of a HookedTransformer forward that fires this point (EMBED_STAGE, 2L / 2L+1 the
        # halves of block L, 2 * n_layers the final norm), recorded by the model; None outside one.
        self.stage: int | None = None
        # Under tensor parallelism, how this point's tensor is split over ranks (hooked.distributed.HookShard):
        # hooks then run on the whole tensor. None: a single process.
        self.shard = None
        # Whether `run_with_cache()` without a names_filter keeps this point. False for the points
        # TransformerLens computes only behind a flag (the split q/k/v inputs, hook_mlp_in): caching them
        # by default would multiply a full cache's memory; `set_use_split_qkv_input(True)` turns them on.
        self.cached_by_default = True
        # Sizes of axes the model does not size, known to this point alone: a spliced dictionary's `d_sae`
        # (hooked.sae). `model.axis_sizes(point_name)` merges them over the model's.
        self.sizes: dict[str, int] = {}
        self._fwd: list[_Registration] = []
        self._bwd: list[_Registration] = []

    # Bypasses nn.Module.__call__: a point with no hooks must cost next to nothing.
    def __call__(self, activation: Tensor) -> Tensor:
        scope = _scope.get()
        if scope is None:
            if not self._fwd and not self._bwd:
                return activation
            if self.shard is None:
                return self._run(activation, self._fwd, self._bwd)
        else:
            entry = scope.points.get(self)
            if not self._fwd and not self._bwd:
                if entry is None:
                    return activation
                if self.shard is None and not scope.shared_from:  # per-call hooks only: the common case
                    return self._run(activation, *entry)
        return self._run(activation) if self.shard is None else self.shard.run(self, activation)

    def _active(self) -> tuple[list[_Registration], list[_Registration]]:
        """The forward and backward hooks that run here for the calling thread / task, in order. A per-call
        one whose block has ended may remain (a task that outlived the block): skip it unless `live`."""
        scope = _scope.get()
        if scope is None:
            return self._fwd, self._bwd
        fwd, bwd = scope.points.get(self, _NO_HOOKS)
        if not scope.shared_from and not self._fwd and not self._bwd:
            return fwd, bwd
        return _merged(self._fwd, fwd, scope.shared_from), _merged(self._bwd, bwd, scope.shared_from)

    forward = __call__

    @property
    def fwd_hooks(self) -> list[_Registration]:
        """The forward hooks that run here for this caller, in call order (a copy: TransformerLens code len()s it)."""
        return [r for r in self._active()[0] if r.live]

    @property
    def bwd_hooks(self) -> list[_Registration]:
        return [r for r in self._active()[1] if r.live]

    def add_hook(
        self, hook: HookFn, dir: Direction = "fwd", is_permanent: bool = False, level=None, prepend: bool = False
    ) -> None:
        """TransformerLens' `HookPoint.add_hook`: attach `hook` here until removed."""
        refuse_level(level)
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', not {dir!r}")
        registrations = self._fwd if dir == "fwd" else self._bwd
        registration = _registration(hook, next(_owner_ids), is_permanent, prepend)
        registrations.insert(0, registration) if prepend else registrations.append(registration)

    def remove_hooks(
        self, dir: Literal["fwd", "bwd", "both"] = "fwd", including_permanent: bool = False, level=None
    ) -> None:
        """TransformerLens' `HookPoint.remove_hooks`: drop this point's hooks of one direction (or both)."""
        refuse_level(level)
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', not {dir!r}")
        kept_fwd, kept_bwd = list(self._fwd), list(self._bwd)
        self._remove_shared(including_permanent)
        if dir == "fwd":
            self._bwd[:] = kept_bwd
        elif dir == "bwd":
            self._fwd[:] = kept_fwd
        _end_scoped(self, dir)

    @property
    def listening(self) -> bool:
        """True when a hook listens here for this caller (models compute costly points only then)."""
        if not self._fwd and not self._bwd:
            scope = _scope.get()
            if scope is None or self not in scope.points:
                return False
        fwd, bwd = self._active()
        return any(r.live for r in fwd) or any(r.live for r in bwd)

    def has_hooks(
        self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = True, level=None
    ) -> bool:
        """TransformerLens 3.9's `HookPoint.has_hooks`: whether a hook of direction `dir` runs here for this
        caller, counting permanent ones unless `including_permanent=False`."""
        refuse_level(level)
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', not {dir!r}")
        chosen = [
            *(self.fwd_hooks if dir in ("fwd", "both") else ()),
            *(self.bwd_hooks if dir in ("bwd", "both") else ()),
        ]
        return any(including_permanent or not r.permanent for r in chosen)

    @property
    def position_ids(self) -> Tensor:
        """[batch pos]: each column's position in its own prompt, for the forward now running."""
        return current_rows().position_ids

    @property
    def attention_mask(self) -> Tensor | None:
        """[batch pos] True for real tokens, or None when no row of the running forward is padded."""
        return current_rows().attention_mask

    @property
    def rows(self) -> Rows:
        """What the running forward's rows hold: `position_ids`, `attention_mask`, and, for a generation
        step, `start` (the first column this step computes) and `lengths` (each prompt's length)."""
        return current_rows()

    def layer(self) -> int:
        """The block index in this point's name (`blocks.3.attn.hook_z` -> 3)."""
        match = re.search(r"blocks\.(\d+)\.", self.name)
        if match is None:
            raise ValueError(f"hook point {self.name!r} is not inside a block, so it has no layer")
        return int(match.group(1))

    def _run(
        self, activation: Tensor, fwd: list[_Registration] | None = None, bwd: list[_Registration] | None = None
    ) -> Tensor:
        if fwd is None:
            fwd, bwd = self._active()
        for registration in list(fwd):
            if not registration.live:
                continue
            result = registration.fn(activation, self)
            if result is None:
                continue
            if not isinstance(result, Tensor):
                raise TypeError(
                    f"hook {_fn_name(registration.fn)} at {self.name} returned {type(result).__name__};"
                    " return a Tensor to replace the activation or None to keep it"
                )
            if result.shape != activation.shape:
                raise ValueError(
                    f"hook {_fn_name(registration.fn)} at {self.name} returned shape {tuple(result.shape)},"
                    f" but the activation has shape {tuple(activation.shape)} ({' '.join(self.axes)});"
                    " a replacement must keep the shape"
                )
            if result.dtype != activation.dtype or result.device != activation.device:
                raise ValueError(
                    f"hook {_fn_name(registration.fn)} at {self.name} returned {result.dtype} on {result.device},"
                    f" but the activation is {activation.dtype} on {activation.device};"
                    " return `new.to(activation)`"
                )
            activation = result
        bwd = [r for r in bwd if r.live] if bwd else bwd
        if bwd:
            if not activation.requires_grad:
                raise RuntimeError(
                    f"a backward hook is attached at {self.name} but the forward runs without"
                    " gradients; call it outside torch.no_grad() / torch.inference_mode()"
                )
            for registration in list(bwd):
                activation.register_hook(_BackwardCall(registration.fn, self))
        return activation

    def _module_hooks_unsupported(self, *args, **kwargs):
        raise TypeError(
            "HookPoint bypasses nn.Module's hook machinery, so this hook would never run;"
            " use model.add_hook(name, fn) or model.hooks(fwd_hooks=[(name, fn)])"
        )

    register_forward_hook = register_forward_pre_hook = _module_hooks_unsupported
    register_full_backward_hook = register_full_backward_pre_hook = register_backward_hook = _module_hooks_unsupported

    def _remove_shared(self, including_permanent: bool) -> None:
        """Drop the hooks added to the model here (permanent ones only with `including_permanent`)."""

        def keep(r: _Registration) -> bool:
            return r.permanent and not including_permanent

        # In place: assigning the attribute would go through nn.Module.__setattr__ (2/3 of the cost).
        self._fwd[:] = [r for r in self._fwd if keep(r)]
        self._bwd[:] = [r for r in self._bwd if keep(r)]

    def extra_repr(self) -> str:
        return f"{self.name!r}, axes={' '.join(self.axes)!r}"


@dataclass
class _BackwardCall:
    """Tensor hook adapter: torch calls it with the gradient of the activation."""

    fn: HookFn
    point: HookPoint

    def __call__(self, grad: Tensor) -> Tensor | None:
        result = self.fn(grad, self.point)
        if isinstance(result, tuple):  # TransformerLens accepts `(grad,)` (a module hook's form) and takes element 0
            result = result[0]
        if result is not None and not isinstance(result, Tensor):
            raise TypeError(
                f"backward hook {_fn_name(self.fn)} at {self.point.name} returned {type(result).__name__};"
                " return a Tensor (or a tuple whose first element is one) to replace the gradient, or None"
            )
        if result is not None and result.shape != grad.shape:
            raise ValueError(
                f"backward hook {_fn_name(self.fn)} at {self.point.name} returned shape"
                f" {tuple(result.shape)}, but the gradient has shape {tuple(grad.shape)}"
            )
        return result


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _end_scoped(point: HookPoint, direction: str = "both") -> None:
    """Drop the per-call hooks this caller sees at `point` (a reset inside a `hooks()` block)."""
    scope = _scope.get()
    if scope is None or point not in scope.points:
        return
    fwd, bwd = scope.points[point]
    for registrations in (fwd,) if direction == "fwd" else (bwd,) if direction == "bwd" else (fwd, bwd):
        for registration in registrations:
            registration.live = False
        registrations.clear()


@dataclass
class _HookContext:
    owner: int = field(default_factory=lambda: next(_owner_ids))
    # The per-call scope the context's hooks go into; None: they go on the points, shared (add_hook).
    scope: _Scope | None = None
    registrations: list[_Registration] = field(default_factory=list)


class HookedRootModule(nn.Module):
    """Base class of every model: names its hook points and owns the hook registry."""

    # Whether the forward may edit a tensor in place after its hook point: True (not audited) for a user's own
    # module. The audited architectures set False, so a cache alone in a call keeps references (hooked/cache.py).
    edits_hooked_tensors: bool = True

    def setup_hooks(self) -> None:
        """Name every HookPoint after its place in the module tree; call at the end of `__init__`."""
        self.hook_dict: dict[str, HookPoint] = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    def setup(self) -> None:
        """TransformerLens' name for `setup_hooks`: call at the end of a HookedRootModule's `__init__`."""
        self.setup_hooks()

    def insert_hook_points(self, after: str, points: dict[str, HookPoint]) -> None:
        """Put `points` (named, not modules of this model: a spliced dictionary's) into the hook registry right
        after the point `after`, in the order given, so forward order still lists them where they run."""
        clash = sorted(set(points) & set(self.hook_dict))
        if clash:
            raise ValueError(f"hook points {clash} are already in the model; remove them first")
        entries = list(self.hook_dict.items())
        at = list(self.hook_dict).index(after) + 1
        self.hook_dict = dict(entries[:at] + list(points.items()) + entries[at:])

    def remove_hook_points(self, names: Iterable[str]) -> None:
        """Take the named points out of the hook registry (those `insert_hook_points` put in); absent names pass."""
        for name in names:
            self.hook_dict.pop(name, None)

    def run_with_cache(
        self, *model_args, names_filter: NameFilter | None = None, **model_kwargs
    ) -> tuple[object, dict[str, Tensor]]:
        """Run a user's own HookedRootModule once and keep every hook point's activation (or those of
        `names_filter`), detached: `output, cache = module.run_with_cache(x)`, `cache["hook_pre"]`.

        The cache is a dict {hook name: activation}, as TransformerLens 3.9's `HookedRootModule.run_with_cache`
        returns (`transformer_lens/HookedRootModule.py`). A model's own `run_with_cache` returns an
        `ActivationCache`, whose analysis helpers need a transformer (hooked/cache.py)."""
        store: dict[str, Tensor] = {}

        def save(activation: Tensor, hook: HookPoint) -> None:
            store[hook.name] = activation.detach().clone()

        names = self.default_cache_names() if names_filter is None else names_filter
        with self.hooks(fwd_hooks=[(names, save)]):
            output = self(*model_args, **model_kwargs)
        return output, store

    def hooks_attached(self) -> bool:
        """Whether a hook would run in this caller's forward now: on the model (`add_hook`; counted even when
        `hooks_suspended()` hides it) or of an enclosing `hooks()` block."""
        scope = _scope.get()
        if scope is not None and any(r.live for fwd, bwd in scope.points.values() for r in (*fwd, *bwd)):
            return True
        return any(point._fwd or point._bwd for point in self.hook_dict.values())

    @property
    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    def default_cache_names(self) -> list[str]:
        """The points a cache without a names_filter keeps: all but those TransformerLens computes only behind a
        flag (see `HookPoint.cached_by_default`)."""
        return [name for name, point in self.hook_dict.items() if point.cached_by_default]

    def hook_points(self) -> list[HookPoint]:
        """Every HookPoint, in forward order (TransformerLens' `hook_points()`)."""
        return list(self.hook_dict.values())

    @property
    def mod_dict(self) -> dict[str, nn.Module]:
        """Every submodule by its dotted name, as TransformerLens' `mod_dict`."""
        return {name: module for name, module in self.named_modules() if name}

    # ----------------------------------------------------------------- name resolution
    def resolve_hook_names(self, names: NameFilter) -> list[str]:
        """The hook names a name, list of names or filter function selects, in forward order.

        Raises a KeyError naming the nearest real names for an unknown name, and a ValueError for
        a filter that matches nothing: a hook that would never run is always a mistake.
        """
        if isinstance(names, str):
            return [self._check_name(names)]
        if callable(names):
            selected = [name for name in self.hook_dict if names(name)]
            if not selected:
                raise ValueError(
                    f"the filter {_fn_name(names)} matches no hook point of this model;"
                    f" names look like {self.hook_names[:3]} (see model.hook_names)"
                )
            return selected
        if isinstance(names, Iterable):
            names = list(names)
            if not names:
                raise ValueError("an empty list of hook names selects nothing")
            return [self._check_name(name) for name in names]
        raise TypeError(f"hook names must be a str, a list of str or a filter function, not {type(names).__name__}")

    def _check_name(self, name: str) -> str:
        if not isinstance(name, str):
            raise TypeError(f"hook name must be a str, not {type(name).__name__}")
        if name in self.hook_dict:
            return name
        nearest = difflib.get_close_matches(name, self.hook_names, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(n) for n in nearest)}?" if nearest else "; see model.hook_names"
        raise KeyError(f"{name!r} is not a hook point of {type(self).__name__}{hint}")

    # ----------------------------------------------------------------- registration
    def add_hook(
        self,
        name: NameFilter,
        hook: HookFn,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        prepend: bool = False,
    ) -> None:
        """Attach `hook` until `reset_hooks()` (or for good with `is_permanent=True`)."""
        self._add(_HookContext(), name, hook, dir, is_permanent, prepend)

    def _add(
        self,
        context: _HookContext,
        name: NameFilter,
        hook: HookFn,
        dir: Direction,
        permanent: bool = False,
        prepend: bool = False,
    ) -> None:
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', not {dir!r}")
        if not callable(hook):
            raise TypeError(f"a hook must be callable as fn(activation, hook), got {type(hook).__name__}")
        hook_names = self.resolve_hook_names(name)
        validate = getattr(hook, "validate_hook_point", None)
        if validate is not None:  # interventions check their selectors against the point up front
            for hook_name in hook_names:
                validate(self.hook_dict[hook_name], self)
        for hook_name in hook_names:
            point = self.hook_dict[hook_name]
            if context.scope is None:
                registrations = point._fwd if dir == "fwd" else point._bwd
            else:
                registrations = context.scope.points.setdefault(point, ([], []))[0 if dir == "fwd" else 1]
            registration = _registration(hook, context.owner, permanent, prepend)
            registrations.insert(0, registration) if prepend else registrations.append(registration)
            context.registrations.append(registration)

    def add_perma_hook(self, name: NameFilter, hook: HookFn, dir: Direction = "fwd") -> None:
        """Attach `hook` for good: only `reset_hooks(including_permanent=True)` removes it."""
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def remove_all_hook_fns(
        self, direction: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = False, level=None
    ) -> None:
        """TransformerLens' `remove_all_hook_fns`: `reset_hooks` without emptying `hook.ctx`."""
        refuse_level(level)
        self.reset_hooks(clear_contexts=False, direction=direction, including_permanent=including_permanent)

    @contextlib.contextmanager
    def hooks_suspended(self) -> Iterator[HookedRootModule]:
        """Run the body as if no hook were registered (hooks added inside are the body's own), but those that are
        part of the model (a spliced dictionary: see the module docstring).

        Interventions use it to compute a reference (a mean, a resample source) from a clean forward
        even when they are first called in the middle of a hooked one.
        """
        parent = _scope.get()
        scope = _Scope(shared_from=next(_owner_ids)) if parent is None else parent.suspended()
        token = _scope.set(scope)  # only for this caller: other threads keep theirs
        try:
            yield self
        finally:
            _scope.reset(token)

    def reset_hooks(
        self,
        clear_contexts: bool = True,
        direction: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = False,
    ) -> None:
        """Remove every hook (permanent ones only with `including_permanent=True`) and, as TransformerLens
        does, empty every `hook.ctx` (unless `clear_contexts=False`). `direction` keeps the other kind."""
        if direction not in ("fwd", "bwd", "both"):
            raise ValueError(f"direction must be 'fwd', 'bwd' or 'both', not {direction!r}")
        for point in self.hook_dict.values():
            kept = (list(point._bwd) if direction == "fwd" else [], list(point._fwd) if direction == "bwd" else [])
            point._remove_shared(including_permanent)
            if direction == "fwd":
                point._bwd[:] = kept[0]
            elif direction == "bwd":
                point._fwd[:] = kept[1]
            _end_scoped(point, direction)
            if clear_contexts:
                point.ctx.clear()

    @contextlib.contextmanager
    def hooks(
        self,
        fwd_hooks: Sequence[tuple[NameFilter, HookFn]] = (),
        bwd_hooks: Sequence[tuple[NameFilter, HookFn]] = (),
        reset_hooks_end: bool = True,
    ) -> Iterator[HookedRootModule]:
        """Attach hooks for the body of a `with` block; nestable, and leaves remove only their own.

        The hooks are this caller's: they run in the thread or asyncio task that entered the block (and
        in tasks it starts inside it), never in another thread using the same model. With
        `reset_hooks_end=False` they outlive the block, so they go on the model, shared, as `add_hook`'s.

        Backward hooks attach to the activations of each forward run inside the block, so they fire
        when you call `.backward()` on that forward's output, even after the block has ended.
        """
        parent = _scope.get()
        context = _HookContext()
        if reset_hooks_end:
            context.scope = parent.child() if parent is not None else _Scope()
        token = None
        try:
            error = None
            try:
                for name, fn in fwd_hooks:
                    self._add(context, name, fn, "fwd")
                for name, fn in bwd_hooks:
                    self._add(context, name, fn, "bwd")
            except Exception as caught:
                error = caught
            if getattr(self, "tensor_parallel", False):  # a bad hook on one rank stops every rank (hooked.distributed)
                self.parallel.agree(error, what="registering hooks")
            elif error is not None:
                raise error
            if context.scope is not None:
                token = _scope.set(context.scope)
            yield self
        finally:
            if token is not None:
                _scope.reset(token)
            if reset_hooks_end:  # a task started inside the block may still hold the scope: end them there too
                for registration in context.registrations:
                    registration.live = False

    def run_with_hooks(
        self,
        *model_args,
        fwd_hooks: Sequence[tuple[NameFilter, HookFn]] = (),
        bwd_hooks: Sequence[tuple[NameFilter, HookFn]] = (),
        reset_hooks_end: bool = True,
        **model_kwargs,
    ):
        """Run the model once with temporary hooks: `model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])`."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end):
            return self(*model_args, **model_kwargs)
