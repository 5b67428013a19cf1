"""The residual graph of a model: which nodes write to the residual stream, which read it, and the edges.

    g = circuits.graph(model)
    g.sources            # ['input', 'L0H0', ..., 'L0.mlp', 'L1H0', ...]: everything that writes
    g.receivers          # ['L0H0.q', 'L0H0.k', 'L0H0.v', ..., 'L0.mlp', ..., 'logits']: everything that reads
    g.edges              # [Edge('input', 'L0H0.q'), ...]; str(edge) == 'input->L0H0.q'

A block reads the residual stream twice and writes it twice. Its attention heads read it through
their query, key and value inputs (`blocks.{l}.hook_q_input`, `hook_k_input`, `hook_v_input`, one copy
of the stream per head) and each head writes its own `z[h] @ W_O[h]` (`attn.hook_result`); the MLP
reads `blocks.{l}.hook_mlp_in` and writes `hook_mlp_out`. The embedding (`input`: token plus
position embeddings, `blocks.0.hook_resid_pre`) writes first and the unembedding (`logits`: the
final residual stream, `blocks.{L-1}.hook_resid_post`) reads last. What a reader sees is the sum of
everything written upstream of it, plus the attention output biases; so an edge `S->R` exists
whenever S writes before R reads: heads of layer l feed the MLP of layer l and everything in later
layers, never the other heads of layer l.

On grouped-query models the key and value inputs belong to key/value heads, shared by several query
heads: they are named `L{l}KV{g}.k` / `L{l}KV{g}.v`, so that `KV1` cannot be read as query head 1.
On a mixture-of-experts layer the MLP node is the whole sparse block (router and experts); with
`graph(model, experts=True)` each expert is a source instead, `L{l}.E{e}`, writing its routed output
(`mlp.hook_expert_result`: routing weight times the expert's output, zero where the router did not pick it),
and the layer's input stays one receiver, `L{l}.mlp`, read by the router and every expert. A patched edge
`L{l}.E{e} -> R` carries the expert's write on the corrupt prompt, with the corrupt run's routing; every
router downstream is recomputed from what its layer reads in the patched forward (none is frozen).

A block that normalises its sublayer outputs before the residual add (OLMo 2, Gemma 2 and Gemma 3 declare
`output_norms`) adds `norm(sum over heads of z[h] @ W_O[h])`: no head's own term is in the residual stream,
so its attention writes as one node, `L{l}.attn` (`blocks.{l}.hook_attn_out`, the post-norm output),
fed by every q/k/v input of the layer. Its receivers stay per head: each head still reads its own copy
of the stream (`graph.whole_attention` lists such layers; `L{l}H{h}` is not a node there).

The order of `sources` and `receivers` is topological and fixed: edge masks and score matrices are
[n_sources, n_receivers] in that order, and an edge's index is its place in `edges`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.interventions.addresses import kv_head_name
from hooked.interventions.kinds import KINDS

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

INPUT, LOGITS = "input", "logits"
# A node is named as the component it is (hooked/interventions/kinds.py): a head `L2H2` and its query input
# `L2H2.q`, a layer's attention `L2.attn` and MLP `L3.mlp`; a key/value input as its key/value head (`L2KV1.k`).
_HEAD, _ATTENTION, _MLP = KINDS["heads"], KINDS["attn"], KINDS["mlps"]


@dataclass(frozen=True, order=True)
class Edge:
    """`source -> receiver`: the source's write, as one term of the receiver's input."""

    source: str
    receiver: str

    def __str__(self) -> str:
        return f"{self.source}->{self.receiver}"

    @property
    def receiver_node(self) -> str:
        """The node the receiving input belongs to (`L2H2.q` -> `L2H2`; `L2KV1.k` -> `L2KV1`)."""
        return self.receiver.rsplit(".", 1)[0] if self.receiver.endswith((".q", ".k", ".v")) else self.receiver


@dataclass(frozen=True)
class Receiver:
    """One input that reads the residual stream, and the hook point (and head slot) where it lives."""

    name: str  # 'L2H2.q', 'L2KV1.k', 'L3.mlp', 'logits'
    hook_name: str  # blocks.2.hook_q_input, blocks.3.hook_mlp_in, blocks.{L-1}.hook_resid_post
    head: int | None  # the slot on the point's head axis; None for a whole-stream point
    stage: int  # 2l for attention inputs, 2l+1 for the MLP, 2L for the logits
    n_upstream: int  # how many sources (the first ones of `Graph.sources`) write before it reads
    fires: int | None = None  # the stage whose computation fires its hook point, where not `stage` (the logits':
    # blocks.{L-1}.hook_resid_post fires in the last block's MLP half, or in its one stage if it is parallel)

    @property
    def start(self) -> int:
        """The latest stage a forward may start at for this receiver's hook point to fire."""
        return self.stage if self.fires is None else self.fires


