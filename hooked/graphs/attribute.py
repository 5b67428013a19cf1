"""Attribution graphs: the direct effect of every active transcoder feature, error node and input token on every
feature and top logit of one prompt, under the local replacement model (Ameisen et al. 2025, "Circuit Tracing:
Revealing Computational Graphs in Language Models"; circuit-tracer 0.5.0, `attribution/attribute.py` and
`attribution/context_transformerlens.py`, whose graph this equals entry by entry where both run).

The local replacement model. Each MLP is replaced by its transcoder, whose features are read from the MLP's input
and written to its output; what the transcoders miss at layer l and position p is the error node e[l, p] = MLP
output - reconstruction. The attention patterns and every norm's scale are frozen at their values on the prompt,
and so is each MLP's output, except the transcoder's skip path (`x W_skip`), which stays live. What is left is
linear in the residual stream, so the effect of a source node on a target node along paths through no other node
is one number, found by one backward pass:

    target row: a feature f of layer l at position p -> its pre-activation, W_enc[:, f] . x_l[p] (x_l: layer l's
                input), not scaled by its own activation; a logit t -> the final norm's output at the last position
                along W_U[t] - mean over the vocabulary of W_U (so a shift of every logit counts for nothing)
    source col: a feature -> its activation times what its decoder row writes (to every later layer, for a CLT);
                an error node -> e[l, p]; a token -> its embedding (the activation at hook_embed)

The gradient of a target injected at its point flows back through the frozen model; at each MLP output it is
contracted with every source written there, and at hook_embed with the token embeddings. Position 0's features
and errors are zeroed (circuit-tracer's convention: the first position, a BOS, has huge norms and no meaning):
its error nodes stay in the graph, without edges; its token node keeps its edges (circuit-tracer's token vectors
are every position's embedding).

Node order and the adjacency's layout: hooked/graphs/graph.py. `max_feature_nodes` keeps every active feature
listed (`active_features`) but gives rows and columns only to the `max_feature_nodes` of them with the most
influence on the logits, found as circuit-tracer does: the influence over the rows computed so far ranks the
features not yet visited, every `update_interval * batch_size` rows.

Memory. circuit-tracer holds an N x N float32 matrix (N grows with the prompt: n_layers + 1 nodes per position
besides the features). With `edges_per_row=k`, each row keeps only its k largest edges by magnitude and the
adjacency is a sparse tensor: memory grows with the edges kept, and pruning and scores work on it alike
(docs/graphs.md, "Memory").
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, SupportsIndex

import torch
from torch import Tensor
from tqdm.auto import tqdm

from hooked.graphs.graph import Graph, LogitTarget, default_scan
from hooked.graphs.transcoders import Transcoders
from hooked.hooks import evaluating, needs_gradients
from hooked.interventions.row_blocks import registered_hooks
from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

ZERO_POSITIONS = slice(0, 1)  # features and errors zeroed: the first position (circuit-tracer's `zero_positions`)


class CustomTarget(NamedTuple):
    """A logit node of your own (circuit-tracer 0.5.0 `attribution/targets.py`): `vec` [d_model] is the direction
    the final norm's output at the last position is read along (a logit difference: `W_U[a] - W_U[b]`, rows of
    `model.unembed_weight`), `prob` its weight in pruning and scores (a probability's place), `token_str` its label.
    Its node's vocabulary index is `d_vocab + i` for the i-th target, as circuit-tracer numbers them."""

    token_str: str
    prob: float
    vec: Tensor


# token ids (a tensor, or ints of any kind: int, numpy, 0-d tensors), one-token texts, or custom targets
Targets = Tensor | Sequence[SupportsIndex] | Sequence[str] | Sequence[CustomTarget | tuple[str, float, Tensor]] | None


def attribute(
    model: HookedTransformer,
    prompt: str | Tensor | Sequence[int],
    transcoders: Sequence[Dictionary] | CrossLayerTranscoder,
    *,
    attribution_targets: Targets = None,
    max_n_logits: int | None = None,
    desired_logit_prob: float | None = None,
    max_feature_nodes: int | None = None,
    batch_size: int = 64,
    edges_per_row: int | None = None,
    update_interval: int = 4,
    progress: bool | None = None,
    attention_mask: Tensor | None = None,
) -> Graph:
    """The attribution graph of one prompt through `transcoders` (module docstring: what it is).

    `prompt`: text, or token ids [pos] (or [1, pos]), with their `attention_mask` (1 = real token) where they are a
    padded row: its padding is left out, so the graph is the prompt's alone (a row's ids alone never say which are
    pads, as for the model's forward). As circuit-tracer, text is tokenized without special tokens and a special
    token (BOS, else pad, else EOS) is put first unless the ids already start with one.
    `transcoders`: one transcoder per layer (a list, layer l at index l: `hooked.sae.load` of a circuit-tracer set)
    or a `CrossLayerTranscoder`, for this model (checked before anything runs).
    Logit nodes: the most probable next tokens, at most `max_n_logits` (default 10), until their probability
    reaches `desired_logit_prob` (default 0.95); or, with neither given, `attribution_targets`, as circuit-tracer
    0.5.0 takes them: token ids (a tensor or a list of ints), token strings (each one token), or
    `CustomTarget(label, weight, vector)`s (or such tuples), a direction in the residual stream of your choosing
    (a logit difference: `W_U[a] - W_U[b]`), whose weight stands in for the probability in pruning and scores
    (`CustomTarget`); in the order given, the ids and strings with their probabilities. `max_feature_nodes`: at
    most this many features get rows and columns (None: every active one). `batch_size`: target rows per backward
    pass (the replacement model runs on this many copies of the prompt). `edges_per_row`: keep only each row's k
    largest edges (a sparse adjacency; None: every edge, dense, as circuit-tracer). `progress`: a tqdm bar over the
    feature rows (None: when writing to a terminal).
    """
    settings = _check_settings(
        max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, edges_per_row, attribution_targets, model
    )
    tc = _ready(model, transcoders, "hooked.graphs.attribute")
    tokens = prompt_tokens(model, prompt, attention_mask)
    return _attribute_all(model, tc, [tokens], settings, update_interval, progress)[0]


def attribute_batch(
    model: HookedTransformer,
    prompts: Sequence[str | Tensor | Sequence[int]] | Tensor,
    transcoders: Sequence[Dictionary] | CrossLayerTranscoder,
    *,
    attribution_targets: Targets = None,
    max_n_logits: int | None = None,
    desired_logit_prob: float | None = None,
    max_feature_nodes: int | None = None,
    batch_size: int = 64,
    edges_per_row: int | None = None,
    update_interval: int = 4,
    progress: bool | None = None,
    attention_mask: Tensor | None = None,
) -> list[Graph]:
    """The attribution graph of each of several prompts, computed together: `attribute`'s graph for each (the same
    numbers), from shared forward and backward passes.

    `prompts`: a list of prompts (texts, or token-id lists / 1-D tensors), or a 2-D tensor of ids, one prompt per
    row, padded as `model.to_tokens(texts)` pads: its padding (`attention_mask`, 1 = real token; without it, read
    from the ids as the model's forward reads it, `model.padding_mask`, or refused where the ids cannot say) is left
    out, so each row's graph is its prompt's alone. Prompts of the same length (after the special token `attribute`
    puts first) share one replacement forward, `batch_size // n` copies of each of n prompts, and every backward
    pass serves all of them: the logit rows of every prompt in one pass, then their feature rows side by side.
    Prompts of different lengths run in one group per length (no padding: a padded position would shift every
    position-indexed node). Each graph equals
    `attribute(model, prompt, transcoders, batch_size=batch_size // n)` for its group of n (with
    `max_feature_nodes`, which features are selected depends on the rows per pass, since influence is re-ranked
    every `update_interval` passes). `attribution_targets` (as `attribute`'s) are every prompt's logit nodes. Returns
    the graphs in the order of `prompts`.
    """
    settings = _check_settings(
        max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, edges_per_row, attribution_targets, model
    )
    if isinstance(prompts, Tensor):
        if prompts.ndim != 2:
            raise ValueError(f"a tensor of prompts is [n_prompts, pos], not {tuple(prompts.shape)}")
        prompts = unpadded_rows(model, prompts, attention_mask)
    elif attention_mask is not None:
        raise ValueError(
            "attention_mask= goes with a 2-D tensor of padded ids; a list of prompts holds each prompt unpadded"
        )
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise TypeError(
            "attribute_batch takes a non-empty list of prompts (texts or token-id lists) or a 2-D tensor of ids;"
            " for one prompt use graphs.attribute"
        )
    if all(isinstance(p, int) for p in prompts):
        raise TypeError(
            "this is one prompt's token ids, not a list of prompts: use graphs.attribute(model, ids, ...), or"
            " attribute_batch(model, [ids], ...)"
        )
    tc = _ready(model, transcoders, "hooked.graphs.attribute_batch")
    tokens = [prompt_tokens(model, p) for p in prompts]
    graphs: list[Graph | None] = [None] * len(tokens)
    by_length: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        by_length.setdefault(t.shape[0], []).append(i)
    for members in by_length.values():
        for start in range(0, len(members), batch_size):  # at most batch_size prompts share a forward
            group = members[start : start + batch_size]
            computed = _attribute_all(model, tc, [tokens[i] for i in group], settings, update_interval, progress)
            for i, graph in zip(group, computed, strict=True):
                graphs[i] = graph
    return graphs


def _ready(model: HookedTransformer, transcoders, caller: str) -> Transcoders:
    """The checks both entry points make before anything runs: gradients available, no outside hooks on the model,
    and transcoders that fit it."""
    needs_gradients(model, caller)
    registered_hooks(model, caller, part_of_model=False)
    return Transcoders(transcoders, model)


def _attribute_all(model, tc: Transcoders, tokens: list[Tensor], settings, update_interval, progress) -> list[Graph]:
    """The graphs of prompts of one length, sharing the replacement model's forward and backward passes."""
    batch_size = settings[3]
    frozen = [(p, p.requires_grad) for module in (model, *tc.modules) for p in module.parameters()]
    with evaluating(model):
        try:
            for p, _ in frozen:
                p.requires_grad_(False)
            nodes = [_nodes(model, tc, t, *settings[:2], settings[5]) for t in tokens]
            most = max(max(len(n.logit_ids), n.n_active) for n in nodes)
            copies = max(1, min(batch_size // len(tokens), most))  # no more copies than targets
            run = _ReplacementRun(model, tc, torch.stack(tokens), nodes, copies)
            rows = _attribute_rows(run, nodes, settings, update_interval, progress)
        finally:
            for p, flag in frozen:
                p.requires_grad_(flag)
    return [_graph(model, tc, t, n, r) for t, n, r in zip(tokens, nodes, rows, strict=True)]


def unpadded_rows(model: HookedTransformer, tokens: Tensor, attention_mask: Tensor | None) -> list[Tensor]:
    """Each row of ids [n pos] without its padding, read as every entry point reads it (`model.padding_mask`):
    a graph has a node per position, so a pad kept would be a token node and shift every position after it."""
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"token ids are an integer tensor, not {tokens.dtype}")
    mask = model.padding_mask(tokens, attention_mask)
    return list(tokens) if mask is None else [row[keep] for row, keep in zip(tokens, mask, strict=True)]


def prompt_tokens(model: HookedTransformer, prompt, attention_mask: Tensor | None = None) -> Tensor:
    """The prompt's ids [pos], without the padding `attention_mask` marks, a special token first (circuit-tracer
    0.5.0 `replacement_model/common.py` `ensure_tokenized`)."""
    tokenizer = getattr(model, "tokenizer", None)
    if attention_mask is not None:
        if isinstance(prompt, str):
            raise ValueError("attention_mask= goes with token ids; a text prompt has no padding")
        ids = torch.as_tensor(prompt)
        (prompt,) = unpadded_rows(model, ids.reshape(1, -1), torch.as_tensor(attention_mask).reshape(1, -1))
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer, so give the prompt as token ids")
        tokens = torch.tensor(tokenizer.encode(prompt, add_special_tokens=False), dtype=torch.long)
    elif isinstance(prompt, Tensor):
        tokens = prompt.detach().to("cpu", torch.long)
        if tokens.ndim == 2 and tokens.shape[0] == 1:
            tokens = tokens[0]
    elif isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        tokens = torch.tensor(list(prompt), dtype=torch.long)
    else:
        raise TypeError(f"the prompt is text or token ids (a tensor or a list of ints), not {type(prompt).__name__}")
    if tokens.ndim != 1:
        raise ValueError(
            f"an attribution graph explains one prompt; got ids of shape {tuple(tokens.shape)}: give one row"
            " (a graph per prompt: call attribute for each)"
        )
    if tokens.numel() == 0:
        raise ValueError("the prompt is empty")
    if tokenizer is not None:
        special = [tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id]
        special = [t for t in special if t is not None]
        if special and int(tokens[0]) not in special:
            tokens = torch.cat([torch.tensor([special[0]]), tokens])
    bad = tokens[(tokens < 0) | (tokens >= model.cfg.d_vocab)]
    if bad.numel():
        raise ValueError(f"token id {int(bad[0])} is outside this model's vocabulary (0..{model.cfg.d_vocab - 1})")
    if tokens.shape[0] > model.cfg.n_ctx:
        raise ValueError(
            f"the prompt is {tokens.shape[0]} tokens (with the first special token), longer than this model's"
            f" context of {model.cfg.n_ctx}; shorten it"
        )
    return tokens.to(model.device)


def _check_settings(
    max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, edges_per_row, attribution_targets, model
):
    targets = _check_targets(attribution_targets, model)
    if targets is not None and (max_n_logits is not None or desired_logit_prob is not None):
        raise ValueError(
            f"max_n_logits={max_n_logits} / desired_logit_prob={desired_logit_prob} choose the logit nodes when"
            " attribution_targets is None; attribution_targets names them, so these would be ignored: leave them out"
        )
    if targets is None:  # the most probable tokens
        max_n_logits = 10 if max_n_logits is None else max_n_logits
        desired_logit_prob = 0.95 if desired_logit_prob is None else desired_logit_prob
    if targets is None and (not isinstance(max_n_logits, int) or max_n_logits < 1):
        raise ValueError(f"max_n_logits must be a positive integer (the most logit nodes), not {max_n_logits!r}")
    if targets is None and not 0 < desired_logit_prob <= 1:
        raise ValueError(
            f"desired_logit_prob must be in (0, 1] (the probability the logit nodes should cover), not"
            f" {desired_logit_prob!r}"
        )
    if max_feature_nodes is not None and (not isinstance(max_feature_nodes, int) or max_feature_nodes < 0):
        raise ValueError(f"max_feature_nodes must be None or an integer >= 0, not {max_feature_nodes!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer (rows per backward pass), not {batch_size!r}")
    if edges_per_row is not None and (not isinstance(edges_per_row, int) or edges_per_row < 1):
        raise ValueError(f"edges_per_row must be None (keep every edge) or a positive integer, not {edges_per_row!r}")
    return max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, edges_per_row, targets


# ----------------------------------------------------------------------------- the logit nodes asked for
@dataclass(frozen=True)
class _Targets:
    """`attribution_targets` checked: token ids (from ids or strings), or custom (label, weight, vector) triples."""

    ids: tuple[int, ...] = ()
    custom: tuple[CustomTarget, ...] = ()


def _check_targets(targets, model) -> _Targets | None:
    """`attribution_targets` as ids or custom targets, each checked before anything runs."""
    if targets is None:
        return None
    d_vocab, d_model = model.cfg.d_vocab, model.cfg.d_model
    if isinstance(targets, Tensor):
        if targets.ndim != 1 or targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
            raise TypeError(
                f"attribution_targets as a tensor is 1-D token ids, not a {targets.dtype} tensor of shape"
                f" {tuple(targets.shape)}"
            )
        targets = targets.tolist()
    if isinstance(targets, str) or not isinstance(targets, Sequence):
        raise TypeError(
            "attribution_targets is None (the most probable tokens), token ids (a tensor or a list of ints), token"
            f" strings, or CustomTarget(label, weight, vector)s; not {type(targets).__name__}"
            + (f": for the one token {targets!r}, pass [{targets!r}]" if isinstance(targets, str) else "")
        )
    if not targets:
        raise ValueError("attribution_targets is empty; leave it None for the most probable tokens")
    kinds = {"id" if _is_id(t) else "str" if isinstance(t, str) else "custom" for t in targets}
    if len(kinds) > 1:
        raise TypeError(
            f"attribution_targets mixes {' and '.join(sorted(kinds))} targets; give one kind: token ids, token"
            " strings, or custom targets (a token's own direction is model.unembed_weight[id] - its mean row)"
        )
    if kinds == {"custom"}:
        return _Targets(custom=tuple(_custom(t, i, d_model) for i, t in enumerate(targets)))
    ids = [_token_id(t, model) for t in targets] if kinds == {"str"} else [operator.index(t) for t in targets]
    bad = [i for i in ids if not 0 <= i < d_vocab]
    if bad:
        raise ValueError(f"attribution target id {bad[0]} is outside this model's vocabulary (0..{d_vocab - 1})")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"attribution_targets names token {repeated[0]} more than once; each is one logit node")
    return _Targets(ids=tuple(ids))


def _is_id(target) -> bool:
    """An integer of any kind (int, a numpy integer, a 0-d integer tensor), not a bool."""
    if isinstance(target, bool) or (isinstance(target, Tensor) and target.dtype == torch.bool):
        return False
    try:
        operator.index(target)
    except TypeError:
        return False
    return True


def _token_id(text: str, model) -> int:
    """The one token `text` is, encoded without special tokens (circuit-tracer's `_from_str`)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(f"attribution target {text!r} is text and this model has no tokenizer: give token ids")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"attribution target {text!r} is {len(ids)} tokens ({list(ids)}), not one: give a single token's text"
            " (often with its leading space, ' Mary'), or its id"
        )
    return int(ids[0])


def _custom(target, i: int, d_model: int) -> CustomTarget:
    if not isinstance(target, tuple) or len(target) != 3:
        raise TypeError(
            f"attribution target {i} is {type(target).__name__}, not a CustomTarget(label, weight, vector) or a"
            " (label, weight, vector) tuple"
        )
    label, weight, vec = target
    if not isinstance(label, str):
        raise TypeError(f"attribution target {i}'s label is {type(label).__name__}, not str")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
        raise ValueError(
            f"attribution target {i} ({label!r}) has weight {weight!r}: a finite number >= 0 (it stands in for a"
            " probability when pruning)"
        )
    if not isinstance(vec, Tensor) or tuple(vec.shape) != (d_model,) or not vec.is_floating_point():
        what = f"a tensor of shape {tuple(vec.shape)}" if isinstance(vec, Tensor) else type(vec).__name__
        raise ValueError(
            f"attribution target {i} ({label!r})'s vector is {what}, not a float tensor [d_model={d_model}]"
        )
    if not torch.isfinite(vec).all():
        raise ValueError(f"attribution target {i} ({label!r})'s vector has non-finite entries")
    return CustomTarget(label, float(weight), vec.detach())


# ----------------------------------------------------------------------------- the nodes, from one clean forward
BLOCK_ELEMENTS = 2**24  # the most floats a contraction's [positions, slots, d] block holds at once (64 MiB)


@dataclass
class _Writes:
    """The active features that write to output layer `layer` (its own features; for a CLT, also every earlier
    layer's), sorted by position: entry j is feature `features[j]` of layer `sources[j]` with activation
    `activations[j]`, column `index[j]` among the active features, at `positions[j]`, slot `slot[j]` of its
    position. Entries of position p are `starts[p]:starts[p + 1]`; a position holds at most `width`.

    Their vectors (activation times decoder row) are gathered a block of positions at a time, never all at once: at
    a CLT's width and a long prompt, every active feature's decoder rows would be most of the memory. A block
    [positions, slots, d] of them meets the gradient [batch, positions, d] in one batched product, reading the
    gradient once instead of copying a row of it for each feature (most positions hold dozens)."""

    layer: int
    positions: Tensor
    slot: Tensor
    index: Tensor
    sources: Tensor
    features: Tensor
    activations: Tensor
    starts: Tensor  # [n_pos + 1]
    width: int

    @classmethod
    def of(cls, layer: int, parts: list[tuple[int, Tensor, Tensor, Tensor, Tensor]], n_pos: int) -> _Writes:
        """From (source layer, index, positions, features, activations) per source layer."""
        sources = torch.cat([torch.full_like(index, source) for source, index, *_ in parts])
        index, positions, features, activations = (torch.cat([part[i] for part in parts]) for i in range(1, 5))
        order = torch.argsort(positions, stable=True)
        index, positions, features, activations, sources = (
            t[order] for t in (index, positions, features, activations, sources)
        )
        counts = torch.bincount(positions, minlength=n_pos)
        starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        slot = torch.arange(positions.shape[0], device=positions.device) - starts[positions]
        width = int(counts.max()) if positions.numel() else 0
        return cls(layer, positions, slot, index, sources, features, activations, starts, width)

    def vectors(self, tc: Transcoders, a: int, b: int) -> Tensor:
        """[b - a, d_out]: entries a..b-1's activation times decoder row (to this layer)."""
        sources, features = self.sources[a:b], self.features[a:b]
        out = torch.empty(b - a, tc.d_out, dtype=tc.dtype, device=tc.device)
        for source in sources.unique().tolist():
            mask = sources == source
            out[mask] = tc.decoder_rows(source, features[mask], self.layer)
        return out * self.activations[a:b, None]

    def blocks(self, n_pos: int, d: int):
        """(first position, end position, first entry, end entry) of blocks of positions within BLOCK_ELEMENTS."""
        step = max(1, BLOCK_ELEMENTS // max(self.width * d, 1))
        for p0 in range(0, n_pos, step):
            p1 = min(p0 + step, n_pos)
            a, b = int(self.starts[p0]), int(self.starts[p1])
            if a < b:
                yield p0, p1, a, b


@dataclass
class _Nodes:
    """Everything the clean forward fixes: the active features, the error vectors, the token embeddings and the
    logit targets."""

    tc: Transcoders
    active: Tensor  # [n_active, 3] (layer, pos, feature), on the CPU
    values: Tensor  # [n_active]
    writes: list[_Writes]  # per output layer
    errors: Tensor  # [n_layers, pos, d_out]
    embeddings: Tensor  # [pos, d_model]
    logit_ids: Tensor  # [n_logits]; a custom target's is d_vocab + its index, as circuit-tracer's
    logit_probabilities: Tensor
    logit_vectors: Tensor  # [n_logits, d_model]
    logit_labels: list[str] | None  # custom targets' labels (None: the tokens' text)

    @property
    def n_active(self) -> int:
        return int(self.active.shape[0])

    def encoder_vectors(self, chunk: Tensor) -> Tensor:
        """[k, d_in]: the input direction each of the active features `chunk` reads (its row of W_enc)."""
        layers, features = self.active[chunk, 0], self.active[chunk, 2]
        out = torch.empty(chunk.shape[0], self.tc.d_in, dtype=self.tc.dtype, device=self.tc.device)
        for layer in layers.unique().tolist():
            mask = layers == layer
            out[mask.to(out.device)] = self.tc.encoder_vectors(layer, features[mask].to(out.device))
        return out


@torch.no_grad()
def _nodes(
    model: HookedTransformer,
    tc: Transcoders,
    tokens: Tensor,
    max_n_logits: int | None,
    desired: float | None,
    targets: _Targets | None = None,
) -> _Nodes:
    names = [*tc.hook_in, *tc.hook_out, "hook_embed"]
    logits, cache = model.run_with_cache(tokens[None], names_filter=names)
    x = [cache[name][0] for name in tc.hook_in]
    n_layers, n_pos = tc.n_layers, tokens.shape[0]

    active, values = [], []
    for layer in range(n_layers):
        acts = tc.activate(layer, tc.pre_activations(layer, x[layer]))
        acts[ZERO_POSITIONS] = 0
        pos, feat = acts.nonzero(as_tuple=True)  # row-major: sorted by position, then feature
        active.append(torch.stack([torch.full_like(pos, layer), pos, feat], dim=1))
        values.append(acts[pos, feat])
    offsets = [0, *torch.tensor([a.shape[0] for a in active]).cumsum(0).tolist()]

    writes, errors = [], []
    for m in range(n_layers):
        parts = []
        for source in range(m + 1) if tc.clt is not None else [m]:
            index = torch.arange(offsets[source], offsets[source + 1], device=active[source].device)
            parts.append((source, index, active[source][:, 1], active[source][:, 2], values[source]))
        into_m = _Writes.of(m, parts, n_pos)
        recon = torch.zeros(n_pos, tc.d_out, dtype=x[m].dtype, device=x[m].device)
        for _, _, a, b in into_m.blocks(n_pos, tc.d_out):
            recon.index_add_(0, into_m.positions[a:b], into_m.vectors(tc, a, b))
        recon = recon + tc.decoder_bias(m)
        skip = tc.skip(m, x[m])
        if skip is not None:
            recon = recon + skip
        error = cache[tc.hook_out[m]][0] - recon
        error[ZERO_POSITIONS] = 0
        errors.append(error)
        writes.append(into_m)

    probabilities = torch.softmax(logits[0, -1], dim=-1)
    labels = None
    if targets is None:  # the most probable tokens, until they hold `desired`
        top_p, top_ids = torch.topk(probabilities, min(max_n_logits, probabilities.shape[0]))
        cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired)) + 1
        ids = top_ids[:cutoff]
    elif targets.ids:
        ids = torch.tensor(targets.ids, device=probabilities.device)
    if targets is None or targets.ids:
        weights, vectors = probabilities[ids], _centred_unembedding(model, ids)
    else:
        n, vocab = len(targets.custom), probabilities.shape[0]
        ids = torch.arange(vocab, vocab + n, device=probabilities.device)
        weights = torch.tensor([t.prob for t in targets.custom], device=probabilities.device)
        vectors = torch.stack([t.vec.to(probabilities.device, model.dtype) for t in targets.custom])
        labels = [t.token_str for t in targets.custom]
    if float(weights.sum()) == 0:  # the targets asked for: a probability under the dtype's smallest, or weights of 0
        raise ValueError(
            f"the logit nodes asked for weigh 0 in all (their {'weights' if labels else 'probabilities here'}), and"
            " pruning, scores and max_feature_nodes weigh the logit nodes by them, so nothing would count: give"
            " custom targets positive weights, or for a token of probability 0, CustomTarget(label, 1.0, W_U[id] -"
            " W_U.mean(0)) with W_U = model.unembed_weight, its own row with a weight of your own"
        )
    return _Nodes(
        tc=tc,
        active=torch.cat(active).cpu(),
        values=torch.cat(values),
        writes=writes,
        errors=torch.stack(errors),
        embeddings=cache["hook_embed"][0],
        logit_ids=ids,
        logit_probabilities=weights,
        logit_vectors=vectors,
        logit_labels=labels,
    )


def _centred_unembedding(model: HookedTransformer, ids: Tensor) -> Tensor:
    """[n, d_model]: rows `ids` of W_U minus its mean row. Under tensor parallelism each rank holds some rows: the
    rows and the sum over the vocabulary are summed over the ranks, so every rank has the whole vectors."""
    w_u = model.unembed_weight  # [d_vocab, d_model], or this rank's rows
    if not model.tensor_parallel:
        return w_u[ids] - w_u.mean(0)
    total = model.parallel.all_reduce(w_u.sum(0))
    return model._unembed_rows(ids) - total / model.cfg.d_vocab


# ----------------------------------------------------------------------------- the replacement model, run backward
def frozen_points(model: HookedTransformer) -> list[str]:
    """The points whose activations the replacement model detaches: every norm's scale, and each attention's
    queries and keys. A pattern is softmax(q k^T / sqrt(d) + mask) (capped, for Gemma 2), a function of q and k
    alone, so detaching q and k freezes it as detaching the pattern would; but no hook on the pattern means the
    attention runs on its fused kernel (SDPA, or hooked's Triton kernel on a GPU), whose backward recomputes the
    pattern blockwise: the memory of the backward passes grows linearly with the prompt, not with its square."""
    names = [n for n in model.hook_dict if n.endswith(("attn.hook_q", "attn.hook_k", "hook_scale"))]
    for point in ("attn.hook_q", "attn.hook_k"):
        if sum(n.endswith(point) for n in model.hook_dict) != model.cfg.n_layers:
            raise ValueError(
                f"{type(model).__name__} does not have one {point} per layer, where the replacement model freezes the"
                " attention pattern (by detaching queries and keys), so its graph cannot be built"
            )
    return names


class _ReplacementRun:
    """One forward of the frozen replacement model on `copies` copies of each prompt (prompts of one length, their
    copies side by side in the batch), kept with its autograd graph; `rows(...)` injects up to `copies` targets per
    prompt and returns each prompt's rows over its [active features, errors, tokens]."""

    def __init__(self, model: HookedTransformer, tc: Transcoders, tokens: Tensor, nodes: list[_Nodes], copies: int):
        self.nodes, self.n_layers, self.n_pos, self.copies = nodes, tc.n_layers, tokens.shape[1], copies
        self.row_sizes = [n.n_active + (tc.n_layers + 1) * self.n_pos for n in nodes]
        self.inputs: list[Tensor | None] = [None] * (tc.n_layers + 1)  # x_l per layer, then the final norm's output
        self.buffers: list[Tensor] = []
        self.embed: Tensor | None = None
        layer_of = {name: layer for layer, name in enumerate(tc.hook_in)}
        out_layer = {name: layer for layer, name in enumerate(tc.hook_out)}

        def freeze(activation: Tensor, hook) -> Tensor:
            return activation.detach()

        def embed(activation: Tensor, hook) -> Tensor:
            leaf = activation.detach().requires_grad_(True)
            leaf.register_hook(self._contract_tokens)
            self.embed = leaf
            return leaf

        def read(activation: Tensor, hook) -> None:
            self.inputs[layer_of[hook.name]] = activation

        def write(activation: Tensor, hook) -> Tensor:
            layer = out_layer[hook.name]
            x = self.inputs[layer]
            skip = tc.skip(layer, x)
            if skip is None:  # keeps the output in the autograd graph, so its gradient is seen (and is all there is)
                skip = x[..., :1] * 0
            out = skip + (activation - skip).detach()
            out.register_hook(lambda grad, layer=layer: self._contract_layer(layer, grad))
            return out

        frozen = frozen_points(model)
        hooks = [("hook_embed", embed), *((n, freeze) for n in frozen)]
        hooks += [(n, read) for n in tc.hook_in] + [(n, write) for n in tc.hook_out]
        with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
            resid = model(tokens.repeat_interleave(copies, dim=0), stop_at_layer=model.cfg.n_layers)
            self.inputs[-1] = model.ln_final(resid)

    def _prompt_grads(self, grad: Tensor):
        """(prompt's nodes, its rows' buffer, its copies' gradient [copies, pos, d]) for each prompt."""
        for i, (nodes, buffer) in enumerate(zip(self.nodes, self.buffers, strict=True)):
            yield nodes, buffer, grad[i * self.copies : (i + 1) * self.copies].float()

    def _contract_layer(self, layer: int, grad: Tensor) -> None:
        for nodes, buffer, g in self._prompt_grads(grad):
            writes = nodes.writes[layer]
            for p0, p1, a, b in writes.blocks(self.n_pos, g.shape[-1]):
                positions, slot = writes.positions[a:b] - p0, writes.slot[a:b]
                block = g.new_zeros(p1 - p0, writes.width, g.shape[-1])
                block[positions, slot] = writes.vectors(nodes.tc, a, b).float()
                products = torch.bmm(block, g[:, p0:p1].permute(1, 2, 0))  # [positions, slots, copies]
                buffer.index_add_(1, writes.index[a:b], products[positions, slot].T)
            start = nodes.n_active + layer * self.n_pos
            buffer[:, start : start + self.n_pos] += torch.einsum("bpd,pd->bp", g, nodes.errors[layer].float())

    def _contract_tokens(self, grad: Tensor) -> None:
        for nodes, buffer, g in self._prompt_grads(grad):
            start = nodes.n_active + self.n_layers * self.n_pos
            buffer[:, start : start + self.n_pos] += torch.einsum("bpd,pd->bp", g, nodes.embeddings.float())

    def rows(self, requests: list[tuple[Tensor, Tensor, Tensor] | None]) -> list[Tensor | None]:
        """Per prompt, the rows [k, row_size] of its k <= copies targets `(layers, positions, vectors)`: target j
        injected at layer `layers[j]` (n_layers: the final norm's output), position `positions[j]`, along
        `vectors[j]`; None where a prompt asks for nothing."""
        device = self.inputs[-1].device
        self.buffers = [torch.zeros(self.copies, size, device=device) for size in self.row_sizes]
        by_layer: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}
        for i, request in enumerate(requests):
            if request is None:
                continue
            layers, positions, vectors = request
            rows_of = torch.arange(layers.shape[0], device=device) + i * self.copies
            for layer in layers.unique().tolist():
                mask = layers == layer
                by_layer.setdefault(layer, []).append((rows_of[mask], positions[mask], vectors[mask]))
        roots, grads = [], []
        for layer, parts in by_layer.items():
            root = self.inputs[layer]
            grad = torch.zeros_like(root)
            for batch_rows, positions, vectors in parts:
                grad[batch_rows, positions] = vectors.to(root.dtype)
            roots.append(root)
            grads.append(grad)
        torch.autograd.backward(roots, grads, retain_graph=True, inputs=[self.embed])
        self.embed.grad = None
        out = [None if r is None else b[: r[0].shape[0]] for r, b in zip(requests, self.buffers, strict=True)]
        self.buffers = []
        return out


