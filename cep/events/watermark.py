"""Event time for the embedded engine: the watermark, lateness, and the reorder buffer.

Per stream, the watermark is ``max(ts seen) - lateness``; the engine's watermark is the minimum of
that over the streams that have produced events (so a stream that lags is not declared late by a
faster one), never moving backwards. An event is *late* when its time is below the engine's
watermark on arrival. Events wait in a :class:`ReorderBuffer` until the watermark reaches them and
leave it in ``(ts, seq)`` order.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cep.events.time_bounds import unit_hint
from query_lang.timestamps import format_iso_ms

__all__ = [
    "END_OF_INPUT",
    "iso_ms",
    "late_detail",
    "NO_WATERMARK",
    "ReorderBuffer",
    "Watermark",
]

NO_WATERMARK = -(2**63)
"""Watermark before any event: nothing is late yet."""

END_OF_INPUT = 2**63 - 1
"""Watermark at end of input: every buffered event is released, every timer fires."""


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC (``2026-01-01T00:00:00.000Z``), for messages: the
    watermark's sentinels as ``-inf``/``+inf``, a time beyond the year 9999 as ``N ms``."""
    if ms <= NO_WATERMARK:
        return "-inf"
    if ms >= END_OF_INPUT:
        return "+inf"
    try:
        return format_iso_ms(ms)
    except ValueError:
        return f"{ms} ms"


