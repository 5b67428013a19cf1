"""Circuit discovery (top edges by attribution, or ACDC) and the `Circuit` it returns.

    c = circuits.discover(model, clean, corrupt, metric, method="eap-ig", n_edges=100)
    c = circuits.discover(model, clean, corrupt, metric, method="acdc", threshold=0.05)
    c.edges; c.nodes; c.faithfulness(held_out_clean, held_out_corrupt, metric)
    c.curve(sizes=[10, 20, 50]); c.plot("circuit.png"); c.to_json("circuit.json")

A circuit is a set of edges; every edge outside it is patched (to the corrupt write, its mean or zero:
the `ablation` it was found with). Its **faithfulness** is

    (m(circuit) - m(empty)) / (m(full) - m(empty))

with m the metric averaged over prompts, `full` the clean run (nothing patched) and `empty` every edge
patched (the corrupt run). 1 means the circuit alone carries the behaviour; 0 that it carries none.
All of it is one batched forward of the circuit's edge mask, however many edges it has.

**Pruning.** An edge whose source no path of circuit edges reaches from `input`, or whose receiver's
node reaches `logits` along none, changes nothing when patched (a head whose inputs are all patched
writes exactly its corrupt output), so it is dropped: `discover` returns the pruned circuit.

**ACDC** (Conmy et al. 2023, "Towards Automated Circuit Discovery for Mechanistic Interpretability",
arXiv 2304.14997) starts from the whole graph and visits receivers in reverse topological order
(`logits` first), and each receiver's edges from the latest source to the earliest; an edge is removed
(patched) for good when removing it moves the metric, averaged over prompts, by less than `threshold`
from the current graph's value. Sequential by definition, it is run here speculatively and exactly:
each forward evaluates the next `batch_edges` trials as row blocks, trial k assuming the decisions on
trials 1..k-1 that an EAP score predicts (removed when its |score| is under the threshold). Decisions
are then read off in order; at the first trial whose real decision differs from the prediction, the
later trials (which assumed otherwise) are discarded and the next forward starts after it. Every
decision is made on the exact metric of the exact graph the sequential algorithm would hold, so the
result is ACDC's; the forwards needed are the trials / `batch_edges` plus one per misprediction.
Trials of late receivers recompute only the layers from that receiver on.

**ACDC's metric and criterion.** With a metric that compares with a base run (`metrics.kl_div()`, the ACDC
paper's choice), the base is the clean run: each trial reads KL(clean model || current graph), 0 with
nothing removed. Its gradient there is 0, so EAP predicts every edge removed and the speculation relies on
that (still exact). `abs_value_threshold=True` (the default) removes an edge when |m(new) - m(current)| <
threshold, the option of the same name in the ACDC code (ArthurConmy/Automatic-Circuit-Discovery,
`acdc/TLACDCExperiment.py`); `False` is the signed criterion of the paper's Algorithm 1 (`D_KL(G||H_new) -
D_KL(G||H) < tau`) and of that code's default: an edge is removed unless removing it moves the metric by at
least `threshold` towards its value with every edge patched (the corrupt run). The ACDC code's metrics all
rise as the circuit breaks (KL, a negated logit difference); here the direction is read off the clean and
the corrupt runs (KL rises, `logit_diff` falls: an edge is kept only when its removal lowers it by the
threshold or more), and an edge whose removal helps is removed. A signed ACDC circuit ranks its edges
(`Circuit.ranking`, what `curve` grows along) by that signed score, the most harmful removal first.

**EAP and EAP-IG with KL.** EAP differentiates the metric at the clean run, where KL(clean || run) is at its
minimum: every score would be 0, so it is refused, saying so. EAP-IG takes the clean run as KL's base too, and
its gradients at the points between the clean and the patched input, where they are not 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.circuits.attribution import (
    EdgeScores,
    interpolation_points,
    receiver_gradients,
    refuse_base_metric,
    scores_from_gradients,
)
from hooked.circuits.engine import Ablation, Where
from hooked.circuits.experiment import Experiment
from hooked.circuits.graph import INPUT, LOGITS, Edge, Graph, graph_of_shape
from hooked.circuits.graph import graph as build_graph
from hooked.hooks import needs_gradients
from hooked.interventions import metrics
from hooked.interventions.positions import PerPrompt, Positions, as_positions, per_prompt, positions_record
from hooked.interventions.results import write_json
from hooked.interventions.sweeps import sweep_provenance

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

DiscoveryMethod = Literal["eap", "eap-ig", "acdc"]


@dataclass
class Circuit:
    """A set of edges of a model's graph, with the score each was chosen by.

    `scores` holds a score for every edge of the graph (the attribution, or for ACDC the metric's move
    when the edge was tried), so `curve` can grow and shrink the circuit along the same ranking.
    """

    graph: Graph
    edges: list[Edge]  # largest |score| first (signed ACDC: largest score first)
    scores: dict[str, float]  # every graph edge -> its score
    method: str
    ablation: Ablation = "corrupt"
    provenance: dict = field(default_factory=dict)
    model: HookedTransformer | None = field(default=None, repr=False, compare=False)
    _prompts: tuple | None = field(
        default=None, repr=False, compare=False
    )  # (clean, corrupt, metric, mask) it was found on
    positions: Where | None = None  # its edges are edges at these positions of each prompt (discover(positions=))

    # ----------------------------------------------------------------- what it holds
    @property
    def nodes(self) -> list[str]:
        """The nodes its edges join, in graph order (`input` and `logits` included when reached)."""
        touched = {e.source for e in self.edges} | {e.receiver_node for e in self.edges}
        for edge in self.edges:
            touched.update(self.graph.heads_reading(edge.receiver))
        order = [s.name for s in self.graph.sources] + [LOGITS]
        return [node for node in order if node in touched]

    @property
    def heads(self) -> dict[str, list[str]]:
        """Each head of the circuit -> which of its inputs ('q', 'k', 'v') circuit edges feed."""
        out: dict[str, list[str]] = {}
        for node in self.nodes:
            if node.startswith("L") and "H" in node and "." not in node:
                fed = {
                    r.rsplit(".", 1)[1]
                    for r in self.graph.receivers_of(node)
                    if any(e.receiver == r for e in self.edges)
                }
                out[node] = [kind for kind in "qkv" if kind in fed]
        return out

    def mask(self) -> Tensor:
        return self.graph.mask(self.edges)

    def ranking(self) -> list[Edge]:
        """Every edge of the graph, the largest |score| first (ties in graph order): what `curve` grows along.

        A circuit of signed ACDC (`abs_value_threshold=False`) ranks by the signed score, the largest harm done
        by removing the edge first: an edge whose removal moved the metric far the other way (it helps the
        circuit to lose it) comes last, not first."""
        return _ranking(self.graph, self.scores, signed=self.signed)

    @property
    def signed(self) -> bool:
        """Whether its scores are signed ACDC's (`abs_value_threshold=False`): harm done by removing the edge."""
        return self.provenance.get("circuits", {}).get("abs_value_threshold") is False

    def __len__(self) -> int:
        return len(self.edges)

    def __contains__(self, edge) -> bool:
        return self.graph.edge(edge) in set(self.edges)

    # ----------------------------------------------------------------- measuring
    def faithfulness(
        self,
        clean=None,
        corrupt=None,
        metric: Callable | None = None,
        *,
        attention_mask: Tensor | None = None,
        positions: Positions = None,
    ) -> float:
        """(m(circuit) - m(corrupt)) / (m(clean) - m(corrupt)) on these prompts (default: those it was found on),
        every edge outside the circuit patched, in one forward. A circuit found at positions (`discover(positions=)`)
        patches its complement there only, and `corrupt` is every edge patched there; on other prompts give their
        `positions=` when it was found at per-prompt ones."""
        experiment, _ = self._experiment(clean, corrupt, metric, attention_mask, positions)
        return _faithfulness(experiment, self.mask()[None])[0]

    def curve(
        self,
        sizes: Sequence[int],
        clean=None,
        corrupt=None,
        metric: Callable | None = None,
        attention_mask: Tensor | None = None,
        positions: Positions = None,
    ) -> list[dict]:
        """Faithfulness of the top-`size` edges by |score| (pruned), for each size: one batched run.

        Returns [{"size": n asked, "edges": n kept after pruning, "faithfulness": f}, ...].
        """
        sizes = [int(size) for size in sizes]
        if not sizes or min(sizes) < 0:
            raise ValueError(f"sizes must be a non-empty list of non-negative edge counts, not {sizes!r}")
        experiment, _ = self._experiment(clean, corrupt, metric, attention_mask, positions)
        ranking = self.ranking()
        circuits = [prune(self.graph, ranking[:size], self.ablation) for size in sizes]
        values = _faithfulness(experiment, torch.stack([self.graph.mask(c) for c in circuits]))
        return [
            {"size": size, "edges": len(c), "faithfulness": f}
            for size, c, f in zip(sizes, circuits, values, strict=True)
        ]

    def _experiment(self, clean, corrupt, metric, attention_mask, positions=None):
        if self.model is None:
            raise ValueError("this circuit has no model (read from JSON?): pass model= to Circuit.from_json")
        where = as_positions(positions)
        if where is not None and self.positions is None:
            raise ValueError("positions= is for a circuit found at positions (discover(positions=)); this one is not")
        if where is None and self.positions is not None:
            if isinstance(self.positions, PerPrompt) and clean is not None:
                raise ValueError(
                    "this circuit was found at one position per prompt of its prompts; for other prompts give"
                    " theirs, positions="
                )
            where = self.positions
        if (clean is None or corrupt is None or metric is None) and self._prompts is None:
            raise ValueError("give clean, corrupt and metric: this circuit does not hold the prompts it was found on")
        if self._prompts is not None:
            found_clean, found_corrupt, found_metric, found_mask = self._prompts
            if metric is None or metric is found_metric:
                # The metric it was found with reads the answers of those prompts: bound to them, other prompts
                # are refused (metrics.check_prompts) rather than scored with the wrong answers.
                metric = metrics.bound_to(
                    found_metric, self.model, found_clean, found_corrupt, found_mask, "the prompts it was found on"
                )
            if clean is None and corrupt is None and attention_mask is None:
                attention_mask = found_mask  # the padding of the prompts it was found on
            clean = found_clean if clean is None else clean
            corrupt = found_corrupt if corrupt is None else corrupt
        experiment = Experiment.of(
            self.model,
            clean,
            corrupt,
            metric,
            self.ablation,
            attention_mask,
            caller="Circuit.faithfulness",
            g=self.graph,
            where=where,
        )
        return experiment, metric

    # ----------------------------------------------------------------- saving and drawing
    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "ablation": self.ablation,
            "edges": [str(e) for e in self.edges],
            "nodes": self.nodes,
            "heads": self.heads,
            "scores": self.scores,
            "shape": {
                "n_layers": self.graph.n_layers,
                "n_heads": self.graph.n_heads,
                "n_kv_heads": self.graph.n_kv_heads,
                **({} if self.graph.mlp_layers is None else {"mlp_layers": list(self.graph.mlp_layers)}),
                **({"parallel_layers": list(self.graph.parallel_layers)} if self.graph.parallel_layers else {}),
                **({"whole_attention": list(self.graph.whole_attention)} if self.graph.whole_attention else {}),
                **({"expert_layers": dict(self.graph.expert_layers)} if self.graph.expert_layers else {}),
            },
            **({} if self.positions is None else {"positions": positions_record(self.positions)}),
            "provenance": self.provenance,
        }

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | Path, model: HookedTransformer | None = None) -> Circuit:
        """The circuit `to_json` wrote; with `model=`, bound to it (so `faithfulness` and `curve` run)."""
        data = json.loads(Path(path).read_text())
        shape = data["shape"]
        mlp_layers = None if shape.get("mlp_layers") is None else tuple(shape["mlp_layers"])  # absent: every layer
        parallel = tuple(shape.get("parallel_layers", ()))
        whole = tuple(shape.get("whole_attention", ()))
        experts = {int(layer): n for layer, n in shape.get("expert_layers", {}).items()}  # JSON keys are str
        g = (
            build_graph(model, bool(experts))
            if model is not None
            else graph_of_shape(
                shape["n_layers"], shape["n_heads"], shape["n_kv_heads"], mlp_layers, parallel, whole, experts
            )
        )
        if model is not None and (
            g.n_layers,
            g.n_heads,
            g.n_kv_heads,
            g.mlp_layers,
            g.parallel_layers,
            g.whole_attention,
            g.expert_layers,
        ) != (
            shape["n_layers"],
            shape["n_heads"],
            shape["n_kv_heads"],
            mlp_layers,
            parallel,
            whole,
            tuple(sorted(experts.items())),
        ):
            raise ValueError(f"the circuit in {path} was found on a graph of shape {shape}, but this model's is {g!r}")
        return cls(
            g,
            [g.edge(e) for e in data["edges"]],
            dict(data["scores"]),
            data["method"],
            data.get("ablation", "corrupt"),
            data.get("provenance", {}),
            model,
            positions=_positions_from_json(data.get("positions")),
        )

    def plot(self, path: str | Path | None = None, title: str | None = None):
        """Draw the circuit, layered by depth (see `hooked.circuits.plot`); needs the `plot` extra."""
        from hooked.circuits.plot import plot_circuit

        return plot_circuit(self, path, title)

    def __repr__(self) -> str:
        return f"Circuit({self.method}, {len(self.edges)} of {len(self.graph.edges)} edges, {len(self.nodes)} nodes)"


