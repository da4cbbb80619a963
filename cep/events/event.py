"""Events as the engine sees them, and their validation against a declared ``stream``.

Raw input (a JSON line, a dict, a DataFrame) becomes :class:`Event` values with event time in
epoch milliseconds; input that does not fit the schema becomes a dead letter instead, so one bad
line never stops a run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cep.errors import BadEventError, EngineError, StateError, UnknownRuleError
from cep.events.clock import DeviceClock, corrected_column_ms, corrected_ms
from cep.events.limits import (
    INVALID_UTF8_MARK,
    MAX_EVENT_BYTES,
    MAX_EVENT_DEPTH,
    line_bytes,
    nesting_depth,
    shown_line,
    too_large_detail,
)
from cep.events.time_bounds import (
    DEFAULT_AHEAD_MS,
    EARLIEST_MS,
    LATEST_EVENT_MS,
    LATEST_MS,
    ahead_detail,
    corrected_detail,
    range_detail,
    wall_clock_ms,
)
from query_lang.ast import StreamDecl
from query_lang.checks import event_time_field
from query_lang.timestamps import epoch_ms, parse_iso_ms

__all__ = [
    "BadEventError",
    "DeadLetter",
    "EngineError",
    "Event",
    "EventReason",
    "StateError",
    "StreamSchema",
    "UnknownRuleError",
    "checked_value",
    "corrected_event_time_ms",
    "corrected_time_column_ms",
    "dead_letter",
    "bounded_event_ms",
    "event_time_ms",
    "parse_json_line",
    "parse_timestamp",
    "plain_value",
    "stream_of",
    "time_column_ms",
    "undeclared_failures",
]

STREAM_FIELD = "stream"
"""Name of the field that says which stream an event of a mixed input belongs to."""

SEQ_FIELD = "_seq"
"""Input position carried by raw events handed to a :class:`cep.events.keyed.KeyedProcessor`."""


class EventReason:
    """The ``reason`` values of dead letters."""

    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    NO_STREAM = "no_stream"
    UNKNOWN_STREAM = "unknown_stream"
    MISSING_TIME = "missing_time"
    WRONG_TYPE = "wrong_type"
    BAD_TIMESTAMP = "bad_timestamp"
    MISSING_KEY = "missing_key"
    UNKNOWN_OP = "unknown_op"
    LATE = "late"
    TOO_FAR_AHEAD = "too_far_ahead"
    INVALID_UTF8 = "invalid_utf8"
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"
    NON_FINITE = "non_finite"


@dataclass(slots=True)
class Event:
    """One validated event.

    Attributes
    ----------
    id:
        The value of the stream's id field, else the event's position in its input.
    stream:
        Name of the stream the event belongs to.
    ts:
        Event time in epoch milliseconds.
    seq:
        Arrival position (from 0); breaks ties between equal event times.
    fields:
        Field values, normalised: timestamps as epoch ms, floats as ``float``, null as ``None``.
    """

    id: int | str
    stream: str
    ts: int
    seq: int
    fields: dict[str, Any]


DeadLetter = dict
"""A dead letter: ``{"reason", "detail", "input", "line", "raw"}`` plus, when known,
``"stream"`` and ``"event"`` (the event as received)."""


def dead_letter(
    reason: str,
    detail: str,
    *,
    input: str = "-",
    line: int | None = None,
    raw: str | None = None,
    stream: str | None = None,
    event: Mapping[str, Any] | None = None,
) -> DeadLetter:
    """Build a dead-letter record (a JSON-ready dict)."""
    letter: DeadLetter = {
        "reason": reason,
        "detail": detail,
        "input": input,
        "line": line,
        "raw": shown_line(raw) if raw is not None else _raw_text(event),
    }
    if stream is not None:
        letter["stream"] = stream
    if event is not None:
        letter["event"] = _json_safe(dict(event))
    return letter


def _raw_text(event: Mapping[str, Any] | None) -> str | None:
    if event is None:
        return None
    return json.dumps(_json_safe(dict(event)), ensure_ascii=False, sort_keys=True)


def _json_safe(value: Any, depth: int = 1) -> Any:
    """``value`` as JSON can carry it: non-finite numbers as null, other objects as text, and
    what nests deeper than :data:`~cep.events.limits.MAX_EVENT_DEPTH` as ``"..."`` (a dead
    letter may hold an event refused for its depth)."""
    if isinstance(value, dict | list | tuple) and depth > MAX_EVENT_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v, depth + 1) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


class _NonFinite(Exception):
    """Raised by the JSON decoder's hooks at a number no JSON number can be."""


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value - value != 0.0:  # an overflow to infinity (inf - inf is NaN)
        raise _NonFinite(literal)
    return value


def _refuse_constant(literal: str) -> Any:
    raise _NonFinite(literal)  # NaN, Infinity, -Infinity: Python's extensions, not JSON


def _finite_int(literal: str) -> int:
    value = int(literal)
    if len(literal) > 308 and not _FLOAT_RANGE[0] <= value <= _FLOAT_RANGE[1]:
        raise _NonFinite(literal)  # no double holds it: a column of numbers could not either
    return value


