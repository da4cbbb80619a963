"""Standing ``query`` blocks on Spark: the percolator runs inside each partition's Python
worker over the raw events, with the same analysis, index and match objects as the embedded
engine (:mod:`cep.engine.queries`). Matching a document needs no state, so no shuffle either. The
query index is built once per Python worker (Spark reuses them) and rebuilt only when the
queries change.
"""

from __future__ import annotations

import gc
import hashlib
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cep.engine import StandingQueries, load_declarations
from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    EventReason,
    StreamSchema,
    dead_letter,
    parse_json_line,
    stream_of,
)
from cep.events.watermark import Watermark, late_detail
from percolator.collector import keep_built
from query_lang import ast
from query_lang.printer import print_declaration
from spark_udf.batch import END_MARK_STREAM, SEQ_COLUMN
from spark_udf.operator import OUTPUT_SCHEMA
from spark_udf.records import dead_letter_record, records_frame, uncorrected_record
from spark_udf.sources import EVENT_COLUMN

__all__ = ["frame_outputs", "query_names", "query_outputs"]


def _queries(program: Any) -> tuple[list[ast.QueryDecl], dict[str, ast.StreamDecl]]:
    # Parsed and checked only: the driver needs the declarations, not an index of them (which
    # each worker builds; at 100k queries, ~12 s per build saved on the driver).
    declarations = load_declarations(program)
    decls = [d for d in declarations if isinstance(d, ast.QueryDecl)]
    return decls, {d.name: d for d in declarations if isinstance(d, ast.StreamDecl)}


#: Rows of a partition's frame matched and handed back together (see ``query_outputs``).
ROWS_PER_CHUNK = 512

_INDEXES: dict[str, tuple[Any, dict[str, Any]]] = {}
"""Query indexes built in this Python worker, by fingerprint of the queries and streams: Spark
reuses its workers, so a worker builds the index once and every later micro-batch and
partition it serves reuses it; changed queries have another fingerprint and get a new one."""


def _index(
    fingerprint: str, decls: Sequence[ast.QueryDecl], streams: dict[str, ast.StreamDecl]
) -> tuple[Any, dict[str, Any]]:
    found = _INDEXES.get(fingerprint)
    if found is None:
        # One program per worker at a time: drop the previous index (unfrozen, so that the
        # collector can reclaim it) before building this one.
        gc.unfreeze()
        _INDEXES.clear()
        gc.collect()
        standing = StandingQueries()
        standing.add(standing.compile(list(decls), streams, {}), streams)
        standing.build()
        schemas = {name: StreamSchema.from_decl(d) for name, d in streams.items()}
        found = _INDEXES[fingerprint] = (standing, schemas)
        # The index lives as long as the worker: moved out of the collector's generations,
        # its millions of objects are not traversed again by every full collection that
        # the matches' allocations trigger (25-30% of a frame's time at 100k queries).
        keep_built()
    return found


def _watermark(schemas: Mapping[str, Any]) -> Watermark:
    """The embedded engine's watermark over the streams of ``schemas``, with their lateness."""
    return Watermark({name: schema.lateness_ms for name, schema in schemas.items()})


def query_names(program: Any) -> list[str]:
    """Names of the ``query`` blocks of a program (rule file path, DSL text or modules).

    Examples
    --------
    >>> query_names('''
    ... stream news (id string, title text, ts timestamp) time ts
    ... query acme from news match title:acme
    ... query globex from news match title:globex
    ... ''')
    ['acme', 'globex']
    """
    return [d.name for d in _queries(program)[0]]