# ----------------------------------------------------------------------------- discovery
def discover(
    model: HookedTransformer,
    clean,
    corrupt,
    metric: Callable,
    *,
    method: DiscoveryMethod = "eap-ig",
    n_edges: int | None = None,
    threshold: float | None = None,
    steps: int = 5,
    ablation: Ablation = "corrupt",
    batch_edges: int = 32,
    abs_value_threshold: bool = True,
    experts: bool = False,
    positions: Positions = None,
    attention_mask: Tensor | None = None,
    task=None,
) -> Circuit:
    """Find a circuit: the `n_edges` edges of largest |EAP| or |EAP-IG| score, or ACDC with `threshold`; pruned.

    ACDC with a metric that compares with the base run (`metrics.kl_div()`, the ACDC paper's) takes the clean
    run as the base: KL(clean model || circuit). `abs_value_threshold` picks ACDC's criterion (the module
    docstring): True, an edge is removed when removing it moves the metric by less than `threshold` either way;
    False, the signed one, when it moves it less than `threshold` towards the corrupt run's value (or away).
    `experts=True`: the experts of a mixture-of-experts MLP are nodes (`circuits.graph`).
    `positions=` (as `patch_edges` takes it) makes every edge an edge at those positions of each prompt: scores,
    ACDC's trials and the circuit's faithfulness patch edges there only.
    """
    needs_gradients(model, "circuits.discover")
    if method not in ("eap", "eap-ig", "acdc"):
        raise ValueError(f"method must be 'eap', 'eap-ig' or 'acdc', not {method!r}")
    if method == "acdc":
        if threshold is None or n_edges is not None:
            raise ValueError(
                "method='acdc' takes threshold= (the metric change below which an edge is removed), not n_edges="
            )
    elif n_edges is None or threshold is not None:
        raise ValueError(f"method={method!r} keeps the top n_edges= edges by score; threshold= is ACDC's")
    elif method == "eap":
        refuse_base_metric(metric, "discover(method='eap')")
    if not isinstance(abs_value_threshold, bool):
        raise TypeError(
            f"abs_value_threshold is True (ACDC's two-sided criterion) or False (the signed one), not"
            f" {abs_value_threshold!r}"
        )
    if method != "acdc" and not abs_value_threshold:
        raise ValueError(f"abs_value_threshold=False is ACDC's signed criterion; method={method!r} ranks by |score|")
    if not isinstance(batch_edges, int) or isinstance(batch_edges, bool) or batch_edges < 1:
        raise ValueError(f"batch_edges (ACDC trials per forward) must be a positive int, not {batch_edges!r}")
    if n_edges is not None and (not isinstance(n_edges, int) or isinstance(n_edges, bool) or n_edges < 0):
        raise ValueError(f"n_edges must be a non-negative int, not {n_edges!r}")
    if threshold is not None:
        check_threshold(threshold)
    alphas = interpolation_points(method, steps) if method != "acdc" else None
    experiment = Experiment.of(
        model,
        clean,
        corrupt,
        metric,
        ablation,
        attention_mask,
        caller="circuits.discover",
        g=build_graph(model, experts) if experts else None,
        where=as_positions(positions),
    )
    g = experiment.graph
    provenance = sweep_provenance(model, [], metric, task, experiment.prompts.tokens)
    if method == "acdc":
        kept, scores, stats = acdc(experiment, float(threshold), batch_edges, abs_value_threshold)
        provenance["circuits"] = {
            "method": "acdc",
            "threshold": threshold,
            "abs_value_threshold": abs_value_threshold,
            "ablation": ablation,
            **stats,
        }
    else:
        matrix = scores_from_gradients(experiment, receiver_gradients(experiment, alphas), experiment.where)
        scores = dict(zip(map(str, g.edges), matrix[g.coordinates()].tolist(), strict=True))
        provenance["circuits"] = {"method": method, "steps": len(alphas), "n_edges": n_edges, "ablation": ablation}
    ranking = _ranking(g, scores, signed=method == "acdc" and not abs_value_threshold)
    order = {e: i for i, e in enumerate(ranking)}
    edges = sorted(prune(g, kept if method == "acdc" else ranking[:n_edges], ablation), key=order.__getitem__)
    provenance["circuits"]["kept_after_pruning"] = len(edges)
    if experiment.where is not None:
        provenance["circuits"]["positions"] = positions_record(experiment.where)
    found_on = (clean, corrupt, metric, attention_mask)
    return Circuit(g, edges, scores, method, ablation, provenance, model, found_on, experiment.where)


