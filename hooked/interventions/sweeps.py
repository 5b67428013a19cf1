"""`hooked.sweep`: many variants of one forward, batched, with work shared by all variants done once.

    result = hooked.sweep(model, tokens, {"L9H9": ablate.hooks(model, "L9H9"), ...}, metric)

How a variant becomes a number in the table, step by step (the functions named follow `sweep` in this
file, in the order it calls them):

0. **The plan.** Each entry of the dict becomes a `PlannedVariant` (`plan_variants`): its name, its
   (hook name, callback) pairs with every name resolved and every callback checked, and its first stage.
1. **Rows.** The prompts are B rows. Each variant gets its own block of B rows; its callbacks are
   wrapped so they see only that block (`activation[rows]`, and a hook view whose `position_ids`,
   `attention_mask` and `slot_experts` are cut to the same rows: `OnRows` in `_run_chunk`). A callback
   written for a single run therefore works unchanged, and in-place edits stay in its rows.
2. **Where a variant starts.** A forward is a list of stages: embedding, then per block its attention
   half (`hook_resid_pre` .. `hook_resid_mid`) and its MLP half (`ln2` .. `hook_resid_post`), then the
   final norm. A variant's rows are identical to the base run's until the first stage one of its
   hooks sits in, so the base run is computed once (`_base_run`), keeping the residual stream entering
   every stage, and a variant's rows join the batch only at its first stage, as copies of that residual.
   A spliced transcoder that reads a point of an earlier stage than the one it writes (`hook_resid_mid` ->
   `hook_mlp_out`) needs its input from the same rows, so a variant never joins between the two
   (`spliced_spans`): it joins at the stage of the point read.
3. **Chunks.** Variants are sorted by first stage and cut into chunks of at most `max_rows` rows (by
   default a memory budget, `max_bytes`: `_chunks`). A chunk runs from the first stage of its first
   variant; later variants' rows are appended as the forward reaches their stage, so row blocks never
   move (`_run_chunk`).
4. **Only what the metric reads.** Only the positions and vocabulary columns the metric declares
   (`metric.position`, `metric.columns`) are computed at the end (`MetricReads`): a logit difference
   needs 2 columns at the last position, not [rows pos d_vocab]; and when it reads the last position
   only, the last block's MLP half (position-wise, like everything after it) runs on that position
   alone unless a hook of the chunk sits there.
5. **The table.** Each variant's block of B values is the metric on its rows, compared with the base
   run's (`_table`, then `SweepResult`).

Sweeps run under `torch.no_grad()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from hooked.hooks import EMBED_STAGE, HookFn, NameFilter
from hooked.interventions.metrics import check_prompts
from hooked.interventions.positions import last_real
from hooked.interventions.results import SweepResult, variant_names
from hooked.interventions.row_blocks import OnRows, Prompts, VariantError, registered_hooks  # noqa: F401  (VariantError: its old path)
from hooked.layers import position_ids_for
from hooked.rows import running_rows
from hooked.version import __version__

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Variants = Mapping[str, Sequence[tuple[NameFilter, HookFn]]]


# ----------------------------------------------------------------------------- stages
def stage_of(model: HookedTransformer, hook_name: str) -> int:
    """The first stage whose computation fires `hook_name`: -1 embedding, 2L / 2L+1 the halves of
    block L, 2 * n_layers the final norm (recorded on the point by the model, from its blocks' `mlp_stage`)."""
    return model.hook_dict[hook_name].stage


def run_stage(model: HookedTransformer, stage: int, resid: Tensor, inputs: tuple) -> Tensor:
    """Compute one stage (0 .. 2 * n_layers - 1) on the residual stream."""
    block = model.blocks[stage // 2]
    return block.attn_half(resid, *inputs) if stage % 2 == 0 else block.mlp_half(resid)


# ----------------------------------------------------------------------------- the sweep
@dataclass(frozen=True)
class PlannedVariant:
    """One variant as the sweep runs it: its name (the table's row), its hooks, the stage its rows join at."""

    name: str
    hooks: list[tuple[str, HookFn]]  # resolved to single hook names
    stage: int  # first stage it touches


def sweep(
    model: HookedTransformer,
    input,
    variants: Variants,
    metric: Callable,
    *,
    attention_mask: Tensor | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    progress: bool | None = None,
    task: Any = None,
    data_parallel: bool | None = None,
) -> SweepResult:
    """Run every variant (a list of (hook name, callback) pairs) on the prompts; one number per prompt each.

    `input` is token ids [batch pos] or prompts; `metric` a `hooked.interventions.metrics` metric (or any callable
    `metric(logits, base_logits=..., attention_mask=...) -> [batch]`). Rows are chunked to `max_rows`,
    or to `max_bytes` of activations (default: a quarter of the model's weights, at least 256 MiB).
    `progress` shows a bar over chunks (default: when there is more than one). `task` is recorded in the
    result's provenance. Equal, within float32 rounding, to running each variant alone with
    `model.run_with_hooks` and applying the metric.

    `data_parallel` spreads the variants over the data-parallel ranks of a torchrun job: each rank (or
    tensor-parallel group) runs every n-th of them, in the order of the stage they start at, and every
    rank returns the whole table. By
    default it does so when the model was loaded with `hooked.load(..., tp=N)` on more ranks than N;
    `True` with a model loaded without `tp` uses every rank of the job (each holds a whole model).
    Every rank must call `sweep` with the same arguments (docs/scaling.md).
    """
    if getattr(model, "engine_name", None) is not None:  # a model served by an inference engine: its own sweep
        options = dict(max_rows=max_rows, max_bytes=max_bytes, data_parallel=data_parallel)
        return model.sweep(
            input, variants, metric, attention_mask=attention_mask, progress=progress, task=task, **options
        )
    if not isinstance(variants, Mapping) or not variants:
        raise ValueError("variants must be a non-empty dict: {name: [(hook_name, callback), ...]}")
    group = _data_parallel_group(model, data_parallel)
    with torch.no_grad():
        # The plan (step 0 of the module docstring): every variant resolved and checked before anything runs.
        tokens, key_valid, planned, reads = _checked_plan(model, input, attention_mask, variants, metric, group)
        prompts = Prompts(tokens, position_ids_for(tokens, key_valid), key_valid)

        # The base run (step 2), keeping the residual stream entering every stage a variant starts at.
        base_resid, base_reduced = _base_run(model, prompts, {v.stage for v in planned}, reads)
        base_value = reads.evaluate(base_reduced, base_reduced, key_valid, "on the base run (no variant)")

        # Chunks of variants (step 3), sorted by the stage they start at; under data parallelism, this rank's share.
        chunks = _chunks(model, planned, tokens.shape, reads, max_rows, max_bytes, group)

        # The table (steps 1, 4, 5): each chunk's forward; each variant's block of B rows is its row of the table.
        values = _table(model, prompts, planned, chunks, base_resid, base_reduced, reads, progress, group)
    return SweepResult(
        variants=[v.name for v in planned],
        values=values,
        base=base_value.cpu(),
        metric=metric_name(metric),
        provenance=sweep_provenance(model, planned, metric, task, tokens),
    )


def _data_parallel_group(model: HookedTransformer, data_parallel: bool | None):
    """The process group whose ranks share the variants, or None to run them all here."""
    parallel = getattr(model, "parallel", None)
    if data_parallel is False or (data_parallel is None and (parallel is None or parallel.dp_size == 1)):
        return None
    if not dist.is_initialized():
        raise RuntimeError(
            "sweep(data_parallel=True) needs torch.distributed: launch with `torchrun --nproc-per-node N` and load the"
            " model with hooked.load(..., tp=...) or call hooked.distributed.init() first"
        )
    if parallel is not None:
        return parallel.dp_group if parallel.dp_size > 1 else None
    return dist.group.WORLD


def _checked_plan(
    model: HookedTransformer, input, attention_mask: Tensor | None, variants: Variants, metric: Callable, group
) -> tuple[Tensor, Tensor | None, list[PlannedVariant], MetricReads]:
    """The prompts (token ids and which are real), the planned variants and what the metric reads.

    Under torch.distributed a mistake on one rank stops every rank here, before any variant runs.
    """
    from hooked.distributed import agree

    error = None
    try:
        tokens, key_valid = model.tokens_and_mask(input, attention_mask, prepend_bos=None)
        check_prompts(metric, model, tokens, key_valid, "hooked.sweep")
        registered_hooks(model, "hooked.sweep")
        planned = plan_variants(model, variants, tokens.shape)
        reads = MetricReads.of(metric, model)
    except Exception as caught:
        error = caught
    calls = None if error is not None else ("hooked.sweep", [(v.name, [name for name, _ in v.hooks]) for v in planned])
    if getattr(model, "tensor_parallel", False):
        model.parallel.agree(error, calls, what="hooked.sweep")
    if group is not None:
        agree(group, error, calls, "hooked.sweep (its variants)", same=True)
    elif error is not None:
        raise error
    return tokens, key_valid, planned, reads


def plan_variants(model: HookedTransformer, variants: Variants, shape: torch.Size) -> list[PlannedVariant]:
    """Resolve every variant's hook names, check its callbacks, and find its first stage."""
    planned = []
    no_hooks = 2 * model.cfg.n_layers  # a variant with no hook joins at the final norm: the base run's logits
    spans = spliced_spans(model)
    for name, pairs in zip(variant_names(variants), variants.values(), strict=True):
        if isinstance(pairs, tuple) and len(pairs) == 2 and callable(pairs[1]):
            pairs = [pairs]  # a single (name, fn) pair
        resolved = []
        try:
            for hook_name, fn in pairs:
                if not callable(fn):
                    raise TypeError(f"a hook must be callable as fn(activation, hook), got {type(fn).__name__}")
                for concrete in model.resolve_hook_names(hook_name):
                    validate = getattr(fn, "validate_hook_point", None)
                    if validate is not None:
                        validate(model.hook_dict[concrete], model)
                    resolved.append((concrete, fn))
        except (KeyError, ValueError, TypeError, IndexError) as error:
            message = error.args[0] if error.args else error  # KeyError's str() would quote it again
            raise type(error)(f"sweep variant {name!r}: {message}") from error
        stage = min((stage_of(model, hook_name) for hook_name, _ in resolved), default=no_hooks)
        planned.append(PlannedVariant(name, resolved, outside_spans(stage, spans)))
    return planned


def spliced_spans(model: HookedTransformer) -> list[tuple[int, int]]:
    """(first, last): the stages of the point a hook that is part of the model reads (`reads_from`, hooked/hooks.py:
    a spliced transcoder's input) and of the point it is registered at, where the two differ. Rows that join the
    batch after `first`, up to `last`, would reach the hook without its input."""
    spans = []
    for point in model.hook_dict.values():
        if not point.listening:
            continue
        for registration in point.fwd_hooks:
            reads = getattr(registration.fn, "reads_from", None)
            if registration.part_of_model and reads is not None and stage_of(model, reads) < point.stage:
                spans.append((stage_of(model, reads), point.stage))
    return spans


def outside_spans(stage: int, spans: list[tuple[int, int]]) -> int:
    """`stage`, or the first stage of the spans it falls inside (first < stage <= last), moved until it is in none."""
    moved = True
    while moved:
        inside = [first for first, last in spans if first < stage <= last]
        moved = bool(inside)
        stage = min(inside, default=stage)
    return stage


def _base_run(model, prompts: Prompts, starts: set[int], reads: MetricReads) -> tuple[dict[int, Tensor], Tensor]:
    """The unhooked forward once: the residual entering each needed stage, and the reduced logits."""
    tokens, rows, mask = prompts.repeated(1)
    kept: dict[int, Tensor] = {}
    with running_rows(rows):
        resid = model.embed(tokens, rows.position_ids)
        inputs = model.block_inputs(rows.position_ids, mask, resid.dtype)
        for stage in range(2 * model.cfg.n_layers):
            if stage in starts:
                kept[stage] = resid
            resid = run_stage(model, stage, resid, inputs)
        kept[2 * model.cfg.n_layers] = resid
        return kept, reads.logits(model, resid, prompts.key_valid)


def _chunks(
    model,
    planned: list[PlannedVariant],
    shape: torch.Size,
    reads: MetricReads,
    max_rows: int | None,
    max_bytes: int | None,
    group,
) -> list[list[int]]:
    """Indices into `planned`, sorted by the stage each variant starts at and cut into chunks of whole variants
    (`max_rows` or `max_bytes`); under data parallelism, only this rank's share."""
    order = sorted(range(len(planned)), key=lambda i: planned[i].stage)
    if group is not None:  # dealt in turn: early-stage variants (which recompute more blocks) are spread evenly
        order = order[dist.get_rank(group) :: dist.get_world_size(group)]
    per_chunk = _rows_per_chunk(model, shape, reads, max_rows, max_bytes) // shape[0]
    per_chunk = max(per_chunk, 1)
    return [order[i : i + per_chunk] for i in range(0, len(order), per_chunk)]


def _rows_per_chunk(model, shape: torch.Size, reads: MetricReads, max_rows: int | None, max_bytes: int | None) -> int:
    """Rows per chunk: `max_rows`, or as many as fit `max_bytes` of activations."""
    batch, pos = shape
    if max_rows is not None:
        if max_rows < batch:
            raise ValueError(f"max_rows={max_rows} is smaller than one variant's {batch} rows")
        return max_rows
    cfg = model.cfg
    if max_bytes is None:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        max_bytes = max(weights // 4, 256 * 2**20)
    itemsize = model.dtype.itemsize
    d_mlp = max(cfg.d_mlp, getattr(cfg, "d_expert_mlp", 0) * getattr(cfg, "top_k", 0))
    # Live at once in a stage: a few residual-sized tensors, q/k/v/z, the MLP's hidden layers, and
    # the scores/pattern if the eager path runs.
    per_row = pos * itemsize * (8 * cfg.d_model + 3 * cfg.n_heads * cfg.d_head + 3 * d_mlp + 2 * cfg.n_heads * pos)
    positions = 1 if reads.position == -1 else pos
    columns = cfg.d_vocab if reads.columns is None else len(reads.columns)
    per_row += positions * columns * 4 * 3  # logits, and the metric's float32 softmax of them
    return max(batch, int(max_bytes // per_row) // batch * batch)


def _table(
    model,
    prompts: Prompts,
    planned: list[PlannedVariant],
    chunks: list[list[int]],
    base_resid: dict[int, Tensor],
    base_reduced: Tensor,
    reads: MetricReads,
    progress: bool | None,
    group,
) -> Tensor:
    """[variant B] float32: the metric on each variant's block of rows, compared with the base run's logits.

    The variant `chunk[block]` owns rows block*B .. (block+1)*B of its chunk's forward. Under data parallelism
    each rank fills its own variants' rows (zeros elsewhere) and every rank returns the sum: the whole table.
    """
    batch = prompts.tokens.shape[0]
    values = torch.zeros(len(planned), batch, dtype=torch.float32)
    first_rank = not dist.is_initialized() or dist.get_rank() == 0
    bar = _progress(len(chunks), sum(map(len, chunks)), progress) if first_rank else None
    error = None
    try:
        for chunk in chunks:
            reduced = _run_chunk(model, prompts, [planned[i] for i in chunk], base_resid, reads)
            for block, index in enumerate(chunk):
                rows = slice(block * batch, (block + 1) * batch)
                what = f"with variant {planned[index].name!r}"
                values[index] = reads.evaluate(reduced[rows], base_reduced, prompts.key_valid, what).cpu()
            bar.update(len(chunk)) if bar is not None else None
    except Exception as caught:
        if group is None:
            raise
        error = caught
    finally:
        if bar is not None:
            bar.close()
    if group is not None:  # every rank learns of a failure, then the shares are summed (zeros elsewhere)
        from hooked.distributed import agree

        agree(group, error, what="its share of the sweep")
        values = _sum_across(group, values, model.device)
    return values


def _run_chunk(
    model, prompts: Prompts, chunk: list[PlannedVariant], base_resid: dict[int, Tensor], reads: MetricReads
) -> Tensor:
    """Forward the chunk's variants, rows joining at their first stage; the reduced logits of all rows."""
    batch = prompts.tokens.shape[0]
    n_stages = 2 * model.cfg.n_layers
    fwd_hooks = [
        (hook_name, OnRows(fn, slice(block * batch, (block + 1) * batch), variant.name))
        for block, variant in enumerate(chunk)
        for hook_name, fn in variant.hooks
    ]
    # The last block's MLP half, the final norm and the unembedding act per position: when the metric
    # reads the last position only and no hook of the chunk sits there, the rest runs on that position (unless a
    # spliced transcoder reads before that stage and writes in it: its input would have every position).
    last_hooked = max((stage_of(model, name) for variant in chunk for name, _ in variant.hooks), default=EMBED_STAGE)
    spanned = any(first < n_stages - 1 <= last for first, last in spliced_spans(model))
    trim_at = n_stages - 1 if reads.position == -1 and last_hooked < n_stages - 1 and not spanned else None
    joined = 0  # variants whose rows are in the batch so far
    resid = None
    current: dict[int, tuple] = {}  # joined -> (rows, block inputs) for the batch as it is now
    with model.hooks(fwd_hooks=fwd_hooks):
        if chunk[0].stage == EMBED_STAGE:
            joined = sum(v.stage == EMBED_STAGE for v in chunk)
            tokens, rows, _ = prompts.repeated(joined)
            with running_rows(rows):
                resid = model.embed(tokens, rows.position_ids)
        first = max(chunk[0].stage, 0)
        for stage in range(first, n_stages + 1):
            joining = 0
            while joined + joining < len(chunk) and chunk[joined + joining].stage <= stage:
                joining += 1
            if joining:
                extra = base_resid[min(stage, n_stages)].repeat(joining, 1, 1)
                if resid is not None and trim_at is not None and stage > trim_at:
                    extra = last_real(extra, prompts.key_valid)
                resid = extra if resid is None else torch.cat([resid, extra])
                joined += joining
            if stage == n_stages:
                break
            if stage == trim_at:
                resid = last_real(resid, prompts.key_valid)  # each prompt's last real token (right padding)
            if joined not in current:
                _, rows, mask = prompts.repeated(joined)
                current = {joined: (rows, model.block_inputs(rows.position_ids, mask, resid.dtype))}
            rows, inputs = current[joined]
            with running_rows(rows):
                resid = run_stage(model, stage, resid, inputs)
        _, rows, _ = prompts.repeated(joined)
        with running_rows(rows):
            return reads.logits(model, resid, None if resid.shape[1] == 1 else prompts.key_valid)


def _progress(n_chunks: int, n_variants: int, progress: bool | None):
    if progress is False or (progress is None and n_chunks <= 1):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=n_variants, desc="sweep", unit="variant")


def _sum_across(group, values: Tensor, device: torch.device) -> Tensor:
    """Each rank filled its own variants' rows (zeros elsewhere): their sum is the whole table, exactly."""
    on_device = values.to(device)  # NCCL reduces CUDA tensors only
    dist.all_reduce(on_device, group=group)
    return on_device.cpu()


# ----------------------------------------------------------------------------- what the metric reads
@dataclass(frozen=True)
class MetricReads:
    """The positions and vocabulary columns a metric reads, and how to compute just those logits."""

    metric: Callable
    position: int | None  # -1: the last column only; None: every position
    columns: Tensor | None  # token ids, or None for the whole vocabulary
    needs_base: bool

    @classmethod
    def of(cls, metric: Callable, model: HookedTransformer) -> MetricReads:
        if not callable(metric):
            raise TypeError(f"metric must be callable on logits, got {type(metric).__name__}")
        declares = hasattr(metric, "compute")
        position = getattr(metric, "position", None) if declares else None
        if position not in (-1, None):
            raise ValueError(
                f"metric {metric!r} reads position {position}; a sweep supports -1 (the last token) or None"
            )
        columns = getattr(metric, "columns", None) if declares else None
        if columns is not None:
            columns = torch.as_tensor(list(columns), dtype=torch.long, device=model.device)
        return cls(metric, position, columns, bool(getattr(metric, "needs_base", True)))

    def logits(self, model: HookedTransformer, resid: Tensor, key_valid: Tensor | None = None) -> Tensor:
        """The logits the metric reads from the final residual stream; position -1 is each prompt's last
        real token (`key_valid` [B pos], for `resid` holding one or more blocks of the B prompts)."""
        final_norm_hooked = model.ln_final.hook_scale.listening or model.ln_final.hook_normalized.listening
        if self.position == -1 and not final_norm_hooked:  # a norm acts per position: slicing first is exact
            return model.logits_from_resid(last_real(resid, key_valid), self.columns)
        logits = model.logits_from_resid(resid, self.columns)
        return last_real(logits, key_valid) if self.position == -1 else logits

    def evaluate(self, logits: Tensor, base: Tensor | None, key_valid: Tensor | None, what: str = "") -> Tensor:
        """The metric per prompt; `what` says which run it is, for the error a NaN raises (`metric_values`)."""
        if hasattr(self.metric, "compute"):
            values = self.metric.compute(logits, base if self.needs_base else None, key_valid)
        else:
            values = self.metric(logits, base_logits=base, attention_mask=key_valid)
        return metric_values(self.metric, values, logits.shape[0], what)


def metric_values(metric: Callable, values: Any, batch: int, what: str = "") -> Tensor:
    """What a user's metric returned, as float32 [batch] (float64 kept), or an error saying what it returned instead.

    Every caller of a metric (sweeps, patching, attribution, circuits) passes its result through here,
    so a scalar, a list or a wrong length fails with one message, not deep inside torch; and a NaN fails
    naming `what` ("with variant 'L2H2'") and the prompts: every comparison with a NaN is false, so ACDC
    would keep every edge and a sweep's table would rank it nowhere, and a mean over prompts would be NaN.
    """
    if isinstance(values, Tensor) and values.shape == (batch,) and not values.is_complex():
        nan = torch.isnan(values.detach())
        if bool(nan.any()):
            rows = nan.nonzero().flatten().tolist()
            listed = ", ".join(map(str, rows[:10])) + (f" and {len(rows) - 10} more" if len(rows) > 10 else "")
            raise ValueError(
                f"metric {metric_name(metric)} is NaN{' ' + what if what else ''} on prompt"
                f"{'s' if len(rows) > 1 else ''} {listed} (of {batch}): a NaN would compare as neither large nor"
                " small and turn every mean into NaN. Look for a 0/0 or a log of 0 in the metric, or NaN logits"
                " (run the model on those prompts)"
            )
        return values.to(torch.promote_types(values.dtype, torch.float32))  # a float64 model's digits kept
    if isinstance(values, Tensor) and values.ndim == 0:
        got = "a scalar (0-d tensor); did it average over the prompts? return the values before .mean()"
    elif isinstance(values, Tensor):
        got = f"a {values.dtype} tensor of shape {list(values.shape)}"
    elif isinstance(values, (list, tuple)):
        got = f"a {type(values).__name__} of {len(values)} values; return a tensor (torch.stack or torch.tensor)"
    else:
        got = f"{type(values).__name__} {values!r}"[:200]
    error = ValueError if isinstance(values, Tensor) else TypeError
    raise error(
        f"metric {metric_name(metric)}: a metric must return one value per prompt, a [batch] tensor ([{batch}]"
        f" here); got {got}"
    )


def metric_name(metric: Callable) -> str:
    """How a result table names `metric`: its `name` (hooked's metrics), else its function or class name."""
    return getattr(metric, "name", getattr(metric, "__name__", type(metric).__name__))


def sweep_provenance(model, planned: list[PlannedVariant], metric, task, tokens: Tensor) -> dict:
    cfg = model.cfg
    task_info = task.to_dict() if hasattr(task, "to_dict") else (repr(task) if task is not None else None)
    return {
        "model": getattr(model, "name_or_path", None) or type(model).__name__,
        "architecture": type(model).__name__,
        "config": {k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str, bool, type(None)))},
        "processing": dict(getattr(model, "processing", {})),  # TransformerLens' weight processing (hooked.processing)
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "metric": repr(metric),
        "task": task_info,
        "prompts": list(tokens.shape),
        "hooked_version": __version__,
        "torch_version": torch.__version__,
        "variants": {v.name: [f"{name}: {fn!r}" for name, fn in v.hooks] for v in planned},
    }
