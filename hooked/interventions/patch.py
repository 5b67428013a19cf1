"""Activation patching and attribution patching: which components carry the difference between two inputs.

    _, clean_cache = model.run_with_cache(task.clean)
    model.run_with_hooks(corrupt, fwd_hooks=[("blocks.9.attn.hook_z", patch.activation(clean_cache, heads=9))])
    heads = patch.head_sweep(model, corrupt, clean_cache, metric)          # "L{layer}H{head}" variants
    values = patch.head_sweep(model, corrupt, clean_cache, metric, hook="v")  # "L{layer}KV{g}" on grouped models
    resid = patch.resid_sweep(model, corrupt, clean_cache, metric)         # "L{layer}@{position}" variants
    estimate = patch.attribution(model, corrupt, clean_cache, metric)      # the same names, one backward pass

**Activation patching** (a sufficiency test) runs the *corrupt* input and writes the *clean* run's
activation into one component: if the metric recovers, that component carries what the clean input
changes. It is resampling from a paired source, so a patch is `hooked.interventions.ablate.Resample` under another
name (`patch(source=<cache of 8 prompts>, heads=[9])`), with the same selectors, checks and padding
rules. The sweeps run every layer x head (or layer x position) patch through `hooked.sweep`: the
corrupt run is the base, computed once, and each patch joins the batch at its first block.

**Attribution patching** replaces the sweep by its first-order Taylor estimate around the corrupt
run: for a patch that writes `clean` over `corrupt` at the elements `S` of an activation `a`,

    metric(patched) - metric(corrupt)  ~=  sum over S of  d metric / d a  *  (clean - corrupt)

One clean forward (for `clean`) and one corrupt forward + backward give the gradient at every hook
point at once, so the estimate of every head costs about one patch. `S` is exactly the selection of
the sweep's patch of the same name (the same `Patch` object builds it), so the two tables line up
name for name. Prompts are independent rows of the batch, so the gradient of the *sum* of the
per-prompt metric gives each prompt its own gradient, and the estimate is per prompt.

Positions are positions in each prompt (as everywhere in `hooked.interventions.ablate`), not padded columns. By
default a layer x position grid covers every position of an unpadded batch (0 .. pos-1), and, for a
padded batch (left or right), the positions every prompt has, counted from the end (-n .. -1, n the
shortest prompt's length), so the last one is always each prompt's last token. One position per prompt (a
1-D tensor such as `task.positions["S2"]`, or `ablate.per_prompt([...])`) works wherever a patch takes
`positions=`; a layer x position grid takes them by name, `positions={"S1": ..., "S2": ..., "END": ...}`
(variants `L{layer}@S1`, ...).

Sources: Meng et al. 2022, "Locating and Editing Factual Associations in GPT" (causal tracing);
Wang et al. 2022, "Interpretability in the Wild" (path and activation patching on IOI); Nanda 2023,
"Attribution Patching: Activation Patching At Industrial Scale"; Syed, Rager and Conmy 2023,
"Attribution Patching Outperforms Automated Circuit Discovery"; Heimersheim and Nanda 2024, "How to
use and interpret activation patching". See docs/ablation.md for when to trust the estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from hooked.cache import ActivationCache, act_name
from hooked.hooks import HookFn, HookPoint, evaluating, needs_gradients
from hooked.interventions import ablate
from hooked.interventions.ablate import Reference, Resample, Selector, is_tokens
from hooked.interventions.addresses import head_names
from hooked.interventions.metrics import check_prompts
from hooked.interventions.positions import PerPrompt, Positions, as_ints, as_positions, positions_record
from hooked.interventions.results import SweepResult, variant_names
from hooked.interventions.row_blocks import registered_hooks
from hooked.interventions.sweeps import PlannedVariant, metric_values, plan_variants, sweep, sweep_provenance

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

HeadHook = Literal["z", "q", "k", "v", "pattern", "result"]
ResidHook = Literal["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"]
HEAD_HOOKS = ("z", "q", "k", "v", "pattern", "result")
RESID_HOOKS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
Variants = dict[str, list[tuple[str, "Patch"]]]


# ----------------------------------------------------------------------------- one patch
@dataclass(frozen=True, repr=False)
class Patch(Resample):
    """Write the source (clean) run's activation at the selection: a resample from a paired source."""

    kind = "patch"

    def __post_init__(self):
        super().__post_init__()
        if self.reference is None or self.seed is not None:
            raise ValueError("a patch takes a source (the clean run's cache, or its prompts with model=), not seed=")


