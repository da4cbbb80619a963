"""Event-time window assignment for ``metric`` blocks: which windows an event falls into, when a
window closes, and until when a late event may still correct it.

Every window is half-open in epoch milliseconds, ``[start, end)``. A ``sliding D`` window without
``every`` is written ``(t - D, t]`` to users; since times are whole milliseconds it is the
half-open ``[t - D + 1, t + 1)`` here, so one rule serves every kind: a window closes when the
watermark reaches its ``end`` and is retained for corrections until the watermark reaches
``end + lateness``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from query_lang.ast import Window

__all__ = [
    "FIXED",
    "SESSION",
    "SLIDING_EVENT",
    "WindowShape",
    "assign_fixed",
    "fixed_starts",
    "session_runs",
]

FIXED = "fixed"
"""Windows at fixed, epoch-aligned positions: ``tumbling`` and ``hopping``/``sliding ... every``."""

SLIDING_EVENT = "sliding_event"
"""``sliding D`` without ``every``: one window ``(t - D, t]`` per event time ``t`` of a group."""

SESSION = "session"
"""``session gap D``: per group, a window that grows while events are less than ``D`` apart."""


@dataclass(frozen=True)
class WindowShape:
    """A ``window`` clause reduced to what the operator needs.

    Attributes
    ----------
    mode:
        :data:`FIXED`, :data:`SLIDING_EVENT` or :data:`SESSION`.
    size_ms:
        Window length (the gap, for sessions).
    every_ms:
        Distance between window starts of :data:`FIXED` windows (equal to ``size_ms`` for a
        tumbling window); 0 for the other modes.
    """

    mode: str
    size_ms: int
    every_ms: int = 0

    @classmethod
    def from_ast(cls, window: Window) -> WindowShape:
        """The shape of a parsed ``window`` clause.

        Raises
        ------
        ValueError
            For an unknown kind, a duration that is not positive, or ``every`` longer than the
            window (events between windows would be missed).

        Examples
        --------
        >>> from query_lang.ast import Duration
        >>> WindowShape.from_ast(Window("sliding", Duration(600_000), Duration(60_000)))
        WindowShape(mode='fixed', size_ms=600000, every_ms=60000)
        >>> WindowShape.from_ast(Window("sliding", Duration(300_000))).mode
        'sliding_event'
        """
        size = window.size.ms
        every = window.every.ms if window.every is not None else None
        if size <= 0 or (every is not None and every <= 0):
            raise ValueError("a window duration must be longer than zero")
        if every is not None and every > size:
            raise ValueError(
                f"the window moves every {every} ms but is only {size} ms long; events in "
                "between would be missed"
            )
        if window.kind == "tumbling":
            if every is not None:
                raise ValueError("a tumbling window takes no 'every'; use 'hopping D every E'")
            return cls(FIXED, size, size)
        if window.kind == "hopping":
            if every is None:
                raise ValueError("a hopping window needs 'every', as in 'hopping 10m every 1m'")
            return cls(FIXED, size, every)
        if window.kind == "sliding":
            return cls(SLIDING_EVENT, size) if every is None else cls(FIXED, size, every)
        if window.kind == "session":
            if every is not None:
                raise ValueError("a session window takes no 'every'")
            return cls(SESSION, size)
        raise ValueError(
            f"unknown window kind {window.kind!r}; expected tumbling, hopping, sliding or session"
        )

    def earliest_end(self, ts: int) -> int:
        """End of the earliest window an event at ``ts`` belongs to (its own, for sessions and
        per-event sliding windows), which decides whether a late event can still be counted.

        Examples
        --------
        >>> WindowShape(FIXED, 10, 5).earliest_end(12)  # windows [5, 15) and [10, 20)
        15
        >>> WindowShape(SLIDING_EVENT, 10).earliest_end(12)  # (2, 12] is [3, 13)
        13
        """
        if self.mode == FIXED:
            first_start = (ts - self.size_ms) // self.every_ms * self.every_ms + self.every_ms
            return first_start + self.size_ms
        if self.mode == SLIDING_EVENT:
            return ts + 1
        return ts + self.size_ms


def assign_fixed(ts: np.ndarray, size_ms: int, every_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """Assign events to epoch-aligned windows ``[k * every, k * every + size)``.

    Parameters
    ----------
    ts:
        Event times (int64 ms).
    size_ms, every_ms:
        Window length and the distance between window starts (equal for tumbling windows).

    Returns
    -------
    rows, starts:
        One pair per (event, window) membership: the event's index into ``ts`` and the
        window's start. Pairs of one event are adjacent, earliest window first.

    Examples
    --------
    >>> rows, starts = assign_fixed(np.array([0, 7, 12]), 10, 5)
    >>> rows.tolist(), starts.tolist()
    ([0, 0, 1, 1, 2, 2], [-5, 0, 0, 5, 5, 10])
    """
    ts = np.asarray(ts, dtype=np.int64)
    last_start = ts // every_ms * every_ms
    if size_ms == every_ms:
        return np.arange(len(ts)), last_start
    k = -(-size_ms // every_ms)
    rows = np.repeat(np.arange(len(ts)), k)
    back = np.tile(np.arange(k - 1, -1, -1, dtype=np.int64) * every_ms, len(ts))
    starts = np.repeat(last_start, k) - back
    inside = starts + size_ms > ts[rows]
    return rows[inside], starts[inside]


def fixed_starts(ts: int, size_ms: int, every_ms: int) -> list[int]:
    """The starts of the windows :func:`assign_fixed` puts one event at ``ts`` into, earliest
    first, computed with Python ints.

    Examples
    --------
    >>> fixed_starts(7, 10, 5), fixed_starts(-3, 10, 10)
    ([0, 5], [-10])
    """
    last_start = ts // every_ms * every_ms
    if size_ms == every_ms:
        return [last_start]
    k = -(-size_ms // every_ms)
    starts = (last_start - back * every_ms for back in range(k - 1, -1, -1))
    return [start for start in starts if start + size_ms > ts]


def session_runs(ts_sorted: np.ndarray, gap_ms: int) -> np.ndarray:
    """Start indices of the runs of a sorted time array in which consecutive times are less
    than ``gap_ms`` apart (each run is one session, before merging with existing ones).

    Examples
    --------
    >>> session_runs(np.array([0, 5, 14, 30, 31]), 10).tolist()
    [0, 3]
    """
    if len(ts_sorted) == 0:
        return np.zeros(0, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(ts_sorted) >= gap_ms) + 1
    return np.r_[0, breaks].astype(np.int64)
