"""Splicing dictionaries into a model: SAELens' `HookedSAETransformer` API on any `hooked` model.

A spliced dictionary replaces the activation at the point it writes with its output: an SAE reads and rewrites
one point; a transcoder reads `hook_name` (the MLP's input, `blocks.L.mlp.hook_in`) and rewrites `hook_name_out`
(`blocks.L.hook_mlp_out`). Its own hook points join the model's under the point it writes, with SAELens' names
(`blocks.3.hook_resid_post.hook_sae_acts_post`), so hooks, caches, ablations, sweeps and patching reach its
features as they reach neurons. `use_error_term=True` adds the reconstruction error back (taken without
gradient), so the model's output is unchanged while the features stay editable.

The splice is a pair of hooks: `with model.saes([sae]):` registers them for the block (for the calling thread,
as `model.hooks()` does) and names the dictionary's points; leaving the block, also by an exception, removes
both. A hook registered at the written point inside the block runs after the splice (it sees the dictionary's
output, as `hook_sae_output` holds it); one registered before the block runs before it (the dictionary reads its
edit). The splice's hooks are part of the model while registered (`part_of_model`, hooked/hooks.py): a reference
computed with hooks suspended (a mean, a resample source) runs through them, and `hooked.sweep` runs every variant
with them. Everything is checked before anything is attached: that the dictionary fits the model (hooked/sae/fits.py:
the hook names, the widths `d_in` and `d_out`, dtype and device, the weight processing and the model it was trained
on), and that no two dictionaries write one point.

Where SAELens differs (`analysis/hooked_sae_transformer.py`, 6.54): it leaves a skip transcoder's `W_skip` out of
the spliced output (its own `SkipTranscoder.forward` includes it), silently skips an SAE whose hook the model
lacks, and fails with a raw shape error for a `d_in` that does not match. Here the skip term is part of the
output, and the other two are refused with the fix named.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from torch import Tensor

from hooked.hooks import HookPoint, _HookContext
from hooked.sae.clt import CLTForward, CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary
from hooked.sae.fits import Spliceable, check_fits

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


@dataclass(frozen=True)
class SpliceHook:
    """One hook of a splice: part of the model while registered (hooked/hooks.py), so `hooks_suspended()` keeps
    it and sweeps run every row through it. `reads_from`: the point whose activation it takes from earlier in the
    same forward (a transcoder's input), which a sweep's rows must not join after."""

    fn: Callable[[Tensor, HookPoint], Tensor | None]
    reads_from: str | None = None
    part_of_model = True

    def __call__(self, activation: Tensor, hook: HookPoint) -> Tensor | None:
        return self.fn(activation, hook)


class _Splice:
    """One dictionary spliced into one model: its checked points, its hooks, and the names it gave."""

    def __init__(self, model: HookedTransformer, dictionary: Dictionary, use_error_term: bool | None):
        self.model, self.dictionary = model, dictionary
        self.use_error_term = dictionary.use_error_term if use_error_term is None else use_error_term
        (self.read,), (self.write,) = check_fits(model, dictionary)
        _check_not_spliced(dictionary, _named(dictionary))
        self.stash: dict[int, Tensor] = {}

    @property
    def writes(self) -> list[str]:
        """The points it replaces (one; a cross-layer transcoder's splice has one per layer)."""
        return [self.write]

    # ----------------------------------------------------------------- the hooks
    def hooks(self) -> list[tuple[str, SpliceHook]]:
        if self.read == self.write:
            return [(self.write, SpliceHook(self._rewrite))]
        return [(self.read, SpliceHook(self._capture)), (self.write, SpliceHook(self._replace, reads_from=self.read))]

    def _rewrite(self, activation: Tensor, hook: HookPoint) -> Tensor:
        return self.dictionary(activation, use_error_term=self.use_error_term)

    def _capture(self, activation: Tensor, hook: HookPoint) -> None:
        self.stash[0] = activation

    def _replace(self, activation: Tensor, hook: HookPoint) -> Tensor:
        x = self.stash.pop(0, None)
        if x is None or x.shape[:-1] != activation.shape[:-1]:
            raise RuntimeError(
                f"{self.dictionary!r} writes {self.write} but {self.read}, which it reads, did not fire for the same"
                f" rows ({None if x is None else tuple(x.shape)} vs {tuple(activation.shape)}): a forward that starts"
                " between the two points (run_stage, a sweep joining rows there) cannot run this transcoder"
            )
        return self.dictionary(x, x_out=activation, use_error_term=self.use_error_term)

    # ----------------------------------------------------------------- the names
    def attach_points(self) -> None:
        """Put the dictionary's points into the model's hook_dict, after the point it writes, named under it; a
        sweep's variant on a feature joins where the dictionary reads."""
        _attach(self.model, _named(self.dictionary), self.write, self.model.hook_dict[self.read].stage)
        _written(self.model)[self.write] = self.dictionary

    def detach_points(self) -> None:
        _written(self.model).pop(self.write, None)
        _detach(self.model, _named(self.dictionary))


class _CrossLayerSplice:
    """A cross-layer transcoder spliced into one model (hooked/sae/clt.py): layer l's read point encodes its
    features, layer m's write point is replaced by the decoding of every layer l <= m's; what the layers carry
    between them in a forward is `state`."""

    def __init__(self, model: HookedTransformer, clt: CrossLayerTranscoder, use_error_term: bool | None):
        self.model, self.dictionary = model, clt
        self.use_error_term = clt.use_error_term if use_error_term is None else use_error_term
        self.reads, self.writes = check_fits(model, clt)
        for layer in range(clt.cfg.n_layers):
            _check_not_spliced(clt, _named_layer(clt, layer), home=f"layers.{layer}.")
        self.state = CLTForward()

    def hooks(self) -> list[tuple[str, SpliceHook]]:
        """Layer m's write decodes the features of layers 0..m, so it reads (for a sweep's rows) from layer 0's read."""
        reads = [(read, SpliceHook(partial(self._read, layer))) for layer, read in enumerate(self.reads)]
        first = self.reads[0]
        return reads + [
            (write, SpliceHook(partial(self._write, layer), reads_from=first))
            for layer, write in enumerate(self.writes)
        ]

    def _read(self, layer: int, activation: Tensor, hook: HookPoint) -> None:
        self.dictionary.read(layer, activation, self.state, self.use_error_term)

    def _write(self, layer: int, activation: Tensor, hook: HookPoint) -> Tensor:
        return self.dictionary.write(layer, activation, self.state, self.use_error_term)

    def attach_points(self) -> None:
        """Layer m's points under the point it writes; all at the stage of layer 0's read point, where a sweep's
        variant on any layer's features must join (layer m's output needs the features of layers 0..m)."""
        stage = self.model.hook_dict[self.reads[0]].stage
        for layer, write in enumerate(self.writes):
            _attach(self.model, _named_layer(self.dictionary, layer), write, stage)
            _written(self.model)[write] = self.dictionary

    def detach_points(self) -> None:
        for write in self.writes:
            _written(self.model).pop(write, None)
        for layer in range(self.dictionary.cfg.n_layers):
            _detach(self.model, _named_layer(self.dictionary, layer), home=f"layers.{layer}.")


def _named_layer(clt: CrossLayerTranscoder, layer: int) -> list[tuple[HookPoint, str]]:
    return list(zip(clt.sae_points(layer), _POINTS, strict=True))


def _written(model: HookedTransformer) -> dict[str, Spliceable]:
    """The points spliced dictionaries write now, by `saes()` blocks and `add_sae` alike, and which writes each."""
    return model.__dict__.setdefault("_written_by_dictionaries", {})


def _named(dictionary: Dictionary) -> list[tuple[HookPoint, str]]:
    return [(getattr(dictionary, local), local) for local in _POINTS]


def _attach(model: HookedTransformer, named: list[tuple[HookPoint, str]], write: str, stage: int) -> None:
    """Name a dictionary's points under the point `write` they belong to, and put them into the model's hook_dict
    right after it, with the `stage` a sweep's variant on them joins at."""
    written = model.hook_dict[write]
    added = {}
    for point, local in named:
        point.name = f"{write}.{local}"
        point.stage = stage
        point.shard = None
        if local in ("hook_sae_error", "hook_sae_output"):
            point.axes = written.axes
        added[point.name] = point
    model.insert_hook_points(write, added)


def _detach(model: HookedTransformer, named: list[tuple[HookPoint, str]], home: str = "") -> None:
    """Take a dictionary's points out of the model's hook_dict, named again as in the dictionary (`home`: the
    prefix of their names there)."""
    model.remove_hook_points([point.name for point, _ in named])
    for point, local in named:
        point.name, point.stage = home + local, None
        if local in ("hook_sae_error", "hook_sae_output"):
            point.axes = ()


_POINTS = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
    "hook_sae_output",
)


def _check_not_spliced(dictionary: Spliceable, named: list[tuple[HookPoint, str]], home: str = "") -> None:
    spliced_at = next((point.name for point, local in named if point.name and point.name != home + local), None)
    if spliced_at is not None:
        raise ValueError(f"{dictionary!r} is already spliced ({spliced_at}); one place at once")


# ----------------------------------------------------------------------------- the public API
def _splices(model: HookedTransformer, saes, use_error_term: bool | None) -> list[_Splice | _CrossLayerSplice]:
    if isinstance(saes, (Dictionary, CrossLayerTranscoder)):
        saes = [saes]
    if not isinstance(saes, Sequence):
        raise TypeError(f"saes= is a list of dictionaries, not {type(saes).__name__}")
    if len({id(d) for d in saes}) != len(saes):
        raise ValueError("a dictionary appears twice in saes=")
    splices = [_splice(model, d, use_error_term) for d in saes]
    writes = dict(_written(model))
    for splice in splices:
        for write in splice.writes:
            other = writes.get(write)
            if other is not None:
                raise ValueError(
                    f"two dictionaries write {write} ({other!r} and {splice.dictionary!r}); which output would"
                    " flow on is ambiguous: splice one of them"
                )
            writes[write] = splice.dictionary
    return splices


def _splice(model: HookedTransformer, dictionary, use_error_term: bool | None) -> _Splice | _CrossLayerSplice:
    if isinstance(dictionary, CrossLayerTranscoder):
        return _CrossLayerSplice(model, dictionary, use_error_term)
    if not isinstance(dictionary, Dictionary):
        raise TypeError(
            f"saes= takes hooked.sae dictionaries (hooked.sae.load(...)) and cross-layer transcoders, not"
            f" {type(dictionary).__name__}; a SAELens SAE converts with hooked.sae.from_saelens(sae)"
        )
    return _Splice(model, dictionary, use_error_term)


@contextlib.contextmanager
def saes(
    model: HookedTransformer, saes: Sequence[Spliceable] | Spliceable = (), *, use_error_term: bool | None = None
) -> Iterator[HookedTransformer]:
    """Splice `saes` into `model` for the body of a `with` block (SAELens' `model.saes(saes=[...])`).

    `use_error_term=None` takes each dictionary's own `use_error_term` (False unless set), as SAELens does."""
    with _spliced(model, saes, use_error_term):
        yield model


@contextlib.contextmanager
def _spliced(
    model: HookedTransformer, dictionaries: Sequence[Spliceable] | Spliceable, use_error_term: bool | None
) -> Iterator[HookedTransformer]:
    """`saes`, under a name that the keyword `saes=` of the functions below does not shadow."""
    splices = _splices(model, dictionaries, use_error_term)
    for splice in splices:
        splice.attach_points()
    try:
        with model.hooks(fwd_hooks=[hook for splice in splices for hook in splice.hooks()]):
            yield model
    finally:
        for splice in reversed(splices):
            splice.detach_points()


def run_with_saes(model: HookedTransformer, *model_args, saes=(), use_error_term: bool | None = None, **kwargs):
    """The model's forward with `saes` spliced for this call only."""
    with _spliced(model, saes, use_error_term):
        return model(*model_args, **kwargs)


def run_with_hooks_with_saes(
    model: HookedTransformer,
    *model_args,
    saes=(),
    fwd_hooks=(),
    bwd_hooks=(),
    use_error_term: bool | None = None,
    **kwargs,
):
    """`run_with_hooks` with `saes` spliced for this call, so `fwd_hooks` may name their points
    (`blocks.3.hook_resid_post.hook_sae_acts_post`): SAELens' `run_with_hooks_with_saes`. The other keywords go to
    `run_with_hooks` (`reset_hooks_end`, `clear_contexts`) and the forward."""
    with _spliced(model, saes, use_error_term):
        return model.run_with_hooks(*model_args, fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks), **kwargs)


