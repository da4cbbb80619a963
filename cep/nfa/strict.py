"""Strict-contiguity rules run as a scan over exact per-event condition bits.

A rule qualifies (:func:`qualifies`) when its contiguity is ``strict``, its pattern has no
negation, its steps have no ``by`` of their own, ``partials`` is ``all`` and every condition reads
only the current event and ``prev`` with an exact column-wise form
(:class:`cep.nfa.compiler.BatchCondition`). Whether a step can take an event then depends only on
the event's *bits* (bit ``i``: variable ``i``'s condition holds), computed for a whole batch of keys
at once by :func:`condition_bits`.

:func:`process_events` then does what :func:`cep.nfa.runtime.process_event` does for each event in
turn, without its per-event work: the Pike-VM run of a start position is abstracted to the
ordered letters of its alternatives and which of them share a binding list, and the
transitions between these abstract states are memoised per rule. Binding lists are built only
for reported matches and for runs still alive when the call returns, by replaying the run's
transitions, so the matches and the state left behind (:meth:`RuleState.to_bytes`) are those of
the per-event runtime.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cep.nfa.compiler import CompiledRule, prev_column
from cep.nfa.errors import OutOfOrderEventError
from cep.nfa.match import Match, build_match
from cep.nfa.runtime import _NO_GUARDS, _enforce_caps, _resume_after, _strict_table
from cep.nfa.state import RuleState, _Binding, _Event, _StrictRun, settle

__all__ = [
    "bits_signature", "block_bits", "condition_bits", "idle_signature", "pass_over",
    "process_events", "qualifies", "stays_idle",
]

_QUALIFIES = "__fast_strict__"
_AUTOMATON = "__fast_strict_automaton__"
_BITS_SIGNATURE = "__fast_strict_bits__"


def qualifies(rule: Any) -> bool:
    """Whether :func:`process_events` may run ``rule`` (see the module docstring)."""
    summaries = getattr(rule, "_summaries", None)
    if summaries is None:
        return False
    cached = summaries.get(_QUALIFIES)
    if cached is None:
        cached = summaries[_QUALIFIES] = (
            rule.contiguity == "strict"
            and not rule.guards
            and not rule.var_keys
            and rule.partials == "all"
            and all(
                not c.reads_variables and (c.predicate is None or c.batch is not None)
                for c in rule.conditions
            )
        )
    return cached


# ---------------------------------------------------------------- condition bits


def idle_signature(rule: Any) -> tuple | None:
    """What decides :func:`stays_idle` besides the bits — the rule's strict transition table
    (which its automaton is built from) and its partials cap — with its
    :func:`bits_signature`; None when that is None."""
    bits = bits_signature(rule)
    if bits is None:
        return None
    return (bits, *transitions_signature(rule))


def transitions_signature(rule: Any) -> tuple:
    """What decides how :func:`process_events` moves a rule's runs on given bits: its strict
    transition table (which its automaton is built from) and its partials cap. Rules with
    equal ones (and equal windows, skip and history) leave equal states for equal bits."""
    return (_strict_table(rule), rule.max_partials)


def bits_signature(rule: Any) -> tuple | None:
    """What decides a rule's :func:`condition_bits`: per variable its stream and condition
    text, and the streams whose events make its ``prev`` history. Rules of one processor
    with equal signatures get equal bits for equal histories and events; None when a
    condition reads a list, a table or a search (its text does not say all it reads)."""
    summaries = rule._summaries
    if _BITS_SIGNATURE not in summaries:
        parts = []
        for c in rule.conditions:
            if c.predicate is None:
                parts.append((c.stream, None))
            elif c.batch is None or c.batch.text is None:
                parts = None
                break
            else:
                parts.append((c.stream, c.batch.text))
        summaries[_BITS_SIGNATURE] = (
            None if parts is None else (tuple(parts), tuple(sorted(rule.streams)))
        )
    return summaries[_BITS_SIGNATURE]


def condition_bits(
    rule: CompiledRule,
    sequences: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Any]]],
    columns: dict[tuple[int, str | None], tuple[Sequence[Any], list[Any]]] | None = None,
) -> list[list[int]]:
    """Each event's bits (bit ``i``: variable ``i``'s condition holds), column-wise.

    Parameters
    ----------
    rule:
        A rule that :func:`qualifies`.
    sequences:
        Per partition key, ``(history, events)``: the fields of the key's events before these
        (the state's ``history``, oldest first; only the last ``prev_depth`` are read) and the
        key's new events in order (objects with ``stream`` and ``fields``).

    columns:
        Where the events' streams and field values are kept for the next call over the same
        event lists (per list and field name; the list is kept too, so that its id stays its
        own): rules scanning the same keys read them once.

    Returns
    -------
    list[list[int]]
        Per sequence, one int per event.
    """
    depth = rule.prev_depth
    if columns is None:
        columns = {}

    def column(events: Sequence[Any], name: str | None) -> list[Any]:
        """The events' values of field ``name`` (``None``: their streams)."""
        found = columns.get((id(events), name))
        if found is None:
            values = ([e.stream for e in events] if name is None
                      else [e.fields.get(name) for e in events])
            found = columns[(id(events), name)] = (events, values)
        return found[1]

    pasts = [list(history[-depth:]) if depth and history else [] for history, _ in sequences]
    history_lengths = [len(past) for past in pasts]
    event_lengths = [len(events) for _, events in sequences]
    streams: list[str | None] = []
    for past, (_, events) in zip(pasts, sequences, strict=True):
        if past:
            streams.extend([None] * len(past))
        streams.extend(column(events, None))

    def values(name: str) -> list[Any]:
        out: list[Any] = []
        for past, (_, events) in zip(pasts, sequences, strict=True):
            if past:
                out.extend([f.get(name) for f in past])
            out.extend(column(events, name))
        return out

    flat = _bits(rule, values, streams, history_lengths, event_lengths)
    out: list[list[int]] = []
    offset = 0
    for count in event_lengths:
        out.append(flat[offset : offset + count])
        offset += count
    return out


def block_bits(
    rule: CompiledRule,
    stream: str,
    column: Callable[[str], list[Any]],
    segments: Sequence[tuple[Sequence[Mapping[str, Any]], int, int]],
) -> list[int]:
    """:func:`condition_bits` over rows held as columns (:mod:`cep.events.columnar`).

    Parameters
    ----------
    rule:
        A rule that :func:`qualifies`.
    stream:
        The stream of every row.
    column:
        Field name -> its values over all rows (``None`` where absent), rows grouped by key
        and in event-time order within a key.
    segments:
        Per key, in row order: ``(history, lo, hi)``, the key's history (as in
        :func:`condition_bits`) and its rows ``lo:hi``.

    Returns
    -------
    list[int]
        One int per row, equal to what :func:`condition_bits` gives for the same events.
    """
    depth = rule.prev_depth
    pasts = [list(h[-depth:]) if depth and h else [] for h, _, _ in segments]
    history_lengths = [len(p) for p in pasts]
    event_lengths = [hi - lo for _, lo, hi in segments]
    if not any(history_lengths):
        streams: list[str | None] = [stream] * sum(event_lengths)
        return _bits(rule, column, streams, history_lengths, event_lengths)
    streams = []
    for past, count in zip(history_lengths, event_lengths, strict=True):
        streams.extend([None] * past)
        streams.extend([stream] * count)

    def values(name: str) -> list[Any]:
        col = column(name)
        out: list[Any] = []
        for past, (_, lo, hi) in zip(pasts, segments, strict=True):
            if past:
                out.extend([f.get(name) for f in past])
            out.extend(col[lo:hi])
        return out

    return _bits(rule, values, streams, history_lengths, event_lengths)


def _bits(
    rule: CompiledRule,
    values_of: Callable[[str], list[Any]],
    streams: list[str | None],
    history_lengths: list[int],
    event_lengths: list[int],
) -> list[int]:
    """The bits of the events of every segment (history rows first, then events), flat.

    ``values_of(name)`` gives a field's values over all rows, history rows included; the
    bits of history rows are computed (their ``prev`` reads the rows before them) and dropped.
    """
    total = len(streams)
    if total == 0:
        return []
    lengths = np.add(history_lengths, event_lengths)
    segment = np.repeat(np.arange(len(lengths)), lengths)
    reads = sorted({read for c in rule.conditions if c.batch is not None for read in c.batch.reads})
    columns: dict[str, np.ndarray] = {}
    current: dict[str, np.ndarray] = {}
    for name, n in reads:
        values = current.get(name)
        if values is None:
            values = current[name] = _values(values_of(name))
        if n == 0:
            columns[name] = values
            continue
        columns[prev_column(name, n)] = _shifted(values, segment, n)
    frame = pd.DataFrame(columns, index=pd.RangeIndex(total)) if columns else None
    stream_values = np.asarray(streams, dtype=object)
    bits = np.zeros(total, dtype=np.int64)
    for i, cond in enumerate(rule.conditions):
        fits = np.ones(total, dtype=bool)
        if cond.stream is not None:
            fits &= stream_values == cond.stream
        if cond.predicate is not None:
            assert cond.batch is not None  # guaranteed by qualifies()
            view = frame if frame is not None else pd.DataFrame(index=pd.RangeIndex(total))
            fits &= np.asarray(cond.batch.evaluate(view), dtype=bool)
        bits |= fits.astype(np.int64) << np.int64(i)
    if any(history_lengths):
        keep = np.ones(total, dtype=bool)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        for start, past in zip(starts.tolist(), history_lengths, strict=True):
            if past:
                keep[start : start + past] = False
        bits = bits[keep]
    return bits.tolist()


def _values(values: list[Any]) -> Any:
    """A column of Python field values, typed so the column-wise kernels take a fast path.

    Floats (with nulls as NaN) and ints (nullable ``Int64``) read exactly as the row-wise
    predicate reads them; anything else stays an object column, which the kernels normalise.
    """
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if kinds == {float}:
        return np.array(values, dtype=np.float64)
    if kinds == {int}:
        try:
            return pd.array(values, dtype="Int64")
        except (OverflowError, TypeError, ValueError):
            pass
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _shifted(values: Any, segment: np.ndarray, n: int) -> Any:
    """``values`` moved ``n`` rows down within each segment; null where nothing is n back."""
    total = len(values)
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        out: Any = np.full(total, np.nan)
        null: Any = np.nan
    elif isinstance(values, np.ndarray):
        out, null = np.full(total, None, dtype=object), None
    else:
        out, null = pd.array([None] * total, dtype=values.dtype), pd.NA
    if n < total:
        out[n:] = values[:-n]
        cut = np.flatnonzero(segment[n:] != segment[:-n]) + n
        out[cut] = null
    return out


# ---------------------------------------------------------------- abstract runs


class _Run:
    """A strict run whose alternatives are kept abstractly (see :func:`process_events`).

    ``sig`` is the id (:class:`_Automaton`) of the ordered tuple of ``(letter, class)``
    alternatives, where alternatives of the same class share one binding list. ``roots`` are
    the binding lists of the classes of ``anchor_sig`` before event ``anchor`` of the call;
    replaying the memoised transitions from there rebuilds the current ones. The best match so
    far is either ``best_node`` (built) or the child ``best_child`` created at event
    ``best_step`` (replayed when needed).
    """

    __slots__ = (
        "start_pos", "start_ts", "born", "sig", "anchor", "anchor_sig", "roots",
        "best_node", "best_step", "best_child", "best_end", "depth",
    )

    def __init__(self, start_pos, start_ts, born, sig, anchor, roots, best_node, best_end):
        self.start_pos = start_pos
        self.start_ts = start_ts
        self.born = born
        self.sig = sig
        self.anchor = anchor
        self.anchor_sig = sig
        self.roots = roots
        self.best_node = best_node
        self.best_step = -1
        self.best_child = -1
        self.best_end = best_end
        self.depth = 0


class _Pending:
    """The binding lists of a run of an earlier call, built when first needed."""

    __slots__ = ("scan", "run", "upto")

    def __init__(self, scan: _Scan, run: _Run, upto: int):
        self.scan = scan
        self.run = run
        self.upto = upto

    def nodes(self) -> list[_Binding | None]:
        return self.scan.replay(self.run, self.upto)


class _PendingBest:
    """The best match of a run of an earlier call, built when first needed."""

    __slots__ = ("scan", "run")

    def __init__(self, scan: _Scan, run: _Run):
        self.scan = scan
        self.run = run

    def node(self) -> _Binding:
        return self.scan.best(self.run)


class _LazyRuns:
    """Runs a call left in abstract form (``RuleState.lazy_runs``); built on first access."""

    __slots__ = ("scan", "runs", "upto")

    def __init__(self, scan: _Scan, runs: list[_Run], upto: int):
        self.scan = scan
        self.runs = runs
        self.upto = upto

    def concrete(self) -> list[_StrictRun]:
        return [self.scan.concrete(r, self.upto) for r in self.runs]


#: Calls a run may span before its binding lists are built (bounds the replay's recursion).
_MAX_DEPTH = 32


def _carry(run: _Run, lazy: _LazyRuns) -> _Run:
    """A run left by the previous call, anchored at the start of this one."""
    if run.depth >= _MAX_DEPTH:
        return _abstract(lazy.scan.auto, lazy.scan.concrete(run, lazy.upto), 0)
    best: Any = run.best_node
    if run.best_step >= 0:
        best = _PendingBest(lazy.scan, run)
    carried = _Run(
        run.start_pos, run.start_ts, run.born, run.sig, 0, _Pending(lazy.scan, run, lazy.upto),
        best, run.best_end,
    )
    carried.depth = run.depth + 1
    return carried


def _abstract(auto: _Automaton, run: _StrictRun, anchor: int) -> _Run:
    classes: dict[int, int] = {}
    roots: list[_Binding | None] = []
    sig = []
    for letter, node, _guards in run.entries:
        cls = classes.get(id(node))
        if cls is None:
            cls = classes[id(node)] = len(roots)
            roots.append(node)
        sig.append((letter, cls))
    return _Run(
        run.start_pos, run.start_ts, run.born, auto.intern(tuple(sig)), anchor, tuple(roots),
        run.best, run.best_end,
    )


class _Automaton:
    """The memoised abstract transitions of one rule, shared by its keys.

    Abstract run states (the ordered ``(letter, class)`` alternatives of a run) are interned
    as small ints; id 0 is the dead state (no alternative left). ``steps[sid]`` maps an
    event's bits to ``(new sid, children, classes, best, length of the new state)``, see
    :meth:`step`.
    """

    __slots__ = ("rows", "sigs", "ids", "steps", "start_bits", "start", "lock", "__weakref__")

    def __init__(self, table: tuple) -> None:
        self.rows, starts = table
        self.sigs: list[tuple] = [()]
        self.ids: dict[tuple, int] = {(): 0}
        self.steps: list[dict[int, tuple]] = [{}]
        self.lock = threading.Lock()
        self.start_bits = 0
        for letter in starts:
            self.start_bits |= 1 << self.rows[letter][0]
        self.start = self.intern(tuple((letter, 0) for letter in starts))

    def intern(self, sig: tuple) -> int:
        sid = self.ids.get(sig)
        if sid is None:
            with self.lock:
                sid = self.ids.get(sig)
                if sid is None:
                    sid = len(self.sigs)
                    self.sigs.append(sig)
                    self.steps.append({})
                    self.ids[sig] = sid
        return sid

    def step(self, sid: int, bits: int) -> tuple:
        """One event for every alternative of a run, as ``cep.nfa.runtime._strict_step`` does.

        Returns ``(new_sid, children, classes, best, length)``: ``children`` lists ``(parent
        class, place)`` per binding created, in creation order; ``classes`` the child of
        each class of the new state; ``best`` the child that reached a plain ACCEPT (-1: none).
        """
        found = self.steps[sid].get(bits)
        if found is not None:
            return found
        rows = self.rows
        made: dict[tuple[int, int], int] = {}
        children: list[tuple[int, int]] = []
        fresh: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        best = -1
        for letter, cls in self.sigs[sid]:
            var, items, accepts, place = rows[letter]
            if not (bits >> var) & 1:
                continue
            child = made.get((cls, place))
            if child is None:
                child = made[(cls, place)] = len(children)
                children.append((cls, place))
            for target, _guards in items:
                if (target, child) not in seen:
                    seen.add((target, child))
                    fresh.append((target, child))
            if accepts:
                # A plain ACCEPT cuts every less preferred alternative of the run.
                best = child
                break
        order: dict[int, int] = {}
        for _, child in fresh:
            if child not in order:
                order[child] = len(order)
        new_sig = tuple((target, order[child]) for target, child in fresh)
        found = (self.intern(new_sig), tuple(children), tuple(order), best, len(new_sig))
        self.steps[sid][bits] = found
        return found


#: One automaton per strict transition table, whichever rules have it: the abstract states
#: of runs then mean the same to rules alike, which may share what a scan left
#: (:func:`cep.nfa.state.twin`).
_AUTOMATA: weakref.WeakValueDictionary[tuple, _Automaton] = weakref.WeakValueDictionary()
_AUTOMATA_LOCK = threading.Lock()


def _automaton(rule: CompiledRule) -> _Automaton:
    auto = rule._summaries.get(_AUTOMATON)
    if auto is None:
        table = _strict_table(rule)
        with _AUTOMATA_LOCK:
            auto = _AUTOMATA.get(table)
            if auto is None:
                auto = _AUTOMATA[table] = _Automaton(table)
        rule._summaries[_AUTOMATON] = auto
    return auto


class _Scan:
    """The events of one :func:`process_events` call and the replay of runs over them."""

    __slots__ = ("auto", "rule", "events", "bits", "pos0", "made", "parts")

    def __init__(self, auto: _Automaton, rule: CompiledRule, events: Sequence[Any],
                 bits: Sequence[int], pos0: int):
        self.auto = auto
        self.rule = rule
        self.events = events
        self.bits = bits
        self.pos0 = pos0
        self.made: list[_Event | None] = [None] * len(events)
        # Rows held as columns (cep.events.columnar.Rows) hand over their columns: no event objects.
        columns = getattr(events, "event_columns", None)
        self.parts = columns() if columns is not None else None

    def event(self, i: int) -> _Event:
        ev = self.made[i]
        if ev is None:
            parts = self.parts
            if parts is not None:
                ids, stream, times, records, lo = parts
                j = lo + i
                ev = _Event(self.pos0 + i, ids[j], stream, times[j], records[j])
            else:
                e = self.events[i]
                ev = _Event(self.pos0 + i, e.id, e.stream, int(e.ts), e.fields)
            self.made[i] = ev
        return ev

    def replay(self, run: _Run, upto: int) -> list[_Binding | None]:
        """Build ``run``'s binding lists up to event ``upto`` (exclusive); sets ``best_node``."""
        roots = run.roots
        nodes = roots.nodes() if type(roots) is _Pending else list(roots)
        sig = run.anchor_sig
        step_of = self.auto.step
        for i in range(run.anchor, upto):
            sig, children, classes, best, _ = step_of(sig, self.bits[i])
            ev = self.event(i)
            made = [_Binding(nodes[cls], place, ev) for cls, place in children]
            if i == run.best_step:
                run.best_node = made[best]
            nodes = [made[c] for c in classes]
        run.anchor, run.anchor_sig, run.roots = upto, sig, tuple(nodes)
        if run.best_step < upto:
            run.best_step = -1
        return nodes

    def best(self, run: _Run) -> _Binding:
        if run.best_step >= 0:
            self.replay(run, run.best_step + 1)
        node = run.best_node
        if type(node) is _PendingBest:
            node = run.best_node = node.node()
        return node

    def word(self, run: _Run) -> list[tuple[int, _Event]]:
        """The ``(place, event)`` pairs of a finished run's best match.

        Unlike :meth:`best` it builds no binding list for the part of the match in this call:
        the run is over, so nothing will share them.
        """
        if run.best_step < 0:
            return [(b.place, b.event) for b in self.best(run).chain()]
        roots = run.roots
        current: list[Any] = roots.nodes() if type(roots) is _Pending else list(roots)
        sig = run.anchor_sig
        step_of = self.auto.step
        tip: Any = None
        for i in range(run.anchor, run.best_step + 1):
            sig, children, classes, best, _ = step_of(sig, self.bits[i])
            made = [(current[cls], place, i) for cls, place in children]
            if i == run.best_step:
                tip = made[best]
                break
            current = [made[c] for c in classes]
        out: list[tuple[int, _Event]] = []
        while type(tip) is tuple:
            out.append((tip[1], self.event(tip[2])))
            tip = tip[0]
        out.reverse()
        if tip is not None:
            out[:0] = [(b.place, b.event) for b in tip.chain()]
        return out

    def concrete(self, run: _Run, upto: int) -> _StrictRun:
        nodes = self.replay(run, upto)
        entries = [(letter, nodes[cls], _NO_GUARDS) for letter, cls in self.auto.sigs[run.sig]]
        best = self.best(run) if run.best_node is not None else None
        return _StrictRun(run.start_pos, run.start_ts, entries, best, run.best_end, run.born)


def process_events(
    rule: CompiledRule,
    state: RuleState,
    events: Sequence[Any],
    bits: Sequence[int],
    times: Sequence[int] | None = None,
) -> list[Match]:
    """Feed a key's events in order; equal to :func:`cep.nfa.runtime.process_event` on each.

    Parameters
    ----------
    rule:
        A rule that :func:`qualifies`.
    state:
        The key's state (mutated in place), as the per-event runtime keeps it.
    events:
        Objects with ``id``, ``stream``, ``ts``, ``seq`` and ``fields``, in event-time order.
    bits:
        Each event's bits from :func:`condition_bits` (with the state's ``history``).
    times:
        Each event's time (int ms), when the caller has them; events are then read only
        where a match, a run left alive, the history or an error needs them.

    Returns
    -------
    list[Match]
        The matches reported, in the order the per-event runtime reports them.

    Raises
    ------
    OutOfOrderEventError
        When an event is behind the key's watermark or before an earlier event of the key.
    """
    n = len(events)
    if n == 0:
        return []
    auto = _automaton(rule)
    start_bits = auto.start_bits
    sig0 = auto.start
    steps = auto.steps
    sigs = auto.sigs
    scan = _Scan(auto, rule, events, bits, state.pos)
    out: list[Match] = []
    within = rule.within_ms
    max_partials = rule.max_partials
    if state.key is None:
        first = events[0]
        state.key = tuple(first.fields.get(f) for f in rule.key_fields.get(first.stream, ()))
    lazy = state.lazy_runs
    if type(lazy) is _LazyRuns:
        runs = [_carry(r, lazy) for r in lazy.runs]
    else:
        # Runs of the state's own, or shared with its twins as stored (read, not changed).
        runs = [_abstract(auto, r, 0) for r in (state._runs if lazy is None else lazy.runs)]
    state.runs = []
    last_ts = state.last_ts
    watermark = state.watermark
    pos = state.pos
    born = state.born
    # Runs alive together are ordered by birth; with none alive, births count afresh (as the
    # per-event runtime counts them).
    quiet = not (state.cohorts or state.held or state.absences)

    def emit(found: list[_Run], runs: list[_Run]) -> list[_Run]:
        # Runs end in start order and each start has one run: that is preference order.
        for run in found:
            if run.start_pos < state.resume:
                continue
            word = scan.word(run)
            out.append(build_match(rule, state.key, word, run.best_end))
            state.resume = _resume_after(rule, state.resume, word, run.start_pos)
        resume = state.resume
        if resume > 0 and runs and runs[0].start_pos < resume:
            runs = [r for r in runs if r.start_pos >= resume]
        return runs

    if times is None:
        times = [int(e.ts) for e in events]
    for i in range(n):
        ts = times[i]
        if (watermark is not None and ts < watermark) or (last_ts is not None and ts < last_ts):
            _finish(scan, state, runs, i, born, last_ts)
            raise OutOfOrderEventError(
                f"rule {rule.name}: event {events[i].id!r} at {ts} arrived behind the key's "
                f"watermark ({watermark}) or after an event at {last_ts}; feed each key's "
                "events in event-time order"
            )
        if within is not None:
            # The windows the event's time passes close first, one emission slot per deadline.
            while runs and runs[0].start_ts + within < ts:
                deadline = runs[0].start_ts + within
                closed = [r for r in runs if r.start_ts + within == deadline]
                runs = [r for r in runs if r.start_ts + within != deadline]
                runs = emit(
                    [r for r in closed if r.best_node is not None or r.best_step >= 0], runs
                )
        b = bits[i]
        if pos >= state.resume and b & start_bits:
            if quiet and not runs:
                born = 0
            born += 1
            runs.append(_Run(pos, ts, born, sig0, i, (None,), None, 0))
        alive: list[_Run] = []
        found: list[_Run] = []
        live = 0
        for run in runs:
            step = steps[run.sig].get(b)
            if step is None:
                step = auto.step(run.sig, b)
            new_sig, _, _, best, length = step
            if best >= 0:
                run.best_step, run.best_child, run.best_end = i, best, ts
                run.best_node = None
            if new_sig:
                run.sig = new_sig
                alive.append(run)
                live += length
            elif run.best_step >= 0 or run.best_node is not None:
                found.append(run)
        runs = alive
        if found:
            runs = emit(found, runs)
            live = sum(len(sigs[r.sig]) for r in runs)
        pos += 1
        last_ts = ts
        if live > max_partials:
            # Rare: the cap drops alternatives, which the per-event runtime decides.
            state.born = born
            state.runs = [scan.concrete(r, i + 1) for r in runs]
            _enforce_caps(rule, state)
            runs = [_abstract(auto, r, i + 1) for r in state.runs]
            state.runs = []
    _finish(scan, state, runs, n, born, last_ts)
    return out


def stays_idle(rule: CompiledRule, bits: Sequence[int], lo: int = 0) -> bool:
    """Whether :func:`process_events` over events with ``bits[lo:]``, from a state with no
    run and nothing held (``resume`` 0), reports no match, drops no partial match and leaves
    no run: then it leaves the state as :func:`pass_over` does. Conservative: a run the
    window would end is counted as left alive (the caller then runs the events). Rules with
    equal :func:`idle_signature` give equal answers."""
    auto = _automaton(rule)
    start_bits = auto.start_bits
    sig0 = auto.start
    steps = auto.steps
    max_partials = rule.max_partials
    runs: list[int] = []
    for i in range(lo, len(bits)):
        b = bits[i]
        if b & start_bits:
            runs.append(sig0)
        elif not runs:
            continue
        alive = []
        live = 0
        for sig in runs:
            step = steps[sig].get(b)
            if step is None:
                step = auto.step(sig, b)
            new_sig, _, _, best, length = step
            if best >= 0:
                return False
            if new_sig:
                alive.append(new_sig)
                live += length
        if live > max_partials:
            return False
        runs = alive
    return not runs


def pass_over(
    rule: CompiledRule,
    state: RuleState,
    events: Sequence[Any],
    history: list[Mapping[str, Any]] | None = None,
) -> None:
    """Leave the state as :func:`process_events` does after ``events`` when no run is live
    before them and none of them can start one: only the counters, the last time and the
    ``prev`` history move. ``history``, when given, is that history already computed (the
    same list may be given to several states: it is replaced, never changed in place)."""
    if not events:
        return
    if state.key is None:
        first = events[0]
        state.key = tuple(first.fields.get(f) for f in rule.key_fields.get(first.stream, ()))
    n = len(events)
    state.pos += n
    state.events_seen += n
    state.last_ts = int(events[-1].ts)
    state.runs = []
    depth = rule.prev_depth
    if depth:
        if history is None:
            history = (state.history + [e.fields for e in events[-depth:]])[-depth:]
        state.history = history
    settle(state)


def _finish(
    scan: _Scan, state: RuleState, runs: list[_Run], upto: int, born: int, last_ts: int | None
) -> None:
    """Leave the state as the per-event runtime leaves it after the first ``upto`` events."""
    state.born = born
    state.pos = scan.pos0 + upto
    state.last_ts = last_ts
    state.events_seen += upto
    state.runs = []
    if runs:
        state.lazy_runs = _LazyRuns(scan, runs, upto)
    depth = scan.rule.prev_depth
    if depth and upto:
        history = state.history + [e.fields for e in scan.events[max(0, upto - depth) : upto]]
        state.history = history[-depth:]
    settle(state)
