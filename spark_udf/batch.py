"""What the Spark operator does with one bucket's rows, as pure functions over pandas frames and
:class:`~spark_udf.bucket_state.BucketState` values, so it is testable without a JVM.

The Spark glue in :mod:`spark_udf.operator` only moves bytes between these functions and Spark's
state store and timers.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from cep.events.event import (
    BadEventError,
    EventReason,
    dead_letter,
    parse_json_line,
    plain_value,
)
from cep.events.keyed import KeyedProcessor, ProcessResult, validate_raw
from cep.events.watermark import END_OF_INPUT, NO_WATERMARK, late_detail
from spark_udf.bucket_state import BucketState
from spark_udf.errors import OperatorConfigError
from spark_udf.records import dead_letter_record, held_record, key_text, match_record
from spark_udf.relevance import (
    ARROW_TYPES,
    needed_rows,
    needed_rows_from_json,
    parse_fields,
    unchecked_rows,
)

__all__ = [
    "ARRIVAL_COLUMN",
    "END_MARK_MS",
    "END_MARK_STREAM",
    "END_WATERMARK_MS",
    "BUCKET_COLUMN",
    "LATE_COLUMN",
    "SEQ_COLUMN",
    "STREAM_COLUMN",
    "TIME_COLUMN",
    "BucketRun",
    "EventLayout",
    "backtest_frame",
    "fire_due_keys",
    "frame_events",
    "process_bucket",
    "run_key",
]

TIME_COLUMN = "_vigil_ms"
"""Internal column: the event time in epoch milliseconds, computed by Spark from the time field."""
BUCKET_COLUMN = "_vigil_bucket"
"""Internal column: ``pmod(xxhash64(key columns), buckets)``."""
LATE_COLUMN = "_vigil_late"
"""Internal column (backtests): the event was behind the watermark when it arrived."""
ARRIVAL_COLUMN = "_vigil_arrival"
"""Internal column (backtests): the watermark when the event arrived (input order)."""
SEQ_COLUMN = "_seq"
"""The event's input position: its id when the stream has none, and the tie-breaker."""
STREAM_COLUMN = "stream"

END_MARK_STREAM = "_vigil_end"
"""Stream of the one row a finite streaming input appends after its last line (the end-of-input
mark): no processor reads it, but its time moves Spark's watermark past every event."""
END_MARK_MS = 253_402_300_799_000
"""Event time of the end-of-input mark: 9999-12-31T23:59:59Z, the last second Spark's
timestamps and every ISO-8601 reader agree on."""
END_WATERMARK_MS = 221_845_392_000_000
"""A watermark from 9000-01-01 on can only come from the end-of-input mark (minus a lateness
of up to a millennium): the operator then runs its processors to end of input
(:data:`cep.events.END_OF_INPUT`), flushing every key as the embedded engine's ``close``."""

_MAX_TIMER_ROUNDS = 10_000

TABLES_SLOT = "\x00tables"
"""The slot of a bucket that says which tables its processor's rules look up
(:mod:`cep.tables`) and up to when they were read; each table key's versions have a slot of
their own, this name, the table's and the key's text (a rule key's text is JSON: it never
starts with a NUL)."""


@dataclass(frozen=True)
class EventLayout:
    """How the rows handed to the operator carry events.

    Attributes
    ----------
    event_columns:
        Columns copied into each event dict (declared fields, ``stream``, ``_seq``).
    json_column:
        Column holding each event's JSON text, or ``None``; its object is the event and
        ``event_columns`` are added to it (so undeclared fields reach search queries).
    int_columns:
        Columns of integer Spark type: pandas turns them into floats when a value is null, and
        they must reach the processor as ints again.
    default_stream:
        Stream given to events that carry no ``stream`` field (an input bound to one stream).
    """

    event_columns: tuple[str, ...]
    json_column: str | None = None
    int_columns: frozenset[str] = frozenset()
    default_stream: str | None = None


@dataclass
class BucketRun:
    """What one call produced: output rows plus counters for the progress report."""

    records: list[dict[str, Any]]
    events: int = 0
    late: int = 0
    keys: int = 0


