"""Feature interventions: set transcoder features of one prompt to chosen values (0 ablates, a larger value
steers) and see the new logits. The question an attribution graph raises ("does this feature carry the
answer?") is answered on the real model.

    r = graphs.intervene(model, prompt, transcoders, {"L1.mlp_out.F5@3": 0.0, (2, 7, 40): 6.0})
    r.logits[-1] - r.clean_logits[-1]        # how each next-token logit moved

The transcoders are spliced with their error term (`model.saes(transcoders, use_error_term=True)`, hooked/sae/
splice.py), so until a feature is edited the model computes what it computes alone, and setting feature f of layer
l at position p from its activation a to v adds exactly (v - a) * W_dec[f] to what layer l's MLP writes there (to
every later layer, for a cross-layer transcoder). Each value is written at the feature's point,
`blocks.L.hook_mlp_out.hook_sae_acts_post`, by `ablate.constant` (the `features` kind).

What else is held at its clean value, `freeze=`:

- `"none"` (default): nothing; the model runs on, and attention, norms and later features respond
  (circuit-tracer 0.5.0 `feature_intervention(..., freeze_attention=False)`);
- `"attention"`: every attention pattern (circuit-tracer's default, `freeze_attention=True`);
- `"all"`: attention patterns, every norm's scale, and each MLP's output but for the edits and the transcoder's
  skip path (circuit-tracer's `constrained_layers=range(n_layers)`).

`"all"` is the attribution graph's replacement model (hooked/graphs/attribute.py): only direct effects pass, so
ablating feature node s moves logit node t (its logit minus the mean logit) by `-adjacency[t, s]` and a feature
target's pre-activation by `-adjacency[t, s]`. Later features' activations still respond in `activations`, but
what they write stays frozen.

Where this differs from circuit-tracer's `feature_intervention` (`replacement_model/
replacement_model_transformerlens.py`): its constrained mode is offered over every layer only (not a sub-range);
its delta at position 0 is taken against an activation it zeroed (`zero_positions`), here against the feature's
real activation there; and the activations it returns are each layer's encoding before the edit, where
`activations` here holds what each feature is after it (the values set, and later features as they respond).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.graphs.attribute import prompt_tokens
from hooked.graphs.transcoders import Transcoders, fitted
from hooked.interventions import ablate
from hooked.interventions.addresses import parse_address
from hooked.interventions.row_blocks import registered_hooks
from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary
from hooked.sae.transcoders import TranscoderSet

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Freeze = Literal["none", "attention", "all"]
FREEZES = ("none", "attention", "all")
Feature = tuple[int, int, int] | str  # (layer, position, feature) or a component address "L1.mlp_out.F5@3"


@dataclass
class InterventionResult:
    """What `intervene` returns: the prompt's logits with and without the interventions, and every feature.

    `interventions` holds each one as (layer, position, feature, value), position None for "every position" (an
    address without `@pos`)."""

    tokens: Tensor  # [pos]: the prompt as run (a special token first, as attribute puts it)
    logits: Tensor  # [pos d_vocab]: after the interventions
    clean_logits: Tensor  # [pos d_vocab]: the same run without them
    activations: Tensor  # [n_layers pos d_sae]: each layer's features after the interventions
    clean_activations: Tensor  # [n_layers pos d_sae]
    interventions: list[tuple[int, int | None, int, float]]
    freeze: str

    def logit_change(self, token: int, position: int = -1) -> float:
        """How much token `token`'s logit at `position` (default the last) moved."""
        return float(self.logits[position, token] - self.clean_logits[position, token])


