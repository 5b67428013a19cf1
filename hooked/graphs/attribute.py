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

Where each step lives: the keywords checked into `AttributionSettings` (settings.py; the logit targets, targets.py),
the prompt's ids (prompts.py), the nodes one clean forward fixes (nodes.py), the replacement model run backward
(replacement.py), which rows in what order and where they are kept (schedule.py), the rows as a Graph (assembly.py).
The transcoders answer the per-layer questions themselves (hooked/sae/transcoders.py); this file drives the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.graphs.assembly import assemble
from hooked.graphs.graph import Graph
from hooked.graphs.nodes import clean_nodes
from hooked.graphs.prompts import prompt_tokens, unpadded_rows
from hooked.graphs.replacement import ReplacementRun, frozen_points
from hooked.graphs.schedule import attribute_rows
from hooked.graphs.settings import AttributionSettings
from hooked.graphs.targets import CustomTarget, Targets
from hooked.graphs.transcoders import Transcoders, fitted
from hooked.hooks import evaluating, needs_gradients
from hooked.interventions.row_blocks import registered_hooks
from hooked.sae.clt import CrossLayerTranscoder
from hooked.sae.dictionary import Dictionary
from hooked.sae.transcoders import TranscoderSet

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

# the names other modules take from here (hooked.graphs re-exports the first three)
__all__ = ["CustomTarget", "attribute", "attribute_batch", "frozen_points", "prompt_tokens", "unpadded_rows"]


def attribute(
    model: HookedTransformer,
    prompt: str | Tensor | Sequence[int],
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder,
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
    `transcoders`: one transcoder per layer (a list, layer l at index l: `hooked.sae.load` of a circuit-tracer set;
    or a `hooked.sae.TranscoderSet`) or a `CrossLayerTranscoder`, for this model (checked before anything runs).
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
    settings = AttributionSettings.of(
        model,
        attribution_targets=attribution_targets,
        max_n_logits=max_n_logits,
        desired_logit_prob=desired_logit_prob,
        max_feature_nodes=max_feature_nodes,
        batch_size=batch_size,
        edges_per_row=edges_per_row,
        update_interval=update_interval,
    )
    tc = _ready(model, transcoders, "hooked.graphs.attribute")
    tokens = prompt_tokens(model, prompt, attention_mask)
    return _attribute_all(model, tc, [tokens], settings, progress)[0]


def attribute_batch(
    model: HookedTransformer,
    prompts: Sequence[str | Tensor | Sequence[int]] | Tensor,
    transcoders: Sequence[Dictionary] | TranscoderSet | CrossLayerTranscoder,
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
    settings = AttributionSettings.of(
        model,
        attribution_targets=attribution_targets,
        max_n_logits=max_n_logits,
        desired_logit_prob=desired_logit_prob,
        max_feature_nodes=max_feature_nodes,
        batch_size=batch_size,
        edges_per_row=edges_per_row,
        update_interval=update_interval,
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
            computed = _attribute_all(model, tc, [tokens[i] for i in group], settings, progress)
            for i, graph in zip(group, computed, strict=True):
                graphs[i] = graph
    return graphs


def _ready(model: HookedTransformer, transcoders, caller: str) -> Transcoders:
    """The checks both entry points make before anything runs: gradients available, no outside hooks on the model,
    and transcoders that fit it."""
    needs_gradients(model, caller)
    registered_hooks(model, caller, part_of_model=False)
    return fitted(transcoders, model)


def _attribute_all(
    model: HookedTransformer, tc: Transcoders, tokens: list[Tensor], settings: AttributionSettings, progress
) -> list[Graph]:
    """The graphs of prompts of one length, sharing the replacement model's forward and backward passes."""
    frozen = [(p, p.requires_grad) for p in (*model.parameters(), *tc.parameters())]
    with evaluating(model):
        try:
            for p, _ in frozen:
                p.requires_grad_(False)
            nodes = [clean_nodes(model, tc, t, settings) for t in tokens]
            most = max(max(len(n.logit_ids), n.n_active) for n in nodes)
            copies = max(1, min(settings.batch_size // len(tokens), most))  # no more copies than targets
            run = ReplacementRun(model, tc, torch.stack(tokens), nodes, copies)
            rows = attribute_rows(run, nodes, settings, progress)
        finally:
            for p, flag in frozen:
                p.requires_grad_(flag)
    return [assemble(model, tc, t, n, r) for t, n, r in zip(tokens, nodes, rows, strict=True)]
