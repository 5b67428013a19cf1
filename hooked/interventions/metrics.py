"""Metrics: plain callables of logits that give one float32 number per prompt (float64 for float64 logits).

A metric is a frozen dataclass. Called on the full logits [batch pos d_vocab] of a run, it returns
[batch]. It also declares what it reads, so that a sweep can keep only that much of every run:

    position    -1: each prompt's last real token (the last column, unless a right-padded row ends with
                padding: then pass the attention mask); None: every position
    columns     the vocabulary ids it reads, in that order; None: the whole vocabulary
    needs_base  it compares with the base (unablated) run, passed as `base_logits`
    name        what tables and plots call it ("logit_diff")

`compute(logits, base_logits, attention_mask)` takes logits already reduced to
[batch, read_pos, len(columns) or d_vocab], read_pos 1 or pos (`attention_mask` keeps every position), and
`metric(logits)` is `reduce` followed by `compute`. Everything is computed in float32 (in float64 for
a float64 model, whose digits a float32 metric would drop: `_wide`). With
position=None a metric scores every position and averages each prompt's real ones (the attention
mask's True entries; every position when the mask is None).

    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    metric(model(task.clean))        # [batch] float32: logit[correct] - logit[incorrect]

Answers are given one per prompt, as strings (each must be one token for the model), ints or a
LongTensor [batch]. A string the tokenizer does not know, which it turns into its unknown token
(`<|unk|>`), is refused: every unknown word would read that one logit, and a difference of two would
be 0. An int is taken as the id it is, the unknown token's included.

**Which prompts.** Answers belong to prompts: `logit_diff` built for one task's prompts, run on another's,
reads logits of the wrong names and returns a number that looks fine. A metric built from a task,
`metrics.logit_diff(model, task)`, or given its prompts, `logit_diff(model, correct, incorrect,
prompts=tokens)`, keeps each prompt's real token ids (`PromptSet`: padding and a leading BOS left out, so
left, right or no padding compare equal), and every call that runs it on prompts (`hooked.sweep`,
`patch.attribution`, `hooked.circuits`, `hooked.sae.attribute`) refuses other prompts before running
(`check_prompts`). A task's metric accepts its clean prompts or its corrupt ones (activation patching runs
the corrupt prompts with the clean answers). `loss` keeps the tokens it scores. A metric of answers alone
knows only how many prompts it has; `kl_div` reads no answers and fits any prompts.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from hooked.interventions.positions import last_real
from hooked.interventions.tasks import Task

Answers = Sequence[str] | Sequence[int] | Int[Tensor, " batch"]
Prompts = Task | str | Sequence[str] | Int[Tensor, "batch pos"]  # what a metric's answers belong to
Mask = Bool[Tensor, "batch pos"] | Int[Tensor, "batch pos"]  # True (or 1, as a tokenizer gives it) at real tokens


@runtime_checkable
class Metric(Protocol):
    """What `hooked.sweep` asks of a metric."""

    name: str
    position: int | None
    columns: tuple[int, ...] | None
    needs_base: bool
    # optional: `prompts`, a PromptSet of the prompts its answers belong to (see `check_prompts`)

    def compute(
        self, logits: Tensor, base_logits: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor: ...

    def __call__(
        self, logits: Tensor, *, base_logits: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor: ...


class _Metric:
    """The shared half of every metric: reduce full logits to what `compute` reads, check shapes."""

    name: ClassVar[str]
    needs_base: ClassVar[bool] = False
    columns = None  # the whole vocabulary, unless a metric declares its columns

    def __call__(
        self,
        logits: Float[Tensor, "batch pos d_vocab"],
        *,
        base_logits: Float[Tensor, "batch pos d_vocab"] | None = None,
        attention_mask: Mask | None = None,
    ) -> Float[Tensor, " batch"]:
        _check_rank(logits, "logits")
        if self.needs_base:
            if base_logits is None:
                raise ValueError(f"{self!r} compares with the base run: pass base_logits= (the unablated run's logits)")
            if base_logits.shape != logits.shape:
                raise ValueError(
                    f"base_logits have shape {tuple(base_logits.shape)} but the logits have {tuple(logits.shape)}"
                )
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(logits.shape[:2]):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the logits are [batch pos] = "
                f"{tuple(logits.shape[:2])}"
            )
        if self.columns is not None and self.columns[-1] >= logits.shape[-1]:
            raise ValueError(
                f"{self!r} reads token id {self.columns[-1]}, but the logits have a vocabulary of {logits.shape[-1]}"
            )
        base = self.reduce(base_logits, attention_mask) if self.needs_base else None
        return self.compute(self.reduce(logits, attention_mask), base, attention_mask)

    def reduce(
        self, logits: Float[Tensor, "batch pos d_vocab"], attention_mask: Tensor | None = None
    ) -> Float[Tensor, "batch _ _"]:
        """The part of full logits that `compute` reads: [batch, 1 or pos, len(columns) or d_vocab]. With
        position -1, each row's last real token (`attention_mask`: right padding leaves the last column
        padding for the shorter prompts)."""
        if self.position == -1:
            logits = last_real(logits, attention_mask)
        if self.columns is not None:
            logits = logits[..., torch.tensor(self.columns, device=logits.device)]
        return logits

    def _check_reduced(self, logits: Tensor, attention_mask: Tensor | None, n_prompts: int | None) -> None:
        _check_rank(logits, "logits")
        if n_prompts is not None and logits.shape[0] != n_prompts:
            raise ValueError(
                f"{self!r} holds {n_prompts} answers (one per prompt), but the logits have a batch of {logits.shape[0]}"
            )
        if self.position == -1 and logits.shape[1] != 1:
            raise ValueError(
                f"{self!r}.compute takes the last position only ([batch, 1, ...]), got {logits.shape[1]} positions;"
                " call the metric itself on full logits"
            )
        if self.columns is not None and logits.shape[-1] != len(self.columns):
            raise ValueError(
                f"{self!r}.compute takes the logits of its {len(self.columns)} columns, got {logits.shape[-1]};"
                " call the metric itself on full logits"
            )
        if attention_mask is not None:
            expected = (logits.shape[0], logits.shape[1] if self.position is None else attention_mask.shape[1])
            if tuple(attention_mask.shape) != expected:
                raise ValueError(
                    f"attention_mask has shape {tuple(attention_mask.shape)}, expected [batch pos] = {expected}"
                )

    def _over_positions(
        self, values: Float[Tensor, "batch pos"], attention_mask: Tensor | None
    ) -> Float[Tensor, " batch"]:
        if self.position == -1:
            return values[:, 0]
        if attention_mask is None:
            return values.mean(-1)
        real = attention_mask.to(device=values.device, dtype=torch.bool)
        return torch.where(real, values, 0.0).sum(-1) / real.sum(-1)

    def _repr_args(self) -> list[str]:
        return [] if self.position == -1 else [f"position={self.position}"]

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(self._repr_args())})"


# ----------------------------------------------------------------------------- answer metrics
@dataclass(frozen=True, repr=False)
class LogitDiff(_Metric):
    """logit[correct_i] - logit[incorrect_i] per prompt; reads only the answers' columns."""

    correct: tuple[int, ...]  # token id of each prompt's right answer
    incorrect: tuple[int, ...]  # token id of the answer it is compared with
    position: int | None = -1
    prompts: PromptSet | None = field(default=None, kw_only=True, compare=False)  # the prompts they belong to
    columns: tuple[int, ...] = field(init=False)  # sorted unique ids of correct and incorrect
    _correct_columns: tuple[int, ...] = field(init=False, repr=False, compare=False)  # where each sits in columns
    _incorrect_columns: tuple[int, ...] = field(init=False, repr=False, compare=False)

    name: ClassVar[str] = "logit_diff"

    def __post_init__(self):
        _set(self, correct=_as_ids(self.correct, "correct"), incorrect=_as_ids(self.incorrect, "incorrect"))
        if len(self.correct) != len(self.incorrect):
            raise ValueError(
                f"one incorrect answer per correct one: got {len(self.correct)} correct and {len(self.incorrect)} "
                "incorrect"
            )
        _check_position(self.position)
        _check_prompt_count(self.prompts, len(self.correct), "answers")
        columns = tuple(sorted(set(self.correct) | set(self.incorrect)))
        column_of = {token: column for column, token in enumerate(columns)}
        _set(
            self,
            columns=columns,
            _correct_columns=tuple(column_of[t] for t in self.correct),
            _incorrect_columns=tuple(column_of[t] for t in self.incorrect),
        )

    def compute(
        self,
        logits: Float[Tensor, "batch read_pos columns"],
        base_logits: None = None,
        attention_mask: Mask | None = None,
    ) -> Float[Tensor, " batch"]:
        self._check_reduced(logits, attention_mask, len(self.correct))
        logits = _wide(logits)
        diff = _gather(logits, self._correct_columns) - _gather(logits, self._incorrect_columns)
        return self._over_positions(diff, attention_mask)

    def _repr_args(self) -> list[str]:
        return [f"n={len(self.correct)}", *super()._repr_args()]