def activation(
    source: Reference,
    heads: Selector = None,
    neurons: Selector = None,
    positions: Positions = None,
    experts: Selector = None,
    *,
    model: HookedTransformer | None = None,
    **more: Selector,
) -> Patch:
    """Patch: write `source`'s activation (same prompt, same place) over the running one, at the selection.

    `model.run_with_hooks(corrupt, fwd_hooks=[("blocks.9.attn.hook_z", patch.activation(clean_cache, heads=9))])`

    `source` is an ActivationCache of prompts of the same count and token lengths as the input (the
    clean prompts of a task), or those prompts / tokens with `model=`. Selectors as in `hooked.interventions.ablate`.
    """
    return Patch(
        heads=heads,
        neurons=neurons,
        experts=experts,
        positions=positions,
        more=tuple(more.items()),
        reference=source,
        model=model,
    )


def hooks(
    model: HookedTransformer, addresses: str | Sequence[str], source: Reference, *, positions: Positions = None
) -> list[tuple[str, HookFn]]:
    """(hook name, patch) pairs that patch the components at `addresses` (`ablate.hooks`' forms) from `source`.

    `model.run_with_hooks(corrupt, fwd_hooks=patch.hooks(model, ["L9H9", "L10H0@-1"], clean_cache))`

    Prompts or tokens as `source` are run once here, for every point at once. `positions=` applies to
    every address without its own `@pos` (`task.positions["S2"]`: one position per prompt).
    """
    pairs = ablate.hooks(model, addresses, "resample", source=source, positions=positions)
    return [(name, Patch(**fn.selector_fields(), reference=fn.reference, model=model)) for name, fn in pairs]


# ----------------------------------------------------------------------------- sweeps
def head_sweep(
    model: HookedTransformer,
    corrupt,
    clean: Reference,
    metric: Callable,
    hook: HeadHook = "z",
    *,
    positions: Positions = None,
    attention_mask: Tensor | None = None,
    **sweep_kwargs,
) -> SweepResult:
    """Patch each head alone, clean into corrupt: one variant `L{layer}H{head}` per head, in one batched sweep.

    `patch.head_sweep(model, corrupt_tokens, clean_cache, metric).heatmap("heads.png")`

    `hook` is the point patched: z (default), q, k, v, pattern or result. On a grouped-query model k and
    v have one slot per key/value head, and their variants are `L{layer}KV{g}` (see hooked/interventions/addresses.py):
    `L0KV1` patches what query heads 2 and 3 of 4 share, never to be read as head 1. `positions`
    restricts each patch to those positions in the prompt (default: all; a 1-D tensor such as
    `task.positions["S2"]`: one position per prompt). `clean` is a cache of
    the clean prompts, or the prompts themselves (run once). Other keyword arguments go to
    `hooked.sweep` (`max_rows`, `progress`, `task`, ...). The result's `change` is
    metric(patched) - metric(corrupt).
    """
    tokens, key_valid = _prompts(model, corrupt, attention_mask)
    source = _source(model, clean, _names(model, hook, HEAD_HOOKS), tokens, key_valid)
    variants = _head_variants(model, hook, source, positions)
    result = sweep(model, tokens, variants, metric, attention_mask=key_valid, **sweep_kwargs)
    result.provenance["patch"] = {
        "method": "activation patching",
        "hook": hook,
        "positions": positions_record(positions),
    }
    return result


