"""An attribution graph: the direct, linear effect of every active transcoder feature, error node and input token
on every feature and logit of one prompt, under the local replacement model (Ameisen et al. 2025, "Circuit
Tracing"; circuit-tracer 0.5.0, `graph.py`). `hooked.graphs.attribute` builds it.

Node order, as circuit-tracer's: the selected features (`selected_features`, indices into `active_features`, whose
rows are sorted by layer, position, feature), then the error nodes layer by layer and position by position
(`n_layers * n_pos`), then one token node per position, then the logit nodes by falling probability. The adjacency
has rows as targets and columns as sources: `adjacency[t, s]` is the direct effect of node s on node t. Error and
token rows and logit columns are zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import Tensor


class LogitTarget(NamedTuple):
    """A logit node: the token's text and its vocabulary id (circuit-tracer 0.5.0 `attribution/targets.py`)."""

    token_str: str
    vocab_idx: int


@dataclass
class Graph:
    """One prompt's attribution graph (module docstring: node order and what an entry means).

    `adjacency` is [N, N] float32 with N = n_features + n_layers * n_pos + n_pos + n_logits: dense (every edge, as
    circuit-tracer keeps it) or a coalesced sparse COO tensor when `attribute` kept only each row's largest edges
    (`edges_per_row`), so its memory grows with the edges kept, not with N squared."""

    input_tokens: Tensor  # [n_pos] int64
    input_string: str
    active_features: Tensor  # [n_active, 3] int64: (layer, position, feature), sorted by layer, position, feature
    activation_values: Tensor  # [n_active] float32: each active feature's activation
    selected_features: Tensor  # [n_features] int64, ascending: the active features that are nodes
    adjacency: Tensor  # [N, N] float32, rows targets, columns sources; dense or sparse COO
    logit_targets: list[LogitTarget]
    logit_probabilities: Tensor  # [n_logits]: each logit node's probability at the last position
    n_layers: int
    vocab_size: int
    feature_input_hook: str  # hooked's point name with {layer}: where the transcoders read
    feature_output_hook: str  # ... and where they write
    model_info: dict[str, Any] = field(default_factory=dict)  # the model's shape and names (save_circuit_tracer)
    scan: str | list[str] | None = None  # the transcoders' identifier for viewers (circuit-tracer's `scan`)

    @property
    def n_pos(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.selected_features.shape[0])

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_logits(self) -> int:
        return len(self.logit_targets)

    @property
    def n_nodes(self) -> int:
        return self.n_features + self.n_errors + self.n_pos + self.n_logits

    @property
    def error_offset(self) -> int:
        """Index of the first error node (layer 0, position 0); error (l, p) is at error_offset + l * n_pos + p."""
        return self.n_features

    @property
    def token_offset(self) -> int:
        """Index of the first token node; token p is at token_offset + p."""
        return self.n_features + self.n_errors

    @property
    def logit_offset(self) -> int:
        """Index of the first logit node (the most probable)."""
        return self.token_offset + self.n_pos
