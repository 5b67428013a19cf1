"""`hooked.sae.evaluate`: the figures every dictionary user asks for, one row per dictionary.

    table = hooked.sae.evaluate(model, [sae, transcoder], tokens)
    table.table()              # a DataFrame; or the rows themselves: table[0]["loss_recovered"]

Over the real (non-padding) positions of `tokens`, each dictionary spliced alone (`model.run_with_saes`, no error
term) into an otherwise clean forward:

- `l0`: mean number of active features per token;
- `fvu`: fraction of variance unexplained, sum ||y - y'||^2 / sum ||y - mean(y)||^2, with y the clean activation at the
  point the dictionary writes, y' the dictionary's output there (a skip transcoder's skip term included);
- `ce_clean`, `ce_spliced`, `ce_zero_ablated`: the model's mean next-token cross-entropy clean, with the dictionary's
  output in place of the activation it writes, and with that activation zeroed;
- `loss_recovered` = (ce_zero_ablated - ce_spliced) / (ce_zero_ablated - ce_clean): 1 is the clean model, 0 no better
  than zeroing;
- `dead_features`: active on no token; `dense_features`: active on more than `dense_threshold` (10%) of them.

Cross-entropy is averaged over the positions whose token and next token are real, as `return_type="loss"` does.

`exclude_special_tokens` is SAELens' `run_evals` choice (6.54, `evals.py`), off by default here: True leaves the
positions holding the tokenizer's BOS, EOS and pad ids out of every figure (a list: those ids), as `run_evals` does
by default. As there, the dictionary is then spliced only at the other positions (the special ones keep their clean
activation), the zero ablation still zeroes every position, and a cross-entropy term counts when its input token is
not special. The default counts every real token, BOS included, because that is what `run_with_saes` splices: the
figures describe the splice a user runs (docs/saes.md, "Evaluation").
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.sae.dictionary import Dictionary
from hooked.tables import ResultTable

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

COLUMNS = (
    "dictionary",
    "hook_name",
    "hook_name_out",
    "d_sae",
    "l0",
    "fvu",
    "ce_clean",
    "ce_spliced",
    "ce_zero_ablated",
    "loss_recovered",
    "dead_features",
    "dense_features",
    "n_tokens",
)


class EvaluationTable(list, ResultTable):
    """A list of dict rows, one per dictionary (keys: `COLUMNS`), with every result's table forms: `table()` (a
    DataFrame, numbered rows), `to_csv(path)`, `to_dict()` (hooked/tables.py)."""

    table_index = None
    columns = COLUMNS

    def rows(self) -> list[dict]:
        return list(self)

    def to_pandas(self):
        """`table()`, under the name it had first."""
        return self.table()


def evaluate(
    model: HookedTransformer,
    dictionaries,  # a Dictionary or a list of them, checked below
    tokens,
    *,
    attention_mask: Tensor | None = None,
    batch_size: int = 32,
    dense_threshold: float = 0.1,
    exclude_special_tokens: bool | Sequence[int] = False,
) -> EvaluationTable:
    """L0, FVU, cross-entropy clean / spliced / zero-ablated, loss recovered, dead and dense features of each
    dictionary on `tokens` (ids [batch pos], or texts); see the module docstring. `batch_size` rows per forward.
    `exclude_special_tokens=True` (or a list of ids) leaves BOS, EOS and pad positions out as SAELens' `run_evals`
    does by default; the default, False, counts every real token."""
    if isinstance(dictionaries, Dictionary):
        dictionaries = [dictionaries]
    if not isinstance(dictionaries, Sequence) or not dictionaries:
        raise TypeError("dictionaries= is a hooked.sae dictionary or a non-empty list of them")
    for d in dictionaries:
        if not isinstance(d, Dictionary):
            raise TypeError(f"evaluate takes hooked.sae dictionaries (hooked.sae.load(...)), not {type(d).__name__}")
        with model.saes([d]):  # every splice check (hook names, widths, dtype, processing), before any forward
            pass
        broken = [name for name, parameter in d.named_parameters() if not bool(torch.isfinite(parameter).all())]
        if broken:  # a topk's L0 would still read k, beside NaN FVU and cross-entropy
            raise ValueError(
                f"{d!r} has NaN or infinite weights ({', '.join(broken)}): every figure but a TopK's L0 would be NaN."
                " Was it trained on NaN activations? hooked.sae.train refuses them where they enter"
            )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size= is a positive int, not {batch_size!r}")
    ignored = _ignored_ids(model, exclude_special_tokens)  # before any forward
    tokens, valid = model.tokens_and_mask(tokens, attention_mask, None)
    valid = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device) if valid is None else valid
    counted = valid & ~torch.isin(tokens, torch.tensor(ignored, dtype=tokens.dtype, device=tokens.device))
    stats = [_Stats(d) for d in dictionaries]
    written = sorted({d.hook_name_out for d in dictionaries}, key=model.hook_names.index)
    clean_loss = _Mean()
    with torch.no_grad():
        for start in range(0, tokens.shape[0], batch_size):
            rows, mask = tokens[start : start + batch_size], valid[start : start + batch_size]
            keep = counted[start : start + batch_size]
            kwargs = dict(attention_mask=mask, return_type="loss", loss_per_token=True)
            per_token, cache = model.run_with_cache(rows, names_filter=written, **kwargs)
            pairs = mask[:, :-1] & mask[:, 1:] & keep[:, :-1]  # the positions whose loss counts
            clean_loss.add(per_token, pairs)
            for d, stat in zip(dictionaries, stats, strict=True):
                point = d.hook_name_out
                names = [f"{point}.hook_sae_acts_post", f"{point}.hook_sae_output"]
                # SAELens' exclusion splices only the counted positions: the others get their clean activation back
                unspliced = [(point, partial(_restore, cache[point], keep))] if ignored else []
                with model.saes([d], use_error_term=False), model.hooks(fwd_hooks=unspliced):
                    spliced, features = model.run_with_cache(rows, names_filter=names, **kwargs)
                zeroed = model.run_with_hooks(rows, fwd_hooks=[(point, _zero)], **kwargs)
                stat.add(cache[point], features[names[1]], features[names[0]], keep, spliced, zeroed, pairs)
    return EvaluationTable(stat.row(clean_loss.value, dense_threshold) for stat in stats)


def _zero(activation: Tensor, hook) -> Tensor:
    return torch.zeros_like(activation)


def _restore(clean: Tensor, keep: Tensor, activation: Tensor, hook) -> Tensor:
    """The dictionary's output where `keep` [batch pos], the clean activation elsewhere (SAELens' torch.where)."""
    return torch.where(keep.view(*keep.shape, *[1] * (activation.ndim - 2)), activation, clean)


def _ignored_ids(model: HookedTransformer, exclude_special_tokens) -> list[int]:
    """The token ids whose positions evaluate leaves out: none, the tokenizer's special ones (True: SAELens'
    `get_special_token_ids`, its BOS, EOS and pad ids), or the ids given."""
    if exclude_special_tokens is False:
        return []
    if exclude_special_tokens is True:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                "exclude_special_tokens=True reads the special ids from the model's tokenizer, and this model has"
                " none; give the ids: exclude_special_tokens=[0]"
            )
        return sorted(special_token_ids(tokenizer))
    ids = list(exclude_special_tokens) if isinstance(exclude_special_tokens, (list, tuple, set, range)) else None
    if ids is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TypeError(f"exclude_special_tokens is True, False or a list of token ids, not {exclude_special_tokens!r}")
    return sorted(set(ids))


def special_token_ids(tokenizer) -> set[int]:
    """BOS, EOS and pad, the ids SAELens 6.54's `get_special_token_ids` takes (`util.py`: the tokenizer's
    structural special tokens). A pad id hooked's tokenizer filled in (0, for a tokenizer with neither pad nor EOS)
    is no token of the vocabulary's own and is left out."""
    ids = {tokenizer.bos_token_id, tokenizer.eos_token_id}
    if tokenizer.eos_token_id is not None or tokenizer.pad_token_id != 0:
        ids.add(tokenizer.pad_token_id)
    return {i for i in ids if i is not None}


