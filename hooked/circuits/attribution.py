"""Edge attribution patching: a score for every edge of the graph from one or a few backward passes.

    scores = circuits.attribute(model, clean, corrupt, metric, method="eap-ig", steps=5)
    scores.top(20); scores.table(); scores.to_csv("edges.csv")

**EAP** (Syed, Rager and Conmy 2023, "Attribution Patching Outperforms Automated Circuit Discovery",
arXiv 2310.10348) is the first-order estimate of patching one edge:

    score(S->R) = mean over prompts of  (patched_S - clean_S) . d metric / d input_R

where `clean_S` is S's write on the clean prompt, `patched_S` its corrupt write (or mean, or zero:
`ablation=`), and the gradient is taken at the clean run with respect to R's own input (a head's
`hook_q_input` slot, an MLP's `hook_mlp_in`, the final residual stream), summed over positions. Every
edge into R shares R's gradient, so the clean and corrupt runs plus one forward and backward give all
scores. It estimates metric(edge patched) - metric(clean).

**EAP-IG** (Hanna, Pezzelle and Belinkov 2024, "Have Faith in Faithfulness", arXiv 2403.17806) replaces
the gradient by its average along the straight line from the clean to the corrupt input embeddings,
at the midpoints of `steps` equal intervals (alpha = (k + 0.5) / steps), all steps as row blocks of
one forward. Where the metric is not linear in the patched direction the single gradient of EAP can
be far off (a saturated softmax, a norm); the average follows the curve. With ablation "mean" or
"zero" the line runs to the input's patched value instead of the corrupt embeddings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.circuits.engine import Ablation, Where, _stage_loop, columns_at, rows_per_forward
from hooked.circuits.experiment import Experiment
from hooked.circuits.graph import Edge, Graph
from hooked.circuits.graph import graph as build_graph
from hooked.hooks import evaluating, needs_gradients
from hooked.interventions.positions import Positions, as_positions, positions_record
from hooked.interventions.sweeps import sweep_provenance
from hooked.tables import ResultTable

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

Method = Literal["eap", "eap-ig"]


class EdgeValues(Tensor):
    """`EdgeScores.values`: a plain tensor (every operation on it gives a plain `Tensor`), except that calling
    it, as the method it used to be, says so."""

    def __call__(self, *args, **kwargs):
        raise TypeError(
            "EdgeScores.values is an attribute (a [n_edges] tensor, as SweepResult.values), no longer a method:"
            " write scores.values, not scores.values()"
        )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    def __repr__(self, **kwargs) -> str:
        return repr(self.as_subclass(Tensor))

    def __deepcopy__(self, memo) -> Tensor:
        return self.as_subclass(Tensor).clone()

    def __reduce_ex__(self, protocol):
        return self.as_subclass(Tensor).__reduce_ex__(protocol)


@dataclass
class EdgeScores(ResultTable):
    """One score per edge of a graph: `scores["L1H0->L2H2.v"]`, `scores.values` ([n_edges]), `top(20)`, `table()`,
    `to_csv(path)` (one row per edge, largest |score| first: hooked/tables.py)."""

    table_index = "edge"
    columns = ("edge", "source", "receiver", "score", "rank")

    graph: Graph
    matrix: Tensor  # [n_sources, n_receivers] float32 (float64 for a float64 model); 0 where there is no edge
    method: str
    provenance: dict = field(default_factory=dict)

    @property
    def values(self) -> Tensor:
        """Every edge's score, [n_edges], in `graph.edges` order."""
        return self.matrix[self.graph.coordinates()].as_subclass(EdgeValues)

    def __getitem__(self, edge) -> float:
        edge = self.graph.edge(edge)
        return float(self.matrix[self.graph.source_index(edge.source), self.graph.receiver_index(edge.receiver)])

    def __len__(self) -> int:
        return len(self.graph.edges)

    def ranking(self) -> list[Edge]:
        """Every edge, the largest |score| first (ties in graph order)."""
        order = torch.sort(self.values.abs(), descending=True, stable=True).indices
        return [self.graph.edges[i] for i in order.tolist()]

    def top(self, k: int = 20) -> list[tuple[str, float]]:
        """The k edges of largest |score|, with their signed scores."""
        values = self.values
        order = torch.sort(values.abs(), descending=True, stable=True).indices[:k]
        return [(str(self.graph.edges[i]), float(values[i])) for i in order.tolist()]

    def rows(self) -> list[dict]:
        """One dict per edge (edge, source, receiver, score, rank), the largest |score| first."""
        values = self.values.tolist()
        ranked = self.ranking()
        rank = {edge: i + 1 for i, edge in enumerate(ranked)}
        return sorted(
            (
                {"edge": str(e), "source": e.source, "receiver": e.receiver, "score": v, "rank": rank[e]}
                for e, v in zip(self.graph.edges, values, strict=True)
            ),
            key=lambda row: row["rank"],
        )

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "scores": {str(e): v for e, v in zip(self.graph.edges, self.values.tolist(), strict=True)},
            "provenance": self.provenance,
        }

    def __repr__(self) -> str:
        best = ", ".join(f"{edge} {score:+.3g}" for edge, score in self.top(3))
        return f"EdgeScores({self.method}, {len(self)} edges; top: {best})"