@dataclass(frozen=True, repr=False)
class _TokenMetric(_Metric):
    """A score of one given token per prompt, read against the whole vocabulary."""

    tokens: tuple[int, ...]  # token id scored for each prompt
    position: int | None = -1
    prompts: PromptSet | None = field(default=None, kw_only=True, compare=False)  # the prompts they belong to

    def __post_init__(self):
        _set(self, tokens=_as_ids(self.tokens, "tokens"))
        _check_position(self.position)
        _check_prompt_count(self.prompts, len(self.tokens), "tokens")

    def compute(
        self,
        logits: Float[Tensor, "batch read_pos d_vocab"],
        base_logits: None = None,
        attention_mask: Mask | None = None,
    ) -> Float[Tensor, " batch"]:
        self._check_reduced(logits, attention_mask, len(self.tokens))
        if max(self.tokens) >= logits.shape[-1]:
            raise ValueError(
                f"{self!r} reads token id {max(self.tokens)}, but the logits have a vocabulary of {logits.shape[-1]}"
            )
        return self._over_positions(self._score(_wide(logits)), attention_mask)

    def _score(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, "batch pos"]:
        """The score of each prompt's token at each position (each token metric defines it)."""
        raise TypeError(f"{type(self).__name__} does not define _score")

    def _repr_args(self) -> list[str]:
        return [f"n={len(self.tokens)}", *super()._repr_args()]


