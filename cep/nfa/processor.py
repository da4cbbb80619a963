"""Per-key processing of compiled rules: the :class:`cep.events.KeyedProcessor` behind both engines.

A :class:`RuleProcessor` serves rules that share one key definition. The embedded engine keeps
each key's :class:`KeyState` as a live object; the Spark operator stores it as bytes between
calls (:meth:`RuleProcessor.process`). Both run the same :meth:`RuleProcessor.run_events` and
:meth:`RuleProcessor.fire_timers`, so both engines report the same matches.
"""

from __future__ import annotations

import json
import math
import operator
import struct
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, groupby
from typing import Any, Protocol

from cep.events.event import (
    STREAM_FIELD,
    EngineError,
    Event,
    StateError,
    StreamSchema,
)
from cep.events.keyed import KeyedProcessorBase, ProcessResult, late_letter, validate_raw
from cep.events.watermark import END_OF_INPUT, NO_WATERMARK
from cep.nfa import runtime, strict
from cep.nfa.state import (
    RuleState,
    alike_starts,
    history_only,
    shared_runs,
    twin,
    twin_start,
    twins,
    unshared,
    with_history,
)
from cep.nfa.touches import advance_class
from cep.nfa.touches import event_touches as touches_of
from query_lang import ast
from query_lang.ast import StreamDecl
from sketches.codec import StateCodec

__all__ = [
    "NOT_REGISTERED",
    "KeyState",
    "RuleProcessor",
    "RuleRuntime",
    "key_signature",
    "must_see_every_event",
    "start_bits",
]

NOT_REGISTERED = object()
"""Mask value for a rule that was registered after the event arrived: the rule skips it."""

_CODEC = StateCodec(b"VGKS", 2, fields="qI", name="key state", error=StateError)
"""Magic, format version, the key's watermark and its number of rule entries, then the body.
Version 2 stores a rule state equal to the one before it (a :func:`~cep.nfa.state.twin`) as
a reference, and each idle row's members list as a blob after the body; version 1 (every
state whole, the members inside the body) is still read."""
_CODEC_V1 = StateCodec(b"VGKS", 1, fields="qI", name="key state", error=StateError)
_RULE_HEAD = struct.Struct("<HII")
"""A rule entry: its name's length, its version and its state's length in bytes, or
:data:`_TWIN`; then the name and the state (or the fingerprint the twin was written under)."""
_TWIN = 0xFFFFFFFF
_IDLE_PLANS = 1024
"""Idle-row plans a processor keeps (:meth:`RuleProcessor._idle_plan`), forgotten all at once
when full."""
_FINGERPRINT = 8
_BLOB = struct.Struct("<I")


class RuleRuntime(Protocol):
    """The NFA runtime functions the processor drives (``cep.nfa.runtime``)."""

    def new_state(self, rule: Any, key: tuple | None = None) -> Any: ...

    def process_event(
        self, rule: Any, state: Any, event: Event, mask: int | None = None
    ) -> list: ...

    def advance_watermark(self, rule: Any, state: Any, watermark_ms: int) -> list: ...

    def state_from_bytes(self, data: bytes, rule: Any) -> Any: ...


class _DefaultRuntime:
    """Adapter over ``cep.nfa.runtime``, imported on first use."""

    def __init__(self) -> None:
        self._rt = runtime
        self.new_state = runtime.new_state
        self.process_event = runtime.process_event
        self.advance_watermark = runtime.advance_watermark

    def state_from_bytes(self, data: bytes, rule: Any) -> Any:
        return self._rt.RuleState.from_bytes(data, rule)


def key_signature(rule: Any) -> tuple:
    """A hashable description of a rule's key definition; rules with equal ones share keys."""
    fields = tuple(sorted((stream, tuple(names)) for stream, names in rule.key_fields.items()))
    var_keys = getattr(rule, "var_keys", None) or {}
    if not var_keys:
        return fields
    # Per-step keys (`define v as ... by f`) make a rule's keys its own.
    return (fields, rule.name)


@dataclass
class KeyState:
    """Everything one partition key remembers between calls.

    Attributes
    ----------
    rules:
        Rule name -> the runtime's per-key state of that rule (absent when empty).
    pending:
        Events accepted but not yet released (their time is above the watermark); used by
        :meth:`RuleProcessor.process` only, the embedded engine buffers globally.
    watermark:
        The last watermark this key was advanced to; events below it are late.
    max_ts:
        Largest event time per stream seen for this key (for a watermark of its own when the
        caller supplies none).
    unseen:
        Per pending event (by ``seq``), the rules that must not see it: rules that started
        fresh (added, or reset to a new version) after it was buffered, as a rule registered
        in the embedded engine does not see the events its reorder buffer holds.
    busy:
        Names of the rules whose state holds more than a ``prev`` history (partial matches,
        runs, deadlines), or ``None`` when not known; kept by :meth:`RuleProcessor.run_indexed`
        so that a key's timers need not look at its idle rules. Not part of the stored state.
    unique:
        Per rule with ``unique``: the values of the matches it reported (JSON text) -> the
        end time of the newest such match, in the order they were last reported.
    groups:
        The idle states that scanned rules alike shared when the state was decoded, or that a
        scan gave rules alike new to the key, with those rules (:meth:`RuleProcessor.encode`
        writes a group still intact at once, as it was read). Not part of the stored state.
    """

    rules: dict[str, Any] = field(default_factory=dict)
    pending: list[Event] = field(default_factory=list)
    watermark: int = NO_WATERMARK
    max_ts: dict[str, int] = field(default_factory=dict)
    unseen: dict[int, frozenset[str]] = field(default_factory=dict)
    busy: dict[str, None] | None = field(default=None, compare=False, repr=False)
    unique: dict[str, OrderedDict[str, int]] = field(default_factory=dict)
    groups: list[tuple[Any, _Group]] = field(default_factory=list, compare=False, repr=False)

    def busy_rules(self) -> dict[str, None]:
        """:attr:`busy` (an ordered set), computed when not known."""
        if self.busy is None:
            self.busy = {name: None for name, st in self.rules.items() if not _idle(st)}
        return self.busy

    def next_timer_ms(self) -> int | None:
        """The earliest event time at which the key must be woken, or ``None``."""
        rules = self.rules
        times = [
            t for name in self.busy_rules()
            if (st := rules.get(name)) is not None and (t := st.next_timer_ms) is not None
        ]
        if self.pending:
            times.append(min(e.ts for e in self.pending))
        return min(times) if times else None

    @property
    def is_empty(self) -> bool:
        return not self.rules and not self.pending and not self.unique


