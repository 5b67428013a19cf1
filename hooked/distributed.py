"""Tensor, expert and data parallelism on torch.distributed, with hooks that see whole tensors.

    torchrun --nproc-per-node 2 script.py          # in script.py:
    model = hooked.load("Qwen/Qwen3-8B", tp=2)     # every rank holds half of every layer
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.3.attn.hook_z", ablate.zero(heads=5))])
    result = hooked.sweep(model, tokens, variants, metric)   # spread over data-parallel ranks too

How a model is split (Megatron-LM's scheme, Shoeybi et al. 2019, "Megatron-LM", section 3):

* **Attention**: each of the `tp` ranks of a tensor-parallel group holds a contiguous block of query
  heads and of key/value heads (q/k/v projections split by output rows: column-parallel), and the
  matching input columns of the output projection (row-parallel). Each rank's output projection
  gives a partial sum; one all-reduce per attention sublayer makes it whole, then the bias is added.
  When there are fewer key/value heads than ranks (Qwen3-235B-A22B: 4 kv heads on 8 ranks), each kv
  head is held by `tp / n_kv_heads` ranks, every one of which serves its own query heads.
* **Dense MLPs**: gate/up (or c_fc) split by hidden columns, down (c_proj) by the same rows; one
  all-reduce per MLP sublayer.
* **Mixture-of-experts MLPs** (expert parallelism): the router is replicated, so every rank routes
  every token identically; each rank holds `n_experts / tp` whole experts and runs the slots routed to
  them; one all-reduce sums the weighted expert outputs.
* **Embedding and unembedding**: split by vocabulary rows (vocab-parallel). An embedding lookup is
  a masked local lookup and an all-reduce; logits are computed per shard and all-gathered, so every
  rank returns whole logits.
* Norms, position embeddings, rotary tables and the router stay replicated; a norm over every head's
  q (or k) at once is cut with the heads, and its attention all-reduces the partial sums of squares.

Each rank reads only its own slices of the safetensors files (`hooked.weights.read_state_dict` with
a plan from `parallelize`), so a rank's memory is about the sharded weights / tp plus the replicated
ones (docs/scaling.md has the arithmetic and the measurements).

**Hooks see whole tensors.** A hook point's axes say how it is split: a point with a `head_index`
or `kv_head_index` axis is split along it, `d_mlp` along the hidden axis, the per-slot expert points
(`top_k ... d_expert_mlp`) by slot (each slot is computed by the rank that holds its expert), and
every other point is replicated. Only when a hook is registered at a point (`HookPoint.listening`)
is the split tensor gathered; the hooks then run on every rank on the whole tensor, TransformerLens'
shape. If any rank's hook changed it, the first rank's result is broadcast and each rank keeps its
own slice (so a hook whose result differed between ranks still gives one consistent model). An
unhooked forward gathers nothing. A run_with_cache therefore holds the whole cache on every rank.

**Failures.** Every rank must make the same calls (SPMD). Before a forward runs, the ranks of a
group compare their inputs, and after the hooks of a point run they compare outcomes; a rank that
raised makes every rank raise (`RankFailedError` naming the rank and its error), and process groups
carry a timeout (`init(timeout=...)`, default `HOOKED_DIST_TIMEOUT` seconds or 300), so a rank that
died or diverged elsewhere ends in an error, not a hang.

**Gradients.** A model loaded with tp > 1 holds no parameter that requires grad, so a forward builds
no autograd graph unless a hook puts a tensor that requires grad into it (attribution graphs,
`hooked.graphs.attribute`, put a leaf at hook_embed). Then its gradients are those of one process,
on every rank, by Megatron-LM's conjugate operators (section 3): a layer split by output rows reads
its replicated input through `copy` (identity forward, all-reduce of the input's gradient backward:
each rank's heads or neurons give part of it), and an all-reduce of partial sums is `reduce`
(its gradient, replicated, passes through unchanged). A hook at a split point differentiates too:
its gather's gradient is all-reduced and cut back to the rank's slice; a hook's broadcast result
passes each rank's gradient to its own result, so the gradient is one process's when the hook
computes the same on every rank. Backward hooks (`bwd_hooks`) are refused.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from hooked.layers.linear import Conv1D

DEFAULT_TIMEOUT_S = float(os.environ.get("HOOKED_DIST_TIMEOUT", 300))


class RankFailedError(RuntimeError):
    """Another rank of the group failed; this rank stops too (the message names the rank and its error)."""


# ----------------------------------------------------------------------------- process groups
def init(backend: str | None = None, timeout: float | timedelta | None = None) -> None:
    """Initialise torch.distributed from torchrun's environment, if not done yet.

    `backend` defaults to NCCL when CUDA is available, else gloo. `timeout` (seconds) bounds every
    collective: a rank whose peers died or stopped calling raises after it instead of hanging.
    """
    if dist.is_initialized():
        return
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"torch.distributed is not initialised and {', '.join(missing)} are not set: launch the script with"
            " `torchrun --nproc-per-node N script.py` (or call torch.distributed.init_process_group first)"
        )
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=_as_timedelta(timeout))


def _as_timedelta(timeout: float | timedelta | None) -> timedelta:
    if isinstance(timeout, timedelta):
        return timeout
    return timedelta(seconds=DEFAULT_TIMEOUT_S if timeout is None else float(timeout))


@dataclass(eq=False)
class Parallel:
    """Where this process sits: its tensor-parallel group (ranks that split one model) and its
    data-parallel group (ranks holding the same shard of different model copies)."""

    tp_size: int
    tp_rank: int
    tp_ranks: list[int]  # global ranks of this tensor-parallel group, in order
    tp_group: object
    dp_size: int
    dp_rank: int
    dp_group: object

    @classmethod
    def create(cls, tp: int, timeout: float | timedelta | None = None) -> Parallel:
        """Groups of `tp` consecutive ranks split a model; ranks with the same place in their groups
        form the data-parallel groups. Collective: every rank must call it."""
        init(timeout=timeout)
        world, rank = dist.get_world_size(), dist.get_rank()
        if not isinstance(tp, int) or tp < 1 or world % tp:
            raise ValueError(
                f"tp={tp!r} must be a positive divisor of the world size {world} (torchrun --nproc-per-node)"
            )
        timeout = _as_timedelta(timeout)
        tp_group = dp_group = None
        tp_ranks: list[int] = []
        for start in range(0, world, tp):  # every rank creates every group, in the same order
            ranks = list(range(start, start + tp))
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                tp_group, tp_ranks = group, ranks
        for offset in range(tp):
            ranks = list(range(offset, world, tp))
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                dp_group = group
        return cls(tp, rank % tp, tp_ranks, tp_group, world // tp, rank // tp, dp_group)

    def device(self, device: torch.device | str) -> torch.device:
        """`device`, with a bare "cuda" made this process's GPU (LOCAL_RANK)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return device

    # ------------------------------------------------------------------------- agreement
    def agree(self, error: BaseException | None, fingerprint=None, what: str = "") -> None:
        """`agree` over this tensor-parallel group, requiring equal fingerprints."""
        agree(self.tp_group, error, fingerprint, what, same=fingerprint is not None)

    # ------------------------------------------------------------------------- collectives
    def all_reduce(self, tensor: Tensor) -> Tensor:
        """Sum over the group, in place; not differentiated (`reduce` is)."""
        dist.all_reduce(tensor, group=self.tp_group)
        return tensor

    def reduce(self, partial: Tensor, split_after: bool = False) -> Tensor:
        """Every rank's partial sum made whole (Megatron's g: the gradient of the replicated sum passes to each
        partial unchanged). `split_after`: each rank reads the sum on its own (OLMo 2's sums of squares, scaling
        only its heads), so the gradient is summed over the ranks too (g then f). In place without autograd."""
        if not (torch.is_grad_enabled() and partial.requires_grad):
            return self.all_reduce(partial)
        whole = _Reduce.apply(partial, self)
        return self.copy(whole) if split_after else whole

    def copy(self, x: Tensor) -> Tensor:
        """A replicated tensor entering a split computation (Megatron's f): itself; its gradient, the sum of
        every rank's part, is all-reduced on the way back."""
        if not (torch.is_grad_enabled() and x.requires_grad):
            return x
        return _Copy.apply(x, self)

    def all_gather(self, local: Tensor, axis: int, sizes: list[int]) -> list[Tensor]:
        """Each rank's piece along `axis` (pieces may differ in length: padded for the collective), as views
        of one buffer that the collective fills in place (no per-piece copies: the whole logits of a
        forward pass through here)."""
        longest = max(sizes)
        padded = local
        if local.shape[axis] < longest:
            pad_shape = list(local.shape)
            pad_shape[axis] = longest - local.shape[axis]
            padded = torch.cat([local, local.new_zeros(pad_shape)], dim=axis)
        padded = padded.contiguous()
        stacked = padded.new_empty((len(sizes), *padded.shape))
        # The concatenated form ([tp * n, ...]; gloo takes no other), a view of the stacked buffer. torch 2.13
        # names it all_gather_single (all_gather_into_tensor before, deprecated since).
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(stacked.view(-1, *padded.shape[1:]), padded, group=self.tp_group)
        return [stacked[index].narrow(axis, 0, size) for index, size in enumerate(sizes)]

    def broadcast(self, tensor: Tensor) -> Tensor:
        """The first rank's tensor on every rank; differentiated as the identity (each rank's gradient goes to its
        own tensor: one process's when every rank's tensor is the same function of the same inputs)."""
        if torch.is_grad_enabled() and tensor.requires_grad:
            return _Broadcast.apply(tensor, self)
        tensor = tensor.contiguous()
        dist.broadcast(tensor, src=self.tp_ranks[0], group=self.tp_group)
        return tensor

    def gather(self, local: Tensor, axis: int, ranges: list[tuple[int, int]], replicated_grad: bool) -> Tensor:
        """The whole tensor from every rank's [start, stop) along `axis` (a range held by several ranks is taken
        from the first). Its gradient goes back to each range's first holder, after an all-reduce unless
        `replicated_grad` (every rank's gradient of the whole is the same: logits read alike on every rank)."""
        if torch.is_grad_enabled() and local.requires_grad:
            return _Gather.apply(local, self, axis, ranges, replicated_grad)
        return self._gather(local, axis, ranges)

    def _gather(self, local: Tensor, axis: int, ranges: list[tuple[int, int]]) -> Tensor:
        pieces = self.all_gather(local, axis, [stop - start for start, stop in ranges])
        distinct, seen = [], set()
        for piece, span in sorted(zip(pieces, ranges, strict=True), key=lambda item: item[1]):
            if span not in seen:  # a replicated key/value head is taken once
                seen.add(span)
                distinct.append(piece)
        return torch.cat(distinct, dim=axis)

    # ------------------------------------------------------------------------- splits
    def even(self, n: int, what: str) -> list[tuple[int, int]]:
        """[start, stop) of each rank: n split evenly (it must divide)."""
        if n % self.tp_size:
            raise ValueError(f"{what} = {n} is not divisible by tp={self.tp_size}; choose a tp that divides it")
        size = n // self.tp_size
        return [(r * size, (r + 1) * size) for r in range(self.tp_size)]

    def even_or_replicated(self, n: int, what: str) -> list[tuple[int, int]]:
        """As `even`, or, when tp is a multiple of n, each item held by tp / n consecutive ranks."""
        if n % self.tp_size == 0:
            return self.even(n, what)
        if self.tp_size % n == 0:
            copies = self.tp_size // n
            return [(r // copies, r // copies + 1) for r in range(self.tp_size)]
        raise ValueError(f"{what} = {n} neither divides nor is divisible by tp={self.tp_size}; choose another tp")

    def uneven(self, n: int) -> list[tuple[int, int]]:
        """Blocks of ceil(n / tp); the last may be shorter (a vocabulary of 50257 on 2 ranks)."""
        size = -(-n // self.tp_size)
        return [(min(r * size, n), min((r + 1) * size, n)) for r in range(self.tp_size)]

    def vocab_start(self, d_vocab: int) -> int:
        """The first vocabulary row this rank's embedding and unembedding hold."""
        return self.uneven(d_vocab)[self.tp_rank][0]


def agree(group, error: BaseException | None, payload=None, what: str = "", same: bool = False) -> list:
    """Every rank of `group` learns whether any rank failed; then all raise together (the failing rank its
    own error, the others `RankFailedError` naming it), or all go on with every rank's `payload`. With
    `same`, the payloads must be equal (the same call with the same input), else all raise. Collective."""
    statuses: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(
        statuses, (None if error is None else f"{type(error).__name__}: {error}", payload), group=group
    )
    if error is not None:
        raise error
    failed = [(index, message) for index, (message, _) in enumerate(statuses) if message is not None]
    if failed:
        index, message = failed[0]
        rank = dist.get_global_rank(group, index)
        raise RankFailedError(f"rank {rank} failed{f' in {what}' if what else ''}, so every rank stops: {message}")
    payloads = [status[1] for status in statuses]
    if same and any(other != payload for other in payloads):
        differing = [index for index, other in enumerate(payloads) if other != payloads[0]]
        raise RankFailedError(
            f"the ranks of a group made different calls or gave different inputs{f' to {what}' if what else ''}"
            f" (members {differing} differ from the first); every rank must make the same calls with the same"
            f" tokens, hooks and variants. Fingerprints: {[_short(other) for other in payloads]}"
        )
    return payloads


def _short(fingerprint, limit: int = 300) -> str:
    text = repr(fingerprint)
    return text if len(text) <= limit else text[:limit] + "..."


# ----------------------------------------------------------------------------- differentiated collectives
class _Reduce(torch.autograd.Function):
    """Megatron's g: all-reduce forward; the replicated gradient passes unchanged."""

    @staticmethod
    def forward(ctx, partial: Tensor, parallel: Parallel) -> Tensor:
        return parallel.all_reduce(partial.clone())

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _Copy(torch.autograd.Function):
    """Megatron's f: identity forward; each rank's partial gradient all-reduced."""

    @staticmethod
    def forward(ctx, x: Tensor, parallel: Parallel) -> Tensor:
        ctx.parallel = parallel
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return ctx.parallel.all_reduce(grad.clone()), None


class _Broadcast(torch.autograd.Function):
    """The first rank's tensor forward; each rank's gradient to its own tensor."""

    @staticmethod
    def forward(ctx, tensor: Tensor, parallel: Parallel) -> Tensor:
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.broadcast(out, src=parallel.tp_ranks[0], group=parallel.tp_group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _Gather(torch.autograd.Function):
    """`Parallel.gather` forward; backward, the gradient of this rank's range (all-reduced first unless replicated),
    zero where another rank's copy of the range was taken."""

    @staticmethod
    def forward(ctx, local: Tensor, parallel: Parallel, axis: int, ranges: list, replicated_grad: bool) -> Tensor:
        ctx.parallel, ctx.axis, ctx.ranges, ctx.replicated_grad = parallel, axis, ranges, replicated_grad
        return parallel._gather(local, axis, ranges)

    @staticmethod
    def backward(ctx, grad: Tensor):
        parallel, ranges = ctx.parallel, ctx.ranges
        if not ctx.replicated_grad:
            grad = parallel.all_reduce(grad.clone())
        start, stop = ranges[parallel.tp_rank]
        if ranges.index(ranges[parallel.tp_rank]) != parallel.tp_rank:  # another rank's copy was taken
            shape = list(grad.shape)
            shape[ctx.axis] = stop - start
            return grad.new_zeros(shape), None, None, None, None
        return grad.narrow(ctx.axis, start, stop - start).contiguous(), None, None, None, None


# ----------------------------------------------------------------------------- hooks
def _version(tensor: Tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors keep no version counter
        return None


class HookShard:
    """How one hook point's tensor is split over a tensor-parallel group, and how its hooks run on the
    whole tensor: `axis` and each rank's [start, stop) along it; `summed`: each rank holds its own
    entries and zeros elsewhere (the per-slot expert points); neither: replicated."""

    def __init__(
        self,
        parallel: Parallel,
        axis: int | None = None,
        ranges: list[tuple[int, int]] | None = None,
        summed: bool = False,
    ):
        self.parallel, self.axis, self.ranges, self.summed = parallel, axis, ranges, summed

    def gather(self, local: Tensor) -> Tensor:
        if self.summed:  # each rank then reads its own slots of the sum
            return self.parallel.reduce(local.clone(), split_after=True)
        if self.axis is None:
            return local
        return self.parallel.gather(local, self.axis, self.ranges, replicated_grad=False)

    def local_part(self, whole: Tensor) -> Tensor:
        if self.summed or self.axis is None:
            return whole
        start, stop = self.ranges[self.parallel.tp_rank]
        return whole.narrow(self.axis, start, stop - start).contiguous()

    def run(self, point, local: Tensor) -> Tensor:
        """Gather, run the point's hooks on the whole tensor, agree, re-shard."""
        whole = self.gather(local)
        before = _version(whole)
        error, result = None, whole
        try:
            if point.bwd_hooks:
                raise RuntimeError(
                    f"a backward hook is registered at {point.name}, but backward hooks are not supported on a model"
                    " loaded with tp > 1; use tp=1, or a tensor hook (Tensor.register_hook) in a forward hook"
                )
            result = point._run(whole)
        except Exception as caught:  # every rank learns of it below, then all raise
            error = caught
        changed = result is not whole or before is None or _version(whole) != before
        if not any(agree(self.parallel.tp_group, error, changed, f"a hook at {point.name}")):
            return local
        return self.local_part(self.parallel.broadcast(result))


def hook_shard(parallel: Parallel, axes: tuple[str, ...], splits: dict[str, list[tuple[int, int]]]) -> HookShard:
    """The split of a point with these axes (see the module docstring)."""
    if "d_expert_mlp" in axes and "top_k" in axes:
        return HookShard(parallel, summed=True)
    for axis_name in ("head_index", "kv_head_index", "d_mlp"):
        if axis_name in axes:
            return HookShard(parallel, axes.index(axis_name), splits[axis_name])
    return HookShard(parallel)


# ----------------------------------------------------------------------------- parallel layers
class RowParallel:
    """A linear layer holding some input columns (rows of GPT-2's Conv1D): its partial product, an
    all-reduce, then the (whole) bias. Mixed into the layer's own class by `row_parallel_class`; a layer
    type declares `partial_product(x)` (its product without the bias) when `F.linear` is not it."""

    parallel: Parallel

    def forward(self, x: Tensor) -> Tensor:
        return self.add_bias(self.partial_product(x))

    def add_bias(self, partial: Tensor) -> Tensor:
        whole = self.parallel.reduce(partial)
        return whole + self.bias if self.bias is not None else whole


class ColumnParallel:
    """A linear layer holding some output rows (columns of GPT-2's Conv1D) of a replicated input: the layer's own
    forward on `Parallel.copy(x)`, so the input's gradient sums every rank's part. Mixed in by
    `column_parallel_class`."""

    parallel: Parallel

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(self.parallel.copy(x))


@functools.cache
def column_parallel_class(cls: type) -> type:
    """`cls` reading its input through `Parallel.copy`: `ColumnParallelLinear` for nn.Linear."""
    return type(f"ColumnParallel{cls.__name__}", (ColumnParallel, cls), {})


@functools.cache
def row_parallel_class(cls: type) -> type:
    """`cls` with RowParallel's forward: `RowParallelLinear` for nn.Linear, `RowParallelConv1D` for Conv1D."""
    product = getattr(cls, "partial_product", None) or (lambda self, x: F.linear(x, self.weight))
    return type(f"RowParallel{cls.__name__}", (RowParallel, cls), {"partial_product": product})


def vocab_rows(parallel: Parallel, weight: Tensor, start: int, ids: Tensor) -> Tensor:
    """Whole rows `ids` (any shape) of a table split by vocabulary rows, on every rank: each rank looks
    up the ids it holds, zeros elsewhere, and an all-reduce adds them."""
    local = ids - start
    inside = (local >= 0) & (local < weight.shape[0])
    if weight.shape[0]:
        out = F.embedding(torch.where(inside, local, 0), weight).masked_fill(~inside[..., None], 0)
    else:
        out = weight.new_zeros(*ids.shape, weight.shape[1])
    return parallel.reduce(out)


class VocabParallelEmbedding(nn.Embedding):
    """nn.Embedding holding vocabulary rows [start, start + num_embeddings): a masked lookup and an all-reduce."""

    parallel: Parallel
    start: int

    def forward(self, ids: Tensor) -> Tensor:
        return vocab_rows(self.parallel, self.weight, self.start, ids)


def vocab_parallel_logits(
    parallel: Parallel, normed: Tensor, weight: Tensor, vocab: int, columns: Tensor | None
) -> Tensor:
    """Logits from a vocab-parallel unembedding: all columns (gathered), or just `columns` (token ids)."""
    start = parallel.vocab_start(vocab)
    normed = parallel.copy(normed)
    if columns is None:  # the local logits are freed in the gather
        return parallel.gather(F.linear(normed, weight), -1, parallel.uneven(vocab), replicated_grad=True)
    mine = (columns >= start) & (columns < start + weight.shape[0])
    out = normed.new_zeros(*normed.shape[:-1], len(columns))
    if bool(mine.any()):
        out[..., mine] = F.linear(normed, weight[columns[mine] - start])
    return parallel.reduce(out)


# ----------------------------------------------------------------------------- splitting a model
ReadPlan = dict[str, tuple[int, list[tuple[int, int]], torch.Size]]  # parameter -> (dim, ranges, shape on disk)
_Cut = tuple[str, nn.Module, dict]  # (module name, module, its tp_plan(): parameter path -> hooked.layers.Split)


def parallelize(model, parallel: Parallel) -> ReadPlan:
    """Cut a model built on the meta device down to this rank's shard, in place, and return what to
    read for each split parameter: (dim, [start, stop) ranges along it, concatenated; its whole shape).

    Raises before changing anything when a size does not split over tp.
    """
    cuts, ranges = _declared_cuts(model, parallel)
    plan: ReadPlan = {}
    for name, module, module_plan in cuts:
        _cut_module(name, module, module_plan, ranges, parallel, plan)
    _cut_vocabulary(model, parallel, plan)
    _record_split(model, parallel, ranges)
    return plan


def _declared_cuts(model, parallel: Parallel) -> tuple[list[_Cut], dict[str, list[tuple[int, int]]]]:
    """Each module's declared cut (`tp_plan`, hooked.layers.Split), and each rank's [start, stop) of every count
    they cut by (heads, kv_heads, d_mlp, experts): checked whole, before anything changes."""
    cfg = model.cfg
    ranges = {
        "heads": parallel.even(cfg.n_heads, "n_heads (attention heads)"),
        "kv_heads": parallel.even_or_replicated(cfg.n_kv_heads, "n_kv_heads (key/value heads)"),
        "d_mlp": parallel.uneven(cfg.d_mlp),
    }
    cuts = [(name, module, module.tp_plan()) for name, module in model.named_modules() if hasattr(module, "tp_plan")]
    if any(how.axis == "experts" for _, _, module_plan in cuts for how in module_plan.values()):
        ranges["experts"] = parallel.even(cfg.n_experts, "n_experts")
    for name, _, module_plan in cuts:
        for path, how in module_plan.items():
            if ranges.get(how.axis) is None:
                raise ValueError(
                    f"{name}.{path}: the tensor-parallel plan cuts by {how.axis!r}, which this model has no "
                    f"count for (heads, kv_heads, d_mlp, experts)"
                )
    return cuts, ranges


def _cut_module(
    name: str,
    module: nn.Module,
    module_plan: dict,
    ranges: dict[str, list[tuple[int, int]]],
    parallel: Parallel,
    plan: ReadPlan,
) -> None:
    """Apply one module's cut on this rank: split each parameter its plan names (recording what to read in
    `plan`), make each layer that reads a cut input row-parallel, and give the module its local counts."""
    rank = parallel.tp_rank
    for path, how in module_plan.items():
        owner_path, _, leaf = path.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        start, stop = ranges[how.axis][rank]
        spans = [
            (part_start + start * how.unit, part_start + stop * how.unit)
            for part_start in _part_starts(getattr(owner, leaf).shape[how.dim], how.parts)
        ]
        _split_parameter(owner, leaf, how.dim, spans, f"{name}.{path[: -len(leaf)]}", plan)
        parent_path, _, child = owner_path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        if how.reduce:  # the layer owning this weight reads a cut input
            _make_row_parallel(parent, child, parallel)
        elif (
            owner_path and isinstance(owner, nn.Linear | Conv1D) and not isinstance(owner, ColumnParallel)
        ):  # cut output rows
            _make_row_parallel(parent, child, parallel, column_parallel_class(type(owner)))
    local = {axis: spans_[rank] for axis, spans_ in ranges.items() if spans_ is not None}
    for attribute, axis in getattr(module, "tp_counts", {}).items():
        setattr(module, attribute, local[axis][1] - local[axis][0])
    if hasattr(module, "tp_applied"):
        module.tp_applied(parallel, local)


def _cut_vocabulary(model, parallel: Parallel, plan: ReadPlan) -> None:
    """Split the embedding and the unembedding (one module when tied, found by their weights) by vocabulary rows."""
    rows = parallel.uneven(model.cfg.d_vocab)[parallel.tp_rank]
    tables = [
        name
        for name, child in model.named_children()
        if getattr(child, "weight", None) is not None
        and any(child.weight is w for w in (model.token_embedding_weight, model.unembed_weight))
    ]
    for child in tables:
        table = getattr(model, child)
        _split_parameter(table, "weight", 0, [rows], f"{child}.", plan)
        if isinstance(table, nn.Embedding):
            _make_row_parallel(model, child, parallel, VocabParallelEmbedding)
            getattr(model, child).num_embeddings = rows[1] - rows[0]
            getattr(model, child).start = rows[0]


def _record_split(model, parallel: Parallel, ranges: dict[str, list[tuple[int, int]]]) -> None:
    """What the forward needs to know of the split: how each hook point's tensor is cut, and the groups."""
    splits = {"head_index": ranges["heads"], "kv_head_index": ranges["kv_heads"], "d_mlp": ranges["d_mlp"]}
    for point in model.hook_dict.values():
        point.shard = hook_shard(parallel, point.axes, splits)
    model.parallel = parallel


def _split_parameter(
    module: nn.Module, name: str, dim: int, spans: list[tuple[int, int]], prefix: str, plan: ReadPlan
) -> None:
    """Replace a parameter by an empty meta one holding `spans` along `dim`, and record what to read for it."""
    parameter = getattr(module, name)
    shape = list(parameter.shape)
    plan[f"{prefix}{name}"] = (dim, spans, parameter.shape)
    shape[dim] = sum(stop - start for start, stop in spans)
    setattr(module, name, nn.Parameter(torch.empty(shape, dtype=parameter.dtype, device="meta"), requires_grad=False))


def _make_row_parallel(module: nn.Module, child: str, parallel: Parallel, cls: type | None = None) -> None:
    """Swap `module.child` for the same layer (same attributes) of its row-parallel class, or of `cls`
    (the column-parallel or vocab-parallel one)."""
    old = getattr(module, child)
    cls = cls or row_parallel_class(type(old))
    new = cls.__new__(cls)
    new.__dict__.update(old.__dict__)
    new.parallel = parallel
    setattr(module, child, new)


def _part_starts(size: int, parts: int) -> list[int]:
    """Where each of `parts` equal blocks of a dimension of `size` starts."""
    if size % parts:
        raise ValueError(f"a dimension of {size} does not hold {parts} equal parts")
    return [part * (size // parts) for part in range(parts)]
