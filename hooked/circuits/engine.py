"""Edge patching as one batched forward: V edge masks over the same B prompts, V * B rows.

How an edge mask becomes a number, step by step:

1. **Two recorded runs.** The clean and the corrupt prompts are run once each (`record`), keeping every
   source's write ([n_sources, B, pos, d_model]: the embedding, each head's `hook_result`, each MLP's
   `hook_mlp_out`) and the residual stream entering every stage. The *patched value* of a source is its
   corrupt write (or their mean, or zero: `patched_values`).
2. **Rows.** Variant v owns rows v*B .. (v+1)*B. As the forward reaches each source, a hook
   (`_CaptureDeltas`) computes, for every row, `delta[s] = patched[s] - current[s]`: what would change if
   that row's receivers read the patched value instead of what the source wrote in *this* forward (which
   already carries the effect of every patched edge upstream of it).
3. **Receivers.** At every receiver (a head's `hook_q_input` / `hook_k_input` / `hook_v_input` slot, an
   MLP's `hook_mlp_in`, the final residual stream for `logits`) a hook (`_Receive`) makes the input
   `input + sum over s of mask[v, s, r] * delta[s]`, one einsum per hook point for all rows and heads at
   once. A receiver with no patched edge is not split and costs nothing.
4. **Where the forward starts.** Rows are identical to the clean run until the first stage a patched
   receiver reads at, so the forward starts there, from the clean run's residual stream and source writes
   (ACDC's trials, which patch late receivers first, recompute only the last layers): the deltas of the
   sources upstream of that stage are the same in every row, computed once (`_SourceDeltas`).

`run_masks` reads in that order: plan the mask groups and the start stage, the source captures, the
receivers, then the forward.

Patching no edge gives the clean run, every edge the corrupt run, every edge into one receiver the
corrupt value of that receiver's input: each up to float rounding, since per-head inputs sum in another
order than the fused projection (tests/circuits/test_circuits.py checks each against a plain-hook computation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.circuits.graph import Graph
from hooked.interventions.positions import PerPrompt, positions_mask
from hooked.interventions.row_blocks import Prompts
from hooked.interventions.sweeps import MetricReads, run_stage
from hooked.rows import running_rows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Ablation = Literal["corrupt", "mean", "zero"]
Where = int | tuple[int, ...] | PerPrompt  # where position-aware edges are patched: `columns_at`
ABLATIONS = ("corrupt", "mean", "zero")


@dataclass(frozen=True)
class Run:
    """One recorded forward: every source's write, the residual entering every stage, the metric's logits."""

    outputs: Tensor  # [n_sources, B, pos, d_model]
    resid: dict[int, Tensor]  # stage -> [B pos d_model] entering it (2L: the final residual stream)
    reduced: Tensor  # the logits the metric reads ([B, 1 or pos, columns])


def _stage_loop(
    model: HookedTransformer,
    prompts: Prompts,
    copies: int,
    start: int,
    start_resid: Tensor | None,
    keep: dict[int, Tensor] | None = None,
) -> Tensor:
    """Run the stages from `start` (-1: the embedding) to the end on `copies` blocks of the prompts; the
    final residual stream. `keep` collects the residual entering each stage."""
    tokens, rows, mask = prompts.repeated(copies)
    n_stages = 2 * model.cfg.n_layers
    with running_rows(rows):
        if start < 0:
            resid, start = model.embed(tokens, rows.position_ids), 0
        else:
            resid = start_resid if copies == 1 else start_resid.repeat(copies, 1, 1)
        inputs = model.block_inputs(rows.position_ids, mask, resid.dtype)
        for stage in range(start, n_stages):
            if keep is not None:
                keep[stage] = resid
            resid = run_stage(model, stage, resid, inputs)
        if keep is not None:
            keep[n_stages] = resid
        return resid


def record(model: HookedTransformer, graph: Graph, prompts: Prompts, reads: MetricReads) -> Run:
    """The unpatched forward, keeping every source's write and every stage's residual stream."""
    outputs: list[Tensor | None] = [None] * len(graph.sources)
    by_point: dict[str, list[tuple[int, int | None]]] = {}
    for index, source in enumerate(graph.sources):
        by_point.setdefault(source.hook_name, []).append((index, source.head))

    def keep(activation: Tensor, hook) -> None:
        for index, head in by_point[hook.name]:
            outputs[index] = activation if head is None else activation[:, :, head]

    resid: dict[int, Tensor] = {}
    with torch.no_grad(), model.hooks(fwd_hooks=[(name, keep) for name in by_point]):
        final = _stage_loop(model, prompts, 1, -1, None, keep=resid)
        reduced = reads.logits(model, final, prompts.key_valid)
    return Run(torch.stack(outputs), resid, reduced)


def patched_values(ablation: Ablation, clean: Run, corrupt: Run | None, key_valid: Tensor | None) -> Tensor:
    """What a patched edge carries from each source, [n_sources, B, pos, d_model] (or broadcastable).

    "corrupt": the source's write on the corrupt prompt paired with each clean one; "mean": its write
    averaged over the corrupt prompts and their real tokens (one vector per source); "zero": nothing.
    """
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {', '.join(map(repr, ABLATIONS))}, not {ablation!r}")
    if ablation == "zero":
        return torch.zeros_like(clean.outputs[:, :1, :1])
    if corrupt is None:
        raise ValueError(f"ablation={ablation!r} needs corrupt prompts")
    if ablation == "corrupt":
        return corrupt.outputs
    outputs = corrupt.outputs
    if key_valid is None:
        return outputs.mean(dim=(1, 2), keepdim=True)
    real = key_valid.to(outputs.dtype)[None, :, :, None]
    return (outputs * real).sum(dim=(1, 2), keepdim=True) / real.sum()


def first_stage(graph: Graph, masks: Tensor) -> int:
    """The earliest stage at which a receiver of any mask reads a patched edge (2L: none)."""
    patched = masks.any(0).any(0)
    stages = [receiver.start for receiver, hit in zip(graph.receivers, patched.tolist(), strict=True) if hit]
    return min(stages, default=2 * graph.n_layers)


def run_masks(
    model: HookedTransformer,
    graph: Graph,
    prompts: Prompts,
    masks: Tensor,
    patched: Tensor,
    clean: Run,
    reads: MetricReads,
    at_positions: dict[Where, Tensor] | None = None,
) -> Tensor:
    """The metric's logits of every row block: [V * B, ...] for V masks [V, n_sources, n_receivers] (bool).

    `at_positions` maps positions in the prompt (an int, negative from each prompt's end; a tuple of them; or
    one per prompt, `PerPrompt`) to more masks [V, n_sources, n_receivers] whose edges are patched there only
    (position-aware edges).
    """
    groups = _mask_groups(graph, prompts, masks, at_positions, clean.outputs.device)
    union = torch.stack([group.masks for group in groups]).any(0)
    # The last MLP half recomputes the final residual stream when only `logits` is patched.
    start = min(first_stage(graph, union), 2 * graph.n_layers - 1)
    rows = (masks.shape[0], *prompts.tokens.shape, model.cfg.d_model)  # (V, B, pos, d_model)
    deltas = _SourceDeltas.plan(graph, union, start, patched, clean, rows)
    hooks = _source_captures(graph, deltas, patched) + _receivers(graph, groups, union, deltas, clean.outputs.dtype)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        final = _stage_loop(model, prompts, masks.shape[0], start, None if start < 0 else clean.resid[start])
        return reads.logits(model, final, prompts.key_valid)


def _mask_groups(
    graph: Graph, prompts: Prompts, masks: Tensor, at_positions: dict[Where, Tensor] | None, device: torch.device
) -> list[_MaskGroup]:
    """The masks patched everywhere, then one group per position of `at_positions`; edges that do not exist dropped."""
    exists = graph.edge_mask().to(device)
    groups = [_MaskGroup(masks.to(device) & exists, None)]
    for position, position_masks in (at_positions or {}).items():
        groups.append(_MaskGroup(position_masks.to(device) & exists, columns_at(prompts, position)))
    return groups


@dataclass(frozen=True, eq=False)
class _MaskGroup:
    """Edge masks patched together, and where in each prompt they apply."""

    masks: Tensor  # [V n_sources n_receivers] bool, existing edges only
    where: Tensor | None  # [B pos] True at the columns of each prompt they apply at; None: every column


@dataclass(frozen=True, eq=False)
class _SourceDeltas:
    """`delta[s] = patched[s] - current[s]` for the sources some patched edge reads (step 2 of the module docstring).

    Sources upstream of the start stage write as in the clean run in every row: their deltas are computed once
    here and shared by all variants. The others are live: `_CaptureDeltas` fills their deltas, per row, as this
    forward writes them.
    """

    shared: list[int]  # sources upstream of the start stage
    live: list[int]  # sources at or after it, in graph order
    shared_delta: Tensor | None  # [k_shared B pos d_model]; None when no source is shared
    live_delta: Tensor  # [k_live V B pos d_model], filled during the forward

    @classmethod
    def plan(cls, graph: Graph, union: Tensor, start: int, patched: Tensor, clean: Run, rows: tuple) -> _SourceDeltas:
        """`union` [n_sources n_receivers]: every edge some group patches; `rows`: (V, B, pos, d_model)."""
        active = torch.nonzero(union.any(0).any(1)).flatten().tolist()  # sources some patched edge reads
        shared = [source for source in active if graph.sources[source].stage < start]
        live = [source for source in active if graph.sources[source].stage >= start]
        shared_delta = torch.stack([patched[s] - clean.outputs[s] for s in shared]) if shared else None
        return cls(shared, live, shared_delta, clean.outputs.new_empty(len(live), *rows))


def _source_captures(graph: Graph, deltas: _SourceDeltas, patched: Tensor) -> list[tuple[str, _CaptureDeltas]]:
    """One `_CaptureDeltas` per hook point that some live source writes at."""
    by_point: dict[str, list[tuple[int, int | None, int]]] = {}
    for slot, source in enumerate(deltas.live):
        by_point.setdefault(graph.sources[source].hook_name, []).append((source, graph.sources[source].head, slot))
    return [(name, _CaptureDeltas(tuple(sources), patched, deltas.live_delta)) for name, sources in by_point.items()]


@dataclass(frozen=True, eq=False)
class _CaptureDeltas:
    """The hook at a source's point: `patched[s] - what this forward wrote`, per row, for each live source there."""

    sources: tuple[tuple[int, int | None, int], ...]  # (source, its head slot or None, its slot in live_delta)
    patched: Tensor = field(repr=False)
    live_delta: Tensor = field(repr=False)  # [k_live V B pos d_model], written here

    def __call__(self, activation: Tensor, hook) -> None:
        rows = self.live_delta.shape[1:]  # (V, B, pos, d_model)
        for source, head, slot in self.sources:
            current = activation if head is None else activation[:, :, head]
            self.live_delta[slot] = self.patched[source] - current.view(*rows)