def attribute(
    model: HookedTransformer,
    clean,
    corrupt,
    metric: Callable,
    *,
    method: Method = "eap",
    steps: int = 5,
    ablation: Ablation = "corrupt",
    positions: Positions = None,
    experts: bool = False,
    attention_mask: Tensor | None = None,
    steps_per_forward: int | None = None,
    task=None,
) -> EdgeScores:
    """A score for every edge: EAP (`method="eap"`) or EAP-IG (`method="eap-ig"`, `steps` interpolations).

    The metric is differentiated (a `hooked.interventions.metrics` metric such as `logit_diff`). A metric that
    compares with a base run, like `metrics.kl_div()`, takes the clean run as its base: KL(clean model || run). Its
    gradient at the clean run is 0, so EAP refuses it; EAP-IG takes its gradients along the path from the clean to
    the patched input, where they are not, and its scores sum to about KL(clean || patched) (Hanna et al. 2024,
    "Have Faith in Faithfulness", score circuits with EAP-IG and KL this way). The model's
    parameters' `.grad` are left alone; no hook stays registered. EAP-IG's steps run as row blocks of one
    forward, `steps_per_forward` at a time (default: what fits the memory budget of the batched edge forward).

    `positions=` (as `patch_edges` takes it: an int or a list for every prompt, a 1-D tensor [batch] one per prompt)
    scores each edge at those positions only: the sum over positions runs over them, estimating `patch_edges(...,
    positions=positions)` of the edge. EAP-IG's path still runs from the clean to the corrupt input at every position.
    `experts=True`: the experts of a mixture-of-experts MLP are sources (`circuits.graph`).
    """
    needs_gradients(model, "circuits.attribute")
    if steps_per_forward is not None and (not isinstance(steps_per_forward, int) or steps_per_forward < 1):
        raise ValueError(f"steps_per_forward must be a positive int, not {steps_per_forward!r}")
    if method not in ("eap", "eap-ig"):
        raise ValueError(f"method must be 'eap' or 'eap-ig', not {method!r}")
    if method == "eap":
        refuse_base_metric(metric, "circuits.attribute(method='eap')")
    alphas = interpolation_points(method, steps)
    where = as_positions(positions)
    experiment = Experiment.of(
        model,
        clean,
        corrupt,
        metric,
        ablation,
        attention_mask,
        caller="circuits.attribute",
        positions=() if where is None else (where,),
        g=build_graph(model, experts) if experts else None,
    )
    gradients = receiver_gradients(experiment, alphas, steps_per_forward)
    matrix = scores_from_gradients(experiment, gradients, where)
    provenance = sweep_provenance(model, [], metric, task, experiment.prompts.tokens)
    provenance["circuits"] = {"method": method, "steps": len(alphas), "ablation": ablation}
    if where is not None:
        provenance["circuits"]["positions"] = positions_record(where)
    return EdgeScores(experiment.graph, matrix, method, provenance)


