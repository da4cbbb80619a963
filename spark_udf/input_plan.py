"""How :func:`spark_udf.detect` reads its input frame: the event time, partition key, hash
bucket and ``_seq`` of every row as Spark columns (:func:`prepare_input`), or, for a frame of
JSON text, a :class:`~spark_udf.routing.JsonRoute` that routes the rows in Python
(:func:`json_route`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cep.events.clock import DeviceClock
from cep.events.time_bounds import (
    DEFAULT_AHEAD_MS,
    EARLIEST_MS,
    LATEST_EVENT_MS,
    fixed_clock_ms,
)
from spark_udf.batch import (
    BUCKET_COLUMN,
    END_MARK_MS,
    END_MARK_STREAM,
    SEQ_COLUMN,
    STREAM_COLUMN,
    TIME_COLUMN,
    EventLayout,
)
from spark_udf.errors import OperatorConfigError
from spark_udf.routing import JsonRoute, StreamRoute

__all__ = [
    "DetectPlan",
    "ahead_of",
    "check_reserved",
    "clock_of",
    "column_types",
    "json_route",
    "prepare_input",
    "routed_layout",
    "with_seq",
]

_KEY_PREFIX = "_vigil_k"
_JSON_PREFIX = "_vigil_j"
_UNITS_MS = {"ms": 1, "s": 1000}
_MAX_AHEAD_MS = 2**62  # a wider bound is no bound, and wall clock plus it still fits a long

AheadMs = int | Mapping[str, int]
"""How far event times may run ahead of the wall clock: one bound, or one per stream (streams
not named get :data:`~cep.events.time_bounds.DEFAULT_AHEAD_MS`)."""


@dataclass(frozen=True)
class DetectPlan:
    """How :func:`spark_udf.detect` reads the input frame (worked out on the driver, shipped
    to workers).

    Attributes
    ----------
    layout:
        How rows become event dicts.
    key_columns:
        The string columns (``_vigil_k0``...) that carry the partition key for Spark's grouping.
    lateness_ms:
        Watermark delay: the watermark is the largest event time seen minus this.
    buckets:
        Number of hash buckets of the keys.
    """

    layout: EventLayout
    key_columns: tuple[str, ...]
    lateness_ms: int
    buckets: int


def column_types(df: DataFrame) -> dict[str, T.DataType]:
    """The frame's columns by name, with their Spark types."""
    return {f.name: f.dataType for f in df.schema.fields}


def _require(df: DataFrame, names: Sequence[str], what: str) -> None:
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise OperatorConfigError(
            f"{what}: column(s) {', '.join(repr(m) for m in missing)} not in the input "
            f"(columns: {', '.join(df.columns)})"
        )


class _FieldReader:
    """Columns for event fields: the frame's own column, or a field of the JSON text column.

    JSON fields are extracted with one ``json_tuple`` over the text (one parse per row), which
    measured ~5x cheaper than a ``get_json_object`` per field and ~10x cheaper than
    ``from_json`` on this stack.
    """

    def __init__(self, df: DataFrame, json_col: str | None) -> None:
        self.df = df
        self.json_col = json_col
        self.extracted: dict[str, str] = {}

    def has(self, name: str) -> bool:
        return name in self.df.columns or self.json_col is not None

    def __call__(self, name: str) -> Column:
        if name in self.df.columns or self.json_col is None:
            return F.col(name)
        alias = self.extracted.get(name)
        if alias is None:
            alias = self.extracted[name] = f"{_JSON_PREFIX}{len(self.extracted)}"
        return F.col(alias)

    def is_json(self, name: str) -> bool:
        return name not in self.df.columns and self.json_col is not None

    def extract(self) -> DataFrame:
        """The frame with the JSON fields asked for so far as string columns."""
        if not self.extracted or self.json_col is None:
            return self.df
        names = list(self.extracted)
        return self.df.select(
            "*",
            F.json_tuple(F.col(self.json_col), *names).alias(*[self.extracted[n] for n in names]),
        )


def _stream_expr(fields: _FieldReader, default: str | None) -> Column:
    if fields.has(STREAM_COLUMN):
        column = fields(STREAM_COLUMN)
    else:
        column = F.lit(None).cast("string")
    return column if default is None else F.coalesce(column, F.lit(default))


def _per_stream(
    fields: _FieldReader, default: str | None, branches: Mapping[str, Column]
) -> Column:
    if len(branches) == 1:
        # One stream: no test needed (events of other streams are ignored by the processor).
        return next(iter(branches.values()))
    stream = _stream_expr(fields, default)
    expr: Column | None = None
    for name, branch in branches.items():
        test = stream == F.lit(name)
        expr = F.when(test, branch) if expr is None else expr.when(test, branch)
    assert expr is not None
    return expr