def _column_values(series: pd.Series, as_int: bool) -> list[Any]:
    if series.dtype.kind == "f":
        if as_int:
            return [None if v != v else int(v) for v in series.tolist()]
        return [None if v != v else v for v in series.tolist()]
    if series.dtype.kind == "M":
        raise OperatorConfigError(
            f"column '{series.name}' reached the operator as a timestamp; detect() converts "
            "timestamp columns to ISO-8601 text, pass the frame through detect()"
        )
    values = series.tolist()
    if series.dtype == object:
        # NaN as null, and Arrow's list and struct cells (numpy arrays, dicts of them) as the
        # lists and objects a JSON line gives
        return [v if type(v) is str else plain_value(v) for v in values]
    return values


def frame_events(
    frame: pd.DataFrame, layout: EventLayout
) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
    """Turn rows into raw event dicts (declared fields + ``stream`` + ``_seq``).

    Returns the events aligned with the rows (``None`` where a row's JSON text could not be
    used) and the dead letters of those rows.
    """
    columns = {
        name: _column_values(frame[name], name in layout.int_columns)
        for name in layout.event_columns
        if name in frame.columns
    }
    n = len(frame)
    events: list[dict[str, Any] | None] = []
    dead: list[dict[str, Any]] = []
    names = list(columns)
    if layout.json_column is None:
        for i in range(n):
            event = {name: columns[name][i] for name in names}
            if layout.default_stream is not None and event.get(STREAM_COLUMN) is None:
                event[STREAM_COLUMN] = layout.default_stream
            events.append(event)
        return events, dead
    texts = frame[layout.json_column].tolist()
    seqs = columns.get(SEQ_COLUMN, [None] * n)
    for i, text in enumerate(texts):
        try:
            # As the embedded engine reads a line (a null row is JSON null: not an object).
            value = parse_json_line(text if isinstance(text, str) else "null")
        except BadEventError as exc:
            dead.append(
                dead_letter(exc.reason, exc.detail, line=seqs[i],
                            raw=text if isinstance(text, str) else None)
            )
            events.append(None)
            continue
        for name in names:
            if columns[name][i] is not None or name not in value:
                value[name] = columns[name][i]
        if layout.default_stream is not None and value.get(STREAM_COLUMN) is None:
            value[STREAM_COLUMN] = layout.default_stream
        events.append(value)
    return events, dead


