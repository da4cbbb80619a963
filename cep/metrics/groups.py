"""What a metric operator keeps for one ``by`` group, and its encoding: the group's windows, the
recent rows per-event sliding windows are computed from, and the history of values ``seen`` asks
about."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from cep.events.watermark import NO_WATERMARK
from cep.metrics.aggregates import (
    SEEN_CAPACITY,
    SEEN_ERROR_RATE,
    SEEN_EXACT_LIMIT,
    Aggregate,
)
from cep.metrics.columns import ValueColumn, concat_columns
from cep.metrics.errors import MetricStateError
from cep.metrics.state import StateReader, StateWriter
from sketches import BloomFilter

__all__ = [
    "GroupState",
    "RowBuffer",
    "SeenHistory",
    "WindowState",
]

_WINDOW_HEAD = struct.Struct("<qqqBq")
"""A window's start, end, last event time, whether it fired and its revision: as ``i64`` x3,
``u8``, ``i64`` of :class:`StateWriter`, in one call."""


class WindowState:
    """One window of one group: its extent, aggregate states and what was reported for it.

    ``revision`` is the revision of the last result computed (-1: none yet); ``last`` the values
    of that result, so a late event that changes nothing produces no correction. A session
    that absorbed a reported session inherits its revision and has ``last = None``.
    """

    __slots__ = ("start", "end", "last_ts", "states", "fired", "revision", "last")

    def __init__(self, start: int, end: int, states: list[Any] | None, last_ts: int = 0) -> None:
        self.start = start
        self.end = end
        self.last_ts = last_ts
        self.states = states
        self.fired = False
        self.revision = -1
        self.last: tuple | None = None

    def write(self, out: StateWriter, aggregates: Sequence[Aggregate]) -> None:
        out.raw(_WINDOW_HEAD.pack(self.start, self.end, self.last_ts, self.fired, self.revision))
        out.value(self.last)
        out.u8(self.states is not None)
        if self.states is not None:
            for aggregate, state in zip(aggregates, self.states, strict=True):
                aggregate.write(out, state)

    @classmethod
    def read(cls, src: StateReader, aggregates: Sequence[Aggregate]) -> WindowState:
        start, end, last_ts, fired, revision = src.unpack(_WINDOW_HEAD)
        fired, last = bool(fired), src.value()
        states = [a.read(src) for a in aggregates] if src.u8() else None
        window = cls(start, end, states, last_ts)
        window.fired, window.revision, window.last = fired, revision, last
        return window


class RowBuffer:
    """The recent rows of a group, sorted by time, from which per-event sliding windows are
    computed (an event's window ``(t - D, t]`` is a slice)."""

    def __init__(self, ts: np.ndarray, columns: list[ValueColumn]) -> None:
        self.ts = ts
        self.columns = columns

    def add(self, ts: np.ndarray, columns: list[ValueColumn]) -> None:
        all_ts = np.concatenate([self.ts, ts])
        order = np.argsort(all_ts, kind="stable")
        self.ts = all_ts[order]
        self.columns = [
            concat_columns(old, new).take(order)
            for old, new in zip(self.columns, columns, strict=True)
        ]

    def drop_before(self, ts: int) -> None:
        cut = int(np.searchsorted(self.ts, ts, side="left"))
        if cut:
            self.ts = self.ts[cut:]
            self.columns = [c.take(np.arange(cut, len(c))) for c in self.columns]

    def write(self, out: StateWriter) -> None:
        out.array(self.ts)
        out.u32(len(self.columns))
        for column in self.columns:
            out.column(column)

    @classmethod
    def read(cls, src: StateReader) -> RowBuffer:
        ts = src.array(np.int64)
        return cls(ts, [src.column() for _ in range(src.u32())])


class SeenHistory:
    """The values a group has shown so far, for ``seen``.

    Recent values are kept with the time each first occurred; once no window that may still
    be evaluated starts before that time, a value is only needed as "seen before", and moves
    to the *older* set: an exact sorted set of hashes while it holds at most
    :data:`SEEN_EXACT_LIMIT` values (no larger than the Bloom filter would be), then the Bloom
    filter. So "occurred before this window's start" is exact up to the Bloom filter's false
    positives, and small groups cost little memory.
    """

    def __init__(self) -> None:
        self.bloom: BloomFilter | None = None
        self.older = np.zeros(0, dtype=np.uint64)
        self.hashes = np.zeros(0, dtype=np.uint64)
        self.first_ts = np.zeros(0, dtype=np.int64)
        self.horizon = NO_WATERMARK

    def add(self, hashes: np.ndarray, ts: np.ndarray) -> None:
        if len(hashes) == 0:
            return
        old = ts < self.horizon
        if old.any():
            self._retire(hashes[old])
            hashes, ts = hashes[~old], ts[~old]
        h = np.concatenate([self.hashes, hashes])
        t = np.concatenate([self.first_ts, ts])
        order = np.lexsort((t, h))
        h, t = h[order], t[order]
        first = np.r_[True, h[1:] != h[:-1]] if len(h) else np.zeros(0, dtype=bool)
        self.hashes, self.first_ts = h[first], t[first]

    def add_one(self, hash_: int, ts: int) -> None:
        """:meth:`add` of one value's hash at ``ts``, by a sorted insert."""
        if ts < self.horizon:
            self._retire(np.array([hash_], dtype=np.uint64))
            return
        at = int(np.searchsorted(self.hashes, np.uint64(hash_)))
        if at < len(self.hashes) and int(self.hashes[at]) == hash_:
            if ts < self.first_ts[at]:
                self.first_ts = self.first_ts.copy()
                self.first_ts[at] = ts
            return
        self.hashes = np.insert(self.hashes, at, np.uint64(hash_))
        self.first_ts = np.insert(self.first_ts, at, ts)

    def fold(self, horizon: int) -> None:
        """Retire values first seen before ``horizon`` to the older set."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        old = self.first_ts < horizon
        if old.any():
            self._retire(self.hashes[old])
            self.hashes, self.first_ts = self.hashes[~old], self.first_ts[~old]

    def _retire(self, hashes: np.ndarray) -> None:
        if self.bloom is not None:
            self.bloom.update(hashes)
            return
        self.older = np.union1d(self.older, hashes)
        if len(self.older) > SEEN_EXACT_LIMIT:
            self.bloom = BloomFilter(SEEN_CAPACITY, SEEN_ERROR_RATE).update(self.older)
            self.older = np.zeros(0, dtype=np.uint64)

    def all_seen_before(self, hashes: np.ndarray | None, start: int) -> bool:
        """Whether every hash occurred before ``start`` (true for no hashes)."""
        if hashes is None or len(hashes) == 0:
            return True
        rest = hashes[~(_members(self.hashes, hashes, self.first_ts < start)
                        | _members(self.older, hashes))]
        if len(rest) == 0:
            return True
        return self.bloom is not None and bool(self.bloom.contains(rest).all())

    def write(self, out: StateWriter) -> None:
        out.blob(b"" if self.bloom is None else self.bloom.to_bytes())
        out.array(self.older)
        out.array(self.hashes)
        out.array(self.first_ts)
        out.i64(self.horizon)

    @classmethod
    def read(cls, src: StateReader) -> SeenHistory:
        history = cls()
        data = src.blob()
        if data:
            try:
                history.bloom = BloomFilter.from_bytes(data)
            except ValueError as error:
                raise MetricStateError(f"seen() history: {error}") from None
        history.older = src.array(np.uint64)
        history.hashes = src.array(np.uint64)
        history.first_ts = src.array(np.int64)
        history.horizon = src.i64()
        if len(history.hashes) != len(history.first_ts):
            raise MetricStateError("seen() history: hashes and times differ in length")
        return history


def _members(
    sorted_set: np.ndarray, hashes: np.ndarray, where: np.ndarray | None = None
) -> np.ndarray:
    """For each hash, whether it is in ``sorted_set`` (at a position ``where`` allows)."""
    if len(sorted_set) == 0:
        return np.zeros(len(hashes), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, hashes), len(sorted_set) - 1)
    found = sorted_set[at] == hashes
    return found if where is None else found & where[at]


class GroupState:
    """Everything the operator keeps for one ``by`` group: its windows by id (a fixed window's
    start, a per-event sliding window's time, a session's number), the rows per-event sliding
    windows are computed from, and one history per ``seen`` aggregate."""

    __slots__ = ("key", "windows", "rows", "history")

    def __init__(self, key: tuple, n_seen: int) -> None:
        self.key = key
        self.windows: dict[int, WindowState] = {}
        self.rows: RowBuffer | None = None
        self.history = [SeenHistory() for _ in range(n_seen)]

    def write(self, out: StateWriter, aggregates: Sequence[Aggregate]) -> None:
        out.value(self.key)
        for history in self.history:
            history.write(out)
        out.u8(self.rows is not None)
        if self.rows is not None:
            self.rows.write(out)
        out.u32(len(self.windows))
        for wid, window in self.windows.items():
            out.i64(wid)
            window.write(out, aggregates)

    @classmethod
    def read(
        cls, src: StateReader, aggregates: Sequence[Aggregate], n_seen: int, key_width: int
    ) -> GroupState:
        key = src.value()
        if not isinstance(key, tuple) or len(key) != key_width:
            raise MetricStateError(f"metric '{src.metric}': malformed group key")
        group = cls(key, 0)
        group.history = [SeenHistory.read(src) for _ in range(n_seen)]
        if src.u8():
            group.rows = RowBuffer.read(src)
        for _ in range(src.u32()):
            wid = src.i64()
            group.windows[wid] = WindowState.read(src, aggregates)
        return group