_FLOAT_RANGE = (-int(np.finfo(np.float64).max), int(np.finfo(np.float64).max))
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_refuse_constant)
# Only a line longer than 308 characters can hold an integer beyond a double's range: the
# integer hook (a Python call per integer) is spent on those only.
_LONG_LINE_DECODER = json.JSONDecoder(
    parse_float=_finite_float, parse_int=_finite_int, parse_constant=_refuse_constant
)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json_line(text: str) -> dict[str, Any]:
    """Decode one JSON line into an object, raising :class:`BadEventError` when it is not one
    or breaks a limit of :mod:`cep.events.limits`.

    A line fails at the first of: ``invalid_utf8`` (bytes that are not UTF-8, marked by
    :func:`~cep.events.limits.decode_line`), ``too_large``, ``too_deep``, then, in the order
    the parser meets them, ``invalid_json`` and ``non_finite`` (``NaN``, ``Infinity``, a number
    beyond a double's range), then ``not_an_object``, and ``invalid_utf8`` for an escaped
    unpaired surrogate (``\\ud800``), which no UTF-8 output could hold.

    Examples
    --------
    >>> parse_json_line('{"a": [1, 2.5]}')
    {'a': [1, 2.5]}
    >>> parse_json_line('{"a": {"b": 1e400}}')
    Traceback (most recent call last):
    cep.errors.BadEventError: non_finite: field 'a.b' holds 1e400, beyond the range of a double
    """
    if text.startswith(INVALID_UTF8_MARK):
        raise BadEventError(
            EventReason.INVALID_UTF8,
            "the line is not valid UTF-8 (raw shows its invalid bytes as \\xNN)",
        )
    if len(text) * 4 > MAX_EVENT_BYTES:  # else it cannot take more bytes than the limit
        size = line_bytes(text)
        if size > MAX_EVENT_BYTES:
            raise BadEventError(EventReason.TOO_LARGE, too_large_detail(size))
    if text.count("[") + text.count("{") > MAX_EVENT_DEPTH:  # else it cannot nest deeper
        depth = nesting_depth(text)
        if depth > MAX_EVENT_DEPTH:
            raise BadEventError(EventReason.TOO_DEEP, _too_deep("the line", f"{depth:,}"))
    try:
        value = (_DECODER if len(text) <= 308 else _LONG_LINE_DECODER).decode(text)
    except _NonFinite as exc:
        raise BadEventError(EventReason.NON_FINITE, _non_finite_detail(text, exc)) from None
    except ValueError as exc:
        raise BadEventError(EventReason.INVALID_JSON, f"not valid JSON: {exc}") from None
    except RecursionError:  # only from a caller's stack nearly exhausted already
        raise BadEventError(EventReason.TOO_DEEP, _too_deep("the line")) from None
    if not isinstance(value, dict):
        raise BadEventError(
            EventReason.NOT_AN_OBJECT,
            f"expected a JSON object, got {_json_kind(value)}",
        )
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        where = _first_path(value, _unencodable)
        if where is not None:
            raise BadEventError(
                EventReason.INVALID_UTF8,
                f"{_field(where)} holds an unpaired surrogate escape (\\ud800-\\udfff), "
                "which is no Unicode character",
            )
    return value


def checked_value(value: Any, name: str) -> Any:
    """:func:`plain_value` of field ``name``'s value, held to a JSON line's limits: a
    non-finite number in it (a bare ``NaN`` is null, pandas' missing value) or nesting deeper
    than :data:`~cep.events.limits.MAX_EVENT_DEPTH` raises :class:`BadEventError`.

    Examples
    --------
    >>> checked_value([1, {"b": float("inf")}], "a")
    Traceback (most recent call last):
    cep.errors.BadEventError: non_finite: field 'a[1].b' holds inf, which no JSON number is
    """
    value = plain_value(value)
    if isinstance(value, float):
        if value - value != 0.0:
            raise BadEventError(EventReason.NON_FINITE, _non_finite_value(name, value))
    elif isinstance(value, dict | list | tuple):
        # The event is level 1, its field's value level 2.
        stack: list[tuple[Any, int, str]] = [(value, 2, name)]
        while stack:
            item, depth, path = stack.pop()
            if isinstance(item, float | np.floating):
                if not math.isfinite(item):
                    raise BadEventError(EventReason.NON_FINITE, _non_finite_value(path, item))
            elif isinstance(item, dict | list | tuple):
                if depth > MAX_EVENT_DEPTH:
                    raise BadEventError(EventReason.TOO_DEEP, _too_deep(f"field '{name}'"))
                pairs = (
                    [(f"{path}.{k}", v) for k, v in item.items()] if isinstance(item, dict)
                    else [(f"{path}[{i}]", v) for i, v in enumerate(item)]
                )
                stack.extend((v, depth + 1, p) for p, v in reversed(pairs))
    return value


def _too_deep(what: str, levels: str = f"more than {MAX_EVENT_DEPTH}") -> str:
    return (
        f"{what} nests {levels} levels of arrays and objects; an event may nest at most "
        f"{MAX_EVENT_DEPTH} (the event object is one)"
    )


def _field(path: str) -> str:
    return f"field '{path}'" if path else "the line"


def _non_finite_value(path: str, value: float) -> str:
    return f"{_field(path)} holds {value!r}, which no JSON number is"


class _Literal:
    """Where a number JSON cannot hold stood in a line (found again for the dead letter)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _literal_float(literal: str) -> Any:
    value = float(literal)
    return _Literal(literal) if value - value != 0.0 else value


def _literal_int(literal: str) -> Any:
    try:
        return _finite_int(literal)
    except _NonFinite:
        return _Literal(literal)


_MARKING_DECODER = json.JSONDecoder(
    parse_float=_literal_float, parse_int=_literal_int, parse_constant=_Literal
)


def _non_finite_detail(text: str, exc: _NonFinite) -> str:
    """The detail of a ``non_finite`` line: the first field holding such a number."""
    literal = str(exc.args[0])
    try:
        marked = _MARKING_DECODER.decode(text)
    except ValueError:  # a JSON error after the number: the field is not named
        where = None
    else:
        where = _first_path(marked, lambda v: isinstance(v, _Literal))
    shown = literal if len(literal) <= 40 else literal[:37] + "..."
    if literal in ("NaN", "Infinity", "-Infinity"):
        return f"{_field(where or '')} holds {shown}, which no JSON number is"
    return f"{_field(where or '')} holds {shown}, beyond the range of a double"


def _unencodable(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _first_path(value: Any, bad: Callable[[Any], bool]) -> str | None:
    """The path (``a.b[2]``) of the first value or key, in document order, for which ``bad``
    holds inside a decoded line; None when there is none."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                where = f"{path}.{key}" if path else str(key)
                if bad(key):
                    return where
                children.append((child, where))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(child, f"{path}[{i}]") for i, child in enumerate(item)]))
        elif bad(item):
            return path
    return None


