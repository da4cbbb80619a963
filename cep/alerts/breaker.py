"""Per-endpoint circuit breaker: stop hammering an endpoint that is down, probe it one at a time.

Hand-written rather than taken from a breaker library (pybreaker): its state is a pure value
advanced by the caller's clock (a ``ManualClock`` in tests), one per endpoint in the dispatcher;
library breakers read the wall clock inside a decorator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from .errors import AlertConfigError

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(StrEnum):
    """Where a breaker is: letting requests through, refusing them, or probing."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class CircuitBreaker:
    """Closed until ``threshold`` consecutive failures, then open for ``cooldown_s``.

    After the cooldown it is half-open: exactly one probe may be in flight. The probe's
    success closes the breaker; its failure opens it for another cooldown. Times are passed
    in, so the breaker is a pure value driven by whichever clock the caller uses.

    Parameters
    ----------
    threshold : int
        Consecutive failures that open the breaker.
    cooldown_s : float
        Seconds the breaker stays open before allowing a probe.

    Examples
    --------
    >>> breaker = CircuitBreaker(threshold=1, cooldown_s=60.0)
    >>> breaker.record_failure(now=0.0)
    >>> breaker.try_acquire(now=30.0), breaker.try_acquire(now=60.0), breaker.try_acquire(now=61.0)
    (False, True, False)
    """

    threshold: int = 5
    cooldown_s: float = 60.0
    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_until: float = -math.inf
    probe_in_flight: bool = False

    def __post_init__(self) -> None:
        if self.threshold < 1:
            raise AlertConfigError(f"breaker threshold must be >= 1, got {self.threshold}")
        if not (math.isfinite(self.cooldown_s) and self.cooldown_s >= 0):
            raise AlertConfigError(f"breaker cooldown must be >= 0, got {self.cooldown_s}")

    def ready_at(self) -> float:
        """Earliest time a request may be sent (``-inf`` when closed, ``inf`` while probing)."""
        if self.state is BreakerState.CLOSED:
            return -math.inf
        if self.state is BreakerState.HALF_OPEN and self.probe_in_flight:
            return math.inf
        return self.opened_until

    def try_acquire(self, now: float) -> bool:
        """Ask to send one request now; True means go ahead (and, if probing, report back)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if now < self.opened_until:
                return False
            self.state = BreakerState.HALF_OPEN
        if self.probe_in_flight:
            return False
        self.probe_in_flight = True
        return True

    def record_success(self) -> None:
        """The endpoint answered: close the breaker and forget past failures."""
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.probe_in_flight = False
        self.opened_until = -math.inf

    def record_failure(self, now: float) -> None:
        """The endpoint failed (5xx, timeout, connection error); maybe open the breaker."""
        self.consecutive_failures += 1
        self.probe_in_flight = False
        if self.state is BreakerState.HALF_OPEN or self.consecutive_failures >= self.threshold:
            self.state = BreakerState.OPEN
            self.opened_until = now + self.cooldown_s
