"""The per-(rule, key) state of the NFA runtime and its bytes.

:class:`RuleState` holds a key's partial matches, held and pending matches and strict runs over
a shared buffer of binding lists (prefixes shared through their links, common suffixes through a
cohort's segments); :meth:`RuleState.to_bytes` stores it as a JSON body (each buffered event
once) in a ``VGRS`` frame of :class:`sketches.codec.StateCodec`.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby, repeat
from typing import Any

from cep.nfa.compiler import CompiledRule
from cep.nfa.errors import StateFormatError
from sketches.codec import StateCodec

__all__ = [
    "RuleState", "SharedRuns", "alike_starts", "history_only", "new_state", "settle",
    "shared_runs", "twin", "twin_start", "twins", "unshared", "with_history",
]

_FRAME = dict(
    fields="8s",
    byte_order=">",
    checksum="crc32",
    checksum_at="header",
    compress_over=512,
    name="rule state",
    error=StateFormatError,
)
_CODEC = StateCodec(b"VGRS", 2, **_FRAME)
"""Magic, format version, flags (zlib), the rule's fingerprint and a CRC-32 of the stored body,
then the JSON body (compressed when over 512 bytes). Version 2 stores cohorts with their
segments' shared tails; version 1 (one row per partial match) is still read."""
_CODEC_V1 = StateCodec(b"VGRS", 1, **_FRAME)
_INF = math.inf


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
    """One partial match under relaxed/any contiguity, as :attr:`RuleState.partials` lists it."""

    node: _Binding
    letters: tuple[int, ...]
    blocked: frozenset[int]
    supersedes: tuple[int, ...]
    after_reluctant: bool
    start_pos: int
    start_ts: int
    born: int


#: A segment of a cohort with at least this many members takes an event with one link for all
#: of them (its shared tail grows); a smaller one takes it with a link per member.
SHARED_TAIL_AT = 32
#: The ``ends`` and ``tails`` of a cohort of one partial match without a tail.
ONE_MEMBER: tuple[int, ...] = (1,)
NO_TAIL: tuple[_Binding | None, ...] = (None,)


def splice(head: _Binding | None, links: list[_Binding]) -> _Binding | None:
    """``head``'s binding list followed by ``links`` (a tail's chain, oldest first), as one
    persistent list: new links for ``links``, ``head``'s own links shared."""
    node = head
    for link in links:
        node = _Binding(node, link.place, link.event)
    return node


