"""The embedded engine: register rules, feed events one at a time or as DataFrames, read matches.

``Engine`` owns event time for all its inputs (one watermark, one reorder buffer), partitions
released events by each rule's key and hands them to :class:`cep.nfa.processor.RuleProcessor`, the
same per-key code the Spark operator runs. Which matches are reported does not depend on how
input is batched; the order of matches of different keys within one batch may.
"""

from __future__ import annotations

import gc
import heapq
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cep.engine.queries import StandingQueries
from cep.events.columnar import Block, Chunk, ColumnBuffer
from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    EngineError,
    Event,
    EventReason,
    StreamSchema,
    UnknownRuleError,
    _column_values,
    dead_letter,
    parse_json_line,
    plain_value,
    stream_of,
)
from cep.events.watermark import END_OF_INPUT, ReorderBuffer, Watermark, iso_ms
from cep.nfa.compiler import compile_rule as compile_rule_default
from cep.nfa.processor import (
    NOT_REGISTERED,
    KeyState,
    RuleProcessor,
    RuleRuntime,
    key_signature,
    must_see_every_event,
)
from percolator.evaluate import field_predicate
from query_lang import ast
from query_lang.checks import check_declarations
from query_lang.errors import ErrorList, IncludeError, VigilError, VigilNameError
from query_lang.loader import check_program
from sketches.bloom import BloomFilter

__all__ = ["Engine", "EngineStats", "load_declarations", "load_list"]

BLOOM_THRESHOLD = 100_000
"""Lists with more values than this are held in a Bloom filter instead of a set."""

BLOOM_FALSE_POSITIVE_RATE = 1e-6


@dataclass(frozen=True)
class EngineStats:
    """Counters of a run.

    Attributes
    ----------
    events:
        Events received (valid or not).
    accepted:
        Events that passed validation and were not late.
    late:
        Events dead-lettered because they arrived behind the watermark.
    bad:
        Events dead-lettered for any other reason (invalid JSON, wrong type, missing key ...).
    matches:
        Matches reported, per rule.
    dropped_partials:
        Partial matches dropped by the ``max_partials`` cap, per rule.
    keys:
        Partition keys currently holding state.
    buffered:
        Events waiting in the reorder buffer for the watermark.
    watermark:
        The engine watermark (epoch ms).
    """

    events: int
    accepted: int
    late: int
    bad: int
    matches: dict[str, int] = field(default_factory=dict)
    dropped_partials: dict[str, int] = field(default_factory=dict)
    keys: int = 0
    buffered: int = 0
    watermark: int = 0


@dataclass
class _Group:
    """Rules that share a key definition, their processor and the live state of each key."""

    processor: RuleProcessor
    slots: tuple[int, ...]
    states: dict[tuple, KeyState] = field(default_factory=dict)
    # stream -> (slot, needs_every_event) of the rules reading it, for a quick relevance test
    readers: dict[str, tuple[tuple[int, bool], ...]] = field(default_factory=dict)
    # len(masks) for which an event's masks are already aligned with the processor's rules
    # (the group's slots are 0..n-1), -1 when they never are
    width: int = -1
    # streams some rule of the group must see every event of
    always: frozenset[str] = frozenset()


