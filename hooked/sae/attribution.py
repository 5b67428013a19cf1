"""Attribution patching over dictionary features: a score for every feature of the spliced dictionaries at once.

    scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae, transcoder])
    scores.top(10); scores["L3.resid_post.F12"]; scores.table(); scores.to_csv("features.csv")

For feature f of a dictionary, with activation a on the clean prompts and a' on the corrupt ones, at every
position p, the score is the first-order estimate of patching f to its corrupt activation in the clean run:

    score(f) = sum over p of  d metric / d a[p, f]  *  (a'[p, f] - a[p, f])      (gradient at the clean run)

estimating metric(clean with f patched) - metric(clean), per prompt; `scores` averages it over prompts. One forward
on the corrupt prompts (for a') and one forward and backward on the clean ones give every feature of every
dictionary (Nanda 2023, "Attribution Patching"; Marks et al. 2024, "Sparse Feature Circuits", arXiv 2403.19647).

With `use_error_term=True` (default) each dictionary adds its reconstruction error back, so the metric is the
model's own. The patch it estimates changes one feature and leaves the error of that dictionary as it was, while
every later dictionary's error follows its new input (a later dictionary then passes its input on unchanged). The
gradient is taken so: each dictionary's features are the inputs the metric is differentiated at (their gradient
does not flow on into the encoder), and the activation a dictionary replaces passes its gradient on whole, as an
error node of Marks et al. does. SAELens' splice detaches the error instead (hooked/sae/splice.py does too, for
runs), under which a feature's gradient would run through every later dictionary's encoder and decoder: a
different number whenever two dictionaries are spliced, and not the patch's first-order term.

With `use_error_term=False` the metric is that of the model with its activations replaced by the reconstructions,
and the gradient runs through every later dictionary's encoder, as the patch itself does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from hooked.hooks import evaluating, needs_gradients
from hooked.interventions import kinds
from hooked.interventions.metrics import check_prompts
from hooked.interventions.row_blocks import registered_hooks
from hooked.interventions.sweeps import metric_values, sweep_provenance
from hooked.layers import position_ids_for
from hooked.sae.dictionary import Dictionary
from hooked.sae.splice import saes as splice
from hooked.tables import ResultTable

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

# the features kind's parts, by the hook they name under blocks.L: "hook_resid_post" -> ".resid_post"
_PARTS = {hook: part for part, hook in kinds.FEATURE_POINTS.items()}


@dataclass
class FeatureScores(ResultTable):
    """A score per feature: `scores["L3.resid_post.F12"]`, `top(20)`, `table()`, `to_csv(path)` (one row per
    feature, largest |score| first: hooked/tables.py).

    `scores` [n_features] is the estimate averaged over prompts, `per_prompt` [batch, n_features] each prompt's;
    `per_position` [n_features, positions] (with `attribute(..., per_position=True)`) averages over the prompts
    that have each position in the prompt. Features are listed dictionary by dictionary, in index order. The
    tensors are float32, float64 for a float64 model.
    """

    features: list[str]  # addresses: "L3.resid_post.F12", "L1.mlp_out.F5"
    scores: Float[Tensor, " n_features"]
    per_prompt: Float[Tensor, "batch n_features"]
    clean: Float[Tensor, " batch"]  # the metric on the clean prompts (the dictionaries spliced)
    corrupt: Float[Tensor, " batch"]  # and on the corrupt ones
    per_position: Tensor | None = None
    provenance: dict = field(default_factory=dict)

    table_index = "feature"
    columns = ("feature", "point", "index", "score", "rank")

    def __post_init__(self):
        self._index = {name: i for i, name in enumerate(self.features)}

    def __getitem__(self, feature: str) -> float:
        if feature not in self._index:
            raise KeyError(f"{feature!r} is not a scored feature; they look like {self.features[:2]}")
        return float(self.scores[self._index[feature]])

    def __len__(self) -> int:
        return len(self.features)

    def ranking(self) -> list[str]:
        """Every feature, the largest |score| first (ties in feature order)."""
        order = torch.sort(self.scores.abs(), descending=True, stable=True).indices
        return [self.features[i] for i in order.tolist()]

    def top(self, k: int = 20) -> list[tuple[str, float]]:
        """The k features of largest |score|, with their signed scores."""
        return [(name, self[name]) for name in self.ranking()[:k]]

    def rows(self) -> list[dict]:
        """One dict per feature (feature, point, index, score, rank), the largest |score| first."""
        rows = []
        for rank, name in enumerate(self.ranking(), start=1):
            point, index = name.rsplit(".F", 1)
            rows.append({"feature": name, "point": point, "index": int(index), "score": self[name], "rank": rank})
        return rows

    def to_dict(self) -> dict:
        return {
            "scores": dict(zip(self.features, self.scores.tolist(), strict=True)),
            "clean": self.clean.tolist(),
            "corrupt": self.corrupt.tolist(),
            "provenance": self.provenance,
        }

    def __repr__(self) -> str:
        best = ", ".join(f"{name} {score:+.3g}" for name, score in self.top(3))
        return f"FeatureScores({len(self)} features; top: {best})"


def attribute(
    model: HookedTransformer,
    clean,
    corrupt,
    metric: Callable,
    *,
    saes: Sequence[Dictionary] | Dictionary,
    use_error_term: bool = True,
    per_position: bool = False,
    attention_mask: Tensor | None = None,
    task=None,
) -> FeatureScores:
    """Attribution patching for every feature of `saes`, spliced for the call: gradient x (corrupt - clean).

    `clean` and `corrupt` are prompts or token ids of the same shape and padding (prompt i of one is paired with
    prompt i of the other, token for token); `metric` a `hooked.interventions.metrics` metric (or any
    `metric(logits, base_logits=..., attention_mask=...) -> [batch]`), differentiated, so one that compares with
    the base run (KL divergence) is refused, as in `hooked.circuits.attribute`. Scores are summed over positions
    (and, with `per_position=True`, also kept per position in the prompt). The model runs in eval mode; parameter
    `.grad`s are not touched and nothing stays attached, also when the metric raises.
    """
    needs_gradients(model, "hooked.sae.attribute")
    dictionaries = [saes] if isinstance(saes, Dictionary) else list(saes)
    if not dictionaries:
        raise ValueError("attribute scores the features of saes=[...]; give at least one dictionary")
    for d in dictionaries:
        if not isinstance(d, Dictionary):
            raise TypeError(
                f"hooked.sae.attribute scores the features of hooked.sae dictionaries (SAEs and transcoders), not"
                f" {type(d).__name__}; a cross-layer transcoder's features are patched one by one with hooked.sweep"
                " (docs/saes.md), a SAELens SAE converts with hooked.sae.from_saelens(sae)"
            )
    if getattr(metric, "needs_base", False) is True:
        raise ValueError(
            f"{metric!r} compares with the clean run, where its gradient is 0: every score would be 0;"
            " use a metric of the answers (logit_diff, log_prob, ...)"
        )
    registered_hooks(model, "hooked.sae.attribute")
    tokens, key_valid = model.tokens_and_mask(clean, attention_mask, prepend_bos=None)
    check_prompts(metric, model, tokens, key_valid, "hooked.sae.attribute")
    corrupt_tokens, corrupt_valid = model.tokens_and_mask(corrupt, attention_mask, prepend_bos=None)
    _check_paired(tokens, key_valid, corrupt_tokens, corrupt_valid)
    mask = torch.ones_like(tokens, dtype=torch.bool) if key_valid is None else key_valid  # always passed explicitly

    with evaluating(model):
        with torch.no_grad(), splice(model, dictionaries, use_error_term=use_error_term):
            names = [d.hook_sae_acts_post.name for d in dictionaries]
            corrupt_logits, cache = model.run_with_cache(corrupt_tokens, attention_mask=mask, names_filter=names)
            corrupt_acts = [cache.cache_dict[name] for name in names]
            corrupt_values = _metric(metric, corrupt_logits, key_valid, "on the corrupt run")
        clean_values, clean_acts, gradients = _clean_gradients(
            model, dictionaries, tokens, mask, key_valid, metric, use_error_term
        )

    # the estimate sums many small products: float32 at least, and the model's float64 kept (scores in it)
    precision = torch.promote_types(model.dtype, torch.float32)
    products = [
        (torch.zeros_like(a, dtype=precision) if g is None else g.to(precision)) * (a_c.to(precision) - a.to(precision))
        for g, a, a_c in zip(gradients, clean_acts, corrupt_acts, strict=True)
    ]
    products = torch.cat(products, dim=-1)  # [batch pos n_features]; 0 at padding, which nothing reads
    per_prompt = products.sum(1).cpu()
    infinite = ~torch.isfinite(per_prompt).all(0)
    if bool(infinite.any()):
        names = [name for d in dictionaries for name in feature_names(d)]
        bad = [names[i] for i in infinite.nonzero().flatten().tolist()]
        raise ValueError(
            f"the attribution score of {len(bad)} feature{'s' if len(bad) > 1 else ''} is NaN or infinite"
            f" ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): the metric's value is finite but its"
            " gradient at the clean run is not (a norm or a square root at 0, a NaN in the backward)"
        )
    provenance = sweep_provenance(model, [], metric, task, tokens)
    provenance["sae"] = {
        "method": "attribution patching (gradient x (corrupt - clean) at the clean run)",
        "dictionaries": [repr(d) for d in dictionaries],
        "use_error_term": use_error_term,
    }
    return FeatureScores(
        features=[name for d in dictionaries for name in feature_names(d)],
        scores=per_prompt.mean(0),
        per_prompt=per_prompt,
        clean=clean_values.detach().to(precision).cpu(),
        corrupt=corrupt_values.to(precision).cpu(),
        per_position=_per_position(products, tokens, key_valid) if per_position else None,
        provenance=provenance,
    )


def feature_names(dictionary: Dictionary) -> list[str]:
    """The address of each feature of a spliced dictionary (`L3.resid_post.F12`), by the point it writes; a point
    the features kind does not name gives `<point>.F12`."""
    point = dictionary.hook_name_out
    found = re.fullmatch(r"blocks\.(\d+)\.(.+)", point)
    part = _PARTS.get(found[2]) if found else None
    kind = kinds.KINDS["features"]
    if part is None:
        return [f"{point}.F{i}" for i in range(dictionary.cfg.d_sae)]
    return [kind.address(int(found[1]), part, feature=i) for i in range(dictionary.cfg.d_sae)]


# ----------------------------------------------------------------------------- the clean forward and backward
class _Gradients:
    """The hooks of the clean run: each dictionary's features kept (as the tensors the metric is differentiated
    at), and, with the error term, the replaced activation's gradient passed on whole (see the module docstring)."""

    def __init__(self, dictionaries: list[Dictionary], use_error_term: bool):
        self.dictionaries, self.use_error_term = dictionaries, use_error_term
        self.acts: dict[str, Tensor] = {}
        self.replaced: dict[str, Tensor] = {}  # write point -> the model's own activation there

    def before_splice(self) -> list[tuple[str, Callable]]:
        """At each written point, registered before the splice: the activation the dictionary replaces."""
        return [(d.hook_name_out, self._keep_replaced) for d in self.dictionaries] if self.use_error_term else []

    def inside_splice(self) -> list[tuple[str, Callable]]:
        hooks = []
        for d in self.dictionaries:
            hooks += [(d.hook_sae_input.name, _requiring_grad), (d.hook_sae_acts_post.name, self._keep_acts)]
            if self.use_error_term:
                hooks.append((d.hook_sae_output.name, self._pass_error_gradient))
        return hooks

    def _keep_replaced(self, activation: Tensor, hook) -> None:
        self.replaced[hook.name] = activation

    def _keep_acts(self, activation: Tensor, hook) -> Tensor:
        acts = activation.detach().requires_grad_(True) if self.use_error_term else activation
        self.acts[hook.name] = acts
        return acts

    def _pass_error_gradient(self, activation: Tensor, hook) -> Tensor:
        replaced = self.replaced[hook.name.rsplit(".", 1)[0]]
        return activation + (replaced - replaced.detach())  # the same value; d output / d replaced = identity


