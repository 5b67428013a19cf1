"""Ablations as hook callbacks: `zero`, `mean`, `resample` and `constant`, registered by hook name like any hook.

    model.run_with_hooks(tokens, fwd_hooks=[("blocks.9.attn.hook_z", ablate.zero(heads=9))])
    model.run_with_hooks(tokens, fwd_hooks=ablate.hooks(model, ["L9H9", "L10H0"], "resample", source=corrupt))

Each ablation is a small frozen value: `fn(activation, hook) -> Tensor`, with its selectors as fields
and a repr that reads like what it does (`zero(heads=[9])`). Selectors name axes of the hook point,
so one callback serves every point that has the axis:

| selector | axis it selects on | points |
|---|---|---|
| `heads=` | `head_index` (or `kv_head_index`) | z, q, k, v, result, pattern, scores, ... |
| `neurons=` | `d_mlp` / `d_expert_mlp` | `mlp.hook_post`, `mlp.hook_pre`, `mlp.hook_expert_post`, ... |
| `experts=` | `n_experts` (router logits), or the slots holding that expert (`top_k`) | `mlp.hook_router_logits`, `mlp.hook_expert_post` |
| `positions=` | `pos` / `query_pos`, by position in the prompt | every point |

Each selector and its axes are declared in hooked/interventions/kinds.py (`kinds.SELECTORS`); a kind
declared there may add one (`features=` along `d_sae`), which every ablation then takes as a keyword.

`positions` are positions in each prompt, not padded columns: in a left-padded batch, position 3 of
a short prompt sits further right, and -1 is every prompt's last token. An int or a list is a set of
positions selected in every prompt; a 1-D integer tensor `[batch]` (or `per_prompt([...])`) is one
position per prompt: prompt i at `positions[i]` (`positions=task.positions["S2"]`). A list is never
read per prompt, even when its length is the batch size: say so with a tensor or `per_prompt`. A
position a prompt does not have (`positions=100` on 20-token prompts) raises. Zeroing `experts=` at
`hook_router_logits` writes -inf, so the expert gets probability 0 in the softmax over all experts
and never wins a slot; the model then routes and renormalises exactly as it would without it.

`mean` averages a reference set (an `ActivationCache`, a tensor, or tokens run once) over real tokens
only, pooled over every prompt and position (default) or per position in the prompt
(`per_position=True`). `resample` writes the value a paired source holds at the same place (a cache
or tokens of the same shape), or, with `seed=`, the value of another row of the same batch, chosen by
a seeded derangement (no row keeps its own). `constant` writes a value you give: a dictionary's feature held
at a value (steering, `constant(8.0, features=12)`), a neuron clamped. See docs/ablation.md for when each is the
right question.

Component addresses (`ablate.hooks`, `hooked.sweep`; parsed in `hooked/interventions/addresses.py`): `L9H9` (a
head's z; `L9H9.q`, `.k`, `.v` its query, key, value), `L3KV1.k` / `.v` (the keys / values of a
key/value head a group of query heads shares, on grouped-query models), `L9.attn` (the attention
output), `L8.mlp` (the MLP output), `L8.N1234` (a neuron), `L3.E5` (an expert), `L3.E5.N12` (a neuron
of an expert), each optionally `@pos` (`L9H9@-1`). Layers may be negative (`L-1H0`: the last block).
Each kind's form, point and selector is declared once, in hooked/interventions/kinds.py.
"""  # noqa: E501  (a Markdown table: its rows cannot wrap)

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.cache import ActivationCache
from hooked.hooks import HookFn, HookPoint
from hooked.interventions import kinds
from hooked.interventions.addresses import Component, components, parse_address  # noqa: F401  (part of hooked.interventions.ablate)
from hooked.interventions.positions import PerPrompt, Positions, as_ints, as_positions, per_prompt, positions_mask  # noqa: F401  (per_prompt, PerPrompt: part of hooked.interventions.ablate)
from hooked.interventions.row_blocks import RowsView
from hooked.layers import all_experts_removed

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Selector = int | Sequence[int] | Tensor | None  # an integer tensor too (hooked.interventions.positions.as_ints)
Method = Literal["zero", "mean", "resample", "constant"]


