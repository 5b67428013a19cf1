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
constant is one more term, "query bias"), k_j likewise at the key position. The score the model computes is the form
(`hook_attn_scores`), or, under Gemma 2's attention softcap, `cap * tanh(form / cap)`: the form is what is
attributed, and the result says so (`attributed`). docs/graphs.md ("QK attribution") has the per-family table.

Cost: one forward up to the head's block (nothing backward), then per key position a [terms, d_head] product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from hooked.graphs.attribute import prompt_tokens
from hooked.graphs.graph import feature_part
from hooked.graphs.transcoders import Transcoders
from hooked.interventions.row_blocks import registered_hooks
from hooked.layers import AttentionMask
from hooked.rotary import rotate_half

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer
    from hooked.sae.clt import CrossLayerTranscoder
    from hooked.sae.dictionary import Dictionary

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


@dataclass
class QKAttribution:
    """One head's pre-softmax score at query position `query` and each attributed key position, split into
    (query term, key term) pairs (module docstring). `pairs(key)` is the full [query terms, key terms] matrix;
    `rows()` / `table()` list each key's `top` pairs by |contribution|; `to_dict()` everything in plain types.

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
    scores: Tensor  # [n_keys] float32: the model's pre-softmax score (hook_attn_scores: scaled, capped if capped)
    forms: Tensor  # [n_keys] float32: the sum of every pair, scaling * q . k (the score, or its pre-cap form)
    attributed: str  # what the pairs add up to: "score", or the pre-cap form under a softcap (module docstring)
    softcap: float | None
    scaling: float  # the score's scale (d_head ** -0.5, or the family's query_pre_attn_scalar ** -0.5)
    query_terms: list[QKTerm]
    query_vectors: Tensor  # [n_query_terms, d_head]: each term's part of the rotated query
    key_terms: list[list[QKTerm]]  # per key position
    key_vectors: list[Tensor]  # per key position [n_key_terms, d_head]: each term's part of the rotated key
    top: int = 20
    prompt: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def _index(self, key: int) -> int:
        if key not in self.keys:
            raise KeyError(
                f"key position {key} is not attributed here; attributed: {self.keys}"
                + (f" (masked from query {self.query}: {self.masked})" if key in self.masked else "")
            )
        return self.keys.index(key)

    def score(self, key: int) -> float:
        """The model's score at `key` (what `hook_attn_scores` holds)."""
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

    def table(self):
        """A pandas DataFrame indexed by (key, rank); a list of dict rows without pandas."""
        try:
            import pandas as pd
        except ImportError:
            return self.rows()
        return pd.DataFrame(self.rows()).set_index(["key", "rank"])

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
    transcoders: Sequence[Dictionary] | CrossLayerTranscoder,
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
    run = QKRun(model, prompt, transcoders, layers=[layer], attention_mask=attention_mask, caller="qk_attribution")
    return run.attribute(layer, head, query, key, top=top)


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
        pattern: bool = False,
    ):
        registered_hooks(model, f"hooked.graphs.{caller}", part_of_model=False)
        n_layers = model.cfg.n_layers
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
                raise ValueError(f"layer must be a block index in 0..{n_layers - 1}, not {layer!r}")
        self.model, self.tc = model, Transcoders(transcoders, model)
        self.tokens = prompt_tokens(model, prompt, attention_mask)
        self.n_pos = int(self.tokens.shape[0])
        self.layers = sorted(set(layers))
        self.part = feature_part(self.tc.templates[1])
        top_layer = self.layers[-1]
        names = {*model.embedding_hook_names, *(f"blocks.{m}.hook_attn_out" for m in range(top_layer))}
        names |= {*self.tc.hook_in[:top_layer], *self.tc.hook_out[:top_layer]}
        for layer in self.layers:
            names |= {f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_attn_scores"}
            names |= {f"blocks.{layer}.{norm}.hook_scale" for norm in ("ln1", "attn.q_norm", "attn.k_norm")}
            if pattern:
                names.add(f"blocks.{layer}.attn.hook_pattern")
        self.inputs: dict[int, tuple] = {}
        handles = [
            model.blocks[layer].attn.register_forward_pre_hook(self._keep_inputs(layer), with_kwargs=True)
            for layer in self.layers
        ]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                _, self.cache = model.run_with_cache(
                    self.tokens[None], names_filter=lambda name: name in names, stop_at_layer=top_layer + 1
                )
        finally:
            for handle in handles:
                handle.remove()
            model.train(was_training)

    def _keep_inputs(self, layer: int):
        def keep(module, args, kwargs):
            values = [*args, *kwargs.values()]
            mask = next(v for v in values if isinstance(v, AttentionMask))
            rotary = args[1:3] if hasattr(module, "hook_rot_q") else None  # (cos, sin): attn(x, cos, sin, mask, ...)
            self.inputs[layer] = (mask, rotary)

        return keep

    # ------------------------------------------------------------------------- the residual stream's pieces
    def token_label(self, position: int) -> str:
        """The graph's token node label (`Graph.node_label`)."""
        token = int(self.tokens[position])
        tokenizer = getattr(self.model, "tokenizer", None)
        text = token if tokenizer is None else repr(tokenizer.decode([token]))
        return f"token {text} @{position}"

    @torch.no_grad()
    def pieces(self, layer: int, position: int) -> tuple[list[QKTerm], Tensor]:
        """The terms whose sum is `resid_pre` of block `layer` at `position`, and their vectors [n, d_model]."""
        cache, terms, vectors = self.cache, [], []
        for name in self.model.embedding_hook_names:
            if name == "hook_embed":
                terms.append(QKTerm(self.token_label(position), "token", position))
            else:  # GPT-2's learned position embedding: no graph node, a constant of the position
                terms.append(
                    QKTerm(f"{name.removeprefix('hook_').replace('_', ' ')} @{position}", "embedding", position)
                )
            vectors.append(cache[name][0, position])
        for m in range(layer):
            terms.append(QKTerm(f"attn L{m} @{position}", "attention", position))
            vectors.append(cache[f"blocks.{m}.hook_attn_out"][0, position])
        for term, vector in self._transcoder_pieces(layer, position):
            terms.append(term)
            vectors.append(vector)
        return terms, torch.stack(vectors)

    def _transcoder_pieces(self, layer: int, position: int) -> list[tuple[QKTerm, Tensor]]:
        """The MLP outputs of blocks below `layer` at `position`, as the graph's nodes: each active feature's
        writes to those layers (a CLT feature's writes to every layer in [its own, layer)), and per layer the
        decoder bias, the skip path and the error."""
        tc, cache = self.tc, self.cache
        out: list[tuple[QKTerm, Tensor]] = []
        for m in range(layer):
            x = cache[tc.hook_in[m]][0, position]
            recon = tc.decoder_bias(m).clone()
            for source in range(m + 1) if tc.clt is not None else [m]:
                acts = self._activations(source, position)
                features = acts.nonzero().flatten()
                writes = acts[features, None] * tc.decoder_rows(source, features, m)  # [k, d_out]
                recon = recon + writes.sum(0)
            skip = tc.skip(m, x)
            if skip is not None:
                recon = recon + skip
                out.append((QKTerm(f"skip L{m} @{position}", "skip", position), skip))
            out.append((QKTerm(f"transcoder bias L{m} @{position}", "transcoder bias", position), tc.decoder_bias(m)))
            error = cache[tc.hook_out[m]][0, position] - recon
            out.append((QKTerm(f"error L{m} @{position}", "error", position), error))
        for source in range(layer):  # each feature once, with every write it makes below `layer`
            acts = self._activations(source, position)
            features = acts.nonzero().flatten()
            if not features.numel():
                continue
            targets = range(source, layer) if tc.clt is not None else [source]
            rows = sum(tc.decoder_rows(source, features, m) for m in targets)
            for f, vector in zip(features.tolist(), acts[features, None] * rows, strict=True):
                label = f"L{source} F{f} @{position}"
                address = f"L{source}.{self.part}.F{f}@{position}"
                out.append((QKTerm(label, "feature", position, address), vector))
        return out

    def _activations(self, layer: int, position: int) -> Tensor:
        """[d_sae]: layer `layer`'s feature activations at `position` on the prompt."""
        x = self.cache[self.tc.hook_in[layer]][0, position]
        return self.tc.activate(layer, self.tc.pre_activations(layer, x[None]))[0]

    # ------------------------------------------------------------------------- one head's affine maps
    def head(self, layer: int, head: int) -> HeadMaps:
        return HeadMaps(self, layer, head)

    @torch.no_grad()
    def attribute(self, layer: int, head: int, query: int, key: int | None, top: int = 20) -> QKAttribution:
        if layer not in self.layers:
            raise ValueError(f"this run kept layers {self.layers}, not {layer}")
        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise ValueError(f"top must be a positive integer (pairs listed per key), not {top!r}")
        maps = self.head(layer, head)
        query = self._position(query, "query")
        visible = maps.visible(query)
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
        query_terms, query_vectors = maps.side_terms("q", query)
        key_terms, key_vectors = [], []
        for k in keys:
            terms, vectors = maps.side_terms("k", k)
            key_terms.append(terms)
            key_vectors.append(vectors)
        scores = self.cache[f"blocks.{layer}.attn.hook_attn_scores"][0, head, query, keys]
        q_total, forms = query_vectors.double().sum(0), []
        for vectors in key_vectors:
            forms.append(maps.scaling * float(q_total @ vectors.double().sum(0)))
        forms = torch.tensor(forms, dtype=torch.float64)
        self._check_total(maps, scores, forms, query_vectors, key_vectors, layer, head)
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
            key_vectors=[v.float().cpu() for v in key_vectors],
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

    def _check_total(self, maps, scores, forms, query_vectors, key_vectors, layer, head) -> None:
        """The terms must add up to the model's own score: a family whose attention is not the affine map above
        would fail here, instead of returning pairs that explain another number."""
        capped = forms if maps.softcap is None else maps.softcap * torch.tanh(forms / maps.softcap)
        # float32's at least: RMSNorms compute in float32 whatever the model's dtype (hooked.layers.RMSNorm)
        eps = max(torch.finfo(self.model.dtype).eps, torch.finfo(torch.float32).eps)
        bound = query_vectors.double().norm(dim=-1).sum() * torch.stack(
            [v.double().norm(dim=-1).sum() for v in key_vectors]
        )
        tolerance = 64 * eps * (maps.scaling * bound + scores.double().abs().cpu())
        if ((capped - scores.double().cpu()).abs() > tolerance.cpu()).any():
            worst = int((capped - scores.double().cpu()).abs().argmax())
            raise RuntimeError(
                f"the QK terms of L{layer}.H{head} add up to {float(capped[worst]):.6g}, not the model's score"
                f" {float(scores[worst]):.6g}: this model's attention is not the frozen-norm affine map qk_attribution"
                " models (docs/graphs.md, QK attribution)"
            )


class HeadMaps:
    """The affine maps from a block's residual stream to one head's rotated query and key at each position, its
    norm scales frozen at their values in the run (module docstring's formula)."""

    def __init__(self, run: QKRun, layer: int, head: int):
        model = run.model
        block = model.blocks[layer]
        attn = block.attn
        n_heads = attn.n_heads
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < n_heads:
            raise ValueError(f"head must be a query head index in 0..{n_heads - 1}, not {head!r}")
        self.run, self.layer, self.head, self.attn = run, layer, head, attn
        self.kv_head = head // (n_heads // getattr(attn, "n_kv_heads", n_heads))
        # The norm the attention reads the residual stream through: ln1, unless the block declares ln1 a norm of the
        # attention's output (OLMo 2 reads the residual stream unnormalised).
        output_norms = getattr(type(block), "output_norms", ())
        self.norm = None if "ln1" in output_norms else block.ln1
        self.mask, self.rotary = run.inputs[layer]
        self.scaling = float(attn.scaling)
        self.softcap = getattr(attn, "softcap", None)
        self.weights = {"q": attn.W_Q[head], "k": attn.W_K[head]}  # [d_model d_head]; W_K by query head (grouped)
        self.biases = {"q": attn.b_Q[head], "k": attn.b_K[head]}
        self.qk_norms = {"q": getattr(attn, "q_norm", None), "k": getattr(attn, "k_norm", None)}
        self.head_of = {"q": head, "k": self.kv_head}

    def visible(self, query: int) -> Tensor:
        """[n_pos] bool: the key positions the head sees from `query`."""
        return self.mask.causal(torch.device("cpu"))[0, 0, query]

    def side_terms(self, side: str, position: int) -> tuple[list[QKTerm], Tensor]:
        """The terms of the rotated query (`side` "q") or key ("k") at `position`: the residual pieces' images under
        the linear part, then the affine constant, as [n_terms, d_head] in float64 (the sums are compared to the
        model's score)."""
        terms, pieces = self.run.pieces(self.layer, position)
        linear = self.linear(side, position, pieces.double())
        constant = self.constant(side, position)
        name = "query bias" if side == "q" else "key bias"
        return [*terms, QKTerm(name, "bias", None)], torch.cat([linear, constant[None]])

    def linear(self, side: str, position: int, x: Tensor) -> Tensor:
        """[n, d_head]: the linear part of the map at `position` applied to x [n, d_model]."""
        cache, layer = self.run.cache, self.layer
        if self.norm is not None:
            scale = cache[f"blocks.{layer}.ln1.hook_scale"][0, position].double()
            x = self.norm.normalize_with_scale(x, scale) * self.norm.gain.double()
        x = x @ self.weights[side].double()
        return self._after_projection(side, position, x)

    def constant(self, side: str, position: int) -> Tensor:
        """[d_head]: the map's value at a zero residual stream (the input norm's bias, then the projection's)."""
        bias = self.biases[side].double()
        norm_bias = getattr(self.norm, "bias", None)
        if norm_bias is not None:
            bias = bias + norm_bias.double() @ self.weights[side].double()
        return self._after_projection(side, position, bias[None])[0]

    def _after_projection(self, side: str, position: int, x: Tensor) -> Tensor:
        """The per-head q/k norm (frozen scale) and the rotary turn of `position`, on x [n, d_head]."""
        norm = self.qk_norms[side]
        if norm is not None:
            scale = self.run.cache[f"blocks.{self.layer}.attn.{side}_norm.hook_scale"][0, position].double()
            if scale.numel() > 1:  # one scale per head; OLMo 2's norm has one for all heads at a position
                scale = scale[self.head_of[side]]
            gain = norm.gain.double()
            gain = gain.view(-1, x.shape[-1])[self.head_of[side]] if gain.numel() > x.shape[-1] else gain
            x = norm.normalize_with_scale(x, scale) * gain
        if self.rotary is not None:
            cos, sin = (t[0, position].double() for t in self.rotary)  # [rotary_dim]: GPT-NeoX turns a leading part
            turned = x[..., : cos.shape[-1]]
            x = torch.cat([turned * cos + rotate_half(turned) * sin, x[..., cos.shape[-1] :]], dim=-1)
        return x
