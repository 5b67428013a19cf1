"""Which tokens the rows of the running forward hold: `Rows`, set by the model once per forward
(`running_rows`), read by hooks as `hook.position_ids` / `hook.attention_mask` (`current_rows`) and by the
code that must know a forward's padding (ablations at positions, generation steps, GPT-2's position
embeddings)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Rows:
    """Which tokens the rows of the running forward hold: set by the model once per forward."""

    position_ids: Tensor  # [batch pos] position of each column in its own prompt
    attention_mask: Tensor | None  # [batch pos] True for real tokens; None when no row is padded
    # Column of the full (padded) sequence where these columns start: 0 for a plain forward, the
    # number of cached columns for a step that continues a KV cache (a generation step).
    start: int = 0
    # [batch 1] what negative positions count back from (-1 is position lengths - 1). None: each row's
    # last column here (the plain forward's rule); generation sets each prompt's length, so that
    # -1 stays the prompt's last token on every decode step.
    lengths: Tensor | None = None
    # [batch] which prompt of the caller's batch each row runs, where an inference engine runs each prompt as a
    # request of its own (hooked.engines): what per-prompt values (one position per prompt, a paired source) are
    # read at. None: row i is prompt i (within its block of a sweep).
    prompts: Tensor | None = None

    def select(self, rows: slice) -> Rows:
        mask = None if self.attention_mask is None else self.attention_mask[rows]
        lengths = None if self.lengths is None else self.lengths[rows]
        prompts = None if self.prompts is None else self.prompts[rows]
        return Rows(self.position_ids[rows], mask, self.start, lengths, prompts)

    def prompt_lengths(self) -> Tensor:
        """[batch 1] the length negative positions count back from."""
        return self.position_ids[:, -1:] + 1 if self.lengths is None else self.lengths


_current_rows: ContextVar[Rows | None] = ContextVar("hooked_current_rows", default=None)


@contextlib.contextmanager
def running_rows(rows: Rows) -> Iterator[None]:
    """Make `rows` what `hook.position_ids` / `hook.attention_mask` report inside the block."""
    token = _current_rows.set(rows)
    try:
        yield
    finally:
        _current_rows.reset(token)


def current_rows() -> Rows:
    rows = _current_rows.get()
    if rows is None:
        raise RuntimeError("position_ids and attention_mask are known only inside a hook, while the model runs")
    return rows
