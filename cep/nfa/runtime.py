"""Runs a compiled rule over the events of one partition key: partial matches, timers, skips.

Everything that belongs to one (rule, key) lives in a :class:`RuleState` value that the caller
keeps (a dict in the embedded engine, Spark state in the streaming operator) and can serialise
with :meth:`RuleState.to_bytes`. The functions here are pure over (compiled rule, state, input):
results do not depend on how a key's events are split into calls. The matching semantics are
specified in ``docs/semantics.md``.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cep.events.event import EngineError, StateError
from cep.nfa.compiler import TAIL_GREEDY, TAIL_RELUCTANT, CompiledRule
from cep.nfa.match import Match

__all__ = [
    "OutOfOrderEventError",
    "RuleRuntimeError",
    "RuleState",
    "StateFormatError",
    "advance_watermark",
    "new_state",
    "process_event",
]

_MAGIC = b"VGRS"
_FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sBB8sI")
_FLAG_ZLIB = 1
_COMPRESS_OVER = 512
_INF = math.inf
_NO_GUARDS: frozenset[int] = frozenset()


class RuleRuntimeError(EngineError):
    """Root of the errors raised while running a compiled rule on a key."""


class OutOfOrderEventError(RuleRuntimeError, ValueError):
    """An event reached the runtime out of event-time order or behind the key's watermark."""


class StateFormatError(RuleRuntimeError, StateError):
    """Serialised rule state is corrupt, truncated, of an unknown version or of another rule."""


class _Event:
    """An event as the runtime keeps it: its partition position plus the caller's values."""

    __slots__ = ("pos", "id", "stream", "ts", "fields")

    def __init__(self, pos: int, id: Any, stream: str, ts: int, fields: Mapping[str, Any]):
        self.pos = pos
        self.id = id
        self.stream = stream
        self.ts = ts
        self.fields = fields


class _Binding:
    """One link of a persistent binding list: ``event`` taken at ``place`` after ``parent``.

    ``place`` is a variable's place in the pattern (:attr:`CompiledRule.places` maps it to the
    variable), so two parses that bind the same events to the same variable at different
    places are different partial matches. Partial matches that share a prefix share its
    links, and through them the buffered events (the role of Flink's SharedBuffer).
    """

    __slots__ = ("parent", "place", "event")

    def __init__(self, parent: _Binding | None, place: int, event: _Event):
        self.parent = parent
        self.place = place
        self.event = event

    def chain(self) -> list[_Binding]:
        out = []
        node: _Binding | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out


@dataclass(slots=True)
class _Partial:
    """A partial match under relaxed/any contiguity: a binding list and its NFA letters."""

    node: _Binding
    letters: tuple[int, ...]
    blocked: frozenset[int]
    supersedes: tuple[int, ...]
    after_reluctant: bool
    start_pos: int
    start_ts: int
    born: int


@dataclass(slots=True)
class _Held:
    """A complete match held back because a trailing greedy quantifier may still extend it."""

    id: int
    node: _Binding
    deadline: float
    superseded: bool = False


@dataclass(slots=True)
class _Absence:
    """A match that waits for its trailing ``!x`` window to close without an ``x``."""

    node: _Binding
    guard_sets: tuple[frozenset[int], ...]
    blocked: frozenset[int]
    deadline: int


#: One live alternative of a strict run, in preference order: ``(letter, binding, guards)``.
#: ``letter`` >= 0 waits to TAKE that letter next; -1 is a trailing absence waiting for its
#: deadline with ``guards`` not yet violated. Plain tuples: strict runs create one per event.
_StrictEntry = tuple


@dataclass(slots=True)
class _StrictRun:
    """All alternatives started at one position under strict contiguity (a Pike-VM run)."""

    start_pos: int
    start_ts: int
    entries: list[_StrictEntry]
    best: _Binding | None = None
    best_end: int = 0
    born: int = 0


class _Context:
    """The ``MatchContext`` a condition sees: bindings so far, the candidate, ``prev``.

    ``var`` is the variable the candidate event is tested for; a variable's bindings are the
    events taken at any of its places.
    """

    __slots__ = ("node", "var", "current", "history", "index", "places")

    def __init__(self, node, var, current, history, index, places):
        self.node = node
        self.var = var
        self.current = current
        self.history = history
        self.index = index
        self.places = places

    def bound(self, var: str) -> Sequence[Mapping[str, Any]]:
        idx = self.index.get(var)
        if idx is None:
            return []
        out = []
        places = self.places
        node = self.node
        while node is not None:
            if places[node.place] == idx:
                out.append(node.event.fields)
            node = node.parent
        out.reverse()
        if idx == self.var and self.current is not None:
            out.append(self.current)
        return out

    def prev(self, n: int = 1) -> Mapping[str, Any] | None:
        if n < 1 or n > len(self.history):
            return None
        return self.history[-n]