def stream_of(
    raw: Mapping[str, Any], bound: str | None, schemas: Mapping[str, StreamSchema]
) -> StreamSchema:
    """Which declared stream a raw event belongs to.

    ``bound`` is the stream the whole input is bound to (``--events txn=path``); otherwise the
    event's ``stream`` field decides, and when the program declares one stream only, events
    without that field belong to it.
    """
    if bound is not None:
        schema = schemas.get(bound)
        if schema is None:
            raise BadEventError(EventReason.UNKNOWN_STREAM, f"stream '{bound}' is not declared")
        return schema
    name = raw.get(STREAM_FIELD)
    if name is None:
        if len(schemas) == 1:
            return next(iter(schemas.values()))
        raise BadEventError(
            EventReason.NO_STREAM,
            f"event has no '{STREAM_FIELD}' field and the program declares "
            f"{len(schemas)} streams ({', '.join(sorted(schemas)) or 'none'})",
        )
    schema = schemas.get(name) if isinstance(name, str) else None
    if schema is None:
        raise BadEventError(
            EventReason.UNKNOWN_STREAM,
            f"stream {_show(name)} is not declared (declared: {', '.join(sorted(schemas))})",
        )
    return schema


@dataclass(frozen=True)
class StreamSchema:
    """A ``stream`` declaration prepared for validating events.

    Attributes
    ----------
    name:
        The stream's name.
    fields:
        Declared field name -> type (``string int float bool timestamp text list<string>
        json``).
    time_field:
        The event-time field: the declared ``time`` field, else the only ``timestamp`` field.
    epoch_unit_ms:
        Milliseconds per unit of epoch numbers in timestamp fields (1000 for seconds, 1 for ms).
    lateness_ms:
        Bounded out-of-orderness of the stream.
    id_field:
        Field holding an event's id (default ``id``).
    ahead_ms:
        How far an event time may run ahead of the wall clock (the stream's ``ahead``).
    now_ms:
        The wall clock, fixed (tests); ``None`` reads it at each validation
        (:func:`cep.events.time_bounds.wall_clock_ms`).
    clock:
        The device clock correction (``time ts sent S received R``), or None: the event time
        is then the time field's value (:mod:`cep.events.clock`).
    """

    name: str
    fields: Mapping[str, str]
    time_field: str | None
    epoch_unit_ms: int = 1000
    lateness_ms: int = 0
    id_field: str = "id"
    ahead_ms: int = DEFAULT_AHEAD_MS
    now_ms: int | None = None
    clock: DeviceClock | None = None
    _timestamps: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_decl(
        cls, decl: StreamDecl, *, lateness_ms: int | None = None, now_ms: int | None = None
    ) -> StreamSchema:
        """Prepare ``decl``; ``lateness_ms`` overrides the declared lateness, ``now_ms`` fixes
        the wall clock that bounds event times (default: read it at each validation)."""
        fields = {f.name: f.type for f in decl.fields}
        time_field = event_time_field(decl)
        clock = DeviceClock.from_decl(decl)
        if time_field is not None:
            # Event time is epoch ms everywhere, whatever type the time field was declared with.
            fields[time_field] = "timestamp"
            if clock is not None:
                # So are the times a device clock is corrected with (the same unit's numbers).
                fields[clock.sent_field] = fields[clock.received_field] = "timestamp"
        if lateness_ms is None:
            lateness_ms = decl.lateness.ms if decl.lateness is not None else 0
        return cls(
            name=decl.name,
            fields=fields,
            time_field=time_field,
            epoch_unit_ms=1 if decl.time_unit == "ms" else 1000,
            lateness_ms=int(lateness_ms),
            id_field=decl.id_field or "id",
            ahead_ms=decl.ahead.ms if decl.ahead is not None else DEFAULT_AHEAD_MS,
            now_ms=now_ms,
            clock=clock,
            _timestamps=tuple(n for n, t in fields.items() if t == "timestamp"),
        )

    # ------------------------------------------------------------------ event time

    def event_time(self, value: Any) -> int:
        """Event time (epoch ms) of the time field's ``value``, held to the time bounds.

        Raises
        ------
        BadEventError
            ``too_far_ahead`` beyond the wall clock plus ``ahead``; ``bad_timestamp`` when the
            value is not a time or falls outside the years an event time may have
            (:data:`~cep.events.time_bounds.LATEST_EVENT_MS`). Either detail names the likely
            unit of an epoch number that does not read as a time in the stream's.

        Examples
        --------
        >>> from query_lang import parse
        >>> decl, = parse("stream s (ts int) time ts").declarations
        >>> schema = StreamSchema.from_decl(decl, now_ms=1_767_225_600_000)  # 2026-01-01
        >>> schema.event_time(1_767_225_600)
        1767225600000
        >>> schema.event_time(1_767_225_600_000)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        cep.errors.BadEventError: too_far_ahead: event time 1767225600000 read as seconds is
        year 57971, more than `ahead 1d` past the wall clock 2026-01-01T00:00:00.000Z; it looks
        like epoch milliseconds: declare `unit ms`
        """
        now_ms, ahead_ms = self._clock()
        return event_time_ms(
            value, self.epoch_unit_ms, self.time_field or "ts", ahead_ms=ahead_ms, now_ms=now_ms
        )

    def event_time_of(self, raw: Mapping[str, Any]) -> int:
        """The event time of a raw event of this stream, as :meth:`normalise` gives it
        (corrected for the device's clock when the stream declares one), without validating
        its other fields.

        Raises
        ------
        BadEventError
            When the time is missing or cannot be right.

        Examples
        --------
        >>> from query_lang import parse
        >>> decl, = parse("stream s (ts int, a int, b int) time ts unit ms "
        ...               "sent a received b").declarations
        >>> StreamSchema.from_decl(decl, now_ms=1_000).event_time_of({"ts": 1, "a": 2, "b": 9})
        8
        """
        name = self.time_field
        if name is None:
            raise BadEventError(
                EventReason.MISSING_TIME,
                f"stream '{self.name}' declares no time field (add `time FIELD`)",
            )
        value = raw.get(name)
        clock = self.clock
        if clock is None:
            if value is None:
                raise BadEventError(
                    EventReason.MISSING_TIME, f"time field '{name}' is missing or null"
                )
            return self.event_time(value)
        now_ms, ahead_ms = self._clock()
        return corrected_event_time_ms(
            value, raw.get(clock.sent_field), raw.get(clock.received_field), clock, name,
            self.epoch_unit_ms, ahead_ms=ahead_ms, now_ms=now_ms,
        )

    def corrected_time(
        self, value: Any, happened: int, sent: int | None, received: int | None
    ) -> int:
        """The event time of a clock-corrected stream's event whose time field holds
        ``value`` (read as ``happened``, epoch ms) and whose sent and received fields read
        ``sent`` and ``received`` (None when missing): corrected when both are known
        (:func:`cep.events.clock.corrected_ms`), held to the time bounds as
        :meth:`event_time` holds an uncorrected time.

        Examples
        --------
        >>> from query_lang import parse
        >>> decl, = parse("stream s (ts int, a int, b int) time ts unit ms "
        ...               "sent a received b").declarations
        >>> schema = StreamSchema.from_decl(decl, now_ms=1_000_000)
        >>> schema.corrected_time(10, 10, 100, 600), schema.corrected_time(10, 10, None, 600)
        (510, 10)
        >>> schema.corrected_time(10, 10, 0, 999_000_000)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        cep.errors.BadEventError: too_far_ahead: clock-corrected event time ... (device time ...
        """
        ms, done = corrected_ms(happened, sent, received)
        now_ms, ahead_ms = self._clock()
        return bounded_event_ms(
            value, ms, self.epoch_unit_ms, ahead_ms=ahead_ms, now_ms=now_ms,
            happened_ms=happened if done else None,
        )

    def uncorrected(self, fields: Mapping[str, Any]) -> bool:
        """Whether an event of a clock-corrected stream, its ``fields`` validated, kept its
        device time for want of a sent or received time (False on other streams)."""
        clock = self.clock
        return clock is not None and (
            fields.get(clock.sent_field) is None or fields.get(clock.received_field) is None
        )

    def uncorrected_rows(self, frame: pd.DataFrame) -> int:
        """How many rows of a frame :meth:`normalise_frame` returned kept their device time
        (see :meth:`uncorrected`)."""
        clock = self.clock
        if clock is None or frame.empty:
            return 0
        known = np.ones(len(frame), dtype=bool)
        for name in (clock.sent_field, clock.received_field):
            if name not in frame.columns:
                return len(frame)
            known &= frame[name].notna().to_numpy()
        return int((~known).sum())

    def _clock(self) -> tuple[int, int]:
        """``(now, ahead)`` in ms: the wall clock (read now unless fixed) and the bound."""
        return (self.now_ms if self.now_ms is not None else wall_clock_ms()), self.ahead_ms

    # ------------------------------------------------------------------ one event at a time

    def normalise(self, raw: Mapping[str, Any], *, seq: int, position: int) -> Event:
        """Validate one raw event and build its :class:`Event`.

        Parameters
        ----------
        raw:
            Field name -> value as decoded from JSON (a ``stream`` field is dropped).
        seq:
            Arrival position in the engine.
        position:
            Position in its own input, the id when the event carries none.

        Raises
        ------
        BadEventError
            When the time field is missing, its time cannot be right (too far ahead of the wall
            clock, outside the years an event time may have) or a field does not have its
            declared type.
        """
        if self.time_field is None:
            raise BadEventError(
                EventReason.MISSING_TIME,
                f"stream '{self.name}' declares no time field (add `time FIELD`)",
            )
        fields: dict[str, Any] = {}
        declared = self.fields
        # Declared fields are checked in declaration order, so that an event with several
        # problems reports the same first one whichever way it is validated.
        for name, kind in declared.items():
            value = raw.get(name)
            if value is not None:
                if name == self.time_field and self.clock is None:
                    fields[name] = self.event_time(value)
                else:
                    fields[name] = _convert(value, kind, name, self.epoch_unit_ms)
            elif name in raw:
                fields[name] = None
        for name, value in raw.items():
            if name not in declared and name != STREAM_FIELD and name != SEQ_FIELD:
                fields[name] = checked_value(value, name)
        ts = fields.get(self.time_field)
        if ts is None:
            raise BadEventError(
                EventReason.MISSING_TIME,
                f"time field '{self.time_field}' is missing or null",
            )
        clock = self.clock
        if clock is not None:
            ts = self.corrected_time(
                raw.get(self.time_field), ts,
                fields.get(clock.sent_field), fields.get(clock.received_field),
            )
            fields[clock.device_field] = fields[self.time_field]
            fields[self.time_field] = ts
        ident = fields.get(self.id_field)
        if not isinstance(ident, str | int) or isinstance(ident, bool):
            ident = position if ident is None else str(ident)
        return Event(id=ident, stream=self.name, ts=ts, seq=seq, fields=fields)

    # ------------------------------------------------------------------ a DataFrame at a time

    def normalise_frame(
        self, frame: pd.DataFrame
    ) -> tuple[pd.DataFrame, np.ndarray, list[tuple[int, str, str]]]:
        """Validate a DataFrame of this stream's events column by column.

        Returns
        -------
        (normalised, ts, bad)
            ``normalised`` holds the rows that passed (original index kept) with timestamp
            columns as epoch ms and numeric columns as ``float64``/``int64``; ``ts`` their event
            times (int64 ms); ``bad`` lists ``(row position, reason, detail)`` of rows that
            failed, positions counted in ``frame``.
        """
        n = len(frame)
        ok = np.ones(n, dtype=bool)
        problems: dict[int, tuple[str, str]] = {}
        columns: dict[str, Any] = {}
        if self.time_field is None:
            detail = f"stream '{self.name}' declares no time field (add `time FIELD`)"
            bad = [(i, EventReason.MISSING_TIME, detail) for i in range(n)]
            return frame.iloc[0:0], np.empty(0, dtype=np.int64), bad
        present = set(frame.columns)
        changed = False
        for name, kind in self.fields.items():
            if name not in present:
                continue
            original = frame[name]
            if name == self.time_field:
                converted, failed = _timestamp_column(
                    original, name, self.epoch_unit_ms,
                    clock=self._clock() if self.clock is None else None,
                )
            else:
                converted, failed = _convert_column(original, kind, name, self.epoch_unit_ms)
            columns[name] = converted
            changed = changed or converted is not original
            for pos, reason, detail in failed:
                if ok[pos]:
                    ok[pos] = False
                    problems[pos] = (reason, detail)
        for name in frame.columns:
            if name not in self.fields and name != STREAM_FIELD and name != SEQ_FIELD:
                columns[name] = frame[name]
        if self.time_field in columns:
            missing = columns[self.time_field].isna().to_numpy() & ok
        else:
            missing = ok.copy()
        for pos in np.flatnonzero(missing):
            ok[pos] = False
            problems[int(pos)] = (
                EventReason.MISSING_TIME,
                f"time field '{self.time_field}' is missing or null",
            )
        if self.clock is not None and self.time_field in columns:
            self._correct_columns(frame, columns, ok, problems)
            changed = True
        if changed or STREAM_FIELD in present or SEQ_FIELD in present:
            normalised = pd.DataFrame(columns, index=frame.index)
        else:
            normalised = frame  # every column already has its type: no copy
        if not ok.all():
            normalised = normalised[ok]
        if normalised.empty:
            normalised = normalised.assign(**{self.time_field: np.empty(0, dtype=np.int64)})
        ts = normalised[self.time_field].to_numpy(dtype=np.int64)
        bad = [(pos, reason, detail) for pos, (reason, detail) in sorted(problems.items())]
        return normalised, ts, bad

    def _correct_columns(
        self,
        frame: pd.DataFrame,
        columns: dict[str, Any],
        ok: np.ndarray,
        problems: dict[int, tuple[str, str]],
    ) -> None:
        """:meth:`normalise_frame`'s twin of :meth:`corrected_time`: the time column
        corrected in ``columns`` (the device's times kept beside it), rows whose time cannot
        be right marked failed in ``ok`` and ``problems``."""
        clock = self.clock
        assert clock is not None and self.time_field is not None
        n = len(frame)

        def as_ms(name: str) -> np.ndarray:
            column = columns.get(name)
            if column is None:
                return np.full(n, np.nan)
            return pd.to_numeric(column, errors="coerce").to_numpy(
                dtype=np.float64, na_value=np.nan
            )

        happened = as_ms(self.time_field)
        sent, received = as_ms(clock.sent_field), as_ms(clock.received_field)
        times, _ = corrected_column_ms(happened, sent, received)
        now_ms, ahead_ms = self._clock()
        timed = ok & ~np.isnan(times)
        outside = timed & (
            (times < EARLIEST_MS) | (times > min(LATEST_EVENT_MS, now_ms + ahead_ms))
        )
        raw = frame[self.time_field]
        for pos in np.flatnonzero(outside).tolist():
            # Rare: the one-event check gives the row its dead letter's detail.
            try:
                self.corrected_time(
                    plain_value(raw.iloc[pos]), int(happened[pos]),
                    None if np.isnan(sent[pos]) else int(sent[pos]),
                    None if np.isnan(received[pos]) else int(received[pos]),
                )
            except BadEventError as exc:
                ok[pos] = False
                problems[pos] = (exc.reason, exc.detail)
        columns[clock.device_field] = columns[self.time_field]
        columns[self.time_field] = pd.Series(
            np.where(np.isnan(times), 0, times).astype(np.int64), index=frame.index
        )

    def column_values(self, frame: pd.DataFrame, names: Sequence[str]) -> list[list[Any]]:
        """The values of fields ``names`` of rows already checked by :meth:`normalise_frame`,
        one list per field, as :meth:`events_from_frame` puts them in the events' fields (a
        field the frame lacks: nulls)."""
        out = []
        for name in names:
            if name == self.time_field:
                out.append(frame[name].to_numpy(dtype=np.int64).tolist())
            elif name in frame.columns:
                out.append(_column_values(frame[name]))
            else:
                out.append([None] * len(frame))
        return out

    def events_from_frame(
        self, frame: pd.DataFrame, seqs: np.ndarray, positions: np.ndarray
    ) -> list[Event]:
        """Build :class:`Event` values from rows already checked by :meth:`normalise_frame`."""
        if frame.empty:
            return []
        names = [str(c) for c in frame.columns if c != STREAM_FIELD and c != SEQ_FIELD]
        columns = [_column_values(frame[name]) for name in names]
        ts_values = frame[self.time_field].to_numpy(dtype=np.int64).tolist()
        columns[names.index(self.time_field)] = ts_values
        if self.id_field in names:
            ids = [
                v if (type(v) is str or type(v) is int) else _fallback_id(v, pos)
                for v, pos in zip(
                    columns[names.index(self.id_field)], positions.tolist(), strict=True
                )
            ]
        else:
            ids = positions.tolist()
        # Lengths agree by construction; the loops below are the per-row hot path.
        records = [dict(zip(names, row, strict=False)) for row in zip(*columns, strict=False)]
        stream = self.name
        return [
            Event(ident, stream, ts, seq, fields)
            for ident, ts, seq, fields in zip(ids, ts_values, seqs.tolist(), records, strict=False)
        ]


