"""An attribution graph's logit nodes: the targets a user asks for (`attribution_targets`: token ids, one-token
strings, or `CustomTarget` directions, as circuit-tracer 0.5.0 `attribution/targets.py` takes them), checked before
anything runs, and the nodes they become on the prompt (`logit_nodes`): each target's id, weight and the direction
in the final norm's output that it reads, W_U[t] - mean over the vocabulary of W_U for a token (so a shift of every
logit counts for nothing).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, SupportsIndex

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


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


@dataclass(frozen=True)
class CheckedTargets:
    """`attribution_targets` checked: token ids (from ids or strings), or custom (label, weight, vector) triples."""

    ids: tuple[int, ...] = ()
    custom: tuple[CustomTarget, ...] = ()


def check_targets(targets, model: HookedTransformer) -> CheckedTargets | None:
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
        return CheckedTargets(custom=tuple(_custom(t, i, d_model) for i, t in enumerate(targets)))
    ids = [_token_id(t, model) for t in targets] if kinds == {"str"} else [operator.index(t) for t in targets]
    bad = [i for i in ids if not 0 <= i < d_vocab]
    if bad:
        raise ValueError(f"attribution target id {bad[0]} is outside this model's vocabulary (0..{d_vocab - 1})")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"attribution_targets names token {repeated[0]} more than once; each is one logit node")
    return CheckedTargets(ids=tuple(ids))


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


def centred_unembedding(model: HookedTransformer, ids: Tensor) -> Tensor:
    """[n, d_model]: rows `ids` of W_U minus its mean row. Under tensor parallelism each rank holds some rows: the
    rows and the sum over the vocabulary are summed over the ranks, so every rank has the whole vectors."""
    w_u = model.unembed_weight  # [d_vocab, d_model], or this rank's rows
    if not model.tensor_parallel:
        return w_u[ids] - w_u.mean(0)
    total = model.parallel.all_reduce(w_u.sum(0))
    return model._unembed_rows(ids) - total / model.cfg.d_vocab


class LogitNodes(NamedTuple):
    """The logit nodes of one prompt: `ids` [n] (a custom target's is d_vocab + its index, as circuit-tracer's), their
    `weights` (the tokens' probabilities, or the custom targets' weights), the `vectors` [n, d_model] they read in the
    final norm's output at the last position, and the custom targets' `labels` (None: the tokens' text)."""

    ids: Tensor
    weights: Tensor
    vectors: Tensor
    labels: list[str] | None


def logit_nodes(
    model: HookedTransformer,
    last_logits: Tensor,
    targets: CheckedTargets | None,
    max_n_logits: int | None,
    desired_logit_prob: float | None,
) -> LogitNodes:
    """The logit nodes from the prompt's logits at its last position [d_vocab]: `targets`, or with none the most
    probable tokens, at most `max_n_logits`, until they hold `desired_logit_prob`."""
    probabilities = torch.softmax(last_logits, dim=-1)
    labels = None
    if targets is None:  # the most probable tokens, until they hold `desired_logit_prob`
        top_p, top_ids = torch.topk(probabilities, min(max_n_logits, probabilities.shape[0]))
        cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
        ids = top_ids[:cutoff]
    elif targets.ids:
        ids = torch.tensor(targets.ids, device=probabilities.device)
    if targets is None or targets.ids:
        weights, vectors = probabilities[ids], centred_unembedding(model, ids)
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
    return LogitNodes(ids, weights, vectors, labels)
