"""Edge patching as one batched forward: V edge masks over the same B prompts, V * B rows.

How an edge mask becomes a number, step by step:

1. **Two recorded runs.** The clean and the corrupt prompts are run once each (`record`), keeping every
   source's write ([n_sources, B, pos, d_model]: the embedding, each head's `hook_result`, each MLP's
   `hook_mlp_out`) and the residual stream entering every stage. The *patched value* of a source is its
   corrupt write (or their mean, or zero: `patched_values`).
2. **Rows.** Variant v owns rows v*B .. (v+1)*B. As the forward reaches each source, hooks compute, for
   every row, `delta[s] = patched[s] - current[s]`: what would change if that row's receivers read the
   patched value instead of what the source wrote in *this* forward (which already carries the effect of
   every patched edge upstream of it).
3. **Receivers.** At every receiver (a head's `hook_q_input` / `hook_k_input` / `hook_v_input` slot, an
   MLP's `hook_mlp_in`, the final residual stream for `logits`) the input becomes
   `input + sum over s of mask[v, s, r] * delta[s]`, one einsum per hook point for all rows and heads at
   once. A receiver with no patched edge is not split and costs nothing.
4. **Where the forward starts.** Rows are identical to the clean run until the first stage a patched
   receiver reads at, so the forward starts there, from the clean run's residual stream and source writes
   (ACDC's trials, which patch late receivers first, recompute only the last layers).

Patching no edge gives the clean run, every edge the corrupt run, every edge into one receiver the
corrupt value of that receiver's input: each up to float rounding, since per-head inputs sum in another
order than the fused projection (tests/circuits/test_circuits.py checks each against a plain-hook computation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.circuits.graph import Graph
from hooked.interventions.positions import positions_mask
from hooked.interventions.row_blocks import Prompts
from hooked.interventions.sweeps import MetricReads, run_stage
from hooked.rows import running_rows

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Ablation = Literal["corrupt", "mean", "zero"]
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
    stages = [receiver.start for receiver, hit in zip(graph.receivers, patched.tolist()) if hit]
    return min(stages, default=2 * graph.n_layers)


def run_masks(
    model: HookedTransformer,
    graph: Graph,
    prompts: Prompts,
    masks: Tensor,
    patched: Tensor,
    clean: Run,
    reads: MetricReads,
    at_positions: dict[int, Tensor] | None = None,
) -> Tensor:
    """The metric's logits of every row block: [V * B, ...] for V masks [V, n_sources, n_receivers] (bool).

    `at_positions` maps a position in the prompt (negative: from each prompt's end) to more masks
    [V, n_sources, n_receivers] whose edges are patched at that position only (position-aware edges).
    """
    copies, batch = masks.shape[0], prompts.tokens.shape[0]
    pos, d_model = prompts.tokens.shape[1], model.cfg.d_model
    device = clean.outputs.device
    exists = graph.edge_mask().to(device)
    # (masks, where in [B pos] they apply: None everywhere); a position-aware group writes one column per prompt
    groups = [(masks.to(device) & exists, None)]
    for position, position_masks in (at_positions or {}).items():
        groups.append((position_masks.to(device) & exists, _columns_at(prompts, position)))
    union = torch.stack([group for group, _ in groups]).any(0)
    n_stages = 2 * graph.n_layers
    # The last MLP half recomputes the final residual stream when only `logits` is patched.
    start = min(first_stage(graph, union), n_stages - 1)
    active = torch.nonzero(union.any(0).any(1)).flatten().tolist()  # sources some patched edge reads
    # Sources upstream of `start` write as in the clean run in every row: their deltas are shared by all
    # variants ([k, B, pos, d_model]). The others are read off as this forward writes them, per row.
    shared = [source for source in active if graph.sources[source].stage < start]
    live = [source for source in active if graph.sources[source].stage >= start]
    shared_delta = torch.stack([patched[s] - clean.outputs[s] for s in shared]) if shared else None
    slot = {source: i for i, source in enumerate(live)}
    live_delta = clean.outputs.new_empty(len(live), copies, batch, pos, d_model)

    hooks = []
    by_source_point: dict[str, list[tuple[int, int | None]]] = {}
    for source in live:
        by_source_point.setdefault(graph.sources[source].hook_name, []).append((source, graph.sources[source].head))
    for name, entries in by_source_point.items():

        def capture(activation: Tensor, hook, entries=entries) -> None:
            for source, head in entries:
                current = activation if head is None else activation[:, :, head]
                live_delta[slot[source]] = patched[source] - current.view(copies, batch, pos, d_model)

        hooks.append((name, capture))

    # Receivers: per hook point and group, the weights [V, k, heads] of the shared and of the k live upstream sources.
    by_point: dict[str, list[int]] = {}
    for index, receiver in enumerate(graph.receivers):
        by_point.setdefault(receiver.hook_name, []).append(index)
    for name, indices in by_point.items():
        if not bool(union[:, :, indices].any()):
            continue
        receivers = sorted((graph.receivers[i] for i in indices), key=lambda r: r.head or 0)
        columns = [graph.receiver_index(r.name) for r in receivers]
        n_live = sum(1 for source in live if source < receivers[0].n_upstream)
        per_head = receivers[0].head is not None
        terms = []
        for group, where in groups:
            weights = group[:, :, columns].to(clean.outputs.dtype)
            if bool(weights.any()):
                terms.append((weights[:, shared] if shared else None, weights[:, live[:n_live]], where))

        def receive(activation: Tensor, hook, terms=terms, n_live=n_live, per_head=per_head) -> Tensor:
            added = None
            for shared_weights, live_weights, where in terms:
                part = None
                if shared_weights is not None and bool(shared_weights.any()):
                    part = (
                        torch.einsum("vsh,sbpd->vbphd", shared_weights, shared_delta)
                        if per_head
                        else torch.einsum("vs,sbpd->vbpd", shared_weights[:, :, 0], shared_delta)
                    )
                if n_live and bool(live_weights.any()):
                    deltas = live_delta[:n_live]  # [k V B pos d_model]
                    more = (
                        torch.einsum("vsh,svbpd->vbphd", live_weights, deltas)
                        if per_head
                        else torch.einsum("vs,svbpd->vbpd", live_weights[:, :, 0], deltas)
                    )
                    part = more if part is None else part + more
                if part is not None and where is not None:  # one column per prompt: [1 B pos 1 (1)]
                    part = part * where.view(1, batch, pos, *([1] * (part.ndim - 3))).to(part.dtype)
                if part is not None:
                    added = part if added is None else added + part
            return activation if added is None else activation + added.reshape(activation.shape)

        hooks.append((name, receive))

    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        final = _stage_loop(model, prompts, copies, start, None if start < 0 else clean.resid[start])
        return reads.logits(model, final, prompts.key_valid)


def _columns_at(prompts: Prompts, position: int) -> Tensor:
    """[B pos] True at the column holding `position` of each prompt (negative: from its end); every prompt
    must have it (`hooked.interventions.positions`)."""
    lengths = prompts.position_ids[:, -1:] + 1  # the last column's position: a right pad repeats the prompt's last
    return positions_mask(
        (position,), prompts.position_ids, prompts.key_valid, lengths, what=f"an edge at position {position}"
    )


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