class Engine:
    """An embedded, single-process CEP engine.

    Parameters
    ----------
    max_partials:
        Cap on partial matches per rule and key (passed to the NFA compiler); ``None`` keeps the
        compiler's default.
    lateness_ms:
        Overrides every stream's declared lateness.
    compile_rule:
        Rule compiler (default ``cep.nfa.compiler.compile_rule``); tests may inject another.
    runtime:
        NFA runtime (default ``cep.nfa.runtime``); tests may inject another.
    fast_strict:
        Run rules that :func:`cep.nfa.strict.qualifies` as a column-wise scan over each released
        batch (the default); ``False`` runs every rule event by event. Results are the same.

    Examples
    --------
    >>> engine = Engine()
    >>> engine.register('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... ''')
    ['big']
    >>> engine.feed({"card_id": "c1", "amount": 500.0, "ts": 1767225600})
    >>> engine.close()
    >>> [(m["name"], m["key"], m["events"], m["start"]) for m in engine.drain()]
    [('big', {'card_id': 'c1'}, {'b': [0]}, '2026-01-01T00:00:00.000Z')]
    """

    def __init__(
        self,
        *,
        max_partials: int | None = None,
        lateness_ms: int | None = None,
        compile_rule: Callable[..., Any] | None = None,
        runtime: RuleRuntime | None = None,
        fast_strict: bool = True,
    ) -> None:
        self.max_partials = max_partials
        self.fast_strict = fast_strict
        self.lateness_ms = lateness_ms
        self._compile_rule = compile_rule
        self._runtime = runtime
        self._declarations: list[ast.Declaration] = []
        self._streams: dict[str, ast.StreamDecl] = {}
        self._schemas: dict[str, StreamSchema] = {}
        self._lists: dict[str, Any] = {}
        self._webhooks: dict[str, ast.WebhookDecl] = {}
        self._rules: dict[str, Any] = {}
        self._rule_decls: dict[str, ast.RuleDecl] = {}
        self._slot_of: dict[str, int] = {}
        self._next_slot = 0
        self._groups: dict[tuple, _Group] = {}
        self._standing = StandingQueries(lateness_ms)
        self._watermark = Watermark({})
        self._buffer = ReorderBuffer()
        # Streams whose rows wait as columns (cep.events.columnar) and the key signature of the one
        # group reading them; streams that qualify but still have events in self._buffer
        # wait in _wanted until those are released.
        self._columns = ColumnBuffer()
        self._columnar: dict[str, tuple] = {}
        self._wanted: dict[str, tuple] = {}
        self._timers: list[tuple[int, int, tuple, tuple]] = []
        self._scheduled: dict[tuple[tuple, tuple], int] = {}
        self._timer_seq = 0
        self._seq = 0
        self._matches: list[dict[str, Any]] = []
        self._dead: list[dict[str, Any]] = []
        self._events = 0
        self._accepted = 0
        self._late = 0
        self._bad = 0
        self._match_counts: Counter[str] = Counter()
        self._retired_drops: Counter[str] = Counter()
        self._closed = False

    # ------------------------------------------------------------------ registration

    @property
    def rules(self) -> list[str]:
        """Names of the registered rules."""
        return list(self._rules)

    @property
    def streams(self) -> dict[str, ast.StreamDecl]:
        """Declared streams by name."""
        return dict(self._streams)

    @property
    def webhooks(self) -> dict[str, ast.WebhookDecl]:
        """Declared webhooks by name (delivery is ``cep.alerts``' job)."""
        return dict(self._webhooks)

    @property
    def declarations(self) -> list[ast.Declaration]:
        """Every registered declaration (streams, lists, webhooks, rules, queries, metrics)."""
        return list(self._declarations)

    @property
    def standing(self) -> list[str]:
        """Names of the registered queries and metrics."""
        return self._standing.names

    def rule(self, name: str) -> Any:
        """The compiled rule ``name``."""
        try:
            return self._rules[name]
        except KeyError:
            raise UnknownRuleError(f"no rule named '{name}' is registered") from None

    def register(self, source: str | os.PathLike | ast.Module | Sequence[ast.Module]) -> list[str]:
        """Add the declarations of a rule file, DSL text, or parsed module(s).

        Streams, lists and webhooks become available to later registrations too. Rules run in
        the NFA runtime, ``query`` blocks in the percolator and ``metric`` blocks in window
        operators (:mod:`cep.engine.queries`).

        Returns
        -------
        list[str]
            Names of the rules, queries and metrics registered.

        Raises
        ------
        query_lang.errors.VigilError
            When the text does not parse or check, a list file cannot be read, or a rule with
            the same name is already registered.
        """
        new_decls = load_declarations(source, self._declarations)
        streams = dict(self._streams)
        lists = dict(self._lists)
        errors: list[VigilError] = []
        for decl in new_decls:
            if isinstance(decl, ast.StreamDecl):
                old = streams.get(decl.name)
                if old is not None and old != decl:
                    errors.append(
                        VigilNameError(
                            f"stream '{decl.name}' is already registered with another definition",
                            decl.span,
                        )
                    )
                streams[decl.name] = decl
            elif isinstance(decl, ast.ListDecl):
                try:
                    lists[decl.name] = load_list(decl)
                except VigilError as exc:
                    errors.append(exc)
        rules_here = [d for d in new_decls if isinstance(d, ast.RuleDecl)]
        standing_here = [d for d in new_decls if isinstance(d, ast.QueryDecl | ast.MetricDecl)]
        seen: set[str] = set()
        for decl in [*rules_here, *standing_here]:
            if decl.name in self._rules or decl.name in self._standing or decl.name in seen:
                errors.append(
                    VigilNameError(
                        f"'{decl.name}' is already registered; unregister it first",
                        decl.span,
                    )
                )
            seen.add(decl.name)
            for stream in decl.streams:
                if stream not in streams:
                    errors.append(
                        VigilNameError(
                            f"rule '{decl.name}' reads undeclared stream '{stream}'", decl.span
                        )
                    )
                elif StreamSchema.from_decl(streams[stream]).time_field is None:
                    errors.append(
                        VigilNameError(
                            f"rule '{decl.name}' reads stream '{stream}', which has no event "
                            "time: declare `time FIELD`",
                            streams[stream].span,
                        )
                    )
        if errors:
            raise errors[0] if len(errors) == 1 else ErrorList(errors)
        compiled = [self._compile(decl, streams, lists) for decl in rules_here]
        standing = self._standing.compile(standing_here, streams, lists)

        # Nothing can fail past this point: commit the registration.
        self._declarations.extend(new_decls)
        self._streams = streams
        self._lists = lists
        for decl in new_decls:
            if isinstance(decl, ast.StreamDecl):
                schema = StreamSchema.from_decl(decl, lateness_ms=self.lateness_ms)
                self._schemas[decl.name] = schema
                self._watermark.set_lateness(decl.name, schema.lateness_ms)
            elif isinstance(decl, ast.WebhookDecl):
                self._webhooks[decl.name] = decl
        self._standing.add(standing, streams)
        for decl, rule in zip(rules_here, compiled, strict=True):
            self._rules[decl.name] = rule
            self._rule_decls[decl.name] = decl
            self._slot_of[decl.name] = self._next_slot
            self._next_slot += 1
            self._regroup(key_signature(rule))
        self._plan_columns()
        return [decl.name for decl in [*rules_here, *standing_here]]

    def unregister(self, name: str) -> None:
        """Remove a rule, query or metric and its state; the others keep theirs."""
        if name in self._standing:
            self._standing.remove(name)
            self._declarations = [
                d for d in self._declarations
                if not (isinstance(d, ast.QueryDecl | ast.MetricDecl) and d.name == name)
            ]
            return
        rule = self.rule(name)
        del self._rules[name]
        del self._rule_decls[name]
        del self._slot_of[name]
        self._declarations = [
            d for d in self._declarations if not (isinstance(d, ast.RuleDecl) and d.name == name)
        ]
        signature = key_signature(rule)
        group = self._groups.get(signature)
        if group is not None:
            for key in list(group.states):
                state = group.states[key]
                group.processor.drop_rule(state, name)
                if state.is_empty:
                    del group.states[key]
                    self._scheduled.pop((signature, key), None)
        self._regroup(signature)
        self._plan_columns()

    def _compile(self, decl: ast.RuleDecl, streams: Mapping[str, ast.StreamDecl], lists) -> Any:
        compile_rule = self._compile_rule
        if compile_rule is None:
            compile_rule = compile_rule_default
        options: dict[str, Any] = {
            "lists": {name: lists[name] for name in lists},
            "search": field_predicate,
            "version": 1,
            "streams": streams,
        }
        if self.max_partials is not None:
            options["max_partials"] = self.max_partials
        return compile_rule(decl, **options)

    def _regroup(self, signature: tuple) -> None:
        rules = [r for r in self._rules.values() if key_signature(r) == signature]
        old = self._groups.get(signature)
        if not rules:
            self._groups.pop(signature, None)
            return
        processor = RuleProcessor(
            rules,
            self._schemas,
            lateness_ms=self.lateness_ms,
            runtime=self._runtime,
            dropped_partials=self._retired_drops,
            fast_strict=self.fast_strict,
        )
        slots = tuple(self._slot_of[r.name] for r in rules)
        readers: dict[str, list[tuple[int, bool]]] = {}
        for rule, slot in zip(rules, slots, strict=True):
            for stream in rule.streams:
                readers.setdefault(stream, []).append((slot, must_see_every_event(rule)))
        self._groups[signature] = _Group(
            processor=processor,
            slots=slots,
            states=old.states if old is not None else {},
            readers={s: tuple(v) for s, v in readers.items()},
            width=len(slots) if slots == tuple(range(len(slots))) else -1,
            always=frozenset(s for s, rs in readers.items() if any(needs for _, needs in rs)),
        )

    # ------------------------------------------------------------------ input

    def feed(
        self,
        event: Mapping[str, Any],
        stream: str | None = None,
        *,
        source: str = "-",
        line: int | None = None,
        position: int | None = None,
        raw: str | None = None,
    ) -> None:
        """Feed one event (a dict of field values).

        Parameters
        ----------
        event:
            Field name -> value, as decoded from JSON; may carry a ``stream`` field.
        stream:
            The stream the event belongs to, overriding its ``stream`` field.
        source, line, raw:
            Where the event came from, for dead letters (input path, line number, text).
        position:
            The event's position in its input, its id when it carries none (default: its
            arrival position in the engine).
        """
        self._check_open()
        seq = self._seq
        self._seq += 1
        self._events += 1
        try:
            schema = stream_of(event, stream, self._schemas)
            ev = schema.normalise(event, seq=seq, position=seq if position is None else position)
        except BadEventError as exc:
            self._bad += 1
            self._dead.append(
                dead_letter(
                    exc.reason,
                    exc.detail,
                    input=source,
                    line=line,
                    raw=raw,
                    event=None if raw is not None else event,
                )
            )
            return
        if self._watermark.observe(ev.stream, ev.ts):
            self._late_letter(ev, source, line, raw, event)
            self._collect(self._standing.late(ev, self._watermark.current) or [])
            return
        self._accepted += 1
        if self._standing.reads(ev.stream):
            self._collect(self._standing.accept(ev))
        if any(ev.stream in g.readers for g in self._groups.values()):
            if ev.stream in self._columnar:
                # Rows fed one at a time go through the reorder buffer; the stream's held
                # columns join them there so that each key still sees its events in order.
                self._demote(ev.stream)
            self._buffer.push(ev.ts, seq, (ev, (None,) * self._next_slot))
        self._pump()

    def feed_record(
        self,
        text: str,
        stream: str | None = None,
        *,
        source: str = "-",
        line: int | None = None,
        position: int | None = None,
    ) -> None:
        """Feed one JSON line; text that is not a JSON object becomes a dead letter."""
        try:
            event = parse_json_line(text)
        except BadEventError as exc:
            self.reject(
                dead_letter(exc.reason, exc.detail, input=source, line=line, raw=text.rstrip("\n"))
            )
            return
        self.feed(event, stream, source=source, line=line, position=position, raw=text.rstrip("\n"))

    def reject(self, letter: dict[str, Any]) -> None:
        """Count an input the caller could not even decode (a dead letter built with
        :func:`cep.events.event.dead_letter`) as a received, bad event."""
        self._check_open()
        self._seq += 1
        self._events += 1
        self._bad += 1
        self._dead.append(letter)

    def feed_batch(
        self,
        frame: pd.DataFrame,
        stream: str | None = None,
        *,
        source: str | Sequence[str] = "-",
        lines: Sequence[int] | np.ndarray | None = None,
        positions: Sequence[int] | np.ndarray | None = None,
        raw: Sequence[str] | None = None,
    ) -> None:
        """Feed a DataFrame of events (rows in arrival order), vectorised.

        Validation, lateness and each rule's columnar conditions are computed per column for
        the whole batch; only rows that can advance some rule (columnar mask not 0, or the rule
        needs every event) reach per-event code. The result equals feeding the rows one by one
        with :meth:`feed`.

        Parameters
        ----------
        frame:
            One row per event; columns are fields (plus ``stream`` in a mixed input).
        stream:
            The stream of every row, overriding a ``stream`` column.
        source, lines, raw:
            Where the rows came from (input path, or one per row; line numbers) and their
            original text, for dead letters.
        positions:
            Each row's position in its input (its id when it carries none); default: arrival
            position in the engine.
        """
        self._check_open()
        if len(frame) == 0:
            return
        with _collector_paused():
            self._feed_frame(frame, stream, source, lines, positions, raw)

    def _feed_frame(
        self,
        frame: pd.DataFrame,
        stream: str | None,
        source: str | Sequence[str],
        lines: Sequence[int] | np.ndarray | None,
        positions: Sequence[int] | np.ndarray | None,
        raw: Sequence[str] | None,
    ) -> None:
        """:meth:`feed_batch` of a non-empty frame."""
        n = len(frame)
        seq0 = self._seq
        self._seq += n
        self._events += n
        seqs = np.arange(seq0, seq0 + n, dtype=np.int64)
        positions = seqs if positions is None else np.asarray(positions, dtype=np.int64)
        where = _RowOrigin(frame, source, lines, raw)
        bad: list[tuple[int, str, str, str | None]] = []  # (row, reason, detail, stream)

        # 1. which stream each row belongs to
        groups: dict[str, np.ndarray] = {}
        if stream is not None or STREAM_FIELD not in frame.columns:
            try:
                schema = stream_of({}, stream, self._schemas)
                groups[schema.name] = np.arange(n)
            except BadEventError as exc:
                bad.extend((i, exc.reason, exc.detail, None) for i in range(n))
        else:
            names = frame[STREAM_FIELD]
            codes, uniques = pd.factorize(names, use_na_sentinel=True)
            for code, name in enumerate(uniques):
                rows = np.flatnonzero(codes == code)
                try:
                    schema = stream_of({STREAM_FIELD: name}, None, self._schemas)
                    groups[schema.name] = rows
                except BadEventError as exc:
                    bad.extend((int(i), exc.reason, exc.detail, None) for i in rows)
            rows = np.flatnonzero(codes == -1)
            if len(rows):
                try:
                    schema = stream_of({}, None, self._schemas)
                    groups[schema.name] = np.sort(
                        np.concatenate([groups.get(schema.name, np.empty(0, np.int64)), rows])
                    )
                except BadEventError as exc:
                    bad.extend((int(i), exc.reason, exc.detail, None) for i in rows)

        # 2. validate per stream, column by column
        parts: list[tuple[str, pd.DataFrame, np.ndarray, np.ndarray]] = []
        for name, rows in groups.items():
            schema = self._schemas[name]
            sub = frame if len(rows) == n else frame.iloc[rows]
            normalised, ts, failed = schema.normalise_frame(sub)
            bad.extend((int(rows[pos]), reason, detail, name) for pos, reason, detail in failed)
            ok_rows = (
                rows
                if not failed
                else rows[np.isin(np.arange(len(rows)), [p for p, _, _ in failed], invert=True)]
            )
            parts.append((name, normalised, ts, ok_rows))
        for row, reason, detail, name in sorted(bad, key=lambda b: b[0]):
            self._bad += 1
            self._dead.append(dead_letter(reason, detail, stream=name, **where.of(row)))
        if not parts:
            return

        # 3. lateness, in arrival order across streams
        stream_names = [p[0] for p in parts]
        all_rows = np.concatenate([p[3] for p in parts])
        all_codes = np.concatenate(
            [np.full(len(p[3]), code, dtype=np.int64) for code, p in enumerate(parts)]
        )
        all_ts = np.concatenate([p[2] for p in parts])
        order = np.argsort(all_rows, kind="stable")
        late_sorted = self._watermark.observe_many(stream_names, all_codes[order], all_ts[order])
        late = np.empty_like(late_sorted)
        late[order] = late_sorted
        met = np.empty(len(order), dtype=np.int64)
        met[order] = self._watermark.arrival_watermarks

        # 4. columnar masks, relevance, events
        if self._wanted:
            self._enable_columns()
        entries_ts: list[np.ndarray] = []
        entries_seq: list[np.ndarray] = []
        entries: list[tuple[Event, tuple]] = []
        offset = 0
        for name, normalised, ts, ok_rows in parts:
            count = len(ok_rows)
            late_here = late[offset : offset + count]
            offset += count
            late_rows = np.flatnonzero(late_here)
            if len(late_rows) and self._standing.reads(name):
                for i, ev in zip(late_rows, self._schemas[name].events_from_frame(
                    normalised.iloc[late_rows], seqs[ok_rows[late_rows]],
                    positions[ok_rows[late_rows]],
                ), strict=True):
                    met_i = int(met[offset - count + i])
                    self._collect(self._standing.late(ev, met_i) or [])
            for i in late_rows:
                row = int(ok_rows[i])
                self._late += 1
                self._dead.append(
                    dead_letter(
                        EventReason.LATE,
                        _late_detail(int(ts[i]), int(met[offset - count + i])),
                        stream=name,
                        **where.of(row),
                    )
                )
            keep = ~late_here
            self._accepted += int(keep.sum())
            if not keep.any():
                continue
            if not keep.all():
                normalised, ts, ok_rows = normalised[keep], ts[keep], ok_rows[keep]
            if self._standing.reads(name):
                docs = (
                    self._schemas[name].events_from_frame(
                        normalised, seqs[ok_rows], positions[ok_rows]
                    )
                    if self._standing.wants_documents(name)
                    else None
                )
                self._collect(
                    self._standing.accept_frame(name, normalised, ts, docs, seqs[ok_rows])
                )
            if name in self._columnar:
                held = self._hold_columns(name, normalised, ts, seqs[ok_rows], positions[ok_rows])
                if held is not None:
                    events, rows = held
                    entries.extend((e, (-1,) * self._next_slot) for e in events)
                    entries_ts.append(ts[rows])
                    entries_seq.append(seqs[ok_rows[rows]])
                continue
            masks, relevant = self._masks(name, normalised)
            if masks is None:
                continue
            rel = np.flatnonzero(relevant)
            if len(rel) == 0:
                continue
            chosen = normalised if len(rel) == len(normalised) else normalised.iloc[rel]
            events = self._schemas[name].events_from_frame(
                chosen, seqs[ok_rows[rel]], positions[ok_rows[rel]]
            )
            entries.extend(zip(events, _mask_tuples(masks[rel]), strict=True))
            entries_ts.append(ts[rel])
            entries_seq.append(seqs[ok_rows[rel]])
        if entries:
            ts_all = np.concatenate(entries_ts)
            seq_all = np.concatenate(entries_seq)
            order = np.lexsort((seq_all, ts_all))
            if np.array_equal(order, np.arange(len(order))):
                ordered = entries
            else:
                ordered = [entries[i] for i in order.tolist()]
            self._buffer.push_sorted(
                zip(ts_all[order].tolist(), seq_all[order].tolist(), ordered, strict=True)
            )
        self._pump()

    def _masks(self, stream: str, frame: pd.DataFrame) -> tuple[np.ndarray | None, np.ndarray]:
        """Per row, the columnar mask of every rule slot (0 for rules not reading ``stream``),
        and which rows some rule must see."""
        readers = [
            (g, slot, needs)
            for g in self._groups.values()
            for slot, needs in g.readers.get(stream, ())
        ]
        n = len(frame)
        if not readers:
            return None, np.zeros(n, dtype=bool)
        masks = np.zeros((n, self._next_slot), dtype=np.int64)
        relevant = np.zeros(n, dtype=bool)
        by_slot = {self._slot_of[name]: rule for name, rule in self._rules.items()}
        # Rules over several streams tell them apart by a `stream` column.
        multi = any(len(by_slot[slot].streams) > 1 for _, slot, _ in readers)
        view = frame.assign(**{STREAM_FIELD: stream}) if multi else frame
        for _group, slot, needs in readers:
            rule = by_slot[slot]
            # the rule's mask already clears the bits whose current-event conjuncts fail
            mask = np.asarray(rule.columnar_mask(view), dtype=np.int64)
            masks[:, slot] = mask
            if needs:
                relevant[:] = True
            else:
                relevant |= mask != 0
        return masks, relevant

    def advance_watermark(self, ts_ms: int) -> None:
        """Declare that no event older than ``ts_ms`` will arrive (the watermark never goes
        back); releases buffered events and fires timers that are due."""
        self._check_open()
        self._watermark.advance_to(int(ts_ms))
        self._pump()

    def close(self) -> None:
        """End of input: release every buffered event, fire every timer and pending absence."""
        if self._closed:
            return
        with _collector_paused():
            self._close()

    def _close(self) -> None:
        """:meth:`close` of an open engine."""
        self._watermark.close()
        self._pump()
        # Keys without a finite timer may still hold matches that wait to grow (a trailing
        # greedy quantifier without `within`): end of input flushes every key.
        outputs: list[dict[str, Any]] = []
        for group in self._groups.values():
            for state in group.states.values():
                group.processor.fire_timers(state, END_OF_INPUT, outputs)
            group.states.clear()
        self._timers.clear()
        self._scheduled.clear()
        outputs.extend(self._standing.advance(END_OF_INPUT))
        self._collect(outputs)
        self._closed = True

    # ------------------------------------------------------------------ output

    def matches(self) -> list[dict[str, Any]]:
        """Matches reported since the last :meth:`drain`, without consuming them."""
        return list(self._matches)

    def drain(self) -> list[dict[str, Any]]:
        """Matches reported since the last :meth:`drain`, consumed."""
        out = self._matches
        self._matches = []
        return out

    def dead_letters(self) -> list[dict[str, Any]]:
        """Dead letters since the last :meth:`drain_dead_letters`, without consuming them."""
        return list(self._dead)

    def drain_dead_letters(self) -> list[dict[str, Any]]:
        """Dead letters since the last call, consumed."""
        out = self._dead
        self._dead = []
        return out

    @property
    def watermark(self) -> int:
        """The engine watermark (epoch ms)."""
        return self._watermark.current

    @property
    def stats(self) -> EngineStats:
        """Counters of the run so far."""
        drops: Counter[str] = Counter(self._retired_drops)
        keys = 0
        for group in self._groups.values():
            keys += len(group.states)
            for state in group.states.values():
                for name, st in state.rules.items():
                    drops[name] += getattr(st, "dropped_partials", 0)
        return EngineStats(
            events=self._events,
            accepted=self._accepted,
            late=self._late,
            bad=self._bad,
            matches={
                **{name: 0 for name in [*self._rules, *self._standing.names]},
                **self._match_counts,
            },
            dropped_partials={k: v for k, v in drops.items() if v},
            keys=keys,
            buffered=len(self._buffer) + len(self._columns),
            watermark=self._watermark.current,
        )

    # ------------------------------------------------------------------ the pump

    def _pump(self) -> None:
        """Release what the watermark passed, dispatch it per key, then fire due timers."""
        watermark = self._watermark.current
        released = self._buffer.release(watermark)
        outputs: list[dict[str, Any]] = []
        for block in self._columns.release(watermark) if self._columns else ():
            self._run_block(block, outputs)
        if released:
            # Events are grouped per key (keeping their order) so that each key's rules run
            # once per release; keys are independent, so this changes no result.
            work: dict[tuple[tuple, tuple], list] = {}
            relevant = self._relevant
            prepared = [
                (
                    signature,
                    group,
                    group.always,
                    group.width,
                    group.processor.keys_of_event
                    if group.processor.multi_key
                    else group.processor.key_of_event,
                    group.processor.multi_key,
                )
                for signature, group in self._groups.items()
            ]
            for _ts, _seq, (event, masks) in released:
                for signature, group, always, width, key_fn, multi in prepared:
                    if event.stream not in always and not relevant(group, event, masks):
                        continue
                    if len(masks) != width:
                        masks = _aligned(masks, group.slots)
                    if multi:
                        keys = key_fn(event)
                    else:
                        key = key_fn(event)
                        keys = () if key is None else (key,)
                    if not keys:
                        self._missing_key(group.processor, event)
                        continue
                    for key in keys:
                        items = work.get((signature, key))
                        if items is None:
                            work[(signature, key)] = items = []
                        items.append((event, masks))
            jobs: dict[tuple, list[tuple[tuple, KeyState, list]]] = {}
            for (signature, key), items in work.items():
                group = self._groups[signature]
                state = group.states.get(key)
                if state is None:
                    state = group.states[key] = KeyState()
                jobs.setdefault(signature, []).append((key, state, items))
            for signature, group_jobs in jobs.items():
                group = self._groups[signature]
                group.processor.run_batch(group_jobs, outputs)
                for key, state, _items in group_jobs:
                    self._after(signature, group, key, state)
        if self._timers and self._timers[0][0] <= watermark:
            due = []
            while self._timers and self._timers[0][0] <= watermark:
                due.append(heapq.heappop(self._timers))
            for timer_ms, _, signature, key in due:
                if self._scheduled.get((signature, key)) != timer_ms:
                    continue
                del self._scheduled[(signature, key)]
                group = self._groups.get(signature)
                state = group.states.get(key) if group is not None else None
                if state is None:
                    continue
                group.processor.fire_timers(state, watermark, outputs)
                self._after(signature, group, key, state)
        outputs.extend(self._standing.advance(watermark))
        self._collect(outputs)

    # ------------------------------------------------------------------ columnar route

    def _plan_columns(self) -> None:
        """Decide which streams' rows wait as columns (after the rules changed).

        A stream qualifies when one group reads it, the group reads no other stream (so keys
        and timers are met in the order the per-event dispatch meets them) and
        :meth:`RuleProcessor.scan_streams` says its rules can run it column-wise. A stream
        that stops qualifying has its held rows moved to the reorder buffer; one that starts
        qualifying is held as columns once the reorder buffer has none of its events
        (:meth:`_enable_columns`).
        """
        wanted: dict[str, tuple] = {}
        if self.fast_strict and self._runtime is None:
            readers: Counter[str] = Counter()
            for group in self._groups.values():
                readers.update(list(group.readers))
            for signature, group in self._groups.items():
                if len(group.readers) != 1:
                    continue
                for stream in group.processor.scan_streams():
                    if readers[stream] == 1:
                        wanted[stream] = signature
        for stream, signature in list(self._columnar.items()):
            if wanted.get(stream) != signature:
                self._demote(stream)
        self._wanted = {
            s: sig for s, sig in wanted.items() if self._columnar.get(s) != sig
        }
        if self._wanted:
            self._enable_columns()

    def _enable_columns(self) -> None:
        """Hold the wanted streams as columns from now on, those without buffered events."""
        buffered = {payload[0].stream for _, _, payload in self._buffer.entries()}
        for stream in [s for s in self._wanted if s not in buffered]:
            self._columnar[stream] = self._wanted.pop(stream)

    def _demote(self, stream: str) -> None:
        """Move a stream's held rows to the reorder buffer as events; its next rows go there
        too until :meth:`_enable_columns` holds it as columns again."""
        signature = self._columnar.pop(stream)
        self._wanted[stream] = signature
        held = self._columns.take(stream)
        if held:
            # Every rule reading the stream runs as a scan, which reads a mask only to know
            # whether the rule was registered when the event arrived.
            entries = sorted(
                ((ev.ts, ev.seq, (ev, (-1,) * width)) for ev, width in held),
                key=lambda entry: (entry[0], entry[1]),
            )
            self._buffer.push_sorted(entries)

    def _hold_columns(
        self,
        stream: str,
        frame: pd.DataFrame,
        ts: np.ndarray,
        seqs: np.ndarray,
        positions: np.ndarray,
    ) -> tuple[list[Event], np.ndarray] | None:
        """Hold accepted rows of a columnar stream; rows with a null key field become events
        (returned with their row numbers) for the reorder buffer, which dead-letters them."""
        schema = self._schemas[stream]
        group = self._groups[self._columnar[stream]]
        fields = group.processor.key_fields[stream]
        null = np.zeros(len(frame), dtype=bool)
        for name in fields:
            if name not in frame.columns:
                null[:] = True
                break
            null |= np.fromiter(
                (v is None for v in _column_values(frame[name])), dtype=bool, count=len(frame)
            )
        missing = None
        if null.any():
            rows = np.flatnonzero(null)
            missing = (
                schema.events_from_frame(frame.iloc[rows], seqs[rows], positions[rows]),
                rows,
            )
            keep = ~null
            frame, ts, seqs, positions = frame[keep], ts[keep], seqs[keep], positions[keep]
        if len(frame):
            self._columns.push(Chunk(schema, frame, ts, seqs, positions, self._next_slot))
        return missing

    def _run_block(self, block: Block, outputs: list[dict[str, Any]]) -> None:
        """Run released columnar rows: what the per-event dispatch does with their events."""
        signature = self._columnar[block.stream]
        group = self._groups[signature]
        processor = group.processor
        fields = processor.key_fields[block.stream]
        index: dict[Any, int] = {}
        if len(fields) == 1:
            codes = [index.setdefault(v, len(index)) for v in block.column(fields[0])]
            keys = [(v,) for v in index]
        else:
            codes = [
                index.setdefault(k, len(index))
                for k in zip(*[block.column(f) for f in fields], strict=True)
            ]
            keys = list(index)
        states = group.states
        key_states = []
        for key in keys:
            state = states.get(key)
            if state is None:
                state = states[key] = KeyState()
            key_states.append(state)
        code_array = np.asarray(codes, dtype=np.int64)
        widths = block.widths()
        for rule_index in processor.scan_rules(block.stream):
            slot = group.slots[rule_index]
            seen = widths > slot
            if seen.all():
                order = np.argsort(code_array, kind="stable")
            else:
                chosen = np.flatnonzero(seen)
                order = chosen[np.argsort(code_array[chosen], kind="stable")]
            if len(order) == 0:
                continue
            part = block.select(order)
            sorted_codes = code_array[order]
            bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
            starts = [0, *bounds.tolist()]
            ends = [*bounds.tolist(), len(order)]
            segments = [
                (keys[c], key_states[c], lo, hi)
                for c, lo, hi in zip(sorted_codes[starts].tolist(), starts, ends, strict=True)
            ]
            processor.run_columns(rule_index, part, segments, outputs)
        for key, state in zip(keys, key_states, strict=True):
            self._after(signature, group, key, state)

    def _missing_key(self, processor: RuleProcessor, event: Event) -> None:
        self._bad += 1
        self._dead.append(
            dead_letter(
                EventReason.MISSING_KEY,
                processor.missing_key_detail(event),
                line=None,
                stream=event.stream,
                event={**event.fields, STREAM_FIELD: event.stream},
            )
        )

    def _collect(self, outputs: list[dict[str, Any]]) -> None:
        if len(outputs) > 1:
            outputs.sort(key=_emission_order)
        for match in outputs:
            self._match_counts[match["name"]] += 1
        self._matches.extend(outputs)

    @staticmethod
    def _relevant(group: _Group, event: Event, masks: tuple) -> bool:
        readers = group.readers.get(event.stream)
        if not readers:
            return False
        if event.stream in group.always:
            return True
        size = len(masks)
        for slot, needs in readers:
            if slot < size and (needs or masks[slot] != 0):
                return True
        return False

    def _after(self, signature: tuple, group: _Group, key: tuple, state: KeyState) -> None:
        if state.is_empty:
            del group.states[key]
            self._scheduled.pop((signature, key), None)
            return
        due = state.next_timer_ms()
        if due is None:
            return
        known = self._scheduled.get((signature, key))
        if known is None or due < known:
            self._scheduled[(signature, key)] = due
            self._timer_seq += 1
            heapq.heappush(self._timers, (due, self._timer_seq, signature, key))

    def _late_letter(
        self, ev: Event, source: str, line: int | None, raw: str | None, event: Mapping[str, Any]
    ) -> None:
        self._late += 1
        self._dead.append(
            dead_letter(
                EventReason.LATE,
                _late_detail(ev.ts, self._watermark.current),
                input=source,
                line=line,
                raw=raw,
                stream=ev.stream,
                event=None if raw is not None else event,
            )
        )

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine is closed (end of input); create a new Engine")