class _Cohort:
    """Partial matches (relaxed/any) at the same NFA position with the same flags.

    ``letters``, ``blocked``, ``supersedes`` and ``after_reluctant`` are shared; ``heads``,
    ``start_pos``, ``start_ts`` and ``born`` hold one entry per member, in born order, and
    ``earliest`` is the smallest ``start_ts``. A state's cohorts are in born order too, so its
    partial matches, oldest first, are the members of its cohorts in turn: the cap drops a
    prefix, and one step moves a whole cohort at once.

    The members are cut into *segments*: segment ``k`` ends before member ``ends[k]`` (the last
    end is the number of members), and a member's binding list is its head's list followed by
    the segment's *tail*, ``tails[k]``: a chain of links whose first has no parent (None when
    empty) that every member of the segment shares. When all the members of a segment of
    :data:`SHARED_TAIL_AT` or more take an event, the segment takes it with one link (member
    ``i``'s list is the parent's member ``i``'s list plus the event), so such a step costs a link
    per segment, not per partial match, and the common suffix is stored once. A smaller segment
    takes an event with a link per member, its tail first copied onto each member's list, and
    has no tail afterwards; neighbouring segments without a tail are one. Each cohort owns its
    lists (joining appends to the older cohort's lists; children get copies, C-level work);
    ``ends`` and ``tails`` are tuples, shared.
    """

    __slots__ = (
        "letters", "blocked", "supersedes", "after_reluctant", "heads", "ends", "tails",
        "start_pos", "start_ts", "born", "earliest",
    )

    def __init__(
        self,
        letters: tuple[int, ...],
        blocked: frozenset[int],
        supersedes: tuple[int, ...],
        after_reluctant: bool,
        heads: list[_Binding | None],
        ends: tuple[int, ...],
        tails: tuple[_Binding | None, ...],
        start_pos: list[int],
        start_ts: list[int],
        born: list[int] | range,
        earliest: int | None = None,
    ):
        self.letters = letters
        self.blocked = blocked
        self.supersedes = supersedes
        self.after_reluctant = after_reluctant
        self.heads = heads
        self.ends = ends
        self.tails = tails
        self.start_pos = start_pos
        self.start_ts = start_ts
        self.born = born
        self.earliest = min(start_ts) if earliest is None else earliest

    def __len__(self) -> int:
        return len(self.heads)

    def flags(self) -> tuple:
        """What the members share; neighbouring cohorts with equal flags are joined."""
        return (self.letters, self.blocked, self.supersedes, self.after_reluctant)

    def with_blocked(self, blocked: frozenset[int]) -> _Cohort:
        """The same members with other blocked guards (it takes over this cohort's lists)."""
        return _Cohort(
            self.letters, blocked, self.supersedes, self.after_reluctant, self.heads, self.ends,
            self.tails, self.start_pos, self.start_ts, self.born, self.earliest,
        )

    def segments(self) -> Iterator[tuple[int, int, _Binding | None]]:
        """``(first member, end, tail)`` per segment."""
        lo = 0
        for hi, tail in zip(self.ends, self.tails, strict=True):
            yield lo, hi, tail
            lo = hi

    def nodes(self) -> list[_Binding | None]:
        """Each member's whole binding list (new links for the tails; read only: it may be
        :attr:`heads` itself)."""
        heads, tails = self.heads, self.tails
        if len(tails) == 1 and tails[0] is None:
            return heads
        out: list[_Binding | None] = []
        for lo, hi, tail in self.segments():
            if tail is None:
                out += heads[lo:hi]
            else:
                links = tail.chain()
                out += [splice(head, links) for head in heads[lo:hi]]
        return out

    def taken(
        self, place: int, event: _Event
    ) -> tuple[list[_Binding | None], tuple[int, ...], tuple[_Binding | None, ...]]:
        """``(heads, ends, tails)`` of the members once each has taken ``event`` at ``place``
        (a new list of heads)."""
        heads, ends, tails = self.heads, self.ends, self.tails
        if len(tails) == 1:
            tail = tails[0]
            if len(heads) >= SHARED_TAIL_AT:
                return heads.copy(), ends, (_Binding(tail, place, event),)
            if tail is None:
                if len(heads) == 1:
                    return [_Binding(heads[0], place, event)], ends, tails
                return list(map(_Binding, heads, repeat(place), repeat(event))), ends, tails
        lo = 0
        for hi in ends:
            if hi - lo < SHARED_TAIL_AT:
                break
            lo = hi
        else:  # every segment takes the event with one link: the heads do not change
            return heads.copy(), ends, tuple([_Binding(tail, place, event) for tail in tails])
        # Some segments take the event member by member: a new list of heads, changed there.
        out_heads = heads.copy()
        out_ends: list[int] = []
        out_tails: list[_Binding | None] = []
        lo = 0
        for hi, tail in zip(ends, tails, strict=True):
            if hi - lo >= SHARED_TAIL_AT:
                out_ends.append(hi)
                out_tails.append(_Binding(tail, place, event))
                lo = hi
                continue
            if tail is not None:
                links = tail.chain()
                out_heads[lo:hi] = [
                    _Binding(splice(head, links), place, event) for head in heads[lo:hi]
                ]
            elif hi - lo == 1:
                out_heads[lo] = _Binding(heads[lo], place, event)
            else:
                out_heads[lo:hi] = map(_Binding, heads[lo:hi], repeat(place), repeat(event))
            if out_tails and out_tails[-1] is None:
                out_ends[-1] = hi
            else:
                out_ends.append(hi)
                out_tails.append(None)
            lo = hi
        return out_heads, tuple(out_ends), tuple(out_tails)

    def select(self, members: list[int]) -> _Cohort | None:
        """The cohort of the given members (indices, ascending), None when there are none."""
        if not members:
            return None
        if len(members) == len(self.heads):
            return self
        if len(self.tails) == 1:
            ends, tails = (len(members),), self.tails
        else:
            cuts: list[int] = []
            kept: list[_Binding | None] = []
            cut, shared = self.ends, self.tails
            k = 0
            for j, i in enumerate(members, 1):
                while i >= cut[k]:
                    k += 1
                tail = shared[k]
                if kept and kept[-1] is tail:
                    cuts[-1] = j
                else:
                    cuts.append(j)
                    kept.append(tail)
            ends, tails = tuple(cuts), tuple(kept)
        heads, start_pos, start_ts, born = self.heads, self.start_pos, self.start_ts, self.born
        return _Cohort(
            self.letters, self.blocked, self.supersedes, self.after_reluctant,
            [heads[i] for i in members], ends, tails, [start_pos[i] for i in members],
            [start_ts[i] for i in members], [born[i] for i in members],
        )

    def drop_oldest(self, count: int) -> _Cohort:
        """The cohort without its ``count`` oldest members (fewer than it has)."""
        if not count:
            return self
        ends = tuple([end - count for end in self.ends if end > count])
        return _Cohort(
            self.letters, self.blocked, self.supersedes, self.after_reluctant,
            self.heads[count:], ends, self.tails[len(self.tails) - len(ends):],
            self.start_pos[count:], self.start_ts[count:], self.born[count:],
        )

    def member(self, i: int) -> _Partial:
        k = bisect_right(self.ends, i)
        tail = self.tails[k]
        node = self.heads[i] if tail is None else splice(self.heads[i], tail.chain())
        return _Partial(
            node, self.letters, self.blocked, self.supersedes, self.after_reluctant,
            self.start_pos[i], self.start_ts[i], self.born[i],
        )


