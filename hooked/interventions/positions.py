"""Positions in the prompt, as every `positions=` reads them: a set for every prompt, or one per prompt.

    ablate.zero(heads=9, positions=[3, -1])            # positions 3 and -1 of every prompt
    ablate.zero(heads=9, positions=task.positions["S2"])   # a 1-D tensor [batch]: one position per prompt
    ablate.zero(heads=9, positions=ablate.per_prompt([4, 6, 5]))

A position counts a prompt's own tokens (BOS included) from 0, or back from its end (-1 is its last token),
so padding, left or right, never shifts it (`positions=-1` is each prompt's last real token, also in a
right-padded batch, where the last column is padding for the shorter prompts). A position some prompt
does not have raises, naming the prompt lengths.
`hooked.interventions.ablate`, `hooked.interventions.patch` and the position-aware edges of `hooked.circuits` share
these rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

Positions = Union[int, Sequence[int], Tensor, "PerPrompt", None]  # a set for every prompt, or one per prompt


def as_ints(selector, name: str) -> tuple[int, ...] | None:
    """An int, a list of ints or a tensor of them as a tuple (None stays None); anything else raises."""
    if selector is None:
        return None
    given = f"{selector!r} ({type(selector).__name__})"
    if isinstance(selector, Tensor):
        given = f"a {selector.dtype} tensor {selector.tolist()}"
        selector = selector.tolist()
    if isinstance(selector, int) and not isinstance(selector, bool):
        return (selector,)
    # A float or a bool is not an index (heads=2.0, heads=True): refused, not rounded or read as 1.
    iterable = hasattr(selector, "__iter__") and not isinstance(selector, (str, bytes, Mapping))
    values = tuple(selector) if iterable else ()
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(
            f"{name}= takes an int or a non-empty list of ints (or an integer tensor), got {given};"
            f" e.g. {name}=2 or {name}=[2, 5]"
        )
    return values


@dataclass(frozen=True, repr=False)
class PerPrompt:
    """One position per prompt: prompt i is selected at `values[i]` only (a list is a set for every prompt).

    Made by `per_prompt([...])`, or from a 1-D integer tensor given as `positions=`. Inside a sweep each
    variant sees its own block of the prompts, so `values` lines up with the prompts as given.
    """

    values: tuple[int, ...]

    def __post_init__(self):
        values = tuple(self.values)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise TypeError(f"per_prompt() takes one int position per prompt, got {self.values!r}")
        object.__setattr__(self, "values", values)

    def __len__(self) -> int:
        return len(self.values)

    def to_json(self) -> dict:
        """The positions as plain data (sweep provenance): {"per_prompt": [3, 5, ...]}."""
        return {"per_prompt": list(self.values)}

    def __repr__(self) -> str:
        shown = ", ".join(map(str, self.values[:8]))
        if len(self.values) > 8:
            shown += f", ... ({len(self.values)} prompts)"
        return f"per_prompt[{shown}]"


def per_prompt(positions: Sequence[int] | Tensor) -> PerPrompt:
    """One position per prompt, `positions=per_prompt([3, 5, 4])`: prompt i at position `positions[i]`.

    The same as a 1-D integer tensor (`positions=torch.tensor([3, 5, 4])`, or `task.positions["S2"]`);
    a plain list `positions=[3, 5, 4]` instead selects the three positions in every prompt.
    """
    if isinstance(positions, PerPrompt):
        return positions
    if isinstance(positions, Tensor):
        if (
            positions.ndim != 1
            or positions.dtype.is_floating_point
            or positions.dtype == torch.bool
            or positions.is_complex()
        ):
            raise TypeError(
                f"per_prompt() takes a 1-D integer tensor [batch], got {positions.dtype} of shape "
                f"{list(positions.shape)}"
            )
        positions = positions.tolist()
    if isinstance(positions, (int, str)):
        raise TypeError(f"per_prompt() takes one position per prompt (a list or a 1-D tensor), not {positions!r}")
    return PerPrompt(tuple(positions))


def as_positions(positions) -> tuple[int, ...] | PerPrompt | None:
    """positions= as given -> a set of positions for every prompt (tuple) or one per prompt (PerPrompt)."""
    if positions is None or isinstance(positions, PerPrompt):
        return positions
    if isinstance(positions, Tensor):
        if positions.ndim == 1 and (
            positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex()
        ):
            raise TypeError(
                f"positions= takes one position per prompt as a 1-D integer tensor [batch], got a {positions.dtype}"
                f" tensor {positions.tolist()[:8]}; e.g. positions=torch.tensor([3, 5, 4])"
            )
        if positions.ndim == 1:
            return per_prompt(positions)
        if positions.ndim > 1:
            raise ValueError(
                f"positions= got a tensor of shape {list(positions.shape)}; give one position per prompt as a 1-D"
                " tensor [batch] (torch.tensor([3, 5, ...]) or task.positions['S2']), or a list of positions to"
                " select in every prompt ([3, -1])"
            )
    return as_ints(positions, "positions")  # an int or a list (a 0-d tensor: one position for every prompt)


def positions_record(positions) -> list[int] | dict | None:
    """positions= as plain data for a result's provenance."""
    positions = as_positions(positions)
    if positions is None:
        return None
    return positions.to_json() if isinstance(positions, PerPrompt) else list(positions)