# ---------------------------------------------------------------------- helpers


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a batch.

    A batch allocates events, binding lists and matches by the hundred thousand, none of them
    in reference cycles; generational collections triggered by those allocations would walk
    every live object again and again (a quarter of the CPU time of a strict-contiguity batch)
    to free nothing. The collector's previous setting is restored afterwards.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _mask_tuples(masks: np.ndarray) -> list[tuple]:
    """Each row of a (rows x rules) mask array as a tuple; equal rows share one tuple (a rule
    that must see every event gives most rows the same masks)."""
    if len(masks) < 64:
        return [tuple(row) for row in masks.tolist()]
    distinct, which = np.unique(masks, axis=0, return_inverse=True)
    shared = [tuple(row) for row in distinct.tolist()]
    return [shared[i] for i in which.reshape(-1).tolist()]


def _emission_order(match: dict[str, Any]) -> tuple:
    return (match.get("end", ""), match.get("start", ""), match.get("name", ""))


def _aligned(masks: tuple, slots: tuple[int, ...]) -> tuple:
    """Per rule of a group, its mask for the event; rules registered after the event arrived
    get :data:`NOT_REGISTERED` and do not see it."""
    size = len(masks)
    return tuple(masks[s] if s < size else NOT_REGISTERED for s in slots)