def count_members(cohorts: list[_Cohort]) -> int:
    """The number of partial matches in ``cohorts``."""
    n = 0
    for cohort in cohorts:
        n += len(cohort.heads)
    return n


def join_cohorts(cohorts: list[_Cohort]) -> list[_Cohort]:
    """``cohorts`` (in born order) with each run of neighbours that share their flags joined
    into the first of them, so a state holds few cohorts however its members arrived.

    Joining appends the newer members to the older cohort's lists, segments kept: its cost is
    the number of members that move, not the size of the cohort they join.
    """
    letters = None
    for cohort in cohorts:
        if cohort.letters == letters:
            break
        letters = cohort.letters
    else:
        return cohorts
    out: list[_Cohort] = []
    shared = None
    for cohort in cohorts:
        flags = cohort.flags()
        if not (out and flags == shared):
            out.append(cohort)
            shared = flags
            continue
        older = out[-1]
        base = len(older.heads)
        cut = cohort.ends
        moved = (base + cut[0],) if len(cut) == 1 else tuple([base + end for end in cut])
        if older.tails[-1] is cohort.tails[0]:
            # The same tail (none, mostly) on both sides: one segment.
            older.ends = older.ends[:-1] + moved
            older.tails += cohort.tails[1:]
        else:
            older.ends += moved
            older.tails += cohort.tails
        older.heads += cohort.heads
        older.start_pos += cohort.start_pos
        older.start_ts += cohort.start_ts
        if isinstance(older.born, range):
            older.born = list(older.born)
        older.born += cohort.born
        if cohort.earliest < older.earliest:
            older.earliest = cohort.earliest
    return out


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