#: Inferred dtypes of object columns whose values :func:`checked_value` cannot refuse.
_PLAIN_KINDS = frozenset({
    "string", "empty", "boolean", "integer", "bytes", "decimal", "datetime", "datetime64",
    "date", "time", "timedelta", "timedelta64", "period", "interval", "categorical",
})


def undeclared_failures(
    frame: pd.DataFrame, declared: Collection[str], failed: Collection[int] = ()
) -> list[tuple[int, str, str]]:
    """``(row position, reason, detail)`` of the rows of ``frame`` whose fields outside
    ``declared`` break an event's limits: the column-wise twin of the :func:`checked_value`
    that :meth:`StreamSchema.normalise` applies to each undeclared field (an infinity, or too
    deep a list or object). Rows in ``failed`` (positions) already failed: they are skipped.

    Examples
    --------
    >>> undeclared_failures(pd.DataFrame({"a": [1.0, float("-inf")], "b": ["x", "y"]}), ["b"])
    [(1, 'non_finite', "field 'a' holds -inf, which no JSON number is")]
    """
    found: dict[int, tuple[str, str]] = {}
    skip = set(failed)
    for name in frame.columns:
        if name in declared or name == STREAM_FIELD or name == SEQ_FIELD:
            continue
        column = frame[name]
        if pd.api.types.is_float_dtype(column.dtype):
            values = column.to_numpy(dtype=np.float64, na_value=np.nan)
            rows = np.flatnonzero(np.isinf(values)).tolist()
        elif column.dtype == object:
            if pd.api.types.infer_dtype(column, skipna=True) in _PLAIN_KINDS:
                continue
            values = column.to_numpy()
            rows = range(len(values))
        else:
            continue
        for row in rows:
            if row in skip or row in found:
                continue
            try:
                checked_value(values[row], str(name))
            except BadEventError as exc:
                found[row] = (exc.reason, exc.detail)
    return [(row, reason, detail) for row, (reason, detail) in sorted(found.items())]