class RuleState:
    """The mutable per-(rule, key) state: partial matches, held and pending matches, timers.

    Attributes
    ----------
    dropped_partials:
        Partial matches dropped because the key hit ``max_partials`` (oldest first).
    """

    __slots__ = (
        "key", "pos", "watermark", "resume", "dropped_partials", "partials", "held",
        "absences", "_runs", "lazy_runs", "history", "born", "held_ids", "last_ts",
        "events_seen", "fingerprint", "within",
    )

    def __init__(self, fingerprint: bytes = b"\0" * 8, within: int | None = None) -> None:
        self.fingerprint = fingerprint
        self.within = within
        self.key: tuple | None = None
        self.pos = 0
        self.watermark: float | None = None
        self.resume = 0
        self.dropped_partials = 0
        self.partials: list[_Partial] = []
        self.held: list[_Held] = []
        self.absences: list[_Absence] = []
        self._runs: list[_StrictRun] = []
        # Strict runs left by the column-wise scan (cep.nfa.strict) in its abstract form; they are
        # built into ``runs`` on first access, so only the scan's next call skips that work.
        self.lazy_runs: Any = None
        self.history: list[Mapping[str, Any]] = []
        self.born = 0
        self.held_ids = 0
        self.last_ts: int | None = None
        self.events_seen = 0

    @property
    def runs(self) -> list[_StrictRun]:
        """Live runs under strict contiguity, in start order."""
        if self.lazy_runs is not None:
            self._runs = self.lazy_runs.concrete()
            self.lazy_runs = None
        return self._runs

    @runs.setter
    def runs(self, runs: list[_StrictRun]) -> None:
        self._runs = runs
        self.lazy_runs = None

    @property
    def is_empty(self) -> bool:
        """True when nothing is pending, so the caller may drop the stored state."""
        return not (
            self.partials or self.held or self.absences or self._runs or self.lazy_runs
            or self.history
        )

    @property
    def partial_count(self) -> int:
        """Live partial matches (relaxed/any) or strict alternatives."""
        return len(self.partials) + sum(len(r.entries) for r in self.runs)

    @property
    def next_timer_ms(self) -> int | None:
        """The earliest event time the watermark must pass for this state to change, or None.

        The watermark *passes* a deadline ``d`` when it exceeds it, so the returned value is
        ``d + 1``; call :func:`advance_watermark` with a watermark of at least that.
        """
        deadlines: list[float] = [h.deadline for h in self.held if not h.superseded]
        deadlines.extend(a.deadline for a in self.absences)
        if self.within is not None:
            # Expiring partial matches produce no output but let the caller drop the state.
            deadlines.extend(p.start_ts + self.within for p in self.partials)
            runs = self.lazy_runs.runs if self.lazy_runs is not None else self._runs
            deadlines.extend(r.start_ts + self.within for r in runs)
        finite = [d for d in deadlines if d != _INF]
        return int(min(finite)) + 1 if finite else None

    def to_bytes(self) -> bytes:
        """A compact, versioned encoding (header + JSON body); events stored once."""
        return _encode(self)

    @classmethod
    def from_bytes(cls, data: bytes, rule: CompiledRule) -> RuleState:
        """Decode :meth:`to_bytes` output for ``rule``.

        Raises
        ------
        StateFormatError
            When the bytes are corrupt, of an unknown format version, or of another rule.
        """
        return _decode(data, rule)


def new_state(rule: CompiledRule, key: tuple | None = None) -> RuleState:
    """A fresh state for one key of ``rule`` (``key`` is filled from the first event if None)."""
    state = RuleState(rule.fingerprint, rule.within_ms)
    state.key = tuple(key) if key is not None else None
    return state


# ---------------------------------------------------------------- evaluation helpers