class RuleProcessor(KeyedProcessorBase):
    """Runs compiled rules that share one key definition, one key at a time.

    Parameters
    ----------
    rules:
        Compiled rules (``cep.nfa.compiler.CompiledRule``); all must have the same ``key_fields``.
    streams:
        Stream name -> declaration (or prepared :class:`StreamSchema`), for validating raw events.
    lateness_ms:
        Overrides every stream's declared lateness when given.
    runtime:
        The NFA runtime; defaults to ``cep.nfa.runtime`` (tests pass a double).
    dropped_partials:
        Counter (rule name -> partial matches dropped by the ``max_partials`` cap) to which the
        counts of rule states are added when they are discarded; the live states keep their own.
    fast_strict:
        Let :meth:`run_batch` run rules that :func:`cep.nfa.strict.qualifies` as a column-wise scan
        (with the default runtime only); the result is the same either way.

    Attributes
    ----------
    tables:
        The tables the rules look up (``cep.tables.Tables``), for a caller that keeps their
        state beside the keys' (the Spark operator); ``None`` when the rules read none.

    Examples
    --------
    >>> from query_lang import parse
    >>> from query_lang.ast import RuleDecl, StreamDecl
    >>> from cep.nfa import compile_rule
    >>> module = parse(
    ...     "stream txn (card string, amount float, ts timestamp) time ts\\n"
    ...     "rule probe from txn by card pattern small big "
    ...     "define small as amount < 1, big as amount > 500\\n")
    >>> streams = {s.name: s for s in module.of_type(StreamDecl)}
    >>> processor = RuleProcessor([compile_rule(module.of_type(RuleDecl)[0], streams=streams)],
    ...                           streams)
    >>> events = [
    ...     {"stream": "txn", "card": "c1", "amount": 0.5, "ts": "2026-01-01T00:00:01Z"},
    ...     {"stream": "txn", "card": "c1", "amount": 900.0, "ts": "2026-01-01T00:00:02Z"},
    ... ]
    >>> for position, event in enumerate(events):
    ...     event["_seq"] = position  # input position: the tie-breaker, and the id here
    >>> result = processor.process(("c1",), None, events, watermark_ms=None)
    >>> [(m["name"], m["events"], m["end"]) for m in result.outputs]
    [('probe', {'small': [0], 'big': [1]}, '2026-01-01T00:00:02.000Z')]
    >>> result.state is None  # nothing is left waiting on this key, so it keeps no state
    True
    """

    def __init__(
        self,
        rules: Sequence[Any],
        streams: Mapping[str, StreamDecl | StreamSchema],
        *,
        lateness_ms: int | None = None,
        runtime: RuleRuntime | None = None,
        dropped_partials: Counter[str] | None = None,
        suppressed: Counter[str] | None = None,
        fast_strict: bool = True,
    ) -> None:
        if not rules:
            raise EngineError("a RuleProcessor needs at least one rule")
        self.tables: Any = None
        signature = key_signature(rules[0])
        for rule in rules[1:]:
            if key_signature(rule) != signature:
                raise EngineError(
                    f"rules '{rules[0].name}' and '{rule.name}' are partitioned differently; "
                    "give them separate processors"
                )
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise EngineError(f"duplicate rule names in one processor: {names}")
        self.rules: tuple[Any, ...] = tuple(rules)
        self.key_fields: dict[str, tuple[str, ...]] = {
            stream: tuple(fields) for stream, fields in rules[0].key_fields.items()
        }
        self.schemas: dict[str, StreamSchema] = {
            name: decl
            if isinstance(decl, StreamSchema)
            else StreamSchema.from_decl(decl, lateness_ms=lateness_ms)
            for name, decl in streams.items()
        }
        self.runtime: RuleRuntime = runtime if runtime is not None else _DefaultRuntime()
        self._fast: frozenset[int] = frozenset()
        if fast_strict and runtime is None:
            self._fast = frozenset(i for i, r in enumerate(self.rules) if strict.qualifies(r))
        by_stream: dict[str, list[tuple[int, Any]]] = {}
        for index, rule in enumerate(self.rules):
            for stream in rule.streams:
                by_stream.setdefault(stream, []).append((index, rule))
        self._by_stream = {s: tuple(v) for s, v in by_stream.items()}
        self._must_see = tuple(must_see_every_event(rule) for rule in self.rules)
        first = self.rules[0]
        self._keys_of = first.keys_of if getattr(first, "var_keys", None) else None
        self._start_bits = tuple(start_bits(rule) for rule in self.rules)
        #: Per rule, the class of the masks of events that cannot start it, when such an event
        #: matters to it only where it has a state (it need not see every event and is not
        #: run as a scan): see advance_class. And those rules by name -> index.
        self._advance_class = tuple(
            None if i in self._fast or self._must_see[i]
            else advance_class(rule, self._start_bits[i])
            for i, rule in enumerate(self.rules)
        )
        self._advancing_by_name = {
            rule.name: i for i, rule in enumerate(self.rules) if self._advance_class[i] is not None
        }
        # Scanned rules with a `prev` history, by index -> what their idle states share when
        # alike: the history's depth and the streams moving it (see RuleState.shared).
        self._share_sig: dict[int, tuple[int, frozenset[str]]] = {
            i: (self.rules[i].prev_depth, frozenset(self.rules[i].streams))
            for i in self._fast if self.rules[i].prev_depth
        }
        self._share_by_name = {self.rules[i].name: sig for i, sig in self._share_sig.items()}
        self._fast_by_name = {self.rules[i].name: i for i in self._fast}
        self._fast_order = tuple(sorted(self._fast))
        self._fast_names = frozenset(self._fast_by_name)
        bits_sigs = {i: strict.bits_signature(self.rules[i]) for i in self._fast}
        alike = Counter(bits_sigs.values())
        #: Scanned rule index -> its bits signature, when another rule has the same one (their
        #: condition bits are computed once per key and batch).
        self._bits_sig = {
            i: sig for i, sig in bits_sigs.items() if sig is not None and alike[sig] > 1
        }
        idle_sigs = {i: strict.idle_signature(self.rules[i]) for i in self._bits_sig}
        alike = Counter(idle_sigs.values())
        #: The same for :func:`strict.stays_idle`: rules that answer it alike for equal bits.
        self._idle_sig = {i: sig for i, sig in idle_sigs.items() if alike[sig] > 1}
        #: Scanned rule index -> the first scanned rule alike in all its scan decides on
        #: (conditions, transitions, window, caps and what their idle states share; only the
        #: name and what a match reports may differ): on a key where both hold the same state
        #: and an event may start both at the same place, the first one's scan stands for the
        #: other's unless it reports a match (see :meth:`_visits`).
        self._lead: dict[int, int] = {}
        leads: dict[tuple, int] = {}
        for i in self._fast_order:
            if i in self._idle_sig and i in self._share_sig:
                rule = self.rules[i]
                alike = (self._share_sig[i], self._idle_sig[i], rule.within_ms, rule.partials,
                         rule.skip, rule.skip_var)
                lead = leads.setdefault(alike, i)
                if lead != i:
                    self._lead[i] = lead
        self._leads = frozenset(self._lead.values())
        #: Scanned rule index -> what, besides its conditions' bits, decides where its scan
        #: leaves a state (strict transitions, window, caps, skip, history), when another
        #: rule shares it: on a key where such rules start from equal states and get equal
        #: bits, the first one's scan stands for the others' unless it reports a match.
        follows = {
            i: (strict.transitions_signature(self.rules[i]), self.rules[i].within_ms,
                self.rules[i].partials, self.rules[i].skip, self.rules[i].skip_var,
                self.rules[i].prev_depth, frozenset(self.rules[i].streams))
            for i in self._fast
        }
        alike = Counter(follows.values())
        self._follow_sig = {i: sig for i, sig in follows.items() if alike[sig] > 1}
        self._rule_by_name = {rule.name: rule for rule in self.rules}
        self._versions = {rule.name: rule.version for rule in self.rules}
        # The rules and their versions, as a key's state records them beside pending events.
        self._rules_list = [[rule.name, rule.version] for rule in self.rules]
        self._rules_bytes = json.dumps(
            self._rules_list, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
        self.dropped_partials: Counter[str] = (
            dropped_partials if dropped_partials is not None else Counter()
        )
        #: Matches not reported because of the rule's ``unique`` (per rule name).
        self.suppressed: Counter[str] = suppressed if suppressed is not None else Counter()
        self.touched = 0
        """(rule, event) pairs looked at so far: per event, the rules offered it one by one,
        and the events a scan ran (what a rule index saves shows here)."""
        #: Members list of an idle row -> :meth:`_idle_plan`'s plan for it.
        self._idle_plans: dict[tuple | bytes, _IdlePlan] = {}
        #: Names of rules alike a scan gave one new idle state -> their :class:`_Group`.
        self._made_groups: dict[tuple[str, ...], _Group] = {}

    @property
    def multi_key(self) -> bool:
        """Whether an event may belong to several keys (steps with their own ``by``)."""
        return self._keys_of is not None

    @property
    def must_see(self) -> tuple[bool, ...]:
        """Per rule, whether it must be shown events whose columnar mask is 0
        (:func:`must_see_every_event`)."""
        return self._must_see

    def advance_class(self, index: int) -> int | None:
        """When an event that cannot start rule ``index`` matters to it only on a key where it
        has a partial match: the class its masks of such events share with other rules
        (:func:`cep.nfa.touches.advance_class`); else None."""
        return self._advance_class[index]

    def start_bits_of(self, index: int) -> int:
        """Mask bits of the variables a match of rule ``index`` can begin with
        (:func:`start_bits`)."""
        return self._start_bits[index]

    @property
    def scanned(self) -> frozenset[int]:
        """Indexes (in :attr:`rules`) of the rules :meth:`run_batch` runs as a column-wise scan."""
        return self._fast

    @property
    def streams(self) -> frozenset[str]:
        """Streams read by at least one of the rules."""
        return frozenset(self._by_stream)

    # ------------------------------------------------------------------ keys

    def key_of(self, event: Mapping[str, Any]) -> tuple | None:
        """The partition key of a raw event (a dict with a ``stream`` field), or ``None``."""
        fields = self.key_fields.get(event.get(STREAM_FIELD))  # type: ignore[arg-type]
        if fields is None:
            return None
        key = tuple(event.get(name) for name in fields)
        return None if any(v is None for v in key) else key

    def keys_of(self, event: Mapping[str, Any]) -> list[tuple]:
        """Every partition key of a raw event: one, or several when steps have their own
        ``by`` (the event is considered under each key it yields); empty when a key is null."""
        stream = event.get(STREAM_FIELD)
        if self._keys_of is None or not isinstance(stream, str):
            key = self.key_of(event)
            return [] if key is None else [key]
        return [k for k in self._keys_of(stream, event) if None not in k]

    def keys_of_event(self, event: Event) -> list[tuple]:
        """:meth:`keys_of` for a validated event."""
        if self._keys_of is None:
            key = self.key_of_event(event)
            return [] if key is None else [key]
        return [k for k in self._keys_of(event.stream, event.fields) if None not in k]

    def key_of_event(self, event: Event) -> tuple | None:
        """The partition key of a validated event, or ``None`` when a key field is null."""
        fields = self.key_fields.get(event.stream)
        if fields is None:
            return None
        values = event.fields
        if len(fields) == 1:
            value = values.get(fields[0])
            return None if value is None else (value,)
        key = tuple(values.get(name) for name in fields)
        return None if None in key else key

    def missing_key_detail(self, event: Event) -> str:
        """Why :meth:`key_of_event` (or :meth:`keys_of_event`) gave no key, for the dead
        letter."""
        fields = self.key_fields.get(event.stream, ())
        missing = [n for n in fields if event.fields.get(n) is None]
        rules = ", ".join(rule.name for _, rule in self._by_stream.get(event.stream, ()))
        if not missing and self._keys_of is not None:
            # The rule's own `by` is there: every step's key the event could take is null.
            first = self.rules[0]
            steps = sorted({
                ", ".join(names) for var, names in first.var_keys.items()
                if first.conditions[first.variables.index(var)].stream in (None, event.stream)
            })
            return (f"every step's key of this event is missing or null "
                    f"({'; '.join(steps)}) (rules: {rules})")
        return (
            f"key field(s) {', '.join(repr(m) for m in missing)} missing or null (rules: {rules})"
        )

    # ------------------------------------------------------------------ the shared core

    def wants(self, stream: str) -> bool:
        """Whether any rule reads events of ``stream``."""
        return stream in self._by_stream

    def run_events(
        self,
        key: tuple,
        state: KeyState,
        items: Iterable[tuple[Event, Sequence[int] | None]],
        outputs: list[dict[str, Any]],
    ) -> None:
        """Feed released events of one key, in ``(ts, seq)`` order, to every rule reading them.

        ``items`` pairs each event with its per-rule columnar masks (aligned with
        :attr:`rules`) or ``None`` to evaluate every condition row-wise. A rule whose mask is 0
        is skipped unless it needs every event (strict contiguity, ``prev``, negation).
        The runtime fires a key's deadlines that an event's time passes before taking the
        event, so where the caller's watermark happens to stand never changes what a key
        reports.
        """
        self._run_rules(key, state, items, outputs, frozenset())

    def run_batch(
        self,
        jobs: Sequence[tuple[tuple, KeyState, Sequence[tuple[Event, Sequence[int] | None]]]],
        outputs: list[dict[str, Any]],
    ) -> None:
        """:meth:`run_events` for several keys: ``(key, state, items)`` per key.

        Rules that :func:`cep.nfa.strict.qualifies` are run for all keys at once: their conditions
        are evaluated column-wise over every key's events and each key's runs advance by
        :func:`cep.nfa.strict.process_events`. The outputs equal those of :meth:`run_events` called
        per key, in the order that matters (per rule, keys in the order given).
        """
        fast = self._fast
        for _, state, _ in jobs:
            state.busy = None
        if len(fast) < len(self.rules):
            for key, state, items in jobs:
                self._run_rules(key, state, items, outputs, fast)
        if not fast:
            return

        new_state = self.runtime.new_state
        for index in sorted(fast):
            rule = self.rules[index]
            streams = rule.streams
            work = []
            for key, state, items in jobs:
                events = [
                    e
                    for e, masks in items
                    if e.stream in streams
                    and (masks is None or masks[index] is not NOT_REGISTERED)
                ]
                if events:
                    st = state.rules.get(rule.name)
                    work.append((key, state, st, events))
            if not work:
                continue
            bits = strict.condition_bits(
                rule, [(st.history if st is not None else (), ev) for _, _, st, ev in work]
            )
            for (key, state, st, events), key_bits in zip(work, bits, strict=True):
                if st is None:
                    st = state.rules[rule.name] = new_state(rule, key)
                elif st.shared:
                    st = state.rules[rule.name] = unshared(rule, st)
                self.touched += len(events)
                found = strict.process_events(rule, st, events, key_bits)
                if found:
                    self._report(outputs, found, rule, state)
                if st.is_empty:
                    self._retire(state.rules, rule.name)

    def run_indexed(
        self,
        jobs: Sequence[tuple[tuple, KeyState, Sequence[tuple[Event, Sequence[Any], int]]]],
        outputs: list[dict[str, Any]],
        slots: Sequence[int],
    ) -> None:
        """:meth:`run_batch` where each event names the rules it may touch.

        ``jobs`` holds per key ``(key, state, items)``; each item is ``(event, touches,
        width, advances)``: ``touches`` the ``(rule index, mask)`` pairs of the rules whose
        columnar mask for the event is not 0, and of every rule that must see every event and
        is not run as a scan, in index order; ``width`` the number of engine slots when the
        event arrived (a rule in slot ``slots[i] >= width`` was registered later and skips
        it); ``advances`` None, or by class (:meth:`advance_class`) the masks of the rules the
        event can only advance, looked up for those that have a state on the key (and are not
        among ``touches`` already: the event may begin one).
        Rules not named are not run on the event: a mask of 0 fits no variable. A scanned
        rule (strict contiguity) sees every event of its streams, but runs only from the first
        event that may start it, or from the first one when a run is live; before that the
        key's events only move its ``prev`` history. The outputs equal :meth:`run_batch`'s,
        and so do the states left (:attr:`KeyState.busy` is kept up to date besides).
        """
        fast = self._fast
        rules = self.rules
        must_see = self._must_see
        start = self._start_bits
        advancing = self._advancing_by_name
        classes = self._advance_class
        process_event = self.runtime.process_event
        new_state = self.runtime.new_state
        touched = 0
        scans = []
        for key, state, items in jobs:
            rule_states = state.rules
            busy = state.busy
            ran: dict[str, Any] = {}
            firsts: dict[int, int] = {}
            # The rules that may want the events they can only advance (Touches.advances):
            # those with a state on the key, by index -> (slot, class): the busy ones (a state
            # left idle is dropped at the end of a key's turn) and those run in this turn.
            waiting = None
            for position, (event, touches, width, advances) in enumerate(items):
                if advances:
                    if waiting is None:
                        busy = state.busy_rules()  # (computed now if not known: kept from here)
                        waiting = {
                            i: (slots[i], classes[i]) for i in (
                                advancing[name] for name in (*busy, *ran) if name in advancing
                            )
                        }
                    if waiting:
                        more = [(i, mask) for i, (slot, c) in waiting.items()
                                if (mask := advances.get(c)) is not None and slot < width]
                        if more:
                            have = {i for i, _ in touches}
                            touches = sorted((*touches, *(p for p in more if p[0] not in have)))
                for index, mask in touches:
                    if index in fast:
                        if index not in firsts and (mask is None or mask & start[index]):
                            firsts[index] = position
                        continue
                    rule = rules[index]
                    touched += 1
                    if mask is not None and not must_see[index]:
                        if mask == 0:
                            continue
                        # Nothing pending for this key and the event cannot begin a match.
                        if not mask & start[index] and rule.name not in rule_states:
                            continue
                    name = rule.name
                    st = rule_states.get(name)
                    if st is None:
                        st = rule_states[name] = new_state(rule, key)
                        if waiting is not None and name in advancing:
                            waiting[index] = (slots[index], classes[index])
                    found = process_event(rule, st, event, mask)
                    ran[rule.name] = st
                    if found:
                        self._report(outputs, found, rule, state)
                    if busy is not None:
                        if _idle(st):
                            busy.pop(rule.name, None)
                        else:
                            busy[rule.name] = None
            for name in [n for n, st in ran.items() if st.is_empty]:
                self._retire(rule_states, name)
                if busy is not None:
                    busy.pop(name, None)
            if fast:
                scans.append((key, state, items, firsts))
        self.touched += touched
        if scans:
            self._scan_indexed(scans, outputs, slots)

    def _scan_indexed(
        self,
        scans: Sequence[tuple[tuple, KeyState, Sequence[tuple[Event, Any, int]], dict[int, int]]],
        outputs: list[dict[str, Any]],
        slots: Sequence[int],
    ) -> None:
        """The scanned rules' part of :meth:`run_indexed`: ``(key, state, items, firsts)`` per
        key, ``firsts`` the position in ``items`` of the first event that may start each rule.

        A key's idle ``prev`` rules alike (same streams and depth, same counters and history)
        hold one shared state (:attr:`RuleState.shared`), moved once per key here
        (:meth:`_visits`) and not looked at by its rules unless an event may start them. Such
        a rule's scan reads its condition bits first (computed once per key for rules with the
        same conditions, :class:`_BitsWanted`): when its runs end within the call and report
        nothing (:func:`strict.stays_idle`), the shared state is where the scan leaves it;
        otherwise it takes its own copy, runs, and rejoins the shared state when its scan
        leaves it equal to it."""
        rules = self.rules
        new_state = self.runtime.new_state
        share = self._share_sig
        newest_slot = max(slots[i] for i in self._fast)
        keys = [_KeyScan(key, state, items, firsts) for key, state, items, firsts in scans]
        visits: dict[int, list[_KeyScan]] = {}
        for ks in keys:
            for index in self._visits(ks, newest_slot):
                visits.setdefault(index, []).append(ks)
        leads = self._leads
        columns: dict = {}  # the keys' field values, read once for all the rules (condition_bits)
        rejoin = []
        for index in self._fast_order:
            visited = visits.get(index)
            if not visited:
                continue
            rule = rules[index]
            name, streams, depth, slot = rule.name, rule.streams, rule.prev_depth, slots[index]
            sig = share.get(index)
            bsig = self._bits_sig.get(index)
            own = frozenset(streams)
            # Per key: (key scan, state, events to run, bits source, cut, shared state): the
            # source from `wanted`, the events starting at `cut` in it.
            work = []
            wanted = _BitsWanted(bsig)
            for ks in visited:
                held = ks.held
                st = held.get(name)
                first = ks.firsts.get(index)
                everything = ks.everything
                if st is not None and st in ks.moved:
                    if first is None:
                        continue  # moved already, once for all the rules sharing it
                    # An event may start the rule: run its bits first, and copy the shared
                    # state only when the scan does more than move it.
                    history = ks.before[id(st)][1]
                    work.append((ks, None, None, wanted.add(ks, history, everything), first, st))
                    continue
                if first is None and ks.width > slot and ks.present in own and (
                    st is None and depth or st is not None and st.key is not None
                    and not (st._runs or st.lazy_runs)
                ):
                    # Idle, and every event of the key is the rule's: a state of its own, or
                    # (when some rule arrived after some of the key's events, and _visits left
                    # each rule to itself) a new one shared by the rules alike new to the key.
                    shareable = sig is not None and (st is None or st.shared)
                    if st is None:
                        if shareable:
                            made = ks.made.get(sig)
                            if made is not None:
                                held[name] = made
                                made.shared = True
                                continue
                        st = held[name] = new_state(rule, key=ks.key)
                    self._move_idle(ks, st, depth)
                    if not depth and st.is_empty:
                        self._retire(held, name)
                    if shareable:
                        ks.moved.add(st)
                        ks.newest[sig] = st
                        if not st.shared:
                            ks.made[sig] = st
                    continue
                live = st is not None and (st._runs or st.lazy_runs)
                if first is None and not live and st is None and not depth:
                    continue  # nothing to start or advance, and no state to keep
                if ks.width > slot and ks.present in own:
                    events = everything
                else:
                    # Other streams' events, or events that arrived before the rule did.
                    kept = [
                        (position, e) for position, (e, _, w, _) in enumerate(ks.items)
                        if w > slot and e.stream in streams
                    ]
                    events = [e for _, e in kept]
                    if first is not None:
                        first = next((i for i, (p, _) in enumerate(kept) if p >= first), None)
                if not events:
                    continue
                if st is None:
                    st = held[name] = new_state(rule, ks.key)
                elif st.shared:
                    st = held[name] = unshared(rule, st)
                lo = 0 if live or first is None else first
                if first is None and not live:
                    # No run to advance and none to start: the events only move the counters
                    # and the history.
                    shared = None
                    if depth and events is everything and len(events) >= depth:
                        shared = ks.tail(depth)
                    strict.pass_over(rule, st, events, shared)
                    if not depth and st.is_empty:
                        self._retire(held, name)
                    continue
                if bsig is not None and events is everything:
                    source = wanted.add(ks, st.history, everything)
                    cut = lo
                else:
                    source = None
                    cut = 0
                if lo:
                    strict.pass_over(rule, st, events[:lo])
                    events = events[lo:]
                if source is None:
                    source = wanted.add(ks, st.history, events)
                work.append((ks, st, events, source, cut, None))
            if not work:
                if index in leads:
                    self._release(visited, index, visits)
                continue
            wanted.compute(rule, columns)
            isig = self._idle_sig.get(index)
            follow_sig = self._follow_sig
            for ks, st, events, source, cut, shared in work:
                if shared is None:
                    key_bits = wanted.bits(source, cut)
                    self.touched += len(events)
                else:
                    found = wanted.bits(source, 0)  # over all the key's events
                    self.touched += len(found) - cut
                    row, history = ks.before[id(shared)]
                    if row is None or row[3] == 0:
                        if isig is None:
                            quiet = strict.stays_idle(rule, found, cut)
                        else:
                            asked = (isig, id(found), cut)
                            quiet = ks.quiet.get(asked)
                            if quiet is None:
                                quiet = ks.quiet[asked] = strict.stays_idle(rule, found, cut)
                        if quiet:
                            # The shared state, moved already, is where it ends (and where
                            # it ends for the rules alike that waited on this answer).
                            ks.deferred.pop(index, None)
                            continue
                    st = ks.held[name] = (
                        new_state(rule, ks.key) if row is None
                        else with_history(rule, row, history)
                    )
                    if cut:
                        strict.pass_over(rule, st, ks.everything[:cut])
                    events = ks.everything[cut:]
                    key_bits = found[cut:]
                state = ks.state
                fsig = follow_sig.get(index)
                start = None if fsig is None else twin_start(st)
                ended = None if start is None else _ended_alike(ks, fsig, start, events, key_bits)
                if ended is not None:
                    # A rule alike left an equal state over these events with these bits
                    # and reported nothing: this one ends where it did.
                    st = ks.held[name] = twin(rule, ended)
                    found = []
                else:
                    found = strict.process_events(rule, st, events, key_bits)
                    if start is not None and not found and twin_start(st) is not None:
                        ks.ended.setdefault((fsig, id(start[0]), tuple(key_bits)), []).append(
                            (start, events, st)
                        )
                waiting = ks.deferred.pop(index, None)
                if waiting:
                    if found or st._runs or st.cohorts or st.held or st.absences:
                        for other in waiting:  # they run on their own
                            visits.setdefault(other, []).append(ks)
                    else:
                        # Nothing reported: the rules alike that waited end where this one
                        # does (runs left alive are shared as the scan left them).
                        self._follow(ks, st, waiting, sig, rejoin)
                if found:
                    self._report(outputs, found, rule, state)
                self._settle(ks, name, st, sig, rejoin)
            if index in leads:
                self._release(visited, index, visits)
        for ks, name, sig, st in rejoin:
            # A scan that left the rule where its idle fellows are: one state again.
            target = ks.newest.get(sig)
            if (
                target is not None and target is not st and ks.held.get(name) is st
                and st.history == target.history and history_only(st) == history_only(target)
            ):
                ks.held[name] = target
                target.shared = True

    def _follow(self, ks: _KeyScan, st: Any, waiting: list[int], sig: tuple | None,
                rejoin: list) -> None:
        """The rules ``waiting`` on a key end in a state equal to ``st``, their lead's after
        a scan that reported nothing."""
        rules = self.rules
        for other in waiting:
            name = rules[other].name
            copy = ks.held[name] = twin(rules[other], st)
            self._settle(ks, name, copy, sig, rejoin)

    def _settle(self, ks: _KeyScan, name: str, st: Any, sig: tuple | None,
                rejoin: list) -> None:
        """After a scan of ``ks``'s key left ``st`` as rule ``name``'s state: drop it when
        empty; else keep the key's busy rules up to date, and note an idle state that may
        rejoin the one its rules alike share."""
        state = ks.state
        busy = state.busy
        if st.is_empty:
            self._retire(state.rules, name)
            if busy is not None:
                busy.pop(name, None)
        elif _idle(st):
            if busy is not None:
                busy.pop(name, None)
            if sig is not None:
                rejoin.append((ks, name, sig, st))
        elif busy is not None:
            busy[name] = None

    @staticmethod
    def _release(visited: list[_KeyScan], index: int,
                 visits: dict[int, list[_KeyScan]]) -> None:
        """The rules still waiting on rule ``index``'s scan of a key (it had nothing to run
        there) are looked at on their own."""
        for ks in visited:
            if ks.deferred:
                for other in ks.deferred.pop(index, ()):
                    visits.setdefault(other, []).append(ks)

    def _visits(self, ks: _KeyScan, newest_slot: int) -> Iterable[int]:
        """The scanned rules :meth:`_scan_indexed` looks at on ``ks``'s key, once the key's
        idle states shared by rules alike are moved (each once) and the rules of such a group
        new to the key given one moved state together: the rules an event may start, those
        holding a state of their own, and the rest that share nothing. A rule on the shared
        idle path is not looked at, so a key costs one move per sharing signature however
        many rules share it. A rule an event may start keeps the shared state for now: its
        scan copies it only when it does more than move it (``ks.before`` keeps what to copy)."""
        rules = self.rules
        held = ks.held
        share_by_name = self._share_by_name
        if ks.width <= newest_slot:
            # Some rules arrived after some of the key's events: each rule on its own.
            for index in self._fast:
                name = rules[index].name
                st = held.get(name)
                if st is not None and st.shared:
                    held[name] = unshared(rules[index], st)
            return self._fast
        visit = set(ks.firsts)
        fast_by_name = self._fast_by_name
        present = ks.present
        moved = ks.moved
        # One pass in comprehensions (a key holds a state per rule): the fast rules holding
        # their own states, and the shared states with one of their rules each.
        alone = [name for name, st in held.items() if not st.shared]
        visit.update(fast_by_name[name] for name in self._fast_names.intersection(alone))
        for name, st in {id(st): (name, st) for name, st in held.items() if st.shared}.values():
            sig = share_by_name[name]
            if present not in sig[1] or st.key is None:
                # Events of other streams: each of its rules on its own path.
                visit.update(fast_by_name[n] for n, s in held.items() if s is st)
            elif st not in moved:
                if ks.firsts:
                    # What a rule an event may start copies, should its scan not stay idle.
                    ks.before[id(st)] = (history_only(st), st.history)
                self._move_idle(ks, st, sig[0])
                moved.add(st)
                ks.newest.setdefault(sig, st)
        missing = self._fast_names - held.keys()
        if missing:
            share = self._share_sig
            new_state = self.runtime.new_state
            joined: dict[tuple, list[str]] = {}
            for index in sorted(fast_by_name[name] for name in missing):
                rule = rules[index]
                sig = share.get(index)
                if sig is None or present not in sig[1]:
                    if rule.prev_depth:
                        visit.add(index)  # a history to start keeping
                    continue
                made = ks.made.get(sig)
                if made is None:
                    made = ks.made[sig] = new_state(rule, key=ks.key)
                    if ks.firsts:
                        ks.before[id(made)] = (None, made.history)  # None: a new state
                    self._move_idle(ks, made, sig[0])
                    moved.add(made)
                    ks.newest.setdefault(sig, made)
                    joined[sig] = [rule.name]
                else:
                    made.shared = True
                    joined[sig].append(rule.name)
                held[rule.name] = made
            # As a decoded state's groups: encode writes a group still intact at once.
            ks.state.groups.extend(
                (ks.made[sig], self._made_group(names))
                for sig, names in joined.items() if len(names) > 1
            )
        lead_of = self._lead
        if lead_of:
            # A rule whose state is its lead's (the same shared idle state, moved already,
            # or an equal twin), and whose first possible start is where its lead's is, waits
            # for the lead's scan: when that stays idle, or leaves runs alive and reports
            # nothing, the rule ends where the lead does (equal bits, equal transitions), and
            # is not looked at; otherwise it runs on its own (_scan_indexed).
            firsts = ks.firsts
            for index in [i for i in visit if i in lead_of]:
                lead = lead_of[index]
                if lead not in visit or firsts.get(lead) != firsts.get(index):
                    continue
                st = held.get(rules[index].name)
                other = held.get(rules[lead].name)
                if st is None or other is None:
                    continue
                if st.shared:
                    if other is not st or st not in moved or index not in firsts:
                        continue
                elif not twins(st, other):
                    continue
                visit.discard(index)
                ks.deferred.setdefault(lead, []).append(index)
        return visit

    @staticmethod
    def _move_idle(ks: _KeyScan, st: Any, depth: int) -> None:
        """Move an idle state of a rule reading every one of the key's events past them:
        :func:`strict.pass_over` for a state with no run, inlined (the hot path of many
        ``prev`` rules)."""
        everything = ks.everything
        n = len(everything)
        st.pos += n
        st.events_seen += n
        st.last_ts = ks.last_ts
        if depth:
            if n >= depth:
                st.history = ks.tail(depth)
            else:
                st.history = (st.history + [e.fields for e in everything])[-depth:]

    def scan_streams(self) -> frozenset[str]:
        """Streams whose rows may be run column-wise by :meth:`run_columns`: every rule of
        the processor reading the stream runs as a scan and reads no other stream, and the
        stream has key fields."""
        if self._keys_of is not None:
            return frozenset()
        out = []
        for stream, readers in self._by_stream.items():
            if self.key_fields.get(stream) and all(
                index in self._fast and tuple(rule.streams) == (stream,)
                for index, rule in readers
            ):
                out.append(stream)
        return frozenset(out)

    def scan_rules(self, stream: str) -> list[int]:
        """Indexes (in :attr:`rules`) of the rules reading ``stream``, in order."""
        return sorted(index for index, _ in self._by_stream.get(stream, ()))

    def run_columns(
        self,
        index: int,
        block: Any,
        segments: Sequence[tuple[tuple, KeyState, int, int]],
        outputs: list[dict[str, Any]],
    ) -> None:
        """Run rule ``index`` (one of :meth:`scan_rules` of a :meth:`scan_streams` stream)
        over rows held as columns: what :meth:`run_batch` does for it with the same events.

        Parameters
        ----------
        index:
            The rule's index in :attr:`rules`.
        block:
            A :class:`cep.events.columnar.Block`: the rows, grouped by key, each key's in
            ``(ts, seq)`` order.
        segments:
            Per key, in the order of :meth:`run_batch`'s jobs: ``(key, state, lo, hi)``, the
            key's rows being ``lo:hi`` of ``block``.
        outputs:
            Matches are appended here.
        """

        rule = self.rules[index]
        name = rule.name
        for _, state, _, _ in segments:
            state.busy = None
        states = [state.rules.get(name) for _, state, _, _ in segments]
        bits = strict.block_bits(
            rule,
            block.stream,
            block.column,
            [
                (st.history if st is not None else (), lo, hi)
                for st, (_, _, lo, hi) in zip(states, segments, strict=True)
            ],
        )
        times = block.times()
        new_state = self.runtime.new_state
        for (key, state, lo, hi), st in zip(segments, states, strict=True):
            if st is None:
                st = state.rules[name] = new_state(rule, key)
            elif st.shared:
                st = state.rules[name] = unshared(rule, st)
            self.touched += hi - lo
            found = strict.process_events(rule, st, block.view(lo, hi), bits[lo:hi], times[lo:hi])
            if found:
                self._report(outputs, found, rule, state)
            if st.is_empty:
                self._retire(state.rules, name)

    def _run_rules(
        self,
        key: tuple,
        state: KeyState,
        items: Iterable[tuple[Event, Sequence[int] | None]],
        outputs: list[dict[str, Any]],
        skip: frozenset[int],
    ) -> None:
        process_event = self.runtime.process_event
        new_state = self.runtime.new_state
        state.busy = None
        rule_states = state.rules
        by_stream = self._by_stream
        must_see = self._must_see
        start = self._start_bits
        shares = self._share_sig
        touched = 0
        for event, masks in items:
            for index, rule in by_stream.get(event.stream, ()):
                if index in skip:
                    continue
                touched += 1
                mask = None if masks is None else masks[index]
                if mask is not None:
                    if mask is NOT_REGISTERED:
                        continue
                    if not must_see[index]:
                        if mask == 0:
                            continue
                        # Nothing pending for this key and the event cannot begin a match:
                        # the runtime would only count it.
                        if not mask & start[index] and rule.name not in rule_states:
                            continue
                st = rule_states.get(rule.name)
                if st is None:
                    st = rule_states[rule.name] = new_state(rule, key)
                elif index in shares and st.shared:
                    st = rule_states[rule.name] = unshared(rule, st)
                found = process_event(rule, st, event, mask)
                if found:
                    self._report(outputs, found, rule, state)
        self.touched += touched
        for name in [n for n, st in rule_states.items() if st.is_empty]:
            self._retire(rule_states, name)

    def fire_timers(
        self, state: KeyState, watermark_ms: int, outputs: list[dict[str, Any]]
    ) -> None:
        """Advance every rule of the key whose timer is due at ``watermark_ms``; at
        :data:`~cep.events.END_OF_INPUT` every rule, so matches waiting to grow are flushed."""
        rt = self.runtime
        end = watermark_ms >= END_OF_INPUT
        names = list(state.rules) if end else list(state.busy_rules())
        for name in names:
            st = state.rules.get(name)
            if st is None:
                continue
            if _idle(st):
                # Nothing to fire; at the end of input the state (at most a history) goes.
                if end:
                    self._retire(state.rules, name)
                if state.busy is not None:
                    state.busy.pop(name, None)
                continue
            due = st.next_timer_ms
            if end:
                rule = self._rule_by_name[name]
                self._report(outputs, rt.advance_watermark(rule, st, math.inf), rule, state)
            elif due is not None and due <= watermark_ms:
                rule = self._rule_by_name[name]
                self._report(outputs, rt.advance_watermark(rule, st, watermark_ms), rule, state)
            if st.is_empty:
                self._retire(state.rules, name)
            if state.busy is not None and _idle(st):
                state.busy.pop(name, None)
        state.watermark = max(state.watermark, watermark_ms)

    def _retire(self, rule_states: dict[str, Any], name: str) -> None:
        dropped = getattr(rule_states.pop(name), "dropped_partials", 0)
        if dropped:
            self.dropped_partials[name] += dropped

    def _report(
        self, outputs: list[dict[str, Any]], matches: list, rule: Any, state: KeyState
    ) -> None:
        """Append ``matches`` of ``rule`` on a key to ``outputs``: those its ``having`` lets
        through; with ``unique``, only those whose values no reported match of the key shares
        (within its duration), the others counted in :attr:`suppressed`."""
        if getattr(rule, "having", None) is not None:
            matches = [m for m in matches if m.reported]
        if getattr(rule, "unique", None) is None:  # (a custom runtime's rules have none)
            _extend(outputs, matches)
            return
        seen = state.unique.get(rule.name)
        if seen is None:
            seen = state.unique[rule.name] = OrderedDict()
        span = rule.unique_ms
        for match in matches:
            values, end = match.unique_values, match.end_ms
            if span is not None:
                # Forget, oldest first, values no later match can fall within `span` of: they
                # ended `span` before this one, and `within` more (a match emitted later
                # starts at most `within` before this one's end). Only memory depends on it.
                horizon = end - span - (rule.within_ms or 0)
                while seen and next(iter(seen.values())) <= horizon:
                    seen.popitem(last=False)
            last = seen.get(values)
            if last is not None and (span is None or end < last + span):
                self.suppressed[rule.name] += 1
                continue
            seen[values] = end
            seen.move_to_end(values)
            outputs.append(match.to_json())

    def drop_rule(self, state: KeyState, name: str) -> None:
        """Forget one rule's state for the key."""
        state.busy = None
        state.unique.pop(name, None)
        if name in state.rules:
            self._retire(state.rules, name)

    # ------------------------------------------------------------------ KeyedProcessor

    def process(
        self,
        key: tuple,
        state: bytes | None,
        events: Sequence[Mapping[str, Any]],
        watermark_ms: int | None,
    ) -> ProcessResult:
        """Validate a key's raw events, release those the watermark passed, and run them.

        ``events`` are dicts of the stream's fields plus ``stream`` and ``_seq`` (input
        position: the id when the stream has none, and the tie-breaker for equal times), in any
        order. Events below the key's previous watermark are late (dead letters). With
        ``watermark_ms`` ``None`` the key uses its own: the smallest over its streams of
        ``max(ts) - lateness``. Events above the watermark stay in the returned state.
        """
        ks, released, dead, watermark_ms = self._admit(state, events, watermark_ms)
        outputs: list[dict[str, Any]] = []
        if ks.unseen:
            self._run_unseen(key, ks, released, outputs)
        else:
            self.run_events(key, ks, ((e, None) for e in released), outputs)
        self.fire_timers(ks, watermark_ms, outputs)
        return self._result(ks, outputs, dead)

    def _admit(
        self, state: bytes | None, events: Sequence[Mapping[str, Any]], watermark_ms: int | None
    ) -> tuple[KeyState, list[Event], list[dict[str, Any]], int]:
        """The first half of :meth:`process`: a key's state decoded, its raw events validated
        (dead letters for the bad and the late), and the events the watermark releases, in
        ``(ts, seq)`` order; the rest stay pending in the state. Returns the state, the
        released events, the dead letters and the watermark the key stands at."""
        ks = self.decode(state) if state else KeyState()
        dead: list[dict[str, Any]] = []
        accepted: list[Event] = []
        # Late: behind this key's last watermark, or behind the caller's (the watermark the
        # caller computed before these events arrived).
        late_below = ks.watermark if watermark_ms is None else max(ks.watermark, watermark_ms)
        for raw in events:
            event = validate_raw(raw, self.schemas, dead, "RuleProcessor")
            if event is None:
                continue
            if event.ts < late_below:
                unit = self.schemas[event.stream].epoch_unit_ms
                dead.append(late_letter(event, late_below, raw, unit))
                continue
            accepted.append(event)
            seen = ks.max_ts.get(event.stream)
            if seen is None or event.ts > seen:
                ks.max_ts[event.stream] = event.ts
        if watermark_ms is None:
            watermark_ms = self._own_watermark(ks)
        watermark_ms = max(ks.watermark, watermark_ms)
        pending = sorted(ks.pending + accepted, key=_order)
        cut = len(pending)
        for i, event in enumerate(pending):
            if event.ts > watermark_ms:
                cut = i
                break
        ks.pending = pending[cut:]
        return ks, pending[:cut], dead, watermark_ms

    def process_keys(
        self,
        batch: Sequence[tuple[tuple, bytes | None, Sequence[Mapping[str, Any]]]],
        watermark_ms: int,
    ) -> tuple[list[dict[str, Any]], list[ProcessResult]]:
        """:meth:`process` for many keys at once, ``(key, state, events)`` each, at one
        watermark: the matches of all keys, and per key its result (its dead letters, state
        and timers; no outputs).

        The released events of every key are matched to the rules they may touch column-wise
        (:func:`cep.nfa.touches.event_touches`: each distinct condition evaluated once over
        the batch), and each key runs only those (:meth:`run_indexed`), as the embedded
        engine's rule index does: the matches are those of :meth:`process` called per key;
        what is saved is offering every event to every rule.
        """
        admitted = []
        outputs: list[dict[str, Any]] = []
        everything: list[Event] = []
        for key, state, events in batch:
            ks, released, dead, wm = self._admit(state, events, watermark_ms)
            admitted.append((key, ks, released, dead, wm))
            if not ks.unseen:
                everything.extend(released)
        touches = iter(touches_of(self, everything))
        width = len(self.rules)
        jobs = []
        for key, ks, released, _, _ in admitted:
            if ks.unseen:
                # Events from before a program edit that some rules must not see: row by row.
                self._run_unseen(key, ks, released, outputs)
            elif released:
                jobs.append((key, ks, [(e, next(touches), width, None) for e in released]))
        if jobs:
            self.run_indexed(jobs, outputs, range(width))
        results = []
        for _, ks, _, dead, wm in admitted:
            timers: list[dict[str, Any]] = []
            self.fire_timers(ks, wm, timers)
            outputs.extend(timers)
            results.append(self._result(ks, [], dead))
        return outputs, results

    def _run_unseen(
        self, key: tuple, ks: KeyState, released: list[Event], outputs: list[dict[str, Any]]
    ) -> None:
        """Run released events in order, each skipping the rules that must not see it."""
        index = {rule.name: i for i, rule in enumerate(self.rules)}
        for skip, group in groupby(
            released, key=lambda e: ks.unseen.pop(e.seq, frozenset())
        ):
            indices = frozenset(index[n] for n in skip if n in index)
            self._run_rules(key, ks, ((e, None) for e in group), outputs, indices)

    # ------------------------------------------------------------------ state bytes

    def encode(self, state: KeyState) -> bytes:
        """Serialise a key's state: a versioned container of the rules' own state bytes,
        the buffered events and the watermark information."""
        parts = []
        # Idle `prev` states alike (the same counters and history, as a key's rules that saw
        # the same events have) are stored once, with the rules sharing them.
        idle: dict[tuple, list[list[Any]]] = {}
        stored = 0
        versions = self._versions
        # A shared state's members list, once found: its other rules join it directly.
        joined: dict[int, list[Any]] = {}
        rules = state.rules
        if state.groups:
            # Shared states still held by the rules they were read with, and no other: their
            # members lists as read.
            values = list(rules.values())
            for st, group in state.groups:
                if st.shared and group.holds(rules, values, st):
                    joined[id(st)] = members = list(group.members)
                    row = history_only(st)
                    if row is None:
                        raise ValueError("a shared rule state holds more than a prev history")
                    self._idle_member(idle, row, st.history, members, group.raw)
        # States whose strict runs are shared (twins), by the runs object.
        twins_of: dict[int, list[tuple[str, Any]]] = {}
        items: Iterable[tuple[str, Any]] = rules.items()
        if joined:
            # The rules of the groups stored already are left out in one pass.
            stored_with = set(joined)
            items = [(n, st) for n, st in items if id(st) not in stored_with]
        for name, st in items:
            shared = st.__class__ is runtime.RuleState and st.shared
            if shared:
                members = joined.get(id(st))
                if members is not None:
                    members.append(name)
                    members.append(versions[name])
                    continue
            row = history_only(st)
            if row is not None:
                members = self._idle_member(idle, row, st.history, [name, versions[name]])
                if shared:
                    joined[id(st)] = members
                continue
            if st.__class__ is runtime.RuleState and st.lazy_runs is not None:
                # Runs shared with twins (rules alike that got equal bits): stored once.
                twins_of.setdefault(id(st.lazy_runs), []).append((name, st))
                continue
            stored += 1
            self._put_state(parts, name, st.to_bytes())
        for group in twins_of.values():
            first = group[0][1]
            alike = [(n, st) for n, st in group[1:] if twins(first, st)]
            apart = [group[0]]
            if len(alike) < len(group) - 1:
                taken = {n for n, _ in alike}
                apart += [(n, st) for n, st in group[1:] if n not in taken]
            for name, st in apart:
                stored += 1
                self._put_state(parts, name, st.to_bytes())
                if st is first:
                    for other, twin_state in alike:
                        stored += 1
                        encoded = other.encode("utf-8")
                        parts.append(_RULE_HEAD.pack(
                            len(encoded), self._rule_by_name[other].version, _TWIN
                        ))
                        parts.append(encoded)
                        parts.append(twin_state.fingerprint)
        body: dict[str, Any] = {
            "max_ts": state.max_ts,
            "pending": [[e.id, e.stream, e.ts, e.seq, e.fields] for e in state.pending],
        }
        rows = [(row, *entry) for row, alike in idle.items() for entry in alike]
        if rows:
            body["idle"] = [[*row, history] for row, history, _, _ in rows]
        if state.unique:
            body["unique"] = [
                [name, self._rule_by_name[name].version, list(seen.items())]
                for name, seen in state.unique.items() if seen and name in self._rule_by_name
            ]
        if state.pending:
            unseen = {e.seq: sorted(state.unseen[e.seq]) for e in state.pending
                      if state.unseen.get(e.seq)}
            if unseen:
                body["unseen"] = [[seq, names] for seq, names in unseen.items()]
        extra = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        parts.append(_BLOB.pack(len(extra)))
        parts.append(extra)
        for _, _, members, raw in rows:
            # Each idle row's members list (name, version, ...) as a blob of its own: read
            # back as bytes, a list seen before is not parsed again (see _idle_plan).
            if raw is None:
                raw = _members_bytes(members)
            parts.append(_BLOB.pack(len(raw)))
            parts.append(raw)
        if state.pending:
            # Which rules saw the pending events buffered (a later program's fresh rules must
            # not; see KeyState.unseen): the processor's list as a blob of its own, encoded
            # once, which a reader compares as bytes before it parses it.
            parts.append(_BLOB.pack(len(self._rules_bytes)))
            parts.append(self._rules_bytes)
        return _CODEC.encode(b"".join(parts), state.watermark, stored)

    @staticmethod
    def _idle_member(idle: dict[tuple, list[list[Any]]], row: tuple, history: list,
                     members: list[Any], raw: bytes | None = None) -> list[Any]:
        """Add ``members`` (name, version, ...) to the idle row of ``row`` and ``history``
        (:meth:`encode`'s rows: equal counters and histories stored once); returns the
        row's members list. ``raw``: those members' list as stored, when it is all of them."""
        alike = idle.setdefault(row, [])
        for entry in alike:
            seen, others, _ = entry
            if seen is history or seen == history:
                others.extend(members)
                entry[2] = None
                return others
        alike.append([history, members, raw])
        return members

    def _put_state(self, parts: list[bytes], name: str, blob: bytes) -> None:
        """Append a rule entry holding the rule's whole state bytes."""
        encoded = name.encode("utf-8")
        parts.append(_RULE_HEAD.pack(len(encoded), self._rule_by_name[name].version, len(blob)))
        parts.append(encoded)
        parts.append(blob)

    def decode(self, data: bytes) -> KeyState:
        """Inverse of :meth:`encode`. State of rules no longer served (or whose version changed)
        is dropped, so redeploying a changed rule starts it afresh.

        Raises
        ------
        StateError
            When the bytes are not a key state of a known format version.
        """
        version1 = bytes(data[:5]) == b"VGKS\1"
        (watermark, count), view = (_CODEC_V1 if version1 else _CODEC).decode(data)
        offset = 0
        ks = KeyState(watermark=watermark)
        stored_names = []
        # The last whole state read, and the state decoded from it (its twins copy it).
        blob = b""
        whole = None
        try:
            for _ in range(count):
                name_len, rule_version, blob_len = _RULE_HEAD.unpack_from(view, offset)
                offset += _RULE_HEAD.size
                name = bytes(view[offset : offset + name_len]).decode("utf-8")
                offset += name_len
                rule = self._rule_by_name.get(name)
                served = rule is not None and rule.version == rule_version
                if blob_len == _TWIN and not version1:
                    fingerprint = bytes(view[offset : offset + _FINGERPRINT])
                    offset += _FINGERPRINT
                    if len(fingerprint) != _FINGERPRINT or not blob:
                        raise StateError(f"key state has a malformed entry for rule '{name}'")
                    if served:
                        if whole is None:
                            # The state it is a twin of belongs to a rule no longer served.
                            whole = ks.rules[name] = shared_runs(RuleState.from_bytes(
                                blob, rule, fingerprint=fingerprint
                            ))
                        elif fingerprint != rule.fingerprint:
                            raise StateError(
                                f"rule state was written by a different compilation of rule "
                                f"{name} (its pattern, variables, version or window changed); "
                                "start the key from a fresh state"
                            )
                        else:
                            ks.rules[name] = twin(rule, shared_runs(whole))
                        stored_names.append(name)
                    continue
                blob = bytes(view[offset : offset + blob_len])
                if len(blob) != blob_len:
                    raise StateError(f"key state truncated inside the state of rule '{name}'")
                offset += blob_len
                whole = None
                if served:
                    whole = ks.rules[name] = self.runtime.state_from_bytes(blob, rule)
                    stored_names.append(name)
            (extra_len,) = _BLOB.unpack_from(view, offset)
            offset += _BLOB.size
            extra_bytes = bytes(view[offset : offset + extra_len])
            offset += extra_len
            if len(extra_bytes) != extra_len:
                raise StateError("key state has a wrong length")
            extra = json.loads(extra_bytes)
            idle = extra.get("idle", ())
            if version1:
                rows = [(entry[:-1], entry[-1], None) for entry in idle]
            else:
                rows = []
                for entry in idle:  # each row's members list follows, as a blob
                    (members_len,) = _BLOB.unpack_from(view, offset)
                    offset += _BLOB.size
                    raw = bytes(view[offset : offset + members_len])
                    if len(raw) != members_len:
                        raise StateError("key state truncated inside an idle row's rules")
                    offset += members_len
                    rows.append((entry, None, raw))
            if offset < len(view):  # the rules that saw the pending events, as a blob
                (rules_len,) = _BLOB.unpack_from(view, offset)
                offset += _BLOB.size
                rules_bytes = bytes(view[offset : offset + rules_len])
                if offset + rules_len != len(view):
                    raise StateError("key state has a wrong length")
                extra["rules"] = (
                    self._rules_list if rules_bytes == self._rules_bytes
                    else json.loads(rules_bytes)
                )
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"corrupted key state: {exc}") from None
        rules = ks.rules
        for (*row, history), members, raw in rows:
            plan = self._idle_plan(members, raw)
            made = [with_history(rule, row, history) for rule, _ in plan.makers]
            for st, (_, group) in zip(made, plan.makers, strict=True):
                if group is not None:
                    # Scanned rules alike hold one state until one of them leaves it.
                    st.shared = True
                    ks.groups.append((st, group))
            rules.update(zip(plan.names, map(made.__getitem__, plan.slots), strict=True))
        # Only a state stored whole can be busy (the idle rows hold histories alone).
        ks.busy = {name: None for name in stored_names if not _idle(ks.rules[name])}
        ks.max_ts = {str(k): int(v) for k, v in extra["max_ts"].items()}
        ks.pending = [
            Event(id=i, stream=s, ts=int(t), seq=int(q), fields=f)
            for i, s, t, q, f in extra["pending"]
        ]
        for name, version, seen in extra.get("unique", ()):
            rule = self._rule_by_name.get(name)
            if rule is not None and rule.version == version and rule.unique is not None:
                ks.unique[name] = OrderedDict((str(v), int(t)) for v, t in seen)
        if ks.pending and "rules" in extra:
            fresh = frozenset()
            if extra["rules"] != self._rules_list:
                saw = {(str(n), int(v)) for n, v in extra["rules"]}
                fresh = frozenset(r.name for r in self.rules if (r.name, r.version) not in saw)
            stored = {int(q): frozenset(names) for q, names in extra.get("unseen", ())}
            for event in ks.pending:
                names = stored.get(event.seq, frozenset()) | fresh
                if names:
                    ks.unseen[event.seq] = names
        return ks

    def _idle_plan(self, members: list[Any] | None, raw: bytes | None = None) -> _IdlePlan:
        """How :meth:`decode` rebuilds an idle row's rules from its members list (name,
        version, name, version, ...), given parsed (``members``) or as stored (``raw``, JSON
        text); keys alike store the same lists, so the plans are kept (a bounded number of
        them)."""
        cache = self._idle_plans
        token = tuple(members) if raw is None else raw
        plan = cache.get(token)
        if plan is not None:
            return plan
        try:
            if members is None:
                members = json.loads(raw)
            if not isinstance(members, list) or len(members) % 2 or not all(
                isinstance(name, str) for name in members[::2]
            ):
                raise ValueError("not a list of rule names and versions")
        except ValueError as exc:
            raise StateError(f"key state has a malformed idle row: {exc}") from None
        names: list[str] = []
        slots: list[int] = []
        makers: list[tuple[Any, list[str]]] = []
        by_sig: dict[tuple, int] = {}
        for position in range(0, len(members), 2):
            name, rule_version = members[position], members[position + 1]
            rule = self._rule_by_name.get(name)
            if rule is None or rule.version != rule_version:
                continue
            sig = self._share_by_name.get(name)
            slot = None if sig is None else by_sig.get(sig)
            if slot is None:
                slot = len(makers)
                makers.append((rule, []))
                if sig is not None:
                    by_sig[sig] = slot
            makers[slot][1].append(name)
            names.append(name)
            slots.append(slot)
        # A group holding every name of the row writes the row back as it was read.
        whole = raw if len(makers) == 1 and len(names) * 2 == len(members) else None
        plan = _IdlePlan(
            tuple(names), tuple(slots),
            tuple((rule, _Group(self, group, whole) if len(group) > 1 else None)
                  for rule, group in makers),
        )
        if len(cache) >= _IDLE_PLANS:
            cache.clear()
        cache[token] = plan
        return plan

    def _made_group(self, names: list[str]) -> _Group:
        """The :class:`_Group` of rules alike a scan gave one new idle state, ``names`` in the
        order they joined it: as :meth:`encode` would write their members list (kept for
        the keys alike that follow, a bounded number of them)."""
        token = tuple(names)
        group = self._made_groups.get(token)
        if group is None:
            if len(self._made_groups) >= _IDLE_PLANS:
                self._made_groups.clear()
            group = self._made_groups[token] = _Group(self, names, None)
            group.raw = _members_bytes(group.members)
        return group

    # ------------------------------------------------------------------ helpers

    def _own_watermark(self, state: KeyState) -> int:
        if not state.max_ts:
            return NO_WATERMARK
        return min(
            ts - (self.schemas[s].lateness_ms if s in self.schemas else 0)
            for s, ts in state.max_ts.items()
        )

    def _result(
        self, state: KeyState, outputs: list[dict[str, Any]], dead: list[dict[str, Any]]
    ) -> ProcessResult:
        due = state.next_timer_ms()
        return ProcessResult(
            state=None if state.is_empty else self.encode(state),
            outputs=outputs,
            dead_letters=dead,
            next_timer_ms=[] if due is None else [due],
        )


