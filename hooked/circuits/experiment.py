"""One clean/corrupt experiment: the prompts checked once, both runs recorded once, edge masks scored in batches.

Every public function of `hooked.circuits` starts here, so they share one set of checks (prompts of the
same shape and padding, no outside hook registered, a metric the sweep machinery can read) and one
definition of "the value of an edge mask": the metric, per prompt, on the clean prompts with the
masked edges patched (`hooked.circuits.engine`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.circuits.engine import (
    Ablation,
    Run,
    Where,
    columns_at,
    patched_values,
    record,
    rows_per_forward,
    run_masks,
)
from hooked.circuits.graph import Graph, graph
from hooked.interventions.metrics import check_prompts
from hooked.interventions.row_blocks import Prompts, registered_hooks
from hooked.interventions.sweeps import MetricReads
from hooked.layers import position_ids_for

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


@dataclass
class Experiment:
    model: HookedTransformer
    graph: Graph
    prompts: Prompts
    corrupt_tokens: Tensor | None
    metric: Callable
    reads: MetricReads
    clean: Run
    corrupt: Run | None
    ablation: Ablation
    patched: Tensor
    max_bytes: int | None = None
    where: Where | None = None  # every mask patched at these positions only (`engine.columns_at`); None: all

    @classmethod
    def of(
        cls,
        model: HookedTransformer,
        clean,
        corrupt,
        metric: Callable,
        ablation: Ablation = "corrupt",
        attention_mask: Tensor | None = None,
        max_bytes: int | None = None,
        caller: str = "hooked.circuits",
        positions: tuple[Where, ...] = (),
        g: Graph | None = None,
        where: Where | None = None,
    ) -> Experiment:
        """`positions`: where position-aware edges will be patched, checked against the prompts before any run;
        `g`: the model's graph, where the caller built it already; `where`: patch every mask of `values` at
        these positions only (discovery over position-aware edges)."""
        if getattr(model, "tensor_parallel", False):
            raise RuntimeError(f"{caller} runs on one process; load the model without tp= (docs/scaling.md)")
        registered_hooks(model, caller, part_of_model=False)
        reads = MetricReads.of(metric, model)
        tokens, key_valid = model.tokens_and_mask(clean, attention_mask, prepend_bos=None)
        check_prompts(metric, model, tokens, key_valid, caller)
        corrupt_tokens = None
        if corrupt is not None:
            corrupt_tokens, corrupt_valid = model.tokens_and_mask(corrupt, attention_mask, prepend_bos=None)
            check_paired(tokens, key_valid, corrupt_tokens, corrupt_valid)
        elif ablation != "zero":
            raise ValueError(
                f"{caller}: ablation={ablation!r} reads the corrupt prompts; pass them, or use ablation='zero'"
            )
        g = graph(model) if g is None else g
        prompts = Prompts(tokens, position_ids_for(tokens, key_valid), key_valid)
        for selected in (*positions, *([] if where is None else [where])):
            columns_at(prompts, selected)  # a position some prompt lacks, or per-prompt positions of another batch
        clean_run = record(model, g, prompts, reads)
        corrupt_run = None
        if corrupt_tokens is not None:
            corrupt_run = record(model, g, Prompts(corrupt_tokens, prompts.position_ids, key_valid), reads)
        patched = patched_values(ablation, clean_run, corrupt_run, key_valid)
        experiment = cls(
            model,
            g,
            prompts,
            corrupt_tokens,
            metric,
            reads,
            clean_run,
            corrupt_run,
            ablation,
            patched,
            max_bytes,
            where,
        )
        experiment.evaluate(clean_run.reduced, "on the clean run")  # a metric that fails there, before any variant
        return experiment

    @property
    def key_valid(self) -> Tensor | None:
        return self.prompts.key_valid

    def evaluate(self, reduced: Tensor, what: str = "") -> Tensor:
        """The metric per prompt, float32, for reduced logits of B rows; `what` names the run for a NaN's error."""
        return self.reads.evaluate(reduced, self.clean.reduced, self.key_valid, what).float()

    @property
    def clean_values(self) -> Tensor:
        return self.evaluate(self.clean.reduced, "on the clean run").cpu()

    @property
    def corrupt_values(self) -> Tensor:
        if self.corrupt is None:
            raise ValueError("this experiment has no corrupt prompts")
        return self.evaluate(self.corrupt.reduced, "on the corrupt run").cpu()

    def values(
        self, masks: Tensor, at_positions: dict[Where, Tensor] | None = None, names: Sequence[str] | None = None
    ) -> Tensor:
        """The metric [V, B] with the edges of each mask [V, n_sources, n_receivers] patched (and those of
        `at_positions[p]`, [V, ...] each, at positions p only: `engine.columns_at`), in batches. `names` says what
        each mask is ("variant 'a'"), for the error a NaN raises."""
        if self.where is not None:  # the masks' edges at `where` only
            masks, at_positions = torch.zeros_like(masks), {self.where: masks, **(at_positions or {})}
        batch = self.prompts.tokens.shape[0]
        per_forward = rows_per_forward(self.model, self.graph, self.prompts, self.max_bytes)
        out = torch.empty(masks.shape[0], batch, dtype=torch.float32)
        for first in range(0, masks.shape[0], per_forward):
            chunk = masks[first : first + per_forward]
            at = {p: m[first : first + per_forward] for p, m in (at_positions or {}).items()}
            reduced = run_masks(self.model, self.graph, self.prompts, chunk, self.patched, self.clean, self.reads, at)
            for i in range(chunk.shape[0]):
                what = f"with {names[first + i]}" if names is not None else f"with edge set {first + i} patched"
                out[first + i] = self.evaluate(reduced[i * batch : (i + 1) * batch], what).cpu()
        return out


def check_paired(tokens: Tensor, key_valid: Tensor | None, corrupt: Tensor, corrupt_valid: Tensor | None) -> None:
    """Clean prompt i and corrupt prompt i are patched token for token: same shape, same padding."""
    if tokens.shape != corrupt.shape:
        raise ValueError(
            f"the clean prompts are {tuple(tokens.shape)} tokens and the corrupt ones {tuple(corrupt.shape)}; an edge"
            " carries corrupt prompt i's value into clean prompt i position by position, so both need the same"
            " [batch pos] (and the same padding)"
        )
    if (key_valid is None) != (corrupt_valid is None) or (
        key_valid is not None and not torch.equal(key_valid, corrupt_valid)
    ):
        raise ValueError(
            "the clean and corrupt prompts are padded differently; each pair must have the same token length"
        )
