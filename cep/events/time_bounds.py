"""How far event times may reach: the wall clock and a stream's ``ahead`` bound, the years an
event time may fall in, and the hints that name a likely unit when an epoch number reads as a
time that cannot be right (epoch milliseconds read as seconds, and the reverse).

The checks themselves run where events are validated (:class:`cep.events.event.StreamSchema`);
this module holds the bounds and the words of their dead letters, so that every path (the
embedded engine, a DataFrame, the Spark operator) says the same.
"""

from __future__ import annotations

import json
import os
import time
from datetime import date, timedelta
from typing import Any

from cep.errors import EngineError
from query_lang.lexical import duration_text
from query_lang.timestamps import format_iso_ms, parse_iso_ms

__all__ = [
    "DEFAULT_AHEAD_MS",
    "EARLIEST_MS",
    "LATEST_EVENT_MS",
    "LATEST_MS",
    "NOW_ENV",
    "ahead_detail",
    "corrected_detail",
    "range_detail",
    "unit_hint",
    "wall_clock_ms",
]

DEFAULT_AHEAD_MS = 86_400_000
"""How far an event time may run ahead of the wall clock when its stream sets no ``ahead``:
one day. Wider than any time zone mistake (a local time sent as UTC is at most 14 hours off)
and than the drift of any clock that is still kept, narrower than every unit mistake (epoch
milliseconds read as seconds land thousands of years ahead)."""

NOW_ENV = "VIGIL_NOW_MS"
"""Environment variable that fixes the wall clock (epoch ms or ISO-8601), for tests."""

EARLIEST_MS = parse_iso_ms("0001-01-01T00:00:00Z")
"""The first time ISO-8601 text can carry: 0001-01-01T00:00:00.000Z."""

LATEST_MS = parse_iso_ms("9999-12-31T23:59:59.999Z")
"""The last time ISO-8601 text can carry (and :func:`~query_lang.timestamps.format_iso_ms` can
print): a timestamp field past it is a ``bad_timestamp``."""

LATEST_EVENT_MS = parse_iso_ms("8999-12-31T23:59:59.999Z")
"""The last event time accepted, whatever a stream's ``ahead``: the years 9000 to 9999 are kept
for times computed from event times (an absence's deadline, a window's end), which must still
print, and for the Spark operator's end-of-input mark (9999-12-31), whose watermark from
9000-01-01 on means end of input."""

_DAY_MS = 86_400_000
_GREGORIAN_CYCLE_DAYS = 146_097  # 400 years, to the day
_PLAUSIBLE_MS = 100_000_000_000  # 1973-03-03: an epoch number read as a time before it is odd
# How an epoch number might have been meant: milliseconds per unit, its name, the advice.
_READINGS = (
    (1000, "seconds", "drop `unit ms`"),
    (1, "milliseconds", "declare `unit ms`"),
    (0.001, "microseconds", "send milliseconds (`unit ms`) or seconds"),
    (0.000_001, "nanoseconds", "send milliseconds (`unit ms`) or seconds"),
)


def wall_clock_ms() -> int:
    """The wall clock in epoch milliseconds: ``$VIGIL_NOW_MS`` (epoch ms or ISO-8601) when set,
    which fixes it for tests, else the system clock.

    Examples
    --------
    >>> import os
    >>> os.environ[NOW_ENV] = "2026-01-01T00:00:00Z"
    >>> wall_clock_ms()
    1767225600000
    >>> del os.environ[NOW_ENV]
    >>> wall_clock_ms() > 1767225600000
    True
    """
    fixed = fixed_clock_ms()
    return fixed if fixed is not None else time.time_ns() // 1_000_000


def fixed_clock_ms() -> int | None:
    """The wall clock ``$VIGIL_NOW_MS`` fixes, or None when it is not set.

    Raises
    ------
    EngineError
        When the variable holds neither epoch milliseconds nor an ISO-8601 time.
    """
    text = os.environ.get(NOW_ENV, "").strip()
    if not text:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    ms = parse_iso_ms(text)
    if ms is None:
        raise EngineError(
            f"${NOW_ENV} must be epoch milliseconds or an ISO-8601 time, got {text!r}"
        )
    return ms


def unit_hint(number: Any, unit_ms: int, latest_ms: int = LATEST_EVENT_MS) -> str:
    """``"; it looks like epoch milliseconds: declare `unit ms`"`` and the like: the unit an
    epoch number, counted in units of ``unit_ms`` ms, probably has when another unit reads it
    as a time from 1973 to ``latest_ms``; ``""`` when none does (or it is not a number).

    Examples
    --------
    >>> unit_hint(1_732_550_400_000, 1000, latest_ms=1_800_000_000_000)
    '; it looks like epoch milliseconds: declare `unit ms`'
    >>> unit_hint(1_732_550_400, 1)
    '; it looks like epoch seconds: drop `unit ms`'
    >>> unit_hint(1_732_550_400, 1000), unit_hint("1732550400", 1)
    ('', '')
    """
    if not isinstance(number, int | float) or isinstance(number, bool):
        return ""
    for ms_per_unit, word, advice in _READINGS:
        if ms_per_unit != unit_ms and _PLAUSIBLE_MS <= number * ms_per_unit <= latest_ms:
            return f"; it looks like epoch {word}: {advice}"
    return ""