def acdc(
    experiment: Experiment, threshold: float, batch_edges: int = 32, abs_value_threshold: bool = True
) -> tuple[list[Edge], dict[str, float], dict]:
    """ACDC's kept edges, every edge's score when it was tried (|metric move|, or with `abs_value_threshold=False`
    the signed move towards the corrupt run's value), and counts (see the module docstring)."""
    check_threshold(threshold)
    g = experiment.graph
    towards = 1.0 if abs_value_threshold else _towards_empty(experiment)

    def effect(move: float) -> float:  # what is compared with the threshold
        return abs(move) if abs_value_threshold else towards * move

    if (
        getattr(experiment.metric, "needs_base", False) is True
    ):  # its gradient at the clean run (its base) is 0: every edge predicted removed
        prediction = torch.zeros(len(g.sources), len(g.receivers))
    else:
        prediction = scores_from_gradients(experiment, receiver_gradients(experiment, [0.0]), experiment.where)
    trials = [
        Edge(g.sources[s].name, receiver.name)
        for r, receiver in reversed(list(enumerate(g.receivers)))
        for s in reversed(range(receiver.n_upstream))
    ]
    index = {e: (g.source_index(e.source), g.receiver_index(e.receiver)) for e in trials}
    removed = torch.zeros(len(g.sources), len(g.receivers), dtype=torch.bool)
    current = float(experiment.clean_values.mean())
    moves: dict[str, float] = {}
    kept: list[Edge] = []
    forwards, position = 0, 0
    while position < len(trials):
        batch = trials[position : position + batch_edges]
        masks, state = [], removed.clone()
        for edge in batch:
            trial = state.clone()
            trial[index[edge]] = True
            masks.append(trial)
            if effect(float(prediction[index[edge]])) < threshold:  # predicted: removed
                state = trial
        values = experiment.values(torch.stack(masks), names=[f"the ACDC trial removing {e}" for e in batch])
        values = values.mean(1).tolist()
        forwards += 1
        for edge, value in zip(batch, values, strict=True):
            position += 1
            move = effect(value - current)
            moves[str(edge)] = move
            predicted_removed = effect(float(prediction[index[edge]])) < threshold
            if move < threshold:
                removed[index[edge]] = True
                current = value
            else:
                kept.append(edge)
            if (move < threshold) != predicted_removed:
                break  # later trials assumed the other decision
    scores = {str(e): moves.get(str(e), 0.0) for e in g.edges}
    stats = {"forwards": forwards, "trials": len(trials), "batch_edges": batch_edges}
    if not abs_value_threshold:
        stats["harm"] = "increase" if towards > 0 else "decrease"
    return kept, scores, stats