class _Evaluator:
    """Evaluates conditions for one event, caching results that do not depend on bindings."""

    __slots__ = ("rule", "state", "event", "mask", "pure", "cache", "index", "keyed")

    def __init__(self, rule: CompiledRule, state: RuleState, event: _Event, mask: int | None):
        self.rule = rule
        self.state = state
        self.event = event
        self.mask = mask
        self.pure = rule.pure_bits
        self.cache: dict[int, bool] = {}
        self.index = _var_index(rule)
        self.keyed = bool(rule.var_keys) and state.key is not None

    def fits(self, var: int, node: _Binding | None) -> bool:
        cond = self.rule.conditions[var]
        shared = not cond.reads_variables
        if shared:
            cached = self.cache.get(var)
            if cached is not None:
                return cached
        result = self._evaluate(var, cond, node)
        if shared:
            self.cache[var] = result
        return result

    def _evaluate(self, var: int, cond, node: _Binding | None) -> bool:
        event = self.event
        if self.mask is not None and not (self.mask >> var) & 1:
            return False
        if cond.stream is not None and event.stream != cond.stream:
            return False
        if self.keyed:
            names = self.rule.var_keys.get(self.rule.variables[var])
            if names is not None:
                width = len(names)
                own = tuple(event.fields.get(f) for f in names)
                if own != tuple(self.state.key[-width:]):
                    return False
        if cond.predicate is None:
            return True
        if self.mask is not None and (self.pure >> var) & 1:
            return True
        ctx = _Context(
            node, var, event.fields, self.state.history, self.index, self.rule.places
        )
        try:
            return bool(cond.predicate(event.fields, ctx))
        except Exception as exc:  # compiled predicates never raise; an embedder's may
            raise RuleRuntimeError(
                f"rule {self.rule.name}: condition of {self.rule.variables[var]} failed on "
                f"event {event.id!r}: {exc}"
            ) from exc


def _var_index(rule: CompiledRule) -> dict[str, int]:
    cached = rule._summaries.get("__index__")
    if cached is None:
        cached = {v: i for i, v in enumerate(rule.variables)}
        rule._summaries["__index__"] = cached
    return cached


def _pref(node: _Binding) -> tuple:
    return tuple((b.event.pos, b.place) for b in node.chain())


def _emit_values(rule: CompiledRule, key: dict[str, Any], last: Any, ctx: Any) -> dict:
    """A match's ``emit`` values: each expression over the last event's fields (the key's
    fields filled in) and ``ctx``, the match's bound events."""
    current = dict(last.fields)
    for name, value in key.items():
        current.setdefault(name, value)
    values = {}
    for name, fn in rule.emit:
        try:
            values[name] = fn(current, ctx)
        except Exception as exc:
            raise RuleRuntimeError(
                f"rule {rule.name}: emit {name} failed on a match: {exc}"
            ) from exc
    return values


def _build_match(
    rule: CompiledRule, state: RuleState, node: _Binding, end_ms: int | None
) -> Match:
    chain = node.chain()
    events: dict[str, list[Any]] = {}
    names, places = rule.variables, rule.places
    for b in chain:
        events.setdefault(names[places[b.place]], []).append(b.event.id)
    first, last = chain[0].event, chain[-1].event
    key = _key_dict(rule, state, first)
    values = (
        dict(key) if rule.emit is None
        else _emit_values(
            rule, key, last, _Context(node, None, None, (), _var_index(rule), rule.places)
        )
    )
    return Match(
        rule=rule.name,
        version=rule.version,
        key=key,
        events=events,
        values=values,
        start_ms=first.ts,
        end_ms=last.ts if end_ms is None else end_ms,
        severity=rule.severity,
    )


def _key_dict(rule: CompiledRule, state: RuleState, first: _Event) -> dict[str, Any]:
    if state.key is not None and len(state.key) == len(rule.key_names):
        return dict(zip(rule.key_names, state.key, strict=True))
    names = rule.key_fields.get(first.stream, ())
    return {n: first.fields.get(f) for n, f in zip(rule.key_names, names, strict=False)}


# ---------------------------------------------------------------- skip strategy