class Probability(_TokenMetric):
    """softmax(logits)[token_i] per prompt."""

    name: ClassVar[str] = "probability"

    def _score(self, logits):
        return _gather(logits.softmax(-1), self.tokens)


class LogProb(_TokenMetric):
    """log_softmax(logits)[token_i] per prompt."""

    name: ClassVar[str] = "log_prob"

    def _score(self, logits):
        return _gather(logits.log_softmax(-1), self.tokens)


class Rank(_TokenMetric):
    """How many vocabulary entries have a strictly larger logit than token_i: 0 = top; ties share the best rank."""

    name: ClassVar[str] = "rank"

    def _score(self, logits):
        token_logit = _gather(logits, self.tokens)  # [batch, pos]
        return (logits > token_logit[..., None]).sum(-1).float()


# ----------------------------------------------------------------------------- distribution metrics
@dataclass(frozen=True, repr=False)
class KLDiv(_Metric):
    """KL(base || run) = sum_v p_base(v) (log p_base(v) - log p_run(v)), per prompt."""

    position: int | None = -1

    name: ClassVar[str] = "kl_div"
    needs_base: ClassVar[bool] = True

    def __post_init__(self):
        _check_position(self.position)

    def compute(
        self,
        logits: Float[Tensor, "batch read_pos d_vocab"],
        base_logits: Float[Tensor, "batch read_pos d_vocab"] | None = None,
        attention_mask: Mask | None = None,
    ) -> Float[Tensor, " batch"]:
        self._check_reduced(logits, attention_mask, None)
        if base_logits is None:
            raise ValueError(f"{self!r} compares with the base run: pass base_logits")
        if base_logits.shape != logits.shape:
            raise ValueError(
                f"base_logits have shape {tuple(base_logits.shape)} but the logits have {tuple(logits.shape)}"
            )
        log_p_run = _wide(logits).log_softmax(-1)
        log_p_base = _wide(base_logits).log_softmax(-1)
        p_base = log_p_base.exp()
        # A token the base run gives probability 0 adds 0, not 0 * (-inf - x) = nan.
        per_position = torch.where(p_base > 0, p_base * (log_p_base - log_p_run), 0.0).sum(-1)
        return self._over_positions(per_position, attention_mask)


