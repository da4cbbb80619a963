"""The engine's non-sequence standing queries: ``query`` blocks (the percolator) and ``metric``
blocks (window operators), fed with every on-time event the engine accepts.

Queries are stateless per document, so they see events as they arrive; metrics keep their own
event-time windows and are moved by the engine's watermark. Late events go to the metrics
that still retain their window (a correction); the engine dead-letters the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from cep.engine.program import compile_program_metric
from cep.events.event import STREAM_FIELD, Event
from cep.events.identity import content_id, event_digest
from cep.events.watermark import iso_ms
from cep.metrics.operator import MetricOperator
from percolator import InvalidDocumentError, Percolator, Schema, compile_query
from percolator.extract import extract
from query_lang import ast
from query_lang.errors import VigilWarning


class StandingQueries:
    """Queries and metrics registered on an engine.

    Parameters
    ----------
    lateness_ms:
        Overrides every stream's lateness (as the engine's own option does).
    """

    def __init__(self, lateness_ms: int | None = None) -> None:
        self.lateness_ms = lateness_ms
        self._percolators: dict[str, Any] = {}  # stream -> Percolator for that stream's schema
        # stream -> (its declaration, the queries registered for it but not yet indexed)
        self._pending: dict[str, tuple[ast.StreamDecl, list[tuple[str, Any, tuple[str]]]]] = {}
        self._queries: dict[str, ast.QueryDecl] = {}
        self._declared: dict[str, tuple[str, ...]] = {}  # stream -> declared field names
        self._metrics: dict[str, Any] = {}  # name -> MetricOperator
        self._metric_streams: dict[str, list[str]] = {}  # stream -> metric names
        self.verified = 0
        self.documents = 0
        self.unsearchable = 0  # documents holding a value no JSON holds (see _match_one)

    # ------------------------------------------------------------------ registration

    @property
    def names(self) -> list[str]:
        return [*self._queries, *self._metrics]

    def __contains__(self, name: str) -> bool:
        return name in self._queries or name in self._metrics

    @property
    def operators(self) -> dict[str, MetricOperator]:
        """The window operator of each registered metric, by name."""
        return dict(self._metrics)

    def replace_operator(self, name: str, operator: MetricOperator) -> None:
        """Run metric ``name`` with ``operator`` from now on: its state restored from a
        checkpoint, or a fresh one of its definition compiled with another version. The
        metric keeps the streams it reads."""
        if name not in self._metrics:
            raise KeyError(name)
        self._metrics[name] = operator

    def compile(
        self,
        decls: list[ast.QueryDecl | ast.MetricDecl],
        streams: Mapping[str, ast.StreamDecl],
        lists: Mapping[str, Any],
        versions: Mapping[str, int] | None = None,
        tables: Mapping[str, Any] | None = None,
    ) -> list[tuple[ast.Node, Any]]:
        """Compile declarations without registering them (so a failing one registers none),
        each metric at its version in ``versions`` (default 1), reading ``tables``."""
        compiled = []
        for decl in decls:
            if isinstance(decl, ast.MetricDecl):
                metric = compile_program_metric(
                    decl, streams, lists, lateness_ms=self.lateness_ms,
                    version=(versions or {}).get(decl.name, 1), tables=tables,
                )
                compiled.append((decl, MetricOperator(metric)))
            else:
                for stream in decl.streams:  # fails early on a query the index would reject
                    compile_query(decl.match, query_schema(streams[stream]))
                compiled.append((decl, decl.match))
        return compiled

    def add(self, compiled: list[tuple[ast.Node, Any]], streams: Mapping[str, ast.StreamDecl]):
        """Register compiled declarations. Queries are indexed when their stream's first
        document comes (:meth:`index`): registering costs no index build where none is used
        (a Spark driver, a program only listed) and a program's queries go in together."""
        for decl, value in compiled:
            if isinstance(decl, ast.MetricDecl):
                self._metrics[decl.name] = value
                for stream in decl.streams:
                    self._metric_streams.setdefault(stream, []).append(decl.name)
            else:
                self._queries[decl.name] = decl
                for stream in decl.streams:
                    self._declared[stream] = tuple(f.name for f in streams[stream].fields)
                    _, pending = self._pending.setdefault(stream, (streams[stream], []))
                    pending.append((decl.name, value, (stream,)))

    def index(self, stream: str) -> Any:
        """The percolator of ``stream``'s queries (None if it has none), with every query
        registered so far indexed."""
        waiting = self._pending.pop(stream, None)
        if waiting is not None:
            decl, batch = waiting
            percolator = self._percolators.get(stream)
            if percolator is None:
                # Highlights on: a query's matches are alerts a person reads, and the offsets
                # say why the event matched; they cost per match, and alerts are few per event
                # (docs/percolator.md, "Highlights").
                percolator = self._percolators[stream] = Percolator(
                    query_schema(decl), highlights=True
                )
            if len(batch) == 1:
                percolator.add(*batch[0])  # into the live delta: no segment for one query
            else:
                # Queries registered together go in as one segment: matching then probes one
                # index rather than the log of segments that adding them one by one leaves.
                percolator.add_many(batch)
        return self._percolators.get(stream)

    def build(self) -> None:
        """Index every registered query now (see :meth:`index`)."""
        for stream in list(self._pending):
            self.index(stream)

    def remove(self, name: str) -> None:
        if name in self._queries:
            decl = self._queries.pop(name)
            for stream in decl.streams:
                self.index(stream).delete(name)
        elif name in self._metrics:
            del self._metrics[name]
            for names in self._metric_streams.values():
                if name in names:
                    names.remove(name)

    def reads(self, stream: str) -> bool:
        """Whether any query or metric wants the events of ``stream``."""
        return bool(self._metric_streams.get(stream)) or self.wants_documents(stream)

    # ------------------------------------------------------------------ input

    def accept(self, event: Event) -> list[dict]:
        """One on-time event (its fields normalised, time in ms)."""
        out = self._match(event.stream, [event])
        for name in self._metric_streams.get(event.stream, ()):
            out.extend(self._metrics[name].process(event.fields, event.ts))
        return out

    def accept_frame(
        self, stream: str, frame: pd.DataFrame, ts: np.ndarray, events: list[Event] | None,
        seqs: np.ndarray,
    ) -> list[dict]:
        """A batch of on-time events of one stream: normalised columns, times in ms, and the
        events themselves when some query needs documents (``None`` otherwise)."""
        out = self._match(stream, events or [])
        names = self._metric_streams.get(stream, ())
        if names:
            view = frame.assign(ts=np.asarray(ts, dtype=np.int64), _seq=seqs)
            for name in names:
                out.extend(self._metrics[name].process_batch(view))
        return out

    def match_events(self, events: list[Event]) -> list[tuple[Event, dict]]:
        """The query matches of on-time ``events`` of any streams, in event order, each with
        its event. Runs of consecutive events of one stream are matched as one batch (see
        :meth:`~percolator.Percolator.match_batch`); metrics are not fed."""
        out: list[tuple[Event, dict]] = []
        start = 0
        while start < len(events):
            stream = events[start].stream
            end = start + 1
            while end < len(events) and events[end].stream == stream:
                end += 1
            out.extend(self._matches(stream, events[start:end]))
            start = end
        return out

    def wants_documents(self, stream: str) -> bool:
        if stream in self._pending:
            return True
        return stream in self._percolators and len(self._percolators[stream]) > 0

    def late(self, event: Event, watermark_ms: int) -> list[dict] | None:
        """An event behind the watermark: the corrections it causes, or None when no metric
        could take it (the engine then dead-letters it as late)."""
        taken = False
        out: list[dict] = []
        for name in self._metric_streams.get(event.stream, ()):
            rows = self._metrics[name].late(event.fields, event.ts, watermark_ms)
            if rows is not None:
                taken = True
                out.extend(rows)
        return out if taken else None

    def settle(self, stream: str, watermark_ms: int) -> list[dict]:
        """Move the metrics of ``stream`` to the watermark (as :meth:`advance` moves all of
        them); returns the windows that closed."""
        out: list[dict] = []
        for name in self._metric_streams.get(stream, ()):
            out.extend(self._metrics[name].advance_watermark(watermark_ms))
        return out

    def counts(self, stream: str) -> bool:
        """Whether a metric reads ``stream`` (its windows depend on where late events fall)."""
        return bool(self._metric_streams.get(stream))

    def advance(self, watermark_ms: int) -> list[dict]:
        """Move every metric to the watermark; returns the windows that closed."""
        out: list[dict] = []
        for op in self._metrics.values():
            out.extend(op.advance_watermark(watermark_ms))
        return out

    def _match(self, stream: str, events: list[Event]) -> list[dict]:
        return [row for _, row in self._matches(stream, events)]

    def _matches(self, stream: str, events: list[Event]) -> list[tuple[Event, dict]]:
        percolator = self.index(stream)
        if percolator is None or not len(percolator) or not events:
            return []
        out: list[tuple[Event, dict]] = []
        try:
            found_per_event = percolator.match_batch(
                [event.fields for event in events],
                document_ids=[event.id for event in events],
                stream=stream,
            ).matches
        except InvalidDocumentError:
            found_per_event = [self._match_one(percolator, event, stream) for event in events]
        self.documents += len(events)
        for event, found in zip(events, found_per_event, strict=True):
            if not found:
                continue
            when = iso_ms(event.ts)
            digest = event_digest(stream, event.ts, event.fields, self._declared.get(stream))
            for m in found:
                decl = self._queries[m.name]
                row = m.to_dict()
                # The engine's id scheme (cep.events.identity): the event's id and digest.
                row.update(
                    match_id=content_id(["query", m.name, event.id, digest]),
                    stream=stream, severity=decl.severity, start=when, end=when,
                )
                out.append((event, row))
        return out

    def _match_one(self, percolator: Any, event: Event, stream: str) -> list[Any]:
        """The query matches of one event; none, counted in ``unsearchable``, when it holds a
        value the percolator cannot search. Every JSON value can be searched: only an event a
        caller built (a set, bytes in an undeclared field) gets here."""
        try:
            return percolator.match_batch(
                [event.fields], document_ids=[event.id], stream=stream
            ).matches[0]
        except InvalidDocumentError:
            self.unsearchable += 1
            return []