# ----------------------------------------------------------------------------- which rows, in what order
def _attribute_rows(run: _ReplacementRun, nodes: list[_Nodes], settings, update_interval: int, progress) -> list:
    """Every prompt's rows: each prompt's targets come from its own schedule (`_schedule`); each backward pass
    serves the next chunk of every prompt that has one."""
    max_feature_nodes, edges_per_row = settings[2], settings[4]
    budgets = [n.n_active if max_feature_nodes is None else min(max_feature_nodes, n.n_active) for n in nodes]
    stores = [
        _Rows(budget + len(n.logit_ids), size + len(n.logit_ids), size, edges_per_row)
        for n, budget, size in zip(nodes, budgets, run.row_sizes, strict=True)
    ]
    bar = tqdm(
        total=sum(budgets),
        desc="attribution graph: feature rows",
        disable=(not progress) if progress is not None else None,
    )
    schedules = [
        _schedule(run, n, store, budget, update_interval, bar)
        for n, store, budget in zip(nodes, stores, budgets, strict=True)
    ]
    pending = [next(s, None) for s in schedules]
    while any(p is not None for p in pending):
        rows = run.rows([None if p is None else p[:3] for p in pending])
        for i, (p, r) in enumerate(zip(pending, rows, strict=True)):
            if p is not None:
                stores[i].add(r, p[3])
                pending[i] = next(schedules[i], None)
    bar.close()
    return stores