def query_outputs(
    events: DataFrame,
    program: Any,
    *,
    json_col: str = EVENT_COLUMN,
    stream: str | None = None,
    operator_streams: Collection[str] = (),
    live: Any = None,
) -> DataFrame | None:
    """Query matches of ``events`` (``_seq`` and a JSON-text column, as the Vigil sources give),
    in the operator's output schema, with the dead letters of the rows no keyed operator checks.

    ``operator_streams`` names the streams whose events a keyed operator over the same input
    (:func:`spark_udf.detect_specs`) validates and dead-letters itself; their bad events are not
    reported twice here. Reported here, like the embedded engine does, are: rows whose stream is
    missing or undeclared; events of the other streams that do not fit their stream; and, when
    no keyed operator runs (``operator_streams`` empty), rows that are not JSON objects.

    Returns ``None`` when the program has no query and the input is bound (``stream``) to a
    stream the keyed operator checks: nothing can be left to report. Without queries, only the
    rows naming no stream or another stream than those are read (filtered in the JVM).

    With ``live`` (a :class:`spark_udf.live.LiveProgram`) each micro-batch runs the queries,
    streams and keyed streams of the program pinned to it (every row is read: what the next
    program searches is not known when the query starts).

    Examples
    --------
    With ``spark`` a SparkSession, a query over two rows, one of which does not fit its
    stream:

    >>> events = spark.createDataFrame([
    ...     (0, '{"stream": "news", "id": "n1", "title": "ACME merger", "ts": 1767225600}'),
    ...     (1, '{"stream": "news", "id": "n2", "title": 7, "ts": "yesterday"}'),
    ... ], "_seq long, _event string")
    >>> out = query_outputs(events, '''
    ... stream news (id string, title text, ts timestamp) time ts
    ... query acme from news match title:acme
    ... ''')
    >>> sorted((row.kind, row.name, row.key) for row in out.collect())
    [('dead_letter', 'wrong_type', None), ('query', 'acme', '{"document_id": "n1"}')]
    """
    if live is not None:
        return events.mapInPandas(_live_partitions(live, json_col, stream), schema=OUTPUT_SCHEMA)
    decls, streams = _queries(program)
    checked = frozenset(operator_streams)
    if not decls and stream is not None and stream in checked:
        return None  # every row is the bound stream's, which the keyed operator checks
    if not decls and stream is None:
        named = F.get_json_object(F.col(json_col), f"$.{STREAM_FIELD}")
        outside = ~named.isin(sorted(checked)) if checked else F.lit(True)
        if len(streams) == 1 and set(streams) <= checked:
            events = events.where(named.isNotNull() & outside)  # no name: the one stream's
        else:
            events = events.where(named.isNull() | outside)
        events = events.where(named.isNull() | (named != F.lit(END_MARK_STREAM)))
    text = "\n".join(print_declaration(d) for d in [*streams.values(), *decls])
    fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()
    shipped = (tuple(decls), streams, stream, json_col, fingerprint, checked)

    def match_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        query_decls, stream_decls, bound, column, key, checked_streams = shipped
        standing, schemas = _index(key, query_decls, stream_decls)
        # One watermark per task, over its slice of the input in order (see frame_outputs).
        watermark = _watermark(schemas)
        for frame in frames:
            # A few hundred rows at a time: a frame's matches are handed on before the next
            # rows are matched, so the objects alive (and traversed by each collection) stay few.
            for start in range(0, len(frame), ROWS_PER_CHUNK):
                yield records_frame(frame_outputs(
                    frame.iloc[start:start + ROWS_PER_CHUNK], standing, schemas,
                    column=column, bound=bound, checked=checked_streams, watermark=watermark,
                ))

    return events.mapInPandas(match_partition, schema=OUTPUT_SCHEMA)


def _live_partitions(live: Any, column: str, bound: str | None) -> Any:
    def match_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        compiled = live.for_task()
        key = f"{live.checkpoint}#{compiled.entry.number}"
        standing, schemas = _index(key, compiled.queries, dict(compiled.streams))
        watermark = _watermark(schemas)
        for frame in frames:
            for start in range(0, len(frame), ROWS_PER_CHUNK):
                yield records_frame(frame_outputs(
                    frame.iloc[start:start + ROWS_PER_CHUNK], standing, schemas,
                    column=column, bound=bound, checked=compiled.keyed_streams,
                    watermark=watermark,
                ))

    return match_partition


