"""The activation stream: a forward per batch of token rows under `torch.no_grad`, stopping after the last block any
dictionary reads; hooks copy each point into a small buffer, shuffled (the same permutation for every point, so a
transcoder's input and target stay paired) and half of it handed out per refill, as SAELens' mixing buffer. Every
dictionary sees the same batches, so several trained from one pass are each exactly as they would be alone."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.hooks import EMBED_STAGE
from hooked.sae.training.config import width
from hooked.sae.training.tokens import PAD, TokenRows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


class ActivationStream:
    """Batches {hook name: [tokens width]} of `points`, from the model's forward, shuffled in a small buffer.

    The buffer holds `buffer_batches` training batches; each time it is full, a seeded permutation (the same for
    every point) hands out half of it and keeps the rest to mix with the next forwards. Only the rows and the seed
    decide the batches, not which dictionaries read them."""

    def __init__(
        self,
        model: HookedTransformer,
        rows: TokenRows,
        points: list[str],
        batch_tokens: int,
        buffer_batches: int,
        seed: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.model, self.rows, self.points = model, rows, points
        self.batch_tokens, self.buffer_batches = batch_tokens, buffer_batches
        self.seed, self.device, self.dtype = seed, device, dtype
        self.widths = {name: width(model, name)[0] for name in points}
        stages = [model.hook_dict[name].stage for name in points]
        last = max(stages)
        # stop after the block of the last point read: EMBED_STAGE -> no block; the final norm -> the whole forward
        self.stop_at_layer = (
            0 if last == EMBED_STAGE else (None if last is None or last >= 2 * model.cfg.n_layers else last // 2 + 1)
        )
        if getattr(model, "tensor_parallel", False):
            self.stop_at_layer = None
        self.rows_read = 0  # the token rows run so far, to name a NaN's row

    def batches(self, repeat: bool) -> Iterator[dict[str, Tensor]]:
        rows_per_forward = max(1, math.ceil(self.batch_tokens / self.rows.context_size))
        per_forward = rows_per_forward * self.rows.context_size
        capacity = max(self.buffer_batches * self.batch_tokens, 2 * self.batch_tokens)
        buffers = {
            name: torch.empty(capacity + per_forward, width, device=self.device, dtype=self.dtype)
            for name, width in self.widths.items()
        }
        generator = torch.Generator().manual_seed(self.seed)
        filled = 0
        for tokens in self.rows.batches(rows_per_forward, repeat):
            filled += self._collect(tokens, buffers, filled)
            if filled >= capacity:
                order = torch.randperm(filled, generator=generator).to(self.device)
                handed = (filled // 2 // self.batch_tokens) * self.batch_tokens
                for start in range(0, handed, self.batch_tokens):
                    chosen = order[start : start + self.batch_tokens]
                    yield {name: buffer[chosen] for name, buffer in buffers.items()}
                kept = order[handed:]
                for buffer in buffers.values():
                    buffer[: len(kept)] = buffer[kept]
                filled = len(kept)
        if filled:  # the data ended: what is left, shuffled
            order = torch.randperm(filled, generator=generator).to(self.device)
            for start in range(0, filled, self.batch_tokens):
                chosen = order[start : start + self.batch_tokens]
                yield {name: buffer[chosen] for name, buffer in buffers.items()}

    def _collect(self, tokens: Tensor, buffers: dict[str, Tensor], at: int) -> int:
        """Run the forward on `tokens` [rows pos], copying each real position's activation at each point into its
        buffer from row `at` (padding, id PAD, left out); the count."""
        tokens = tokens.to(self.model.device)
        mask = tokens != PAD  # real tokens, BOS ids included
        tokens = tokens.clamp(min=0)  # any id will do under the mask
        n = int(mask.sum())

        def keep(activation: Tensor, hook) -> None:
            buffers[hook.name][at : at + n].copy_(activation[mask].reshape(n, -1))

        with torch.no_grad(), self.model.hooks(fwd_hooks=[(self.points, keep)]):
            self.model(tokens, attention_mask=mask, return_type=None, stop_at_layer=self.stop_at_layer)
        for name, buffer in buffers.items():
            _check_finite(buffer[at : at + n], mask, name, self.rows_read)
        self.rows_read += tokens.shape[0]
        return n


def _check_finite(kept: Tensor, mask: Tensor, name: str, first_row: int) -> None:
    """Refuse NaN or infinite activations where they enter, before any step reads them: a dictionary trained on them
    would end with NaN weights, and its L0 would still look plausible. Names the point and the rows and positions."""
    bad = ~torch.isfinite(kept).all(-1)
    if not bool(bad.any()):
        return
    where = mask.nonzero()[bad.nonzero().flatten()].tolist()  # [row, position] in this forward's rows
    listed = ", ".join(f"row {first_row + row} position {position}" for row, position in where[:5])
    more = f" and {len(where) - 5} more" if len(where) > 5 else ""
    raise ValueError(
        f"the activations at {name} are NaN or infinite at {len(where)} real position{'s' if len(where) > 1 else ''}"
        f" ({listed}{more}; rows as training cuts the data, counted from 0): a dictionary trained on them would get"
        " NaN weights. Nothing was trained on them. Look for NaN in the model's weights, or for a value overflowing"
        " the model's dtype, on those tokens (model.run_with_cache on them shows where it starts)"
    )


def batch_rows(batch: dict[str, Tensor]) -> int:
    return next(iter(batch.values())).shape[0]
