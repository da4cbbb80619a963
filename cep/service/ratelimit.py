"""Rate limits of ``vigil serve``: one token bucket per API token.

Each token's bucket holds up to ``burst`` requests and refills at ``rate`` per second; a
request finds it empty is refused (429) with how long until the next one fits (Retry-After).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """Token buckets by name.

    Parameters
    ----------
    rate:
        Requests per second each name may make over time (``0`` or less: no limit).
    burst:
        Requests a name may make at once after being idle.
    clock:
        Monotonic seconds (tests pass a fake one).

    Examples
    --------
    >>> now = [0.0]
    >>> limiter = RateLimiter(rate=1.0, burst=2, clock=lambda: now[0])
    >>> limiter.take("ana"), limiter.take("ana"), limiter.take("ana")
    (0.0, 0.0, 1.0)
    >>> now[0] = 1.0
    >>> limiter.take("ana"), limiter.take("bo")
    (0.0, 0.0)
    """

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, at)

    def take(self, name: str) -> float:
        """Take one request from ``name``'s bucket: ``0.0`` when it may go on, else the
        seconds to wait before one fits."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(name, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[name] = (tokens - 1.0, now)
                return 0.0
            self._buckets[name] = (tokens, now)
            return (1.0 - tokens) / self.rate

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """The Retry-After header for a wait: whole seconds, at least 1."""
        return str(max(1, math.ceil(wait_s)))