def _schedule(run: _ReplacementRun, nodes: _Nodes, store: _Rows, budget: int, update_interval: int, bar):
    """One prompt's targets, `run.copies` at a time, as (layers, positions, vectors, node ids): the logits, then
    the features, as circuit-tracer orders them: all of them, or, with fewer rows than active features, the ones
    not yet visited ranked by their influence through the rows computed so far, re-ranked every
    `update_interval * copies` rows. The caller stores each chunk's rows before asking for the next."""
    n_active, n_logits, size, c = nodes.n_active, len(nodes.logit_ids), store.row_size, run.copies
    for start in range(0, n_logits, c):
        vecs = nodes.logit_vectors[start : start + c]
        k = vecs.shape[0]
        yield (
            torch.full((k,), run.n_layers),
            torch.full((k,), run.n_pos - 1),
            vecs,
            torch.arange(start, start + k) + size,
        )

    layers, positions = nodes.active[:, 0], nodes.active[:, 1]
    visited = torch.zeros(n_active, dtype=torch.bool)
    n_visited = 0
    while n_visited < budget:
        if budget == n_active:
            pending = torch.arange(n_active)
        else:
            influence = store.partial_influences(nodes.logit_probabilities.float().cpu())
            rank = torch.argsort(influence[:n_active], descending=True)
            pending = rank[~visited[rank]][: min(update_interval * c, budget - n_visited)]
        for chunk in pending.split(c):
            n_visited += chunk.shape[0]
            yield layers[chunk], positions[chunk], nodes.encoder_vectors(chunk), chunk
            visited[chunk] = True
            bar.update(chunk.shape[0])
    store.selected = torch.where(visited)[0]