class _Group:
    """Rules sharing one idle state as a key's state was read (:attr:`KeyState.groups`):
    their names, their members list as stored, and how to look their states up at once; a
    state written back with the same rules and no other stores that list again without a
    step per rule."""

    __slots__ = ("names", "members", "lookup", "raw")

    def __init__(self, processor: RuleProcessor, names: list[str], raw: bytes | None) -> None:
        self.names = tuple(names)
        #: The members list as stored, when it holds these rules and no other.
        self.raw = raw
        versions = processor._versions
        self.members = list(chain.from_iterable((name, versions[name]) for name in names))
        self.lookup = operator.itemgetter(*names)

    def holds(self, rules: dict[str, Any], values: list[Any], st: Any) -> bool:
        """Whether ``st`` is the state of exactly these rules in ``rules`` (whose values are
        ``values``)."""
        try:
            found = self.lookup(rules)
        except KeyError:
            return False
        n = len(self.names)
        return found.count(st) == n and values.count(st) == n


@dataclass(frozen=True)
class _IdlePlan:
    """:meth:`RuleProcessor._idle_plan`: the names still served at their stored version, in
    order; per name the index of the state it gets; per state the rule it is made for (the
    first of its names) and, when several scanned rules alike share it, their
    :class:`_Group` (any other rule gets a state of its own)."""

    names: tuple[str, ...]
    slots: tuple[int, ...]
    makers: tuple[tuple[Any, _Group | None], ...]


