"""The pictures a circuit study draws every day, as matplotlib figures saved to files, and circuitsvis views.

    from hooked import plot
    plot.attention_pattern(cache["pattern", 2][0, 2], model.to_str_tokens(prompt), "L2H2.png")
    plot.layer_head_grid(att["IO"], "end_to_io.png", title="END -> IO")   # any [n_layers n_heads] tensor
    plot.attention_to_positions(att, "end_attention.png")    # a hooked.attention_to_positions table
    plot.logit_lens(cache, metrics.logit_diff(model, task.correct, task.incorrect), "lens.png")
    plot.attention_heads(cache["pattern", 2][0], model.to_str_tokens(prompt), layer=2)   # circuitsvis, in a notebook

Each matplotlib function returns its Figure, open, so a notebook shows it and a script can
`plt.close(figure)`; with a `path` it also writes the file (the format from the suffix: .png, .pdf,
.svg) and, unless a backend is already in use, switches matplotlib to the headless Agg backend before
pyplot is imported, so scripts and tests need no display. matplotlib comes with the `plot` extra
(`pip install 'hooked[plot]'`); circuitsvis, for the interactive `attention_heads` view, with the
`notebooks` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hooked.analysis import PositionAttention
    from hooked.cache import ActivationCache
    from hooked.interventions.metrics import Metric

GRID_ANNOTATE_MAX = 144  # a layer x head grid writes each cell's value when it has at most this many cells


def attention_pattern(pattern, tokens: Sequence[str], path: str | Path | None = None, title: str | None = None):
    """One head's attention over one prompt's tokens, [query_pos key_pos], with the tokens on both axes.

        _, cache = model.run_with_cache(prompt)
        plot.attention_pattern(cache["pattern", 2][0, 2], model.to_str_tokens(prompt), "L2H2.png", title="L2H2")

    `tokens` label the keys; the queries are the last `query_pos` of them. A prompt of a left-padded
    batch holds only its last n columns: pass `pattern[-n:, -n:]` with n = len(tokens).
    """
    pattern = _as_tensor(pattern, "pattern")
    tokens = list(tokens)
    if pattern.ndim != 2:
        raise ValueError(
            f"attention_pattern draws one head's pattern [query_pos key_pos], got shape {list(pattern.shape)};"
            " pick a prompt and a head: cache['pattern', layer][prompt, head]"
        )
    n_queries, n_keys = pattern.shape
    if len(tokens) != n_keys or n_queries > n_keys:
        raise ValueError(
            f"the pattern has {n_queries} query and {n_keys} key positions but {len(tokens)} tokens were given; give"
            " one token per key position (model.to_str_tokens(prompt)); for a prompt of a left-padded batch keep its"
            " own columns, pattern[-n:, -n:] with n = len(tokens)"
        )
    plt = _pyplot(path)
    size = min(30.0, max(4.0, 0.32 * n_keys + 2.0))
    figure, axes = plt.subplots(figsize=(size + 1.0, size * max(n_queries, 2) / n_keys + 1.0))
    image = axes.imshow(pattern.numpy(), cmap="Blues", vmin=0.0, vmax=max(float(pattern.max()), 1e-9))
    labels = [_label(token) for token in tokens]
    axes.set_xticks(range(n_keys), labels, rotation=90, fontsize=8)
    axes.set_yticks(range(n_queries), labels[n_keys - n_queries :], fontsize=8)
    axes.set_xlabel("key: the token attended to")
    axes.set_ylabel("query: the attending token")
    axes.set_title(title or "attention pattern")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    return _finish(figure, path)


def layer_head_grid(
    values, path: str | Path | None = None, title: str | None = None, label: str | None = None, model=None
):
    """Any [n_layers n_heads] tensor (sweep results, attention to a position, head scores) as a grid of cells.

        plot.layer_head_grid(att["IO"], "end_to_io.png", title="END -> IO", model=model)

    Layer 0 is the top row, head 0 the left column; each cell's value is written in it when the grid has
    at most 144 cells. Values of both signs get a diverging scale centred on 0, others a sequential one.
    `label` names the colour bar; `model` checks the shape against its layers and heads.
    """
    values = _grid_values(values, model)
    plt = _pyplot(path)
    n_layers, n_heads = values.shape
    size = (min(30.0, max(4.0, 0.55 * n_heads + 2.5)), min(30.0, max(3.0, 0.45 * n_layers + 1.5)))
    figure, axes = plt.subplots(figsize=size)
    image = _draw_grid(axes, values, *_scale(values))
    figure.colorbar(image, ax=axes, label=label or "")
    axes.set_title(title or "")
    return _finish(figure, path)


def attention_to_positions(table: PositionAttention, path: str | Path | None = None, title: str | None = None):
    """`hooked.attention_to_positions`' table as one layer x head grid per name, side by side, on one scale (0..max).

    plot.attention_to_positions(hooked.attention_to_positions(model, task), "end_attention.png")
    """
    plt = _pyplot(path)
    mean = table.mean  # [layer head_index name]
    n_layers, n_heads, n_names = mean.shape
    width = min(30.0, max(3.0, 0.5 * n_heads + 1.5))
    figure, grid_axes = plt.subplots(
        1, n_names, figsize=(width * n_names + 1.5, min(30.0, max(3.0, 0.45 * n_layers + 1.8))), squeeze=False
    )
    high = max(float(mean.max()), 1e-9)
    for index, (axes, name) in enumerate(zip(grid_axes[0], table.names, strict=True)):
        image = _draw_grid(axes, mean[..., index], "Blues", 0.0, high)
        axes.set_title(f"{table.query} → {name}")
        if index:
            axes.set_ylabel("")
    figure.colorbar(image, ax=list(grid_axes[0]), label="attention (mean over prompts)")
    figure.suptitle(title or f"attention from {table.query}, mean over {table.values.shape[0]} prompts")
    return _finish(figure, path, tight=False)


def logit_lens(
    cache: ActivationCache,
    metric: Metric | Callable[[Tensor], Tensor],
    path: str | Path | None = None,
    title: str | None = None,
):
    """The metric read off the residual stream before each block and after the last (`hooked.logit_lens`),
    one faint line per prompt and their mean in bold.

        _, cache = model.run_with_cache(task.clean)
        plot.logit_lens(cache, metrics.logit_diff(model, task.correct, task.incorrect), "lens.png")
    """
    from hooked.analysis import logit_lens as read

    values, labels = read(cache, metric)  # [point batch]
    name = getattr(metric, "name", None) or getattr(metric, "__name__", "metric")
    plt = _pyplot(path)
    figure, axes = plt.subplots(figsize=(min(30.0, max(5.0, 0.5 * len(labels) + 2.0)), 4.0))
    points = range(len(labels))
    if values.shape[1] > 1:
        axes.plot(points, values.numpy(), color="#9fb8d0", linewidth=0.8, alpha=0.6)
    axes.plot(
        points,
        values.mean(1).numpy(),
        color="#1f4e79",
        linewidth=2.2,
        marker="o",
        label=f"mean over {values.shape[1]} prompts",
    )
    axes.axhline(0.0, color="#888888", linewidth=0.6)
    axes.set_xticks(list(points), labels, rotation=45, ha="right")
    axes.set_xlabel("residual stream read (before each block, then the final one)")
    axes.set_ylabel(name)
    axes.legend(loc="upper left", frameon=False)
    axes.set_title(title or f"logit lens: {name} at the last token")
    return _finish(figure, path)


def attention_heads(patterns, tokens: Sequence[str], layer: int | None = None, head_names: Sequence[str] | None = None):
    """An interactive circuitsvis view of the heads' patterns ([head_index query_pos key_pos], or one head's
    [query_pos key_pos]) over one prompt's tokens; a notebook displays the returned object.

        plot.attention_heads(cache["pattern", 2][0], model.to_str_tokens(prompt), layer=2)   # heads L2H0, L2H1, ...

    `str(view)` is its HTML. Needs circuitsvis: `pip install 'hooked[notebooks]'`.
    """
    try:
        from circuitsvis.attention import attention_heads as view
    except ImportError as error:
        raise ImportError(
            "hooked.plot.attention_heads draws with circuitsvis, which is not installed:"
            " pip install 'hooked[notebooks]' (or pip install circuitsvis)"
        ) from error
    patterns = _as_tensor(patterns, "patterns")
    if patterns.ndim == 2:
        patterns = patterns[None]
    tokens = list(tokens)
    if patterns.ndim != 3 or patterns.shape[-1] != len(tokens) or patterns.shape[-2] != len(tokens):
        raise ValueError(
            f"attention_heads takes [head_index query_pos key_pos] patterns over one prompt's tokens; got shape"
            f" {list(patterns.shape)} for {len(tokens)} tokens (one prompt's: cache['pattern', layer][prompt], and"
            " for a prompt of a left-padded batch its own columns, [:, -n:, -n:] with n = len(tokens))"
        )
    if head_names is None:
        head_names = [f"L{layer}H{head}" if layer is not None else f"H{head}" for head in range(patterns.shape[0])]
    elif len(head_names) != patterns.shape[0]:
        raise ValueError(f"{len(head_names)} head_names for {patterns.shape[0]} heads; give one name per head")
    return view(attention=patterns, tokens=tokens, attention_head_names=list(head_names))


# ----------------------------------------------------------------------------- shared drawing
def _pyplot(path):
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _finish(figure, path, tight: bool = True, dpi: int = 120):
    """Lay the figure out and save it to `path` (its folder made) when given; returns the figure."""
    if tight:
        figure.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=dpi, bbox_inches="tight")
    return figure


def _as_tensor(values, what: str) -> Tensor:
    """A float32 CPU tensor of a tensor, array or nested list."""
    try:
        tensor = torch.as_tensor(values.detach() if isinstance(values, Tensor) else values)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{what} must be a tensor, an array or a nested list of numbers, not {type(values).__name__}"
        ) from error
    return tensor.float().cpu()


def _grid_values(values, model) -> Tensor:
    values = _as_tensor(values, "values")
    expected = None if model is None else (model.cfg.n_layers, model.cfg.n_heads)
    if values.ndim != 2 or (expected is not None and tuple(values.shape) != expected):
        shape = f"[{expected[0]} {expected[1]}] (n_layers n_heads)" if expected else "[n_layers n_heads]"
        hint = ""
        if expected is not None and tuple(values.shape) == expected[::-1]:
            hint = "; it is [n_heads n_layers]: pass values.T"
        elif values.ndim > 2:
            hint = "; reduce the other axes first, e.g. the mean over prompts (values.mean(0)) or one position"
        elif values.ndim < 2:
            hint = "; a flat list of heads is values.reshape(n_layers, n_heads)"
        raise ValueError(f"layer_head_grid takes a {shape} tensor, got shape {list(values.shape)}{hint}")
    return values


def _scale(values: Tensor) -> tuple[str, float, float]:
    """Colour map and limits: diverging around 0 when the values have both signs, else sequential."""
    finite = values[values.isfinite()]
    if finite.numel() == 0:
        return "Blues", 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if low < 0 < high:
        limit = max(-low, high)
        return "RdBu_r", -limit, limit
    if high <= 0:
        return "Blues_r", min(low, -1e-9), 0.0
    return "Blues", 0.0, max(high, 1e-9)


def _draw_grid(axes, values: Tensor, cmap: str, low: float, high: float):
    n_layers, n_heads = values.shape
    image = axes.imshow(values.numpy(), cmap=cmap, vmin=low, vmax=high, aspect="auto")
    axes.set_xticks(range(n_heads), [str(head) for head in range(n_heads)])
    axes.set_yticks(range(n_layers), [str(layer) for layer in range(n_layers)])
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    if values.numel() <= GRID_ANNOTATE_MAX:
        middle = (low + high) / 2
        for layer in range(n_layers):
            for head in range(n_heads):
                value = float(values[layer, head])
                if value != value:  # NaN: a cell with no value stays blank
                    continue
                dark = value > middle if cmap == "Blues" else abs(value) > 0.6 * max(abs(low), abs(high))
                axes.text(
                    head,
                    layer,
                    f"{value:.2g}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
    return image


def _label(token: str) -> str:
    """A token as a tick label: newlines and tabs shown escaped, `$` not read as mathtext."""
    return token.replace("\n", "\\n").replace("\t", "\\t").replace("$", r"\$")


__all__ = ["attention_heads", "attention_pattern", "attention_to_positions", "layer_head_grid", "logit_lens"]
