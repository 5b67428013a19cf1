"""QK attribution: why a head attends where it does, as pairs of nodes (Kamath, Ameisen et al. 2025, "Tracing
Attention Computation Through Feature Interactions", transformer-circuits.pub/2025/attention-qk; circuit-tracer
issue 53). An attribution graph freezes every attention pattern; this explains one pattern entry.

With every norm's scale frozen at its value on the prompt, the map from the residual stream a head reads
(`resid_pre` of its block) to its rotated query (or key) at position p is affine:

    q(p) = R_p  N_q,p( W_Q[h]^T  N_p(x) + b_Q[h] )           N_p: the attention's input norm, its scale s_p frozen
                                                           N_q,p: the per-head q norm (Qwen3, Gemma 3; OLMo 2's spans
                                                           every head), frozen; R_p: the rotary turn of position p

and the residual stream at a position is a sum of pieces: the token's embedding (and GPT-2's position embedding),
each earlier layer's attention output, and each earlier layer's MLP output split as the attribution graph splits
it: every active transcoder feature's decoder write (a cross-layer transcoder's feature: its writes to every layer
below the head's), the decoder bias, the skip path, and the error node (MLP output minus the reconstruction). So
the head's pre-softmax form

    form(q, k) = scaling * q(q) . k(k) = sum over (query term i, key term j) of scaling * q_i . k_j

splits exactly into pairs: q_i is the linear part of the map applied to piece i at the query position (the affine
constant is one more term, "query bias"), k_j likewise at the key position. The score the model computes
(`hook_attn_scores`) is the form, or, under Gemma 2's attention softcap, `cap * tanh(form / cap)`: the form is what
is attributed, and the result says so (`attributed`). The score is taken from the run's own rotated queries and keys
(so the attention keeps its fused kernel and memory stays linear in the prompt), and the terms must add up to it.
docs/graphs.md ("QK attribution") has the per-family table. What a family does to its queries and keys is read from
its declarations: the attention's `query_key_path()` (q/k norms, rotary tables and turn, where the final q and k are
hooked; hooked.layers.QueryKeyPath), the block's `output_norms` (OLMo 2: no norm before attention), the input norm's
own `normalize_with_scale` and `gain`.

Cost: one forward up to the head's block (nothing backward), the transcoders' encoders on the prompt, then per side
one [terms, d_head] product (a feature's image is its activation times its decoder rows' image, mapped once per
distinct feature).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from hooked.graphs.graph import feature_part
from hooked.graphs.prompts import prompt_tokens
from hooked.graphs.transcoders import fitted
from hooked.hooks import evaluating
from hooked.interventions.row_blocks import registered_hooks
from hooked.layers import AttentionMask
from hooked.tables import ResultTable

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer
    from hooked.sae.clt import CrossLayerTranscoder
    from hooked.sae.dictionary import Dictionary
    from hooked.sae.transcoders import TranscoderSet

TermKind = Literal["feature", "error", "token", "embedding", "attention", "skip", "transcoder bias", "bias"]


@dataclass(frozen=True)
class QKTerm:
    """One side's term of a score: a piece of the residual stream at `position` (None: the affine constant, "query
    bias" / "key bias"). `label` is a graph node's label where the piece is a node ("L1 F17 @3", "error L0 @3",
    "token 'Mary' @3"); `address` a feature's component address ("L1.mlp_out.F17@3", for `hooked.sweep` and
    `ablate` with the transcoders spliced), None for other kinds."""

    label: str
    kind: TermKind
    position: int | None
    address: str | None = None


class Span(Sequence[int]):
    """The feature ids `flat[start:stop]` of one position and layer, read into a list only when first asked (a long
    prompt has tens of thousands, and a table reads a few positions' worth)."""

    __slots__ = ("flat", "start", "stop", "_ids")

    def __init__(self, flat: Tensor, start: int, stop: int):
        self.flat, self.start, self.stop, self._ids = flat, start, stop, None

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i):
        if self._ids is None:
            self._ids = self.flat[self.start : self.stop].tolist()
        return self._ids[i]


class Terms(Sequence[QKTerm]):
    """One side's terms at one position: the few per-position terms, then the features of each lower layer, made
    into `QKTerm`s only when read (a long prompt has tens of thousands of them, and a table reads a few)."""

    def __init__(self, fixed: list[tuple], features: list[tuple[int, Sequence[int]]], position: int, part: str):
        self.fixed, self.features, self.position, self.part = fixed, features, position, part  # fixed: (label, kind)
        self.bounds = [len(fixed)]
        for _, ids in features:
            self.bounds.append(self.bounds[-1] + len(ids))

    def __len__(self) -> int:
        return self.bounds[-1] + 1  # and the bias, last

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"term {i} of {n}")
        i %= n
        if i < len(self.fixed):
            label, kind = self.fixed[i]
            return QKTerm(label(self.position), kind, self.position)
        if i == n - 1:
            return self.bias
        block = next(b for b in range(len(self.features)) if i < self.bounds[b + 1])
        source, ids = self.features[block]
        f, p = ids[i - self.bounds[block]], self.position
        return QKTerm(f"L{source} F{f} @{p}", "feature", p, f"L{source}.{self.part}.F{f}@{p}")

    bias: QKTerm = QKTerm("bias", "bias", None)


