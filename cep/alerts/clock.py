"""Injectable time source, so retry schedules spanning hours can be tested in milliseconds."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Wall-clock time in unix seconds, and a way to wait for it to pass."""

    def now(self) -> float:
        """Return the current time in unix seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait until ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The real clock: :func:`time.time` and :func:`time.sleep`."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to; ``sleep`` advances it instantly.

    Parameters
    ----------
    start : float
        Initial time in unix seconds.

    Examples
    --------
    >>> clock = ManualClock(start=1_000.0)
    >>> clock.sleep(3_600)
    >>> clock.now()
    4600.0
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (which must not be negative)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds})")
        with self._lock:
            self._now += seconds

    def __repr__(self) -> str:
        return f"ManualClock(now={self.now()!r})"