def _ordered(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    parts = [f for f in frames if len(f)]
    if not parts:
        return pd.DataFrame()
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    by = [c for c in (TIME_COLUMN, SEQ_COLUMN) if c in frame.columns]
    # A stable sort on (time, seq): rows reach the operator in no particular order and the
    # split into micro-batches moves across restarts, so order must come from the data alone.
    return frame.sort_values(by, kind="stable", na_position="first").reset_index(drop=True)


class _StreamFilter:
    """Asks the processor once per stream name whether it reads that stream."""

    def __init__(self, processor: KeyedProcessor) -> None:
        self._wants = getattr(processor, "wants", None)
        self._known: dict[Any, bool] = {}

    def __call__(self, event: Mapping[str, Any]) -> bool:
        if self._wants is None:
            return True
        stream = event.get(STREAM_COLUMN)
        if stream is None:
            return True  # the processor reports an event naming no stream
        if not isinstance(stream, str):
            return False  # names no stream this processor reads, as an undeclared name
        known = self._known.get(stream)
        if known is None:
            known = self._known[stream] = self._wants(stream)
        return known


def _collect(
    result: ProcessResult,
    key: tuple,
    seq_times: Mapping[Any, int | None],
    out: list[dict[str, Any]],
) -> None:
    for match in result.outputs:
        out.append(match_record(match))
    for letter in result.dead_letters:
        # A processor's dead letter names its event by input position (``line``).
        out.append(
            dead_letter_record(letter, key=key, time_ms=seq_times.get(letter.get("line")))
        )


def _seq_times(events: Sequence[Mapping[str, Any]], times: Sequence[int | None]) -> dict:
    return {event.get(SEQ_COLUMN): t for event, t in zip(events, times, strict=True)}


def _group_by_key(
    processor: KeyedProcessor,
    events: Sequence[dict[str, Any] | None],
    times: Sequence[int | None],
    late: np.ndarray | None,
    watermark_ms: int | None,
    run: BucketRun,
    *,
    filtered: bool = False,
) -> dict[tuple, tuple[list[dict[str, Any]], list[int | None]]]:
    groups: dict[tuple, tuple[list[dict[str, Any]], list[int | None]]] = {}
    wanted = _StreamFilter(processor)
    key_of = processor.key_of
    # Steps with their own ``by``: an event belongs to each key it yields (a process as the
    # parent under its pid, as the child under its parent's); rows were routed by the part
    # of the key those share, so all of an event's keys are in this bucket.
    keys_of = processor.keys_of if getattr(processor, "multi_key", False) else None
    # Each stream's unit of epoch numbers, for the unit hint of a late event's detail.
    schemas = getattr(processor, "schemas", None)
    units = ({name: schema.epoch_unit_ms for name, schema in schemas.items()}
             if isinstance(schemas, Mapping) else {})
    # Metrics take late events themselves (corrections of windows they still keep).
    own_late = getattr(processor, "handles_late", False)
    # Rows no rule condition can take are skipped before per-event work, as the embedded
    # engine skips them; late ones are still reported late.
    needed = None if filtered else needed_rows(processor, events)
    for i, event in enumerate(events):
        if event is None or not wanted(event):
            continue
        is_late = late is not None and bool(late[i]) and not own_late
        skipped = needed is not None and not needed[i]
        if skipped and not is_late:
            continue
        if keys_of is not None and not skipped:
            # Checked once here: under each of its keys a bad event would be reported again.
            refused = _refused(schemas, event, times[i])
            if refused is not None:
                run.records.append(refused)
                continue
            keys = keys_of(event)
            key = keys[0] if keys else None
        else:
            keys = None
            key = None if skipped else key_of(event)
        if is_late or key is None:
            # What is wrong with the event comes first, then lateness, then a missing key:
            # the order in which the embedded engine finds them.
            refused = _refused(schemas, event, times[i])
            if refused is not None:
                run.records.append(refused)
                continue
        if is_late:
            run.late += 1
            run.records.append(_late_record(event, times[i], watermark_ms, key, units))
            continue
        if key is None:
            run.records.append(
                dead_letter_record(
                    dead_letter(EventReason.MISSING_KEY, "the event's key fields are missing or "
                                "null", line=event.get(SEQ_COLUMN), event=event,
                                stream=event.get(STREAM_COLUMN)),
                    time_ms=times[i],
                )
            )
            continue
        for each in keys or (key,):
            try:
                group = groups.get(each)
            except TypeError:
                # A list or object where a key value belongs: validation refuses the event
                # (key fields hold single values), which the processor reports under this key.
                each = _frozen(each)
                group = groups.get(each)
            if group is None:
                group = groups[each] = ([], [])
            group[0].append(event)
            group[1].append(times[i])
    return groups


def _frozen(value: Any) -> Any:
    """``value`` with its lists as tuples and its objects as sorted item tuples: hashable."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    return value


def _refused(schemas: Any, event: dict[str, Any], time_ms: int | None) -> dict[str, Any] | None:
    """The dead-letter record of an event its stream's declaration refuses (a wrong type, a
    bad value), or ``None``: a late or keyless event is reported for that first."""
    if not isinstance(schemas, Mapping) or not isinstance(event.get(SEQ_COLUMN), int):
        return None
    dead: list[dict[str, Any]] = []
    validate_raw(event, schemas, dead, "the Spark operator")
    return dead_letter_record(dead[0], time_ms=time_ms) if dead else None


def _late_record(
    event: dict[str, Any],
    time_ms: int,
    watermark_ms: int | None,
    key: tuple | None,
    units: Mapping[Any, int],
) -> dict[str, Any]:
    return dead_letter_record(
        dead_letter(
            EventReason.LATE,
            late_detail(time_ms, watermark_ms, units.get(event.get(STREAM_COLUMN))),
            line=event.get(SEQ_COLUMN),
            stream=event.get(STREAM_COLUMN),
            event=event,
        ),
        key=key,
        time_ms=time_ms,
    )


def _times_of(frame: pd.DataFrame) -> list[int | None]:
    if TIME_COLUMN not in frame.columns:
        return [None] * len(frame)
    return _optional_ints(frame[TIME_COLUMN])


def _optional_ints(series: pd.Series) -> list[int | None]:
    return [None if pd.isna(v) else int(v) for v in series.tolist()]


def process_bucket(
    processor: KeyedProcessor,
    bucket: BucketState,
    frames: Iterable[pd.DataFrame],
    layout: EventLayout,
    watermark_ms: int,
    *,
    filtered: bool | None = None,
    bucket_index: int | None = None,
) -> BucketRun:
    """Feed one bucket's new rows to the processor, key by key, and update ``bucket`` in place.

    Rows whose event time is behind ``watermark_ms`` are late: they become ``late`` dead
    letters here, because Spark would otherwise drop them silently before a stateful operator.
    ``filtered`` says the rows were already narrowed to those the processor may need (``True``)
    or still need the row-by-row test (``False``); ``None`` lets this function decide from the
    rows' JSON text. ``bucket_index`` is the bucket's place among its processor's (``None``:
    unknown): a changelog row every bucket receives is reported (late, invalid, changing no
    table) by bucket 0 alone.
    """
    frame = _ordered(frames)
    run = BucketRun(records=[])
    if frame.empty:
        return run
    run.events = len(frame)
    if filtered is None:
        filtered = False
        if layout.json_column is not None and TIME_COLUMN in frame.columns:
            stamps = frame[TIME_COLUMN]
            if not stamps.isna().any():
                stamps = stamps.to_numpy(dtype=np.int64)
                needed = needed_rows_from_json(
                    processor, frame[layout.json_column].tolist(), stamps, layout.default_stream
                )
                if needed is not None:
                    # Only the rows a rule may take, and late rows (reported with their
                    # content), become Python objects.
                    frame = frame[needed | (stamps < watermark_ms)]
                    filtered = True
    opened = _open_tables(processor, bucket)
    if opened is not None:
        frame = _take_changes_by_column(processor, opened, frame, layout, watermark_ms)
    events, bad = frame_events(frame, layout)
    run.records.extend(dead_letter_record(letter) for letter in bad)
    times = _times_of(frame)
    late = np.array([t is not None and t < watermark_ms for t in times], dtype=bool)
    if opened is not None:
        _apply_changes(processor, opened, events, times, watermark_ms, run,
                       reports_copies=bucket_index in (None, 0))
    groups = _group_by_key(processor, events, times, late, watermark_ms, run,
                           filtered=filtered)
    run.keys = len(groups)
    held = _held_so_far(processor)
    many = getattr(processor, "process_keys", None)
    if many is not None:
        _run_keys_together(
            many, bucket,
            [(key, key_text(key), key_events, _seq_times(key_events, key_times))
             for key, (key_events, key_times) in groups.items()],
            watermark_ms, run.records,
        )
    else:
        for key, (key_events, key_times) in groups.items():
            text = key_text(key)
            slot = bucket.keys.get(text)
            result = processor.process(
                key, slot.state if slot else None, key_events, watermark_ms
            )
            _collect(result, key, _seq_times(key_events, key_times), run.records)
            bucket.set(text, result.state, min(result.next_timer_ms, default=None))
    _held_since(processor, held, groups, run.records)
    _close_tables(opened, bucket, watermark_ms)
    return run


def _run_keys_together(
    process_keys: Any,
    bucket: BucketState,
    jobs: Sequence[tuple[tuple, str, Sequence[Mapping[str, Any]], Mapping[Any, int | None]]],
    watermark_ms: int,
    records: list[dict[str, Any]],
) -> None:
    """Keys of the bucket in one call (:meth:`RuleProcessor.process_keys`), ``(key, its text,
    its new events, their times by seq)`` each: the rules each event may touch are found
    column-wise over the keys' events, as the embedded engine's rule index finds them, instead
    of every event being offered to every rule. Records and new states go to ``records`` and
    ``bucket``."""
    if not jobs:
        return
    outputs, results = process_keys(
        [(key, slot.state if (slot := bucket.keys.get(text)) else None, events)
         for key, text, events, _ in jobs],
        watermark_ms,
    )
    records.extend(match_record(match) for match in outputs)
    for (key, text, _, seq_times), result in zip(jobs, results, strict=True):
        _collect(result, key, seq_times, records)
        bucket.set(text, result.state, min(result.next_timer_ms, default=None))


def _held_so_far(processor: KeyedProcessor) -> Counter[str] | None:
    """Matches the processor's rules have held back by their ``unique`` (``None``: it has no
    such count), before a call."""
    held = getattr(processor, "suppressed", None)
    return None if held is None else Counter(held)


def _held_since(
    processor: KeyedProcessor, before: Counter[str] | None, keys: Iterable[Any],
    out: list[dict[str, Any]],
) -> None:
    """One ``held`` row per rule that held matches back during the call (for the summary),
    named after the call's first key."""
    if before is None:
        return
    now = processor.suppressed  # type: ignore[attr-defined]
    where = next((key_text(k) for k in keys), "") or ""
    for rule in sorted(now):
        count = now[rule] - before.get(rule, 0)
        if count > 0:
            out.append(held_record(rule, count, where))


