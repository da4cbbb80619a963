"""Alert throttling: at most one alert per (rule, key) per interval of event time.

A pure value with no clock or I/O, serialisable to bytes so a streaming engine can keep it
in its per-key state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sketches.codec import StateCodec

from .errors import AlertConfigError, ThrottleStateError

__all__ = ["Throttle"]

_CODEC = StateCodec(b"VTHR", 1, name="throttle state", error=ThrottleStateError)
"""Magic, a format version, then canonical JSON."""


def _canonical_key(key: Any) -> str:
    try:
        return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise AlertConfigError(f"throttle keys must be JSON values: {exc}") from exc


class Throttle:
    """Let the first alert of each (rule, key) through, then suppress it for ``interval_ms``.

    The interval is measured in event time from the last alert let through. An alert whose
    event time is earlier than that (a late event) is suppressed.

    Parameters
    ----------
    interval_ms : int
        Minimum event-time distance between two alerts of the same rule and key.

    Examples
    --------
    >>> throttle = Throttle(interval_ms=60_000)
    >>> [throttle.allow("card_testing", {"card": "c1"}, t) for t in (0, 30_000, 60_000)]
    [True, False, True]
    >>> throttle.suppressed
    1
    >>> Throttle.from_bytes(throttle.to_bytes()) == throttle
    True
    """

    def __init__(self, interval_ms: int) -> None:
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms < 0:
            raise AlertConfigError(f"interval_ms must be an int >= 0, got {interval_ms!r}")
        self.interval_ms = interval_ms
        self._last_allowed: dict[tuple[str, str], int] = {}
        self._suppressed: dict[str, int] = {}

    def allow(self, rule: str, key: Any, event_time_ms: int) -> bool:
        """Return True if this alert should be sent; otherwise count it as suppressed.

        Parameters
        ----------
        rule : str
            Rule name.
        key : JSON value
            The match's key (e.g. ``{"card": "c1"}``); dict key order does not matter.
        event_time_ms : int
            Event time of the match, in milliseconds.
        """
        slot = (rule, _canonical_key(key))
        last = self._last_allowed.get(slot)
        if last is None or event_time_ms - last >= self.interval_ms:
            self._last_allowed[slot] = int(event_time_ms)
            return True
        self._suppressed[rule] = self._suppressed.get(rule, 0) + 1
        return False

    @property
    def suppressed(self) -> int:
        """Alerts suppressed so far, over all rules."""
        return sum(self._suppressed.values())

    @property
    def suppressed_by_rule(self) -> Mapping[str, int]:
        """Alerts suppressed so far, per rule."""
        return dict(self._suppressed)

    def prune(self, watermark_ms: int) -> int:
        """Forget (rule, key) slots whose interval ended at or before ``watermark_ms``.

        Once the watermark has passed, no on-time alert could be suppressed by such a slot, so
        dropping it bounds the state without changing decisions. Returns the number dropped.
        """
        expired = [
            slot
            for slot, last in self._last_allowed.items()
            if last + self.interval_ms <= watermark_ms
        ]
        for slot in expired:
            del self._last_allowed[slot]
        return len(expired)

    def __len__(self) -> int:
        return len(self._last_allowed)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Throttle):
            return NotImplemented
        return (
            self.interval_ms == other.interval_ms
            and self._last_allowed == other._last_allowed
            and self._suppressed == other._suppressed
        )

    __hash__ = None  # type: ignore[assignment] - mutable

    def __repr__(self) -> str:
        return (
            f"Throttle(interval_ms={self.interval_ms}, keys={len(self)},"
            f" suppressed={self.suppressed})"
        )

    def to_bytes(self) -> bytes:
        """Serialise to bytes: a magic, a format version, then canonical JSON."""
        state = {
            "interval_ms": self.interval_ms,
            "last_allowed": sorted(
                [rule, key, last] for (rule, key), last in self._last_allowed.items()
            ),
            "suppressed": dict(sorted(self._suppressed.items())),
        }
        payload = json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return _CODEC.encode(payload)

    @classmethod
    def from_bytes(cls, data: bytes) -> Throttle:
        """Rebuild a throttle from :meth:`to_bytes` output.

        Raises
        ------
        ThrottleStateError
            If the bytes are not throttle state or use an unknown format version.
        """
        _, body = _CODEC.decode(data)
        try:
            state = json.loads(bytes(body).decode("utf-8"))
            throttle = cls(state["interval_ms"])
            for rule, key, last in state["last_allowed"]:
                throttle._last_allowed[(str(rule), str(key))] = int(last)
            throttle._suppressed = {str(rule): int(n) for rule, n in state["suppressed"].items()}
        except (ValueError, KeyError, TypeError, AttributeError, AlertConfigError) as exc:
            raise ThrottleStateError(f"throttle state is corrupt: {exc}") from exc
        return throttle
