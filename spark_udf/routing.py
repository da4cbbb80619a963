"""Routing JSON rows before the shuffle: each row's event time, hash bucket and whether the
processor may need it, worked out column-wise in Python, then packed one blob per bucket.

Spark's own JSON functions parse a row at a time on the JVM (``json_tuple`` was ~40 % of the
executors' CPU on W1); here one ``pyarrow.json`` parse per input batch yields the stream, key
and time fields and the fields the rules' conditions read, and the rows no rule can take are
flagged so the stateful operator turns only the others (and late ones) into Python objects.

Each output row is ``(bucket, max event time, Arrow IPC blob)``: Spark's watermark is the
largest event time seen, so the per-blob maximum gives it exactly. The events of a
clock-corrected stream that keep their device time (no sent or received time) are counted here,
once per input row whichever processors read it, and the count rides in the schema metadata of
one blob of the batch (:data:`UNCORRECTED_METADATA`) to the stateful operator, which reports it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import json as pa_json

from cep.events.clock import DeviceClock
from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    StreamSchema,
    corrected_event_time_ms,
    corrected_time_column_ms,
    event_time_ms,
    parse_json_line,
    time_column_ms,
)
from cep.events.keyed import KeyedProcessor
from cep.events.time_bounds import DEFAULT_AHEAD_MS
from spark_udf.batch import BUCKET_COLUMN, END_MARK_MS, END_MARK_STREAM, TIME_COLUMN
from spark_udf.errors import OperatorConfigError
from spark_udf.packing import PACKED_COLUMN, ipc_bytes
from spark_udf.relevance import ARROW_TYPES, json_fields, needed_from_parsed, unchecked_rows

__all__ = [
    "DEFAULT_BUCKETS",
    "MAX_TIME_COLUMN",
    "NEED_COLUMN",
    "NEED_NO",
    "NEED_UNKNOWN",
    "NEED_YES",
    "ROUTED_SCHEMA",
    "UNCORRECTED_METADATA",
    "JsonRoute",
    "RoutePlan",
    "StreamRoute",
    "check_buckets",
    "resolve_processor",
    "route_batches",
    "route_plan_batches",
    "uncorrected_counts",
    "uncorrected_in",
]

MAX_TIME_COLUMN = "_vigil_max_ms"
"""Largest event time (ms) of a blob's rows, the column Spark's watermark is defined on."""
NEED_COLUMN = "_vigil_need"
"""Per row inside a blob: whether the processor may need it (:data:`NEED_NO`, :data:`NEED_YES`,
or :data:`NEED_UNKNOWN` when no column-wise test applied and the operator must decide)."""
NEED_NO, NEED_YES, NEED_UNKNOWN = 0, 1, 2

ROUTED_SCHEMA = f"{BUCKET_COLUMN} bigint, {MAX_TIME_COLUMN} bigint, {PACKED_COLUMN} binary"
"""Schema of the routed rows (the blob last, where the operator looks for it)."""

_ARROW_ROUTED = pa.schema(
    [(BUCKET_COLUMN, pa.int64()), (MAX_TIME_COLUMN, pa.int64()), (PACKED_COLUMN, pa.binary())]
)
_KEY_SEPARATOR = "\x1f"

UNCORRECTED_METADATA = b"vigil.uncorrected"
"""Key of the Arrow schema metadata by which one routed blob of an input batch carries, as JSON
``{stream: count}``, how many of the batch's events kept their device time
(:func:`uncorrected_counts`). Inside the blob, not a column of :data:`ROUTED_SCHEMA`: the
routed rows' schema, and so the sources and checkpoints that read it, stay as they were."""

DEFAULT_BUCKETS = 16
"""Hash buckets per processor unless the caller says otherwise. Every bucket costs a Python
call and a state read and write per micro-batch (~5 ms on top of its events, measured on
``local[2]``), and a bucket is the unit of parallelism of the stateful operator: 16 keeps the
calls few and still spreads over up to 8 cores' shuffle partitions (``docs/spark.md``)."""

ProcessorSource = KeyedProcessor | Callable[[], KeyedProcessor]