class _Emitter:
    """Applies the after-match skip strategy to matches in emission order."""

    __slots__ = ("rule", "state", "out")

    def __init__(self, rule: CompiledRule, state: RuleState):
        self.rule = rule
        self.state = state
        self.out: list[Match] = []

    def emit_slot(self, found: list[tuple[_Binding, int | None]]) -> None:
        """Report the matches of one emission slot, ordered by start position, preference."""
        if not found:
            return
        found.sort(key=lambda f: _pref(f[0]))
        # Parses that bind the same events to the same variables at different places are
        # one match when they are emitted together (docs/semantics.md, rule 7).
        reported: set[tuple] | None = set() if self.rule.reuses_variables else None
        for node, end in found:
            chain = node.chain()
            first = chain[0].event.pos
            if first < self.state.resume:
                continue
            if reported is not None:
                places = self.rule.places
                word = tuple((b.event.pos, places[b.place]) for b in chain)
                if word in reported:
                    continue
                reported.add(word)
            self.out.append(_build_match(self.rule, self.state, node, end))
            self.state.resume = self._resume_after(chain, first)
        self._discard_before(self.state.resume)

    def _resume_after(self, chain: list[_Binding], first: int) -> int:
        kind = self.rule.skip
        if kind == "past_last":
            return chain[-1].event.pos + 1
        if kind == "to_next":
            return first + 1
        if kind == "no_skip":
            return self.state.resume
        places = self.rule.places
        positions = [b.event.pos for b in chain if places[b.place] == self.rule.skip_var]
        if not positions:
            return first + 1
        target = positions[0] if kind == "to_first" else positions[-1]
        return target if target > first else first + 1

    def _discard_before(self, resume: int) -> None:
        if resume <= 0:
            return
        s = self.state
        s.partials = [p for p in s.partials if p.start_pos >= resume]
        s.held = [h for h in s.held if _start(h.node) >= resume]
        s.absences = [a for a in s.absences if _start(a.node) >= resume]
        s.runs = [r for r in s.runs if r.start_pos >= resume]


def _start(node: _Binding) -> int:
    while node.parent is not None:
        node = node.parent
    return node.event.pos


# ---------------------------------------------------------------- public entry points


def process_event(
    rule: CompiledRule, state: RuleState, event: Any, mask: int | None = None
) -> list[Match]:
    """Feed one event of the state's key (events must arrive in event-time order).

    Parameters
    ----------
    rule, state:
        The compiled rule and the key's state (mutated in place).
    event:
        An object with ``id``, ``stream``, ``ts`` (epoch ms), ``seq`` and ``fields``.
    mask:
        This event's bit from :meth:`CompiledRule.columnar_mask` (None: evaluate row-wise).

    Returns
    -------
    list[Match]
        Matches reported by this event, including those whose deadline it passed.
    """
    ts = int(event.ts)
    if state.watermark is not None and ts < state.watermark:
        raise OutOfOrderEventError(
            f"rule {rule.name}: event {event.id!r} at {ts} is behind the key's watermark "
            f"{state.watermark}; late events must be dead-lettered before the runtime"
        )
    if state.last_ts is not None and ts < state.last_ts:
        raise OutOfOrderEventError(
            f"rule {rule.name}: event {event.id!r} at {ts} arrived after an event at "
            f"{state.last_ts}; feed each key's events in event-time order"
        )
    emitter = _Emitter(rule, state)
    if state.held or state.absences or state.runs or state.partials:
        _fire(rule, state, ts, emitter)
    if state.key is None:
        names = rule.key_fields.get(event.stream, ())
        state.key = tuple(event.fields.get(f) for f in names)
    current = _Event(state.pos, event.id, event.stream, ts, event.fields)
    state.pos += 1
    state.last_ts = ts
    state.events_seen += 1
    ev = _Evaluator(rule, state, current, mask)
    if rule.contiguity == "strict":
        found, live = _strict_step(rule, state, ev)
    else:
        found = _relaxed_step(rule, state, ev)
        live = len(state.partials)
    if found:
        emitter.emit_slot(found)
        live = state.partial_count
    if rule.partials == "latest" or live > rule.max_partials:
        _enforce_caps(rule, state)
    if rule.prev_depth:
        state.history.append(event.fields)
        if len(state.history) > rule.prev_depth:
            del state.history[0]
    return emitter.out


def advance_watermark(rule: CompiledRule, state: RuleState, watermark_ms: float) -> list[Match]:
    """Advance the key's event time: expire partial matches, fire deadlines, flush at the end.

    A deadline ``d`` (``first.ts + within``) fires once ``watermark_ms > d``. ``float('inf')``
    means end of input: every pending match is settled, including greedy matches of rules
    without ``within``, and the state becomes empty.
    """
    if state.watermark is None or watermark_ms > state.watermark:
        state.watermark = watermark_ms
    emitter = _Emitter(rule, state)
    _fire(rule, state, watermark_ms, emitter)
    if watermark_ms == _INF:
        state.history.clear()
    return emitter.out


# ---------------------------------------------------------------- relaxed / any