def ahead_of(processor: object) -> dict[str, int]:
    """Each stream's ``ahead`` bound (ms), as the processor's stream schemas hold them (none
    for a processor without schemas, or a factory of processors).

    Examples
    --------
    >>> from spark_udf.rules import processor_specs
    >>> (spec,), _ = processor_specs('''
    ... stream txn (card_id string, ts timestamp) time ts ahead 1h
    ... rule r from txn by card_id pattern a define a as card_id == "x"
    ... ''')
    >>> ahead_of(spec.processor)
    {'txn': 3600000}
    """
    schemas = getattr(processor, "schemas", None)
    if not isinstance(schemas, Mapping):
        return {}
    return {
        name: int(schema.ahead_ms) for name, schema in schemas.items()
        if isinstance(getattr(schema, "ahead_ms", None), int)
    }


def clock_of(processor: object) -> dict[str, DeviceClock]:
    """Each clock-corrected stream's :class:`~cep.events.clock.DeviceClock`, as the
    processor's stream schemas hold them (none for a processor without schemas).

    Examples
    --------
    >>> from spark_udf.rules import processor_specs
    >>> (spec,), _ = processor_specs('''
    ... stream app (user string, ts timestamp, s timestamp, r timestamp)
    ...   time ts sent s received r
    ... rule r from app by user pattern a define a as user == "x"
    ... ''')
    >>> clock_of(spec.processor)
    {'app': DeviceClock(sent_field='s', received_field='r', device_field='ts_device')}
    """
    schemas = getattr(processor, "schemas", None)
    if not isinstance(schemas, Mapping):
        return {}
    return {
        name: schema.clock for name, schema in schemas.items()
        if isinstance(getattr(schema, "clock", None), DeviceClock)
    }


def _time_expr(
    fields: _FieldReader,
    time_col: str | Mapping[str, str],
    time_unit: str | Mapping[str, str],
    stream: str | None,
    ahead_ms: AheadMs = DEFAULT_AHEAD_MS,
) -> Column:
    if isinstance(time_col, Mapping):
        if not time_col:
            raise OperatorConfigError("time_col maps no stream to a time field")
        units = time_unit if isinstance(time_unit, Mapping) else dict.fromkeys(time_col, time_unit)
        branches = {
            name: _time_expr(fields, field, units.get(name, "ms"), stream,
                             _ahead_for(ahead_ms, name))
            for name, field in time_col.items()
        }
        return _per_stream(fields, stream, branches)
    if isinstance(time_unit, Mapping) or time_unit not in _UNITS_MS:
        raise OperatorConfigError(f"time_unit must be 'ms' or 's', got {time_unit!r}")
    unit_ms = _UNITS_MS[time_unit]
    return _bounded(_raw_time(fields, time_col, unit_ms), _ahead_for(ahead_ms, stream))


def _raw_time(fields: _FieldReader, time_col: str, unit_ms: int) -> Column:
    """Epoch ms of the time field, null where it is not a time; ``try_`` arithmetic because
    ANSI mode raises on overflow, and a number too large for a time must reach the processor
    (which dead-letters it), not fail the query."""
    if fields.is_json(time_col):
        return _text_time(fields(time_col), unit_ms)
    _require(fields.df, [time_col], "time_col")
    kind = column_types(fields.df)[time_col]
    column = F.col(time_col)
    if isinstance(kind, T.TimestampType | T.TimestampNTZType | T.DateType):
        return F.unix_millis(column.cast("timestamp"))
    if isinstance(kind, T.IntegralType):
        return F.try_multiply(column.cast("long"), F.lit(unit_ms).cast("long"))
    if isinstance(kind, T.FractionalType):
        return (column.cast("double") * F.lit(unit_ms)).try_cast("long")
    if isinstance(kind, T.StringType):
        return _text_time(column, unit_ms)
    raise OperatorConfigError(
        f"time column '{time_col}' has type {kind.simpleString()}; expected a timestamp, an "
        "epoch number or ISO-8601 text"
    )


def _ahead_for(ahead_ms: AheadMs, stream: str | None) -> int:
    """The bound of ``stream``'s events; of events of any stream (``None``), the widest."""
    if not isinstance(ahead_ms, Mapping):
        return ahead_ms
    if stream is None:
        return max(ahead_ms.values(), default=DEFAULT_AHEAD_MS)
    return ahead_ms.get(stream, DEFAULT_AHEAD_MS)