@lru_cache(maxsize=1 << 16)
def _table_slot(table: str, key: tuple) -> str:
    # Cached: a changed key's slot is named when it is read and again when it is written.
    return f"{TABLES_SLOT}{table}\x00{key_text(key)}"


def _open_tables(processor: KeyedProcessor, bucket: BucketState) -> tuple[Any, int] | None:
    """The processor's tables reading this bucket's keys (the same objects its compiled rules
    read: each key's versions are read from its slot when first needed), and the time up to
    which the bucket's events have read them."""
    tables = getattr(processor, "tables", None)
    if not tables:
        return None
    header = bucket.keys.get(TABLES_SLOT)

    def fetch(table: str, key: tuple) -> bytes | None:
        slot = bucket.keys.get(_table_slot(table, key))
        return None if slot is None else slot.state

    released, stale = tables.bind(None if header is None else header.state, fetch)
    for table in stale:  # a table declared otherwise since: its stored keys no longer hold
        prefix = f"{TABLES_SLOT}{table}\x00"
        for text in [t for t in bucket.keys if t.startswith(prefix)]:
            bucket.set(text, None, None)
    return tables, NO_WATERMARK if released is None else released


def _close_tables(opened: tuple[Any, int] | None, bucket: BucketState, watermark_ms: int) -> None:
    """Write back the keys the call changed, compacted, and the time the tables are read up
    to (``watermark_ms``: a change at or before it comes too late for the tables).

    Compaction keeps what a lookup at the bucket's earliest due time can still see: a key
    without input in this call may hold events the watermark has passed that no call has
    released yet (its timer wakes it after this call's keys ran, in the same micro-batch or
    the next), and they read the tables as of their own times (a key's due time is at most its
    earliest held event's)."""
    if opened is None:
        return
    tables, released = opened
    released = max(released, watermark_ms)
    pending = bucket.earliest_due()
    tables.compact(released if pending is None else min(released, pending))
    for table, key, data in tables.changed():
        bucket.set(_table_slot(table, key), data, None)
    bucket.set(TABLES_SLOT, tables.header(released), None)


