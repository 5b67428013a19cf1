"""A model's state dict read from its checkpoint: renamed, stacked, sliced for tensor parallelism, and checked.

The model declares its checkpoint's layout as data (docs/adding-a-model.md): `checkpoint_renames`
(key pattern -> parameter name), `checkpoint_ignored` (keys read by nobody) and `checkpoint_stacked`
(keys that fill one slice of a stacked parameter, e.g. one expert of [n_experts, ...]; docs/qwen3.md).
`read_state_dict` walks every key of every safetensors file once, reads each into its preallocated
destination in the target dtype and device, and raises one `CheckpointError` listing every missing,
unexpected and mis-shaped tensor before the model is touched. Under tensor parallelism a plan from
`hooked.distributed.parallelize` says which slices this rank holds, and only their bytes are read
(docs/scaling.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import Tensor

from hooked.weights.allocation import empty_weight
from hooked.weights.errors import CheckpointError
from hooked.weights.safetensors import SafetensorsFile, safetensors_files


def read_state_dict(directory: Path, model, dtype: torch.dtype, device: torch.device, plan=None) -> dict[str, Tensor]:
    """Every parameter of `model`, read from the checkpoint into dtype/device, renamed and checked.

    `plan` (tensor parallelism, `hooked.distributed.parallelize`) maps a parameter to the part of the
    tensor on disk this rank holds: (dim, [start, stop) ranges along it, concatenated; the shape on
    disk). Only those bytes are read; stacked experts outside the rank's range are skipped.
    """
    plan = plan or {}
    expected = dict(model.state_dict(keep_vars=True))
    renames = [(re.compile(pattern), replacement) for pattern, replacement in model.checkpoint_renames]
    ignored = [re.compile(pattern) for pattern in model.checkpoint_ignored]
    stacked = [(re.compile(entry[0]), *entry[1:]) for entry in getattr(model, "checkpoint_stacked", ())]
    filled: dict[str, tuple[set, int]] = {}  # stacked parameter -> (the (slice, part) pairs read, parts per slice)
    state: dict[str, Tensor] = {}
    unexpected, mis_shaped = [], []
    for path in safetensors_files(directory):
        with SafetensorsFile(path) as file:
            for key in file.keys():
                target = _rename(key, renames)
                if target is None and stacked:
                    outcome = _read_slice(file, key, stacked, expected, state, filled, dtype, device, plan)
                    if outcome is not None:  # the key is one slice of a stacked parameter
                        if outcome == "unexpected":
                            unexpected.append(key)
                        elif outcome != "read":
                            mis_shaped.append(outcome)
                        continue
                if target is None:
                    if not any(pattern.fullmatch(key) for pattern in ignored):
                        unexpected.append(key)
                    continue
                if target not in expected or target in state:
                    unexpected.append(key)
                    continue
                on_disk = plan[target][2] if target in plan else expected[target].shape
                if file.shape(key) != on_disk:
                    mis_shaped.append(f"{key}: {tuple(file.shape(key))} in the file, {tuple(on_disk)} expected")
                    continue
                destination = empty_weight(expected[target].shape, dtype, device)
                if target in plan:  # this rank's slices only
                    dim, spans, _ = plan[target]
                    offset = 0
                    for start, stop in spans:
                        file.read_part_into(key, dim, start, stop, destination.narrow(dim, offset, stop - start))
                        offset += stop - start
                    state[target] = destination
                else:
                    state[target] = file.read_into(key, destination)
    missing = [name for name in expected if name not in state]
    missing += [
        f"{name}[{i}]" + (f" (part {part + 1} of {parts})" if parts > 1 else "")
        for name, (done, parts) in filled.items()
        if name in state  # (a parameter with no piece read is listed once above)
        for i in range(expected[name].shape[0])
        for part in range(parts)
        if (i, part) not in done
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if unexpected:
        problems.append(f"unexpected tensors: {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
    if mis_shaped:
        problems.append("mis-shaped tensors: " + "; ".join(mis_shaped[:10]))
    if problems:
        raise CheckpointError(
            f"checkpoint {directory} does not match {type(model).__name__}({model.cfg}): " + " | ".join(problems)
        )
    return state


def _read_slice(file, key: str, stacked, expected, state, filled, dtype, device, plan=None) -> str | None:
    """Read `key` into one slice of a stacked parameter (e.g. one expert of [n_experts, ...]).

    A `checkpoint_stacked` entry is (key pattern with a named group `expert`, parameter name
    template[, (part, parts)]): the group gives the index along axis 0; with (part, parts) the tensor
    fills block `part` of `parts` equal blocks along axis 1 (e.g. gate and up fused into one
    [n_experts, 2 * d_mlp, d_model] parameter). The parameter is allocated once and filled piece by
    piece, so stacking costs no second copy. Under tensor parallelism `plan` gives the range of axis 0
    this rank holds, and other slices are skipped (their shape still checked). Returns None when `key`
    matches no entry, "read", "unexpected" (unknown parameter, index out of range, read twice), or a
    message when its shape is wrong.
    """
    for pattern, replacement, *split in stacked:
        match = pattern.fullmatch(key)
        if match is None:
            continue
        target, index = match.expand(replacement), int(match.group("expert"))
        part, parts = split[0] if split else (0, 1)
        if plan and target in plan:  # expert parallelism: this rank holds experts [start, stop)
            ((start, stop),) = plan[target][1]
            whole = plan[target][2]
            if not 0 <= index < whole[0]:
                return "unexpected"
            if not start <= index < stop:  # another rank's expert: not read here
                if file.shape(key) != _piece_shape(whole, parts):
                    return f"{key}: {tuple(file.shape(key))} in the file, {tuple(_piece_shape(whole, parts))} expected"
                return "read"
            index -= start
        done, _ = filled.setdefault(target, (set(), parts)) if target in expected else (set(), parts)
        if target not in expected or not 0 <= index < expected[target].shape[0] or (index, part) in done:
            return "unexpected"
        if target in state and not done:  # already read whole (a fused tensor of another layout): never overwrite it
            return "unexpected"
        shape = expected[target].shape
        piece = _piece_shape(shape, parts)
        if file.shape(key) != piece:
            return (
                f"{key}: {tuple(file.shape(key))} in the file, {tuple(piece)} expected"
                f" (a piece of {target} {tuple(shape)})"
            )
        if target not in state:
            state[target] = empty_weight(shape, dtype, device)
        destination = (
            state[target][index] if parts == 1 else state[target][index, part * piece[0] : (part + 1) * piece[0]]
        )
        file.read_into(key, destination)
        done.add((index, part))
        return "read"
    return None


def _piece_shape(shape: torch.Size, parts: int) -> torch.Size:
    """The shape of one key on disk that fills one slice (or one of `parts` blocks of it) of a stacked parameter."""
    return shape[1:] if parts == 1 else torch.Size((shape[1] // parts, *shape[2:]))


def _rename(key: str, renames) -> str | None:
    for pattern, replacement in renames:
        match = pattern.fullmatch(key)
        if match:
            return match.expand(replacement)
    return None