def refuse_base_metric(metric: Callable, caller: str) -> None:
    """Refuse, for EAP, a metric that compares with the base run (KL divergence): its base is the clean run, where
    it is at its minimum, so its gradient there is 0 and every EAP score would be 0."""
    if getattr(metric, "needs_base", False) is True:
        raise ValueError(
            f"{caller}: {metric!r} compares with the clean run, where it is at its minimum and its gradient is 0,"
            " so every EAP score would be 0; use method='eap-ig' (its gradients are taken on the way from the"
            " clean to the patched input, where they are not 0), a metric of the answers (logit_diff, log_prob,"
            " ...), or circuits.discover(method='acdc'), which patches the edges and reads the metric itself"
        )


def interpolation_points(method: Method, steps: int) -> list[float]:
    """Where the gradient is taken, as the fraction of the way from the clean to the patched input: 0 for EAP;
    the midpoints of `steps` equal intervals for EAP-IG."""
    if method == "eap-ig" and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"steps must be a positive int, not {steps!r}")
    return [0.0] if method == "eap" else [(k + 0.5) / steps for k in range(steps)]


def receiver_gradients(
    experiment: Experiment, alphas: list[float], steps_per_forward: int | None = None
) -> dict[str, Tensor]:
    """d metric / d input at every receiver point ([B pos (heads) d_model]), averaged over the inputs
    clean + alpha * (patched - clean) of the embedding. The alphas run as row blocks, `steps_per_forward`
    at a time (default: as many as the memory budget of `engine.rows_per_forward` allows)."""
    model, g, prompts = experiment.model, experiment.graph, experiment.prompts
    if steps_per_forward is None:
        steps_per_forward = rows_per_forward(model, g, prompts, experiment.max_bytes)
    points = list(dict.fromkeys(receiver.hook_name for receiver in g.receivers))
    precision = torch.promote_types(model.dtype, torch.float32)
    totals: dict[str, Tensor] = {}
    with evaluating(model):
        for first in range(0, len(alphas), steps_per_forward):
            for point, grad in _gradients_at(experiment, alphas[first : first + steps_per_forward], points).items():
                grad = grad.to(precision).sum(0)  # [B ...]: the sum over this chunk's alphas
                totals[point] = grad if point not in totals else totals[point] + grad
    return {point: total / len(alphas) for point, total in totals.items()}


def _gradients_at(experiment: Experiment, alphas: list[float], points: list[str]) -> dict[str, Tensor]:
    """One forward and backward of len(alphas) row blocks: each point's gradient, [alphas B ...]."""
    model, g, prompts = experiment.model, experiment.graph, experiment.prompts
    batch, copies = prompts.tokens.shape[0], len(alphas)
    clean_input = experiment.clean.outputs[0]
    towards = experiment.patched[0].expand_as(clean_input)
    alpha = torch.tensor(alphas, dtype=clean_input.dtype, device=clean_input.device)[:, None, None, None]
    start = (clean_input + alpha * (towards - clean_input)).reshape(copies * batch, *clean_input.shape[1:])
    inputs: dict[str, Tensor] = {}

    def embed(activation: Tensor, hook) -> Tensor:
        return start.detach().requires_grad_(True)

    def keep(activation: Tensor, hook) -> None:
        inputs[hook.name] = activation

    with torch.enable_grad(), model.hooks(fwd_hooks=[(g.sources[0].hook_name, embed)] + [(p, keep) for p in points]):
        final = _stage_loop(model, prompts, copies, 0, experiment.clean.resid[0])
        reduced = experiment.reads.logits(model, final, prompts.key_valid)
        values = torch.cat(
            [
                experiment.reads.evaluate(  # a metric with a base (KL) compares with the clean run
                    reduced[i * batch : (i + 1) * batch],
                    experiment.clean.reduced,
                    experiment.key_valid,
                    _at_point(alphas[i]),
                )
                for i in range(copies)
            ]
        )
        if not values.requires_grad:
            raise ValueError(
                f"metric {experiment.metric!r} returned values with no gradient (a .detach(), .item() or"
                " no_grad inside?); attribution differentiates the metric"
            )
        grads = torch.autograd.grad(values.float().sum(), [inputs[p] for p in points], allow_unused=True)
    out = {}
    for point, grad in zip(points, grads, strict=True):
        shape = inputs[point].shape
        grad = torch.zeros(shape, dtype=clean_input.dtype, device=clean_input.device) if grad is None else grad
        out[point] = grad.view(copies, batch, *shape[1:])
    return out