def _relaxed_step(rule: CompiledRule, state: RuleState, ev: _Evaluator) -> list:
    event = ev.event
    within = rule.within_ms
    relaxed = rule.contiguity == "relaxed"
    place_var = rule.places
    found: list[tuple[_Binding, int | None]] = []

    survivors: list[_Absence] = []
    for pending in state.absences:
        blocked = _block(rule, ev, pending.node, pending.blocked, _union(pending.guard_sets))
        if any(not (g & blocked) for g in pending.guard_sets):
            pending.blocked = blocked
            survivors.append(pending)
    state.absences = survivors

    kept: list[_Partial] = []
    children: list[_Partial] = []
    for p in state.partials:
        if within is not None and event.ts - p.start_ts > within:
            continue
        summary = rule.summary(p.letters)
        fitted = False
        for place, options in summary.takes.items():
            if not ev.fits(place_var[place], p.node):
                continue
            fitted = True
            if len(options) == 1:
                letter, guards = options[0]
                targets = [] if guards & p.blocked else [letter]
            else:
                targets = sorted({lt for lt, guards in options if not (guards & p.blocked)})
            if targets:
                children.append(_child(rule, state, p, place, targets, event))
        if fitted and relaxed:
            continue
        if summary.guards:
            p.blocked = _block(rule, ev, p.node, p.blocked, summary.guards)
            if all(
                guards & p.blocked for opts in summary.takes.values() for _, guards in opts
            ):
                continue
        kept.append(p)

    if state.pos - 1 >= state.resume:
        start = rule.summary((-1,))
        for place, options in start.takes.items():
            if ev.fits(place_var[place], None):
                targets = sorted({letter for letter, _ in options})
                children.append(_child(rule, state, None, place, targets, event))

    for child in children:
        summary = rule.summary(child.letters)
        _arrive(rule, state, child, summary, found)
        if summary.takes:
            kept.append(child)
    state.partials = kept
    return found


def _union(sets: tuple[frozenset[int], ...]) -> frozenset[int]:
    out: frozenset[int] = frozenset()
    for s in sets:
        out |= s
    return out


def _block(
    rule: CompiledRule,
    ev: _Evaluator,
    node: _Binding | None,
    blocked: frozenset[int],
    guards: frozenset[int],
) -> frozenset[int]:
    fresh = [g for g in guards if g not in blocked and ev.fits(rule.guards[g], node)]
    return blocked | frozenset(fresh) if fresh else blocked


def _child(
    rule: CompiledRule,
    state: RuleState,
    parent: _Partial | None,
    place: int,
    targets: list[int],
    event: _Event,
) -> _Partial:
    supersedes: tuple[int, ...] = ()
    after_reluctant = False
    if parent is not None and (parent.supersedes or parent.after_reluctant):
        tails = {rule.letters[t].tail for t in targets}
        # The event extends the match inside a trailing quantifier when any derivation takes
        # it there (a fixed repetition like (a{1,3}){2} also reaches a's outside the tail).
        if TAIL_GREEDY in tails:
            supersedes = parent.supersedes
        if TAIL_RELUCTANT in tails:
            after_reluctant = parent.after_reluctant
    state.born += 1
    return _Partial(
        node=_Binding(parent.node if parent is not None else None, place, event),
        letters=tuple(targets),
        blocked=frozenset(),
        supersedes=supersedes,
        after_reluctant=after_reluctant,
        start_pos=parent.start_pos if parent is not None else event.pos,
        start_ts=parent.start_ts if parent is not None else event.ts,
        born=state.born,
    )


def _arrive(rule: CompiledRule, state: RuleState, child: _Partial, summary, found: list) -> None:
    """Handle a partial match that just took an event: plain and absence accepts."""
    if not summary.accepts:
        return
    plain = any(not guards for guards in summary.accepts)
    absent = tuple(guards for guards in summary.accepts if guards)
    if plain:
        for held in state.held:
            if held.id in child.supersedes:
                held.superseded = True
        if not child.after_reluctant:
            if summary.greedy_tail_take:
                state.held_ids += 1
                within = rule.within_ms
                deadline = child.start_ts + within if within is not None else _INF
                state.held.append(_Held(state.held_ids, child.node, deadline))
                child.supersedes = child.supersedes + (state.held_ids,)
            else:
                found.append((child.node, None))
        if any(rule.letters[t].tail == TAIL_RELUCTANT for opts in summary.takes.values()
               for t, _ in opts):
            child.after_reluctant = True
    if absent and rule.within_ms is not None:
        state.absences.append(
            _Absence(child.node, absent, frozenset(), child.start_ts + rule.within_ms)
        )


# ---------------------------------------------------------------- strict