def _apply_changes(
    processor: KeyedProcessor,
    opened: tuple[Any, int],
    events: Sequence[dict[str, Any] | None],
    times: Sequence[int | None],
    watermark_ms: int,
    run: BucketRun,
    *,
    reports_copies: bool = True,
    arrivals: Sequence[int] | None = None,
) -> None:
    """Apply the bucket's changelog rows to its tables before any key runs, as the embedded
    engine applies each on arrival (:class:`cep.tables.Tables`); a row the rules do not read
    themselves is reported here when it is late or invalid. The rows of a broadcast stream
    (every bucket has a copy) are reported only where ``reports_copies``. ``arrivals``: each
    row's own watermark, the one that stood when it arrived (a static frame replayed in input
    order), instead of ``watermark_ms`` and the time the tables were read up to."""
    tables, released = opened
    streams = tables.streams
    schemas = processor.schemas  # type: ignore[attr-defined]
    wants = getattr(processor, "wants", lambda stream: False)
    for i, (event, time_ms) in enumerate(zip(events, times, strict=True)):
        stream = None if event is None else event.get(STREAM_COLUMN)
        if stream not in streams:
            continue
        if arrivals is not None:
            watermark_ms = released = arrivals[i]
        # Reported by the rules when they read the stream; a broadcast row by one bucket only.
        silent = wants(stream) or (stream in tables.broadcast and not reports_copies)
        if time_ms is not None and time_ms < watermark_ms:
            if not silent:
                run.late += 1
                run.records.append(_late_record(event, time_ms, watermark_ms, None, {}))
            continue
        seq = event.get(SEQ_COLUMN)
        try:
            change = schemas[stream].normalise(event, seq=seq, position=seq)
        except BadEventError as exc:
            if not silent:
                run.records.append(dead_letter_record(
                    dead_letter(exc.reason, exc.detail, line=seq, stream=stream, event=event),
                    time_ms=time_ms,
                ))
            continue
        for error in tables.apply(change, released):
            if stream in tables.broadcast and not reports_copies:
                continue
            run.records.append(dead_letter_record(
                dead_letter(error.reason, error.detail, line=seq, stream=stream, event=event),
                time_ms=time_ms,
            ))