def frame_outputs(
    frame: pd.DataFrame,
    standing: Any,
    schemas: Mapping[str, Any],
    *,
    column: str = EVENT_COLUMN,
    bound: str | None = None,
    checked: Collection[str] = frozenset(),
    watermark: Watermark | None = None,
) -> list[dict[str, Any]]:
    """Output records (see :func:`spark_udf.records.records_frame`) of one frame of rows:
    the query matches of its events and the dead letters of the rows no keyed operator checks
    (``checked`` names the streams one does); what a worker of :func:`query_outputs` runs.

    Lateness as in the embedded engine: ``watermark`` (a fresh one when None) follows the
    rows in input order, and an event behind it is not searched; it is dead-lettered ``late``
    unless a keyed operator checks its stream (which reports it). A worker judges its slice of
    the input only: an event late only against rows of another task is still searched.

    The events of a clock-corrected stream no keyed operator checks that keep their device
    time (no sent or received time) are counted here, in one ``uncorrected`` record per
    stream (the keyed operator's routing counts those of its streams).
    """
    checked_streams = frozenset(checked)
    if watermark is None:
        watermark = _watermark(schemas)
    seqs = frame[SEQ_COLUMN].tolist() if SEQ_COLUMN in frame else range(len(frame))
    accepted = []
    letters: list[dict[str, Any]] = []
    late: list[dict[str, Any]] = []
    uncorrected: dict[str, int] = {}
    for seq, text in zip(seqs, frame[column].tolist(), strict=True):
        text = text if isinstance(text, str) else None
        try:
            # As the embedded engine reads a line (a null row is JSON null: not an object).
            raw = parse_json_line("null" if text is None else text)
        except BadEventError as exc:
            if not checked_streams:  # else the keyed operator reports it
                letters.append(dead_letter(exc.reason, exc.detail, line=seq, raw=text))
            continue
        named = raw.get(STREAM_FIELD)
        if named == END_MARK_STREAM:
            continue  # the source's end-of-input mark, not an event
        try:
            schema = stream_of(raw, bound, schemas)
        except BadEventError as exc:  # no keyed operator sees these rows
            letters.append(dead_letter(
                exc.reason, exc.detail, line=seq,
                stream=named if isinstance(named, str) else None, event=raw,
            ))
            continue
        checked_here = schema.name not in checked_streams
        if not checked_here and not standing.wants_documents(schema.name):
            continue
        try:
            event = schema.normalise(raw, seq=int(seq), position=int(seq))
        except BadEventError as exc:
            if checked_here:
                letters.append(dead_letter(
                    exc.reason, exc.detail, line=seq, stream=schema.name, event=raw,
                ))
            continue
        if checked_here and schema.uncorrected(event.fields):
            uncorrected[schema.name] = uncorrected.get(schema.name, 0) + 1
        met = watermark.current
        if watermark.observe(event.stream, int(event.ts)):
            if checked_here:
                late.append(dead_letter_record(dead_letter(
                    EventReason.LATE, late_detail(int(event.ts), met, schema.epoch_unit_ms),
                    line=seq, stream=schema.name, event=raw,
                ), time_ms=int(event.ts)))
            continue
        if standing.wants_documents(event.stream):
            accepted.append(event)
    rows = [dead_letter_record(letter) for letter in letters] + late
    rows.extend(uncorrected_record(stream, count, f"seq {seqs[0]}")
                for stream, count in sorted(uncorrected.items()))
    # One batch per run of a stream's events: candidates are selected many at a time.
    for event, match in standing.match_events(accepted):
        when = int(event.ts)
        rows.append({
            "kind": "query",
            "name": match["name"],
            "match_id": match["match_id"],
            "key": json.dumps({"document_id": match["document_id"]}),
            "payload": json.dumps(match, separators=(",", ":"), default=str),
            "start_ms": when,
            "end_ms": when,
        })
    return rows