def run_with_cache_with_saes(
    model: HookedTransformer,
    *model_args,
    saes=(),
    use_error_term: bool | None = None,
    sparse_features: bool = False,
    **kwargs,
):
    """`run_with_cache` with `saes` spliced for this call: the cache holds their points (`...hook_sae_acts_post`).

    `sparse_features=True` keeps each dictionary's `hook_sae_acts_post` as a torch sparse COO tensor, the indices and
    values of its active features (`cache[name].to_dense()` is the dense one), converted as the point fires. Use it
    when caching features of many tokens: a dense cache holds d_sae values per token, a sparse one 28 bytes per
    active feature (three int64 indices and a float32 value), so a dictionary of 16,384 features with 64 active
    per token keeps 1.8 KB per token instead of 64 KB; below one active feature in seven it always saves.
    """
    with _spliced(model, saes, use_error_term):
        if sparse_features:
            kwargs["sparse"] = [name for d in _as_list(saes) for name in _features_points(d)]
        return model.run_with_cache(*model_args, **kwargs)


def _as_list(saes) -> list[Spliceable]:
    return [saes] if isinstance(saes, (Dictionary, CrossLayerTranscoder)) else list(saes)


def _features_points(dictionary: Spliceable) -> list[str]:
    """The names of a spliced dictionary's `hook_sae_acts_post` points (a cross-layer transcoder: every layer's)."""
    if isinstance(dictionary, CrossLayerTranscoder):
        return [module.hook_sae_acts_post.name for module in dictionary.layers]
    return [dictionary.hook_sae_acts_post.name]