def late_detail(ts: int, watermark: int | None, unit_ms: int | None = None) -> str:
    """The detail of a late event's dead letter, in every engine; ``watermark`` None: the
    event is behind an earlier one in input order. With ``unit_ms`` (the stream's unit of epoch
    numbers), it names the likely unit of a time that reads as one long past (epoch seconds on
    a ``unit ms`` stream land in 1970).

    Examples
    --------
    >>> late_detail(1_732_550_400, 1_764_000_000_000, unit_ms=1)  # doctest: +ELLIPSIS
    'event time 1970-01-21T01:15:50.400Z is behind the watermark ...: drop `unit ms`'
    >>> late_detail(1000, None)
    'event time 1970-01-01T00:00:01.000Z is behind the watermark (input order)'
    """
    hint = unit_hint(ts // unit_ms, unit_ms) if unit_ms else ""
    if watermark is None:
        return f"event time {iso_ms(ts)} is behind the watermark (input order){hint}"
    if watermark >= END_OF_INPUT:
        return f"event time {iso_ms(ts)} arrived after end of input{hint}"
    return f"event time {iso_ms(ts)} is behind the watermark {iso_ms(watermark)}{hint}"


class Watermark:
    """Tracks the engine watermark from the event times seen on each stream.

    Parameters
    ----------
    lateness_ms:
        Stream name -> bounded out-of-orderness in milliseconds.

    Examples
    --------
    >>> wm = Watermark({"txn": 1000})
    >>> wm.observe("txn", 5000)
    False
    >>> wm.current
    4000
    >>> wm.observe("txn", 3999)
    True
    """

    def __init__(self, lateness_ms: Mapping[str, int]) -> None:
        self._lateness = dict(lateness_ms)
        self._max_ts: dict[str, int] = {}
        self._current = NO_WATERMARK
        self.arrival_watermarks = np.empty(0, dtype=np.int64)

    @property
    def current(self) -> int:
        """The engine watermark: events with a smaller time are late."""
        return self._current

    @property
    def max_ts(self) -> dict[str, int]:
        """Largest event time seen per stream."""
        return dict(self._max_ts)

    def restore(self, current: int, max_ts: Mapping[str, int]) -> None:
        """Continue from a checkpoint: the watermark ``current`` and the largest event time
        seen per stream (streams no longer declared are best left out: they would hold the
        watermark back)."""
        self._current = int(current)
        self._max_ts = {str(name): int(ts) for name, ts in max_ts.items()}

    def set_lateness(self, stream: str, lateness_ms: int) -> None:
        """Declare (or redeclare) a stream's lateness."""
        self._lateness[stream] = int(lateness_ms)

    def is_late(self, ts: int) -> bool:
        """Whether an event at ``ts`` arriving now would be late."""
        return ts < self._current

    def observe(self, stream: str, ts: int) -> bool:
        """Account for one arriving event; returns whether it was late on arrival."""
        late = ts < self._current
        seen = self._max_ts.get(stream)
        if seen is None or ts > seen:
            self._max_ts[stream] = ts
        self._current = max(self._current, self._candidate())
        return late

    def observe_many(self, streams: Sequence[str], codes: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`observe` over events in arrival order.

        Parameters
        ----------
        streams:
            Stream names; ``codes[i]`` indexes into it.
        codes, ts:
            Per event: stream code and event time (int64 ms).

        Returns
        -------
        numpy.ndarray
            Boolean array: which events were late on arrival. Same result as calling
            :meth:`observe` once per event, so a run does not depend on how input is batched.
            The watermark each event met on arrival is left in :attr:`arrival_watermarks`.
        """
        n = len(ts)
        if n == 0:
            self.arrival_watermarks = np.zeros(0, dtype=np.int64)
            return np.zeros(0, dtype=bool)
        ts = np.asarray(ts, dtype=np.int64)
        big = np.iinfo(np.int64).max
        small = np.iinfo(np.int64).min
        names = set(self._max_ts) | set(streams)
        candidate = np.full(n, big, dtype=np.int64)
        last_max: dict[str, int] = {}
        for name in names:
            prior = self._max_ts.get(name, small)
            if name in streams:
                code = streams.index(name)
                own = np.where(codes == code, ts, small)
                running = np.maximum.accumulate(np.maximum(own, prior))
            else:
                running = np.full(n, prior, dtype=np.int64)
            last_max[name] = int(running[-1])
            lateness = self._lateness.get(name, 0)
            seen = running != small
            contribution = np.where(seen, running - lateness, big)
            np.minimum(candidate, contribution, out=candidate)
        candidate[candidate == big] = small
        after = np.maximum.accumulate(np.maximum(candidate, self._current))
        before = np.empty(n, dtype=np.int64)
        before[0] = self._current
        before[1:] = after[:-1]
        for name, value in last_max.items():
            if value != small:
                self._max_ts[name] = value
        self._current = int(after[-1])
        self.arrival_watermarks = before
        return ts < before

    def advance_to(self, ts_ms: int) -> None:
        """Move the watermark forward explicitly (it never moves back)."""
        self._current = max(self._current, int(ts_ms))

    def close(self) -> None:
        """End of input: the watermark jumps to :data:`END_OF_INPUT`."""
        self._current = END_OF_INPUT

    def _candidate(self) -> int:
        if not self._max_ts:
            return NO_WATERMARK
        return min(ts - self._lateness.get(name, 0) for name, ts in self._max_ts.items())


class ReorderBuffer:
    """Holds events until the watermark passes them, then releases them in ``(ts, seq)`` order.

    Entries are ``(ts, seq, payload)`` tuples; ``seq`` is unique, so payloads never compare.
    An event at exactly the watermark is released: a later event with the same time would
    have a larger ``seq`` and so sorts after it anyway.

    Examples
    --------
    >>> buf = ReorderBuffer()
    >>> buf.push(20, 0, "b"); buf.push(10, 1, "a")
    >>> [p for _, _, p in buf.release(15)]
    ['a']
    >>> len(buf)
    1
    """

    def __init__(self) -> None:
        self._entries: list[tuple[int, int, Any]] = []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def earliest_ts(self) -> int | None:
        """Time of the next event to be released, or ``None`` when empty."""
        return self._entries[0][0] if self._entries else None

    def push(self, ts: int, seq: int, payload: Any) -> None:
        """Buffer one event."""
        entry = (ts, seq, payload)
        entries = self._entries
        if not entries or entries[-1] < entry:
            entries.append(entry)
        else:
            entries.insert(bisect_right(entries, entry), entry)

    def push_sorted(self, entries: Iterable[tuple[int, int, Any]]) -> None:
        """Buffer many events given already sorted by ``(ts, seq)``."""
        batch = entries if isinstance(entries, list) else list(entries)
        if not batch:
            return
        pending = self._entries
        if not pending or pending[-1] < batch[0]:
            pending.extend(batch)
            return
        # Only the part of the batch that sorts before the last pending event needs merging;
        # with mostly ordered input that is a handful of events.
        cut = bisect_right(batch, pending[-1])
        first = bisect_right(pending, batch[0])
        merged = list(heapq.merge(pending[first:], batch[:cut]))
        del pending[first:]
        pending.extend(merged)
        pending.extend(batch[cut:])

    def release(self, watermark_ms: int) -> list[tuple[int, int, Any]]:
        """Remove and return the events with ``ts <= watermark_ms``, in order."""
        entries = self._entries
        if not entries or entries[0][0] > watermark_ms:
            return []
        if entries[-1][0] <= watermark_ms:
            self._entries = []
            return entries
        cut = bisect_right(entries, (watermark_ms, float("inf")))
        released = entries[:cut]
        del entries[:cut]
        return released

    def entries(self) -> list[tuple[int, int, Any]]:
        """The buffered entries in order (a copy)."""
        return list(self._entries)