def _fallback_id(value: Any, position: int) -> int | str:
    if value is None:
        return position
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return str(value)


def _column_values(column: pd.Series) -> list[Any]:
    """A column as native Python values, nulls as ``None``."""
    dtype = column.dtype
    if pd.api.types.is_float_dtype(dtype):
        values = column.to_numpy(dtype=np.float64)
        out = values.tolist()
        if np.isnan(values).any():
            out = [None if v != v else v for v in out]
        return out
    if pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_bool_dtype(dtype):
        if column.hasnans:
            return [plain_value(v) for v in column.tolist()]
        return column.to_numpy().tolist()
    if pd.api.types.infer_dtype(column, skipna=True) == "string":
        values = column.tolist()  # plain str values and nulls: only the nulls to convert
        if column.hasnans:
            return [v if type(v) is str else None for v in values]
        return values
    return [plain_value(v) for v in column.tolist()]


# ---------------------------------------------------------------------- value conversion


_INT64 = (-(2**63), 2**63 - 1)


def _convert(value: Any, kind: str, name: str, unit_ms: int) -> Any:
    if kind in ("string", "text"):
        if isinstance(value, str):
            return value
    elif kind == "float" or kind == "int":
        if isinstance(value, float) and not math.isfinite(value):
            if value != value:
                return None  # NaN: pandas' missing value, as in a DataFrame
            raise BadEventError(EventReason.NON_FINITE, _non_finite_value(name, value))
        if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer of more than 308 digits
                raise BadEventError(
                    EventReason.NON_FINITE,
                    f"field '{name}' holds {_show(value)}, beyond the range of a double",
                ) from None
        if kind == "int" and not isinstance(value, bool):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
                return value
    elif kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "timestamp":
        return parse_timestamp(value, unit_ms, name)
    elif kind == "list<string>":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    elif kind == "json":
        return value  # any JSON value: an object, a list, a string, a number, a boolean
    else:
        return value
    raise BadEventError(
        EventReason.WRONG_TYPE, f"field '{name}' expected {kind}, got {_describe(value)}"
    )