def _take_changes_by_column(
    processor: KeyedProcessor,
    opened: tuple[Any, int],
    frame: pd.DataFrame,
    layout: EventLayout,
    watermark_ms: int,
) -> pd.DataFrame:
    """Apply the bucket's changelog rows that only feed its tables column-wise, as the
    embedded engine takes a batch's changes (:meth:`cep.tables.Tables.apply_frame`), instead
    of one parse, one validation and one change per row; the rows left to the row-wise path
    (:func:`_apply_changes`) are returned: rows of other streams, of a stream the rules also
    read as events, late or without a time, that ``pyarrow`` or the stream's validation
    refuse, and changes the tables refuse (applied again there, they are refused again and
    reported with their event). So both paths give the same tables and the same reports."""
    tables, released = opened
    wants = getattr(processor, "wants", lambda stream: False)
    schemas = processor.schemas  # type: ignore[attr-defined]
    streams = {
        name: fields for name in tables.streams
        if not wants(name) and (fields := _parsed_fields(schemas[name])) is not None
    }
    json_col = layout.json_column
    if (
        not streams or json_col is None or json_col not in frame.columns
        or TIME_COLUMN not in frame.columns or SEQ_COLUMN not in frame.columns
        or set(layout.event_columns) - {SEQ_COLUMN}  # columns that would override the text
    ):
        return frame
    texts = frame[json_col].tolist()
    times = frame[TIME_COLUMN].to_numpy(dtype=np.float64, na_value=np.nan)
    candidates = ~np.isnan(times) & (times >= watermark_ms)
    if not candidates.any() or not all(isinstance(t, str) for t in texts):
        return frame
    candidates &= ~unchecked_rows(pa.array(texts, pa.string()))
    rows = np.flatnonzero(candidates)
    named = parse_fields([texts[i] for i in rows], {STREAM_COLUMN: pa.string()})
    if named is None:
        return frame
    stream_of = named.column(STREAM_COLUMN).to_pandas()
    if layout.default_stream is not None:
        stream_of = stream_of.fillna(layout.default_stream)
    seqs = frame[SEQ_COLUMN].tolist()
    taken: list[np.ndarray] = []
    for name, fields in streams.items():
        mine = rows[(stream_of == name).to_numpy()]
        parsed = parse_fields([texts[i] for i in mine], fields) if len(mine) else None
        if parsed is None:
            continue
        schema = schemas[name]
        part = parsed.to_pandas(integer_object_nulls=True)
        part[schema.time_field] = pd.to_datetime(times[mine].astype(np.int64), unit="ms",
                                                 utc=True)
        normalised, ts, _ = schema.normalise_frame(part)  # refused rows: left to the row path
        good = mine[normalised.index.to_numpy()]
        errors = tables.apply_frame(
            schema, normalised, ts.tolist(), [seqs[i] for i in good], [released] * len(good)
        )
        refused = np.zeros(len(good), dtype=bool)
        refused[[i for i, _ in errors]] = True
        taken.append(good[~refused])
    if not taken:
        return frame
    keep = np.ones(len(frame), dtype=bool)
    keep[np.concatenate(taken)] = False
    return frame[keep]