def _late_detail(ts: int, watermark: int) -> str:
    if watermark >= END_OF_INPUT:
        return f"event time {iso_ms(ts)} arrived after end of input"
    return f"event time {iso_ms(ts)} is behind the watermark {iso_ms(watermark)}"


class _RowOrigin:
    """Where each row of a batch came from, for its dead letter."""

    def __init__(self, frame: pd.DataFrame, source, lines, raw) -> None:
        self.frame = frame
        self.source = source
        self.lines = lines
        self.raw = raw

    def of(self, row: int) -> dict[str, Any]:
        source = self.source if isinstance(self.source, str) else self.source[row]
        line = None if self.lines is None else int(self.lines[row])
        if self.raw is not None:
            return {"input": source, "line": line, "raw": self.raw[row]}
        values = self.frame.iloc[row].to_dict()
        event = {str(k): plain_value(v) for k, v in values.items() if not _is_missing(v)}
        return {"input": source, "line": line, "event": event}


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def load_list(decl: ast.ListDecl) -> Any:
    """The membership container of a ``list`` declaration.

    Values come inline or from a file (one value a line, blank lines ignored, path relative
    to the declaring file). Lists larger than :data:`BLOOM_THRESHOLD` are held in a Bloom
    filter (``sketches.BloomFilter``) to bound memory; smaller ones in a ``frozenset``.

    Raises
    ------
    query_lang.errors.IncludeError
        When the file cannot be read.
    """
    if decl.path is None:
        return frozenset(decl.values)
    path = Path(decl.path)
    declared_in = decl.span.file
    if not path.is_absolute() and declared_in and declared_in != "<string>":
        path = Path(declared_in).parent / path
    try:
        with open(path, encoding="utf-8") as handle:
            values = [line.strip() for line in handle]
    except OSError as exc:
        raise IncludeError(
            f"cannot read list '{decl.name}' from {str(path)!r}: {exc.strerror or exc}", decl.span
        ) from None
    except UnicodeDecodeError:
        raise IncludeError(
            f"list '{decl.name}' file {str(path)!r} is not UTF-8 text", decl.span
        ) from None
    values = [v for v in values if v]
    if len(values) <= BLOOM_THRESHOLD:
        return frozenset(values)
    return _bloom(values)


