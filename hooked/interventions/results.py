"""`SweepResult`: per-variant, per-prompt metric values, with the base run and what produced them.

    result.table()             # pandas DataFrame (result.rows() the same rows as dicts, without pandas)
    result.scores["L9H9"]      # mean over prompts
    result.to_csv("heads.csv"); result.to_json("heads.json"); result.save("runs/heads")
    result.heatmap("heads.png")  # layer x head (or layer x position) grid, from the variant names

pandas and matplotlib are optional (`pip install hooked[plot]`) and imported only by the methods
that need them. `table()` and `to_csv()` are every result's (hooked/tables.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from hooked.interventions import kinds
from hooked.tables import ResultTable

# Variant names of a layer x position grid: "L9@3", "L9.resid_pre@3" (patch.resid_sweep's, "L9@S2" aside).
_POSITION_GRID = (re.compile(r"^L(?P<row>-?\d+)(?:\.[A-Za-z_]+)?@(?P<col>-?\d+)$"), "layer", "position")


def grid_names() -> list[tuple[re.Pattern, str, str]]:
    """The variant names a heatmap understands, (pattern with `row` and `col`, row label, column label): every
    kind of one index (hooked/interventions/kinds.py: "L9H9" layer x head, "L3KV1" layer x key/value head,
    "L9.N12" layer x neuron, "L3.E5" layer x expert, and any declared one), and "L9@3" (layer x position)."""
    grids = []
    for kind in kinds.KINDS.values():
        pattern = kind.grid_pattern()
        if pattern is not None:
            (index,) = kind.indices.values()
            grids.append((pattern, "layer", index.noun))
    return grids + [_POSITION_GRID]


BASE = "base"  # the name of the run without any variant's hooks: the first row of every table


def variant_names(names, what: str = "variant", reserved: tuple[str, ...] = (BASE,)) -> list[str]:
    """`names` as the strings a table shows, refusing two that read the same (`1` and `"1"`), which would
    silently merge two rows, and a reserved name ("base" is the run without any variant)."""
    seen: dict[str, object] = {}
    for name in names:
        text = str(name)
        if text in reserved:
            raise ValueError(
                f"{what} name {name!r} is reserved: {text!r} names the run without any variant (the first"
                f" row of table(), result[{text!r}]); rename the {what}"
            )
        if text in seen:
            raise ValueError(
                f"{what} names {seen[text]!r} and {name!r} are both {text!r} in the table, so one would hide"
                f" the other; give every {what} a distinct name"
            )
        seen[text] = name
    return list(seen)


@dataclass
class SweepResult(ResultTable):
    """One metric value per variant and prompt, the base run's values, and the run's provenance. `table()` and
    `to_csv(path)` hold `rows()` (hooked/tables.py); `to_dict()` / `to_json(path)` the values and provenance."""

    table_index = "variant"

    variants: list[str]
    values: Tensor  # [variant prompt] float32
    base: Tensor  # [prompt] float32: the run without any variant's hooks
    metric: str
    provenance: dict = field(default_factory=dict)

    def __post_init__(self):
        self.variants = variant_names(self.variants)
        if self.values.shape != (len(self.variants), self.base.shape[0]):
            raise ValueError(
                f"values {tuple(self.values.shape)} do not match {len(self.variants)} variants x {self.base.shape[0]} "
                "prompts"
            )

    def __len__(self) -> int:
        return len(self.variants)

    def __getitem__(self, variant: str) -> Tensor:
        """The per-prompt values of one variant, or of the base run (`result["base"]`, as in `table()`)."""
        if variant == BASE:
            return self.base
        try:
            return self.values[self.variants.index(variant)]
        except ValueError:
            raise KeyError(f"no variant {variant!r}; variants are {self.variants[:5]}...") from None

    @property
    def scores(self) -> dict[str, float]:
        """variant -> mean over prompts."""
        return dict(zip(self.variants, self.values.mean(1).tolist(), strict=True))

    @property
    def base_score(self) -> float:
        return float(self.base.mean())

    @property
    def change(self) -> dict[str, float]:
        """variant -> mean change against the base run."""
        return {name: score - self.base_score for name, score in self.scores.items()}

    def rows(self) -> list[dict]:
        """One dict per variant (the base run first): variant, mean, change, and p0, p1, ... per prompt: the rows of
        `table()` and `to_csv(path)`."""

        def row(name: str, values: Tensor) -> dict:
            mean = float(values.mean())
            return {
                "variant": name,
                self.metric: mean,
                "change": mean - self.base_score,
                **{f"p{i}": float(v) for i, v in enumerate(values)},
            }

        return [row(BASE, self.base)] + [
            row(name, values) for name, values in zip(self.variants, self.values, strict=True)
        ]

    def top(self, k: int = 10, by: str = "change") -> list[tuple[str, float]]:
        """The k variants that moved the metric most (largest |change|)."""
        ranked = sorted(self.change.items(), key=lambda item: -abs(item[1]))
        return ranked[:k]

    # ----------------------------------------------------------------- export
    def to_dict(self) -> dict:
        return {
            "metric": self.metric,
            "variants": self.variants,
            "values": self.values.tolist(),
            "base": self.base.tolist(),
            "provenance": self.provenance,
        }

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | Path) -> SweepResult:
        data = json.loads(Path(path).read_text())
        return cls(
            data["variants"],
            torch.tensor(data["values"], dtype=torch.float32),
            torch.tensor(data["base"], dtype=torch.float32),
            data["metric"],
            data["provenance"],
        )

    def save(self, directory: str | Path, name: str = "sweep") -> Path:
        """Write `<name>.csv`, `<name>.json` (values and provenance) and, when the names form a grid and
        matplotlib is installed, `<name>.png` into `directory`."""
        directory = Path(directory)
        self.to_csv(directory / f"{name}.csv")
        self.to_json(directory / f"{name}.json")
        if self.grid() is not None:
            try:
                self.heatmap(directory / f"{name}.png")
            except ImportError:
                pass
        return directory

    # ----------------------------------------------------------------- grids
    def grid(self, value: str = "change") -> tuple[Tensor, str, str, list[int], list[int]] | None:
        """The variants as a [row col] grid (NaN where absent), with axis labels, when every name has
        one of the grid forms (L9H9, L3KV1, L9@3, L9.N12, L3.E5: `grid_names()`); else None."""
        form = self._grid_form()
        if form is None:
            return None
        row_label, col_label, matches = form
        values = self.change if value == "change" else self.scores
        cells = {(int(m["row"]), int(m["col"])): values[name] for m, name in zip(matches, self.variants, strict=True)}
        rows = sorted({r for r, _ in cells})
        cols = sorted({c for _, c in cells})
        grid = torch.full((len(rows), len(cols)), float("nan"))
        for (r, c), v in cells.items():
            grid[rows.index(r), cols.index(c)] = v
        return grid, row_label, col_label, rows, cols

    def _grid_form(self) -> tuple[str, str, list[re.Match]] | None:
        """The first grid form every variant name has: its row and column labels and each name's match."""
        for pattern, row_label, col_label in grid_names():
            matches = [pattern.match(name) for name in self.variants]
            if all(matches):
                return row_label, col_label, matches
        return None

    def heatmap(self, path: str | Path | None = None, value: str = "change", title: str | None = None):
        """Plot the grid of changes (or `value="score"`) as a heatmap; save to `path` if given. Returns the figure."""
        found = self.grid(value)
        if found is None:
            raise ValueError(
                f"the variant names ({self.variants[:3]}...) do not form a grid; name them like {_grid_examples()}"
            )
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        grid, row_label, col_label, rows, cols = found
        limit = float(grid.nan_to_num(0).abs().max()) or 1.0
        figure, axes = plt.subplots(figsize=(max(4, 0.45 * len(cols) + 2), max(3, 0.4 * len(rows) + 1.5)))
        image = axes.imshow(grid.numpy(), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        axes.set_xticks(range(len(cols)), [str(c) for c in cols])
        axes.set_yticks(range(len(rows)), [str(r) for r in rows])
        axes.set_xlabel(col_label)
        axes.set_ylabel(row_label)
        what = "change in" if value == "change" else ""
        axes.set_title(title or f"{what} {self.metric} (base {self.base_score:+.3f})".strip())
        figure.colorbar(image, ax=axes)
        figure.tight_layout()
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, dpi=120)
        return figure

    def __repr__(self) -> str:
        top = ", ".join(f"{name} {change:+.3f}" for name, change in self.top(3))
        return (
            f"SweepResult({len(self)} variants x {self.base.shape[0]} prompts, {self.metric};"
            f" base {self.base_score:+.4f}; top: {top})"
        )


def _grid_examples() -> str:
    """ "L9H9, L9KV9, L9.N9, L9.E9 or L9@3": one name of each grid form."""
    examples = [
        kind.address(9, **dict.fromkeys(kind.indices, 9)) for kind in kinds.KINDS.values() if kind.grid_pattern()
    ]
    return ", ".join(examples) + " or L9@3"


def write_json(path: str | Path, data: dict) -> Path:
    """`data` as indented JSON at `path`, its folder made if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path