def _requiring_grad(activation: Tensor, hook) -> Tensor:
    # frozen parameters: nothing upstream needs a gradient, but the features must have one
    return activation if activation.requires_grad else activation.detach().requires_grad_(True)


def _clean_gradients(
    model: HookedTransformer,
    dictionaries: list[Dictionary],
    tokens: Tensor,
    mask: Tensor,
    key_valid: Tensor | None,
    metric: Callable,
    use_error_term: bool,
) -> tuple[Tensor, list[Tensor], list[Tensor | None]]:
    """The clean run: the metric per prompt, each dictionary's features, and the gradient of the metric's sum at
    them (None where the metric does not read a dictionary). autograd.grad, so parameters' .grad stay as they were."""
    gradients = _Gradients(dictionaries, use_error_term)
    with torch.enable_grad(), model.hooks(fwd_hooks=gradients.before_splice()):
        with splice(model, dictionaries, use_error_term=use_error_term):
            with model.hooks(fwd_hooks=gradients.inside_splice()):
                logits = model(tokens, attention_mask=mask)
            acts = [gradients.acts[d.hook_sae_acts_post.name] for d in dictionaries]  # named so while spliced
        values = _metric(metric, logits, key_valid, "on the clean run")
        if not values.requires_grad:
            raise ValueError(
                f"metric {metric!r} returned values with no gradient (a .detach(), .item() or no_grad inside?);"
                " attribution differentiates the metric"
            )
        grads = torch.autograd.grad(values.sum(), acts, allow_unused=True)
    return values, [a.detach() for a in acts], list(grads)