class _Rows:
    """The rows computed so far, in the order computed, over every node as a column ([active features, errors,
    tokens, logits]); dense as circuit-tracer's `edge_matrix`, or each row's `edges_per_row` largest entries."""

    def __init__(self, n_rows: int, n_columns: int, row_size: int, edges_per_row: int | None):
        self.n_columns, self.row_size, self.keep = n_columns, row_size, edges_per_row
        self.node_of_row = torch.zeros(n_rows, dtype=torch.long)
        self.count = 0
        self.selected = torch.zeros(0, dtype=torch.long)
        if edges_per_row is None:
            self.matrix = torch.zeros(n_rows, n_columns)
        else:
            self.matrix = None
            self.row_index: list[Tensor] = []
            self.columns: list[Tensor] = []
            self.values: list[Tensor] = []

    def add(self, rows: Tensor, nodes: Tensor) -> None:
        rows = rows.float().cpu()
        k = rows.shape[0]
        row_ids = torch.arange(self.count, self.count + k)
        if self.matrix is not None:
            self.matrix[self.count : self.count + k, : self.row_size] = rows
        else:
            keep = min(self.keep, rows.shape[1])
            values, columns = rows.abs().topk(keep, dim=1)
            values = rows.gather(1, columns)
            nonzero = values != 0
            self.row_index.append(row_ids[:, None].expand(-1, keep)[nonzero])
            self.columns.append(columns[nonzero])
            self.values.append(values[nonzero])
        self.node_of_row[self.count : self.count + k] = nodes
        self.count += k

    def coo(self) -> tuple[Tensor, Tensor, Tensor]:
        """(row, column, value) of every entry kept, rows in computed order (the sparse store's)."""
        if not self.values:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty, torch.zeros(0)
        return torch.cat(self.row_index), torch.cat(self.columns), torch.cat(self.values)

    def partial_influences(self, logit_probabilities: Tensor, max_iter: int = 128) -> Tensor:
        """Each node's influence on the logits through the rows computed so far (circuit-tracer 0.5.0 `graph.py`
        `compute_partial_influences`: row-normalised |A|, the power series from the logit nodes)."""
        node_of_row = self.node_of_row[: self.count]
        if self.matrix is not None:  # as circuit-tracer: a dense product per step
            normalized = self.matrix[: self.count].abs()
            normalized /= normalized.sum(dim=1, keepdim=True).clamp(min=1e-8)
            step = lambda prod: prod[node_of_row] @ normalized  # noqa: E731
        else:  # the same sums over the entries kept
            rows, columns, values = self.coo()
            values = values.abs()
            values = values / torch.zeros(self.count).index_add_(0, rows, values).clamp(min=1e-8)[rows]
            step = lambda prod: torch.zeros(self.n_columns).index_add_(0, columns, values * prod[node_of_row][rows])  # noqa: E731
        influence = torch.zeros(self.n_columns)
        prod = torch.zeros(self.n_columns)
        prod[-logit_probabilities.shape[0] :] = logit_probabilities
        for _ in range(max_iter):
            prod = step(prod)
            if not prod.any():
                break
            influence += prod
        else:
            raise RuntimeError("the influence of the rows computed so far did not converge in 128 steps")
        return influence