@dataclass(frozen=True, repr=False, eq=False)
class Loss(_Metric):
    """Each prompt's mean next-token cross-entropy over its real targets (as HookedTransformer.loss, per prompt)."""

    tokens: Int[Tensor, "batch pos"]  # the inputs of the run whose logits are scored
    mask: Mask | None = None  # their attention mask (kept as bool); a call's attention_mask overrides it
    prompts: PromptSet | None = field(default=None, kw_only=True)  # `tokens` as `check_prompts` compares them

    name: ClassVar[str] = "loss"
    position: ClassVar[None] = None

    def __post_init__(self):
        tokens = torch.as_tensor(self.tokens)
        tokens = tokens[None] if tokens.ndim == 1 else tokens
        if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(
                f"loss needs integer token ids [batch pos], got {tokens.dtype} of shape {tuple(tokens.shape)}"
            )
        if tokens.shape[1] < 2:
            raise ValueError(f"loss needs at least 2 positions (one input and its next token), got {tokens.shape[1]}")
        mask = self.mask
        if mask is not None:
            mask = torch.as_tensor(mask).to(torch.bool)
            mask = mask[None] if mask.ndim == 1 else mask
            if mask.shape != tokens.shape:
                raise ValueError(
                    f"the attention mask has shape {tuple(mask.shape)} but the tokens have {tuple(tokens.shape)}"
                )
            if bool((mask[:, 1:] & mask[:, :-1]).sum(-1).min() == 0):
                raise ValueError("a prompt has fewer than 2 real tokens, so no next token to predict")
            mask = None if bool(mask.all()) else mask
        _set(self, tokens=tokens.long(), mask=mask)
        _check_prompt_count(self.prompts, tokens.shape[0], "token rows")

    def compute(
        self,
        logits: Float[Tensor, "batch pos d_vocab"],
        base_logits: None = None,
        attention_mask: Mask | None = None,
    ) -> Float[Tensor, " batch"]:
        self._check_reduced(logits, attention_mask, None)
        if tuple(logits.shape[:2]) != tuple(self.tokens.shape):
            raise ValueError(
                f"{self!r} scores tokens of shape {tuple(self.tokens.shape)}, but the logits are for "
                f"{tuple(logits.shape[:2])}"
            )
        if int(self.tokens.max()) >= logits.shape[-1]:
            raise ValueError(
                f"{self!r} has token id {int(self.tokens.max())}, but the logits have a vocabulary of "
                f"{logits.shape[-1]}"
            )
        tokens = self.tokens.to(logits.device)
        log_probs = _wide(logits[:, :-1]).log_softmax(-1)
        per_token = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch, pos - 1]
        mask = attention_mask if attention_mask is not None else self.mask
        if mask is None:
            return per_token.mean(-1)
        real = mask.to(device=logits.device, dtype=torch.bool)
        # A target counts when it and the position predicting it are both real tokens.
        targets = real[:, 1:] & real[:, :-1]
        return torch.where(targets, per_token, 0.0).sum(-1) / targets.sum(-1)

    def _repr_args(self) -> list[str]:
        return [f"n={self.tokens.shape[0]}"]


# ----------------------------------------------------------------------------- constructors
def logit_diff(
    model,
    correct: Answers | Task,
    incorrect: Answers | None = None,
    position: int | None = -1,
    *,
    prompts: Prompts | None = None,
) -> LogitDiff:
    """logit[correct_i] - logit[incorrect_i] per prompt, at the last position.

    metric = logit_diff(model, task)   # the task's answers, for the task's prompts (clean or corrupt) only
    metric = logit_diff(model, task.correct, task.incorrect, prompts=tokens)   # the same, answers given
    metric(logits)   # [batch] float32

    Strings need the model; ids don't, unless `prompts` (text or ids, or a task) is given.
    """
    if isinstance(correct, Task):
        if incorrect is not None or prompts is not None:
            raise TypeError(
                "logit_diff(model, task) takes the answers and the prompts from the task: pass no incorrect= or"
                " prompts=, or pass the answers themselves"
            )
        correct, incorrect, prompts = correct.correct, correct.incorrect, correct
    elif incorrect is None:
        raise TypeError("logit_diff needs the incorrect answers too: logit_diff(model, correct, incorrect), or a task")
    return LogitDiff(
        _token_ids(model, correct, "correct"),
        _token_ids(model, incorrect, "incorrect"),
        position,
        prompts=_prompt_set(model, prompts),
    )