def resid_sweep(
    model: HookedTransformer,
    corrupt,
    clean: Reference,
    metric: Callable,
    hook: ResidHook = "resid_pre",
    *,
    positions: Selector | Mapping[str, Positions] = None,
    attention_mask: Tensor | None = None,
    **sweep_kwargs,
) -> SweepResult:
    """Patch one layer at one position at a time, clean into corrupt: variants `L{layer}@{position}`.

    `patch.resid_sweep(model, corrupt_tokens, clean_cache, metric, hook="resid_pre").heatmap("resid.png")`

    `hook` is resid_pre (default), resid_mid, resid_post, attn_out or mlp_out. `positions` are
    positions in the prompt; by default every position of an unpadded batch (0 .. pos-1), or for a
    padded one (left or right) the positions every prompt has, counted from the end (-n .. -1). Positions that
    differ per prompt go by name: `positions={"S2": task.positions["S2"], "END": task.positions["END"]}`
    gives variants `L{layer}@S2`, `L{layer}@END`. Other keyword arguments go to `hooked.sweep`.
    """
    tokens, key_valid = _prompts(model, corrupt, attention_mask)
    source = _source(model, clean, _names(model, hook, RESID_HOOKS), tokens, key_valid)
    positions = _grid_positions(tokens, key_valid, positions)
    variants = _resid_variants(model, hook, source, positions)
    result = sweep(model, tokens, variants, metric, attention_mask=key_valid, **sweep_kwargs)
    result.provenance["patch"] = {"method": "activation patching", "hook": hook, "positions": _grid_record(positions)}
    return result


# ----------------------------------------------------------------------------- attribution
def attribution(
    model: HookedTransformer,
    corrupt,
    clean: Reference,
    metric: Callable,
    hook: HeadHook | ResidHook = "z",
    *,
    positions: Positions | Mapping[str, Positions] = None,
    attention_mask: Tensor | None = None,
    task=None,
) -> SweepResult:
    """Attribution patching: the first-order estimate of every patch of the matching sweep, in one backward pass.

    `patch.attribution(model, corrupt_tokens, clean_cache, metric, hook="z").table()`

    For a head hook (z, q, k, v, pattern, result) the variants are `L{layer}H{head}` (`L{layer}KV{g}` for
    the k and v of a grouped-query model; as `head_sweep`, summed over the head's elements at
    `positions`, default all); for a residual hook (resid_pre, resid_mid, resid_post, attn_out,
    mlp_out) they are `L{layer}@{position}` (as `resid_sweep`). Each
    value is `metric(corrupt) + grad . (clean - corrupt)` over the elements that variant's patch
    writes, per prompt: `base` is the corrupt run, so `result.change` is the estimate of
    metric(patched) - metric(corrupt) and compares directly with the sweep's.

    The metric is called on the full logits of the corrupt run and must be differentiable. A metric
    that compares with the base run (KL divergence) has zero gradient there, so it is refused. The
    model runs in eval mode under `torch.enable_grad()`; parameter `.grad`s are not touched, and no
    hook stays registered, also when the metric raises.
    """
    _check_can_attribute(model, hook, metric)
    tokens, key_valid = _prompts(model, corrupt, attention_mask)
    check_prompts(metric, model, tokens, key_valid, "patch.attribution")
    source = _source(model, clean, _names(model, hook, HEAD_HOOKS + RESID_HOOKS), tokens, key_valid)
    if hook in HEAD_HOOKS:
        variants = _head_variants(model, hook, source, positions)
    else:
        variants = _resid_variants(model, hook, source, _grid_positions(tokens, key_valid, positions))
    planned = plan_variants(model, variants, tokens.shape)  # checks every selector before the forward runs

    # float32 at least (float64 for a float64 model): the estimate sums many small products
    points = _PatchedPoints(planned, torch.promote_types(model.dtype, torch.float32))
    base, gradients = _corrupt_gradients(model, tokens, key_valid, metric, points)
    estimates = points.estimates(gradients, [v.name for v in planned], tokens)
    infinite = ~torch.isfinite(estimates).all(1)
    if bool(infinite.any()):
        names = [planned[i].name for i in infinite.nonzero().flatten().tolist()]
        raise ValueError(
            f"the attribution estimate of {len(names)} variant{'s' if len(names) > 1 else ''} is NaN or infinite"
            f" ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): the metric's value is finite but its"
            " gradient at the corrupt run is not (a norm or a square root at 0, a NaN in the backward);"
            " differentiate a metric whose gradient is defined there, or run the sweep"
        )
    provenance = sweep_provenance(model, planned, metric, task, tokens)
    provenance["patch"] = {"method": "attribution patching (gradient x (clean - corrupt))", "hook": hook}
    return SweepResult(
        variants=[v.name for v in planned],
        values=base[None] + estimates.float().cpu(),
        base=base,
        metric=getattr(metric, "name", getattr(metric, "__name__", type(metric).__name__)),
        provenance=provenance,
    )