@torch.no_grad()
def intervene(
    model: HookedTransformer,
    prompt: str | Tensor | Sequence[int],
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder,
    interventions: Mapping[Feature, float],
    *,
    freeze: Freeze = "none",
    attention_mask: Tensor | None = None,
) -> InterventionResult:
    """Run `prompt` with each feature of `interventions` set to its value (module docstring: what is frozen).

    `prompt`, its `attention_mask` and `transcoders` as `graphs.attribute` takes them (the same tokens, so positions
    match a graph's).
    A feature is `(layer, position, feature)` or an address `"L1.mlp_out.F5@3"` (`Graph.feature_address`; without
    `@pos` the feature is set at every position); positions may be negative.
    """
    if freeze not in FREEZES:
        raise ValueError(f"freeze must be one of {', '.join(map(repr, FREEZES))}, not {freeze!r}")
    if not isinstance(interventions, Mapping) or not interventions:
        raise TypeError(
            "interventions maps each feature, (layer, position, feature) or an address such as 'L1.mlp_out.F5@3',"
            f" to the value it is set to (0 ablates), e.g. {{(1, 3, 5): 0.0}}; got {interventions!r}"
        )
    registered_hooks(model, "hooked.graphs.intervene", part_of_model=False)
    tc = fitted(transcoders, model)
    tokens = prompt_tokens(model, prompt, attention_mask)
    points = [f"{name}.hook_sae_acts_post" for name in tc.hook_names_out()]
    errors = [f"{name}.hook_sae_error" for name in tc.hook_names_out()]
    frozen = []
    if freeze != "none":
        frozen += [n for n in model.hook_dict if n.endswith("attn.hook_pattern")]
    if freeze == "all":
        frozen += [n for n in model.hook_dict if n.endswith("hook_scale")]

    with model.saes(tc, use_error_term=True):
        edits = _normalise(model, tc, points, tokens.shape[0], interventions)
        clean_logits, cache = model.run_with_cache(tokens[None], names_filter=[*points, *errors, *frozen])
        after: list[Tensor | None] = [None] * tc.n_layers
        hooks = [(name, _Frozen(cache[name])) for name in frozen]
        for layer, point in enumerate(points):
            mine = [edit for edit in edits if edit[0] == layer]
            hooks += [(point, ablate.constant(value, features=f, positions=p)) for _, p, f, value in mine]
            hooks.append((point, _Record(after, layer)))
            if freeze == "all":  # what flows on: the clean features but the edited ones, and the clean error
                hooks.append((point, _Frozen(cache[point], _edited(mine, cache[point]))))
                hooks.append((errors[layer], _Frozen(cache[errors[layer]])))
        logits = model.run_with_hooks(tokens[None], fwd_hooks=hooks)
    return InterventionResult(
        tokens=tokens.cpu(),
        logits=logits[0],
        clean_logits=clean_logits[0],
        activations=torch.stack([a[0] for a in after]),
        clean_activations=torch.stack([cache[point][0] for point in points]),
        interventions=edits,
        freeze=freeze,
    )


@dataclass(frozen=True)
class _Frozen:
    """A hook that writes the clean run's value (where `mask` is False, with a mask)."""

    clean: Tensor
    mask: Tensor | None = None

    def __call__(self, activation: Tensor, hook) -> Tensor:
        if self.mask is None:
            return self.clean
        return torch.where(self.mask, activation, self.clean)


@dataclass(frozen=True)
class _Record:
    """A hook that keeps the features of layer `layer` as they flow past."""

    into: list
    layer: int

    def __call__(self, activation: Tensor, hook) -> None:
        self.into[self.layer] = activation.clone()


def _edited(edits: list[tuple[int, int | None, int, float]], like: Tensor) -> Tensor:
    """[1 pos d_sae]: True at the features `edits` set."""
    mask = torch.zeros(like.shape, dtype=torch.bool, device=like.device)
    for _, position, feature, _ in edits:
        mask[0, slice(None) if position is None else position, feature] = True
    return mask


def _normalise(
    model: HookedTransformer, tc: Transcoders, points: list[str], n_pos: int, interventions: Mapping
) -> list[tuple[int, int | None, int, float]]:
    """Each intervention as (layer, position >= 0 or None, feature, value), checked, before anything runs."""
    edits, seen = [], {}
    for key, value in interventions.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"interventions[{key!r}] is {value!r}; a feature is set to a finite number (0 ablates)")
        if isinstance(key, str):
            layer, position, feature = _from_address(model, points, key)
        elif isinstance(key, tuple) and len(key) == 3 and all(isinstance(i, int) for i in key):
            layer, position, feature = key
            if not 0 <= layer < tc.n_layers:
                raise IndexError(f"intervention {key}: layer {layer} is out of range (0..{tc.n_layers - 1})")
            if not 0 <= feature < tc.d_sae:
                raise IndexError(f"intervention {key}: feature {feature} is out of range (0..{tc.d_sae - 1})")
        else:
            raise TypeError(
                f"an intervention's feature is (layer, position, feature), three ints, or an address such as"
                f" 'L1.mlp_out.F5@3'; got {key!r}"
            )
        if position is not None:
            if not -n_pos <= position < n_pos:
                raise IndexError(
                    f"intervention {key!r}: position {position} is outside the prompt's {n_pos} tokens (the first"
                    " is the special token attribute puts first)"
                )
            position %= n_pos
        spot = (layer, position, feature)
        if spot in seen:
            raise ValueError(f"interventions {seen[spot]!r} and {key!r} set the same feature; give it once")
        seen[spot] = key
        edits.append((layer, position, feature, float(value)))
    return edits


def _from_address(model: HookedTransformer, points: list[str], address: str) -> tuple[int, int | None, int]:
    component = parse_address(model, address)
    if component.hook_name not in points or "features" not in component.selectors:
        raise ValueError(
            f"{address!r} is not a feature of these transcoders, whose features are at"
            f" {points[0].replace('blocks.0.', 'blocks.L.')} ('L1.mlp_out.F5@3': layer 1, feature 5, position 3)"
        )
    positions = component.selectors.get("positions")
    (feature,) = component.selectors["features"]
    return points.index(component.hook_name), None if positions is None else positions[0], feature