class RuleState:
    """The mutable per-(rule, key) state: partial matches, held and pending matches, timers.

    Attributes
    ----------
    dropped_partials:
        Partial matches dropped because the key hit ``max_partials`` (oldest first).
    shared:
        True when the object may stand for several rules of a key at once: idle ``prev``
        states alike (the same counters and history, of rules with the same streams and
        ``prev`` depth) are one object, moved once per batch (:meth:`cep.nfa.processor.
        RuleProcessor.run_indexed`). Whoever changes a state otherwise takes its own copy first
        (:func:`unshared`). Not part of the stored state.

    Examples
    --------
    >>> from cep.events.event import Event
    >>> from cep.nfa.compiler import compile_rule
    >>> from cep.nfa.runtime import advance_watermark, process_event
    >>> from query_lang import parse
    >>> program = parse('''
    ... stream txn (card string, amount float, ts timestamp) time ts
    ... rule probe from txn by card pattern small big within 1h
    ...   define small as amount < 1, big as amount > 500
    ... ''')
    >>> rule = compile_rule(program.declarations[1])
    >>> state = new_state(rule)
    >>> process_event(rule, state, Event(0, "txn", 0, 0, {"card": "c1", "amount": 0.5}))
    []
    >>> state.partial_count, state.next_timer_ms
    (1, 3600001)
    >>> data = state.to_bytes()
    >>> data[:4], RuleState.from_bytes(data, rule).to_bytes() == data
    (b'VGRS', True)
    >>> later = RuleState.from_bytes(data, rule)
    >>> big = Event(1, "txn", 60_000, 1, {"card": "c1", "amount": 900.0})
    >>> [m.events for m in process_event(rule, later, big)]
    [{'small': [0], 'big': [1]}]
    >>> advance_watermark(rule, later, float("inf")), later.is_empty
    ([], True)
    """

    __slots__ = (
        "key", "pos", "watermark", "resume", "dropped_partials", "cohorts", "held",
        "absences", "_runs", "lazy_runs", "history", "born", "held_ids", "last_ts",
        "events_seen", "fingerprint", "within", "shared",
    )

    def __init__(self, fingerprint: bytes = b"\0" * 8, within: int | None = None) -> None:
        self.fingerprint = fingerprint
        self.within = within
        self.key: tuple | None = None
        self.pos = 0
        self.watermark: float | None = None
        self.resume = 0
        self.dropped_partials = 0
        # Partial matches under relaxed/any contiguity, oldest first (see _Cohort).
        self.cohorts: list[_Cohort] = []
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
        self.shared = False

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
    def partials(self) -> list[_Partial]:
        """Live partial matches under relaxed/any contiguity, oldest first (a copy)."""
        return [
            _Partial(node, c.letters, c.blocked, c.supersedes, c.after_reluctant, pos, ts, born)
            for c in self.cohorts
            for node, pos, ts, born in zip(c.nodes(), c.start_pos, c.start_ts, c.born, strict=True)
        ]

    @property
    def is_empty(self) -> bool:
        """True when nothing is pending, so the caller may drop the stored state."""
        return not (
            self.cohorts or self.held or self.absences or self._runs or self.lazy_runs
            or self.history
        )

    @property
    def partial_count(self) -> int:
        """Live partial matches (relaxed/any) or strict alternatives."""
        runs = self.runs
        n = count_members(self.cohorts)
        return n + sum(len(r.entries) for r in runs) if runs else n

    @property
    def next_timer_ms(self) -> int | None:
        """The earliest event time the watermark must pass for this state to change, or None.

        The watermark *passes* a deadline ``d`` when it exceeds it, so the returned value is
        ``d + 1``; call :func:`advance_watermark` with a watermark of at least that.
        """
        # The smallest finite deadline, found in one pass without lists (the timers ask every
        # busy state of a key after each batch).
        best = _INF
        for h in self.held:
            if h.deadline < best and not h.superseded:
                best = h.deadline
        for a in self.absences:
            if a.deadline < best:
                best = a.deadline
        within = self.within
        if within is not None:
            # Expiring partial matches produce no output but let the caller drop the state.
            for c in self.cohorts:
                due = c.earliest + within
                if due < best:
                    best = due
            runs = self.lazy_runs.runs if self.lazy_runs is not None else self._runs
            for r in runs:
                due = r.start_ts + within
                if due < best:
                    best = due
        return int(best) + 1 if best != _INF else None

    def to_bytes(self) -> bytes:
        """A compact, versioned encoding (header + JSON body); events stored once.

        Raises
        ------
        ValueError
            For a :attr:`shared` state, which stands for several rules: encode each rule's
            own (:func:`unshared`), under that rule's fingerprint.
        """
        if self.shared:
            raise ValueError("a shared rule state is stored per rule: unshared(rule, state)")
        return _encode(self)

    @classmethod
    def from_bytes(
        cls, data: bytes, rule: CompiledRule, *, fingerprint: bytes | None = None
    ) -> RuleState:
        """Decode :meth:`to_bytes` output for ``rule``. ``fingerprint``: the one the state
        was written under, when the bytes are a :func:`twin`'s of another rule (stored once
        for the twins of a key, see :meth:`cep.nfa.processor.RuleProcessor.encode`).

        Raises
        ------
        StateFormatError
            When the bytes are corrupt, of an unknown format version, or of another rule.
        """
        return _decode(data, rule, fingerprint)


def new_state(rule: CompiledRule, key: tuple | None = None) -> RuleState:
    """A fresh state for one key of ``rule`` (``key`` is filled from the first event if None)."""
    state = RuleState(rule.fingerprint, rule.within_ms)
    state.key = tuple(key) if key is not None else None
    return state


