"""Which of a bucket's rows a rule processor needs at all, decided column-wise.

The embedded engine evaluates every rule's conditions on the whole batch with numpy
(``CompiledRule.columnar_mask``) and hands per-event Python only the rows some variable may
take; a row no variable fits cannot begin, extend or break a relaxed or ``any`` match, nor
violate a negation. The Spark operator applies the same test to a bucket's rows before grouping
them by key, so the processor's per-event work (validation, reorder buffer, NFA) is spent on
the few rows that matter, as in the embedded engine.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyarrow import json as pa_json

from cep.events.event import STREAM_FIELD
from cep.events.limits import MAX_EVENT_BYTES, MAX_EVENT_DEPTH
from cep.nfa.processor import must_see_every_event

__all__ = [
    "ARROW_TYPES",
    "json_fields",
    "needed_from_parsed",
    "needed_rows",
    "needed_rows_from_json",
    "parse_fields",
    "unchecked_rows",
]


def needed_rows(processor: Any, events: Sequence[dict[str, Any] | None]) -> np.ndarray | None:
    """A boolean per event: whether ``processor`` may need it; ``None`` when it needs all.

    Rows that fail the stream's validation are kept (the processor dead-letters them with the
    reason), and so are the rows of streams whose rules must see every event (strict
    contiguity, ``prev``). Only processors that expose compiled ``rules`` and ``schemas`` (a
    :class:`cep.nfa.processor.RuleProcessor`) are filtered.
    """
    rules = getattr(processor, "rules", None)
    schemas = getattr(processor, "schemas", None)
    if not rules or schemas is None or not all(hasattr(r, "columnar_mask") for r in rules):
        return None
    by_stream: dict[str, list[int]] = {}
    for i, event in enumerate(events):
        if event is not None:
            stream = event.get(STREAM_FIELD)
            if isinstance(stream, str):
                by_stream.setdefault(stream, []).append(i)
    keep = np.zeros(len(events), dtype=bool)
    for stream, rows in by_stream.items():
        readers = [rule for rule in rules if stream in rule.streams]
        schema = schemas.get(stream)
        if not readers:
            continue  # no rule reads the stream: the processor ignores its rows anyway
        index = np.asarray(rows, dtype=np.int64)
        if schema is None or any(must_see_every_event(rule) for rule in readers):
            keep[index] = True
            continue
        # Only the declared fields: conditions read nothing else, and building the columns
        # field by field is several times cheaper than a frame of whole records.
        rows_here = [events[i] for i in rows]
        frame = pd.DataFrame(
            {name: [e.get(name) for e in rows_here] for name in schema.fields}
        )
        normalised, _, bad = schema.normalise_frame(frame)
        for position, _reason, _detail in bad:
            keep[index[position]] = True
        if normalised.empty:
            continue
        keep[index[_taken(readers, normalised, stream)]] = True
    return keep


def _taken(readers: Sequence[Any], normalised: pd.DataFrame, stream: str) -> np.ndarray:
    """Index labels of the validated rows some variable of some reader may take."""
    view = normalised
    if any(len(rule.streams) > 1 for rule in readers):
        view = normalised.assign(**{STREAM_FIELD: stream})
    wanted = np.zeros(len(normalised), dtype=bool)
    for rule in readers:
        wanted |= np.asarray(rule.columnar_mask(view), dtype=np.int64) != 0
    return normalised.index.to_numpy()[wanted]


_OPEN_OBJECT, _N, _I = ord("{"), ord("N"), ord("I")
_NAN, _INFINITY = np.frombuffer(b"NaN", dtype=np.uint8), np.frombuffer(b"Infinity", np.uint8)

ARROW_TYPES = {
    "float": pa.float64(),
    "int": pa.int64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "text": pa.string(),
}
"""Arrow type a JSON field of each declared kind is parsed as (other kinds: no column-wise
parse)."""


def json_fields(processor: Any) -> dict[str, pa.DataType] | None:
    """The fields (with Arrow types) a column-wise relevance test of ``processor`` reads from
    each row's JSON — the ``stream`` field and the declared non-time fields of every stream its
    rules read — or ``None`` when the test does not apply: a processor without compiled rules,
    a rule that must see every row, a stream with field types other than numbers, booleans
    and strings."""
    rules = getattr(processor, "rules", None)
    schemas = getattr(processor, "schemas", None)
    if not rules or schemas is None or not all(hasattr(r, "columnar_mask") for r in rules):
        return None
    if any(must_see_every_event(rule) for rule in rules):
        return None
    fields: dict[str, pa.DataType] = {STREAM_FIELD: pa.string()}
    for stream in sorted({s for rule in rules for s in rule.streams}):
        schema = schemas.get(stream)
        if schema is None:
            return None
        for name, kind in schema.fields.items():
            if name == schema.time_field:
                continue
            arrow = ARROW_TYPES.get(kind)
            if arrow is None or fields.get(name, arrow) != arrow:
                return None
            fields[name] = arrow
    return fields


def parse_fields(texts: Sequence[Any], fields: Mapping[str, pa.DataType]) -> pa.Table | None:
    """The ``fields`` of JSON object texts, one column each (``pyarrow.json``, in C; other
    fields ignored), or ``None`` when some text is not a JSON object whose fields have those
    types (or holds a line break): the caller then parses row by row, which reports each bad
    row with its reason. Rows :func:`unchecked_rows` flags are the caller's to leave out.

    Examples
    --------
    >>> parse_fields(['{"a": 1, "b": "x"}', '{"b": "y"}'], {"a": pa.int64()}).to_pylist()
    [{'a': 1}, {'a': None}]
    >>> parse_fields(['{"a": "one"}'], {"a": pa.int64()}) is None
    True
    """
    if not len(texts) or not all(isinstance(t, str) for t in texts):
        return None
    options = pa_json.ParseOptions(
        explicit_schema=pa.schema(list(fields.items())), unexpected_field_behavior="ignore"
    )
    try:
        table = pa_json.read_json(
            io.BytesIO("\n".join(texts).encode("utf-8")), parse_options=options
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeEncodeError):
        return None
    if table.num_rows != len(texts):
        return None  # a text held a line break or several objects: parse row by row
    return table


def needed_rows_from_json(
    processor: Any,
    texts: Sequence[Any],
    times: np.ndarray,
    default_stream: str | None,
) -> np.ndarray | None:
    """:func:`needed_rows` straight from the rows' JSON text, parsed column by column in C
    (``pyarrow.json``) instead of one ``json.loads`` per row, so the rows a rule cannot take
    are never turned into Python objects.

    ``times`` are the rows' event times in ms (computed by Spark). Returns ``None`` when this
    shortcut does not apply (see :func:`json_fields`), or when a row is not a JSON object of
    the declared types (the caller then parses row by row, which reports those rows with their
    reasons).
    """
    fields = json_fields(processor)
    if fields is None:
        return None
    table = parse_fields(texts, fields)
    if table is None:
        return None
    needed = needed_from_parsed(processor, table, times, default_stream)
    if needed is None:
        return None
    # Rows the line checks may refuse are kept: the processor parses and reports them.
    return needed | unchecked_rows(pa.array(texts, pa.string()))


def unchecked_rows(texts: pa.Array) -> np.ndarray:
    """A boolean per JSON text: whether ``pyarrow.json`` might parse it although
    :func:`~cep.events.event.parse_json_line` refuses it, for breaking a limit of
    :mod:`cep.events.limits` (more bytes, or possibly more nesting, than allowed) or holding
    ``NaN`` or ``Infinity`` (which pyarrow reads as numbers). Column-wise shortcuts must leave
    those rows to the row-wise parse, which dead-letters them as the embedded engine does.
    Other refusals (a number beyond a double, an unpaired surrogate, a duplicate field) make
    pyarrow refuse the whole batch, which then goes row by row anyway.

    Examples
    --------
    >>> unchecked_rows(pa.array(['{"a": 1}', '{"a": NaN}', '{"a": "Infinity War"}', None]))
    array([False,  True,  True, False])
    """
    n = len(texts)
    if not n:
        return np.zeros(0, dtype=bool)
    # On the text buffer itself: Arrow's substring kernels cost as much as the parse.
    _, offsets_buffer, data_buffer = texts.buffers()
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=width)[texts.offset:texts.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]]
        if data_buffer is not None else np.zeros(0, dtype=np.uint8)
    )
    starts = offsets - offsets[0]
    odd = np.diff(starts) > MAX_EVENT_BYTES
    # At most one level per opening bracket: few brackets, no doubt (strings count too).
    brackets = np.flatnonzero((data | 0x20) == _OPEN_OBJECT)  # "[" is "{" but for bit 0x20
    odd |= np.diff(np.searchsorted(brackets, starts)) > MAX_EVENT_DEPTH
    # NaN and Infinity, found from their capitals (few in most text).
    capitals = np.flatnonzero((data == _N) | (data == _I))
    if len(capitals):
        padded = np.concatenate([data, np.zeros(len(_INFINITY), dtype=np.uint8)])
        windows = padded[capitals[:, None] + np.arange(len(_INFINITY))]
        found = (windows == _INFINITY).all(axis=1)
        found |= (windows[:, :len(_NAN)] == _NAN).all(axis=1)
        odd[np.searchsorted(starts, capitals[found], side="right") - 1] = True
    return odd


def needed_from_parsed(
    processor: Any, table: pa.Table, times: np.ndarray, default_stream: str | None
) -> np.ndarray | None:
    """:func:`needed_rows` of rows already parsed into ``table`` (the :func:`json_fields`
    columns, others ignored), with their event times in ms; ``None`` when the test does not
    apply to ``processor``. Rows that fail their stream's validation are kept."""
    fields = json_fields(processor)
    if fields is None:
        return None
    rules = processor.rules
    schemas = processor.schemas
    streams = sorted({s for rule in rules for s in rule.streams})
    frame = table.select([name for name in fields if name in table.column_names]).to_pandas()
    stream_of_row = frame[STREAM_FIELD]
    if default_stream is not None:
        stream_of_row = stream_of_row.fillna(default_stream)
    keep = np.zeros(len(frame), dtype=bool)
    for stream in streams:
        rows = np.flatnonzero((stream_of_row == stream).to_numpy())
        if not len(rows):
            continue
        schema = schemas[stream]
        part = frame.iloc[rows].drop(columns=[STREAM_FIELD]).reset_index(drop=True)
        # As instants: the stream's epoch unit (ms or s) reads them the same either way.
        part[schema.time_field] = pd.to_datetime(np.asarray(times, dtype=np.int64)[rows],
                                                 unit="ms", utc=True)
        normalised, _, bad = schema.normalise_frame(part)
        for position, _reason, _detail in bad:
            keep[rows[position]] = True
        if normalised.empty:
            continue
        readers = [rule for rule in rules if stream in rule.streams]
        keep[rows[_taken(readers, normalised, stream)]] = True
    tables = getattr(processor, "tables", None)
    for stream in tables.streams if tables is not None else ():
        keep[(stream_of_row == stream).to_numpy()] = True  # changes of the rules' tables
    return keep
