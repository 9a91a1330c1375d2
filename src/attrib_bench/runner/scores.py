"""Per-example scores kept compactly while a run goes: one float array per (evaluator, kind).

A run over 20,000 examples with a dozen methods and evaluators holds millions of per-example
score vectors; a numpy array and a dict entry of its own for each would cost more than the
numbers. Here each method numbers its examples once (:class:`ExampleIndex`), and each of its
(evaluator, kind) columns is one (examples, layers) float64 array indexed by that number, grown
by doubling: an example costs its L numbers per column.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np


class ExampleIndex:
    """Example id -> row, in the order the examples were first scored; shared by a method's
    columns."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def row(self, example_id: str) -> int:
        return self.rows.setdefault(example_id, len(self.rows))


class ScoreColumn(Mapping[str, np.ndarray]):
    """Example id -> its (L,) scores, stored as rows of one array (see the module doc).

    Reading gives a copy, so a later write never changes what was read.
    """

    def __init__(self, index: ExampleIndex) -> None:
        self.index = index
        self._values_EL: np.ndarray | None = None
        self._present_E = np.zeros(0, dtype=bool)
        self._count = 0

    def __setitem__(self, example_id: str, values: np.ndarray) -> None:
        values_L = np.asarray(values, dtype=float)
        if values_L.ndim != 1:
            raise ValueError(f"scores of one example are (layers,), got shape {values_L.shape}")
        row = self.index.row(example_id)
        if self._values_EL is None:
            self._values_EL = np.full((0, len(values_L)), np.nan)
        if self._values_EL.shape[1] != len(values_L):
            raise ValueError(
                f"{len(values_L)} layers for {example_id!r}, {self._values_EL.shape[1]} before"
            )
        if row >= len(self._present_E):
            size = max(16, 2 * len(self._present_E), row + 1)
            grown = np.full((size, self._values_EL.shape[1]), np.nan)
            grown[: len(self._values_EL)] = self._values_EL
            present = np.zeros(size, dtype=bool)
            present[: len(self._present_E)] = self._present_E
            self._values_EL, self._present_E = grown, present
        self._values_EL[row] = values_L
        self._count += not self._present_E[row]
        self._present_E[row] = True

    def _row(self, example_id: str) -> int | None:
        row = self.index.rows.get(example_id)
        if row is None or row >= len(self._present_E) or not self._present_E[row]:
            return None
        return row

    def __getitem__(self, example_id: str) -> np.ndarray:
        row = self._row(example_id)
        if row is None:
            raise KeyError(example_id)
        return self._values_EL[row].copy()

    def __contains__(self, example_id: object) -> bool:
        return isinstance(example_id, str) and self._row(example_id) is not None

    def __iter__(self) -> Iterator[str]:
        return (i for i, row in self.index.rows.items() if self._row(i) is not None)

    def __len__(self) -> int:
        return self._count
