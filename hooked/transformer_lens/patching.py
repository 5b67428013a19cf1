"""TransformerLens 3.9's `patching` module under its names, run as `hooked.sweep`s.

    from hooked import patching                       # was: from transformer_lens import patching
    _, clean_cache = model.run_with_cache(clean_tokens)
    def metric(logits):                                  # TransformerLens' contract: logits -> a scalar
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()
    results = patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)   # [n_layers pos]

Each function has TransformerLens' signature `(model, corrupted_tokens, clean_cache, patching_metric)`,
its output shape and axis order, and its numbers (tests/transformer_lens/test_tl_patching.py compares them on the same
weights). What differs is how they run: TransformerLens runs one forward per patch; here every patch is
a variant of one `hooked.sweep` over the corrupted tokens, so the corrupted run up to a patch's layer is
computed once and the patches run batched (a block of `batch` rows each).

The metric: TransformerLens calls `patching_metric(logits)` on the logits of one patched run (all the
prompts, [batch pos d_vocab]) and takes `.item()`. A sweep wants one value per prompt, so the metric is
wrapped (`ScalarMetric`): it is called on each patch's block of rows (exactly the logits TransformerLens
would pass it) and its scalar is spread over the block. A metric that returns one value per prompt
(hooked's convention) is refused, since TransformerLens would fail on it too: average it first.

Index axes as in TransformerLens: the first index is the layer; `pos`, `dest_pos`, `src_pos` are columns
of `corrupted_tokens`; `head` of k / v is the key/value head on grouped-query models (the `_every`
helpers zero-pad those to n_heads, as TransformerLens does). Source: transformer_lens/patching.py (3.9).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hooked.cache import ActivationCache, act_name
from hooked.hooks import HookPoint
from hooked.interventions.row_blocks import RowsView
from hooked.interventions.sweeps import sweep

if TYPE_CHECKING:
    import pandas as pd

    from hooked.models.base import HookedTransformer

PatchSetter = Callable[[Tensor, Sequence[int], Tensor], Tensor]


# ----------------------------------------------------------------------------- patch setters (TransformerLens')
def layer_pos_patch_setter(corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor) -> Tensor:
    """index = [layer, pos]; activations [batch pos ...]."""
    _, pos = index
    corrupted_activation[:, pos, ...] = clean_activation[:, pos, ...]
    return corrupted_activation


def layer_pos_head_vector_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, pos, head]; activations [batch pos head_index d_head] (q, k, v, z, result)."""
    _, pos, head = index
    corrupted_activation[:, pos, head] = clean_activation[:, pos, head]
    return corrupted_activation


def layer_head_vector_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head]; activations [batch pos head_index d_head], every position."""
    _, head = index
    corrupted_activation[:, :, head] = clean_activation[:, :, head]
    return corrupted_activation


def layer_head_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head]; patterns [batch head_index query_pos key_pos]."""
    _, head = index
    corrupted_activation[:, head] = clean_activation[:, head]
    return corrupted_activation


def layer_head_pos_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head, dest_pos]; patterns [batch head_index query_pos key_pos]."""
    _, head, dest_pos = index
    corrupted_activation[:, head, dest_pos] = clean_activation[:, head, dest_pos]
    return corrupted_activation


def layer_head_dest_src_pos_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head, dest_pos, src_pos]; patterns [batch head_index query_pos key_pos]."""
    _, head, dest_pos, src_pos = index
    corrupted_activation[:, head, dest_pos, src_pos] = clean_activation[:, head, dest_pos, src_pos]
    return corrupted_activation


# ----------------------------------------------------------------------------- the sweep's callables
@dataclass(frozen=True, repr=False)
class SetterPatch:
    """One patch of the sweep: a TransformerLens patch setter at one index, with the clean activation."""

    setter: PatchSetter
    index: tuple[int, ...]
    clean: Tensor  # the clean run's activation at this hook point, all prompts

    def __call__(self, activation: Tensor, hook: HookPoint | RowsView) -> Tensor:
        return self.setter(activation, list(self.index), self.clean.to(activation.device, activation.dtype))

    def __repr__(self) -> str:
        return f"{getattr(self.setter, '__name__', 'setter')}(index={list(self.index)})"