def probability(
    model, tokens: Answers | Task, position: int | None = -1, *, prompts: Prompts | None = None
) -> Probability:
    """The probability of tokens_i per prompt (softmax over the whole vocabulary): probability(model, [" Paris"]);
    probability(model, task) scores the task's correct answers, for its prompts only."""
    ids, prompt_set = _token_metric_args(model, tokens, prompts, "probability")
    return Probability(ids, position, prompts=prompt_set)


def log_prob(model, tokens: Answers | Task, position: int | None = -1, *, prompts: Prompts | None = None) -> LogProb:
    """The log-probability of tokens_i per prompt: log_prob(model, task.correct, prompts=task.clean), or
    log_prob(model, task)."""
    ids, prompt_set = _token_metric_args(model, tokens, prompts, "log_prob")
    return LogProb(ids, position, prompts=prompt_set)


def rank(model, tokens: Answers | Task, position: int | None = -1, *, prompts: Prompts | None = None) -> Rank:
    """The 0-based rank of tokens_i among the vocabulary (0 = largest logit; ties share the best rank), as float32;
    rank(model, task) ranks the task's correct answers, for its prompts only."""
    ids, prompt_set = _token_metric_args(model, tokens, prompts, "rank")
    return Rank(ids, position, prompts=prompt_set)


def kl_div(position: int | None = -1) -> KLDiv:
    """KL(base || run) of the next-token distributions: metric(logits, base_logits=clean_logits)."""
    return KLDiv(position)


def loss(model, tokens, attention_mask: Tensor | None = None) -> Loss:
    """Per-prompt mean next-token cross-entropy of the run on `tokens` (text or ids [batch pos]).

    The attention mask of a left-padded batch comes from `attention_mask`, else from the model's
    tokenizer when `tokens` is the tensor `model.to_tokens` returned (or text); a mask passed when the
    metric is called takes precedence.

        metric = loss(model, task.clean)
        metric(model(model.to_tokens(task.clean)))
    """
    if isinstance(tokens, str) or (isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens)):
        if model is None or model.tokenizer is None:
            raise ValueError(
                "loss was given text: pass the model (one with a tokenizer) to tokenize it, or give token ids"
            )
        texts = [tokens] if isinstance(tokens, str) else tokens
        # The tokenizer's own mask: ids alone cannot carry it when a prompt begins with the pad token.
        tokens, text_mask = model.tokenizer.encode_batch(texts, model.default_prepend_bos, model.cfg.n_ctx)
        attention_mask = text_mask if attention_mask is None else attention_mask
    elif not isinstance(tokens, Tensor):
        raise TypeError(f"loss takes text or token ids [batch pos], not {type(tokens).__name__}")
    if attention_mask is None and model is not None:  # read from the ids as every entry point reads them
        attention_mask = model.padding_mask(tokens)
    if model is not None and tokens.numel() and int(tokens.max()) >= model.cfg.d_vocab:
        raise ValueError(
            f"token id {int(tokens.max())} is out of range for the model's vocabulary of {model.cfg.d_vocab}"
        )
    tokens = tokens.detach().cpu()
    attention_mask = None if attention_mask is None else attention_mask.detach().cpu()
    prompts = None if model is None else _prompt_set(model, tokens, attention_mask, "the tokens it scores")
    return Loss(tokens, attention_mask, prompts=prompts)


