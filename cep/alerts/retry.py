"""Retry schedule with jitter, and parsing of the ``Retry-After`` response header.

Hand-written rather than taken from a retry library (tenacity): the schedule is a pure value
that gives the next attempt time, which the outbox stores with each message so retries survive a
restart; a library's retry decorator sleeps inside the process instead.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from .errors import AlertConfigError

__all__ = ["DEFAULT_SCHEDULE", "JITTER_MODES", "RetryPolicy", "parse_retry_after"]

# Delay before attempt 1, 2, ...: immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
DEFAULT_SCHEDULE: tuple[float, ...] = (0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
JITTER_MODES = ("none", "full", "proportional")


@dataclass(frozen=True)
class RetryPolicy:
    """When to attempt a message again after a retryable failure.

    Parameters
    ----------
    schedule : tuple of float
        Seconds to wait before each attempt: ``schedule[0]`` before the first (0 means at
        once), ``schedule[k]`` after the k-th attempt failed. Its length is the maximum number
        of attempts; once exhausted the message goes to the dead letters.
    jitter : {"proportional", "full", "none"}
        ``proportional`` spreads each delay uniformly over ±``jitter_ratio``; ``full`` draws it
        uniformly from ``[0, delay]``; ``none`` keeps it exact.
    jitter_ratio : float
        Spread of proportional jitter, 0.2 meaning ±20%.
    max_retry_after_s : float
        Upper bound on a receiver's ``Retry-After``, so one bad header cannot park a message
        for years.
    """

    schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    jitter: str = "proportional"
    jitter_ratio: float = 0.2
    max_retry_after_s: float = 86_400.0

    def __post_init__(self) -> None:
        schedule = tuple(float(delay) for delay in self.schedule)
        if not schedule:
            raise AlertConfigError("a retry schedule needs at least one entry")
        if any(not math.isfinite(delay) or delay < 0 for delay in schedule):
            raise AlertConfigError(f"retry delays must be finite and >= 0, got {schedule}")
        object.__setattr__(self, "schedule", schedule)
        if self.jitter not in JITTER_MODES:
            raise AlertConfigError(f"jitter must be one of {JITTER_MODES}, got {self.jitter!r}")
        if not 0 <= self.jitter_ratio < 1:
            raise AlertConfigError(f"jitter_ratio must be in [0, 1), got {self.jitter_ratio}")
        if not self.max_retry_after_s >= 0:
            raise AlertConfigError("max_retry_after_s must be >= 0")

    @property
    def max_attempts(self) -> int:
        """How many attempts a message gets before it is dead-lettered."""
        return len(self.schedule)

    def delay_after(self, attempts_made: int, rng: random.Random) -> float | None:
        """Return the jittered delay before the next attempt, or None once exhausted.

        Parameters
        ----------
        attempts_made : int
            Attempts already made (0 for a new message).
        rng : random.Random
            Source of jitter; seed it for reproducible tests.
        """
        if attempts_made >= len(self.schedule):
            return None
        delay = self.schedule[attempts_made]
        if self.jitter == "full":
            return rng.uniform(0.0, delay)
        if self.jitter == "proportional":
            return delay * rng.uniform(1.0 - self.jitter_ratio, 1.0 + self.jitter_ratio)
        return delay


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Return the seconds a ``Retry-After`` header asks to wait, or None if absent or invalid.

    Parameters
    ----------
    value : str or None
        Either delay-seconds (``"120"``) or an HTTP date (``"Wed, 21 Oct 2015 07:28:00 GMT"``).
    now : float
        Current unix time, to turn a date into a delay.

    Examples
    --------
    >>> parse_retry_after("120", now=0.0)
    120.0
    >>> parse_retry_after("Thu, 01 Jan 1970 00:02:00 GMT", now=60.0)
    60.0
    >>> parse_retry_after("soon", now=0.0) is None
    True
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