def _bounded(ms: Column, ahead_ms: int) -> Column:
    """``ms`` where it is a time that can be right, else null, as
    :meth:`cep.events.event.StreamSchema.event_time` bounds it: a row more than ``ahead_ms``
    past the wall clock, or outside the years an event time may have, must not move Spark's
    watermark (it reaches the processor without a time, and the processor dead-letters it)."""
    fixed = fixed_clock_ms()
    # current_timestamp() is the start of the micro-batch (of the query, for a static frame).
    now = F.lit(fixed) if fixed is not None else F.unix_millis(F.current_timestamp())
    latest = F.least(now + F.lit(min(ahead_ms, _MAX_AHEAD_MS)), F.lit(LATEST_EVENT_MS))
    return F.when(ms.between(F.lit(EARLIEST_MS), latest), ms)


def _text_time(text: Column, unit_ms: int) -> Column:
    # Epoch numbers first, then ISO-8601; try_ variants because ANSI mode raises on bad input,
    # and a bad time must reach the processor (which dead-letters it), not fail the query.
    return F.coalesce(
        (text.try_cast("double") * F.lit(unit_ms)).try_cast("long"),
        F.unix_millis(F.try_to_timestamp(text)),
    )


def _key_exprs(
    fields: _FieldReader,
    key_cols: Sequence[str] | Mapping[str, Sequence[str]],
    stream: str | None,
) -> list[Column]:
    def value(name: str) -> Column:
        if not fields.is_json(name):
            _require(fields.df, [name], "key_cols")
        return fields(name).cast("string")

    if isinstance(key_cols, Mapping):
        widths = {len(tuple(v)) for v in key_cols.values()}
        if len(widths) != 1:
            raise OperatorConfigError(
                f"every stream's key must have the same number of fields, got {dict(key_cols)}"
            )
        width = widths.pop()
        if width == 0:
            # One group for the whole stream (a metric without ``by``): a constant key.
            return [F.lit("")]
        return [
            _per_stream(fields, stream, {name: value(tuple(cols)[i])
                                         for name, cols in key_cols.items()})
            for i in range(width)
        ]
    if isinstance(key_cols, str):
        key_cols = [key_cols]
    if not key_cols:
        raise OperatorConfigError("key_cols names no column")
    return [value(name) for name in key_cols]


def check_reserved(df: DataFrame) -> None:
    """Refuse input columns named like the operator's own (``_vigil_...``)."""
    reserved = [c for c in df.columns if c.startswith("_vigil_")]
    if reserved:
        raise OperatorConfigError(f"input columns {reserved} use the reserved prefix '_vigil_'")


def with_seq(frame: DataFrame, columns: Sequence[str]) -> DataFrame:
    """``frame`` with a ``_seq`` column: its own, or a hash of the input ``columns``. Without
    an input position, a content hash is the deterministic id and tie-breaker: the same row
    gets the same ``_seq`` on every replay."""
    if SEQ_COLUMN in columns:
        return frame
    content = [F.col(c) for c in columns]
    return frame.withColumn(SEQ_COLUMN, F.pmod(F.xxhash64(*content), F.lit(2**62)))