def _bloom(values: list[str]) -> Any:
    bloom = BloomFilter(capacity=len(values), error_rate=BLOOM_FALSE_POSITIVE_RATE)
    bloom.update(np.asarray(values, dtype=object))
    return bloom


# ---------------------------------------------------------------------- program loading


def load_declarations(
    source: Any, known: Sequence[ast.Declaration] = ()
) -> list[ast.Declaration]:
    """Parse and check what :meth:`Engine.register` was given, against what is registered
    (``known``), compiling nothing: for callers that need a program's declarations only.

    Files are loaded with their includes. Semantic checks run over the earlier registrations
    plus the new declarations, so a rule file may use streams registered before it; earlier
    registrations passed these checks, so every error reported belongs to the new input.
    """
    if isinstance(source, ast.Module):
        source = [source]
    if isinstance(source, list | tuple) and all(isinstance(m, ast.Module) for m in source):
        new = [d for m in source for d in m.declarations if not isinstance(d, ast.Include)]
        new = _without_repeats(new, known)
        errors = check_declarations([*known, *new])
    else:
        if isinstance(source, os.PathLike) or (
            isinstance(source, str) and "\n" not in source and _looks_like_path(source)
        ):
            if not Path(source).is_file():
                raise IncludeError(f"file not found: {source}", ast.Span(str(source)))
            program, errors = check_program([str(source)])
        elif isinstance(source, str):
            program, errors = check_program(text=source)
        else:
            raise TypeError(
                f"register() takes DSL text, a path or parsed Modules, not {type(source).__name__}"
            )
        new = _without_repeats(program.declarations, known)
        if known and errors:
            # Errors about names the earlier registrations declare are not errors here.
            alone = {_error_key(e) for e in check_declarations(new, program.sources)}
            loading = [e for e in errors if _error_key(e) not in alone]
            errors = loading + check_declarations([*known, *new], program.sources)
        for err in errors:
            if err.source is None and err.span is not None:
                err.source = program.sources.get(err.span.file)
    if errors:
        raise errors[0] if len(errors) == 1 else ErrorList(errors)
    return new


def _without_repeats(
    new: Sequence[ast.Declaration], known: Sequence[ast.Declaration]
) -> list[ast.Declaration]:
    """Drop streams, lists and webhooks identical to registered ones (two rule files that
    include the same ``common.vigil``); a different redefinition stays and is reported."""
    shared = (ast.StreamDecl, ast.ListDecl, ast.WebhookDecl)
    registered = {(type(d), d.name): d for d in known if isinstance(d, shared)}
    return [
        d for d in new if not (isinstance(d, shared) and registered.get((type(d), d.name)) == d)
    ]


def _error_key(error: VigilError) -> tuple:
    return (type(error).__name__, error.message, error.span)


def _looks_like_path(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and (stripped.endswith(".vigil") or Path(stripped).is_file())