def _towards_empty(experiment: Experiment) -> float:
    """+1 when the metric rises from the clean run to the corrupt one (every edge patched), as a KL divergence
    does; -1 when it falls, as a logit difference does: the direction in which a removed edge does harm."""
    full, empty = float(experiment.clean_values.mean()), float(_empty(experiment).mean())
    if full == empty:
        raise ValueError(
            f"abs_value_threshold=False keeps an edge when removing it moves the metric towards its value with every"
            f" edge patched, but the metric is {full} both with none and with every edge patched; there is no"
            " direction to measure (use abs_value_threshold=True)"
        )
    return 1.0 if empty > full else -1.0


def check_threshold(threshold) -> None:
    """ACDC removes an edge when the metric moves by strictly less than `threshold`: a finite number > 0, since at 0
    or below no edge is ever removed, and a NaN compares as false, keeping every edge too."""
    if isinstance(threshold, bool) or not isinstance(threshold, Real) or not math.isfinite(threshold) or threshold <= 0:
        raise ValueError(
            f"threshold must be a finite number > 0, not {threshold!r}: ACDC removes an edge when removing it moves the"
            " metric by less than the threshold, so at 0 or below (or NaN) it removes none and keeps the whole graph;"
            " pick it on the metric's scale, e.g. a small fraction of metric(clean) - metric(corrupt)"
        )