def resolve_processor(source: ProcessorSource) -> KeyedProcessor:
    """The processor itself, or the one a zero-argument factory builds."""
    if hasattr(source, "process") and hasattr(source, "key_of"):
        return source  # type: ignore[return-value]
    return source()  # type: ignore[operator]


def check_buckets(buckets: Any) -> None:
    """Raise :class:`OperatorConfigError` unless ``buckets`` is a positive int."""
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
        raise OperatorConfigError(f"buckets must be a positive int, got {buckets!r}")


@dataclass(frozen=True)
class StreamRoute:
    """Where one stream's rows keep their key and time.

    Attributes
    ----------
    key_fields:
        The partition key's fields, in key order (empty: one group for the whole stream).
    time_field:
        The event-time field: epoch number in ``unit_ms`` units or ISO-8601 text.
    unit_ms:
        Milliseconds per unit of an epoch number.
    ahead_ms:
        How far past the wall clock a time may be (the stream's ``ahead``): a time beyond it
        routes with no time, so it moves no watermark.
    clock:
        The stream's device clock correction, if it declares one: rows route with their
        corrected time (:mod:`cep.events.clock`), as the processor's events carry it.
    """

    key_fields: tuple[str, ...]
    time_field: str
    unit_ms: int
    ahead_ms: int = DEFAULT_AHEAD_MS
    clock: DeviceClock | None = None

    @property
    def time_inputs(self) -> tuple[str, ...]:
        """The fields a row's time is computed from."""
        if self.clock is None:
            return (self.time_field,)
        return (self.time_field, self.clock.sent_field, self.clock.received_field)


@dataclass(frozen=True)
class JsonRoute:
    """How :func:`route_batches` reads a JSON text column.

    Attributes
    ----------
    json_column:
        The column holding each event's JSON text.
    streams:
        Stream name -> its route; the key ``None`` routes every row whatever its stream.
    default_stream:
        Stream of rows whose JSON names none.
    buckets:
        Number of hash buckets.
    clocked:
        Other processors' streams whose times are corrected for their device's clock: a
        route of every row (``None``) times their rows as their own processor does, so
        that a device's clock never moves the watermark (:mod:`cep.events.clock`).
    broadcast:
        Streams whose rows go to every bucket (changelogs of tables looked up by another
        key than the rules'; :mod:`cep.tables`).
    """

    json_column: str
    streams: Mapping[str | None, StreamRoute]
    default_stream: str | None
    buckets: int
    clocked: Mapping[str, StreamRoute] = field(default_factory=dict)
    broadcast: frozenset[str] = frozenset()

    def time_route(self, stream: Any) -> StreamRoute | None:
        """The route whose fields give a row of ``stream`` (any JSON value a line holds) its
        time."""
        if None in self.streams and isinstance(stream, str) and stream in self.clocked:
            return self.clocked[stream]
        return self.route_of(stream)

    def route_of(self, stream: Any) -> StreamRoute | None:
        """The route of a row of ``stream`` (``None`` for a stream the operator has no key for)."""
        route = self.streams.get(None)
        if route is not None:
            return route
        return self.streams.get(stream) if isinstance(stream, str) else None


# ---------------------------------------------------------------------------- key texts


def _declared(processor: Any, stream: str | None, name: str) -> pa.DataType:
    schemas = getattr(processor, "schemas", None) or {}
    candidates = [schemas[stream]] if stream in schemas else list(schemas.values())
    for schema in candidates:
        kind = getattr(schema, "fields", {}).get(name)
        if kind in ARROW_TYPES:
            return ARROW_TYPES[kind]
    return pa.string()