def _receivers(
    graph: Graph, groups: list[_MaskGroup], union: Tensor, deltas: _SourceDeltas, dtype: torch.dtype
) -> list[tuple[str, _Receive]]:
    """One `_Receive` per hook point where some receiver reads a patched edge; the others are not hooked."""
    by_point: dict[str, list[int]] = {}
    for index, receiver in enumerate(graph.receivers):
        by_point.setdefault(receiver.hook_name, []).append(index)
    return [
        (name, _Receive.at(graph, indices, groups, deltas, dtype))
        for name, indices in by_point.items()
        if bool(union[:, :, indices].any())
    ]


@dataclass(frozen=True, eq=False)
class _Receive:
    """The hook at a receiver's point: `input + sum over s of mask[v, s, r] * delta[s]`, all rows and heads at once."""

    terms: tuple[_Term, ...]
    deltas: _SourceDeltas = field(repr=False)
    n_live: int  # how many live sources write upstream of this point
    per_head: bool  # the point has a head axis (q/k/v inputs); else one whole stream (MLP input, logits)

    @classmethod
    def at(cls, graph: Graph, indices: list[int], groups: list[_MaskGroup], deltas: _SourceDeltas, dtype) -> _Receive:
        """The hook for the receivers `indices` that share one hook point."""
        receivers = sorted((graph.receivers[i] for i in indices), key=lambda r: r.head or 0)
        columns = [graph.receiver_index(r.name) for r in receivers]
        n_live = sum(1 for source in deltas.live if source < receivers[0].n_upstream)
        terms = []
        for group in groups:
            weights = group.masks[:, :, columns].to(dtype)
            if bool(weights.any()):
                shared = weights[:, deltas.shared] if deltas.shared else None
                terms.append(_Term(shared, weights[:, deltas.live[:n_live]], group.where))
        return cls(tuple(terms), deltas, n_live, receivers[0].head is not None)

    def __call__(self, activation: Tensor, hook) -> Tensor:
        added = None
        for term in self.terms:
            part = self._added_by(term)
            if part is not None:
                added = part if added is None else added + part
        return activation if added is None else activation + added.reshape(activation.shape)

    def _added_by(self, term: _Term) -> Tensor | None:
        """One group's `sum over s of mask * delta`: [V B pos heads d_model] ([V B pos d_model] without heads)."""
        part = None
        if term.shared_weights is not None and bool(term.shared_weights.any()):
            part = self._weighted(term.shared_weights, self.deltas.shared_delta, "sbpd")
        if self.n_live and bool(term.live_weights.any()):
            more = self._weighted(term.live_weights, self.deltas.live_delta[: self.n_live], "svbpd")
            part = more if part is None else part + more
        if part is not None and term.where is not None:  # one column per prompt: [1 B pos 1 (1)]
            part = part * term.where.view(1, *term.where.shape, *([1] * (part.ndim - 3))).to(part.dtype)
        return part

    def _weighted(self, weights: Tensor, deltas: Tensor, delta_axes: str) -> Tensor:
        """`sum over s of weights[v, s, h] * deltas[s, (v), b, p, d]`; `deltas` shared ("sbpd") or per row ("svbpd")."""
        if self.per_head:
            return torch.einsum(f"vsh,{delta_axes}->vbphd", weights, deltas)
        return torch.einsum(f"vs,{delta_axes}->vbpd", weights[:, :, 0], deltas)