# ----------------------------------------------------------------------------- the graph
def _graph(model: HookedTransformer, tc: Transcoders, tokens: Tensor, nodes: _Nodes, rows: _Rows) -> Graph:
    """The rows, in circuit-tracer's node order, as a Graph: feature rows by feature, then logit rows; columns of
    the selected features only."""
    n_active = nodes.n_active
    selected = rows.selected
    # column of each node in the graph: selected features first, then errors, tokens, logits; -1 for features left out
    column_of = torch.full((rows.n_columns,), -1, dtype=torch.long)
    column_of[selected] = torch.arange(selected.shape[0])
    n_features = selected.shape[0]
    column_of[n_active:] = torch.arange(n_features, n_features + rows.n_columns - n_active)
    n_nodes = n_features + rows.n_columns - n_active
    # row of each computed row: a feature's own column; a logit's, its node
    row_nodes = rows.node_of_row[: rows.count]
    target = column_of[row_nodes]

    if rows.matrix is not None:  # circuit-tracer's steps: the selected features' columns, rows to their nodes
        columns = rows.matrix[: rows.count]
        if selected.shape[0] < n_active:
            columns = columns[:, torch.cat([selected, torch.arange(n_active, rows.n_columns)])]
        adjacency = torch.zeros(n_nodes, n_nodes)
        adjacency[target] = columns
    else:
        r, c, v = rows.coo()
        keep = column_of[c] >= 0
        r, c, v = target[r[keep]], column_of[c[keep]], v[keep]
        adjacency = torch.sparse_coo_tensor(
            torch.stack([r, c]), v, (n_nodes, n_nodes), check_invariants=True
        ).coalesce()

    tokenizer = getattr(model, "tokenizer", None)
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else (lambda ids: "")
    cfg = model.cfg
    info = {
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_head": getattr(cfg, "d_head", cfg.d_model // cfg.n_heads),
        "d_mlp": getattr(cfg, "d_mlp", None),
        "d_vocab": cfg.d_vocab,
        "n_ctx": cfg.n_ctx,
        "model_name": _safe(lambda: cfg.model_name),
        "tokenizer_name": _safe(lambda: cfg.tokenizer_name),
        "family": type(model).__name__,
    }
    return Graph(
        input_tokens=tokens.cpu(),
        input_string=decode(tokens.tolist()),
        active_features=nodes.active,
        activation_values=nodes.values.float().cpu(),
        selected_features=selected,
        adjacency=adjacency,
        logit_targets=[
            LogitTarget(decode([int(t)]) if nodes.logit_labels is None else nodes.logit_labels[i], int(t))
            for i, t in enumerate(nodes.logit_ids)
        ],
        logit_probabilities=nodes.logit_probabilities.float().cpu(),
        n_layers=tc.n_layers,
        vocab_size=cfg.d_vocab,
        feature_input_hook=tc.templates[0],
        feature_output_hook=tc.templates[1],
        model_info=info,
        scan=tc.scan or default_scan(info),  # circuit-tracer's create_graph_files refuses a graph without one
    )


def _safe(read):
    try:
        return read()
    except Exception:  # a model built in memory has no name
        return None