def prune(g: Graph, edges: Sequence, ablation: Ablation = "corrupt") -> list[Edge]:
    """The edges that matter: each on a path to `logits` and, when patched edges carry the corrupt run's
    writes, on a path from `input` too (a path through a head enters by any of its inputs).

    Both cuts change nothing. A node with no path to `logits` reaches it only along patched edges. With
    `ablation="corrupt"` a node with no path from `input` reads only corrupt values, so it writes exactly
    its corrupt output, which is what patching its edges writes anyway; with "mean" or "zero" it does not,
    and the forward cut is skipped.
    """
    edges = list(dict.fromkeys(g.edge(e) for e in edges))
    incoming: dict[str, list[Edge]] = {}
    outgoing: dict[str, list[Edge]] = {}
    for edge in edges:
        for node in _nodes_fed(g, edge):
            incoming.setdefault(node, []).append(edge)
        outgoing.setdefault(edge.source, []).append(edge)
    order = [source.name for source in g.sources] + [LOGITS]
    reached = set(order)
    if ablation == "corrupt":
        reached = {INPUT}
        for node in order[1:]:  # topological: every edge into a node comes from an earlier one
            if any(edge.source in reached for edge in incoming.get(node, [])):
                reached.add(node)
    useful = {LOGITS}
    for node in reversed(order[:-1]):
        if any(useful.intersection(_nodes_fed(g, edge)) for edge in outgoing.get(node, [])):
            useful.add(node)
    return [e for e in edges if e.source in reached and useful.intersection(_nodes_fed(g, e))]


