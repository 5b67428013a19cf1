"""Readings a circuit study takes from every run: attention between named positions, and the logit lens.

    task = tasks.ioi(32, model=model)                 # task.positions: IO, S1, S2, END per prompt
    att = hooked.attention_to_positions(model, task)  # how much END attends to IO, S1 and S2, per head
    att.table()          # DataFrame: one row per (layer, head), one column per name, mean over prompts
    att["IO"]            # [layer head_index]: END -> IO, mean over prompts
    att.values           # [prompt layer head_index name]: each prompt's own value
    att.heatmap("end_attention.png")

    _, cache = model.run_with_cache(task.clean)
    values, labels = hooked.logit_lens(cache, metrics.logit_diff(model, task.correct, task.incorrect))

Positions are positions in each prompt (BOS included, as `task.positions` gives them), so a left-padded
batch reads each prompt at its own columns: `hooked.interventions.positions` turns them into columns with the
forward's position ids and mask, as `positions=` of `hooked.interventions.ablate` does. The pictures are drawn by
`hooked.plot`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from hooked.interventions.metrics import Metric
from hooked.interventions.positions import last_real, per_prompt, positions_mask
from hooked.tables import ResultTable

if TYPE_CHECKING:
    from hooked.cache import ActivationCache
    from hooked.interventions.tasks import Task
    from hooked.models.base import HookedTransformer


@dataclass(frozen=True, eq=False)
class PositionAttention(ResultTable):
    """Attention from one named position (`query`, END by default) to others (`names`), per prompt and head.
    `table()` is indexed by (layer, head), one column per name, the mean over prompts; `to_csv(path)` writes the
    same rows (hooked/tables.py).

    `values[b, l, h, i]` is `pattern[b, h, query_b, names[i]_b]` of `blocks.{l}.attn.hook_pattern`, where
    `query_b` and `names[i]_b` are prompt b's own columns (its padding skipped).
    """

    values: Float[Tensor, "prompt layer head_index name"]  # float32, on the CPU
    names: tuple[str, ...]  # the attended-to positions, in the order of the last axis
    query: str = "END"  # the attending position
    provenance: dict = field(default_factory=dict)  # model, task, prompts

    table_index = ("layer", "head")

    @property
    def mean(self) -> Float[Tensor, "layer head_index name"]:
        """The mean over prompts."""
        return self.values.mean(0)

    def __getitem__(self, name: str) -> Float[Tensor, "layer head_index"]:
        """`query -> name`, the mean over prompts, as a layer x head grid (for `hooked.plot.layer_head_grid`)."""
        if name not in self.names:
            raise KeyError(f"no position {name!r} in this table; its positions are {list(self.names)}")
        return self.mean[..., self.names.index(name)]

    def rows(self) -> list[dict]:
        """One dict per head: layer, head, then the mean attention to each name."""
        mean = self.mean.tolist()
        return [
            {"layer": layer, "head": head, **dict(zip(self.names, values, strict=True))}
            for layer, heads in enumerate(mean)
            for head, values in enumerate(heads)
        ]

    def heatmap(self, path=None, title: str | None = None):
        """One layer x head grid per name, on one colour scale (`hooked.plot.attention_to_positions`)."""
        from hooked.plot import attention_to_positions as draw

        return draw(self, path=path, title=title)

    def __repr__(self) -> str:
        prompts, layers, heads, _ = self.values.shape
        return (
            f"PositionAttention({self.query} -> {', '.join(self.names)}: {prompts} prompts x {layers} layers"
            f" x {heads} heads)"
        )


def attention_to_positions(
    model: HookedTransformer,
    task: Task,
    names: Sequence[str] | None = None,
    query: str = "END",
    prepend_bos: bool | None = None,
    batch_size: int | None = None,
) -> PositionAttention:
    """How much `query` (END: each prompt's last token) attends to each of `names`, for every head.

        att = hooked.attention_to_positions(model, tasks.ioi(32, model=model))
        att.table().sort_values("IO", ascending=False).head()   # the heads that read the indirect object

    Runs `task.clean` (left-padded, `batch_size` prompts a forward; None: all in one) and reads
    `blocks.{l}.attn.hook_pattern` at each prompt's own columns. `names` defaults to every position of
    `task.positions` but the query, sorted (IO, S1, S2 for `ioi`). The positions are checked against
    this model's tokenizer where the task recorded where its names are, so positions made for another
    tokenizer, or with another `prepend_bos`, raise instead of reading the wrong tokens.
    """
    positions = _task_positions(task)
    names = tuple(sorted(name for name in positions if name != query)) if names is None else tuple(names)
    if isinstance(names, str) or not names:
        raise ValueError(f"names= takes a non-empty list of position names, e.g. {sorted(positions)}")
    for name in (query, *names):
        if name not in positions:
            raise ValueError(
                f"task {task.name!r} has no position {name!r}; its positions are {list(positions)}"
                " (task.positions, filled by task.with_positions(model))"
            )
    _check_tokenizer(model, task, (query, *names), prepend_bos)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int or None, not {batch_size!r}")
    step = batch_size or len(task)
    chunks = [
        _read_attention(model, task[start : start + step], names, query, prepend_bos)
        for start in range(0, len(task), step)
    ]
    provenance = {
        "model": getattr(model, "name_or_path", None),
        "task": repr(task),
        "prompts": len(task),
        "hook": "blocks.{l}.attn.hook_pattern",
    }
    return PositionAttention(torch.cat(chunks), names, query, provenance)


def _task_positions(task: Task) -> dict[str, Tensor]:
    if task.token_positions is None:
        raise ValueError(
            f"task {task.name!r} has no token positions: they depend on the model's tokenizer; make the task with"
            f" tasks.{task.name}(..., model=model) or pass task.with_positions(model)"
        )
    return task.token_positions


def _check_tokenizer(model, task: Task, used: tuple[str, ...], prepend_bos: bool | None) -> None:
    """Raise if the task's positions are not where this model's tokens put the recorded names."""
    if not task.per_prompt.get("spans") or model.tokenizer is None:
        return  # nothing to check them against: positions given by hand are taken as they are
    expected = task.with_positions(model, prepend_bos).token_positions
    for name in used:
        if name not in expected:
            continue
        given, here = task.token_positions[name], expected[name]
        if not torch.equal(given, here):
            row = int((given != here).nonzero()[0])
            raise ValueError(
                f"task.positions[{name!r}] do not match this model's tokens: prompt {row} has {name} at position"
                f" {int(here[row])} here, but the task says {int(given[row])}. They were made for another tokenizer"
                f" or another prepend_bos; remake them with task.with_positions(model), or pass the prepend_bos"
                f" they were made with"
            )


def _read_attention(model, task: Task, names: tuple[str, ...], query: str, prepend_bos: bool | None) -> Tensor:
    """[prompt layer head_index name] for one forward over `task.clean`."""
    positions = task.token_positions
    columns: dict[str, Tensor] = {}
    per_layer: dict[int, Tensor] = {}

    def column_of(name: str, hook) -> Tensor:
        """[batch] the column holding each prompt's `name` position (the padding-aware rule of positions=)."""
        at = positions_mask(
            per_prompt(positions[name]),
            hook.position_ids,
            hook.attention_mask,
            hook.rows.prompt_lengths(),
            what=f"task.positions[{name!r}]",
        )  # [batch pos]
        return at.int().argmax(-1)

    def read(pattern: Float[Tensor, "batch head_index query_pos key_pos"], hook) -> None:
        if not columns:
            columns["query"] = column_of(query, hook)
            columns["keys"] = torch.stack([column_of(name, hook) for name in names], -1)  # [batch name]
        batch, n_heads = pattern.shape[:2]
        from_query = pattern[
            torch.arange(batch, device=pattern.device), :, columns["query"]
        ]  # [batch head_index key_pos]
        keys = columns["keys"][:, None, :].expand(batch, n_heads, len(names))
        per_layer[hook.layer()] = from_query.gather(-1, keys).float().cpu()  # [batch head_index name]

    hook_names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        model.run_with_hooks(
            task.clean, prepend_bos=prepend_bos, return_type=None, fwd_hooks=[(name, read) for name in hook_names]
        )
    return torch.stack([per_layer[layer] for layer in range(model.cfg.n_layers)], 1)


def logit_lens(
    cache: ActivationCache,
    metric: Metric | Callable[[Tensor], Tensor],
) -> tuple[Float[Tensor, "point batch"], list[str]]:
    """The metric read off the residual stream before each block and after the last: the logit lens.

        _, cache = model.run_with_cache(task.clean)
        values, labels = hooked.logit_lens(cache, metrics.logit_diff(model, task.correct, task.incorrect))
        values[-1]     # the model's own logit difference; labels: "0_pre", "1_pre", ..., "final_post"

    Each point of `cache.accumulated_resid()` at each prompt's last token goes through the final norm (its
    own statistics) and the unembedding, as the model's output does. A `hooked.interventions.metrics` metric reads only
    its answer columns; one that compares with a base run (`metrics.kl_div()`) is given the model's own
    final logits. Any other callable gets the full logits of the last token, [batch 1 d_vocab], and must
    return [batch]. Returns ([point batch] float32, labels).
    """
    model = cache.model
    if isinstance(metric, Metric) and metric.position != -1:
        raise ValueError(
            f"the logit lens reads each prompt's last token; make {metric!r} with position=-1 (the default)"
        )
    mask = cache.attention_mask if cache.has_batch_dim else None
    if mask is not None and not bool(mask[:, -1].all()):  # right padding: each prompt's last real token
        every, labels = cache.accumulated_resid(return_labels=True)  # [point batch pos d_model]
        resid = torch.stack([last_real(point, mask)[:, 0] for point in every])  # [point batch d_model]
    else:
        resid, labels = cache.accumulated_resid(pos_slice=-1, return_labels=True)  # [point batch d_model]
    if not cache.has_batch_dim:
        resid = resid[:, None]
    columns = None
    if isinstance(metric, Metric) and metric.columns is not None:
        columns = torch.tensor(metric.columns, device=resid.device)
    values = []
    with torch.no_grad():
        final = model.logits_from_resid(resid[-1][:, None], columns)  # [batch 1 d_vocab or columns]: the model's logits
        for point in range(resid.shape[0]):
            logits = model.logits_from_resid(resid[point][:, None], columns)
            if isinstance(metric, Metric):
                value = metric.compute(logits, final if metric.needs_base else None)
            else:
                value = metric(logits)
            if not isinstance(value, Tensor) or value.shape != (resid.shape[1],):
                shape = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(
                    f"a metric must return one value per prompt, a [batch] tensor of {resid.shape[1]}; got {shape}"
                )
            values.append(value.float())
    return torch.stack(values).cpu(), labels


__all__ = ["PositionAttention", "attention_to_positions", "logit_lens"]
