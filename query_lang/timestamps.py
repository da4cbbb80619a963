"""The language's ``timestamp`` values: ISO-8601 text and epoch numbers read as epoch
milliseconds, and epoch milliseconds written as ISO-8601 UTC — one behaviour for every path
(the embedded engine, the percolator, Spark), so a time reads the same wherever it arrives.

A time without a zone is UTC. Sub-millisecond digits are dropped (floor), never rounded up, so
a time never moves into the next millisecond.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from functools import lru_cache

__all__ = ["epoch_ms", "format_iso_ms", "parse_iso_ms"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_DAY_MS = 86_400_000
_DAYS: dict[int, str] = {}


@lru_cache(maxsize=1 << 12)
def parse_iso_ms(text: str) -> int | None:
    """Epoch milliseconds of an ISO-8601 time, or None when ``text`` is not one.

    Examples
    --------
    >>> parse_iso_ms("2023-11-14T22:13:20.123Z")
    1700000000123
    >>> parse_iso_ms("2023-11-14T22:13:20.123")  # no zone: UTC
    1700000000123
    >>> parse_iso_ms("2023-11-14T23:13:20.1239+01:00")  # sub-millisecond digits dropped
    1700000000123
    >>> parse_iso_ms("soon") is None
    True
    """
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MS


def epoch_ms(number: int | float, unit_ms: int = 1000) -> int | None:
    """Epoch milliseconds of an epoch number counted in units of ``unit_ms`` milliseconds
    (1000 for seconds, 1 for milliseconds); None when it is not a finite number.

    Examples
    --------
    >>> epoch_ms(1_700_000_000), epoch_ms(1.5, unit_ms=1000), epoch_ms(5, unit_ms=1)
    (1700000000000, 1500, 5)
    >>> epoch_ms(float("inf")) is None, epoch_ms(True) is None
    (True, True)
    """
    if isinstance(number, bool):
        return None
    if isinstance(number, int):
        return number * unit_ms
    if isinstance(number, float) and math.isfinite(number):
        return int(round(number * unit_ms))
    return None


def format_iso_ms(ms: int | float) -> str:
    """Epoch milliseconds as ISO-8601 UTC with millisecond precision.

    Raises
    ------
    ValueError
        When the time is outside the years 1-9999 that ISO-8601 text can carry.

    Examples
    --------
    >>> format_iso_ms(0)
    '1970-01-01T00:00:00.000Z'
    >>> format_iso_ms(1_700_000_000_123)
    '2023-11-14T22:13:20.123Z'
    """
    ms = int(ms)
    day, rest = divmod(ms, _DAY_MS)
    date = _DAYS.get(day)
    if date is None:
        # Times come in bursts from the same days: format each day's date once.
        if len(_DAYS) > 4096:
            _DAYS.clear()
        try:
            moment = _EPOCH + timedelta(days=day)
        except OverflowError:
            raise ValueError(f"{ms} ms is outside the years ISO-8601 can show") from None
        date = _DAYS[day] = moment.date().isoformat() + "T"
    seconds, millis = divmod(rest, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{date}{hour:02d}:{minute:02d}:{second:02d}.{millis:03d}Z"