@dataclass
class QKAttribution(ResultTable):
    """One head's pre-softmax score at query position `query` and each attributed key position, split into
    (query term, key term) pairs (module docstring). `pairs(key)` is the full [query terms, key terms] matrix;
    `rows()` / `table()` / `to_csv()` list each key's `top` pairs by |contribution| (hooked/tables.py); `to_dict()`
    everything in plain types.

        a = graphs.qk_attribution(model, prompt, transcoders, layer=1, head=3, query=-1)
        a.table()                        # top pairs per key: query term, key term, contribution
        a.key_totals(key=2)              # each key-side term's total over the query side
    """

    layer: int
    head: int
    kv_head: int  # the key/value head query head `head` reads (grouped-query attention: shared by a group)
    query: int
    keys: list[int]  # the key positions attributed, ascending
    masked: list[int]  # positions the head cannot see from `query` (after it, or outside its sliding window)
    scores: Tensor  # [n_keys] float32: the model's pre-softmax score (scaled, capped under a softcap)
    forms: Tensor  # [n_keys] float32: the sum of every pair, scaling * q . k (the score, or its pre-cap form)
    attributed: str  # what the pairs add up to: "score", or the pre-cap form under a softcap (module docstring)
    softcap: float | None
    scaling: float  # the score's scale (d_head ** -0.5, or the family's query_pre_attn_scalar ** -0.5)
    query_terms: Sequence[QKTerm]
    query_vectors: Tensor  # [n_query_terms, d_head]: each term's part of the rotated query
    key_terms: list[Sequence[QKTerm]]  # per key position
    key_vectors: list[Tensor]  # per key position [n_key_terms, d_head]: each term's part of the rotated key
    top: int = 20
    prompt: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    table_index = ("key", "rank")  # ResultTable: table()'s index

    def _index(self, key: int) -> int:
        if key not in self.keys:
            raise KeyError(
                f"key position {key} is not attributed here; attributed: {self.keys}"
                + (f" (masked from query {self.query}: {self.masked})" if key in self.masked else "")
            )
        return self.keys.index(key)

    def score(self, key: int) -> float:
        """The model's score at `key` (what `hook_attn_scores` holds there)."""
        return float(self.scores[self._index(key)])

    def pairs(self, key: int) -> Tensor:
        """[n_query_terms, n_key_terms] float32: every pair's contribution to the form at `key`; sums to
        `forms[keys.index(key)]`."""
        i = self._index(key)
        return self.scaling * self.query_vectors.double() @ self.key_vectors[i].double().T

    def query_totals(self, key: int) -> Tensor:
        """[n_query_terms]: each query-side term's total over every key-side term at `key` (a pair matrix's row
        sums): what removing that query term (norms frozen) takes off the form."""
        i = self._index(key)
        return self.scaling * self.query_vectors.double() @ self.key_vectors[i].double().sum(0)

    def key_totals(self, key: int) -> Tensor:
        """[n_key_terms]: each key-side term's total over every query-side term (a pair matrix's column sums): what
        removing that key term from the residual stream at `key` (norms frozen) takes off the form."""
        i = self._index(key)
        return self.scaling * self.key_vectors[i].double() @ self.query_vectors.double().sum(0)

    def top_pairs(self, key: int, k: int | None = None) -> list[tuple[QKTerm, QKTerm, float]]:
        """The `k` (default `top`) pairs of largest |contribution| at `key`: (query term, key term, contribution)."""
        matrix = self.pairs(key)
        k = min(self.top if k is None else k, matrix.numel())
        values, flat = matrix.flatten().abs().topk(k)
        n_key_terms = matrix.shape[1]
        terms = self.key_terms[self._index(key)]
        return [
            (self.query_terms[f // n_key_terms], terms[f % n_key_terms], float(matrix.flatten()[f]))
            for f in flat.tolist()
        ]

    def rows(self) -> list[dict]:
        """One dict per (key, pair) for each key's `top` pairs, largest |contribution| first within a key."""
        rows = []
        for key, score, form in zip(self.keys, self.scores.tolist(), self.forms.tolist(), strict=True):
            for rank, (q, k, value) in enumerate(self.top_pairs(key), start=1):
                rows.append(
                    {
                        "key": key,
                        "rank": rank,
                        "query_term": q.label,
                        "key_term": k.label,
                        "contribution": value,
                        "query_address": q.address,
                        "key_address": k.address,
                        "form": form,
                        "score": score,
                    }
                )
        return rows

    def to_dict(self) -> dict:
        """Plain types: the head, positions, scores, what is attributed, and per key its top pairs and each term's
        total on either side (`query_totals`, `key_totals`)."""
        per_key = []
        for key, score, form in zip(self.keys, self.scores.tolist(), self.forms.tolist(), strict=True):
            per_key.append(
                {
                    "key": key,
                    "score": score,
                    "form": form,
                    "top_pairs": [
                        {"query_term": q.label, "key_term": k.label, "contribution": v}
                        for q, k, v in self.top_pairs(key)
                    ],
                    "query_totals": dict(
                        zip([t.label for t in self.query_terms], self.query_totals(key).tolist(), strict=True)
                    ),
                    "key_totals": dict(
                        zip(
                            [t.label for t in self.key_terms[self.keys.index(key)]],
                            self.key_totals(key).tolist(),
                            strict=True,
                        )
                    ),
                }
            )
        return {
            "layer": self.layer,
            "head": self.head,
            "kv_head": self.kv_head,
            "query": self.query,
            "masked": list(self.masked),
            "attributed": self.attributed,
            "softcap": self.softcap,
            "scaling": self.scaling,
            "prompt": self.prompt,
            "keys": per_key,
        }

    def to_json(self, path: str | Path) -> Path:
        import json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def __repr__(self) -> str:
        best = ""
        if self.keys:
            key = self.keys[int(self.scores.argmax())]
            (q, k, v), *_ = self.top_pairs(key, 1)
            best = f"; at key {key} (highest score) the top pair is {q.label} x {k.label} = {v:+.3g}"
        return (
            f"QKAttribution(L{self.layer}.H{self.head}, query {self.query}, {len(self.keys)} keys, attributed:"
            f" {self.attributed}{best})"
        )


def qk_attribution(
    model: HookedTransformer,
    prompt: str | Tensor | Sequence[int],
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder,
    layer: int,
    head: int,
    query: int,
    key: int | None = None,
    *,
    top: int = 20,
    attention_mask: Tensor | None = None,
) -> QKAttribution:
    """Head `head` of block `layer`'s pre-softmax score from position `query` to `key` (every key it can see when
    None) split into (query term, key term) pairs of the attribution graph's nodes (module docstring). `prompt` and
    `transcoders` as `graphs.attribute` takes them (the same special token first, the same node labels); `query`
    and `key` index the prompt's tokens so (negative counts from the end). A key the head cannot see (after the
    query, or outside a sliding window) is refused by name.

        a = graphs.qk_attribution(model, "When Mary and John went", transcoders, layer=1, head=0, query=-1)
        a.table()
    """
    check_layer(model, layer)
    check_head(model, layer, head)
    check_top(top)
    run = QKRun(model, prompt, transcoders, [layer], attention_mask, "qk_attribution", [("query", query), ("key", key)])
    return run.attribute(layer, head, query, key, top=top)


def check_layer(model: HookedTransformer, layer: int) -> None:
    n_layers = model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be a block index in 0..{n_layers - 1}, not {layer!r}")


def check_head(model: HookedTransformer, layer: int, head: int) -> None:
    n_heads = model.blocks[layer].attn.n_heads
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < n_heads:
        raise ValueError(f"head must be a query head index in 0..{n_heads - 1}, not {head!r}")


def check_top(top: int) -> None:
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive integer (pairs listed per key), not {top!r}")


@dataclass
class FeatureBlock:
    """One lower layer's active features at the positions asked for, sorted by position: entry j is feature
    `basis` row `inverse[j]` (its writes below the head's layer, summed) times activation `values[j]`, at position
    slot `index[j]`. The map is applied to the few distinct rows, not to every entry."""

    index: Tensor  # [n] into the positions asked for
    values: Tensor  # [n]
    basis: Tensor  # [k, d_model]
    inverse: Tensor  # [n] into basis


@dataclass
class Active:
    """One layer's active features on the whole prompt: entry j is feature `features[j]` at `positions[j]` with
    activation `values[j]` (by position, then feature), the `inverse[j]`-th of the `distinct` features active
    anywhere; `columns` [n_pos, distinct] their activations. Decoder rows of the distinct features are read once per
    output layer (`decoder_rows`)."""

    positions: Tensor
    features: Tensor
    values: Tensor
    distinct: Tensor
    inverse: Tensor
    columns: Tensor
    rows: dict[int, Tensor]

    def decoder_rows(self, tc, layer: int, out_layer: int) -> Tensor:
        """[distinct, d_out]: what each distinct active feature writes to output `out_layer`."""
        if out_layer not in self.rows:
            self.rows[out_layer] = tc.decoder_rows(layer, self.distinct, out_layer)
        return self.rows[out_layer]


@dataclass
class Pieces:
    """The residual stream at P positions as a sum of terms: per position `terms` (the fixed ones, then each
    FeatureBlock's entries there, in block order), `fixed` [P, n_fixed, d_model] the per-position vectors,
    `features` the feature blocks, `positions` [P]."""

    terms: list[Terms]
    fixed: Tensor
    features: list[FeatureBlock]
    positions: Tensor

    def vector(self, i: int, label: str) -> Tensor | None:
        """[d_model]: the residual piece named `label` at the i-th position (None: no such term there)."""
        terms = self.terms[i]
        if label.startswith("L") and " F" in label:  # a feature: find it among its layer's block without naming all
            source, feature = (int(x) for x in label.split(" @")[0].removeprefix("L").split(" F"))
            for block, (layer, ids) in zip(self.features, terms.features, strict=True):
                if layer == source and feature in ids:
                    entries = (block.index == i).nonzero().flatten()
                    k = entries[ids.index(feature)]
                    return block.values[k] * block.basis[block.inverse[k]]
            return None
        for j, (name, _) in enumerate(terms.fixed):
            if name(terms.position) == label:
                return self.fixed[i, j]
        return None


# ----------------------------------------------------------------------------- one forward, every layer's pieces
class QKRun:
    """One clean forward of `prompt`, kept: the residual pieces at every position below each of `layers` and each
    of those layers' frozen norm scales, rotary tables and mask, from which `attribute` splits any head's score
    (`explain_heads` attributes several heads of one prompt from one run)."""

    def __init__(
        self,
        model: HookedTransformer,
        prompt,
        transcoders,
        layers: Sequence[int],
        attention_mask: Tensor | None = None,
        caller: str = "qk_attribution",
        positions: Sequence[tuple[str, int | None]] = (),
    ):
        registered_hooks(model, f"hooked.graphs.{caller}", part_of_model=False)
        if model.tensor_parallel:
            raise ValueError(
                f"hooked.graphs.{caller} reads whole heads' weights and norm scales, and under tensor parallelism"
                " each rank holds some heads: load the model without tp= for it"
            )
        for layer in layers:
            check_layer(model, layer)
        self.model, self.tc = model, fitted(transcoders, model)
        self.reads, self.writes = self.tc.hook_names(), self.tc.hook_names_out()
        self.tokens = prompt_tokens(model, prompt, attention_mask)
        self.n_pos = int(self.tokens.shape[0])
        for name, position in positions:  # positions the caller will ask for, checked before the forward
            if position is not None:
                self._position(position, name)
        self.layers = sorted(set(layers))
        self.part = feature_part(self.tc.feature_output_hook)
        top_layer = self.layers[-1]
        names = {*model.embedding_hook_names, *(f"blocks.{m}.hook_attn_out" for m in range(top_layer))}
        names |= {*self.reads[:top_layer], *self.writes[:top_layer]}
        for layer in self.layers:
            # the head's own rotated queries and keys ([pos, heads, d_head]: linear in the prompt), not its
            # [heads, pos, pos] scores, whose hook would also move the attention off its fused kernel
            path, norm = model.blocks[layer].attn.query_key_path(), input_norm(model.blocks[layer])
            top = {self.qk_point(layer, "q"), self.qk_point(layer, "k")}
            top |= {n.hook_scale.name for n in (norm, path.query_norm, path.key_norm) if n is not None}
            names |= top
        self.inputs: dict[int, tuple] = {}
        handles = [
            model.blocks[layer].attn.register_forward_pre_hook(self._keep_inputs(layer), with_kwargs=True)
            for layer in self.layers
        ]
        try:
            with torch.no_grad(), evaluating(model):
                _, self.cache = model.run_with_cache(  # up to the top layer's queries and keys: no further
                    self.tokens[None], names_filter=sorted(names), stop_after=sorted(top), stop_at_layer=top_layer + 1
                )
        finally:
            for handle in handles:
                handle.remove()

    def qk_point(self, layer: int, side: str) -> str:
        """Where block `layer`'s attention holds its final queries or keys (its `query_key_path()` declares it)."""
        path = self.model.blocks[layer].attn.query_key_path()
        return f"blocks.{layer}.attn.{path.q_point if side == 'q' else path.k_point}"

    def model_scores(self, maps: HeadMaps, query: int, keys: list[int]) -> Tensor:
        """[n_keys]: the head's pre-softmax scores from the run's own queries and keys, as the attention forms
        them: scaled, then capped under a softcap."""
        q = self.cache[self.qk_point(maps.layer, "q")][0, query, maps.head]
        contiguous = keys == list(range(keys[0], keys[0] + len(keys)))  # every visible key: a range, read as a view
        k = self.cache[self.qk_point(maps.layer, "k")][0, slice(keys[0], keys[0] + len(keys)) if contiguous else keys]
        k = k[:, maps.kv_head]
        scores = (k @ q) * maps.scaling
        return scores if maps.softcap is None else torch.tanh(scores / maps.softcap) * maps.softcap

    def _keep_inputs(self, layer: int):
        def keep(module, args, kwargs):
            values = [*args, *kwargs.values()]
            mask = next(v for v in values if isinstance(v, AttentionMask))
            where = module.query_key_path().rotary_arguments  # the (cos, sin) tables' places among the arguments
            self.inputs[layer] = (mask, None if where is None else tuple(args[i] for i in where))

        return keep

    # ------------------------------------------------------------------------- the residual stream's pieces
    def token_label(self, position: int) -> str:
        """The graph's token node label (`Graph.node_label`)."""
        token = int(self.tokens[position])
        tokenizer = getattr(self.model, "tokenizer", None)
        text = token if tokenizer is None else repr(tokenizer.decode([token]))
        return f"token {text} @{position}"

    @functools.cached_property
    def _mlp_parts(self) -> tuple[list[Active], list[Tensor], list[Tensor | None]]:
        """Per layer below the highest kept: its active features (`Active`), the error (MLP output minus the
        reconstruction) and the skip path, at every position [n_pos, d_out]. Computed once, every position at a
        time. The reconstruction decodes the features active anywhere in the prompt as one product,
        [n_pos, distinct] @ [distinct, d_out] (the encoder already costs [n_pos, d_in] @ [d_in, d_sae]); the error is
        what is left of the MLP's output, as the graph's error node (hooked/graphs/nodes.py)."""
        tc, cache, top_layer = self.tc, self.cache, self.layers[-1]
        active, errors, skips = [], [], []
        with torch.no_grad():
            for m in range(top_layer):
                acts = tc.activate(m, tc.pre_activations(m, cache[self.reads[m]][0]))
                entries = acts.to_sparse()  # coalesced: its entries by position, then feature
                (positions, features), values = entries.indices(), entries.values()
                distinct, inverse = features.unique(return_inverse=True)
                active.append(
                    Active(positions, features, values, distinct, inverse, acts.index_select(1, distinct), {})
                )
            for m in range(top_layer):
                error = cache[self.writes[m]][0] - tc.decoder_bias(m)
                for source in tc.source_layers(m):
                    rows = active[source].decoder_rows(tc, source, m)  # [distinct, d_out]
                    error.addmm_(active[source].columns, rows, alpha=-1)
                skip = tc.skip(m, cache[self.reads[m]][0]) if tc.has_skip else None
                if skip is not None:
                    error.sub_(skip)
                skips.append(skip)
                errors.append(error)
        return active, errors, skips

    @torch.no_grad()
    def pieces(self, layer: int, positions: Sequence[int]) -> Pieces:
        """The terms whose sum is `resid_pre` of block `layer` at each of `positions` (`Pieces`). A feature is one
        term with every write it makes below `layer` (a CLT feature's to each layer in [its own, layer)); per lower
        layer the attention output, the decoder bias, the skip path and the error are terms, as are the
        embeddings."""
        if list(positions) != sorted(set(positions)):
            raise ValueError(f"pieces takes distinct positions in ascending order, not {list(positions)}")
        cache, tc = self.cache, self.tc
        where = torch.tensor(list(positions), dtype=torch.long, device=self.tokens.device)
        every = len(positions) == self.n_pos  # every position (every key): nothing to select

        def at(vectors: Tensor) -> Tensor:  # [n_pos, d] -> [P, d]
            return vectors if every else vectors.index_select(0, where)

        names, vectors = [], []  # the per-position terms: a label maker and [P, d_model] each

        for name in self.model.embedding_hook_names:
            if name == "hook_embed":
                names.append((self.token_label, "token"))
            else:  # GPT-2's learned position embedding: no graph node, a constant of the position
                words = name.removeprefix("hook_").replace("_", " ")
                names.append((lambda p, words=words: f"{words} @{p}", "embedding"))
            vectors.append(at(cache[name][0]))
        active, errors, skips = self._mlp_parts if layer else ([], [], [])
        for m in range(layer):
            names.append((lambda p, m=m: f"attn L{m} @{p}", "attention"))
            vectors.append(at(cache[f"blocks.{m}.hook_attn_out"][0]))
            if skips[m] is not None:
                names.append((lambda p, m=m: f"skip L{m} @{p}", "skip"))
                vectors.append(at(skips[m]))
            names.append((lambda p, m=m: f"transcoder bias L{m} @{p}", "transcoder bias"))
            vectors.append(tc.decoder_bias(m).expand(len(positions), -1))
            names.append((lambda p, m=m: f"error L{m} @{p}", "error"))
            vectors.append(at(errors[m]))

        if not every:
            slot = torch.full((self.n_pos,), -1, dtype=torch.long, device=where.device)
            slot[where] = torch.arange(len(positions), device=where.device)
        features = []
        ids: list[list[tuple[int, Span]]] = [[] for _ in positions]
        for source in range(layer):
            entries = active[source]
            # positions ascending: the entries (by position, then feature) stay so, each position's contiguous
            index, feature_ids, values, inverse = entries.positions, entries.features, entries.values, entries.inverse
            if not every:
                index = slot[index]
                keep = index >= 0
                index, feature_ids, values, inverse = index[keep], feature_ids[keep], values[keep], inverse[keep]
            targets = [m for m in range(source, layer) if source in tc.source_layers(m)]
            rows = [entries.decoder_rows(tc, source, m) for m in targets]  # [distinct, d_model] each
            basis = rows[0] if len(rows) == 1 else torch.stack(rows).sum(0)
            features.append(FeatureBlock(index, values, basis, inverse))
            start = 0
            for i, count in enumerate(torch.bincount(index, minlength=len(positions)).tolist()):
                ids[i].append((source, Span(feature_ids, start, start + count)))
                start += count
        terms = [Terms(names, i, p, self.part) for i, p in zip(ids, positions, strict=True)]
        return Pieces(terms, torch.stack(vectors, dim=1), features, where)

    # ------------------------------------------------------------------------- one head's affine maps
    def head(self, layer: int, head: int) -> HeadMaps:
        return HeadMaps(self, layer, head)

    @torch.no_grad()
    def attribute(self, layer: int, head: int, query: int, key: int | None, top: int = 20) -> QKAttribution:
        if layer not in self.layers:
            raise ValueError(f"this run kept layers {self.layers}, not {layer}")
        check_top(top)
        maps = self.head(layer, head)
        query = self._position(query, "query")
        visible = maps.visible(query).tolist()
        masked = [p for p in range(self.n_pos) if not visible[p]]
        if key is None:
            keys = [p for p in range(self.n_pos) if visible[p]]
        else:
            key = self._position(key, "key")
            if not visible[key]:
                why = (
                    "after the query (the causal mask hides it)"
                    if key > query
                    else f"outside the head's sliding window of {maps.mask.window} positions"
                )
                seen = [p for p in range(self.n_pos) if visible[p]]
                raise ValueError(
                    f"key position {key} is masked from query position {query} in block {layer}: it is {why}, so the"
                    f" head gives it no score to explain; the keys it sees are {seen}"
                )
            keys = [key]
        positions = sorted({*keys, query})  # the residual pieces once for both sides
        pieces = self.pieces(layer, positions)
        i = positions.index(query)
        query_vectors, key_rows, counts = maps.images(pieces, i, None if positions == keys else positions.index(key))
        t = pieces.terms[i]
        query_terms = Terms(t.fixed, t.features, t.position, t.part)  # its own: the two sides name their biases
        query_terms.bias = QKTerm("query bias", "bias", None)
        key_terms = pieces.terms if positions == keys else [pieces.terms[positions.index(key)]]
        for terms in key_terms:
            terms.bias = QKTerm("key bias", "bias", None)
        scores = self.model_scores(maps, query, keys)
        # per key, the sum of its rows' products with the query's sum, and of their norms. Each product is a
        # d_head-long dot product in the rows' dtype (its rounding a few eps of |row| |query sum|, inside the check's
        # 64 eps of the bound); the sums over rows, where the terms cancel, in float64.
        segment = torch.repeat_interleave(torch.tensor(counts, device=key_rows.device))
        query_sum = query_vectors.double().sum(0)
        products = torch.mv(key_rows, query_sum.to(key_rows.dtype)).double()
        forms = (maps.scaling * products.new_zeros(len(keys)).index_add_(0, segment, products)).cpu()
        key_norms = products.new_zeros(len(keys)).index_add_(0, segment, key_rows.norm(dim=-1).double())
        bound = maps.scaling * query_vectors.double().norm(dim=-1).sum() * key_norms
        self._check_total(maps, scores, forms, bound.cpu(), layer, head)
        softcap = maps.softcap
        attributed = "score" if softcap is None else f"form: the score is {softcap:g} * tanh(form / {softcap:g})"
        return QKAttribution(
            layer=layer,
            head=head,
            kv_head=maps.kv_head,
            query=query,
            keys=keys,
            masked=masked,
            scores=scores.float().cpu(),
            forms=forms.float(),
            attributed=attributed,
            softcap=softcap,
            scaling=maps.scaling,
            query_terms=query_terms,
            query_vectors=query_vectors.float().cpu(),
            key_terms=key_terms,
            key_vectors=list(key_rows.float().cpu().split(counts)),
            top=top,
            metadata={"tokens": self.tokens.tolist()},
        )

    def _position(self, position, name: str) -> int:
        if isinstance(position, bool) or not isinstance(position, int) or not -self.n_pos <= position < self.n_pos:
            raise ValueError(
                f"{name} must be a position of the prompt's {self.n_pos} tokens (with the special token first):"
                f" 0..{self.n_pos - 1}, or negative from the end; not {position!r}"
            )
        return position % self.n_pos

    def _check_total(self, maps, scores, forms, bound, layer, head) -> None:
        """The terms must add up to the model's own score: a family whose attention is not the affine map above
        would fail here, instead of returning pairs that explain another number."""
        capped = forms if maps.softcap is None else maps.softcap * torch.tanh(forms / maps.softcap)
        # float32's at least: RMSNorms compute in float32 whatever the model's dtype (hooked.layers.RMSNorm)
        eps = max(torch.finfo(self.model.dtype).eps, torch.finfo(torch.float32).eps)
        scores = scores.double().cpu()
        tolerance = 64 * eps * (bound + scores.abs())  # bound: sum of |q_i| |k_j|, times the scale
        if ((capped - scores).abs() > tolerance).any():
            worst = int((capped - scores).abs().argmax())
            raise RuntimeError(
                f"the QK terms of L{layer}.H{head} add up to {float(capped[worst]):.6g}, not the model's score"
                f" {float(scores[worst]):.6g}: this model's attention is not the frozen-norm affine map qk_attribution"
                " models (docs/graphs.md, QK attribution)"
            )


def input_norm(block):
    """The norm a block's attention reads the residual stream through: `ln1`, unless the block declares `ln1` a norm
    of the attention's output (`output_norms`: OLMo 2's attention reads the stream unnormalised)."""
    return None if "ln1" in getattr(type(block), "output_norms", ()) else block.ln1


class HeadMaps:
    """The affine maps from a block's residual stream to one head's rotated query and key at each position, its
    norm scales frozen at their values in the run (module docstring's formula)."""

    def __init__(self, run: QKRun, layer: int, head: int):
        model = run.model
        block = model.blocks[layer]
        attn = block.attn
        n_heads = attn.n_heads
        check_head(run.model, layer, head)
        self.run, self.layer, self.head, self.attn = run, layer, head, attn
        self.kv_head = head // (n_heads // getattr(attn, "n_kv_heads", n_heads))
        # The norm the attention reads the residual stream through: ln1, unless the block declares ln1 a norm of the
        # attention's output (OLMo 2 reads the residual stream unnormalised).
        self.norm = input_norm(block)
        self.mask, self.tables = run.inputs[layer]
        self.path = attn.query_key_path()
        self.scaling = float(attn.scaling)
        self.softcap = getattr(attn, "softcap", None)
        self.weights = {"q": attn.W_Q[head], "k": attn.W_K[head]}  # [d_model d_head]; W_K by query head (grouped)
        self.biases = {"q": attn.b_Q[head], "k": attn.b_K[head]}
        self.qk_norms = {"q": self.path.query_norm, "k": self.path.key_norm}
        self.head_of = {"q": head, "k": self.kv_head}

    def visible(self, query: int) -> Tensor:
        """[n_pos] bool: the key positions the head sees from `query`."""
        return self.mask.causal(torch.device("cpu"))[0, 0, query]

    def images(self, pieces: Pieces, query: int, key: int | None) -> tuple[Tensor, Tensor, list[int]]:
        """Each term's part of the rotated query at the pieces' `query`-th position and of the rotated key at the
        `key`-th (None: at every one of them): the terms' images under the maps' linear part, then the affine
        constant (`QKRun.pieces` orders the terms). Returns the query's rows [n_query_terms, d_head], the keys' rows
        [rows, d_head] position by position, and each key position's row count (float32; float64 for a float64
        model).

        Both projections are applied together, once to each distinct vector (each fixed piece, each feature's
        decoder rows, the constant): every row is then one of them times a coefficient (a feature's activation,
        over its position's frozen input scale), through its position's q/k norm and turn. The order is settled on
        integers, so each [rows, d_head] tensor is gathered once."""
        where, n_positions = pieces.positions, len(pieces.terms)
        device, dtype = where.device, self.dtype
        d_head = self.weights["q"].shape[-1]
        weight = self.input_weight_for(torch.cat([self.weights["q"], self.weights["k"]], dim=1))  # [d_model 2*d_head]
        inverse_scale = 1 / self.input_scale(where)[:, 0]  # [P]
        n_fixed = pieces.fixed.shape[1]
        vectors = [pieces.fixed.flatten(0, 1)]  # [P * n_fixed, d_model], then each block's distinct rows
        source = [torch.arange(n_positions * n_fixed, device=device)]
        slots = [torch.arange(n_positions, device=device).repeat_interleave(n_fixed)]
        coefficients = [torch.ones(n_positions * n_fixed, dtype=dtype, device=device)]
        offset = n_positions * n_fixed
        for block in pieces.features:
            vectors.append(block.basis)
            source.append(block.inverse + offset)
            slots.append(block.index)
            coefficients.append(block.values)
            offset += block.basis.shape[0]
        # [offset + 1, 2 * d_head]: each vector's image, written in place (no [*, d_model] concatenation), then the
        # constant, unscaled, last at every position
        table = weight.new_empty(offset + 1, weight.shape[1])
        start = 0
        for part in vectors:
            torch.mm(part.to(dtype), weight, out=table[start : start + part.shape[0]])
            start += part.shape[0]
        table[offset] = torch.cat([self.constant("q"), self.constant("k")])
        source.append(torch.full((n_positions,), offset, device=device))
        slots.append(torch.arange(n_positions, device=device))
        slot = torch.cat(slots)
        # every term's coefficient: its activation (1 for a fixed piece) over its position's input scale; the
        # constants' (last) 1
        coefficient = torch.cat(coefficients).to(dtype).mul_(inverse_scale[slot[:-n_positions]])
        coefficient = torch.cat([coefficient, torch.ones(n_positions, dtype=dtype, device=device)])
        order = torch.argsort(slot, stable=True)  # each position's rows contiguous, in term order
        slot, source, coefficient = slot[order], torch.cat(source)[order], coefficient[order]
        counts = torch.bincount(slot, minlength=n_positions).tolist()
        starts = [0]
        for count in counts:
            starts.append(starts[-1] + count)

        def side(name: str, columns: slice, i: int | None) -> Tensor:
            rows = slice(None) if i is None else slice(starts[i], starts[i + 1])
            image = table[:, columns].index_select(0, source[rows]).mul_(coefficient[rows, None])
            return self._after_projection(name, where[slot[rows]], image)

        key_counts = counts if key is None else [counts[key]]
        return side("q", slice(0, d_head), query), side("k", slice(d_head, None), key), key_counts

    @functools.cached_property
    def dtype(self) -> torch.dtype:
        """float64 for a float64 model, else float32 (model.dtype walks the parameters: asked once)."""
        return torch.float64 if self.run.model.dtype == torch.float64 else torch.float32

    def input_weight_for(self, projection: Tensor) -> Tensor:
        """[d_model, d_out]: the input norm at scale 1 (its centring and gain, as a matrix: the norm's own
        `normalize_with_scale` applied to the identity) times `projection` [d_model, d_out]; a row's image is its
        product with this, divided by its position's frozen scale."""
        weight = projection.to(self.dtype)
        if self.norm is None:
            return weight
        identity = torch.eye(weight.shape[0], dtype=self.dtype, device=weight.device)
        one = torch.ones((), dtype=self.dtype, device=weight.device)
        return (self.norm.normalize_with_scale(identity, one) * self.norm.gain.to(self.dtype)) @ weight

    def input_scale(self, positions: Tensor) -> Tensor:
        """[n, 1]: the input norm's frozen scale at each of `positions` (ones without an input norm)."""
        if self.norm is None:
            return torch.ones(positions.shape[0], 1, dtype=self.dtype, device=positions.device)
        return self.run.cache[self.norm.hook_scale.name][0, positions].to(self.dtype)

    def constant(self, side: str) -> Tensor:
        """[d_head]: the projection's value at a zero residual stream (the input norm's bias, then the projection's),
        before the q/k norm and the turn."""
        bias = self.biases[side].to(self.dtype)
        norm_bias = getattr(self.norm, "bias", None)
        if norm_bias is not None:
            bias = bias + norm_bias.to(self.dtype) @ self.weights[side].to(self.dtype)
        return bias

    def _after_projection(self, side: str, positions: Tensor, x: Tensor) -> Tensor:
        """The q/k norm (its scale frozen; an RMSNorm in every family that has one) and the rotary turn of each row's
        position, on x [n, d_head] with `positions` [n]. x is the caller's own: the norm is applied in place."""
        norm = self.qk_norms[side]
        if norm is not None:
            scale = take_rows(self.run.cache[norm.hook_scale.name][0], positions).to(self.dtype)
            if scale.ndim == positions.ndim + 2:  # [..., heads, 1]: one scale per head (OLMo 2: one for all, [..., 1])
                scale = scale[..., self.head_of[side], :]
            gain = norm.gain.to(self.dtype)
            gain = gain.view(-1, x.shape[-1])[self.head_of[side]] if gain.numel() > x.shape[-1] else gain
            x = x.div_(scale).mul_(gain)
        if self.tables is not None:  # cos, sin [..., rotary_dim] of each row's position (GPT-NeoX: a leading part)
            cos, sin = take_rows(self.turns, positions).to(self.dtype).chunk(2, dim=-1)
            x = self.path.rotate(x, cos, sin)
        return x

    @functools.cached_property
    def turns(self) -> Tensor:
        """[n_pos, 2 * rotary_dim]: each position's cos and sin side by side, gathered per row in one pass."""
        cos, sin = self.tables
        return torch.cat([cos[0], sin[0]], dim=-1)


def take_rows(table: Tensor, positions: Tensor) -> Tensor:
    """table[positions] for a table [n_pos, ...] and positions of any shape, through `index_select` (on CPU several
    times faster than advanced indexing for the tens of thousands of rows a long prompt's terms have)."""
    return table.index_select(0, positions.flatten()).view(*positions.shape, *table.shape[1:])