def query_warnings(program: Any) -> list[Any]:
    """``query`` blocks that probably do not do what their author wants: those that search a
    field their stream does not declare (read as a keyword, per the open schema: often a typo),
    those that require nothing a document must contain (verified against every document of
    their streams, as the always-run bucket counts them) and those that can never match."""
    found = []
    # Program.streams rebuilds its table from every declaration: looked up once, not per query.
    streams = program.streams
    schemas = {name: query_schema(decl) for name, decl in streams.items()}
    for decl in program.queries.values():
        source = program.sources.get(decl.span.file) if decl.span else None
        for leaf, stream in _undeclared_fields(decl, streams):
            found.append(VigilWarning(
                f"query '{decl.name}' searches field '{leaf.field}', which stream '{stream}' "
                "does not declare: it is read from the events as a keyword field, if they carry "
                "it (check the spelling, or declare it)",
                leaf.span, source,
            ))
        for stream in decl.streams:
            requirement = extract(compile_query(decl.match, schemas[stream]))
            if requirement.always:
                message = (
                    f"query '{decl.name}' requires no term, value or field a document must "
                    f"contain: it is verified against every '{stream}' event, outside the index"
                )
            elif requirement.never:
                message = f"query '{decl.name}' can never match a '{stream}' event"
            else:
                continue
            found.append(VigilWarning(message, decl.span, source))
    return found


def _undeclared_fields(
    decl: ast.QueryDecl, streams: Mapping[str, ast.StreamDecl]
) -> list[tuple[Any, str]]:
    """``(leaf, stream)`` for each leaf of the query naming a field one of its streams does not
    declare (the ``stream`` field and the stream's id field are always there; a dotted name,
    a field of a nested object, cannot be declared)."""
    found = []
    for leaf in ast.search_leaves(decl.match):
        field = getattr(leaf, "field", None)
        if field is None or "." in field:
            continue
        for stream in decl.streams:
            schema = streams[stream]
            known = field in (STREAM_FIELD, schema.id_field or "id")
            if not known and schema.field_type(field) is None:
                found.append((leaf, stream))
    return found


def query_schema(decl: ast.StreamDecl) -> Any:
    """The percolator schema of a stream: declared field types; times arrive as epoch ms."""
    return Schema.of({f.name: f.type for f in decl.fields}, time_unit="ms")