def _strict_table(rule: CompiledRule) -> tuple:
    """Per letter: (variable, PROCEED items up to the first plain ACCEPT, accepts?, place)."""
    table = rule._summaries.get("__strict__")
    if table is None:
        rows = []
        for letter, items in zip(rule.letters, rule.after, strict=True):
            kept: list[tuple[int, frozenset[int]]] = []
            accepts = False
            for item in items:
                if item.is_accept and not item.guards:
                    accepts = True
                    break
                kept.append((item.letter, item.guards))
            rows.append((letter.var, tuple(kept), accepts, letter.place))
        starts = tuple(item.letter for item in rule.start if not item.is_accept)
        table = rule._summaries["__strict__"] = (tuple(rows), starts)
    return table


def _strict_step(rule: CompiledRule, state: RuleState, ev: _Evaluator) -> list:
    event = ev.event
    within = rule.within_ms
    rows, starts = _strict_table(rule)
    found: list[tuple[_Binding, int | None]] = []
    fits = ev.fits
    if event.pos >= state.resume and any(fits(rows[letter][0], None) for letter in starts):
        state.born += 1
        entries = [(letter, None, _NO_GUARDS) for letter in starts]
        state.runs.append(_StrictRun(event.pos, event.ts, entries, born=state.born))
    alive: list[_StrictRun] = []
    live = 0
    # Hash-consing children keeps one binding object per distinct binding list, so
    # alternatives that bound the same events to the same variables deduplicate by identity.
    children: dict[tuple[int, int], _Binding] = {}
    for run in state.runs:
        fresh: list[_StrictEntry] = []
        in_window = within is None or event.ts - run.start_ts <= within
        if len(run.entries) == 1 and run.entries[0][0] >= 0:
            # One waiting alternative: its closure items are distinct, nothing to deduplicate.
            letter, node, _ = run.entries[0]
            var, items, accepts, place = rows[letter]
            if in_window and fits(var, node):
                child = _Binding(node, place, event)
                fresh = [(t, child, g if t < 0 else _NO_GUARDS) for t, g in items]
                if accepts:
                    run.best, run.best_end = child, event.ts
            run.entries = fresh
            if fresh:
                alive.append(run)
                live += len(fresh)
            elif run.best is not None:
                found.append((run.best, run.best_end))
            continue
        seen: set[tuple] = set()
        for entry in run.entries:
            letter, node, entry_guards = entry
            if letter < 0:
                blocked = _block(rule, ev, node, _NO_GUARDS, entry_guards)
                if not blocked and (letter, id(node), entry_guards) not in seen:
                    seen.add((letter, id(node), entry_guards))
                    fresh.append(entry)
                continue
            var, items, accepts, place = rows[letter]
            if not in_window or not fits(var, node):
                continue
            key = (id(node), place)
            child = children.get(key)
            if child is None:
                child = children[key] = _Binding(node, place, event)
            for target, guards in items:
                mark = (target, id(child), guards)
                if mark in seen:
                    continue
                seen.add(mark)
                fresh.append((target, child, guards if target < 0 else _NO_GUARDS))
            if accepts:
                # A plain ACCEPT cuts every less preferred alternative of this run.
                run.best, run.best_end = child, event.ts
                break
        run.entries = fresh
        if fresh:
            alive.append(run)
            live += len(fresh)
        elif run.best is not None:
            found.append((run.best, run.best_end))
    state.runs = alive
    return found, live


def _strict_deadline(run: _StrictRun, deadline: float) -> tuple[_Binding, int | None] | None:
    """The window of a strict run closed: waiting TAKEs die, a live absence accepts."""
    for entry in run.entries:
        if entry[0] < 0:
            run.best, run.best_end = entry[1], int(deadline)
            break
    run.entries = []
    if run.best is None:
        return None
    return run.best, run.best_end


# ---------------------------------------------------------------- deadlines