class _Mean:
    """A running mean of per-token values over the positions a mask keeps (float64)."""

    def __init__(self):
        self.total, self.count = 0.0, 0

    def add(self, values: Tensor, keep: Tensor) -> None:
        self.total += float(values.double()[keep].sum())
        self.count += int(keep.sum())

    @property
    def value(self) -> float:
        return self.total / self.count if self.count else float("nan")


class _Stats:
    """One dictionary's running sums over the batches."""

    def __init__(self, d: Dictionary):
        self.d = d
        self.active = torch.zeros(d.cfg.d_sae, dtype=torch.long)
        self.n_tokens, self.l0 = 0, 0
        self.squared_error = 0.0
        self.sum = torch.zeros(d.cfg.d_out, dtype=torch.float64)
        self.sum_squares = 0.0
        self.spliced, self.zeroed = _Mean(), _Mean()

    def add(self, target, output, acts, mask, spliced, zeroed, pairs) -> None:
        y = target[mask].flatten(1).double()  # [tokens d_out] (attn.hook_z's heads flattened)
        y_hat = output[mask].flatten(1).double()
        active = acts[mask] > 0  # [tokens d_sae]
        self.n_tokens += y.shape[0]
        self.l0 += int(active.sum())
        self.active += active.sum(0).cpu()
        self.squared_error += float((y - y_hat).pow(2).sum())
        self.sum += y.sum(0).cpu()
        self.sum_squares += float(y.pow(2).sum())
        self.spliced.add(spliced, pairs)
        self.zeroed.add(zeroed, pairs)

    def row(self, clean: float, dense_threshold: float) -> dict:
        d, n = self.d, self.n_tokens
        variance = self.sum_squares - float(self.sum.pow(2).sum()) / n  # sum ||y - mean||^2
        spliced, zeroed = self.spliced.value, self.zeroed.value
        return {
            "dictionary": d.extra_repr(),
            "hook_name": d.hook_name,
            "hook_name_out": d.cfg.hook_name_out,
            "d_sae": d.cfg.d_sae,
            "l0": self.l0 / n,
            "fvu": self.squared_error / variance if variance > 0 else float("nan"),
            "ce_clean": clean,
            "ce_spliced": spliced,
            "ce_zero_ablated": zeroed,
            "loss_recovered": (zeroed - spliced) / (zeroed - clean) if zeroed != clean else float("nan"),
            "dead_features": int((self.active == 0).sum()),
            "dense_features": int((self.active > dense_threshold * n).sum()),
            "n_tokens": n,
        }