def parse_timestamp(value: Any, unit_ms: int = 1000, name: str = "ts") -> int:
    """Epoch milliseconds from an ISO-8601 string or an epoch number in ``unit_ms`` units.

    ISO-8601 times without an offset are taken as UTC (:mod:`query_lang.timestamps`). A time
    outside the years 1 to 9999, which ISO-8601 text cannot carry, is a ``bad_timestamp``
    (an event time is held to more: :meth:`StreamSchema.event_time`).

    Examples
    --------
    >>> parse_timestamp("2026-01-01T00:00:00Z"), parse_timestamp(1.5)
    (1767225600000, 1500)
    >>> parse_timestamp(10**12, name="at")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    cep.errors.BadEventError: bad_timestamp: field 'at': 1000000000000 read as seconds is year
    33658, outside the years 1 to 9999 a timestamp may have; it looks like epoch milliseconds:
    declare `unit ms`
    """
    ms = _time_ms(value, unit_ms)
    if ms is None:
        raise BadEventError(
            EventReason.BAD_TIMESTAMP,
            f"field '{name}' expected an ISO-8601 timestamp or epoch number, "
            f"got {_describe(value)}",
        )
    if not EARLIEST_MS <= ms <= LATEST_MS:
        raise BadEventError(
            EventReason.BAD_TIMESTAMP,
            range_detail(value, ms, unit_ms, LATEST_MS, what=f"field '{name}':"),
        )
    return ms


def _time_ms(value: Any, unit_ms: int) -> int | None:
    """Epoch ms of ISO-8601 text or an epoch number, however far; None when it is neither."""
    if isinstance(value, str):
        return parse_iso_ms(value)
    if isinstance(value, float) and math.isfinite(value) and abs(value) > 2.0**53:
        # Far outside every bound, and its product with the unit may overflow a float: the
        # exact integer keeps it a number the bounds refuse.
        return int(value) * unit_ms
    return epoch_ms(value, unit_ms)


def time_column_ms(
    column: pd.Series,
    name: str,
    unit_ms: int,
    *,
    ahead_ms: int = DEFAULT_AHEAD_MS,
    now_ms: int | None = None,
) -> np.ndarray:
    """Event times (epoch ms, as float) of a column of raw time values, parsed and bounded as
    :meth:`StreamSchema.event_time` does one; ``NaN`` where a value is missing, not a time, or
    a time that cannot be right (more than ``ahead_ms`` past the wall clock ``now_ms``, default
    :func:`~cep.events.time_bounds.wall_clock_ms`; outside the years an event time may have),
    so that such a row never moves a watermark.

    Examples
    --------
    >>> time_column_ms(pd.Series([1.5, None]), "ts", 1000).tolist()
    [1500.0, nan]
    >>> time_column_ms(pd.Series(["1970-01-01T00:00:01Z", "soon"]), "ts", 1).tolist()
    [1000.0, nan]
    >>> time_column_ms(pd.Series([1_767_225_600, 1_767_225_600_000]), "ts", 1000).tolist()
    [1767225600000.0, nan]
    """
    clock = (now_ms if now_ms is not None else wall_clock_ms(), ahead_ms)
    converted, failed = _timestamp_column(column, name, unit_ms, clock=clock)
    out = pd.to_numeric(pd.Series(converted), errors="coerce").to_numpy(dtype=np.float64)
    for position, _reason, _detail in failed:
        out[position] = np.nan
    return out