class _BitsWanted:
    """The condition bits one rule's scan needs, per key: computed in one
    :func:`strict.condition_bits` call, or taken from a rule with the same bits signature that
    computed them over the same history and all the key's events this call."""

    __slots__ = ("signature", "requests", "fulls", "computed")

    def __init__(self, signature: tuple | None) -> None:
        self.signature = signature
        self.requests: list[tuple[list, Sequence[Event]]] = []
        self.fulls: list[tuple[int, _KeyScan, list]] = []
        self.computed: list[list[int]] = []

    def add(self, ks: _KeyScan, history: list, events: Sequence[Event]) -> Any:
        """The source of the bits of ``events`` after ``history``: a list computed already,
        or the index of a request."""
        signature = self.signature
        if signature is not None and events is ks.everything:
            cached = ks.bits.get(signature)
            if cached is not None and cached[0] == history:
                return cached[1]
            self.fulls.append((len(self.requests), ks, history))
        self.requests.append((history, events))
        return len(self.requests) - 1

    def compute(self, rule: Any, columns: dict) -> None:
        if self.requests:
            self.computed = strict.condition_bits(rule, self.requests, columns)
        for i, ks, history in self.fulls:
            ks.bits[self.signature] = (history, self.computed[i])

    def bits(self, source: Any, cut: int) -> list[int]:
        found = self.computed[source] if type(source) is int else source
        return found[cut:] if cut else found