def _check_can_attribute(model: HookedTransformer, hook: str, metric: Callable) -> None:
    """Refuse, before anything runs, what attribution cannot estimate or would estimate wrong."""
    if hook not in HEAD_HOOKS + RESID_HOOKS:
        raise ValueError(f"attribution patches a head hook {HEAD_HOOKS} or a residual hook {RESID_HOOKS}, not {hook!r}")
    if getattr(metric, "needs_base", False) is True:
        raise ValueError(
            f"{metric!r} compares with the base run, and attribution is a gradient at the base (the corrupt"
            " run), where such a metric is at its minimum: every estimate would be 0. Use a metric that"
            " reads the answers (logit_diff, log_prob, ...) or run the activation-patching sweep"
        )
    needs_gradients(model, "attribution")
    # As hooked.sweep: the estimate must line up with the sweep's unhooked corrupt run. A spliced dictionary, which a
    # sweep runs with, is refused too: its error term passes no gradient, so the estimate would not be the sweep's.
    registered_hooks(model, "patch.attribution", part_of_model=False)


class _PatchedPoints:
    """The hook at every point some variant patches, during the corrupt run: it keeps the activation (to take
    the gradient at), `clean - corrupt` there, and the elements each variant's patch writes; then it turns
    the gradients into each variant's estimate."""

    def __init__(self, planned: list[PlannedVariant], precision: torch.dtype):
        self.by_point: dict[str, list[tuple[str, Patch]]] = {}  # point -> (variant, its patch there)
        for variant in planned:
            for name, fn in variant.hooks:
                self.by_point.setdefault(name, []).append((variant.name, fn))
        self.precision = precision  # of the deltas and the estimates
        self.activations: dict[str, Tensor] = {}
        self.deltas: dict[str, Tensor] = {}  # clean - corrupt, per point
        self.selections: dict[tuple[str, str], Tensor | None] = {}  # (variant, point) -> elements its patch writes

    def __call__(self, activation: Tensor, point: HookPoint) -> Tensor:
        if not activation.requires_grad:  # frozen parameters: nothing upstream needs a gradient
            activation = activation.detach().requires_grad_(True)
        self.activations[point.name] = activation
        with torch.no_grad():
            patches = self.by_point[point.name]  # one source for all: any patch at the point reads it
            clean = patches[0][1].replacement(activation, point).to(self.precision)
            self.deltas[point.name] = clean - activation.to(self.precision)
            for variant_name, fn in patches:
                self.selections[variant_name, point.name] = fn.selection(activation, point)
        return activation

    def estimates(self, gradients: dict[str, Tensor | None], variants: list[str], tokens: Tensor) -> Tensor:
        """[variant batch]: each variant's `sum over its elements of grad * (clean - corrupt)`, per prompt."""
        estimates = torch.zeros(len(variants), tokens.shape[0], dtype=self.precision, device=tokens.device)
        index = {name: i for i, name in enumerate(variants)}
        for name, grad in gradients.items():
            if grad is None:  # the metric does not read this point at all: every estimate there is 0
                continue
            product = grad.to(self.precision) * self.deltas.pop(name)  # [batch ...]
            for variant_name, _ in self.by_point[name]:
                selected = self.selections[variant_name, name]
                written = product if selected is None else product * selected
                estimates[index[variant_name]] += written.flatten(1).sum(1)
        return estimates