def add_sae(model: HookedTransformer, sae: Spliceable, use_error_term: bool | None = None) -> None:
    """Splice `sae` until `reset_saes` (SAELens' `add_sae`): for every caller, as `model.add_hook` is."""
    (splice,) = _splices(model, [sae], use_error_term)
    splice.attach_points()
    context = _HookContext()
    try:
        for name, fn in splice.hooks():
            model._add(context, name, fn, "fwd", permanent=True)
    except Exception:
        _remove(model, splice, context)
        raise
    model.__dict__.setdefault("_spliced", {})[id(sae)] = splice
    splice.context = context


def reset_saes(model: HookedTransformer, saes: Sequence[Spliceable] | None = None) -> None:
    """Take out the dictionaries `add_sae` spliced (all of them, or those in `saes`)."""
    spliced = model.__dict__.get("_spliced", {})
    chosen = list(spliced) if saes is None else [id(d) for d in saes]
    for key in chosen:
        splice = spliced.pop(key, None)
        if splice is None:
            raise ValueError("reset_saes: that dictionary is not spliced with add_sae")
        _remove(model, splice, splice.context)


def _remove(model: HookedTransformer, splice: _Splice | _CrossLayerSplice, context: _HookContext) -> None:
    for registration in context.registrations:
        registration.live = False
        for point in model.hook_dict.values():
            if registration in point._fwd:
                point._fwd.remove(registration)
    splice.detach_points()


def spliced(model: HookedTransformer) -> list[Spliceable]:
    """The dictionaries `add_sae` has spliced into `model` (those of a `saes()` block are the block's own)."""
    return [splice.dictionary for splice in model.__dict__.get("_spliced", {}).values()]
