"""`ResultTable`: what every analysis result shares, its rows as a table, a CSV file and a dict.

    class EdgeScores(ResultTable):
        table_index = "edge"                                    # the column that names a row
        columns = ("edge", "source", "receiver", "score", "rank")  # fixed columns (None: the first row's keys)

        def rows(self) -> list[dict]: ...                       # the one method a result implements

    scores.table()            # a pandas DataFrame indexed by `table_index` (pandas: `pip install 'hooked[plot]'`)
    scores.to_csv("edges.csv")
    scores.to_dict()          # {"rows": [...]}, unless the result keeps a richer record (SweepResult's values)

pandas is an optional extra, imported only by `table()`; without it `table()` raises an ImportError naming the
install, and `rows()` gives the same rows as a list of dicts.
"""

from __future__ import annotations

import csv
from pathlib import Path


class ResultTable:
    """The base of every result with rows: `table()`, `to_csv(path)` and `to_dict()` from the subclass's `rows()`."""

    table_index: str | tuple[str, ...] | None  # the column(s) naming a row, `table()`'s index; None: numbered rows
    columns: tuple[str, ...] | None = None  # the CSV and DataFrame columns, in order; None: the first row's keys

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [
            what
            for what, absent in (
                ("a rows() method (one dict per row)", cls.rows is ResultTable.rows),
                ("a `table_index` (the column naming a row, or None)", not hasattr(cls, "table_index")),
            )
            if absent
        ]
        if missing:
            raise TypeError(
                f"{cls.__name__} is a ResultTable but lacks {' and '.join(missing)}: table(), to_csv() and"
                " to_dict() are made from them (hooked/tables.py)"
            )

    def rows(self) -> list[dict]:
        """One dict per row, keys the column names."""
        raise NotImplementedError  # never reached: __init_subclass__ refuses a subclass without rows()

    def column_names(self, rows: list[dict]) -> list[str]:
        if self.columns is not None:
            return list(self.columns)
        return list(rows[0]) if rows else []

    def table(self):
        """A pandas DataFrame of `rows()`, indexed by `table_index`."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                f"{type(self).__name__}.table() makes a pandas DataFrame, and pandas is not installed: pip install"
                " 'hooked[plot]' (or pandas); rows() gives the same rows as a list of dicts without it"
            ) from None
        rows = self.rows()
        frame = pd.DataFrame(rows, columns=self.column_names(rows))
        if self.table_index is None:
            return frame
        index = self.table_index
        return frame.set_index(index if isinstance(index, str) else list(index))

    def to_csv(self, path: str | Path) -> Path:
        """`rows()` as a CSV file at `path` (its folder made if needed); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.column_names(rows))
            writer.writeheader()
            writer.writerows(rows)
        return path

    def to_dict(self) -> dict:
        """`{"rows": rows()}`; a result that keeps more than its rows (provenance, per-prompt values) says so itself."""
        return {"rows": self.rows()}