def _positions_from_json(record) -> Where | None:
    """`positions_record`'s plain data back: a list for every prompt, or {"per_prompt": [...]}."""
    if record is None:
        return None
    return per_prompt(record["per_prompt"]) if isinstance(record, dict) else tuple(record)


def _nodes_fed(g: Graph, edge: Edge) -> list[str]:
    return g.heads_reading(edge.receiver) or [edge.receiver]


def _ranking(g: Graph, scores: dict[str, float], signed: bool = False) -> list[Edge]:
    """Every edge, the largest |score| first (signed: the largest score first); ties in graph order."""
    values = torch.tensor([scores.get(str(e), 0.0) for e in g.edges], dtype=torch.float64)
    values = values if signed else values.abs()
    return [g.edges[i] for i in torch.sort(values, descending=True, stable=True).indices.tolist()]


def _faithfulness(experiment: Experiment, circuits: Tensor) -> list[float]:
    """Faithfulness of each circuit mask [V, n_sources, n_receivers]: its complement patched."""
    complement = ~circuits & experiment.graph.edge_mask()[None]
    full, empty = float(experiment.clean_values.mean()), float(_empty(experiment).mean())
    if full == empty:
        raise ValueError("the metric is the same on the clean and the corrupt run, so faithfulness is undefined")
    names = [f"the circuit of {int(c.sum())} edges (every other edge patched)" for c in circuits]
    values = experiment.values(complement, names=names).mean(1)
    return [(float(v) - empty) / (full - empty) for v in values]


def _empty(experiment: Experiment) -> Tensor:
    if experiment.ablation == "corrupt" and experiment.where is None:
        return experiment.corrupt_values
    return experiment.values(experiment.graph.edge_mask()[None], names=["every edge patched"])[0]


__all__ = ["Circuit", "EdgeScores", "acdc", "discover", "prune"]