def history_only(state: Any) -> tuple | None:
    """What a state holding nothing but counters and a ``prev`` history (an idle ``prev``
    rule's, the most common state of a key) has besides that history, as a hashable row, or
    None when it holds more: ``(key, pos, watermark, resume, dropped, born, held ids, last
    time, events seen)``. Equal rows with equal histories are stored once per key, however
    many rules share them (:meth:`cep.nfa.processor.RuleProcessor.encode`)."""
    if type(state) is not RuleState or not state.history or (
        state.cohorts or state.held or state.absences or state._runs or state.lazy_runs
    ):
        return None
    return (
        None if state.key is None else tuple(state.key), state.pos, _num_out(state.watermark),
        state.resume, state.dropped_partials, state.born, state.held_ids, state.last_ts,
        state.events_seen,
    )


def with_history(rule: CompiledRule, row: Sequence[Any], history: Sequence[Any]) -> RuleState:
    """The state :func:`history_only` described by ``row``, for ``rule``, holding a copy of
    ``history``."""
    key, pos, watermark, resume, dropped, born, held_ids, last_ts, seen = row
    state = RuleState(rule.fingerprint, rule.within_ms)
    state.key = None if key is None else tuple(key)
    state.pos = pos
    state.watermark = _num_in(watermark)
    state.resume = resume
    state.dropped_partials = dropped
    state.born = born
    state.held_ids = held_ids
    state.last_ts = last_ts
    state.events_seen = seen
    state.history = list(history)
    return state


def settle(state: RuleState) -> None:
    """Forget what cannot matter any more, so that states that will behave alike are equal
    (and idle ones can be shared): ``born`` only orders the runs alive together, so a state
    with none restarts it at 0; a ``resume`` position the key's events have passed skips
    nothing, so it becomes 0. Strict rules' paths (the per-event runtime and the scan) call it
    at the end of every call, and restart ``born`` when a run is born with none alive."""
    if not (state.cohorts or state.held or state.absences or state._runs or state.lazy_runs):
        state.born = 0
    if state.resume and state.resume <= state.pos:
        state.resume = 0


def unshared(rule: CompiledRule, state: RuleState) -> RuleState:
    """``state`` itself, or when it is :attr:`RuleState.shared` a copy of its own for
    ``rule`` (a shared state holds only counters and a history)."""
    if not state.shared:
        return state
    row = history_only(state)
    if row is None:
        raise ValueError("a shared rule state holds more than a prev history")
    return with_history(rule, row, state.history)


def twin(rule: CompiledRule, state: RuleState) -> RuleState:
    """A state of ``rule`` equal to ``state``, a scanned strict rule's that holds nothing but
    counters, a ``prev`` history and runs left by the scan in abstract form
    (``lazy_runs``): those are shared, since no call changes them in place (the next scan
    carries them into runs of its own; reading them builds new ones)."""
    out = RuleState(rule.fingerprint, rule.within_ms)
    out.key = state.key
    out.pos = state.pos
    out.watermark = state.watermark
    out.resume = state.resume
    out.dropped_partials = state.dropped_partials
    out.born = state.born
    out.held_ids = state.held_ids
    out.last_ts = state.last_ts
    out.events_seen = state.events_seen
    out.history = list(state.history)
    out.lazy_runs = state.lazy_runs
    return out


class SharedRuns:
    """Strict runs several twin states hold as one (:attr:`RuleState.lazy_runs`), as read
    back from their stored bytes: no call changes them in place; a state that needs its own
    (:attr:`RuleState.runs`) gets a copy."""

    __slots__ = ("runs",)

    def __init__(self, runs: list[_StrictRun]) -> None:
        self.runs = runs

    def concrete(self) -> list[_StrictRun]:
        return [
            _StrictRun(r.start_pos, r.start_ts, list(r.entries), r.best, r.best_end, r.born)
            for r in self.runs
        ]


def shared_runs(state: RuleState) -> RuleState:
    """``state`` (just decoded, holding nothing but counters, a history and strict runs) with
    its runs in the form its :func:`twin` copies share."""
    if state._runs:
        state.lazy_runs = SharedRuns(state._runs)
        state._runs = []
    return state