def _fire(rule: CompiledRule, state: RuleState, watermark: float, emitter: _Emitter) -> None:
    """Settle every deadline ``d < watermark`` in ascending order of ``d``."""
    within = rule.within_ms
    end_of_input = watermark == _INF

    def run_deadline(r: _StrictRun) -> float:
        return r.start_ts + within if within is not None else _INF

    while state.held or state.absences or state.runs:
        d = _INF
        for h in state.held:
            if h.deadline < d:
                d = h.deadline
        for pending in state.absences:
            if pending.deadline < d:
                d = pending.deadline
        if state.runs and within is not None:
            # Runs are kept in start order, so the first one's window closes first.
            d = min(d, state.runs[0].start_ts + within)
        if not (d < watermark or end_of_input):
            break
        found: list[tuple[_Binding, int | None]] = []
        keep_held = []
        for h in state.held:
            if h.deadline == d:
                if not h.superseded:
                    found.append((h.node, None))
            else:
                keep_held.append(h)
        state.held = keep_held
        keep_abs = []
        for a in state.absences:
            if a.deadline == d:
                found.append((a.node, a.deadline))
            else:
                keep_abs.append(a)
        state.absences = keep_abs
        keep_runs = []
        for r in state.runs:
            if run_deadline(r) == d:
                result = _strict_deadline(r, d)
                if result is not None:
                    found.append(result)
            else:
                keep_runs.append(r)
        state.runs = keep_runs
        emitter.emit_slot(found)
    if end_of_input:
        state.partials = []
    elif within is not None:
        state.partials = [p for p in state.partials if p.start_ts + within >= watermark]


def _enforce_caps(rule: CompiledRule, state: RuleState) -> None:
    if rule.partials == "latest":
        if state.partials:
            newest: dict[tuple[int, ...], _Partial] = {}
            for p in state.partials:
                current = newest.get(p.letters)
                if current is None or p.born > current.born:
                    newest[p.letters] = p
            state.partials = sorted(newest.values(), key=lambda p: p.born)
        if state.runs:
            _latest_strict(state)
    over = state.partial_count - rule.max_partials
    if over <= 0:
        return
    if state.partials:
        state.partials.sort(key=lambda p: p.born)
        drop = min(over, len(state.partials))
        state.dropped_partials += drop
        del state.partials[:drop]
        over -= drop
    while over > 0 and state.runs:
        oldest = min(state.runs, key=lambda r: r.born)
        take = min(over, len(oldest.entries))
        del oldest.entries[:take]
        state.dropped_partials += take
        over -= take
        if not oldest.entries:
            state.runs.remove(oldest)


def _latest_strict(state: RuleState) -> None:
    """Keep one alternative per pattern step: the newest run's, its most preferred one."""
    claimed: set[int] = set()
    for run in sorted(state.runs, key=lambda r: r.born, reverse=True):
        kept = []
        for entry in run.entries:
            if entry[0] < 0:
                kept.append(entry)
            elif entry[0] not in claimed:
                claimed.add(entry[0])
                kept.append(entry)
        run.entries = kept
    state.runs = [r for r in state.runs if r.entries or r.best is not None]


# ---------------------------------------------------------------- serialisation


def _encode(state: RuleState) -> bytes:
    nodes: dict[int, int] = {}
    node_rows: list[list[int]] = []
    events: dict[int, list[Any]] = {}

    def ref(node: _Binding | None) -> int:
        if node is None:
            return -1
        found = nodes.get(id(node))
        if found is not None:
            return found
        pending = []
        cur: _Binding | None = node
        while cur is not None and id(cur) not in nodes:
            pending.append(cur)
            cur = cur.parent
        for n in reversed(pending):
            parent = nodes[id(n.parent)] if n.parent is not None else -1
            e = n.event
            if e.pos not in events:
                events[e.pos] = [e.pos, e.id, e.stream, e.ts, e.fields]
            nodes[id(n)] = len(node_rows)
            node_rows.append([parent, n.place, e.pos])
        return nodes[id(node)]

    body = {
        "key": list(state.key) if state.key is not None else None,
        "pos": state.pos,
        "wm": _num_out(state.watermark),
        "r": state.resume,
        "drop": state.dropped_partials,
        "born": state.born,
        "hid": state.held_ids,
        "last": state.last_ts,
        "seen": state.events_seen,
        "p": [
            [ref(p.node), list(p.letters), sorted(p.blocked), list(p.supersedes),
             int(p.after_reluctant), p.start_pos, p.start_ts, p.born]
            for p in state.partials
        ],
        "h": [[h.id, ref(h.node), _num_out(h.deadline), int(h.superseded)] for h in state.held],
        "a": [
            [ref(a.node), [sorted(g) for g in a.guard_sets], sorted(a.blocked), a.deadline]
            for a in state.absences
        ],
        "s": [
            [r.start_pos, r.start_ts, ref(r.best), r.best_end, r.born,
             [[e[0], ref(e[1]), sorted(e[2])] for e in r.entries]]
            for r in state.runs
        ],
        "hist": list(state.history),
    }
    body["n"] = node_rows
    body["e"] = [events[k] for k in sorted(events)]
    payload = json.dumps(body, separators=(",", ":"), default=_json_default).encode("utf-8")
    flags = 0
    if len(payload) > _COMPRESS_OVER:
        payload = zlib.compress(payload, 1)
        flags |= _FLAG_ZLIB
    header = _HEADER.pack(_MAGIC, _FORMAT_VERSION, flags, state.fingerprint, zlib.crc32(payload))
    return header + payload


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if hasattr(value, "tolist") and callable(value.tolist):
        # numpy scalars and arrays from DataFrame batches: store the Python value.
        return value.tolist()
    raise StateFormatError(
        f"cannot store a {type(value).__name__} field value in rule state; events must carry "
        "JSON values (strings, numbers, booleans, null, lists)"
    )