def positions_mask(
    positions: tuple[int, ...] | PerPrompt,
    position_ids: Tensor,
    attention_mask: Tensor | None,
    lengths: Tensor,
    generating: bool = False,
    what: str = "positions=",
    prompts: Tensor | None = None,
) -> Tensor:
    """[batch pos] True at the real tokens whose position in their prompt is selected: a set of positions for
    every row, or one per row (`PerPrompt`). `lengths` [batch 1] is what negative positions count back from
    (each prompt's length); `what` names the caller in errors. `prompts` [batch] (`Rows.prompts`): the prompt of the
    caller's batch each row runs, where an engine runs prompts as separate requests.
    """
    batch = position_ids.shape[0]
    if isinstance(positions, PerPrompt) and prompts is not None:
        if int(prompts.max()) >= len(positions):
            raise ValueError(
                f"{what}: positions= gives {len(positions)} positions, one per prompt, but this call runs prompt"
                f" {int(prompts.max())}; give one position per prompt, in the order of the prompts"
            )
        wanted = torch.tensor(positions.values, device=position_ids.device)[prompts.to(position_ids.device)][:, None]
    elif isinstance(positions, PerPrompt):
        if len(positions) != batch:
            raise ValueError(
                f"{what}: positions= gives {len(positions)} positions, one per prompt, but this forward runs {batch}"
                " prompts; give one position per prompt, in the order of the prompts"
            )
        wanted = torch.tensor(positions.values, device=position_ids.device)[:, None]  # [batch 1]
    else:
        wanted = torch.tensor(positions, device=position_ids.device)[None].expand(batch, -1)  # [batch k]
    lengths = lengths.to(position_ids.device)
    _check_in_prompts(what, wanted, lengths, generating)
    target = torch.where(wanted < 0, wanted + lengths, wanted)  # [batch k]
    at = (position_ids[:, :, None] == target[:, None, :]).any(-1)
    return at if attention_mask is None else at & attention_mask


def _check_in_prompts(what: str, wanted: Tensor, lengths: Tensor, generating: bool) -> None:
    """Raise when a selected position is not in its prompt: it would silently select nothing there.

    While generating (`Rows.lengths` set) a position past the prompt is a generated token, which a later
    decode step computes, so only positions before the prompt's start (-p > its length) are refused.
    """
    bad = wanted < -lengths
    if not generating:
        bad |= wanted >= lengths
    if not bool(bad.any()):
        return
    row, column = (int(i) for i in bad.nonzero()[0])
    shown = lengths[:, 0].tolist()
    listed = ", ".join(map(str, shown[:16])) + (f", ... ({len(shown)} prompts)" if len(shown) > 16 else "")
    length = shown[row]
    raise ValueError(
        f"{what}: position {int(wanted[row, column])} does not exist in prompt {row}, which has"
        f" {length} tokens (prompt lengths: [{listed}]); positions count each prompt's tokens, BOS included, from 0"
        f" to length-1, or back from its end (-1 .. -length)"
    )


def last_real(values: Tensor, attention_mask: Tensor | None) -> Tensor:
    """`values[:, -1:]` read at each row's last real token: [batch 1 ...].

    That is the last column unless a row ends with padding (right padding), whose last real token is
    read instead. `attention_mask` is [rows pos] (True = real token); `values` [batch pos ...] may hold
    several blocks of those rows one after another (a sweep's variants), each read with the same mask.
    """
    if attention_mask is None or bool(attention_mask[:, -1].all()):
        return values[:, -1:]
    mask = attention_mask.to(device=values.device, dtype=torch.bool)
    if values.shape[0] % mask.shape[0] or values.shape[1] != mask.shape[1]:
        raise ValueError(
            f"values of shape {tuple(values.shape)} do not line up with an attention mask of shape"
            f" {tuple(mask.shape)} ([batch pos], or several blocks of its rows)"
        )
    mask = mask.repeat(values.shape[0] // mask.shape[0], 1)
    last = mask.shape[1] - 1 - mask.flip(-1).long().argmax(-1)  # [batch]: each row's last True column
    index = last.view(-1, 1, *[1] * (values.ndim - 2)).expand(-1, 1, *values.shape[2:])
    return values.gather(1, index)
