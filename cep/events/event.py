"""Events as the engine sees them, and their validation against a declared ``stream``.

Raw input (a JSON line, a dict, a DataFrame) becomes :class:`Event` values with event time in
epoch milliseconds; input that does not fit the schema becomes a dead letter instead, so one bad
line never stops a run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cep.errors import BadEventError, EngineError, StateError, UnknownRuleError
from query_lang.ast import StreamDecl
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
    "dead_letter",
    "parse_json_line",
    "parse_timestamp",
    "plain_value",
    "stream_of",
    "time_column_ms",
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
    LATE = "late"


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
        "raw": raw if raw is not None else _raw_text(event),
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


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def parse_json_line(text: str) -> dict[str, Any]:
    """Decode one JSON line into an object, raising :class:`BadEventError` when it is not one."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadEventError(EventReason.INVALID_JSON, f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadEventError(
            EventReason.NOT_AN_OBJECT,
            f"expected a JSON object, got {_json_kind(value)}",
        )
    return value


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
        Declared field name -> type (``string int float bool timestamp text list<string>``).
    time_field:
        The event-time field: the declared ``time`` field, else the only ``timestamp`` field.
    epoch_unit_ms:
        Milliseconds per unit of epoch numbers in timestamp fields (1000 for seconds, 1 for ms).
    lateness_ms:
        Bounded out-of-orderness of the stream.
    id_field:
        Field holding an event's id (default ``id``).
    """

    name: str
    fields: Mapping[str, str]
    time_field: str | None
    epoch_unit_ms: int = 1000
    lateness_ms: int = 0
    id_field: str = "id"
    _timestamps: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_decl(cls, decl: StreamDecl, *, lateness_ms: int | None = None) -> StreamSchema:
        """Prepare ``decl``; ``lateness_ms`` overrides the declared lateness."""
        fields = {f.name: f.type for f in decl.fields}
        time_field = decl.time_field
        if time_field is None:
            stamps = [n for n, t in fields.items() if t == "timestamp"]
            time_field = stamps[0] if len(stamps) == 1 else None
        if time_field is not None:
            # Event time is epoch ms everywhere, whatever type the time field was declared with.
            fields[time_field] = "timestamp"
        if lateness_ms is None:
            lateness_ms = decl.lateness.ms if decl.lateness is not None else 0
        return cls(
            name=decl.name,
            fields=fields,
            time_field=time_field,
            epoch_unit_ms=1 if decl.time_unit == "ms" else 1000,
            lateness_ms=int(lateness_ms),
            id_field=decl.id_field or "id",
            _timestamps=tuple(n for n, t in fields.items() if t == "timestamp"),
        )

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
            When the time field is missing or a field does not have its declared type.
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
                fields[name] = _convert(value, kind, name, self.epoch_unit_ms)
            elif name in raw:
                fields[name] = None
        for name, value in raw.items():
            if name not in declared and name != STREAM_FIELD and name != SEQ_FIELD:
                fields[name] = plain_value(value)
        ts = fields.get(self.time_field)
        if ts is None:
            raise BadEventError(
                EventReason.MISSING_TIME,
                f"time field '{self.time_field}' is missing or null",
            )
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
    if pd.api.types.infer_dtype(column, skipna=False) == "string":
        return column.tolist()  # plain str values, no null: nothing to convert
    return [plain_value(v) for v in column.tolist()]


# ---------------------------------------------------------------------- value conversion


def _convert(value: Any, kind: str, name: str, unit_ms: int) -> Any:
    if kind in ("string", "text"):
        if isinstance(value, str):
            return value
    elif kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "timestamp":
        return parse_timestamp(value, unit_ms, name)
    elif kind == "list<string>":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    else:
        return value
    raise BadEventError(
        EventReason.WRONG_TYPE, f"field '{name}' expected {kind}, got {_describe(value)}"
    )


def parse_timestamp(value: Any, unit_ms: int = 1000, name: str = "ts") -> int:
    """Epoch milliseconds from an ISO-8601 string or an epoch number in ``unit_ms`` units.

    ISO-8601 times without an offset are taken as UTC (:mod:`query_lang.timestamps`).
    """
    ms = parse_iso_ms(value) if isinstance(value, str) else epoch_ms(value, unit_ms)
    if ms is not None:
        return ms
    raise BadEventError(
        EventReason.BAD_TIMESTAMP,
        f"field '{name}' expected an ISO-8601 timestamp or epoch number, got {_describe(value)}",
    )


def time_column_ms(column: pd.Series, name: str, unit_ms: int) -> np.ndarray:
    """Event times (epoch ms, as float) of a column of raw time values, parsed as
    :func:`parse_timestamp` parses one; ``NaN`` where a value is missing or not a time.

    Examples
    --------
    >>> time_column_ms(pd.Series([1.5, None]), "ts", 1000).tolist()
    [1500.0, nan]
    >>> time_column_ms(pd.Series(["1970-01-01T00:00:01Z", "soon"]), "ts", 1).tolist()
    [1000.0, nan]
    """
    converted, failed = _timestamp_column(column, name, unit_ms)
    out = pd.to_numeric(pd.Series(converted), errors="coerce").to_numpy(dtype=np.float64)
    for position, _reason, _detail in failed:
        out[position] = np.nan
    return out


def _convert_column(
    column: pd.Series, kind: str, name: str, unit_ms: int
) -> tuple[pd.Series, list[tuple[int, str, str]]]:
    """Vectorised :func:`_convert`: the converted column and ``(position, reason, detail)``
    failures."""
    dtype = column.dtype
    if kind == "float":
        if dtype == np.float64:
            return column, []
        if pd.api.types.is_float_dtype(dtype) or (
            pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
        ):
            return column.astype(np.float64), []
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
    column: pd.Series, name: str, unit_ms: int
) -> tuple[pd.Series, list[tuple[int, str, str]]]:
    dtype = column.dtype
    if pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
        if dtype == np.int64 and unit_ms == 1:
            return column, []
        return column.astype(np.int64) * unit_ms, []
    if pd.api.types.is_float_dtype(dtype):
        values = column.to_numpy(dtype=np.float64)
        finite = np.isfinite(values)
        if finite.all():
            return pd.Series(np.round(values * unit_ms).astype(np.int64), index=column.index), []
    if pd.api.types.is_datetime64_any_dtype(dtype):
        stamps = column
        if getattr(dtype, "tz", None) is None:
            stamps = stamps.dt.tz_localize("UTC")
        if not stamps.isna().any():
            ms = stamps.dt.tz_convert("UTC").astype("datetime64[ns, UTC]").astype(np.int64)
            return ms // 1_000_000, []
    if pd.api.types.infer_dtype(column, skipna=True) == "string":
        parsed = pd.to_datetime(column, utc=True, format="ISO8601", errors="coerce")
        good = parsed.notna().to_numpy() | column.isna().to_numpy()
        if good.all() and not column.isna().any():
            ns = parsed.astype("datetime64[ns, UTC]").astype(np.int64)
            return ns // 1_000_000, []
    return _convert_rowwise(column, "timestamp", name, unit_ms)


def _is_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return value is pd.NaT or value is pd.NA


def plain_value(value: Any) -> Any:
    """Native Python value for a field (numpy scalars unboxed, NaN/NA as None)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.ndarray):
        return [plain_value(v) for v in value.tolist()]
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