def _parsed_fields(schema: Any) -> dict[str, pa.DataType] | None:
    """The Arrow types a changelog stream's declared fields are parsed as column-wise (the
    time comes from the routing), or ``None`` when some field has no such type or the stream
    corrects a device clock (then its rows go row by row)."""
    if getattr(schema, "clock", None) is not None or schema.time_field is None:
        return None
    fields: dict[str, pa.DataType] = {}
    for name, kind in schema.fields.items():
        if name == schema.time_field:
            continue
        arrow = ARROW_TYPES.get(kind)
        if arrow is None:
            return None
        fields[name] = arrow
    return fields


def fire_due_keys(
    processor: KeyedProcessor, bucket: BucketState, watermark_ms: int
) -> list[dict[str, Any]]:
    """Wake every key of the bucket whose due time the watermark has reached (``on_timer``);
    at :data:`~cep.events.watermark.END_OF_INPUT` every key, so each flushes what it still holds."""
    records: list[dict[str, Any]] = []
    end = watermark_ms >= END_OF_INPUT
    due = [
        (text, slot) for text, slot in (bucket.keys.items() if end else bucket.due(watermark_ms))
        if not text.startswith(TABLES_SLOT)
    ]
    opened = _open_tables(processor, bucket) if due else None
    held = _held_so_far(processor) if due else None
    many = getattr(processor, "process_keys", None)
    if many is not None:
        # A due key's timer is at or behind the watermark: every due key moves to the
        # watermark, in one call, the events its buffer releases offered only to the rules
        # they may touch (as in process_bucket).
        _run_keys_together(many, bucket, [(tuple(json.loads(text)), text, (), {})
                                          for text, _ in due], watermark_ms, records)
    else:
        for text, slot in due:
            key = tuple(json.loads(text))
            timer = slot.due_ms if slot.due_ms is not None else watermark_ms
            result = processor.on_timer(key, slot.state, timer, watermark_ms)
            _collect(result, key, {}, records)
            bucket.set(text, result.state, min(result.next_timer_ms, default=None))
    _held_since(processor, held, (json.loads(text) for text, _ in due), records)
    _close_tables(opened, bucket, watermark_ms)
    return records


def run_key(
    processor: KeyedProcessor,
    key: tuple,
    events: Sequence[Mapping[str, Any]],
    final_watermark_ms: int,
    *,
    arrival_watermark_ms: int = NO_WATERMARK,
    state: bytes | None = None,
) -> tuple[list[ProcessResult], bytes | None]:
    """Run one key's events in one call, advance it to ``final_watermark_ms``, then fire its
    timers until none is due.

    ``arrival_watermark_ms`` is the watermark when the events arrived (events behind it are
    late); the default, no watermark, suits a complete, late-filtered input. This is the
    reference the streaming operator must agree with, and the backtest path.
    """
    results = [processor.process(key, state, events, arrival_watermark_ms)]
    if final_watermark_ms > arrival_watermark_ms:
        results.append(processor.process(key, results[-1].state, (), final_watermark_ms))
    rounds = 0
    while True:
        last = results[-1]
        due = [t for t in last.next_timer_ms if t <= final_watermark_ms]
        if not due:
            return results, last.state
        rounds += 1
        if rounds > _MAX_TIMER_ROUNDS:
            raise OperatorConfigError(
                f"the processor kept asking for timers at or before the watermark for key "
                f"{key!r} ({_MAX_TIMER_ROUNDS} rounds): its on_timer does not make progress"
            )
        results.append(processor.on_timer(key, last.state, min(due), final_watermark_ms))