def _num_out(value: float | None) -> Any:
    if value is None:
        return None
    if value == _INF:
        return "inf"
    return value


def _num_in(value: Any) -> float | None:
    if value is None:
        return None
    if value == "inf":
        return _INF
    return value


def _decode(data: bytes, rule: CompiledRule) -> RuleState:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise StateFormatError(f"rule state must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise StateFormatError(
            f"rule state for {rule.name} is truncated ({len(data)} bytes, header needs "
            f"{_HEADER.size})"
        )
    magic, version, flags, fingerprint, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise StateFormatError(f"rule state for {rule.name} does not start with {_MAGIC!r}")
    if version != _FORMAT_VERSION:
        raise StateFormatError(
            f"rule state for {rule.name} has format version {version}; this build reads "
            f"version {_FORMAT_VERSION}"
        )
    payload = data[_HEADER.size:]
    if zlib.crc32(payload) != crc:
        raise StateFormatError(f"rule state for {rule.name} is corrupt (checksum mismatch)")
    if fingerprint != rule.fingerprint:
        raise StateFormatError(
            f"rule state was written by a different compilation of rule {rule.name} (its "
            "pattern, variables, version or window changed); start the key from a fresh state"
        )
    try:
        if flags & _FLAG_ZLIB:
            payload = zlib.decompress(payload)
        body = json.loads(payload.decode("utf-8"))
        return _rebuild(body, rule)
    except StateFormatError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, zlib.error) as exc:
        raise StateFormatError(f"rule state for {rule.name} cannot be decoded: {exc}") from exc


def _rebuild(body: dict, rule: CompiledRule) -> RuleState:
    n_letters = len(rule.letters)
    events = {row[0]: _Event(row[0], row[1], row[2], row[3], row[4]) for row in body["e"]}
    nodes: list[_Binding] = []
    for parent, place, pos in body["n"]:
        if not 0 <= place < len(rule.places):
            raise StateFormatError(
                f"rule state for {rule.name} names pattern place #{place}, but the rule has "
                f"{len(rule.places)}; was it written by another version of the rule?"
            )
        nodes.append(_Binding(nodes[parent] if parent >= 0 else None, place, events[pos]))

    def node(i: int) -> _Binding | None:
        return nodes[i] if i >= 0 else None

    def letters(values: list[int]) -> tuple[int, ...]:
        for v in values:
            if not 0 <= v < n_letters:
                raise StateFormatError(
                    f"rule state for {rule.name} names pattern step {v}, but the rule has "
                    f"{n_letters}; was it written by another version of the rule?"
                )
        return tuple(values)

    state = RuleState(rule.fingerprint, rule.within_ms)
    state.key = tuple(body["key"]) if body["key"] is not None else None
    state.pos = body["pos"]
    state.watermark = _num_in(body["wm"])
    state.resume = body["r"]
    state.dropped_partials = body["drop"]
    state.born = body["born"]
    state.held_ids = body["hid"]
    state.last_ts = body["last"]
    state.events_seen = body["seen"]
    state.partials = [
        _Partial(node(n), letters(lt), frozenset(b), tuple(s), bool(ar), sp, st, born)
        for n, lt, b, s, ar, sp, st, born in body["p"]
    ]
    state.held = [_Held(i, node(n), _num_in(d), bool(s)) for i, n, d, s in body["h"]]
    state.absences = [
        _Absence(node(n), tuple(frozenset(g) for g in gs), frozenset(b), d)
        for n, gs, b, d in body["a"]
    ]
    state.runs = [
        _StrictRun(
            sp, st,
            [(letter if letter < 0 else letters([letter])[0], node(n), frozenset(g))
             for letter, n, g in entries],
            node(best), best_end, born,
        )
        for sp, st, best, best_end, born, entries in body["s"]
    ]
    state.history = list(body["hist"])
    return state