def twin_start(state: RuleState) -> tuple | None:
    """What a state :func:`twin` may copy (counters, a ``prev`` history and runs in shared
    form, or none) is, as a tuple whose first item, its runs object, compares by identity
    and the rest by value; None for any other state."""
    if state.cohorts or state.held or state.absences or state._runs or state.shared:
        return None
    return (state.lazy_runs, state.key, state.pos, state.watermark, state.resume,
            state.dropped_partials, state.born, state.held_ids, state.last_ts,
            state.events_seen, state.history)


def alike_starts(a: tuple, b: tuple) -> bool:
    """Whether two :func:`twin_start` tuples describe equal states."""
    return a[0] is b[0] and a[1:] == b[1:]


def twins(a: RuleState, b: RuleState) -> bool:
    """Whether two states that :func:`twin` may copy are equal: the same abstract runs (one
    object) and equal counters and history."""
    if a.lazy_runs is None:
        return False
    start_a, start_b = twin_start(a), twin_start(b)
    return start_a is not None and start_b is not None and alike_starts(start_a, start_b)


# ---------------------------------------------------------------- bytes


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
        # Per cohort: flags, then per member (head, start position, start time, born), then
        # per segment (end, tail).
        "p": [
            [list(c.letters), sorted(c.blocked), list(c.supersedes), int(c.after_reluctant),
             [ref(h) for h in c.heads], list(c.start_pos), list(c.start_ts), list(c.born),
             list(c.ends), [ref(t) for t in c.tails]]
            for c in state.cohorts
        ],
        "h": [[h.id, ref(h.node), _num_out(h.deadline), int(h.superseded)] for h in state.held],
        "a": [
            [ref(a.node), [sorted(g) for g in a.guard_sets], sorted(a.blocked), a.deadline]
            for a in state.absences
        ],
        "s": [
            [r.start_pos, r.start_ts, ref(r.best), r.best_end, r.born,
             [[e[0], ref(e[1]), sorted(e[2])] for e in r.entries]]
            # Runs shared with twins are built for the bytes, and left shared.
            for r in (state._runs if state.lazy_runs is None else state.lazy_runs.concrete())
        ],
        "hist": list(state.history),
    }
    body["n"] = node_rows
    body["e"] = [events[k] for k in sorted(events)]
    payload = json.dumps(body, separators=(",", ":"), default=_json_default).encode("utf-8")
    return _CODEC.encode(payload, state.fingerprint)


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


def _decode(data: bytes, rule: CompiledRule, written: bytes | None = None) -> RuleState:
    version1 = isinstance(data, bytes | bytearray | memoryview) and bytes(data[:5]) == b"VGRS\1"
    codec = _CODEC_V1 if version1 else _CODEC
    (fingerprint,), payload = codec.decode(data, context=f"rule {rule.name}")
    if (fingerprint if written is None else written) != rule.fingerprint:
        raise StateFormatError(
            f"rule state was written by a different compilation of rule {rule.name} (its "
            "pattern, variables, version or window changed); start the key from a fresh state"
        )
    try:
        body = json.loads(payload.tobytes().decode("utf-8"))
        return _rebuild(body, rule, version1)
    except StateFormatError:
        raise
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise StateFormatError(f"rule state for {rule.name} cannot be decoded: {exc}") from exc


def _rebuild(body: dict, rule: CompiledRule, version1: bool) -> RuleState:
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
    if version1:
        # Rows are partial matches oldest first; a run of rows with the same flags is a cohort.
        for (lt, b, s, ar), run in groupby(body["p"], key=lambda row: row[1:5]):
            rows = list(run)
            state.cohorts.append(_Cohort(
                letters(lt), frozenset(b), tuple(s), bool(ar), [node(row[0]) for row in rows],
                (len(rows),), NO_TAIL, [row[5] for row in rows], [row[6] for row in rows],
                [row[7] for row in rows],
            ))
    else:
        for lt, b, s, ar, heads, start_pos, start_ts, born, ends, tails in body["p"]:
            n = len(heads)
            if not (
                n and len(start_pos) == len(start_ts) == len(born) == n
                and len(ends) == len(tails) and ends and ends[-1] == n
                and all(lo < hi for lo, hi in zip([0, *ends], ends, strict=False))
            ):
                raise StateFormatError(
                    f"rule state for {rule.name} has a malformed cohort of partial matches"
                )
            state.cohorts.append(_Cohort(
                letters(lt), frozenset(b), tuple(s), bool(ar), [node(h) for h in heads],
                tuple(ends), tuple([node(t) for t in tails]), start_pos, start_ts, born,
            ))
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