def _corrupt_gradients(
    model: HookedTransformer, tokens: Tensor, key_valid: Tensor | None, metric: Callable, points: _PatchedPoints
) -> tuple[Tensor, dict[str, Tensor | None]]:
    """The corrupt run: the metric per prompt (float32, on the CPU), and the gradient of its sum at every
    patched point, in forward order (None where the metric does not read the point)."""
    with (
        evaluating(model),
        torch.enable_grad(),
        model.hooks(fwd_hooks=[(name, points) for name in points.by_point]),
    ):
        logits = model(tokens, attention_mask=_explicit_mask(tokens, key_valid))
        values = _evaluate(metric, logits, key_valid)
        names = list(points.activations)
        # autograd.grad, not .backward(): the parameters' .grad stay as the caller left them
        grads = torch.autograd.grad(values.sum(), [points.activations[name] for name in names], allow_unused=True)
    return values.detach().float().cpu(), dict(zip(names, grads, strict=True))


# ----------------------------------------------------------------------------- shared pieces
def _names(model: HookedTransformer, hook: str, allowed: tuple[str, ...]) -> list[str]:
    """The hook name of `hook` in every block."""
    if hook not in allowed:
        raise ValueError(f"hook must be one of {', '.join(allowed)}, not {hook!r}")
    return [model._check_name(act_name(hook, layer)) for layer in range(model.cfg.n_layers)]


def _head_variants(model: HookedTransformer, hook: str, source: ActivationCache, positions: Positions) -> Variants:
    variants: Variants = {}
    positions = as_positions(positions)
    for layer, name in enumerate(_names(model, hook, HEAD_HOOKS)):
        axis = "kv_head_index" if "kv_head_index" in model.hook_dict[name].axes else "head_index"
        for head, head_name in enumerate(head_names(model, layer, axis)):  # L0KV1 for a grouped k/v head
            variants[head_name] = [(name, Patch(heads=head, positions=positions, reference=source, model=model))]
    return variants


def _resid_variants(
    model: HookedTransformer, hook: str, source: ActivationCache, positions: dict[str, Positions]
) -> Variants:
    return {
        f"L{layer}@{label}": [(name, Patch(positions=position, reference=source, model=model))]
        for layer, name in enumerate(_names(model, hook, RESID_HOOKS))
        for label, position in positions.items()
    }


def _grid_positions(tokens: Tensor, key_valid: Tensor | None, positions) -> dict[str, Positions]:
    """The columns of a layer x position grid, label -> positions: given (ints, or named per-prompt
    positions), or every position all prompts have (see the module docstring)."""
    if isinstance(positions, Mapping):
        if not positions:
            raise ValueError("positions= is an empty dict; name at least one column, e.g. {'S2': task.positions['S2']}")
        labels = variant_names(positions, "positions= label", reserved=())  # {1: ..., "1": ...} would lose a column
        return {label: as_positions(value) for label, value in zip(labels, positions.values(), strict=True)}
    if isinstance(as_positions(positions), PerPrompt):
        raise ValueError(
            f"positions={as_positions(positions)!r} is one position per prompt, but a layer x position grid patches one"
            " column of positions at a time; name it: positions={'S2': task.positions['S2']} (variants L{layer}@S2)"
        )
    if positions is not None:
        return {str(p): p for p in as_ints(positions, "positions")}
    if key_valid is None:
        return {str(p): p for p in range(tokens.shape[1])}
    shortest = int(key_valid.sum(-1).min())
    return {str(p): p for p in range(-shortest, 0)}


