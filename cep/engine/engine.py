"""The embedded engine: register rules, feed events one at a time or as DataFrames, read matches.

``Engine`` owns event time for all its inputs (one watermark, one reorder buffer) and hands
released events per key to :class:`cep.nfa.processor.RuleProcessor`, the code the Spark operator
runs, so which matches are reported does not depend on how input is batched (the order of
matches of different keys within one batch may).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cep.engine import checkpoint
from cep.engine.checkpoint import form_identity, form_version
from cep.engine.column_route import ColumnRoute, run_block
from cep.engine.dispatch import KeyedRules, KeyTimers, fire_due
from cep.engine.intake import (
    RowOrigin,
    lateness,
    mask_tuples,
    rule_masks,
    split_by_stream,
)
from cep.engine.program import (
    add_declarations,
    compile_program_rule,
    load_declarations,
    load_list,
    lookup_horizons,
)
from cep.engine.queries import StandingQueries
from cep.engine.rule_index import RULE_INDEXES, RuleIndex
from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    EngineError,
    Event,
    EventReason,
    StreamSchema,
    UnknownRuleError,
    dead_letter,
    parse_json_line,
    stream_of,
)
from cep.events.watermark import (
    END_OF_INPUT,
    NO_WATERMARK,
    ReorderBuffer,
    Watermark,
    late_detail,
)
from cep.nfa.compiler import compile_rule
from cep.nfa.processor import RuleProcessor, RuleRuntime, key_signature
from cep.tables import ChangeError, TableFeed, Tables
from percolator.collector import collector_paused
from query_lang import ast

__all__ = ["Engine", "EngineStats", "load_declarations", "load_list"]


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
        Events dead-lettered for any other reason (invalid JSON, wrong type, ...).
    unkeyed:
        ``missing_key`` dead letters: an accepted event a keyed rule could take but whose key
        fields are missing or null (that rule skips it; queries, metrics and rules keyed
        otherwise still see it). One per event and key definition.
    matches:
        Matches reported, per rule.
    dropped_partials:
        Partial matches dropped by the ``max_partials`` cap, per rule.
    suppressed:
        Matches not reported because a reported match of their key had the same ``unique``
        values, per rule.
    keys:
        Partition keys currently holding state.
    buffered:
        Events waiting in the reorder buffer for the watermark.
    watermark:
        The engine watermark (epoch ms).
    uncorrected:
        Valid events of clock-corrected streams (``time ts sent S received R``) that lacked a
        sent or received time and kept their device time (:mod:`cep.events.clock`).
    unchanged:
        Accepted rows of a table's changelog stream that changed no table (a missing key, an
        unknown op, or a time events had already read the table at: ``missing_key``,
        ``unknown_op`` or ``late`` dead letters naming the table), one per row and table.
    table_rows:
        Keys holding a row (or a version) per table (:mod:`cep.tables`).
    """

    events: int
    accepted: int
    late: int
    bad: int
    unkeyed: int = 0
    matches: dict[str, int] = field(default_factory=dict)
    dropped_partials: dict[str, int] = field(default_factory=dict)
    suppressed: dict[str, int] = field(default_factory=dict)
    keys: int = 0
    buffered: int = 0
    watermark: int = 0
    uncorrected: int = 0
    unchanged: int = 0
    table_rows: dict[str, int] = field(default_factory=dict)


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
    now_ms:
        The wall clock that bounds event times (a stream's ``ahead``), fixed: for tests and
        replays. ``None`` (the default) reads it as events arrive
        (:func:`cep.events.time_bounds.wall_clock_ms`: ``$VIGIL_NOW_MS`` when set).
    rule_index:
        How events find the rules they may start or advance (:mod:`cep.engine.rule_index`):
        ``"starts"`` (the default) runs per key only those; ``"none"`` offers each event to
        every rule reading its stream. Results are the same; :attr:`rules_touched` differs.

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
        now_ms: int | None = None,
        rule_index: str = "starts",
    ) -> None:
        if rule_index not in RULE_INDEXES:
            raise EngineError(
                f"unknown rule index '{rule_index}' (one of: {', '.join(RULE_INDEXES)})"
            )
        self._index: RuleIndex = RULE_INDEXES[rule_index]()
        # (rule, event) pairs run by processors since replaced (see rules_touched)
        self._touched_before = 0
        self._signatures: dict[int, tuple[Any, tuple]] = {}
        self.max_partials = max_partials
        self.now_ms = now_ms
        self.fast_strict = fast_strict
        self.lateness_ms = lateness_ms
        self._compile_rule = compile_rule
        self._runtime = runtime
        # By (kind, name): a program's declarations in registration order, one removed in
        # constant time (an engine may hold thousands of standing queries).
        self._declarations: dict[tuple[type, str], ast.Declaration] = {}
        self._streams: dict[str, ast.StreamDecl] = {}
        self._schemas: dict[str, StreamSchema] = {}
        self._lists: dict[str, Any] = {}
        self._webhooks: dict[str, ast.WebhookDecl] = {}
        self._rules: dict[str, Any] = {}
        self._rule_decls: dict[str, ast.RuleDecl] = {}
        self._slot_of: dict[str, int] = {}
        self._next_slot = 0
        self._groups: dict[tuple, KeyedRules] = {}
        self._standing = StandingQueries(lateness_ms)
        self._watermark = Watermark({})
        self._buffer = ReorderBuffer()
        self._route = ColumnRoute(self._buffer)
        self._timers = KeyTimers()
        self._seq = 0
        self._matches: list[dict[str, Any]] = []
        self._dead: list[dict[str, Any]] = []
        self._events = 0
        self._accepted = 0
        self._late = 0
        self._bad = 0
        self._unkeyed = 0
        self._uncorrected = 0
        self._unchanged = 0
        self._tables = Tables()
        self._pumped = NO_WATERMARK  # the watermark of the last pump: events released to it
        self._match_counts: Counter[str] = Counter()
        self._retired_drops: Counter[str] = Counter()
        #: Matches a rule's ``unique`` held back, per rule (shared by the group processors).
        self._suppressed: Counter[str] = Counter()
        # Forms a restore dropped (cep.engine.checkpoint): a name coming back continues its
        # version numbering.
        self._retired_forms: dict[str, dict[str, Any]] = {}
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
        return list(self._declarations.values())

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
        new_decls = load_declarations(source, list(self._declarations.values()))
        streams, lists = add_declarations(
            new_decls, self._streams, self._lists, {*self._rules, *self._standing.names}
        )
        rules_here = [d for d in new_decls if isinstance(d, ast.RuleDecl)]
        standing_here = [d for d in new_decls if isinstance(d, ast.QueryDecl | ast.MetricDecl)]
        new_tables = [TableFeed(d, streams[d.stream])
                      for d in new_decls if isinstance(d, ast.TableDecl)]
        tables = {**self._tables.readers, **{f.name: f.table for f in new_tables}}
        versions = self._returning_versions(new_decls, streams, lists)
        compiled = [self._compile(decl, streams, lists, versions.get(decl.name, 1), tables)
                    for decl in rules_here]
        standing = self._standing.compile(standing_here, streams, lists, versions, tables)

        # Nothing can fail past this point: commit the registration.
        self._declarations.update((_declared_as(d), d) for d in new_decls)
        self._streams = streams
        self._lists = lists
        for decl in new_decls:
            if isinstance(decl, ast.StreamDecl):
                schema = StreamSchema.from_decl(
                    decl, lateness_ms=self.lateness_ms, now_ms=self.now_ms
                )
                self._schemas[decl.name] = schema
                self._watermark.set_lateness(decl.name, schema.lateness_ms)
            elif isinstance(decl, ast.WebhookDecl):
                self._webhooks[decl.name] = decl
        for feed in new_tables:
            self._tables.add(feed)
        metrics_here = [value.compiled for decl, value in standing
                        if isinstance(decl, ast.MetricDecl)]
        for table, horizon in lookup_horizons(rules_here, metrics_here).items():
            self._tables.widen(table, horizon)
        self._standing.add(standing, streams)
        for name in versions:
            self._retired_forms.pop(name, None)
        signatures: dict[tuple, None] = {}
        for decl, rule in zip(rules_here, compiled, strict=True):
            self._rules[decl.name] = rule
            self._rule_decls[decl.name] = decl
            self._slot_of[decl.name] = self._next_slot
            self._next_slot += 1
            signatures[key_signature(rule)] = None
        # Each group's processor is rebuilt once, however many of its rules came.
        for signature in signatures:
            self._regroup(signature)
        self._plan_columns()
        return [decl.name for decl in [*rules_here, *standing_here]]

    def _returning_versions(
        self, decls: Sequence[ast.Declaration], streams: Mapping[str, ast.StreamDecl], lists
    ) -> dict[str, int]:
        """The versions of rules and metrics registered under a name this engine removed
        (:meth:`unregister`, or a restore that dropped it): a changed form continues the
        name's version numbering, so its matches never take the ids the earlier form gave;
        the very form that was removed keeps its version (and its match ids)."""
        versions = {}
        for decl in decls:
            gone = self._retired_forms.get(getattr(decl, "name", None))
            if gone is not None and isinstance(decl, ast.RuleDecl | ast.MetricDecl):
                kind, identity = self._form(decl, streams, lists)
                versions[decl.name] = form_version(kind, identity, None, gone)[1]
        return versions

    def _form(self, decl: ast.Declaration, streams: Mapping[str, ast.StreamDecl],
              lists) -> tuple[str, str]:
        """A declaration's kind and identity (:func:`cep.engine.checkpoint.form_identity`)."""
        if isinstance(decl, ast.RuleDecl):
            kind, options = "rule", {"max_partials": self.max_partials}
        elif isinstance(decl, ast.MetricDecl):
            kind, options = "metric", {"lateness_ms": self.lateness_ms}
        else:
            kind, options = "query", {}
        return kind, form_identity(decl, streams, lists, options)

    def _retire(self, decl: ast.Declaration | None, version: int) -> None:
        if decl is not None:
            kind, identity = self._form(decl, self._streams, self._lists)
            self._retired_forms[decl.name] = {"kind": kind, "identity": identity,
                                              "version": version}

    def unregister(self, name: str) -> None:
        """Remove a rule, query or metric and its state; the others keep theirs. Registered
        again later, a changed form of it runs at the next version (see
        :meth:`_returning_versions`)."""
        if name in self._standing:
            metric = self._declarations.get((ast.MetricDecl, name))
            if metric is not None:
                self._retire(metric, self._standing.operators[name].compiled.version)
            self._standing.remove(name)
            self._declarations.pop((ast.QueryDecl, name), None)
            self._declarations.pop((ast.MetricDecl, name), None)
            return
        rule = self.rule(name)
        self._retire(self._rule_decls.get(name), rule.version)
        del self._rules[name]
        self._signatures.pop(id(rule), None)
        del self._rule_decls[name]
        del self._slot_of[name]
        self._declarations.pop((ast.RuleDecl, name), None)
        signature = key_signature(rule)
        group = self._groups.get(signature)
        if group is not None:
            for key in list(group.states):
                state = group.states[key]
                group.processor.drop_rule(state, name)
                if state.is_empty:
                    del group.states[key]
                    self._timers.forget(signature, key)
        self._regroup(signature)
        self._plan_columns()

    def _compile(
        self, decl: ast.RuleDecl, streams: Mapping[str, ast.StreamDecl], lists, version: int = 1,
        tables: Mapping[str, Any] | None = None,
    ) -> Any:
        return compile_program_rule(
            decl, streams, lists, max_partials=self.max_partials,
            compiler=self._compile_rule or compile_rule, version=version,
            tables=self._tables.readers if tables is None else tables,
        )

    def _regroup(self, signature: tuple) -> None:
        signature_of = self._signature_of
        rules = [r for r in self._rules.values() if signature_of(r) == signature]
        old = self._groups.get(signature)
        if old is not None:
            self._touched_before += old.processor.touched
        if not rules:
            self._groups.pop(signature, None)
            return
        processor = RuleProcessor(
            rules,
            self._schemas,
            lateness_ms=self.lateness_ms,
            runtime=self._runtime,
            dropped_partials=self._retired_drops,
            suppressed=self._suppressed,
            fast_strict=self.fast_strict,
        )
        slots = tuple(self._slot_of[r.name] for r in rules)
        self._groups[signature] = KeyedRules.of(
            processor, slots, old.states if old is not None else {}
        )

    def _signature_of(self, rule: Any) -> tuple:
        """:func:`key_signature` of a registered rule, remembered per compiled rule."""
        known = self._signatures.get(id(rule))
        if known is None or known[0] is not rule:
            known = self._signatures[id(rule)] = (rule, key_signature(rule))
        return known[1]

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
        if schema.clock is not None and schema.uncorrected(ev.fields):
            self._uncorrected += 1
        if self._watermark.observe(ev.stream, ev.ts):
            self._late_letter(ev, source, line, raw, event)
            self._collect(self._standing.late(ev, self._watermark.current) or [])
            return
        self._accepted += 1
        if self._tables.reads(ev.stream):
            for error in self._tables.apply(ev, self._pumped):
                self._change_letter(error, ev.stream, dict(input=source, line=line, raw=raw,
                                    event=None if raw is not None else event))
        if self._standing.reads(ev.stream):
            self._collect(self._standing.accept(ev))
        if any(ev.stream in g.readers for g in self._groups.values()):
            if ev.stream in self._route.streams:
                # Rows fed one at a time go through the reorder buffer; the stream's held
                # columns join them there so that each key still sees its events in order.
                self._route.demote(ev.stream)
            masks = (None,) * self._next_slot  # unknown: each rule tests the event itself
            if self._lacks_a_key(ev):
                # A rule reports a missing key only for an event it could take, as the
                # column-wise path decides (rows no condition takes are never dispatched).
                masks = self._masks_of(event, stream, ev)
            self._buffer.push(ev.ts, seq, (ev, masks))
        self._pump()

    def _lacks_a_key(self, ev: Event) -> bool:
        for group in self._groups.values():
            if ev.stream in group.readers:
                processor = group.processor
                if not (processor.keys_of_event(ev) if processor.multi_key
                        else processor.key_of_event(ev) is not None):
                    return True
        return False

    def _masks_of(self, event: Mapping[str, Any], stream: str | None, ev: Event) -> tuple:
        """The column-wise masks of one event, as :meth:`feed_batch` computes them."""
        parts, _ = split_by_stream(pd.DataFrame([dict(event)]), stream, self._schemas)
        if not parts:
            return (None,) * self._next_slot
        name, normalised, _, _ = parts[0]
        masks, _ = rule_masks(
            name, normalised, self._groups.values(), self._rules, self._slot_of, self._next_slot
        )
        return (0,) * self._next_slot if masks is None else mask_tuples(masks)[0]

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
        with collector_paused():
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
        where = RowOrigin(frame, source, lines, raw)
        parts, bad = split_by_stream(frame, stream, self._schemas)
        for row, reason, detail, name in bad:
            self._bad += 1
            self._dead.append(dead_letter(reason, detail, stream=name, **where.of(row)))
        if not parts:
            return
        late, met = lateness(self._watermark, parts)

        self._route.enable()
        entries_ts: list[np.ndarray] = []
        entries_seq: list[np.ndarray] = []
        entries: list[tuple[Event, tuple]] = []
        offset = 0
        for name, normalised, ts, ok_rows in parts:
            self._uncorrected += self._schemas[name].uncorrected_rows(normalised)
            count = len(ok_rows)
            late_here = late[offset : offset + count]
            offset += count
            late_rows = np.flatnonzero(late_here)
            met_here = met[offset - count : offset]
            for i in late_rows:
                row = int(ok_rows[i])
                self._late += 1
                self._dead.append(
                    dead_letter(
                        EventReason.LATE,
                        late_detail(
                            int(ts[i]), int(met_here[i]), self._schemas[name].epoch_unit_ms
                        ),
                        stream=name,
                        **where.of(row),
                    )
                )
            keep = ~late_here
            self._accepted += int(keep.sum())
            if self._standing.reads(name):
                self._feed_standing(name, normalised, ts, ok_rows, late_rows, met_here, seqs,
                                    positions)
            if not keep.any():
                continue
            if not keep.all():
                normalised, ts, ok_rows = normalised[keep], ts[keep], ok_rows[keep]
                met_here = met_here[keep]
            if self._tables.reads(name):
                # Each change as fed alone: the events before it in the batch were released
                # up to the watermark it met.
                errors = self._tables.apply_frame(
                    self._schemas[name], normalised, ts.tolist(), seqs[ok_rows].tolist(),
                    np.maximum(met_here, self._pumped).tolist(),
                )
                rows = ok_rows.tolist()
                for i, error in sorted(errors, key=lambda item: item[0]):
                    self._change_letter(error, name, where.of(rows[i]))
            if name in self._route.streams:
                fields = self._groups[self._route.streams[name]].processor.key_fields[name]
                held = self._route.hold(
                    self._schemas[name], fields, normalised, ts, seqs[ok_rows],
                    positions[ok_rows], self._next_slot,
                )
                if held is not None:
                    events, rows = held
                    entries.extend((e, (-1,) * self._next_slot) for e in events)
                    entries_ts.append(ts[rows])
                    entries_seq.append(seqs[ok_rows[rows]])
                continue
            payloads, rel = self._index.payloads(
                name, normalised, self._groups.values(), self._rules, self._slot_of,
                self._next_slot,
            )
            if len(rel) == 0:
                continue
            chosen = normalised if len(rel) == len(normalised) else normalised.iloc[rel]
            events = self._schemas[name].events_from_frame(
                chosen, seqs[ok_rows[rel]], positions[ok_rows[rel]]
            )
            entries.extend(zip(events, payloads, strict=True))
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

    def _feed_standing(
        self,
        name: str,
        normalised: pd.DataFrame,
        ts: np.ndarray,
        ok_rows: np.ndarray,
        late_rows: np.ndarray,
        met: np.ndarray,
        seqs: np.ndarray,
        positions: np.ndarray,
    ) -> None:
        """Hand one stream's valid rows of a batch to its queries and metrics as :meth:`feed`
        does row by row: each late row reaches the metrics after the on-time rows that came
        before it, with the metrics moved to the watermark it met (so it finds the windows
        fired and forgotten that a row-by-row run would have left)."""
        schema = self._schemas[name]
        wants_documents = self._standing.wants_documents(name)

        def accept(rows: np.ndarray) -> None:
            chosen = normalised.iloc[rows] if len(rows) < len(normalised) else normalised
            docs = (
                schema.events_from_frame(chosen, seqs[ok_rows[rows]], positions[ok_rows[rows]])
                if wants_documents
                else None
            )
            self._collect(
                self._standing.accept_frame(name, chosen, ts[rows], docs, seqs[ok_rows[rows]])
            )

        if not self._standing.counts(name):  # queries search the on-time rows, in any order
            on_time = np.setdiff1d(np.arange(len(normalised)), late_rows)
            if len(on_time):
                accept(on_time)
            return
        start = 0
        for stop in [*late_rows.tolist(), len(normalised)]:
            if stop > start:
                accept(np.arange(start, stop))
            if stop < len(normalised):
                one = [stop]
                (ev,) = schema.events_from_frame(
                    normalised.iloc[one], seqs[ok_rows[one]], positions[ok_rows[one]]
                )
                watermark = int(met[stop])
                self._collect(self._standing.settle(name, watermark))
                self._collect(self._standing.late(ev, watermark) or [])
            start = stop + 1

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
        with collector_paused():
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
    def rules_touched(self) -> int:
        """(rule, event) pairs the rules were run on so far: per event, the rules its key ran
        it through (row by row or in a scan); what the rule index saves shows here."""
        return self._touched_before + sum(g.processor.touched for g in self._groups.values())

    @property
    def rule_index(self) -> str:
        """The name of the rule index in use (the ``rule_index`` option)."""
        return self._index.name

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
            unkeyed=self._unkeyed,
            matches={
                **{name: 0 for name in [*self._rules, *self._standing.names]},
                **self._match_counts,
            },
            dropped_partials={k: v for k, v in drops.items() if v},
            suppressed={k: v for k, v in self._suppressed.items() if v},
            keys=keys,
            buffered=len(self._buffer) + len(self._route.columns),
            watermark=self._watermark.current,
            uncorrected=self._uncorrected,
            unchanged=self._unchanged,
            table_rows={feed.name: len(feed.table) for feed in self._tables.feeds()},
        )

    # ------------------------------------------------------------------ restarts

    def snapshot(self) -> bytes:
        """The engine's whole state as versioned bytes, to continue from after a restart
        (:meth:`restore`); the engine is not changed. The format and what it holds:
        :mod:`cep.engine.checkpoint`. Matches and dead letters not yet drained are part of it.

        Raises
        ------
        cep.errors.CheckpointError
            When the engine is closed or holds a value that is not JSON in an event.

        Examples
        --------
        >>> program = '''
        ... stream txn (card string, amount float, ts timestamp) time ts
        ... rule probe from txn by card pattern small big within 1h
        ...   define small as amount < 1, big as amount > 500
        ... '''
        >>> engine = Engine()
        >>> engine.register(program)
        ['probe']
        >>> engine.feed({"card": "c1", "amount": 0.5, "ts": 1767225600})
        >>> data = engine.snapshot()
        >>> data[:4]
        b'VGCK'
        >>> later = Engine()
        >>> later.register(program.replace("amount > 500", "amount > 800"))
        ['probe']
        >>> report = later.restore(data)
        >>> report.reset, report.versions
        (('probe',), {'probe': 2})
        """
        with collector_paused():  # one object per partial match and event
            return checkpoint.snapshot(self)

    def restore(self, data: bytes) -> checkpoint.RestoreReport:
        """Continue from a :meth:`snapshot`: call it on a new engine with its program
        registered, before feeding it. Rules, queries and metrics whose compiled form is
        unchanged keep their state and version; changed ones start fresh with a new version,
        new ones start fresh, and those the program no longer has are dropped
        (:mod:`cep.engine.checkpoint`). Nothing changes when an error is raised.

        Returns
        -------
        cep.engine.checkpoint.RestoreReport
            What was kept, reset, added and dropped.

        Raises
        ------
        cep.errors.CheckpointError
            When ``data`` is corrupt or of another format version, or the engine was fed.
        """
        with collector_paused():
            return checkpoint.restore(self, data)

    # ------------------------------------------------------------------ the pump

    def _pump(self) -> None:
        """Release what the watermark passed, dispatch it per key, then fire due timers."""
        watermark = self._watermark.current
        if self._tables and watermark != self._pumped:
            # Lookups from here on are at times after the watermark the last pump saw.
            self._tables.compact(self._pumped)
        self._pumped = watermark
        released = self._buffer.release(watermark)
        outputs: list[dict[str, Any]] = []
        for block in self._route.release(watermark):
            signature = self._route.streams[block.stream]
            group = self._groups[signature]
            for key, state in run_block(block, group, outputs):
                self._timers.update(signature, group, key, state)
        if released:
            self._index.dispatch(self._groups, released, self._timers, outputs,
                                 self._missing_key)
        fire_due(self._groups, self._timers, watermark, outputs)
        outputs.extend(self._standing.advance(watermark))
        self._collect(outputs)

    def _plan_columns(self) -> None:
        """Decide which streams' rows wait as columns (:meth:`ColumnRoute.plan`): none when
        the scan is off or the runtime is not the default one."""
        self._route.plan(self._groups if self.fast_strict and self._runtime is None else {})

    def _missing_key(self, processor: RuleProcessor, event: Event) -> None:
        self._unkeyed += 1
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

    def _late_letter(
        self, ev: Event, source: str, line: int | None, raw: str | None, event: Mapping[str, Any]
    ) -> None:
        self._late += 1
        self._dead.append(
            dead_letter(
                EventReason.LATE,
                late_detail(
                    ev.ts, self._watermark.current, self._schemas[ev.stream].epoch_unit_ms
                ),
                input=source,
                line=line,
                raw=raw,
                stream=ev.stream,
                event=None if raw is not None else event,
            )
        )

    def _change_letter(self, error: ChangeError, stream: str, where: Mapping[str, Any]) -> None:
        self._unchanged += 1
        self._dead.append(dead_letter(error.reason, error.detail, stream=stream, **where))

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine is closed (end of input); create a new Engine")


def _emission_order(match: dict[str, Any]) -> tuple:
    return (match.get("end", ""), match.get("start", ""), match.get("name", ""))


def _declared_as(decl: ast.Declaration) -> tuple[type, str]:
    """The key of a declaration among a program's: its kind and name (unique together)."""
    return type(decl), getattr(decl, "name", None) or str(id(decl))
