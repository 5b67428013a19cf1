"""What an attribution graph is asked for, checked before anything runs: one record, `AttributionSettings`, that the
entry points (hooked/graphs/attribute.py) build from their keywords and every later step reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hooked.graphs.targets import CheckedTargets, check_targets

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


@dataclass(frozen=True)
class AttributionSettings:
    """`attribute`'s keywords, checked (`AttributionSettings.of`): the logit nodes (`targets`, or with none the
    `max_n_logits` most probable tokens until they hold `desired_logit_prob`), at most `max_feature_nodes` features
    with rows and columns (None: every active one), `batch_size` target rows per backward pass, each row's
    `edges_per_row` largest edges kept (None: every edge), and influence re-ranked every `update_interval` passes."""

    max_n_logits: int | None  # None where `targets` names the logit nodes
    desired_logit_prob: float | None
    max_feature_nodes: int | None
    batch_size: int
    edges_per_row: int | None
    targets: CheckedTargets | None
    update_interval: int

    @classmethod
    def of(
        cls,
        model: HookedTransformer,
        *,
        attribution_targets,
        max_n_logits,
        desired_logit_prob,
        max_feature_nodes,
        batch_size,
        edges_per_row,
        update_interval,
    ) -> AttributionSettings:
        """The settings, or a ValueError (TypeError) naming the first bad one (the keywords are `attribute`'s, of
        any type: each is checked here)."""
        targets = check_targets(attribution_targets, model)
        if targets is not None and (max_n_logits is not None or desired_logit_prob is not None):
            raise ValueError(
                f"max_n_logits={max_n_logits} / desired_logit_prob={desired_logit_prob} choose the logit nodes when"
                " attribution_targets is None; attribution_targets names them, so these would be ignored: leave them"
                " out"
            )
        if targets is None:  # the most probable tokens
            max_n_logits = 10 if max_n_logits is None else max_n_logits
            desired_logit_prob = 0.95 if desired_logit_prob is None else desired_logit_prob
        if targets is None and (not isinstance(max_n_logits, int) or max_n_logits < 1):
            raise ValueError(f"max_n_logits must be a positive integer (the most logit nodes), not {max_n_logits!r}")
        if targets is None and not 0 < desired_logit_prob <= 1:
            raise ValueError(
                f"desired_logit_prob must be in (0, 1] (the probability the logit nodes should cover), not"
                f" {desired_logit_prob!r}"
            )
        if max_feature_nodes is not None and (not isinstance(max_feature_nodes, int) or max_feature_nodes < 0):
            raise ValueError(f"max_feature_nodes must be None or an integer >= 0, not {max_feature_nodes!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer (rows per backward pass), not {batch_size!r}")
        if edges_per_row is not None and (not isinstance(edges_per_row, int) or edges_per_row < 1):
            raise ValueError(
                f"edges_per_row must be None (keep every edge) or a positive integer, not {edges_per_row!r}"
            )
        if not isinstance(update_interval, int) or update_interval < 1:
            raise ValueError(
                f"update_interval must be a positive integer (backward passes between re-rankings), not"
                f" {update_interval!r}"
            )
        desired_logit_prob = None if desired_logit_prob is None else float(desired_logit_prob)
        return cls(
            max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, edges_per_row, targets, update_interval
        )
