"""Sorted interval tables: which numeric or time intervals of a field hold a document's value."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping

import numpy as np

from percolator.document import AnalyzedDocument

__all__ = ["IntervalTable", "value_hits"]


#: Interval tables up to this size are stabbed by a Python scan; larger ones through numpy.
_FEW_INTERVALS = 32

#: Beyond this magnitude an integer may not survive conversion to a float, so it is compared
#: with the bounds in Python, exactly, as the evaluator does.
_EXACT_FLOAT = 2**53


class IntervalTable:
    """Intervals of one (kind, field), inclusive, open ends as infinities, sorted by low end."""

    __slots__ = ("pending", "highs", "atoms", "low_list")

    def __init__(self) -> None:
        self.pending: list[tuple[float, float, int]] = []
        self.highs: np.ndarray | None = None
        self.atoms: np.ndarray | None = None
        self.low_list: list[float] = []

    def add(self, low: float | None, high: float | None, atom_id: int) -> None:
        """Add the inclusive interval ``[low, high]`` (None: open) of atom ``atom_id``."""
        self.pending.append((-np.inf if low is None else low, np.inf if high is None else high,
                             atom_id))

    def seal(self) -> None:
        self.pending.sort()
        if len(self.pending) <= _FEW_INTERVALS:
            return
        self.low_list = [low for low, _, _ in self.pending]
        self.highs = np.array([high for _, high, _ in self.pending], dtype=np.float64)
        self.atoms = np.array([atom for _, _, atom in self.pending], dtype=np.int64)

    def stab(self, value: float, hits: set[int]) -> None:
        """Add the atoms of the intervals holding ``value`` to ``hits``."""
        if self.atoms is None or (
            type(value) is int and not -_EXACT_FLOAT <= value <= _EXACT_FLOAT
        ):
            # Python compares an int with a float bound exactly, whatever its size.
            for low, high, atom_id in self.pending:
                if low <= value <= high:
                    hits.add(atom_id)
            return
        assert self.highs is not None
        value = float(value)
        count = bisect_right(self.low_list, value)
        if count:
            hits.update(self.atoms[:count][self.highs[:count] >= value].tolist())


def value_hits(
    doc: AnalyzedDocument,
    intervals: Mapping[tuple[str, str], IntervalTable],
    exists: Mapping[str, int],
    hits: set[int],
) -> None:
    """Add to ``hits`` the atoms of the ``(kind, field)`` intervals holding a value of ``doc``
    and of the fields ``doc`` has (``exists``: field -> its presence atom)."""
    for (kind, field_name), table in intervals.items():
        if doc.has(field_name):
            values = doc.numbers(field_name) if kind == "number" else doc.timestamps(field_name)
            for value in values:
                table.stab(value, hits)
    for field_name, atom_id in exists.items():
        if doc.has(field_name):
            hits.add(atom_id)