def _at_point(alpha: float) -> str:
    return "on the clean run" if alpha == 0 else f"at the EAP-IG point alpha={alpha:g} (clean to patched input)"


def scores_from_gradients(experiment: Experiment, gradients: dict[str, Tensor], where: Where | None = None) -> Tensor:
    """[n_sources, n_receivers]: (patched_S - clean_S) . gradient at R, summed over positions (those of `where`
    only, `engine.columns_at`; None: all), mean over prompts."""
    g = experiment.graph
    clean = experiment.clean.outputs
    precision = next(iter(gradients.values())).dtype
    delta = (experiment.patched - clean).to(precision)  # [n_sources B pos d_model]
    if where is not None:
        delta = delta * columns_at(experiment.prompts, where).to(delta)[None, :, :, None]
    batch = clean.shape[1]
    matrix = torch.zeros(len(g.sources), len(g.receivers), dtype=precision)
    by_point: dict[str, list[int]] = {}
    for index, receiver in enumerate(g.receivers):
        by_point.setdefault(receiver.hook_name, []).append(index)
    for point, indices in by_point.items():
        receivers = [g.receivers[i] for i in indices]
        upstream = receivers[0].n_upstream
        grad = gradients[point]
        if receivers[0].head is None:
            scores = torch.einsum("sbpd,bpd->s", delta[:upstream], grad)[:, None]
        else:
            scores = torch.einsum("sbpd,bphd->sh", delta[:upstream], grad)[:, [r.head for r in receivers]]
        matrix[:upstream, indices] = (scores / batch).cpu()
    infinite = ~torch.isfinite(matrix)
    if bool(infinite.any()):
        edges = [f"{g.sources[s].name}->{g.receivers[r].name}" for s, r in infinite.nonzero().tolist()]
        raise ValueError(
            f"the attribution score of {len(edges)} edge{'s' if len(edges) > 1 else ''} is NaN or infinite"
            f" ({', '.join(edges[:5])}{', ...' if len(edges) > 5 else ''}) on these {batch} prompts: the metric's"
            " value is finite but its gradient is not (a norm or a square root at 0, a NaN in the backward);"
            " differentiate a metric whose gradient is defined at the clean run"
        )
    return matrix  # in the gradients' precision: float32, or the float64 of a float64 model


def scores_for(
    model: HookedTransformer, values: dict[str, float], method: str, provenance: dict | None = None
) -> EdgeScores:
    """EdgeScores from {edge: score} (e.g. read back from JSON)."""
    g = build_graph(model) if not isinstance(model, Graph) else model
    matrix = torch.zeros(len(g.sources), len(g.receivers))
    for edge, value in values.items():
        edge = g.edge(edge)
        matrix[g.source_index(edge.source), g.receiver_index(edge.receiver)] = value
    return EdgeScores(g, matrix, method, provenance or {})