class _KeyScan:
    """One key's part of :meth:`RuleProcessor._scan_indexed`: its events, the first event that
    may start each rule, and what its idle rules share during the call."""

    __slots__ = (
        "key", "state", "held", "items", "firsts", "everything", "present", "width",
        "last_ts", "tails", "moved", "made", "newest", "before", "bits", "quiet", "deferred",
        "ended",
    )

    def __init__(self, key: tuple, state: KeyState, items: Sequence[Any], firsts: dict) -> None:
        self.key = key
        self.state = state
        self.held = state.rules
        self.items = items
        self.firsts = firsts
        self.everything = [e for e, *_ in items]
        streams = {e.stream for e in self.everything}
        #: The one stream of the key's events (None: several).
        self.present = streams.pop() if len(streams) == 1 else None
        #: The engine's slots when the key's earliest event arrived.
        self.width = min(item[2] for item in items)
        self.last_ts = int(self.everything[-1].ts)
        self.tails: dict[int, list] = {}
        #: Shared states moved this call; per sharing signature the state new rules of the
        #: key join, and the newest shared state (what a rule's scan may rejoin).
        self.moved: set[Any] = set()
        self.made: dict[tuple, Any] = {}
        self.newest: dict[tuple, Any] = {}
        #: id of a shared state -> its row and history before this call moved it.
        self.before: dict[int, tuple] = {}
        #: Bits signature -> (history, the bits of all the key's events after it).
        self.bits: dict[tuple, tuple[list, list[int]]] = {}
        #: (idle signature, id of a bits list, from) -> :func:`strict.stays_idle`'s answer.
        self.quiet: dict[tuple, bool] = {}
        #: Lead rule index -> the rules alike whose scan waits for the lead's (see _visits).
        self.deferred: dict[int, list[int]] = {}
        #: (Follow signature, id of the start's runs, bits) -> per scan run on the key that
        #: reported nothing: its start (:func:`~cep.nfa.state.twin_start`), events and the
        #: state it left (see _ended_alike).
        self.ended: dict[tuple, list[tuple]] = {}

    def tail(self, depth: int) -> list:
        """The history every idle rule of ``depth`` reading all the key's events ends with:
        one list, shared (a history is replaced, never changed in place)."""
        shared = self.tails.get(depth)
        if shared is None:
            shared = self.tails[depth] = [e.fields for e in self.everything[-depth:]]
        return shared