# ----------------------------------------------------------------------------- pieces
def _metric(metric: Callable, logits: Tensor, key_valid: Tensor | None, what: str) -> Tensor:
    if not callable(metric):
        raise TypeError(f"metric must be callable on logits, got {type(metric).__name__}")
    values = metric(logits, base_logits=logits.detach(), attention_mask=key_valid)
    return metric_values(metric, values, logits.shape[0], what)


def _check_paired(tokens: Tensor, key_valid: Tensor | None, corrupt: Tensor, corrupt_valid: Tensor | None) -> None:
    if tokens.shape != corrupt.shape:
        raise ValueError(
            f"the clean prompts are {tuple(tokens.shape)} tokens and the corrupt ones {tuple(corrupt.shape)};"
            " attribution pairs prompt i of one with prompt i of the other, token for token: give the same shape"
        )
    same = (key_valid is None and corrupt_valid is None) or (
        key_valid is not None and corrupt_valid is not None and torch.equal(key_valid, corrupt_valid)
    )
    if not same:
        raise ValueError(
            "the clean prompts are padded differently from the corrupt ones; each clean prompt must have the same"
            " token length as the corrupt prompt it is paired with"
        )


def _per_position(products: Tensor, tokens: Tensor, key_valid: Tensor | None) -> Tensor:
    """[n_features, positions]: each position in the prompt's score, averaged over the prompts that have it."""
    position_ids = position_ids_for(tokens, key_valid)
    real = torch.ones_like(tokens, dtype=torch.bool) if key_valid is None else key_valid.bool()
    n_positions = int(position_ids[real].max()) + 1
    sums = torch.zeros(n_positions, products.shape[-1], dtype=products.dtype, device=products.device)
    sums.index_add_(0, position_ids[real], products[real])
    counts = torch.bincount(position_ids[real], minlength=n_positions).to(products.dtype)
    return (sums / counts[:, None]).T.cpu()


__all__ = ["FeatureScores", "attribute", "feature_names"]