# ----------------------------------------------------------------------------- which prompts
@dataclass(frozen=True)
class PromptSet:
    """The prompts a metric's answers belong to, as `check_prompts` compares them: each prompt's real token ids
    (padding and a leading BOS left out), for one set of prompts or several (a task's clean and its corrupt ones)."""

    sets: tuple[tuple[tuple[int, ...], ...], ...]
    source: str  # what they are, for error messages ("task Task('ioi', n=8, seed=0)")

    @classmethod
    def of(cls, model, prompts: Prompts, attention_mask: Tensor | None = None, source: str | None = None) -> PromptSet:
        """The prompts `prompts` (a task: its clean and its corrupt prompts; text; token ids) as `model` reads them."""
        if model is None:
            raise ValueError("prompts= needs the model, to read the prompts' tokens and padding as its forward does")
        if isinstance(prompts, Task):
            every = [prompts.clean, prompts.corrupt]
            source = source or f"task {prompts!r}, its clean or its corrupt prompts"
        else:
            every = [prompts]
            source = source or "the prompts given as prompts="
        sets = []
        for one in every:
            tokens, key_valid = model.tokens_and_mask(one, attention_mask, prepend_bos=None)
            sets.append(prompt_rows(model, tokens, key_valid))
        return cls(tuple(sets), source)

    def __repr__(self) -> str:
        return f"PromptSet({len(self.sets[0])} prompts: {self.source})"


def prompt_rows(model, tokens: Tensor, key_valid: Tensor | None) -> tuple[tuple[int, ...], ...]:
    """Each prompt's real token ids, a leading BOS left out: equal for the same prompts however they are padded,
    and with or without the BOS."""
    tokenizer = getattr(model, "tokenizer", None)
    bos = None if tokenizer is None else tokenizer.bos_token_id
    rows = tokens.tolist()
    if key_valid is not None:
        valid = key_valid.tolist()
        rows = [[t for t, real in zip(row, keep, strict=True) if real] for row, keep in zip(rows, valid, strict=True)]
    return tuple(tuple(row[1:] if row and row[0] == bos else row) for row in rows)


def check_prompts(metric, model, tokens: Tensor, key_valid: Tensor | None, caller: str) -> None:
    """Refuse prompts other than those `metric` was built for (its `prompts`, when it has them), before anything
    runs: the answers of one prompt set read on another give numbers that look fine and mean nothing."""
    bound = getattr(metric, "prompts", None)
    if not isinstance(bound, PromptSet):
        return
    given = prompt_rows(model, tokens, key_valid)
    if any(given == rows for rows in bound.sets):
        return
    built = bound.sets[0]
    if len(given) != len(built):
        differs = f"these are {len(given)} prompts, those {len(built)}"
    else:
        row = next(i for i, (a, b) in enumerate(zip(given, built, strict=True)) if a != b)
        differs = f"prompt {row} here is {_text(model, given[row])}, the metric's is {_text(model, built[row])}"
    fix = (
        "metrics.loss(model, these prompts)"
        if isinstance(metric, Loss)
        else f"metrics.{metric.name}(model, task) with these prompts' task, or prompts= these prompts"
    )
    raise ValueError(
        f"{caller}: the metric {metric!r} was built for other prompts ({bound.source}): {differs}. Its answers"
        f" belong to those prompts, so on these it would read the wrong logits; build it for these: {fix}"
    )


def bound_to(metric, model, clean, corrupt, attention_mask: Tensor | None, source: str):
    """`metric` bound to the prompts `clean` (and `corrupt`) when it reads answers and holds no prompts yet
    (see `check_prompts`); any other metric as it is."""
    if not isinstance(metric, (LogitDiff, _TokenMetric)) or metric.prompts is not None:
        return metric
    sets = []
    for one in (clean, corrupt):
        if one is not None:
            tokens, key_valid = model.tokens_and_mask(one, attention_mask, prepend_bos=None)
            sets.append(prompt_rows(model, tokens, key_valid))
    return replace(metric, prompts=PromptSet(tuple(sets), source))


def _text(model, row: tuple[int, ...]) -> str:
    tokenizer = getattr(model, "tokenizer", None)
    text = repr(tokenizer.decode(list(row))) if tokenizer is not None else f"token ids {list(row)}"
    return text if len(text) <= 120 else text[:117] + "..."


def _prompt_set(model, prompts: Prompts | None, attention_mask: Tensor | None = None, source: str | None = None):
    return None if prompts is None else PromptSet.of(model, prompts, attention_mask, source)


