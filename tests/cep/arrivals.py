"""Events as a stream delivers them to the engine: each at an event time, arriving up to the
lateness after it, in arrival order — what the Hypothesis tests of out-of-order input draw."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st


def arriving(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    row: Callable[[int, int], dict[str, Any]],
    lateness_s: float,
    most: int,
    last_ts: int,
) -> list[dict[str, Any]]:
    """1 to ``most`` rows ``row(i, ts)`` (``ts`` an event time in s from 0 to ``last_ts``),
    each arriving less than ``lateness_s`` after its time, in the order they arrive."""
    timed = []
    for i in range(draw(st.integers(1, most))):
        ts = draw(st.integers(0, last_ts))
        arrival = ts + draw(st.floats(0, lateness_s - 0.5))
        timed.append((arrival, i, row(i, ts)))
    timed.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in timed]