def must_see_every_event(rule: Any) -> bool:
    """Whether a rule must be shown events whose columnar mask is 0.

    Only strict contiguity (every event breaks or extends a run) and ``prev`` (every event is
    someone's previous one) need them. A row with mask 0 fits no variable, and so can neither
    extend a relaxed or ``any`` partial match nor violate a negation; the compiled rule's more
    cautious ``needs_every_event`` is used when the rule does not say what it reads.
    """
    contiguity = getattr(rule, "contiguity", None)
    prev_depth = getattr(rule, "prev_depth", None)
    if contiguity is None or prev_depth is None:
        return bool(rule.needs_every_event)
    return contiguity == "strict" or prev_depth > 0


def start_bits(rule: Any) -> int:
    """Mask bits of the variables a match can begin with (all bits when unknown)."""
    pattern = getattr(rule, "pattern", None)
    variables = getattr(rule, "variables", None)
    if pattern is None or variables is None:
        return -1
    first, nullable = _first(pattern)
    if nullable:
        return -1
    bits = 0
    for name in first:
        if name not in variables:
            return -1
        bits |= 1 << variables.index(name)
    return bits


def _first(pattern: Any) -> tuple[set[str], bool]:
    """The variables a word of ``pattern`` can start with, and whether it can be empty."""
    if isinstance(pattern, ast.PatVar):
        return {pattern.name}, False
    if isinstance(pattern, ast.PatAbsent):
        return set(), True
    if isinstance(pattern, ast.PatSeq):
        first: set[str] = set()
        for item in pattern.items:
            found, nullable = _first(item)
            first |= found
            if not nullable:
                return first, False
        return first, True
    if isinstance(pattern, ast.PatAlt):
        first, nullable = set(), False
        for option in pattern.options:
            found, empty = _first(option)
            first |= found
            nullable = nullable or empty
        return first, nullable
    if isinstance(pattern, ast.PatQuant):
        found, nullable = _first(pattern.inner)
        return found, nullable or pattern.min == 0
    return set(), True


