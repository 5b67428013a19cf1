"""Row blocks: how several variants share one batch, each owning a block of rows.

Variant v of V owns rows v*B .. (v+1)*B of a batch of V copies of the same B prompts (`Prompts.repeated`).
Its callbacks are wrapped (`OnRows`) so they see only that block, `activation[rows]`, with a hook view
(`RowsView`) whose `position_ids`, `attention_mask` and `slot_experts` are cut to the same rows: a callback
written for a single run works unchanged, and its in-place edits stay in its rows. `hooked.sweep`,
`hooked.generate_variants` and the circuits engine build on this protocol; outside hooks would apply to
every row, so each refuses to run while any is registered (`registered_hooks`). A hook that is part of the
model (a spliced dictionary: `part_of_model`, hooked/hooks.py) is the model's own computation for every row
alike, so sweeps and generation run with it; the circuits engine, whose graph knows the model's components only,
refuses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from hooked.hooks import HookFn, HookPoint
from hooked.layers import AttentionMask
from hooked.rows import Rows, current_rows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


class VariantError(RuntimeError):
    """A callback raised inside a sweep; the message names the variant and the hook."""


@dataclass(frozen=True)
class Prompts:
    """The B prompts every variant runs on."""

    tokens: Tensor  # [B pos]
    position_ids: Tensor  # [B pos]
    key_valid: Tensor | None  # [B pos] or None when unpadded

    def repeated(self, copies: int) -> tuple[Tensor, Rows, AttentionMask]:
        """Tokens, rows and mask of `copies` blocks of these prompts, one after another."""
        position_ids = self.position_ids.repeat(copies, 1)
        key_valid = None if self.key_valid is None else self.key_valid.repeat(copies, 1)
        pos = self.tokens.shape[1]
        return self.tokens.repeat(copies, 1), Rows(position_ids, key_valid), AttentionMask(key_valid, pos, pos)


class RowsView:
    """What a callback inside a sweep receives as `hook`: the point, cut to the variant's rows."""

    def __init__(self, point: HookPoint, rows: slice):
        self._point, self._rows = point, rows

    def __getattr__(self, name: str):  # name, axes, ctx, layer(), has_hooks ... as the point's
        return getattr(self._point, name)

    @property
    def rows(self) -> Rows:
        return current_rows().select(self._rows)

    @property
    def position_ids(self) -> Tensor:
        return current_rows().position_ids[self._rows]

    @property
    def attention_mask(self) -> Tensor | None:
        mask = current_rows().attention_mask
        return None if mask is None else mask[self._rows]

    @property
    def slot_experts(self) -> Tensor | None:
        slots = self._point.slot_experts
        return None if slots is None else slots[self._rows]

    def __repr__(self) -> str:
        return f"RowsView({self._point.name!r}, rows {self._rows.start}:{self._rows.stop})"


@dataclass
class OnRows:
    """A variant's callback, applied to its block of rows only."""

    fn: HookFn
    rows: slice
    variant: str

    def __call__(self, activation: Tensor, hook: HookPoint) -> None:
        part = activation[self.rows]  # a view: in-place edits by fn land in these rows
        try:
            result = self.fn(part, RowsView(hook, self.rows))
        except Exception as error:
            raise VariantError(
                f"sweep variant {self.variant!r}, hook {hook.name}: {type(error).__name__}: {error}"
            ) from error
        if result is not None and result is not part:
            if not isinstance(result, Tensor) or result.shape != part.shape:
                shape = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
                raise VariantError(
                    f"sweep variant {self.variant!r}, hook {hook.name}: the callback returned {shape}, but its rows"
                    f" have shape {tuple(part.shape)}; a replacement must keep the shape"
                )
            activation[self.rows] = result


def registered_hooks(model: HookedTransformer, caller: str, *, part_of_model: bool = True) -> None:
    """Refuse to run variants while outside hooks are registered: they would apply to every row. Hooks that
    are part of the model (a spliced dictionary) pass, unless `part_of_model=False` (the caller cannot run them)."""
    listening = [
        (name, [*point.fwd_hooks, *point.bwd_hooks]) for name, point in model.hook_dict.items() if point.listening
    ]
    if not part_of_model and any(r.part_of_model for _, registrations in listening for r in registrations):
        raise RuntimeError(
            f"{caller} runs the model's own components, but dictionaries are spliced into it (hooked.sae);"
            " run it outside the `model.saes(...)` block, or after model.reset_saes()"
        )
    registered = [name for name, registrations in listening if any(not r.part_of_model for r in registrations)]
    if registered:
        raise RuntimeError(
            f"{caller} runs the model without outside hooks, but hooks are registered at {registered[:3]};"
            " remove them (model.reset_hooks()) or add them to every variant"
        )
