"""The process-wide intern pool: one object for each distinct immutable value that many standing
queries repeat, so that a million compiled queries and their requirements hold each once.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["INTERN_POOL", "SharedValues"]

_V = TypeVar("_V")


class SharedValues:
    """One object for each distinct immutable value passed through it: what a million standing
    queries repeat (word tuples, one-atom requirement clauses) is stored once. Emptied when it
    holds ``limit`` values, so it stays bounded; values already handed out stay valid.

    Examples
    --------
    >>> share = SharedValues(limit=2)
    >>> a = share(("acme",)); b = share(tuple(["acme"]))
    >>> a is b
    True
    """

    __slots__ = ("_table", "limit")

    def __init__(self, limit: int) -> None:
        self._table: dict[Any, Any] = {}
        self.limit = limit

    def __call__(self, value: _V) -> _V:
        found = self._table.get(value)
        if found is None:
            if len(self._table) >= self.limit:
                self._table.clear()
            found = self._table[value] = value
        return found

    def clear(self) -> None:
        """Forget every value (for measuring memory from a clean start)."""
        self._table.clear()


#: The process-wide pool the compiled queries (word tuples, keyword spellings) and their
#: requirements (one-atom clauses) are interned through.
INTERN_POOL = SharedValues(limit=1 << 20)
