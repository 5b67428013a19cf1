"""Edge patching and path patching.

    circuits.patch_edges(model, clean, corrupt, {"one": ["L1H0->L2H2.v"], "into L2H2": into}, metric)
    circuits.path_patch(model, clean, corrupt, senders=["L2H2"], receivers=["logits"], metric=metric)

**Edge patching** replaces one term of a receiver's input: with edge `S->R` patched, R reads S's
corrupt write (or its mean, or zero: `ablation=`) instead of the write S makes in this forward, and
everything downstream of R is recomputed. Each variant of the dict is a set of edges patched together;
all variants run as row blocks of one batched forward (`hooked.circuits.engine`).

**Path patching** asks how much of the effect of some senders reaches some receivers *directly*. Two
variants are in use, and they answer different questions:

- `method="direct"` (the default): the senders' corrupt writes reach the receivers along the direct
  edges `sender -> receiver` only; every other path, including sender -> MLP -> receiver, is held at its
  clean value. It is `patch_edges` of those edges.
- `method="wang"`: Wang et al. 2022 ("Interpretability in the Wild", arXiv 2211.00593, section 3.1):
  a first forward writes the senders' corrupt outputs, freezes every *other head* at its clean output
  and recomputes the MLPs, and records the receivers' inputs; a second, clean forward patches the
  receivers' inputs to those recorded values and recomputes everything after them. Paths
  sender -> MLP -> ... -> receiver count; paths through other heads do not. Where a layer's attention is
  one node (`L{l}.attn`, a post-norm block: `hooked.circuits.graph`), that node is frozen as a head is.

The two agree when no MLP sits between senders and receivers; docs/circuits.md compares them on the
bundled IOI model.

**Positions.** `positions=` (as `hooked.ablate` reads it: an int or a list for every prompt, or a 1-D tensor
[batch], one position per prompt) restricts both to the receivers' inputs at those positions: Wang et al.
patch the name movers' queries at END only (`receivers=["L3H0.q"], positions=-1`). "direct": the edges
`sender -> receiver` patched at those positions (the receiver's input there reads the senders' patched writes
there). "wang": the first forward is as above, and in the second the receivers read its values at those
positions only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.circuits.engine import Ablation, Where, _stage_loop, columns_at
from hooked.circuits.experiment import Experiment
from hooked.circuits.graph import Edge, Graph, graph
from hooked.interventions.positions import Positions, as_positions, positions_record
from hooked.interventions.results import SweepResult, variant_names
from hooked.interventions.sweeps import metric_name, sweep_provenance

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

PathMethod = Literal["direct", "wang"]
EdgeLike = "str | Edge | tuple[str, str]"


def patch_edges(
    model: HookedTransformer,
    clean,
    corrupt,
    variants: Mapping[str, Iterable] | Iterable,
    metric: Callable,
    *,
    ablation: Ablation = "corrupt",
    positions: Positions = None,
    experts: bool = False,
    attention_mask: Tensor | None = None,
    max_bytes: int | None = None,
    task=None,
) -> SweepResult:
    """The metric on the clean prompts with each variant's edges patched: one row per variant.

    `variants` maps a name to a list of edges (`"L1H0->L2H2.v"`, `(source, receiver)` or `Edge`); a plain
    list of edges (or one edge) is one variant named after its edges, joined by "+" (`"L1H0->L2H2.v+L2H2->logits"`,
    as `path_patch` names its pair; "no edges" for an empty list). An edge may carry a position, `"L1H0->L2H2.q@-1"` or
    `(source, receiver, -1)`: it is then patched at that position of each prompt only (a position in the
    prompt, negative from its end, as `positions=` elsewhere; every prompt must have it). `base` is the clean run, so
    `result.change` is
    metric(patched) - metric(clean). `ablation`: "corrupt" (the paired corrupt prompt's write), "mean"
    (the write averaged over the corrupt prompts' real tokens) or "zero" (corrupt may then be None).

    `positions=` patches every edge at those positions only, as `hooked.ablate` reads them: an int or a list
    (the same positions in every prompt) or a 1-D integer tensor [batch], one position per prompt
    (`positions=task.positions["S2"]`): the receiver's input at that position of each prompt reads the
    source's patched write at that position. Edges then carry no `@position` of their own.

    `experts=True`: the experts of a mixture-of-experts MLP are sources, `"L1.E3->logits"` (`circuits.graph`).
    """
    if not isinstance(variants, Mapping):
        edges = [variants] if isinstance(variants, (str, Edge)) else list(variants)
        variants = {"+".join(map(_edge_label, edges)) or "no edges": edges}
    if not variants:
        raise ValueError("variants must be a non-empty dict: {name: [edge, ...]}")
    names = variant_names(variants)  # before any forward: two names that read the same, or "base", raise
    where = as_positions(positions)
    # The graph's edges depend on the model only: the edges are read, and refused, before any forward.
    g = graph(model, experts)
    everywhere, at = zip(*(_mask(g, name, edges) for name, edges in variants.items()), strict=True)
    if where is not None and any(at):
        edge = next(f"{name!r}: {sorted(a)}" for name, a in zip(names, at, strict=True) if a)
        raise ValueError(
            f"variant {edge}: an edge carries its own position ('S->R@-1') and positions= is given too; use one:"
            " positions= for every edge, or '@p' on each edge"
        )
    listed = {
        name: [str(e) for e in g.edges_of(m)] + [f"{e}@{p}" for p, pm in sorted(a.items()) for e in g.edges_of(pm)]
        for name, m, a in zip(names, everywhere, at, strict=True)
    }
    if where is not None:  # every edge at `where`
        at, everywhere = [{where: m} for m in everywhere], [torch.zeros_like(m) for m in everywhere]
    keys = [where] if where is not None else sorted({p for variant in at for p in variant})
    experiment = Experiment.of(
        model, clean, corrupt, metric, ablation, attention_mask, max_bytes, "circuits.patch_edges", tuple(keys), g
    )
    masks = torch.stack(everywhere)
    empty = torch.zeros_like(masks[0])
    at_positions = {p: torch.stack([variant.get(p, empty) for variant in at]) for p in keys}
    values = experiment.values(masks, at_positions, [f"variant {name!r}" for name in names])
    info = {"method": "edge patching", "ablation": ablation, "edges": listed}
    if where is not None:
        info["positions"] = positions_record(where)
    return _result(experiment, names, values, task, info)


def path_patch(
    model: HookedTransformer,
    clean,
    corrupt,
    senders: Sequence[str],
    receivers: Sequence[str],
    metric: Callable,
    *,
    method: PathMethod = "direct",
    ablation: Ablation = "corrupt",
    positions: Positions = None,
    experts: bool = False,
    attention_mask: Tensor | None = None,
    task=None,
) -> SweepResult:
    """Path patching from `senders` (nodes: "L2H2", "L3.mlp", "input") to `receivers` (nodes, whose every
    input is a receiver, or inputs such as "L2H2.q", "L2KV0.k", "L3.mlp", "logits"); one variant.

    See the module docstring for `method="direct"` (the default) and `method="wang"`, and for `positions=`.
    """
    name = f"{'+'.join(senders)}->{'+'.join(receivers)}"
    return path_patch_sweep(
        model,
        clean,
        corrupt,
        {name: (senders, receivers)},
        metric,
        method=method,
        ablation=ablation,
        positions=positions,
        experts=experts,
        attention_mask=attention_mask,
        task=task,
    )


def path_patch_sweep(
    model: HookedTransformer,
    clean,
    corrupt,
    pairs: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    metric: Callable,
    *,
    method: PathMethod = "direct",
    ablation: Ablation = "corrupt",
    positions: Positions = None,
    experts: bool = False,
    attention_mask: Tensor | None = None,
    max_bytes: int | None = None,
    task=None,
) -> SweepResult:
    """Many (senders, receivers) pairs as one batched run: `{"L2H2->logits": (["L2H2"], ["logits"]), ...}`."""
    if method not in ("direct", "wang"):
        raise ValueError(
            f"method must be 'direct' (direct edges only) or 'wang' (Wang et al.'s: MLPs recomputed), not {method!r}"
        )
    if not isinstance(pairs, Mapping) or not pairs:
        raise ValueError("pairs must be a non-empty dict: {name: (senders, receivers)}")
    names = variant_names(pairs, "pair")
    where = as_positions(positions)
    g = graph(model, experts)
    resolved = {name: _resolve_pair(g, name, pair) for name, pair in zip(names, pairs.values(), strict=True)}
    experiment = Experiment.of(
        model,
        clean,
        corrupt,
        metric,
        ablation,
        attention_mask,
        max_bytes,
        "circuits.path_patch",
        () if where is None else (where,),
        g,
    )
    if method == "direct":
        masks = torch.stack([g.mask(Edge(s, r) for s, r in _direct_edges(g, *pair)) for pair in resolved.values()])
        labels = [f"pair {name!r}" for name in resolved]
        values = (
            experiment.values(masks, names=labels)
            if where is None
            else experiment.values(torch.zeros_like(masks), {where: masks}, labels)
        )
    else:
        values = _wang(experiment, list(resolved.values()), [f"pair {name!r}" for name in resolved], where)
    return _result(
        experiment,
        list(resolved),
        values,
        task,
        {
            "method": f"path patching ({method})",
            "ablation": ablation,
            "pairs": {
                name: {"senders": senders, "receivers": receivers} for name, (senders, receivers) in resolved.items()
            },
            **({} if where is None else {"positions": positions_record(where)}),
        },
    )


# ----------------------------------------------------------------------------- pieces
def _mask(g: Graph, name, edges) -> tuple[Tensor, dict[int, Tensor]]:
    if isinstance(edges, (str, Edge)):
        edges = [edges]
    try:
        return g.masks(edges)
    except (KeyError, ValueError, TypeError) as error:
        message = error.args[0] if error.args else error
        raise type(error)(f"variant {name!r}: {message}") from error


def _edge_label(edge) -> str:
    """An edge as it was given, as text: `"L1H0->L2H2.v"`, `("L1H0", "L2H2.v", -1)` -> `"L1H0->L2H2.v@-1"`."""
    if isinstance(edge, (tuple, list)) and len(edge) in (2, 3):
        return f"{edge[0]}->{edge[1]}" + (f"@{edge[2]}" if len(edge) == 3 else "")
    return str(edge)


def _resolve_pair(g: Graph, name: str, pair) -> tuple[list[str], list[str]]:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"pair {name!r} must be (senders, receivers), got {pair!r}")
    senders, receivers = ([items] if isinstance(items, str) else list(items) for items in pair)
    if not senders or not receivers:
        raise ValueError(f"pair {name!r} needs at least one sender and one receiver")
    for sender in senders:
        g.source_index(sender)
    inputs = []
    for receiver in receivers:
        if receiver in g._receiver_index:
            inputs.append(receiver)
        else:
            try:
                inputs += g.receivers_of(receiver)
            except KeyError:
                # 'L2H2.k' where key/value heads are grouped; 'L2H2' where layer 2's attention is one node
                wrong_kind = g.head_kind_error(receiver) or g.whole_attention_error(receiver)
                raise KeyError(
                    f"pair {name!r}: "
                    + (
                        wrong_kind
                        or f"{receiver!r} is neither a receiver ('L2H2.q', 'L3.mlp',"
                        " 'logits') nor a head node ('L2H2', or 'L2.attn' where a layer's"
                        " attention is one node)"
                    )
                ) from None
    if not _direct_edges(g, senders, inputs):
        raise ValueError(
            f"pair {name!r}: no sender of {senders} writes before any receiver of {inputs} reads; a path runs"
            " from an earlier layer to a later one"
        )
    return senders, list(dict.fromkeys(inputs))


def _direct_edges(g: Graph, senders: list[str], receivers: list[str]) -> list[tuple[str, str]]:
    upstream = {s: g.sources[g.source_index(s)].stage for s in senders}
    return [(s, r) for r in receivers for s in senders if upstream[s] < g.receivers[g.receiver_index(r)].stage]


def _wang(
    experiment: Experiment, pairs: list[tuple[list[str], list[str]]], names: list[str], where: Where | None = None
) -> Tensor:
    """Wang et al.'s path patching for every pair at once: V row blocks, two forwards; the receivers read what
    they read in the first at the positions `where` only (None: every position). `names` label the pairs in the
    error a NaN raises."""
    model, g, prompts = experiment.model, experiment.graph, experiment.prompts
    copies, batch = len(pairs), prompts.tokens.shape[0]
    clean, patched = experiment.clean, experiment.patched
    columns = None if where is None else columns_at(prompts, where)[:, :, None]  # [B pos 1]

    # Forward 1: senders patched, every other head frozen at its clean write, MLPs recomputed.
    senders_at: dict[str, list[tuple[int, int | None, int]]] = {}  # hook name -> (variant, head, source)
    for variant, (senders, _) in enumerate(pairs):
        for sender in senders:
            source = g.sources[g.source_index(sender)]
            senders_at.setdefault(source.hook_name, []).append((variant, source.head, g.source_index(sender)))
    head_sources: dict[str, list[int]] = {}  # attention sources: a layer's heads, or its whole-attention node
    for index, source in enumerate(g.sources):
        if source.attention:
            head_sources.setdefault(source.hook_name, []).append(index)

    def write(activation: Tensor, hook) -> Tensor:
        if hook.name in head_sources:  # every head (whole-attention layer: the layer's output) at its clean write
            indices = head_sources[hook.name]
            if g.sources[indices[0]].head is None:
                new = clean.outputs[indices[0]].repeat(copies, 1, 1).to(activation.dtype)
            else:
                frozen = clean.outputs[indices].permute(1, 2, 0, 3)  # [B pos heads d_model]
                new = frozen.repeat(copies, 1, 1, 1).to(activation.dtype)
        else:
            new = activation.clone()
        blocks = new.view(copies, batch, *new.shape[1:])
        for variant, head, source in senders_at.get(hook.name, []):
            value = patched[source].to(new.dtype)
            if head is None:
                blocks[variant] = value
            else:
                blocks[variant, :, :, head] = value
        return new

    receivers_at: dict[str, list[tuple[int, int | None]]] = {}
    for variant, (_, receivers) in enumerate(pairs):
        for receiver in receivers:
            r = g.receivers[g.receiver_index(receiver)]
            receivers_at.setdefault(r.hook_name, []).append((variant, r.head))
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = activation.clone()

    written = set(head_sources) | set(senders_at)
    hooks = [(name, write) for name in written] + [(name, keep) for name in receivers_at]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        _stage_loop(model, prompts, copies, 0, clean.resid[0])

    # Forward 2: the clean run with each variant's receivers reading what they read in forward 1.
    def replace(activation: Tensor, hook) -> Tensor:
        new = activation.clone()
        blocks, source = (
            new.view(copies, batch, *new.shape[1:]),
            recorded[hook.name].view(copies, batch, *new.shape[1:]),
        )
        for variant, head in receivers_at[hook.name]:
            if head is None:
                blocks[variant] = _at(columns, source[variant], blocks[variant])
            else:
                blocks[variant, :, :, head] = _at(columns, source[variant, :, :, head], blocks[variant, :, :, head])
        return new

    start = min(min(g.receivers[g.receiver_index(r)].start for r in receivers) for _, receivers in pairs)
    start = min(start, 2 * g.n_layers - 1)
    with torch.no_grad(), model.hooks(fwd_hooks=[(name, replace) for name in receivers_at]):
        final = _stage_loop(model, prompts, copies, start, clean.resid[start])
        reduced = experiment.reads.logits(model, final, prompts.key_valid)
    return torch.stack(
        [experiment.evaluate(reduced[v * batch : (v + 1) * batch], f"with {names[v]}").cpu() for v in range(copies)]
    )


def _at(columns: Tensor | None, recorded: Tensor, current: Tensor) -> Tensor:
    """`recorded` [B pos d] at the selected columns (`columns` [B pos 1]; None: all), `current` elsewhere."""
    return recorded if columns is None else torch.where(columns, recorded, current)


def _result(experiment: Experiment, names: list[str], values: Tensor, task, circuit_info: dict) -> SweepResult:
    metric = experiment.metric
    provenance = sweep_provenance(experiment.model, [], metric, task, experiment.prompts.tokens)
    provenance["circuits"] = circuit_info
    return SweepResult(
        variants=names,
        values=values,
        base=experiment.clean_values,
        metric=metric_name(metric),
        provenance=provenance,
    )