def _texts_of(values: pa.Array | Sequence[Any], kind: pa.DataType) -> list[str | None]:
    """Key values as text, the same way for a parsed column and for values of ``json.loads``:
    through an Arrow array of the declared type, so ``7`` and ``7.0`` of a float field agree."""
    if not isinstance(values, pa.Array):
        try:
            values = pa.array(values, type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return [_one_text(v, kind) for v in values]
    return pc.cast(values, pa.string()).to_pylist()


def _one_text(value: Any, kind: pa.DataType) -> str | None:
    if value is None:
        return None
    try:
        return pc.cast(pa.array([value], type=kind), pa.string())[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        # A value of the wrong type: the processor dead-letters the event, any bucket will do.
        return json.dumps(value, sort_keys=True, default=str)


EVERY_BUCKET = -1
"""The bucket of a row that goes to every bucket (:attr:`JsonRoute.broadcast`)."""
_EVERY = "\x00every"  # the key text of such a row (a key's text never starts with a NUL)


def _buckets_of(texts: Sequence[str | None], buckets: int) -> np.ndarray:
    """Stable hash buckets of key texts (``None``: no key, bucket 0; :data:`_EVERY`:
    :data:`EVERY_BUCKET`)."""
    array = np.array(["" if t is None else t for t in texts], dtype=object)
    hashed = pd.util.hash_array(array) % np.uint64(buckets)
    out = hashed.astype(np.int64)
    out[np.array([t is None for t in texts], dtype=bool)] = 0
    out[np.array([t is _EVERY for t in texts], dtype=bool)] = EVERY_BUCKET
    return out


def _joined(columns: list[list[str | None]], n: int) -> list[str | None]:
    if not columns:
        return [""] * n  # no key fields: one group
    if len(columns) == 1:
        return columns[0]
    return [
        None if None in parts else _KEY_SEPARATOR.join(parts)  # type: ignore[arg-type]
        for parts in zip(*columns, strict=True)
    ]


# ---------------------------------------------------------------------------- column-wise


def _newline_joined(texts: pa.Array) -> pa.Buffer:
    """The texts as one buffer of lines, without a Python string per row."""
    lines = pc.binary_join_element_wise(texts, pa.scalar("", texts.type), "\n")
    offsets_width = 8 if pa.types.is_large_string(lines.type) else 4
    _, offsets, data = lines.buffers()
    view = np.frombuffer(offsets, dtype=np.int64 if offsets_width == 8 else np.int32)
    view = view[lines.offset: lines.offset + len(lines) + 1]
    return data.slice(int(view[0]), int(view[-1] - view[0]))


def _read_timed(
    texts: pa.Array, fields: Mapping[str, pa.DataType], time_fields: Iterable[str]
) -> pa.Table | None:
    """The JSON object ``texts`` parsed column-wise (``pyarrow.json``, other fields ignored):
    ``fields`` of their types, ``time_fields`` as numbers (epoch times) or, when some row holds
    text there, as text (ISO-8601); ``None`` when neither reads every row as one object."""
    buffer = _newline_joined(texts)
    block = max(1 << 20, buffer.size + 1)
    for time_type in (pa.float64(), pa.string()):
        schema = pa.schema(list(fields.items()) + [(name, time_type) for name in time_fields])
        options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        try:
            table = pa_json.read_json(
                io.BytesIO(buffer), parse_options=options,
                read_options=pa_json.ReadOptions(block_size=block, use_threads=False),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return table if table.num_rows == len(texts) else None
    return None


class _Router:
    """Column-wise routing of one processor's rows (built once per Python worker)."""

    def __init__(self, route: JsonRoute, processor: Any) -> None:
        self.route = route
        self.processor = processor
        self.relevance = json_fields(processor)
        fields: dict[str, pa.DataType] = {STREAM_FIELD: pa.string()}
        consistent = True
        time_fields: set[str] = set()
        for sroute in route.clocked.values():
            time_fields.update(sroute.time_inputs)
        for stream, sroute in route.streams.items():
            time_fields.update(sroute.time_inputs)
            for name in sroute.key_fields:
                kind = _declared(processor, stream, name)
                if fields.setdefault(name, kind) != kind:
                    consistent = False
        for name, kind in (self.relevance or {}).items():
            if name in time_fields:
                continue
            if fields.setdefault(name, kind) != kind:
                self.relevance = None
        self.time_fields = time_fields
        self.fields = fields if consistent and not (time_fields & set(fields)) else None

    def _parse(self, texts: pa.Array) -> pa.Table | None:
        if self.fields is None:
            return None
        return _read_timed(texts, self.fields, self.time_fields)

    def locate(self, texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(times ms as float with NaN for none, buckets, need)`` of the rows' JSON texts.

        Only texts that open an object reach the column-wise parser (``pyarrow.json`` must
        never see a bare ``null``); the others get no time and no key, and the processor
        reports them when it parses them. Texts the column-wise parser could take although
        the line checks of :func:`~cep.events.event.parse_json_line` refuse them (too large,
        too deep, ``NaN``: :func:`~spark_udf.relevance.unchecked_rows`) are parsed row by row
        instead, so that no bad row is ever judged unneeded and dropped before the processor
        reports it.
        """
        n = len(texts)
        times = np.full(n, np.nan)
        keys: list[str | None] = [None] * n
        need = np.full(n, NEED_UNKNOWN, dtype=np.int8)
        opens = pc.starts_with(pc.utf8_ltrim_whitespace(texts), "{")
        opens = pc.fill_null(opens, False).to_numpy(zero_copy_only=False)
        odd = unchecked_rows(texts) & opens
        parts = ((np.flatnonzero(opens & ~odd), True), (np.flatnonzero(odd), False))
        for rows, columnwise in parts:
            if not len(rows):
                continue
            objects = texts.take(pa.array(rows)) if len(rows) < n else texts
            located = self._parse(objects) if columnwise else None
            part_times, part_keys, part_need = (
                self._locate_parsed(located) if located is not None
                else self._locate_rowwise(objects.to_pylist())
            )
            times[rows] = part_times
            need[rows] = part_need
            for row, key in zip(rows.tolist(), part_keys, strict=True):
                keys[row] = key
        return times, _buckets_of(keys, self.route.buckets), need

    def _locate_parsed(
        self, table: pa.Table
    ) -> tuple[np.ndarray, list[str | None], np.ndarray]:
        n = table.num_rows
        stream_column = table.column(STREAM_FIELD)
        if stream_column.null_count == n:
            # No row names its stream (the common case of a one-stream input): no per-row
            # comparison of stream names.
            end = np.zeros(n, dtype=bool)
            if None in self.route.streams:
                routes = [(None, None)]
            elif self.route.default_stream in self.route.streams:
                routes = [(self.route.default_stream, None)]
            else:
                routes = []
        else:
            streams = stream_column.to_pandas()
            if self.route.default_stream is not None:
                streams = streams.fillna(self.route.default_stream)
            end = (streams == END_MARK_STREAM).to_numpy()
            routes = ([(None, np.ones(n, dtype=bool))] if None in self.route.streams else
                      [(s, (streams == s).to_numpy()) for s in self.route.streams])
        times = np.full(n, np.nan)
        keys: list[str | None] = [None] * n
        for stream, mask in routes:
            # mask None: every row
            rows = np.arange(n) if mask is None else np.flatnonzero(mask)
            if not len(rows):
                continue
            sroute = self.route.streams[stream]
            part = table if len(rows) == n else table.take(pa.array(rows))
            column = part.column(sroute.time_field).to_pandas()
            if sroute.clock is None:
                times[rows] = time_column_ms(column, sroute.time_field, sroute.unit_ms,
                                             ahead_ms=sroute.ahead_ms)
            else:
                times[rows] = corrected_time_column_ms(
                    column, part.column(sroute.clock.sent_field).to_pandas(),
                    part.column(sroute.clock.received_field).to_pandas(), sroute.clock,
                    sroute.time_field, sroute.unit_ms, ahead_ms=sroute.ahead_ms,
                )
            texts_by_field = [
                _texts_of(part.column(name).combine_chunks(), self.fields[name])  # type: ignore[index]
                for name in sroute.key_fields
            ]
            joined = _joined(texts_by_field, len(rows))
            if stream in self.route.broadcast:
                joined = [_EVERY] * len(rows)
            if len(rows) == n:
                keys = list(joined)
            else:
                for row, text in zip(rows.tolist(), joined, strict=True):
                    keys[row] = text
        if None in self.route.streams and stream_column.null_count < n:
            for name, sroute in self.route.clocked.items():
                rows = np.flatnonzero((streams == name).to_numpy())
                if len(rows):
                    part = table.take(pa.array(rows))
                    times[rows] = corrected_time_column_ms(
                        part.column(sroute.time_field).to_pandas(),
                        part.column(sroute.clock.sent_field).to_pandas(),
                        part.column(sroute.clock.received_field).to_pandas(), sroute.clock,
                        sroute.time_field, sroute.unit_ms, ahead_ms=sroute.ahead_ms,
                    )
        times[end] = END_MARK_MS
        need = np.full(n, NEED_UNKNOWN, dtype=np.int8)
        timed = ~np.isnan(times) & ~end
        if self.relevance is not None and timed.any():
            rows = np.flatnonzero(timed)
            needed = needed_from_parsed(
                self.processor, table if len(rows) == n else table.take(pa.array(rows)),
                times[rows].astype(np.int64), self.route.default_stream,
            )
            if needed is not None:
                # Rows without a usable time stay undecided: the processor reports them.
                need[rows] = needed.astype(np.int8)
        need[end] = NEED_NO
        return times, keys, need

    def _locate_rowwise(
        self, texts: list[Any]
    ) -> tuple[np.ndarray, list[str | None], np.ndarray]:
        """The same, one :func:`~cep.events.event.parse_json_line` per row: for input the
        column-wise parse refused (a bad row, mixed types); rows that are not JSON objects, or
        break an event's limits, get no time and bucket 0."""
        n = len(texts)
        times = np.full(n, np.nan)
        need = np.full(n, NEED_UNKNOWN, dtype=np.int8)
        per_route: dict[Any, tuple[list[int], list[list[Any]]]] = {}
        for i, text in enumerate(texts):
            try:
                value = parse_json_line(text) if isinstance(text, str) else None
            except BadEventError:
                value = None  # the processor reports the row
            if value is None:
                continue
            stream = value.get(STREAM_FIELD)
            if stream is None:
                stream = self.route.default_stream
            if stream == END_MARK_STREAM:
                times[i] = END_MARK_MS
                need[i] = NEED_NO
                continue
            sroute = self.route.route_of(stream)
            if sroute is None:
                continue
            timing = self.route.time_route(stream) or sroute
            try:
                # Bounded as the column-wise path bounds it: a time that cannot be right stays
                # NaN, so it never moves the watermark (the processor dead-letters the row).
                if timing.clock is None:
                    times[i] = event_time_ms(value.get(timing.time_field), timing.unit_ms,
                                             timing.time_field, ahead_ms=timing.ahead_ms)
                else:
                    times[i] = corrected_event_time_ms(
                        value.get(timing.time_field), value.get(timing.clock.sent_field),
                        value.get(timing.clock.received_field), timing.clock,
                        timing.time_field, timing.unit_ms, ahead_ms=timing.ahead_ms,
                    )
            except BadEventError:
                pass
            slot = None if None in self.route.streams else stream
            rows, values = per_route.setdefault(slot, ([], [[] for _ in sroute.key_fields]))
            rows.append(i)
            for field_values, name in zip(values, sroute.key_fields, strict=True):
                field_values.append(value.get(name))
        keys: list[str | None] = [None] * n
        for slot, (rows, values) in per_route.items():
            sroute = self.route.streams[slot]
            texts_by_field = [
                _texts_of(field_values, _declared(self.processor, slot, name))
                for field_values, name in zip(values, sroute.key_fields, strict=True)
            ]
            for row, text in zip(rows, _joined(texts_by_field, len(rows)), strict=True):
                keys[row] = _EVERY if slot in self.route.broadcast else text
        return times, keys, need


@dataclass(frozen=True)
class RoutePlan:
    """Several processors sharing one routed input and one stateful operator: processor ``i``
    owns the groups ``slots[i] * buckets`` to ``(slots[i] + 1) * buckets - 1`` (slot ``i``
    unless ``slots`` says otherwise: a checkpoint keeps a processor's slot across program
    edits, see :mod:`spark_udf.edits`).

    Attributes
    ----------
    entries:
        ``(route, processor source, event layout)`` per processor.
    buckets:
        Hash buckets per processor (every route uses this many).
    lateness_ms:
        The watermark delay: the largest lateness over the processors (Spark keeps one
        watermark per query).
    slots:
        The slot of each processor's groups (``None``: its index).
    clock_streams:
        The clock-corrected streams the processors read: their events that keep their device
        time are counted as the rows are routed (:func:`uncorrected_counts`, validated by the
        stream schema a processor holds), once per input row.
    """

    entries: tuple[tuple[JsonRoute, ProcessorSource, Any], ...]
    buckets: int
    lateness_ms: int
    slots: tuple[int, ...] | None = None
    clock_streams: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        check_buckets(self.buckets)
        if self.slots is not None and (
            len(self.slots) != len(self.entries) or len(set(self.slots)) != len(self.slots)
        ):
            raise ValueError(f"one distinct slot per processor is needed, got {self.slots}")

    def offset(self, index: int) -> int:
        """The first group of processor ``index``."""
        return (index if self.slots is None else self.slots[index]) * self.buckets

    def owner(self, group: int) -> int | None:
        """Index of the processor that owns ``group``, or ``None`` when none does (the slot of
        a processor an earlier program of the checkpoint had)."""
        slot = group // self.buckets
        if self.slots is None:
            return slot if slot < len(self.entries) else None
        try:
            return self.slots.index(slot)
        except ValueError:
            return None


def route_batches(
    batches: Iterable[pa.RecordBatch], route: JsonRoute, source: ProcessorSource
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body for one processor: each input batch's rows, with their event time
    and need, packed into one ``(bucket, max event time, blob)`` row per bucket.

    Examples
    --------
    >>> from cep.events.keyed import ProcessResult
    >>> class Count:
    ...     def key_of(self, event): return (event.get("k"),)
    ...     def process(self, key, state, events, watermark_ms): return ProcessResult(state=b"")
    >>> route = JsonRoute("_event", {None: StreamRoute(("k",), "ts", 1)}, "s", 4)
    >>> batch = pa.RecordBatch.from_pydict(
    ...     {"_event": ['{"k": "a", "ts": 5}', '{"k": "a", "ts": 9}', '{"k": "b", "ts": 7}']})
    >>> rows = next(route_batches([batch], route, Count())).to_pylist()
    >>> sorted(row[MAX_TIME_COLUMN] for row in rows)
    [7, 9]
    """
    plan = RoutePlan(((route, source, None),), route.buckets, 0)
    yield from route_plan_batches(batches, plan)


def route_plan_batches(
    batches: Iterable[pa.RecordBatch], plan: RoutePlan
) -> Iterator[pa.RecordBatch]:
    """:func:`route_batches` for every processor of ``plan``: each input batch is routed once
    per processor, into that processor's range of groups. The batch's count of events that
    kept their device time (:attr:`RoutePlan.clock_streams`) rides on the first blob of the
    first processor (:data:`UNCORRECTED_METADATA`): once per input row, however many
    processors read it."""
    routers: list[_Router] | None = None
    clocks: dict[str, StreamSchema] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if routers is None:
            processors = [resolve_processor(source) for _, source, _ in plan.entries]
            routers = [_Router(route, processor)
                       for (route, _, _), processor in zip(plan.entries, processors, strict=True)]
            clocks = _clock_schemas(plan.clock_streams, processors)
        table = pa.Table.from_batches([batch])
        counts: dict[str, int] = {}
        if clocks:
            first = routers[0].route
            counts = uncorrected_counts(batch.column(first.json_column), clocks,
                                        first.default_stream)
        for index, router in enumerate(routers):
            yield _packed(table, *router.locate(batch.column(router.route.json_column)),
                          offset=plan.offset(index), bucket_count=plan.buckets,
                          uncorrected=counts if index == 0 else None)


def _clock_schemas(
    names: Iterable[str], processors: Sequence[Any]
) -> dict[str, StreamSchema]:
    """The stream schema of each clock-corrected stream named, as the first processor holding
    it has it (the one its events are validated by)."""
    found: dict[str, StreamSchema] = {}
    for name in sorted(names):
        for processor in processors:
            schema = (getattr(processor, "schemas", None) or {}).get(name)
            if isinstance(schema, StreamSchema) and schema.clock is not None:
                found[name] = schema
                break
    return found


# ---------------------------------------------------------------------------- uncorrected


def uncorrected_counts(
    texts: pa.Array, schemas: Mapping[str, StreamSchema], default_stream: str | None
) -> dict[str, int]:
    """Per clock-corrected stream of ``schemas``, how many of the JSON ``texts`` are events of
    it that keep their device time for want of a sent or received time: valid events only, as
    the embedded engine counts them (:attr:`cep.engine.EngineStats.uncorrected`; a row its
    stream refuses is a dead letter, not an event). The rows that lack either time are found
    column-wise; only those are parsed and validated row by row.

    Examples
    --------
    >>> from query_lang import parse
    >>> decl, = parse("stream app (u string, ts int, s int, r int) time ts unit ms "
    ...               "sent s received r").declarations
    >>> app = StreamSchema.from_decl(decl, now_ms=1_000)
    >>> texts = pa.array([
    ...     '{"u": "a", "ts": 10, "s": 10, "r": 15}',
    ...     '{"u": "b", "ts": 10, "r": 15}',            # no sent time
    ...     '{"u": "c", "ts": 10, "s": null}',          # neither
    ...     '{"u": 7, "ts": 10}',                       # not an event: u is no string
    ...     '{"stream": "other", "ts": 10}', 'not json', None])
    >>> uncorrected_counts(texts, {"app": app}, "app")
    {'app': 2}
    """
    n = len(texts)
    if not n or not schemas:
        return {}
    opens = pc.starts_with(pc.utf8_ltrim_whitespace(texts), "{")
    rows = np.flatnonzero(pc.fill_null(opens, False).to_numpy(zero_copy_only=False))
    if not len(rows):
        return {}
    objects = texts.take(pa.array(rows)) if len(rows) < n else texts
    lacking = _lacking_a_time(objects, schemas, default_stream)
    if lacking is not None:
        rows = rows[lacking]
    counts: dict[str, int] = {}
    for text in texts.take(pa.array(rows, pa.int64())).to_pylist():
        try:
            value = parse_json_line(text)
        except BadEventError:
            continue  # a dead letter
        stream = value.get(STREAM_FIELD)
        if stream is None:
            stream = default_stream
        schema = schemas.get(stream) if isinstance(stream, str) else None
        if schema is None:
            continue
        try:
            event = schema.normalise(value, seq=0, position=0)
        except BadEventError:
            continue  # a dead letter
        if schema.uncorrected(event.fields):
            counts[schema.name] = counts.get(schema.name, 0) + 1
    return counts


def _lacking_a_time(
    texts: pa.Array, schemas: Mapping[str, StreamSchema], default_stream: str | None
) -> np.ndarray | None:
    """Per JSON object text, whether it names (or defaults to) a stream of ``schemas`` and
    lacks that stream's sent or received time (missing or null), read column-wise; ``None``
    when ``pyarrow.json`` cannot read the texts so (the caller then looks at every row). A row
    marked may still be refused by its stream; a row not marked cannot be an event that keeps
    its device time: what the column-wise parse reads of a line the row-wise parse accepts, it
    reads alike."""
    names = sorted({name for schema in schemas.values() if schema.clock is not None
                    for name in (schema.clock.sent_field, schema.clock.received_field)})
    if STREAM_FIELD in names:
        return None
    table = _read_timed(texts, {STREAM_FIELD: pa.string()}, names)
    if table is None:
        return None
    streams = table.column(STREAM_FIELD).to_pandas()
    if default_stream is not None:
        streams = streams.fillna(default_stream)
    lacking = np.zeros(len(texts), dtype=bool)
    for name, schema in schemas.items():
        clock = schema.clock
        if clock is None:
            continue
        missing = pc.or_(pc.is_null(table.column(clock.sent_field)),
                         pc.is_null(table.column(clock.received_field)))
        lacking |= (streams == name).to_numpy() & missing.to_numpy(zero_copy_only=False)
    return lacking


def uncorrected_in(payloads: Iterable[bytes]) -> dict[str, int]:
    """The counts of events that kept their device time carried by routed blobs
    (:data:`UNCORRECTED_METADATA`), summed per stream; only each blob's schema is read.

    Examples
    --------
    Two processors read a stream whose two events lack a sent time; each is counted once:

    >>> from query_lang import parse
    >>> decl, = parse("stream app (k string, ts int, s int, r int) time ts unit ms "
    ...               "sent s received r").declarations
    >>> class Reader:
    ...     schemas = {"app": StreamSchema.from_decl(decl, now_ms=1_000)}
    ...     def key_of(self, event): return (event.get("k"),)
    ...     def process(self, key, state, events, watermark_ms): return None
    >>> route = JsonRoute("_event", {None: StreamRoute(("k",), "ts", 1)}, "app", 2)
    >>> plan = RoutePlan(((route, Reader(), None), (route, Reader(), None)), 2, 0,
    ...                  clock_streams=frozenset({"app"}))
    >>> batch = pa.RecordBatch.from_pydict({"_event": [
    ...     '{"k": "a", "ts": 10, "s": 10}', '{"k": "b", "ts": 11}', '{"k": "a", "ts": 12}']})
    >>> routed = [row for out in route_plan_batches([batch], plan) for row in out.to_pylist()]
    >>> uncorrected_in(row[PACKED_COLUMN] for row in routed)
    {'app': 3}
    """
    counts: dict[str, int] = {}
    for payload in payloads:
        metadata = pa.ipc.open_stream(pa.py_buffer(payload)).schema.metadata or {}
        carried = metadata.get(UNCORRECTED_METADATA)
        if carried:
            for stream, count in json.loads(carried).items():
                counts[stream] = counts.get(stream, 0) + int(count)
    return counts


def _packed(
    table: pa.Table, times: np.ndarray, buckets: np.ndarray, need: np.ndarray, *, offset: int,
    bucket_count: int, uncorrected: Mapping[str, int] | None = None,
) -> pa.RecordBatch:
    missing = np.isnan(times)
    stamps = pa.array(np.where(missing, 0, times).astype(np.int64), mask=missing)
    table = table.append_column(TIME_COLUMN, stamps)
    table = table.append_column(NEED_COLUMN, pa.array(need, pa.int8()))
    every = buckets == EVERY_BUCKET
    if every.any():
        # A row of a broadcast stream: one copy per bucket.
        copies = np.flatnonzero(every)
        rows = np.concatenate([np.flatnonzero(~every), np.tile(copies, bucket_count)])
        buckets = np.concatenate(
            [buckets[~every], np.repeat(np.arange(bucket_count), len(copies))]
        )
        times = times[rows]
        missing = missing[rows]
        table = table.take(pa.array(rows))
    order = np.argsort(buckets, kind="stable")
    ordered = table.take(pa.array(order))
    sorted_buckets = buckets[order]
    sorted_times = np.where(missing, -np.inf, times)[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(sorted_buckets)) + 1))
    ends = np.append(starts[1:], len(sorted_buckets))
    maxima = np.maximum.reduceat(sorted_times, starts)
    slices = [ordered.slice(lo, hi - lo)
              for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True)]
    if uncorrected:
        carried = json.dumps(dict(sorted(uncorrected.items())), separators=(",", ":"))
        slices[0] = slices[0].replace_schema_metadata(
            {**(slices[0].schema.metadata or {}), UNCORRECTED_METADATA: carried.encode()}
        )
    payloads = [ipc_bytes(part) for part in slices]
    finite = np.isfinite(maxima)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(sorted_buckets[starts] + offset),
            pa.array(np.where(finite, maxima, 0).astype(np.int64), mask=~finite),
            pa.array(payloads, pa.binary()),
        ],
        schema=_ARROW_ROUTED,
    )