def __getattr__(name: str) -> str:
    if name == "ADDRESS_FORMS":  # the forms errors list (hooked.interventions.addresses.ADDRESS_FORMS)
        return kinds.address_forms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Ablation(abc.ABC):
    """What every ablation shares: the selectors, where they apply, and the write.

    Which axes each selector selects on is declared in hooked/interventions/kinds.py (`kinds.SELECTORS`); a
    selector a declared kind adds (`features=`) is kept in `more`, and reads like the others everywhere.
    """

    # As given; __post_init__ keeps heads, neurons and experts as tuples of ints, positions as a tuple or PerPrompt.
    heads: Selector = None
    neurons: Selector = None
    experts: Selector = None
    positions: Positions = None  # a set for every prompt, or one per prompt
    more: tuple[tuple[str, Selector], ...] = ()  # declared kinds' selectors, as given: (("features", 12),)

    def __post_init__(self):
        for name in ("heads", "neurons", "experts"):
            object.__setattr__(self, name, as_ints(getattr(self, name), name))
        object.__setattr__(self, "positions", as_positions(self.positions))
        if self.experts is not None and min(self.experts) < 0:
            raise ValueError(f"experts= takes expert ids 0..n_experts-1, got {list(self.experts)}")
        more = dict(self.more)
        unknown = [name for name in more if name not in kinds.SELECTORS or name in ("heads", "neurons", "experts")]
        if unknown:
            raise TypeError(
                f"{self.kind}() has no selector {unknown[0]}=; its selectors are {', '.join(kinds.SELECTORS)} and"
                " positions (a kind declared in hooked.interventions.kinds adds its own)"
            )
        given = {name: as_ints(values, name) for name, values in more.items()}
        ordered = tuple((name, given[name]) for name in kinds.SELECTORS if given.get(name) is not None)
        object.__setattr__(self, "more", ordered)

    @property
    def selectors(self) -> dict[str, tuple[int, ...]]:
        """The selectors given, but positions, in the order kinds.SELECTORS declares them: {"heads": (9,)}."""
        given = {"heads": self.heads, "neurons": self.neurons, "experts": self.experts, **dict(self.more)}
        return {name: given[name] for name in kinds.SELECTORS if given.get(name) is not None}

    def selector_fields(self) -> dict:
        """The keyword arguments that give another ablation class the same selection (patch.hooks)."""
        return selectors(self.heads, self.neurons, self.experts, self.positions, dict(self.more))

    # ----------------------------------------------------------------- the callback
    def __call__(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        selected = self.selection(activation, hook)
        if self.positions is not None and not bool(selected.any()):
            return activation  # no selected position in these columns (e.g. a decode step past them)
        replacement = self.replacement(activation, hook)
        if selected is None:
            return replacement.expand_as(activation).to(activation.dtype).clone()
        return torch.where(selected, replacement.to(activation.dtype), activation)

    @abc.abstractmethod
    def replacement(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        """The values written where the selection is true (broadcastable to the activation)."""

    # ----------------------------------------------------------------- selection
    def selected_axes(self, point: HookPoint | RowsView) -> dict[str, str]:
        """selector name -> the axis of `point` it selects on; a clear error when there is none."""
        found = {}
        for name in self.selectors:
            selector = kinds.SELECTORS[name]
            axis = next((a for a in selector.axes if a in point.axes), None)
            if axis is None:
                axes = " or ".join(selector.axes)
                raise ValueError(
                    f"{self!r}: {name}= selects on a {axes} axis, but {point.name or 'this point'} has axes"
                    f" ({' '.join(point.axes)}); {selector.where}"
                )
            found[name] = axis
        if found.get("experts") == "top_k" and not point.knows_slot_experts:
            raise ValueError(
                f"{self!r}: {point.name} does not know which expert each slot holds; select experts at"
                " mlp.hook_router_logits, hook_expert_weights, hook_expert_pre or hook_expert_post"
            )
        if self.positions is not None and not any(a in point.axes for a in kinds.POSITION_AXES):
            raise ValueError(
                f"{self!r}: positions= needs a pos axis, but {point.name} has axes ({' '.join(point.axes)})"
            )
        if found.get("neurons") == "d_expert_mlp" and self.experts is None:
            raise ValueError(
                f"{self!r} at {point.name}: a neuron of an expert needs experts= too (neuron j of expert e is in"
                " whichever slot holds e), e.g. zero(experts=5, neurons=12) or the address 'L3.E5.N12'"
            )
        return found

    def validate_hook_point(self, point: HookPoint, model: HookedTransformer | None = None) -> None:
        """Check the selectors against `point` (and index ranges against `model`); called at registration."""
        found = self.selected_axes(point)
        if model is None:
            return
        sizes = model.axis_sizes(point.name)
        selected = self.selectors
        for name, axis in found.items():
            size = sizes.get(kinds.SELECTORS[name].size_axis(axis))
            if size is None:
                continue
            bad = [i for i in selected[name] if not -size <= i < size]
            if bad:
                raise IndexError(
                    f"{self!r} at {point.name}: {name} {bad} out of range; this model has {size} ({axis}: "
                    f"0..{size - 1})"
                )
        self.validate_source(point, model)

    def validate_source(self, point: HookPoint, model: HookedTransformer) -> None:  # noqa: B027  (optional)
        """Check a reference or source against the point: nothing to check for `zero`; mean / resample override it."""

    def selection(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor | None:
        """A boolean mask broadcastable to the activation, True where the ablation writes (None: everywhere)."""
        axes = hook.axes
        mask = None

        def combine(part: Tensor) -> None:
            nonlocal mask
            mask = part if mask is None else mask & part

        selected = self.selectors
        for name, axis in self.selected_axes(hook).items():
            values = selected[name]
            if axis == "top_k":  # the slots whose expert is one of `experts`
                slot_experts = hook.slot_experts
                if slot_experts is None:
                    raise RuntimeError(f"{hook.name} does not know which expert each slot holds")
                wanted = torch.tensor(values, device=activation.device)
                in_slot = torch.isin(slot_experts, wanted)  # [batch pos top_k]
                combine(in_slot.view(*in_slot.shape, *([1] * (activation.ndim - 3))))
                continue
            dim = axes.index(axis)
            size = activation.shape[dim]
            along = torch.zeros(size, dtype=torch.bool, device=activation.device)
            along[[v % size for v in values]] = True
            shape = [1] * activation.ndim
            shape[dim] = size
            combine(along.view(shape))
        if self.positions is not None:
            dim = next(axes.index(a) for a in kinds.POSITION_AXES if a in axes)
            at = _positions_mask(self, hook)  # [batch pos]
            shape = [1] * activation.ndim
            shape[0], shape[dim] = at.shape
            combine(at.view(shape))
        return mask

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(self._repr_fields())})"

    def _repr_fields(self) -> list[str]:
        fields = [f"{name}={list(values)}" for name, values in self.selectors.items()]
        if isinstance(self.positions, PerPrompt):
            fields.append(f"positions={self.positions!r}")
        elif self.positions is not None:
            fields.append(f"positions={list(self.positions)}")
        return fields

    kind = "ablation"


def _positions_mask(ablation: Ablation, hook: HookPoint | RowsView) -> Tensor:
    """[batch pos] True at the real tokens whose position in their prompt is selected (a set, or one per row)."""
    rows = hook.rows
    return positions_mask(
        ablation.positions,
        rows.position_ids,
        rows.attention_mask,
        rows.prompt_lengths(),
        generating=rows.lengths is not None,
        what=f"{ablation!r} at {hook.name}",
        prompts=rows.prompts,
    )


# ----------------------------------------------------------------------------- zero
@dataclass(frozen=True, repr=False)
class Zero(Ablation):
    """Write zeros (at router logits: -inf, so the expert never wins a slot)."""

    kind = "zero"

    @staticmethod
    def routes(axes) -> bool:
        """Router logits: one score per expert (the last axis), where zeroing an expert means -inf. A point that
        holds each expert's write (`mlp.hook_expert_result`, [..., n_experts, d_model]) is zeroed plainly."""
        return bool(axes) and axes[-1] == "n_experts"

    def replacement(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        if self.routes(hook.axes) and self.experts is not None:
            return torch.tensor(float("-inf"), dtype=activation.dtype, device=activation.device)
        return torch.zeros((), dtype=activation.dtype, device=activation.device)

    def validate_hook_point(self, point: HookPoint, model: HookedTransformer | None = None) -> None:
        super().validate_hook_point(point, model)
        if model is not None and self.experts is not None and self.routes(point.axes):
            n_experts = model.axis_sizes()["n_experts"]
            if len({expert % n_experts for expert in self.experts}) == n_experts:
                raise ValueError(all_experts_removed(point.name, n_experts))


def selectors(
    heads: Selector, neurons: Selector, experts: Selector, positions: Positions, more: Mapping[str, Selector]
) -> dict:
    """An ablation's selector fields from a constructor's selectors (`zero`, `mean`, `resample`, `constant`,
    `patch.activation`): `more`, the selectors of kinds declared in hooked.interventions.kinds by keyword, kept as
    (name, selector) pairs so the ablation stays a hashable value."""
    return dict(heads=heads, neurons=neurons, experts=experts, positions=positions, more=tuple(more.items()))


def zero(
    heads: Selector = None,
    neurons: Selector = None,
    positions: Positions = None,
    experts: Selector = None,
    **more: Selector,
) -> Zero:
    """Zero-ablate the selected part of a hook point (all of it with no selector).

    `model.run_with_hooks(tokens, fwd_hooks=[("blocks.9.attn.hook_z", zero(heads=9))])`

    `positions`: an int or list selects those positions in every prompt; a 1-D tensor [batch] (or
    `per_prompt([...])`) one position per prompt. `more`: the selectors of kinds declared in
    hooked.interventions.kinds (`zero(features=12)`).
    """
    return Zero(**selectors(heads, neurons, experts, positions, more))


# ----------------------------------------------------------------------------- constant
@dataclass(frozen=True, repr=False)
class Constant(Ablation):
    """Write a value given once: a float, or a tensor that broadcasts against the point's trailing axes."""

    value: float | Tensor = 0.0
    kind = "constant"

    def __post_init__(self):
        super().__post_init__()
        value = self.value
        if isinstance(value, Tensor):
            if not value.dtype.is_floating_point:
                raise TypeError(f"constant() writes a float or a floating-point tensor, not a {value.dtype} tensor")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"constant() writes a float or a floating-point tensor, not {type(value).__name__}")
        else:
            object.__setattr__(self, "value", float(value))

    def replacement(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        return torch.as_tensor(self.value, dtype=activation.dtype, device=activation.device)

    def validate_hook_point(self, point: HookPoint, model: HookedTransformer | None = None) -> None:
        super().validate_hook_point(point, model)
        if model is None or not isinstance(self.value, Tensor):
            return
        sizes = model.axis_sizes(point.name)
        if self.value.ndim > len(point.axes):
            raise ValueError(
                f"{self!r} at {point.name}: the value has {self.value.ndim} axes, the point {len(point.axes)}"
                f" ({' '.join(point.axes)})"
            )
        trailing = point.axes[len(point.axes) - self.value.ndim :]
        for axis, size in zip(trailing, self.value.shape, strict=True):
            if size != 1 and sizes.get(axis, size) != size:
                raise ValueError(
                    f"{self!r} at {point.name}: the value's shape {list(self.value.shape)} does not broadcast against"
                    f" the point's axes ({' '.join(point.axes)}): {axis} is {sizes[axis]} there"
                )

    def _repr_fields(self) -> list[str]:
        shown = f"<tensor {list(self.value.shape)}>" if isinstance(self.value, Tensor) else repr(self.value)
        return [shown, *super()._repr_fields()]


def constant(
    value: float | Tensor,
    heads: Selector = None,
    neurons: Selector = None,
    positions: Positions = None,
    experts: Selector = None,
    **more: Selector,
) -> Constant:
    """Write `value` at the selected part of a hook point: hold a dictionary's feature at a value on every
    position (steering), clamp a neuron, write a direction into the residual stream.

    `with model.saes([sae]): model.run_with_hooks(tokens, fwd_hooks=ablate.hooks(model, "L3.resid_post.F12",
    "constant", value=8.0))` holds feature 12 at 8.0; `constant(8.0, features=12)` is that callback.

    `value` is a float, or a tensor that broadcasts against the point's trailing axes (a [d_model] vector at
    `hook_resid_post`). Selectors as `zero`'s; under a KV cache each generated token is written too.
    """
    return Constant(**selectors(heads, neurons, experts, positions, more), value=value)


# ----------------------------------------------------------------------------- references
Reference = ActivationCache | Tensor | str | Sequence[str]


def is_tokens(reference) -> bool:
    return isinstance(reference, (str, list, tuple)) or (
        isinstance(reference, Tensor) and not reference.dtype.is_floating_point and not reference.is_complex()
    )


@dataclass(frozen=True, repr=False)
class _FromReference(Ablation):
    """An ablation that reads another run's activations at the same hook point."""

    reference: object = None  # an ActivationCache, a tensor of activations, or tokens (with model=)
    model: object = None  # runs token references once, without hooks
    _runs: dict = field(default_factory=dict, compare=False)  # hook name -> (activations, Rows-like info)

    def reference_at(self, point: HookPoint | RowsView) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The reference's activation at `point`, with its position ids and mask (None: unknown / no padding)."""
        reference = self.reference
        if isinstance(reference, ActivationCache):
            if point.name not in reference.cache_dict:
                raise KeyError(
                    f"{self!r}: the reference cache has no {point.name}; cache it"
                    f" (run_with_cache(..., names_filter=[{point.name!r}]) or no names_filter)"
                )
            if not reference.has_batch_dim:
                raise ValueError(
                    f"{self!r}: the reference cache was made with remove_batch_dim=True; keep the batch axis"
                )
            return reference.cache_dict[point.name], reference.position_ids, reference.attention_mask
        if is_tokens(reference):
            if point.name not in self._runs:
                self._runs[point.name] = self._run_tokens(point)
            return self._runs[point.name]
        if isinstance(reference, Tensor):
            return reference, None, None
        raise TypeError(
            f"{self.kind}() takes an ActivationCache, a tensor of activations or tokens, not {type(reference).__name__}"
        )

    def _run_tokens(self, point: HookPoint | RowsView):
        model = self.model
        if model is None:
            raise ValueError(
                f"{self.kind}() was given tokens but no model to run them: pass model=, or a cache"
                " (_, cache = model.run_with_cache(tokens))"
            )
        with torch.no_grad(), model.hooks_suspended():
            _, cache = model.run_with_cache(self.reference, names_filter=[point.name])
        return cache.cache_dict[point.name], cache.position_ids, cache.attention_mask

    def validate_source(self, point: HookPoint, model: HookedTransformer) -> None:
        reference = self.reference
        if isinstance(reference, ActivationCache) and point.name in reference.cache_dict:
            sizes = model.axis_sizes(point.name)
            cached = reference.cache_dict[point.name]
            expected = [sizes.get(axis) for axis in point.axes]
            for axis, want, got in zip(point.axes, expected, cached.shape, strict=True):
                if want is not None and want != got:
                    raise ValueError(
                        f"{self!r}: the reference's {point.name} has {axis} {got}, but this model's has {want};"
                        " the reference comes from another model (or another width)"
                    )
        elif isinstance(reference, ActivationCache):
            self.reference_at(point)  # raises: not cached


# ----------------------------------------------------------------------------- mean
@dataclass(frozen=True, repr=False)
class Mean(_FromReference):
    """Write the reference set's mean activation, over real tokens only (pooled, or per position)."""

    per_position: bool = False
    kind = "mean"

    def replacement(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        key = (hook.name, activation.device, activation.dtype)
        if key not in self._runs:
            self._runs[key] = self._mean(hook).to(device=activation.device, dtype=activation.dtype)
        mean = self._runs[key]
        if "key_pos" in hook.axes:
            if mean.shape[-1] != activation.shape[-1]:
                raise ValueError(
                    f"{self!r} at {hook.name}: the reference has {mean.shape[-1]} key positions, the input"
                    f" {activation.shape[-1]}; a mean attention pattern needs prompts of the same length"
                )
            return mean[None]
        if not self.per_position:
            return mean
        position_ids = hook.position_ids  # [batch pos]
        if int(position_ids.max()) >= mean.shape[0]:
            raise ValueError(
                f"{self!r} at {hook.name}: the input reaches position {int(position_ids.max())}, but the"
                f" reference prompts are at most {mean.shape[0]} tokens long; give longer reference prompts or"
                " per_position=False"
            )
        return mean[position_ids]  # [batch pos ...]

    def _mean(self, hook: HookPoint | RowsView) -> Tensor:
        """Mean over real tokens: without batch and pos axes (pooled) or [position ...] (per position)."""
        acts, position_ids, mask = self.reference_at(hook)
        acts = acts.float()
        if acts.ndim == len(hook.axes) - 2 and "key_pos" not in hook.axes:
            return acts  # already a mean: no batch, no pos axis
        if acts.ndim != len(hook.axes):
            raise ValueError(
                f"{self!r}: the reference for {hook.name} has shape {tuple(acts.shape)}, expected axes "
                f"({' '.join(hook.axes)})"
            )
        if "key_pos" in hook.axes:  # a pattern: average over prompts only, which must be unpadded
            if mask is not None:
                raise ValueError(f"{self!r} at {hook.name}: a mean attention pattern needs a reference without padding")
            return acts.mean(0)
        pos_dim = hook.axes.index("pos")
        acts = acts.movedim(pos_dim, 1)  # [batch pos ...]
        batch, pos = acts.shape[:2]
        real = torch.ones(batch, pos, dtype=torch.bool, device=acts.device) if mask is None else mask.to(acts.device)
        if position_ids is None:
            position_ids = torch.arange(pos, device=acts.device).expand(batch, pos)
        weights = real.float().view(batch, pos, *([1] * (acts.ndim - 2)))
        if not self.per_position:
            mean = (acts * weights).sum((0, 1)) / weights.sum()
            return mean
        n_positions = int(position_ids[real].max()) + 1
        sums = torch.zeros((n_positions, *acts.shape[2:]), dtype=acts.dtype, device=acts.device)
        counts = torch.zeros(n_positions, dtype=acts.dtype, device=acts.device)
        sums.index_add_(0, position_ids[real], acts[real])
        counts.index_add_(0, position_ids[real], torch.ones_like(position_ids[real], dtype=acts.dtype))
        mean = sums / counts.view(-1, *([1] * (acts.ndim - 2)))
        return mean.movedim(1, pos_dim) if pos_dim != 1 else mean

    def _repr_fields(self) -> list[str]:
        fields = super()._repr_fields()
        return fields + (["per_position=True"] if self.per_position else [])


def mean(
    reference: Reference,
    heads: Selector = None,
    neurons: Selector = None,
    positions: Positions = None,
    experts: Selector = None,
    *,
    per_position: bool = False,
    model: HookedTransformer | None = None,
    **more: Selector,
) -> Mean:
    """Mean-ablate: write the reference set's mean activation (over real tokens) at the selection.

    `reference` is an ActivationCache (`_, ref = model.run_with_cache(prompts)`), a tensor of
    activations with the point's axes (or an already-averaged one without batch and pos), or tokens /
    prompts run once without hooks (pass `model=`). Pooled over prompts and positions, or per
    position in the prompt with `per_position=True`. Selectors as `zero`'s.
    """
    return Mean(
        **selectors(heads, neurons, experts, positions, more),
        reference=reference,
        model=model,
        per_position=per_position,
    )


# ----------------------------------------------------------------------------- resample
@dataclass(frozen=True, repr=False)
class Resample(_FromReference):
    """Write a paired source's activation at the same place, or another row's (seeded derangement)."""

    seed: int | None = None
    kind = "resample"

    def replacement(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        if self.reference is None:
            return activation[self._derangement(activation, hook)]
        whole, _, whole_mask = self.reference_at(hook)
        rows = hook.rows
        if rows.prompts is not None:  # an engine's request: its prompt's row of the source, without its padding
            whole, whole_mask = _prompts_of(self, whole, whole_mask, rows.prompts, hook)
        source, source_mask = _columns_of(self, whole, whole_mask, activation, hook, rows)
        if source.shape != activation.shape:
            raise ValueError(
                f"{self!r} at {hook.name}: the source has shape {tuple(source.shape)} but the input has"
                f" {tuple(activation.shape)} ({' '.join(hook.axes)}); it was recorded from another model or hook point"
            )
        if not _same_mask(source_mask, rows.attention_mask):
            raise ValueError(f"{self!r} at {hook.name}: {_prompts_differ(whole, whole_mask, hook)}")
        return source.to(device=activation.device)

    def _derangement(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        batch = activation.shape[0]
        if batch < 2:
            raise ValueError(
                f"{self!r} at {hook.name}: resampling within the batch needs at least 2 prompts, got {batch}"
            )
        if hook.attention_mask is not None:
            raise ValueError(
                f"{self!r} at {hook.name}: resampling within a padded batch would move values across positions;"
                " use prompts of the same token length, or a paired source"
            )
        return derangement(batch, self.seed)

    def _repr_fields(self) -> list[str]:
        source = [f"seed={self.seed}"] if self.reference is None else [f"source={_describe(self.reference)}"]
        return source + super()._repr_fields()


def _columns_of(
    ablation, source: Tensor, source_mask: Tensor | None, activation: Tensor, hook: HookPoint | RowsView, rows
):
    """The source's columns that the running call computes: all of them for a plain forward, columns
    start.. for a generation step on a KV cache (keys too: the first L of them)."""
    dim = next((hook.axes.index(a) for a in kinds.POSITION_AXES if a in hook.axes), None)
    start = rows.start
    if dim is None or (start == 0 and source.shape == activation.shape):
        return source, source_mask
    generating = rows.lengths is not None  # then the source holds the prompt, this call a part of it or past it
    n = activation.shape[dim]
    same_prompts = source.ndim == activation.ndim and source.shape[0] == activation.shape[0]
    if not same_prompts or (not generating and source.shape[dim] != n):
        raise ValueError(f"{ablation!r} at {hook.name}: {_prompts_differ(source, source_mask, hook)}")
    if not generating:
        return source, source_mask  # same prompts, other widths: the caller's shape check names them
    if source.shape[dim] < start + n:
        raise ValueError(
            f"{ablation!r} at {hook.name}: this call computes columns {start}..{start + n - 1} (a generation step), but"
            f" the source has only {source.shape[dim] if source.ndim == activation.ndim else '?'}; restrict the"
            " ablation to the prompt's positions with positions=[...]"
        )
    source = source.narrow(dim, start, n)
    if "key_pos" in hook.axes:
        source = source.narrow(hook.axes.index("key_pos"), 0, activation.shape[hook.axes.index("key_pos")])
    return source, None if source_mask is None else source_mask[:, start : start + n]


def _prompts_of(ablation, source: Tensor, source_mask: Tensor | None, prompts: Tensor, hook) -> tuple[Tensor, None]:
    """The source's rows for `prompts` (one request's prompt, as an engine runs it: unpadded), padding columns
    dropped: [1 pos ...] with no mask."""
    if prompts.numel() != 1:
        raise ValueError(f"{ablation!r} at {hook.name}: an engine request runs one prompt, not {prompts.numel()}")
    prompt = int(prompts[0])
    if prompt >= source.shape[0]:
        raise ValueError(
            f"{ablation!r} at {hook.name}: the source has {source.shape[0]} prompts but this call runs prompt {prompt};"
            " give the source for the same prompts"
        )
    row = source[prompt : prompt + 1]
    if source_mask is None:
        return row, None
    real = source_mask[prompt].nonzero()[:, 0].to(row.device)
    for axis in (i for i, a in enumerate(hook.axes) if a in kinds.POSITION_AXES):
        row = row.index_select(axis, real)
    return row, None


def _prompts_differ(source: Tensor, source_mask: Tensor | None, hook: HookPoint | RowsView) -> str:
    """How the source's prompts differ from the running ones (count, and the token length of each), and the fix."""
    dim = next((hook.axes.index(a) for a in kinds.POSITION_AXES if a in hook.axes), None)
    width = source.shape[dim] if dim is not None and source.ndim > dim else "?"
    source_lengths = [width] * source.shape[0] if source_mask is None else source_mask.sum(-1).tolist()
    run_lengths = hook.rows.prompt_lengths()[:, 0].tolist()

    def listed(lengths: list) -> str:  # "3 prompts of 11 tokens", "3 prompts of [9, 11, 10] tokens"
        shown = (
            str(lengths[0])
            if len(set(lengths)) == 1
            else str(lengths[:16])[:-1] + (", ...]" if len(lengths) > 16 else "]")
        )
        return f"{len(lengths)} prompt{'s' * (len(lengths) != 1)} of {shown} tokens"

    return (
        f"the source holds {listed(source_lengths)}, but this run has {listed(run_lengths)}; give a source of as"
        " many prompts as the run, each as long as the prompt it replaces (source prompt i replaces prompt i)"
    )


def _same_mask(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether two [batch pos] real-token masks agree (None: every token real)."""
    if a is None or b is None:
        other = b if a is None else a
        return other is None or bool(other.all())
    return torch.equal(a.to(b.device), b)


def derangement(n: int, seed: int) -> Tensor:
    """A permutation of range(n) that moves every element, drawn from a generator seeded `seed`."""
    generator = torch.Generator().manual_seed(seed)
    while True:  # rejection: about e draws on average
        permutation = torch.randperm(n, generator=generator)
        if not bool((permutation == torch.arange(n)).any()):
            return permutation


def resample(
    source: Reference | None = None,
    heads: Selector = None,
    neurons: Selector = None,
    positions: Positions = None,
    experts: Selector = None,
    *,
    seed: int | None = None,
    model: HookedTransformer | None = None,
    **more: Selector,
) -> Resample:
    """Resample-ablate: write a paired source's activation at the same place, or (with `seed=`) another row's.

    `source` is an ActivationCache of prompts of the same count and token length as the input (e.g. the
    corrupt prompts of a task), or those prompts / tokens with `model=`. With `seed=` and no source,
    each row takes the value of another row of the same batch (a seeded derangement). Selectors as `zero`'s.
    """
    if (source is None) == (seed is None):
        raise ValueError(
            "resample() takes a source (a cache or tokens of the same shape) or seed=, exactly one of them"
        )
    return Resample(**selectors(heads, neurons, experts, positions, more), reference=source, model=model, seed=seed)


def _describe(reference) -> str:
    if isinstance(reference, ActivationCache):
        batch = next(iter(reference.values())).shape[0] if len(reference) else 0
        return f"<cache of {batch} prompts>"
    if isinstance(reference, Tensor):
        return f"<tensor {list(reference.shape)}>"
    if isinstance(reference, str):
        return repr(reference[:30])
    return f"<{len(reference)} prompts>"


def hooks(
    model: HookedTransformer,
    addresses: str | Sequence[str],
    method: Method = "zero",
    *,
    source: Reference | None = None,
    reference: Reference | None = None,
    seed: int | None = None,
    per_position: bool = False,
    positions: Positions = None,
    value: float | Tensor | None = None,
) -> list[tuple[str, HookFn]]:
    """(hook name, callback) pairs that ablate the components at `addresses` with one method.

    `model.run_with_hooks(tokens, fwd_hooks=ablate.hooks(model, ["L9H9", "L10H0"], "resample", source=corrupt))`

    Addresses at the same point and position share one callback (`zero(heads=[6, 9])`). Token
    references and sources are run once here, for every point at once. Every selector is checked
    against the model before this returns. `positions=` applies to every address (as the selector:
    `task.positions["S2"]` is one position per prompt); an address may instead name its own (`L9H9@-1`).
    `method="constant"` writes `value=` (`ablate.hooks(model, "L3.resid_post.F12", "constant", value=8.0)`).
    """
    if method not in ("zero", "mean", "resample", "constant"):
        raise ValueError(f"method must be 'zero', 'mean', 'resample' or 'constant', not {method!r}")
    if (method == "constant") != (value is not None):
        raise ValueError(
            "method='constant' needs value= (what to write, e.g. value=8.0), and value= belongs to it alone"
            if method == "constant"
            else f"value= belongs to method='constant', not {method!r}"
        )
    if method != "mean" and (reference is not None or per_position):
        raise ValueError(f"reference= and per_position= belong to method='mean', not {method!r}")
    if method != "resample" and (source is not None or seed is not None):
        raise ValueError(f"source= and seed= belong to method='resample', not {method!r}")
    if method == "mean" and reference is None:
        raise ValueError("method='mean' needs reference= (a cache, activations, or prompts to average over)")
    addresses = [addresses] if isinstance(addresses, str) else list(addresses)
    if not addresses:
        raise ValueError("no component addresses given")
    positions = as_positions(positions)
    groups: dict[tuple, dict[str, list[int]]] = {}
    for address in addresses:
        component = parse_address(model, address)
        at = component.selectors.get("positions")
        if at is not None and positions is not None:
            raise ValueError(
                f"{address!r} names its position and positions={positions!r} was given too; use one of them"
            )
        # A component of two selectors (a neuron of an expert: experts x neurons) is their product: merging
        # two such would select the product of their unions, components neither address names.
        own = address if len(set(component.selectors) - {"positions"}) > 1 else None
        key = (component.hook_name, positions if at is None else at, own)
        merged = groups.setdefault(key, {})
        for name, values in component.selectors.items():
            if name != "positions":
                merged.setdefault(name, [])
                merged[name] += [v for v in values if v not in merged[name]]
    names = sorted({name for name, _, _ in groups})
    given = reference if method == "mean" else source
    if given is not None and is_tokens(given):  # run once, for every point at once
        with torch.no_grad(), model.hooks_suspended():
            _, given = model.run_with_cache(given, names_filter=names)
    result = []
    for (name, positions, _), selectors in groups.items():
        selectors = {key: tuple(values) for key, values in selectors.items()}
        if method == "zero":
            callback = zero(**selectors, positions=positions)
        elif method == "constant":
            callback = constant(value, **selectors, positions=positions)
        elif method == "mean":
            callback = mean(given, **selectors, positions=positions, per_position=per_position, model=model)
        else:
            callback = resample(given, **selectors, positions=positions, seed=seed, model=model)
        callback.validate_hook_point(model.hook_dict[name], model)
        result.append((name, callback))
    return result


__all__ = [
    "Ablation",
    "Component",
    "Constant",
    "Mean",
    "PerPrompt",
    "Resample",
    "Zero",
    "components",
    "constant",
    "derangement",
    "hooks",
    "mean",
    "parse_address",
    "per_prompt",
    "resample",
    "zero",
]