def _grid_record(positions: dict[str, Positions]) -> list[int] | dict:
    """The grid's columns as plain data: the positions (a list of ints), or label -> positions."""
    if all(isinstance(value, int) for value in positions.values()):
        return list(positions.values())
    return {label: positions_record(value) for label, value in positions.items()}


def _prompts(model: HookedTransformer, corrupt, attention_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    if isinstance(corrupt, ActivationCache):
        raise TypeError("the corrupt input is run, so it must be prompts or token ids, not a cache")
    return model.tokens_and_mask(corrupt, attention_mask, prepend_bos=None)


def _explicit_mask(tokens: Tensor, key_valid: Tensor | None) -> Tensor:
    # Always passed: token ids alone would make the model look their padding up in the tokenizer again.
    return torch.ones_like(tokens, dtype=torch.bool) if key_valid is None else key_valid


def _source(
    model: HookedTransformer, clean: Reference, names: list[str], tokens: Tensor, key_valid: Tensor | None
) -> ActivationCache:
    """The clean run's activations at `names` (prompts are run once), checked against the corrupt prompts."""
    if is_tokens(clean):
        with torch.no_grad(), model.hooks_suspended():
            _, clean = model.run_with_cache(clean, names_filter=names)
    if not isinstance(clean, ActivationCache):
        raise TypeError(f"the clean source is a cache or prompts / token ids, not {type(clean).__name__}")
    missing = [name for name in names if name not in clean.cache_dict]
    if missing:
        raise KeyError(
            f"the clean cache has no {missing[0]} (nor {len(missing) - 1} more); cache it"
            f" (run_with_cache(clean, names_filter=lambda name: name.endswith({missing[0].rsplit('.', 1)[1]!r})))"
        )
    if not clean.has_batch_dim:
        raise ValueError("the clean cache was made with remove_batch_dim=True; keep the batch axis")
    batch, pos = tokens.shape
    cached = clean.cache_dict[names[0]]
    axes = model.hook_dict[names[0]].axes
    cached_pos = cached.shape[axes.index("pos" if "pos" in axes else "query_pos")]
    if (cached.shape[0], cached_pos) != (batch, pos):
        raise ValueError(
            f"the clean cache holds {cached.shape[0]} prompts of {cached_pos} tokens but the corrupt input is"
            f" {batch} prompts of {pos} tokens; patching pairs prompt i of one with prompt i of the other,"
            " token for token, so both need the same shape"
        )
    source_mask = clean.attention_mask
    if (source_mask is None) != (key_valid is None) or (
        key_valid is not None and not torch.equal(source_mask.to(key_valid.device), key_valid)
    ):
        raise ValueError(
            "the clean prompts are padded differently from the corrupt ones; each clean prompt must have"
            " the same token length as the corrupt prompt it is paired with"
        )
    return clean


def _evaluate(metric: Callable, logits: Tensor, key_valid: Tensor | None) -> Float[Tensor, " batch"]:
    """The metric on full logits, per prompt, still attached to the graph."""
    if not callable(metric):
        raise TypeError(f"metric must be callable on logits, got {type(metric).__name__}")
    values = metric_values(
        metric,
        metric(logits, base_logits=logits.detach(), attention_mask=key_valid),
        logits.shape[0],
        "on the corrupt run (patch.attribution's base)",
    )
    if not values.requires_grad:
        raise ValueError(
            f"metric {metric!r} returned values with no gradient (a .detach(), .item() or no_grad inside?);"
            " attribution differentiates the metric"
        )
    return values


__all__ = ["HEAD_HOOKS", "Patch", "RESID_HOOKS", "activation", "attribution", "head_sweep", "hooks", "resid_sweep"]