def corrected_time_column_ms(
    column: pd.Series,
    sent: pd.Series | None,
    received: pd.Series | None,
    clock: DeviceClock,
    name: str,
    unit_ms: int,
    *,
    ahead_ms: int = DEFAULT_AHEAD_MS,
    now_ms: int | None = None,
) -> np.ndarray:
    """:func:`time_column_ms` of a clock-corrected stream: each row's time corrected with its
    sent and received times (``None``: a column no row has) as
    :meth:`StreamSchema.normalise_frame` corrects it, then bounded; ``NaN`` where the time is
    missing or cannot be right, and where a sent or received value is present but not a time
    (the processor dead-letters those rows).

    Examples
    --------
    >>> clock = DeviceClock("a", "b", "ts_device")
    >>> corrected_time_column_ms(pd.Series([10, 10, 10]), pd.Series([100, None, "x"]),
    ...                          pd.Series([600, 600, 600]), clock, "ts", 1,
    ...                          now_ms=0).tolist()
    [510.0, 10.0, nan]
    """
    n = len(column)

    def as_ms(values: pd.Series | None, field_name: str) -> tuple[np.ndarray, np.ndarray]:
        if values is None:
            return np.full(n, np.nan), np.zeros(n, dtype=bool)
        values = values.reset_index(drop=True)
        converted, failed = _timestamp_column(values, field_name, unit_ms)
        ms = pd.to_numeric(pd.Series(converted), errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
        broken = np.zeros(n, dtype=bool)
        for position, _reason, _detail in failed:
            ms[position] = np.nan
            broken[position] = True
        return ms, broken

    happened, _ = as_ms(column, name)
    sent_ms, sent_bad = as_ms(sent, clock.sent_field)
    received_ms, received_bad = as_ms(received, clock.received_field)
    times, _ = corrected_column_ms(happened, sent_ms, received_ms)
    if now_ms is None:
        now_ms = wall_clock_ms()
    with np.errstate(invalid="ignore"):
        wrong = (times < EARLIEST_MS) | (times > min(LATEST_EVENT_MS, now_ms + ahead_ms))
    times[wrong | sent_bad | received_bad] = np.nan
    return times


def corrected_event_time_ms(
    value: Any,
    sent: Any,
    received: Any,
    clock: DeviceClock,
    name: str,
    unit_ms: int,
    *,
    ahead_ms: int = DEFAULT_AHEAD_MS,
    now_ms: int | None = None,
) -> int:
    """:func:`event_time_ms` of one clock-corrected event's raw time, sent and received
    values: :func:`corrected_time_column_ms` for one row.

    Raises
    ------
    BadEventError
        When the time is missing, a value is not a time, or the corrected time cannot be
        right.

    Examples
    --------
    >>> corrected_event_time_ms(10, 100, 600, DeviceClock("a", "b", "t"), "ts", 1, now_ms=0)
    510
    """
    if _is_null(value):
        raise BadEventError(EventReason.MISSING_TIME, f"time field '{name}' is missing or null")
    happened = parse_timestamp(value, unit_ms, name)
    sent_ms = None if _is_null(sent) else parse_timestamp(sent, unit_ms, clock.sent_field)
    received_ms = (
        None if _is_null(received) else parse_timestamp(received, unit_ms, clock.received_field)
    )
    ms, _ = corrected_ms(happened, sent_ms, received_ms)
    return bounded_event_ms(value, ms, unit_ms, ahead_ms=ahead_ms, now_ms=now_ms)


def _convert_column(
    column: pd.Series, kind: str, name: str, unit_ms: int
) -> tuple[pd.Series, list[tuple[int, str, str]]]:
    """Vectorised :func:`_convert`: the converted column and ``(position, reason, detail)``
    failures."""
    dtype = column.dtype
    if kind == "float":
        if pd.api.types.is_float_dtype(dtype) or (
            pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
        ):
            converted = column if dtype == np.float64 else column.astype(np.float64)
            if not np.isinf(converted.to_numpy(dtype=np.float64)).any():
                return converted, []
            # else row by row: an infinity is a dead letter (non_finite)
    elif kind == "int":
        if pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
            return column, []
    elif kind == "bool":
        if pd.api.types.is_bool_dtype(dtype):
            return column, []
    elif kind in ("string", "text"):
        if pd.api.types.is_string_dtype(dtype):
            inferred = pd.api.types.infer_dtype(column, skipna=True)
            if inferred in ("string", "empty"):
                return column, []
    elif kind == "timestamp":
        return _timestamp_column(column, name, unit_ms)
    return _convert_rowwise(column, kind, name, unit_ms)


def _convert_rowwise(
    column: pd.Series, kind: str, name: str, unit_ms: int
) -> tuple[pd.Series, list[tuple[int, str, str]]]:
    values = column.tolist()
    failed: list[tuple[int, str, str]] = []
    out: list[Any] = []
    for pos, value in enumerate(values):
        if _is_null(value):
            out.append(None)
            continue
        try:
            out.append(_convert(plain_value(value), kind, name, unit_ms))
        except BadEventError as exc:
            failed.append((pos, exc.reason, exc.detail))
            out.append(None)
    series = pd.Series(out, index=column.index, dtype=object)
    if kind == "float":
        series = pd.to_numeric(series, errors="coerce").astype(np.float64)
    elif kind in ("int", "timestamp") and not any(v is None for v in out):
        series = series.astype(np.int64)
    return series, failed


def _timestamp_column(
    column: pd.Series, name: str, unit_ms: int, clock: tuple[int, int] | None = None
) -> tuple[pd.Series, list[tuple[int, str, str]]]:
    """Vectorised :func:`parse_timestamp`, or with ``clock`` (``(now, ahead)`` in ms) the
    time field's :meth:`StreamSchema.event_time`: the column as epoch ms and its failures."""
    dtype = column.dtype
    # Each fast path computes the times as float too (exact at the magnitudes of valid times;
    # an int64 product could wrap), to find the rows out of bounds before the exact times.
    exact: np.ndarray | pd.Series | None = None
    if pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
        raw = column.to_numpy(dtype=np.int64)
        approx = raw.astype(np.float64) * unit_ms
        if dtype == np.int64 and unit_ms == 1:
            exact = column
        else:
            exact = np.where(np.abs(approx) < 2.0**62, raw, 0) * unit_ms
    elif pd.api.types.is_float_dtype(dtype):
        values = column.to_numpy(dtype=np.float64)
        if np.isfinite(values).all():
            with np.errstate(over="ignore"):  # an infinite product is out of bounds: checked
                approx = np.round(values * unit_ms)
            exact = np.where(np.abs(approx) < 2.0**62, approx, 0).astype(np.int64)
    elif pd.api.types.is_datetime64_any_dtype(dtype):
        stamps = column
        if getattr(dtype, "tz", None) is None:
            stamps = stamps.dt.tz_localize("UTC")
        if not stamps.isna().any():
            ns = stamps.dt.tz_convert("UTC").astype("datetime64[ns, UTC]").astype(np.int64)
            exact = ns.to_numpy() // 1_000_000
            approx = exact.astype(np.float64)
    elif pd.api.types.infer_dtype(column, skipna=True) == "string":
        parsed = pd.to_datetime(column, utc=True, format="ISO8601", errors="coerce")
        good = parsed.notna().to_numpy() | column.isna().to_numpy()
        if good.all() and not column.isna().any():
            ns = parsed.astype("datetime64[ns, UTC]").astype(np.int64)
            exact = ns.to_numpy() // 1_000_000
            approx = exact.astype(np.float64)
    if exact is None:
        if clock is None:
            return _convert_rowwise(column, "timestamp", name, unit_ms)
        return _event_times_rowwise(column, name, unit_ms, clock)
    latest = LATEST_MS if clock is None else min(LATEST_EVENT_MS, clock[0] + clock[1])
    outside = np.flatnonzero((approx < EARLIEST_MS) | (approx > latest))
    if not len(outside):
        if isinstance(exact, pd.Series):
            return exact, []
        return pd.Series(exact, index=column.index), []
    # Rare: each row out of bounds gets the one-value check, and with it the same detail.
    check = _time_check(name, unit_ms, clock)
    exact = np.array(exact, dtype=np.int64)
    failed: list[tuple[int, str, str]] = []
    for pos in outside.tolist():
        try:
            exact[pos] = check(plain_value(column.iloc[pos]))
        except BadEventError as exc:
            failed.append((pos, exc.reason, exc.detail))
            exact[pos] = 0
    return pd.Series(exact, index=column.index), failed


def event_time_ms(
    value: Any,
    unit_ms: int = 1000,
    name: str = "ts",
    *,
    ahead_ms: int = DEFAULT_AHEAD_MS,
    now_ms: int | None = None,
) -> int:
    """:func:`parse_timestamp` of an event time, held to the time bounds: at most ``ahead_ms``
    past the wall clock ``now_ms`` (default :func:`~cep.events.time_bounds.wall_clock_ms`),
    within the years an event time may have (:meth:`StreamSchema.event_time`, which a
    stream's events go through, says more).

    Too far ahead is checked first: epoch milliseconds read as seconds are also past the last
    year, and the unit is what their dead letter should be about.

    Examples
    --------
    >>> event_time_ms("2026-01-01T00:00:00Z", now_ms=1_767_225_600_000)
    1767225600000
    >>> event_time_ms("2026-01-03", now_ms=1_767_225_600_000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    cep.errors.BadEventError: too_far_ahead: event time "2026-01-03" is ...
    """
    ms = _time_ms(value, unit_ms)
    if ms is None:
        return parse_timestamp(value, unit_ms, name)
    return bounded_event_ms(value, ms, unit_ms, ahead_ms=ahead_ms, now_ms=now_ms)


def bounded_event_ms(
    value: Any,
    ms: int,
    unit_ms: int = 1000,
    *,
    ahead_ms: int = DEFAULT_AHEAD_MS,
    now_ms: int | None = None,
    happened_ms: int | None = None,
) -> int:
    """``ms``, the event time read from ``value``, held to the time bounds of
    :func:`event_time_ms`; ``happened_ms``: ``ms`` is that device time clock-corrected, which
    a dead letter's detail then says.

    Examples
    --------
    >>> bounded_event_ms("x", 5, now_ms=0)
    5
    """
    if now_ms is None:
        now_ms = wall_clock_ms()
    if ms > now_ms + ahead_ms:
        raise BadEventError(
            EventReason.TOO_FAR_AHEAD,
            ahead_detail(value, ms, unit_ms, ahead_ms, now_ms) if happened_ms is None
            else corrected_detail(happened_ms, ms, latest_ms=LATEST_EVENT_MS,
                                  ahead_ms=ahead_ms, now_ms=now_ms),
        )
    if not EARLIEST_MS <= ms <= LATEST_EVENT_MS:
        raise BadEventError(
            EventReason.BAD_TIMESTAMP,
            range_detail(value, ms, unit_ms, LATEST_EVENT_MS) if happened_ms is None
            else corrected_detail(happened_ms, ms, latest_ms=LATEST_EVENT_MS),
        )
    return ms


def _time_check(name: str, unit_ms: int, clock: tuple[int, int] | None) -> Callable[[Any], int]:
    """The one-value check of a timestamp column: :func:`parse_timestamp`, or with ``clock``
    the event time's."""
    if clock is None:
        return lambda value: parse_timestamp(value, unit_ms, name)
    return lambda value: event_time_ms(value, unit_ms, name, ahead_ms=clock[1], now_ms=clock[0])


def _event_times_rowwise(
    column: pd.Series, name: str, unit_ms: int, clock: tuple[int, int]
) -> tuple[pd.Series, list[tuple[int, str, str]]]:
    """:func:`_convert_rowwise` of the time field: each value through the event time's check."""
    check = _time_check(name, unit_ms, clock)
    out: list[Any] = []
    failed: list[tuple[int, str, str]] = []
    for pos, value in enumerate(column.tolist()):
        if _is_null(value):
            out.append(None)
            continue
        try:
            out.append(check(plain_value(value)))
        except BadEventError as exc:
            failed.append((pos, exc.reason, exc.detail))
            out.append(None)
    series = pd.Series(out, index=column.index, dtype=object)
    if not any(v is None for v in out):
        series = series.astype(np.int64)
    return series, failed


def _is_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return value is pd.NaT or value is pd.NA


def plain_value(value: Any) -> Any:
    """Native Python value for a field (numpy scalars unboxed, NaN/NA as None), through the
    objects and arrays a ``json`` field holds (Arrow's struct cells are dicts of numpy arrays).

    >>> plain_value({"a": np.array([np.int64(1), {"b": np.float64("nan")}], dtype=object)})
    {'a': [1, {'b': None}]}
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.ndarray):
        return [plain_value(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__


def _show(value: Any) -> str:
    text = json.dumps(_json_safe(value), ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        kind = "int"
    elif isinstance(value, float):
        kind = "float"
    elif isinstance(value, str):
        kind = "string"
    elif isinstance(value, list):
        kind = "list"
    elif isinstance(value, dict):
        kind = "object"
    else:
        kind = type(value).__name__
    return f"{kind} {_show(value)}"