def ahead_detail(value: Any, ms: int, unit_ms: int, ahead_ms: int, now_ms: int) -> str:
    """The detail of a ``too_far_ahead`` dead letter: the time as sent and as read, the bound,
    the wall clock, and the likely unit.

    Examples
    --------
    >>> ahead_detail(1_732_550_400_000, 1_732_550_400_000_000, 1000, 86_400_000,
    ...              1_764_000_000_000)  # doctest: +NORMALIZE_WHITESPACE
    'event time 1732550400000 read as seconds is year 56872, more than `ahead 1d` past the
    wall clock 2025-11-24T16:00:00.000Z; it looks like epoch milliseconds: declare `unit ms`'
    """
    hint = unit_hint(value, unit_ms, now_ms + ahead_ms)
    return (
        f"event time {_reading(value, ms, unit_ms)}, more than `ahead {duration_text(ahead_ms)}`"
        f" past the wall clock {_when(now_ms)}{hint}"
    )


def range_detail(
    value: Any, ms: int, unit_ms: int, latest_ms: int, what: str = "event time"
) -> str:
    """The detail of a ``bad_timestamp`` dead letter for a time outside the years 1 to the year
    of ``latest_ms`` (``what`` names the value: an event time, or ``field 'x':``).

    Examples
    --------
    >>> print(range_detail("9999-12-31", 253_402_214_400_000, 1000, LATEST_EVENT_MS))
    ... # doctest: +NORMALIZE_WHITESPACE
    event time "9999-12-31" is 9999-12-31T00:00:00.000Z, outside the years 1 to 8999 an event
    time may have
    """
    kind = "an event time" if what == "event time" else "a timestamp"
    return (
        f"{what} {_reading(value, ms, unit_ms)}, outside the years 1 to "
        f"{_year_of(latest_ms)} {kind} may have{unit_hint(value, unit_ms, latest_ms)}"
    )


def corrected_detail(
    happened_ms: int, ms: int, *, latest_ms: int, ahead_ms: int | None = None,
    now_ms: int | None = None,
) -> str:
    """The detail of a dead letter for a clock-corrected event time ``ms`` that cannot be
    right: the device's time and the correction, then the bound passed (``ahead_ms`` and
    ``now_ms``: the wall clock's, else the last year ``latest_ms``).

    Examples
    --------
    >>> print(corrected_detail(10, 999_000_010, latest_ms=LATEST_EVENT_MS, ahead_ms=86_400_000,
    ...                        now_ms=1_000_000))  # doctest: +NORMALIZE_WHITESPACE
    clock-corrected event time 1970-01-12T13:30:00.010Z (device time
    1970-01-01T00:00:00.010Z, +999000000 ms), more than `ahead 1d` past the wall clock
    1970-01-01T00:16:40.000Z
    """
    offset = ms - happened_ms
    head = (
        f"clock-corrected event time {_when(ms)} (device time {_when(happened_ms)}, "
        f"{'+' if offset >= 0 else '-'}{abs(offset)} ms)"
    )
    if ahead_ms is not None and now_ms is not None:
        return (
            f"{head}, more than `ahead {duration_text(ahead_ms)}` past the wall clock "
            f"{_when(now_ms)}"
        )
    return f"{head}, outside the years 1 to {_year_of(latest_ms)} an event time may have"


def _reading(value: Any, ms: int, unit_ms: int) -> str:
    """An event time as sent and as read: ``1732550400000 read as seconds is year 56872``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        unit = "seconds" if unit_ms == 1000 else "milliseconds"
        return f"{value!r} read as {unit} is {_when(ms)}"
    return f"{json.dumps(value, ensure_ascii=False, default=str)} is {_when(ms)}"


def _when(ms: int) -> str:
    """ISO-8601 text of a time, or ``year N`` when ISO-8601 cannot carry it."""
    if EARLIEST_MS <= ms <= LATEST_MS:
        return format_iso_ms(ms)
    year = _year_of(ms)
    if abs(year) >= 10**12:
        return f"a year of {len(str(abs(year)))} digits"
    return f"year {year}"


def _year_of(ms: int) -> int:
    """The (proleptic Gregorian) year of a time, however far: whole 400-year cycles first."""
    cycles, day = divmod(ms // _DAY_MS, _GREGORIAN_CYCLE_DAYS)
    return 400 * cycles + (date(1970, 1, 1) + timedelta(days=day)).year