@dataclass(frozen=True)
class ScalarMetric:
    """A TransformerLens metric (logits of one run -> a scalar) as a sweep metric: the scalar of a
    variant's block of rows, repeated once per row."""

    metric: Callable[[Tensor], Tensor | float]

    @property
    def __name__(self) -> str:
        return getattr(self.metric, "__name__", type(self.metric).__name__)

    def __call__(
        self, logits: Tensor, base_logits: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        value = self.metric(logits)
        if isinstance(value, Tensor) and value.numel() != 1:
            raise ValueError(
                f"patching_metric {self.__name__} returned a tensor of shape {list(value.shape)}; TransformerLens'"
                " patching functions take a metric that returns one number for the batch (e.g. .mean() it)"
            )
        value = value.item() if isinstance(value, Tensor) else float(value)
        return torch.full((logits.shape[0],), value, dtype=torch.float32)


# ----------------------------------------------------------------------------- the generic patch
def make_df_from_ranges(column_max_ranges: Sequence[int], column_names: Sequence[str]) -> pd.DataFrame:
    """A dataframe with every combination of `range(n)` for each n, one column per name (needs pandas)."""
    import pandas as pd

    rows = list(itertools.product(*[range(n) for n in column_max_ranges]))
    return pd.DataFrame(rows, columns=list(column_names))


def _axis_ranges(model: HookedTransformer, corrupted_tokens: Tensor, activation_name: str) -> dict[str, int]:
    n_heads = model.cfg.n_heads
    if activation_name in ("k", "v") and getattr(model.cfg, "n_key_value_heads", None) is not None:
        n_heads = model.cfg.n_key_value_heads
    pos = corrupted_tokens.shape[-1]
    return {
        "layer": model.cfg.n_layers,
        "pos": pos,
        "src_pos": pos,
        "dest_pos": pos,
        "head_index": n_heads,
        "head": n_heads,
    }


def generic_activation_patch(
    model: HookedTransformer,
    corrupted_tokens: Int[Tensor, "batch pos"],
    clean_cache: ActivationCache,
    patching_metric: Callable[[Float[Tensor, "batch pos d_vocab"]], Float[Tensor, ""]],
    patch_setter: PatchSetter,
    activation_name: str,
    index_axis_names: Sequence[str] | None = None,
    index_df: pd.DataFrame | None = None,
    return_index_df: bool = False,
) -> Tensor | tuple[Tensor, pd.DataFrame]:
    """The metric after each patch of `activation_name` (`"z"`, `"resid_pre"`, ...) at every index.

    With `index_axis_names` (the first one "layer") every combination is patched and the result has one
    axis per name; with `index_df` (one row per index) the result is flat, one value per row.
    """
    if index_df is None:
        if index_axis_names is None:
            raise ValueError("generic_activation_patch needs index_axis_names or index_df")
        ranges = _axis_ranges(model, corrupted_tokens, activation_name)
        shape = [ranges[name] for name in index_axis_names]
        indices = list(itertools.product(*[range(n) for n in shape]))  # row-major, as the dataframe's rows
        if return_index_df:  # pandas only when asked for (TransformerLens always builds the dataframe)
            index_df = make_df_from_ranges(shape, index_axis_names)
    elif index_axis_names is not None:
        raise ValueError("give index_axis_names or index_df, not both")
    else:
        shape = None  # flat: one value per row of index_df
        indices = [tuple(int(i) for i in row) for row in index_df.itertuples(index=False)]
    variants = {}
    for index in indices:
        name = act_name(activation_name, index[0])
        variants[f"{activation_name}{list(index)}"] = [(name, SetterPatch(patch_setter, index, clean_cache[name]))]
    result = sweep(model, corrupted_tokens, variants, ScalarMetric(patching_metric))
    values = result.values[:, 0].to(model.cfg.device)
    values = values if shape is None else values.reshape(shape)
    return (values, index_df) if return_index_df else values


def _specialise(name: str, setter: PatchSetter, activation_name: str, axes: tuple[str, ...], shape: str):
    def patch(
        model: HookedTransformer,
        corrupted_tokens: Int[Tensor, "batch pos"],
        clean_cache: ActivationCache,
        patching_metric: Callable[[Tensor], Tensor],
        index_axis_names=axes,
        index_df=None,
        return_index_df: bool = False,
    ):
        return generic_activation_patch(
            model,
            corrupted_tokens,
            clean_cache,
            patching_metric,
            setter,
            activation_name,
            None if index_df is not None else index_axis_names,
            index_df,
            return_index_df,
        )

    patch.__name__ = patch.__qualname__ = name
    patch.__doc__ = f"Patch the clean `{activation_name}` into the corrupted run at each index; returns {shape}."
    return patch


_LAYER_POS = ("layer", "pos")
_LAYER_POS_HEAD = ("layer", "pos", "head")
_LAYER_HEAD = ("layer", "head")

get_act_patch_resid_pre = _specialise(
    "get_act_patch_resid_pre", layer_pos_patch_setter, "resid_pre", _LAYER_POS, "[n_layers, pos]"
)
get_act_patch_resid_mid = _specialise(
    "get_act_patch_resid_mid", layer_pos_patch_setter, "resid_mid", _LAYER_POS, "[n_layers, pos]"
)
get_act_patch_attn_out = _specialise(
    "get_act_patch_attn_out", layer_pos_patch_setter, "attn_out", _LAYER_POS, "[n_layers, pos]"
)
get_act_patch_mlp_out = _specialise(
    "get_act_patch_mlp_out", layer_pos_patch_setter, "mlp_out", _LAYER_POS, "[n_layers, pos]"
)

get_act_patch_attn_head_out_by_pos = _specialise(
    "get_act_patch_attn_head_out_by_pos",
    layer_pos_head_vector_patch_setter,
    "z",
    _LAYER_POS_HEAD,
    "[n_layers, pos, n_heads]",
)
get_act_patch_attn_head_q_by_pos = _specialise(
    "get_act_patch_attn_head_q_by_pos",
    layer_pos_head_vector_patch_setter,
    "q",
    _LAYER_POS_HEAD,
    "[n_layers, pos, n_heads]",
)
get_act_patch_attn_head_k_by_pos = _specialise(
    "get_act_patch_attn_head_k_by_pos",
    layer_pos_head_vector_patch_setter,
    "k",
    _LAYER_POS_HEAD,
    "[n_layers, pos, n_key_value_heads]",
)
get_act_patch_attn_head_v_by_pos = _specialise(
    "get_act_patch_attn_head_v_by_pos",
    layer_pos_head_vector_patch_setter,
    "v",
    _LAYER_POS_HEAD,
    "[n_layers, pos, n_key_value_heads]",
)
get_act_patch_attn_head_pattern_by_pos = _specialise(
    "get_act_patch_attn_head_pattern_by_pos",
    layer_head_pos_pattern_patch_setter,
    "pattern",
    ("layer", "head_index", "dest_pos"),
    "[n_layers, n_heads, dest_pos]",
)
get_act_patch_attn_head_pattern_dest_src_pos = _specialise(
    "get_act_patch_attn_head_pattern_dest_src_pos",
    layer_head_dest_src_pos_pattern_patch_setter,
    "pattern",
    ("layer", "head_index", "dest_pos", "src_pos"),
    "[n_layers, n_heads, dest_pos, src_pos]",
)

get_act_patch_attn_head_out_all_pos = _specialise(
    "get_act_patch_attn_head_out_all_pos", layer_head_vector_patch_setter, "z", _LAYER_HEAD, "[n_layers, n_heads]"
)
get_act_patch_attn_head_q_all_pos = _specialise(
    "get_act_patch_attn_head_q_all_pos", layer_head_vector_patch_setter, "q", _LAYER_HEAD, "[n_layers, n_heads]"
)
get_act_patch_attn_head_k_all_pos = _specialise(
    "get_act_patch_attn_head_k_all_pos",
    layer_head_vector_patch_setter,
    "k",
    _LAYER_HEAD,
    "[n_layers, n_key_value_heads]",
)
get_act_patch_attn_head_v_all_pos = _specialise(
    "get_act_patch_attn_head_v_all_pos",
    layer_head_vector_patch_setter,
    "v",
    _LAYER_HEAD,
    "[n_layers, n_key_value_heads]",
)
get_act_patch_attn_head_pattern_all_pos = _specialise(
    "get_act_patch_attn_head_pattern_all_pos",
    layer_head_pattern_patch_setter,
    "pattern",
    ("layer", "head_index"),
    "[n_layers, n_heads]",
)


# ----------------------------------------------------------------------------- every activation type at once
def _pad_heads(results: Tensor, n_heads: int) -> Tensor:
    return torch.nn.functional.pad(results, (0, n_heads - results.shape[-1]))


def get_act_patch_attn_head_all_pos_every(
    model, corrupted_tokens, clean_cache, metric
) -> Float[Tensor, "5 layer head"]:
    """Head patching over all positions for output, query, key, value and pattern: [5, n_layers, n_heads]
    (key/value heads zero-padded to n_heads on grouped-query models)."""
    n_heads = model.cfg.n_heads
    return torch.stack(
        [
            get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_head_q_all_pos(model, corrupted_tokens, clean_cache, metric),
            _pad_heads(get_act_patch_attn_head_k_all_pos(model, corrupted_tokens, clean_cache, metric), n_heads),
            _pad_heads(get_act_patch_attn_head_v_all_pos(model, corrupted_tokens, clean_cache, metric), n_heads),
            get_act_patch_attn_head_pattern_all_pos(model, corrupted_tokens, clean_cache, metric),
        ]
    )


def get_act_patch_attn_head_by_pos_every(
    model, corrupted_tokens, clean_cache, metric
) -> Float[Tensor, "5 layer pos head"]:
    """Head patching by position for output, query, key, value and pattern (by destination): [5, n_layers,
    pos, n_heads]."""
    n_heads = model.cfg.n_heads
    pattern = get_act_patch_attn_head_pattern_by_pos(model, corrupted_tokens, clean_cache, metric)  # [layer head pos]
    return torch.stack(
        [
            get_act_patch_attn_head_out_by_pos(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_head_q_by_pos(model, corrupted_tokens, clean_cache, metric),
            _pad_heads(get_act_patch_attn_head_k_by_pos(model, corrupted_tokens, clean_cache, metric), n_heads),
            _pad_heads(get_act_patch_attn_head_v_by_pos(model, corrupted_tokens, clean_cache, metric), n_heads),
            pattern.transpose(1, 2),
        ]
    )


def get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric) -> Float[Tensor, "3 layer pos"]:
    """Patching the residual stream before each block, each attention output and each MLP output, by
    position: [3, n_layers, pos]."""
    return torch.stack(
        [
            get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_out(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, metric),
        ]
    )