def _token_metric_args(model, tokens: Answers | Task, prompts: Prompts | None, name: str):
    """The token ids and the PromptSet of a token metric given answers (and prompts), or a task."""
    if isinstance(tokens, Task):
        if prompts is not None:
            raise TypeError(f"{name}(model, task) takes the prompts from the task: pass no prompts=")
        tokens, prompts = tokens.correct, tokens
    return _token_ids(model, tokens, "tokens"), _prompt_set(model, prompts)


def _check_prompt_count(prompts: PromptSet | None, n: int, what: str) -> None:
    if prompts is not None and len(prompts.sets[0]) != n:
        raise ValueError(f"the metric has {n} {what} (one per prompt), but {len(prompts.sets[0])} prompts")


# ----------------------------------------------------------------------------- helpers
def _token_ids(model, answers: Answers, what: str) -> tuple[int, ...]:
    """One token id per prompt from strings (one token each), ints or a LongTensor [batch]."""
    if isinstance(answers, (str, int)) or (isinstance(answers, Tensor) and answers.ndim == 0):
        raise TypeError(
            f"{what}: give one answer per prompt (a list, or a LongTensor [batch]), not the single {answers!r};"
            f" for one answer everywhere write [{answers!r}] * batch"
        )
    if isinstance(answers, Tensor):
        if answers.ndim != 1:
            raise ValueError(f"{what} must be a [batch] tensor, got shape {tuple(answers.shape)}")
        answers = answers.tolist()
    resolved: dict[str, int] = {}
    ids = []
    for i, answer in enumerate(answers):
        if isinstance(answer, str):
            if answer not in resolved:
                resolved[answer] = _single_token(model, answer, f"{what}[{i}]")
            ids.append(resolved[answer])
        else:
            ids.append(_as_id(answer, f"{what}[{i}]"))
    if model is not None:
        too_large = [token for token in ids if token >= model.cfg.d_vocab]
        if too_large:
            raise ValueError(
                f"{what} has token id {too_large[0]}, out of range for the model's vocabulary of {model.cfg.d_vocab}"
            )
    return _as_ids(ids, what)


def _single_token(model, answer: str, what: str) -> int:
    if model is None:
        raise ValueError(f"{what} is the string {answer!r}: pass the model to turn it into a token id, or give ids")
    try:
        return model.to_single_token(answer)
    except ValueError as error:
        raise ValueError(
            f"{what}: {error}; a metric reads one logit per answer, so each must be one token the tokenizer knows"
        ) from None


def _as_ids(values, what: str) -> tuple[int, ...]:
    """A non-empty tuple of non-negative ints: the form a metric keeps its token ids in."""
    ids = tuple(_as_id(value, f"{what}[{i}]") for i, value in enumerate(values))
    if not ids:
        raise ValueError(f"{what} is empty: give one answer per prompt")
    return ids


def _as_id(value, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} is a bool, not a token id")
    try:
        token = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be a token id (int) or a string, not {type(value).__name__} {value!r}") from None
    if token < 0:
        raise ValueError(f"{what} is {token}: token ids are non-negative")
    return token


def _wide(logits: Tensor) -> Tensor:
    """Logits in the precision a metric computes in: float32, or float64 when they are float64."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _gather(values: Float[Tensor, "batch pos columns"], columns: tuple[int, ...]) -> Float[Tensor, "batch pos"]:
    """values[i, p, columns[i]] for every prompt i and position p."""
    index = torch.tensor(columns, device=values.device)[:, None, None].expand(-1, values.shape[1], 1)
    return values.gather(-1, index)[..., 0]


def _check_position(position) -> None:
    if position != -1 and position is not None:
        raise ValueError(f"position must be -1 (the last position) or None (every position), not {position!r}")


def _check_rank(logits, what: str) -> None:
    if not isinstance(logits, Tensor) or logits.ndim != 3:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"a metric takes {what} [batch pos d_vocab]; got {shape}")


def _set(metric, **values) -> None:
    """Normalise fields of a frozen dataclass in __post_init__."""
    for name, value in values.items():
        object.__setattr__(metric, name, value)


__all__ = [
    "Answers",
    "KLDiv",
    "LogProb",
    "LogitDiff",
    "Loss",
    "Metric",
    "PromptSet",
    "Probability",
    "Rank",
    "kl_div",
    "log_prob",
    "logit_diff",
    "loss",
    "check_prompts",
    "probability",
    "prompt_rows",
    "rank",
]