@dataclass(frozen=True)
class Source:
    """One node that writes to the residual stream, and where its write is read off."""

    name: str  # 'input', 'L2H2', 'L3.mlp'
    hook_name: str  # blocks.0.hook_resid_pre, blocks.2.attn.hook_result, blocks.3.hook_mlp_out
    head: int | None
    stage: int  # -1 the embedding, 2l the heads of layer l, 2l+1 its MLP
    attention: bool = False  # a head, or a whole-attention node (L2.attn): what Wang et al.'s path patching freezes


@dataclass(frozen=True)
class Graph:
    """Sources, receivers and edges of one model's residual graph (see the module docstring)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    sources: tuple[Source, ...]
    receivers: tuple[Receiver, ...]
    edges: tuple[Edge, ...] = field(repr=False)
    _source_index: dict = field(repr=False, compare=False)
    _receiver_index: dict = field(repr=False, compare=False)
    _edge_index: dict = field(repr=False, compare=False)
    mlp_layers: tuple[int, ...] | None = None  # the layers with an MLP node; None: every layer (attn_only: ())
    parallel_layers: tuple[int, ...] = ()  # parallel-residual blocks: the MLP reads resid_pre, beside the heads
    whole_attention: tuple[int, ...] = ()  # layers whose attention writes as one node L{l}.attn (a post-norm)
    expert_layers: tuple[tuple[int, int], ...] = ()  # (layer, n_experts): sparse MLPs that write as experts L{l}.E{e}

    def has_mlp(self, layer: int) -> bool:
        return self.mlp_layers is None or layer in self.mlp_layers

    @property
    def nodes(self) -> list[str]:
        """Every node: the sources, then `logits` (a head's q/k/v inputs are inputs of its node, not nodes)."""
        return [source.name for source in self.sources] + [LOGITS]

    @property
    def grouped(self) -> bool:
        return self.n_kv_heads != self.n_heads

    def source_index(self, name: str) -> int:
        return _index_of(self._source_index, name, "source node", self.whole_attention_error)

    def whole_attention_error(self, name: object) -> str | None:
        """Why a head node `L{l}H{h}` is not a node where layer l's attention writes as one (`L{l}.attn`)."""
        match = re.fullmatch(r"L(\d+)H(\d+)", str(name))
        if match is None or int(match[1]) not in self.whole_attention or int(match[2]) >= self.n_heads:
            return None
        layer = int(match[1])
        return (
            f"{name!r} is not a node: block {layer} normalises its attention output before adding it to the residual"
            f" stream, so no head's write is a term of it and the layer's attention writes as one node, "
            f"'L{layer}.attn';"
            f" its heads' inputs are still receivers ('L{layer}H{match[2]}.q', ...)"
        )

    def receiver_index(self, name: str) -> int:
        return _index_of(self._receiver_index, name, "receiver", self.head_kind_error)

    def head_kind_error(self, name: object) -> str | None:
        """Why a head input's name is of the wrong kind (`L0H1.k` on a grouped model, `L0KV0.k` on an
        ungrouped one, `L0KV1.q`), naming the right one; None when that is not the problem."""
        match = re.fullmatch(r"L(\d+)(H|KV)(\d+)\.([qkv])", str(name))
        if match is None or int(match[1]) >= self.n_layers:
            return None
        layer, kind, index, part = int(match[1]), match[2], int(match[3]), match[4]
        group = self.n_heads // self.n_kv_heads
        if kind == "KV" and not self.grouped and index < self.n_heads:
            return (
                f"{name!r} is not a receiver: key/value heads are not grouped here (each head has its own), so its"
                f" input is 'L{layer}H{index}.{part}'"
            )
        if kind == "KV" and part == "q" and index < self.n_kv_heads:
            queries = ", ".join(repr(f"L{layer}H{h}.q") for h in range(index * group, (index + 1) * group))
            return (
                f"{name!r} is not a receiver: a query input belongs to a query head; the heads of key/value head"
                f" {index} read theirs at {queries}"
            )
        if kind == "H" and part != "q" and self.grouped and index < self.n_heads:
            kv = index // group
            sharing = ", ".join(f"L{layer}H{h}" for h in range(kv * group, (kv + 1) * group))
            what = "key" if part == "k" else "value"
            return (
                f"{name!r} is not a receiver: query heads {sharing} share key/value head {kv}, whose {what} input"
                f" is 'L{layer}KV{kv}.{part}'"
            )
        return None

    def edge(self, edge: str | Edge | tuple[str, str]) -> Edge:
        """An edge from `'S->R'`, `(S, R)` or an `Edge`, checked to exist."""
        if isinstance(edge, str):
            if edge.count("->") != 1:
                raise ValueError(f"an edge is written 'SOURCE->RECEIVER' (e.g. 'L1H0->L2H2.v'), not {edge!r}")
            edge = Edge(*(part.strip() for part in edge.split("->")))
        elif isinstance(edge, tuple) and len(edge) == 2:
            edge = Edge(*edge)
        elif not isinstance(edge, Edge):
            raise TypeError(f"an edge is a str 'S->R', a (source, receiver) pair or an Edge, not {type(edge).__name__}")
        if edge not in self._edge_index:
            source, receiver = self.source_index(edge.source), self.receiver_index(edge.receiver)
            raise ValueError(
                f"there is no edge {edge}: {edge.source} writes at stage {self.sources[source].stage}, after or as"
                f" {edge.receiver} reads (stage {self.receivers[receiver].stage}); an edge runs from an earlier"
                " writer to a later reader (heads of one layer do not feed each other)"
            )
        return edge

    def edge_index(self, edge: str | Edge | tuple[str, str]) -> int:
        return self._edge_index[self.edge(edge)]

    def mask(self, edges) -> Tensor:
        """A [n_sources, n_receivers] boolean mask of `edges` (strings, pairs or Edges)."""
        mask = torch.zeros(len(self.sources), len(self.receivers), dtype=torch.bool)
        for edge in edges:
            edge = self.edge(edge)
            mask[self._source_index[edge.source], self._receiver_index[edge.receiver]] = True
        return mask

    def masks(self, edges) -> tuple[Tensor, dict[int, Tensor]]:
        """Like `mask`, for edges that may carry a position, `'S->R@-1'` or `(S, R, -1)`: (the mask of the
        edges at every position, {position: the mask of the edges patched at that position only})."""
        everywhere, at = [], {}
        for edge in edges:
            position = None
            if isinstance(edge, str) and "@" in edge:
                edge, _, text = edge.rpartition("@")
                try:
                    position = int(text)
                except ValueError:
                    raise ValueError(
                        f"{edge}@{text}: the position after '@' is an int (a position in the prompt,"
                        " negative from its end, as in positions=)"
                    ) from None
            elif isinstance(edge, tuple) and len(edge) == 3:
                edge, position = edge[:2], edge[2]
                if not isinstance(position, int) or isinstance(position, bool):
                    raise TypeError(f"an edge's position is an int, not {position!r}")
            (everywhere if position is None else at.setdefault(position, [])).append(edge)
        return self.mask(everywhere), {position: self.mask(edges) for position, edges in at.items()}

    def edge_mask(self) -> Tensor:
        """[n_sources, n_receivers]: True where an edge exists."""
        stages = torch.tensor([s.stage for s in self.sources])
        return stages[:, None] < torch.tensor([r.stage for r in self.receivers])[None, :]

    def coordinates(self) -> tuple[Tensor, Tensor]:
        """(source index, receiver index) of every edge, in `edges` order: `matrix[coordinates()]` lists a
        [n_sources, n_receivers] matrix's value for each edge."""
        sources = torch.tensor([self._source_index[e.source] for e in self.edges], dtype=torch.long)
        receivers = torch.tensor([self._receiver_index[e.receiver] for e in self.edges], dtype=torch.long)
        return sources, receivers

    def edges_of(self, mask: Tensor) -> list[Edge]:
        """The edges a [n_sources, n_receivers] mask marks, in `edges` order."""
        sources, receivers = torch.nonzero(mask & self.edge_mask(), as_tuple=True)
        found = [
            Edge(self.sources[s].name, self.receivers[r].name)
            for s, r in zip(sources.tolist(), receivers.tolist(), strict=True)
        ]
        return sorted(found, key=self._edge_index.__getitem__)

    def receivers_of(self, node: str) -> list[str]:
        """The inputs of a node: a head's q, k and v inputs (its key/value head's, on grouped models), every
        q/k/v input of the layer for a whole-attention node `L{l}.attn`, or the node itself for an MLP and `logits`."""
        whole = re.fullmatch(r"L(\d+)\.attn", node)
        if whole is not None:
            self.source_index(node)
            return [r.name for r in self.receivers if r.stage == 2 * int(whole[1]) and r.head is not None]
        expert = re.fullmatch(r"L(\d+)\.E\d+", node)
        if expert is not None:  # every expert reads the MLP's input
            self.source_index(node)
            return [_MLP.address(int(expert[1]))]
        match = re.fullmatch(r"L(\d+)H(\d+)", node)
        if match is None:
            self.receiver_index(node)
            return [node]
        layer, head = int(match[1]), int(match[2])
        self.source_index(node)
        kv = kv_head_name(layer, head // (self.n_heads // self.n_kv_heads), self.n_heads, self.n_kv_heads)
        return [f"{node}.q", f"{kv}.k", f"{kv}.v"]

    def heads_reading(self, receiver: str) -> list[str]:
        """The attention nodes a receiver feeds: one head for a query input, the group for a key/value input;
        the layer's `L{l}.attn` on a whole-attention layer; and the experts of a sparse MLP node's input where
        they are nodes (`graph(model, experts=True)`)."""
        match = re.fullmatch(r"L(\d+)(H|KV)(\d+)\.[qkv]", receiver)
        mlp = re.fullmatch(r"L(\d+)\.mlp", receiver)
        if mlp is not None and int(mlp[1]) in dict(self.expert_layers):  # its experts read it
            return [f"L{mlp[1]}.E{e}" for e in range(dict(self.expert_layers)[int(mlp[1])])]
        if match is None:
            return []
        layer, kind, index = int(match[1]), match[2], int(match[3])
        if layer in self.whole_attention:
            return [f"L{layer}.attn"]
        if kind == "H":
            return [f"L{layer}H{index}"]
        group = self.n_heads // self.n_kv_heads
        return [f"L{layer}H{h}" for h in range(index * group, (index + 1) * group)]

    def __len__(self) -> int:
        return len(self.edges)

    def __repr__(self) -> str:
        whole = len(self.whole_attention)
        return (
            f"Graph({self.n_layers} layers x {self.n_heads} heads"
            + (f" ({self.n_kv_heads} key/value head{'s' if self.n_kv_heads > 1 else ''})" if self.grouped else "")
            + (
                ""
                if not whole
                else ", attention as one node"
                + ("" if whole == self.n_layers else f" in layers {list(self.whole_attention)}")
            )
            + f": {len(self.sources)} sources, {len(self.receivers)} receivers, {len(self.edges)} edges)"
        )


def graph(model: HookedTransformer, experts: bool = False) -> Graph:
    """The residual graph of `model`: `len(circuits.graph(model).edges)` is 32,491 for GPT-2 small's shapes.

    `experts=True`: each expert of a sparse mixture-of-experts MLP is a source, `L{l}.E{e}`, its routed write
    (`mlp.hook_expert_result`: weight * output, zero where its router did not pick it), in place of `L{l}.mlp`;
    the layer's input stays one receiver, `L{l}.mlp`, read by the router and every expert."""
    mlp_layers = tuple(layer for layer, block in enumerate(model.blocks) if block.mlp is not None)  # attn_only: none
    # A block that declares no MLP stage computes attention and MLP from the same resid_pre (GPT-NeoX's parallel
    # residual).
    parallel = tuple(layer for layer in mlp_layers if not type(model.blocks[layer]).mlp_stage)
    for name in ("hook_q_input", "hook_k_input", "hook_v_input"):
        model._check_name(f"blocks.0.{name}")  # an architecture without the split input points has no circuits
    for layer in mlp_layers[:1]:
        model._check_name(f"blocks.{layer}.hook_mlp_in")
    # An edge's effect is a source's write added to a receiver's input: where a norm sits between the heads' sum and
    # the residual add (the block declares `output_norms`), the layer's attention is one source.
    whole = tuple(layer for layer, block in enumerate(model.blocks) if getattr(type(block), "output_norms", ()))
    for layer in whole[:1]:
        model._check_name(f"blocks.{layer}.hook_attn_out")
    expert_layers = {}
    if experts:
        for layer in mlp_layers:
            mlp = model.blocks[layer].mlp
            if model.cfg.is_sparse(layer):  # the config's declaration: this layer's MLP routes to experts
                if getattr(mlp, "parallel", None) is not None:
                    raise ValueError("expert nodes read each expert's write on one process; load without ep=")
                expert_layers[layer] = mlp.n_experts
        if not expert_layers:
            raise ValueError(
                f"experts=True makes each expert of a sparse mixture-of-experts MLP a node, but {type(model).__name__}"
                " has no such layer"
            )
    cfg = model.cfg
    return graph_of_shape(
        cfg.n_layers,
        cfg.n_heads,
        cfg.n_kv_heads,
        None if len(mlp_layers) == cfg.n_layers else mlp_layers,
        parallel,
        whole,
        expert_layers,
    )


def graph_of_shape(
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    mlp_layers: tuple[int, ...] | None = None,
    parallel_layers: tuple[int, ...] = (),
    whole_attention: tuple[int, ...] = (),
    expert_layers: dict[int, int] | None = None,
) -> Graph:
    """The residual graph of a model with these shapes (the hook names are every architecture's); `mlp_layers`
    lists the layers with an MLP (None: all; `()` for an attention-only model, `cfg.attn_only`).

    `parallel_layers` are parallel-residual blocks (GPT-NeoX / Pythia): their MLP reads the block's resid_pre
    as its heads do, so it receives no edge from them, and both run in the block's one stage.

    `whole_attention` are blocks that normalise their attention output before the residual add (OLMo 2, Gemma):
    their attention is one source, `L{l}.attn` (`hook_attn_out`), in place of a source per head.

    `expert_layers` maps a layer to its number of experts where each expert is a source, `L{l}.E{e}`
    (`mlp.hook_expert_result`), in place of `L{l}.mlp`."""
    expert_layers = dict(expert_layers or {})
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
    sources = [Source(INPUT, "blocks.0.hook_resid_pre", None, -1)]
    receivers = []
    for layer in range(n_layers):
        upstream = len(sources)
        block = f"blocks.{layer}."
        receivers += [
            Receiver(_HEAD.address(layer, ".q", head=h), block + "hook_q_input", h, 2 * layer, upstream)
            for h in range(n_heads)
        ]
        kv_names = [kv_head_name(layer, g, n_heads, n_kv_heads) for g in range(n_kv_heads)]  # L0KV1 where grouped
        receivers += [
            Receiver(f"{kv}.k", block + "hook_k_input", g, 2 * layer, upstream) for g, kv in enumerate(kv_names)
        ]
        receivers += [
            Receiver(f"{kv}.v", block + "hook_v_input", g, 2 * layer, upstream) for g, kv in enumerate(kv_names)
        ]
        if layer in whole_attention:
            sources.append(Source(_ATTENTION.address(layer), block + "hook_attn_out", None, 2 * layer, attention=True))
        else:
            sources += [
                Source(_HEAD.address(layer, head=h), block + "attn.hook_result", h, 2 * layer, attention=True)
                for h in range(n_heads)
            ]
        if mlp_layers is None or layer in mlp_layers:
            parallel = layer in parallel_layers
            stage, mlp_upstream = (2 * layer, upstream) if parallel else (2 * layer + 1, len(sources))
            mlp = _MLP.address(layer)
            receivers.append(Receiver(mlp, block + "hook_mlp_in", None, stage, mlp_upstream))
            if layer in expert_layers:
                point = block + "mlp.hook_expert_result"
                sources += [Source(f"L{layer}.E{e}", point, e, stage) for e in range(expert_layers[layer])]
            else:
                sources.append(Source(mlp, block + "hook_mlp_out", None, stage))
    last = n_layers - 1
    receivers.append(
        Receiver(
            LOGITS,
            f"blocks.{last}.hook_resid_post",
            None,
            2 * n_layers,
            len(sources),
            fires=2 * last + (0 if last in parallel_layers else 1),
        )
    )
    edges = tuple(
        Edge(source.name, receiver.name) for receiver in receivers for source in sources[: receiver.n_upstream]
    )
    return Graph(
        n_layers,
        n_heads,
        n_kv_heads,
        tuple(sources),
        tuple(receivers),
        edges,
        {s.name: i for i, s in enumerate(sources)},
        {r.name: i for i, r in enumerate(receivers)},
        {e: i for i, e in enumerate(edges)},
        None if mlp_layers is None else tuple(mlp_layers),
        tuple(parallel_layers),
        tuple(sorted(whole_attention)),
        tuple(sorted(expert_layers.items())),
    )


def _index_of(index: dict[str, int], name: str, what: str, why_not: Callable[[object], str | None]) -> int:
    """`index[name]`, or a KeyError that says why `name` is not a `what` (`why_not`'s answer, else the nearest
    names)."""
    try:
        return index[name]
    except KeyError:
        raise KeyError(why_not(name) or _unknown(name, what, list(index))) from None


def _unknown(name: str, what: str, known: list[str]) -> str:
    import difflib

    nearest = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(map(repr, nearest))}?" if nearest else f"; names look like {known[:3]}"
    return f"{name!r} is not a {what} of this graph{hint}"