@dataclass(frozen=True, eq=False)
class _Term:
    """One mask group's weights at a receiver's point: [V k heads] of the shared and of the live upstream sources."""

    shared_weights: Tensor | None  # None when no source is shared
    live_weights: Tensor
    where: Tensor | None  # as `_MaskGroup.where`


def columns_at(prompts: Prompts, where: Where) -> Tensor:
    """[B pos] True at the columns holding the positions `where` of each prompt (an edge's own `@p`, an int; or
    `positions=`: a tuple for every prompt, or `PerPrompt`, one per prompt; negative from its end); every prompt
    must have them (`hooked.interventions.positions`)."""
    lengths = prompts.position_ids[:, -1:] + 1  # the last column's position: a right pad repeats the prompt's last
    what = f"an edge at position {where}" if isinstance(where, int) else "positions="
    selected = (where,) if isinstance(where, int) else where
    return positions_mask(selected, prompts.position_ids, prompts.key_valid, lengths, what=what)


def rows_per_forward(model: HookedTransformer, graph: Graph, prompts: Prompts, max_bytes: int | None) -> int:
    """How many variants one forward takes: the deltas and activations of a variant, within `max_bytes`
    (default: a quarter of the model's weights, at least 512 MiB)."""
    batch, pos = prompts.tokens.shape
    cfg = model.cfg
    if max_bytes is None:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        max_bytes = max(weights // 4, 512 * 2**20)
    itemsize = model.dtype.itemsize
    heads = cfg.n_heads + 2 * cfg.n_kv_heads
    per_variant = (
        batch
        * pos
        * itemsize
        * (
            len(graph.sources) * cfg.d_model  # the deltas
            + 3 * heads * cfg.d_model  # split inputs, their norms, the einsum's result
            + 8 * cfg.d_model
            + 4 * cfg.n_heads * cfg.d_head
            + 3 * cfg.d_mlp
            + 2 * cfg.n_heads * pos
        )
    )
    return max(1, int(max_bytes // per_variant))