def _ended_alike(ks: _KeyScan, sig: tuple, start: tuple, events: Sequence[Any],
                 bits: Sequence[int]) -> Any:
    """The state a scan of a rule with follow signature ``sig`` left on ``ks``'s key from a
    start equal to ``start`` over the same events with the same bits, reporting nothing; or
    None. The strict transitions, window, caps and skip being equal, such a scan leaves an
    equal state (see :func:`cep.nfa.state.twin`). (A start's runs object is held by the
    record, so its id is not reused while the record lives.)"""
    for before, seen, ended in ks.ended.get((sig, id(start[0]), tuple(bits)), ()):
        if (
            alike_starts(before, start)
            and len(seen) == len(events) and all(map(operator.is_, seen, events))
        ):
            return ended
    return None


def _members_bytes(members: list[Any]) -> bytes:
    """An idle row's members list (name, version, ...) as :meth:`RuleProcessor.encode` stores
    it."""
    return json.dumps(members, separators=(",", ":"), ensure_ascii=False).encode()


def _idle(st: Any) -> bool:
    """Whether a runtime state holds nothing a deadline can change (at most its ``prev``
    history): no timer, and advancing its watermark reports nothing."""
    if type(st) is not runtime.RuleState:  # another runtime's state: ask it
        return False
    return not (st.cohorts or st.held or st.absences or st._runs or st.lazy_runs)


def _order(event: Event) -> tuple[int, int]:
    return (event.ts, event.seq)


def _extend(outputs: list[dict[str, Any]], matches: list) -> None:
    for match in matches:
        outputs.append(match if isinstance(match, dict) else match.to_json())