def run_keys(
    process_keys: Any,
    jobs: Sequence[tuple[tuple, Sequence[Mapping[str, Any]]]],
    final_watermark_ms: int,
) -> tuple[list[dict[str, Any]], list[list[ProcessResult]]]:
    """:func:`run_key` for many keys at once, through
    :meth:`~cep.nfa.processor.RuleProcessor.process_keys` (each event offered only to the
    rules it may touch): ``(key, events)`` per key, all arriving with no watermark. Returns the
    matches and, per key, its results (dead letters, states and timers)."""
    keys = [key for key, _ in jobs]
    outputs, first = process_keys([(key, None, events) for key, events in jobs], NO_WATERMARK)
    results = [[result] for result in first]
    rounds = 0
    todo = list(range(len(jobs))) if final_watermark_ms > NO_WATERMARK else []
    while todo:
        found, later = process_keys(
            [(keys[i], results[i][-1].state, ()) for i in todo], final_watermark_ms
        )
        outputs.extend(found)
        for i, result in zip(todo, later, strict=True):
            results[i].append(result)
        todo = [i for i in todo if any(t <= final_watermark_ms
                                       for t in results[i][-1].next_timer_ms)]
        rounds += 1
        if todo and rounds > _MAX_TIMER_ROUNDS:
            raise OperatorConfigError(
                f"the processor kept asking for timers at or before the watermark for key "
                f"{keys[todo[0]]!r} ({_MAX_TIMER_ROUNDS} rounds): it does not make progress"
            )
    return outputs, results


def backtest_frame(
    processor: KeyedProcessor,
    frame: pd.DataFrame,
    layout: EventLayout,
    final_watermark_ms: int,
) -> BucketRun:
    """Run a static frame's rows (one group of keys, complete) to ``final_watermark_ms``.

    Rows flagged in :data:`LATE_COLUMN` (behind the watermark in input order) become ``late``
    dead letters, as the embedded engine would report them.
    """
    frame = _ordered([frame])
    run = BucketRun(records=[])
    if frame.empty:
        return run
    events, bad = frame_events(frame, layout)
    run.records.extend(dead_letter_record(letter) for letter in bad)
    times = _times_of(frame)
    run.events = len(frame)
    late = None
    if LATE_COLUMN in frame.columns:
        late = frame[LATE_COLUMN].fillna(False).to_numpy(dtype=bool)
    opened = _open_tables(processor, BucketState())
    if opened is not None:
        # The whole input is here: every change goes in before any key runs, and lookups
        # read the tables as of their events' times.
        arrivals = None
        if ARRIVAL_COLUMN in frame.columns:
            arrivals = [NO_WATERMARK if t is None else t
                        for t in _optional_ints(frame[ARRIVAL_COLUMN])]
        _apply_changes(processor, opened, events, times, NO_WATERMARK, run, arrivals=arrivals)
    groups = _group_by_key(processor, events, times, late, None, run)
    run.keys = len(groups)
    replay = getattr(processor, "replay", None)
    arrivals: dict[Any, int | None] = {}
    if replay is not None and ARRIVAL_COLUMN in frame.columns:
        # Processors that take late events (metrics) replay the input order instead, so late
        # rows correct their windows as in the embedded engine.
        arrivals = dict(zip(frame[SEQ_COLUMN].tolist(), _optional_ints(frame[ARRIVAL_COLUMN]),
                            strict=True))
    held = _held_so_far(processor)
    many = getattr(processor, "process_keys", None)
    together = None
    if replay is None and many is not None:
        outputs, together = run_keys(
            many, [(key, key_events) for key, (key_events, _) in groups.items()],
            final_watermark_ms,
        )
        run.records.extend(match_record(match) for match in outputs)
    for position, (key, (key_events, key_times)) in enumerate(groups.items()):
        if together is not None:
            results = together[position]
        elif replay is not None:
            marks = [arrivals.get(e.get(SEQ_COLUMN)) for e in key_events]
            results = [replay(key, key_events, marks, final_watermark_ms)]
        else:
            results, _ = run_key(processor, key, key_events, final_watermark_ms)
        seq_times = _seq_times(key_events, key_times)
        for result in results:
            _collect(result, key, seq_times, run.records)
    _held_since(processor, held, groups, run.records)
    return run