def prepare_input(
    df: DataFrame,
    *,
    key_cols: Sequence[str] | Mapping[str, Sequence[str]],
    time_col: str | Mapping[str, str],
    time_unit: str | Mapping[str, str],
    lateness_ms: int,
    stream: str | None,
    json_col: str | None,
    buckets: int,
    ahead_ms: AheadMs = DEFAULT_AHEAD_MS,
) -> tuple[DataFrame, DetectPlan]:
    """``df`` with the operator's columns added (event time, key, bucket, ``_seq``; timestamps
    as ISO text) and the plan that reads it; the arguments are :func:`spark_udf.detect`'s. The
    event time is null where the time cannot be right (see :func:`_bounded`)."""
    if json_col is not None:
        _require(df, [json_col], "json_col")
    check_reserved(df)
    fields = _FieldReader(df, json_col)
    # The end-of-input mark of a finite stream (see spark_udf.batch.END_MARK_STREAM) carries
    # the time that moves the watermark past every event.
    time_expr = F.when(
        _stream_expr(fields, None) == F.lit(END_MARK_STREAM), F.lit(END_MARK_MS)
    ).otherwise(_time_expr(fields, time_col, time_unit, stream, ahead_ms))
    keys = _key_exprs(fields, key_cols, stream)
    prepared = fields.extract()
    if json_col is None:
        for name, kind in column_types(df).items():
            # The processor reads timestamps as ISO-8601 text or epoch numbers, like JSON input.
            if isinstance(kind, T.TimestampType | T.TimestampNTZType):
                prepared = prepared.withColumn(
                    name, F.date_format(F.col(name), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")
                )
    prepared = with_seq(prepared, df.columns)
    key_names = tuple(f"{_KEY_PREFIX}{i}" for i in range(len(keys)))
    prepared = prepared.withColumns(
        {TIME_COLUMN: time_expr, **dict(zip(key_names, keys, strict=True))}
    )
    prepared = prepared.withColumn(
        BUCKET_COLUMN, F.pmod(F.xxhash64(*[F.col(n) for n in key_names]), F.lit(buckets))
    ).drop(*fields.extracted.values())
    event_columns = [
        c for c in prepared.columns
        if not c.startswith("_vigil_") and c != json_col
    ]
    ints = frozenset(
        name for name, kind in column_types(prepared).items()
        if isinstance(kind, T.IntegralType) and name in event_columns
    )
    layout = EventLayout(
        event_columns=tuple(event_columns), json_column=json_col, int_columns=ints,
        default_stream=stream,
    )
    return prepared, DetectPlan(
        layout=layout, key_columns=key_names, lateness_ms=lateness_ms, buckets=buckets
    )


def json_route(
    columns: Sequence[str],
    json_col: str | None,
    key_cols: Sequence[str] | Mapping[str, Sequence[str]],
    time_col: str | Mapping[str, str],
    time_unit: str | Mapping[str, str],
    stream: str | None,
    buckets: int,
    ahead_ms: AheadMs = DEFAULT_AHEAD_MS,
    clocks: Mapping[str, DeviceClock] | None = None,
) -> JsonRoute | None:
    """How to route rows of a frame with these columns whose stream, key and time all come
    from the JSON text column, or ``None`` when some come from the frame's own columns (Spark
    expressions then compute them, see :func:`prepare_input`); ``ahead_ms`` bounds each
    stream's times as :func:`prepare_input`'s does; ``clocks`` names the streams whose times
    are corrected for their device's clock (:mod:`cep.events.clock`), as their processor's
    events are."""
    if json_col is None or json_col not in columns:
        return None

    def unit_of(name: str | None) -> int:
        unit = time_unit.get(name, "ms") if isinstance(time_unit, Mapping) else time_unit
        if unit not in _UNITS_MS:
            raise OperatorConfigError(f"time_unit must be 'ms' or 's', got {unit!r}")
        return _UNITS_MS[unit]

    streams: dict[str | None, StreamRoute] = {}
    if isinstance(key_cols, Mapping) or isinstance(time_col, Mapping):
        names = set(key_cols) if isinstance(key_cols, Mapping) else set()
        names |= set(time_col) if isinstance(time_col, Mapping) else set()
        for name in sorted(names):
            keys = key_cols.get(name) if isinstance(key_cols, Mapping) else key_cols
            times = time_col.get(name) if isinstance(time_col, Mapping) else time_col
            if keys is None or times is None:
                return None
            keys = (keys,) if isinstance(keys, str) else tuple(keys)
            streams[name] = StreamRoute(keys, times, unit_of(name), _ahead_for(ahead_ms, name),
                                        (clocks or {}).get(name))
    else:
        keys = (key_cols,) if isinstance(key_cols, str) else tuple(key_cols)
        if not keys:
            return None
        streams[None] = StreamRoute(keys, time_col, unit_of(None), _ahead_for(ahead_ms, stream),
                                    (clocks or {}).get(stream) if stream is not None else None)
    if len({len(r.key_fields) for r in streams.values()}) != 1:
        return None  # _key_exprs reports the mismatch
    if len(streams) == 1:
        # One stream: its fields route every row, as _per_stream does (rows of other streams
        # are ignored by the processor but still move the watermark).
        streams = {None: next(iter(streams.values()))}
    used = {STREAM_COLUMN} | {f for r in streams.values() for f in (*r.key_fields, *r.time_inputs)}
    if used & set(columns):
        return None
    return JsonRoute(json_col, streams, stream, buckets)


def routed_layout(
    columns: Mapping[str, T.DataType], json_col: str, stream: str | None
) -> EventLayout:
    """How the stateful operator reads routed rows of a frame with these columns (plus the
    ``_seq`` :func:`detect_plan` adds when the frame has none)."""
    names = [*columns, *([] if SEQ_COLUMN in columns else [SEQ_COLUMN])]
    event_columns = tuple(c for c in names if c != json_col)
    ints = frozenset(
        name for name in event_columns
        if name not in columns or isinstance(columns[name], T.IntegralType)
    )
    return EventLayout(event_columns=event_columns, json_column=json_col, int_columns=ints,
                       default_stream=stream)
