"""Runs a compiled rule over the events of one partition key: one step per event (relaxed/any
partial matches, or strict Pike-VM runs), then deadlines, the skip strategy and the caps.

Pure over (compiled rule, :class:`cep.nfa.state.RuleState`, input): results do not depend on how
a key's events are split into calls; the semantics are specified in ``docs/semantics.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from cep.nfa.automaton import TAIL_GREEDY, TAIL_RELUCTANT
from cep.nfa.compiler import CompiledRule
from cep.nfa.errors import OutOfOrderEventError, RuleRuntimeError, StateFormatError
from cep.nfa.match import Match, build_match
from cep.nfa.state import (
    NO_TAIL,
    ONE_MEMBER,
    RuleState,
    _Absence,
    _Binding,
    _Cohort,
    _Event,
    _Held,
    _StrictEntry,
    _StrictRun,
    count_members,
    join_cohorts,
    new_state,
    settle,
)

__all__ = [
    "OutOfOrderEventError",
    "RuleRuntimeError",
    "RuleState",
    "StateFormatError",
    "advance_watermark",
    "new_state",
    "process_event",
]

_INF = math.inf
_NO_GUARDS: frozenset[int] = frozenset()


class _Context:
    """The ``MatchContext`` a condition sees: bindings so far, the candidate, ``prev``, and the
    candidate's time (what ``lookup`` reads a table as of).

    ``var`` is the variable the candidate event is tested for; a variable's bindings are the
    events taken at any of its places. The bindings so far are ``node``'s list followed by
    ``tail``'s (the shared tail of a cohort's segment, see :class:`cep.nfa.state._Cohort`).
    """

    __slots__ = ("node", "var", "current", "history", "index", "places", "tail", "ts")

    def __init__(self, node, var, current, history, index, places, tail=None, ts=None):
        self.ts = ts
        self.node = node
        self.var = var
        self.current = current
        self.history = history
        self.index = index
        self.places = places
        self.tail = tail

    def bound(self, var: str) -> Sequence[Mapping[str, Any]]:
        idx = self.index.get(var)
        if idx is None:
            return []
        out = []
        places = self.places
        node = self.tail  # newest first: a segment's tail holds the newest links
        while node is not None:
            if places[node.place] == idx:
                out.append(node.event.fields)
            node = node.parent
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

    def time(self) -> int | None:
        return self.ts


# ---------------------------------------------------------------- evaluation helpers


class _Evaluator:
    """Evaluates conditions for one event, caching results that do not depend on bindings."""

    __slots__ = ("rule", "state", "event", "mask", "pure", "cache", "keyed")

    def __init__(self, rule: CompiledRule, state: RuleState, event: _Event, mask: int | None):
        self.rule = rule
        self.state = state
        self.event = event
        self.mask = mask
        self.pure = rule.pure_bits
        self.cache: dict[int, bool] = {}
        self.keyed = bool(rule.var_keys) and state.key is not None

    def fits(self, var: int, node: _Binding | None, tail: _Binding | None = None) -> bool:
        """Whether the event fits ``var`` after the bindings ``node`` (then ``tail``)."""
        cond = self.rule.conditions[var]
        shared = not cond.reads_variables
        if shared:
            cached = self.cache.get(var)
            if cached is not None:
                return cached
        result = self._evaluate(var, cond, node, tail)
        if shared:
            self.cache[var] = result
        return result

    def fitting(self, var: int, cohort: _Cohort) -> list[int] | None:
        """The members of ``cohort`` (indices) the event fits as ``var``; None means all."""
        fits, heads, tails = self.fits, cohort.heads, cohort.tails
        if len(tails) == 1:
            tail = tails[0]
            members = [i for i, node in enumerate(heads) if fits(var, node, tail)]
        else:
            members = []
            for lo, hi, tail in cohort.segments():
                members += [i for i in range(lo, hi) if fits(var, heads[i], tail)]
        return None if len(members) == len(heads) else members

    def _evaluate(self, var: int, cond, node: _Binding | None, tail: _Binding | None) -> bool:
        event = self.event
        if self.mask is not None and not (self.mask >> var) & 1:
            return False
        if cond.stream is not None and event.stream != cond.stream:
            return False
        if self.keyed:
            values = self.rule.var_key_values.get(self.rule.variables[var])
            if values is not None:
                own = values(event.fields)
                if own != tuple(self.state.key[-len(own):]):
                    return False
        if cond.predicate is None:
            return True
        if self.mask is not None and (self.pure >> var) & 1:
            return True
        ctx = _Context(
            node, var, event.fields, self.state.history, _var_index(self.rule), self.rule.places,
            tail, event.ts,
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
        rule, state = self.rule, self.state
        reported: set[tuple] | None = set() if rule.reuses_variables else None
        for node, end in found:
            word = [(b.place, b.event) for b in node.chain()]
            first = word[0][1].pos
            if first < state.resume:
                continue
            if reported is not None:
                places = rule.places
                bound = tuple((ev.pos, places[place]) for place, ev in word)
                if bound in reported:
                    continue
                reported.add(bound)
            self.out.append(build_match(rule, state.key, word, end))
            state.resume = _resume_after(rule, state.resume, word, first)
        self._discard_before(state.resume)

    def _discard_before(self, resume: int) -> None:
        if resume <= 0:
            return
        s = self.state
        s.cohorts = _members_since(s.cohorts, "start_pos", resume)
        s.held = [h for h in s.held if _start(h.node) >= resume]
        s.absences = [a for a in s.absences if _start(a.node) >= resume]
        s.runs = [r for r in s.runs if r.start_pos >= resume]


def _start(node: _Binding) -> int:
    while node.parent is not None:
        node = node.parent
    return node.event.pos


def _resume_after(
    rule: CompiledRule, resume: int, word: Sequence[tuple[int, _Event]], first: int
) -> int:
    """The position matching resumes from after a match (the rule's ``after match skip``).

    ``word`` is the match's ``(place, event)`` pairs, ``first`` its first event's position and
    ``resume`` the position before the match.
    """
    kind = rule.skip
    if kind == "past_last":
        return word[-1][1].pos + 1
    if kind == "to_next":
        return first + 1
    if kind == "no_skip":
        return resume
    places = rule.places
    positions = [ev.pos for place, ev in word if places[place] == rule.skip_var]
    if not positions:
        return first + 1
    target = positions[0] if kind == "to_first" else positions[-1]
    return target if target > first else first + 1


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

    Examples
    --------
    >>> from cep.events.event import Event
    >>> from cep.nfa.compiler import compile_rule
    >>> from query_lang import parse
    >>> program = parse('''
    ... stream txn (card string, amount float, ts timestamp) time ts
    ... rule probe from txn by card pattern small big within 1h
    ...   define small as amount < 1, big as amount > 500
    ... ''')
    >>> rule = compile_rule(program.declarations[1])
    >>> state = new_state(rule)
    >>> rows = [(0.5, 0), (20.0, 60_000), (900.0, 120_000)]
    >>> for i, (amount, ts) in enumerate(rows):
    ...     event = Event(i, "txn", ts, i, {"card": "c1", "amount": amount, "ts": ts})
    ...     for match in process_event(rule, state, event):
    ...         print(match.key, match.events, match.start_ms, match.end_ms)
    {'card': 'c1'} {'small': [0], 'big': [2]} 0 120000
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
    if state.held or state.absences or state.runs or state.cohorts:
        _fire(rule, state, ts, emitter)
    if state.key is None:
        names = rule.key_fields.get(event.stream, ())
        state.key = tuple(event.fields.get(f) for f in names)
    current = _Event(state.pos, event.id, event.stream, ts, event.fields)
    state.pos += 1
    state.last_ts = ts
    state.events_seen += 1
    ev = _Evaluator(rule, state, current, mask)
    born = state.born
    if rule.contiguity == "strict":
        found, live = _strict_step(rule, state, ev)
    else:
        found = _relaxed_step(rule, state, ev)
        live = count_members(state.cohorts)
    if found:
        emitter.emit_slot(found)
        live = state.partial_count
    if rule.partials == "latest" or live > rule.max_partials:
        _enforce_caps(rule, state)
    if state.born != born and len(state.cohorts) > 1:
        # New partial matches may continue from where others do: join their cohorts, after
        # the cap, so that the cohorts it drops are not copied first.
        state.cohorts = join_cohorts(state.cohorts)
    if rule.prev_depth:
        state.history.append(event.fields)
        if len(state.history) > rule.prev_depth:
            del state.history[0]
    if rule.contiguity == "strict":
        settle(state)
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
        state.history = []
    if rule.contiguity == "strict":
        settle(state)
    return emitter.out


# ---------------------------------------------------------------- relaxed / any


def _relaxed_step(rule: CompiledRule, state: RuleState, ev: _Evaluator) -> list:
    event = ev.event
    place_var = rule.places
    found: list[tuple[_Binding, int | None]] = []

    survivors: list[_Absence] = []
    for pending in state.absences:
        blocked = _block(rule, ev, pending.node, pending.blocked, _union(pending.guard_sets))
        if any(not (g & blocked) for g in pending.guard_sets):
            pending.blocked = blocked
            survivors.append(pending)
    state.absences = survivors

    # _fire has dropped the partial matches whose window closed before this event.
    kept: list[_Cohort] = []
    children: list[_Cohort] = []
    for cohort in state.cohorts:
        _step(rule, state, ev, cohort, kept, children)

    if state.pos - 1 >= state.resume:
        start = rule.summary((-1,))
        for place in start.takes:
            if ev.fits(place_var[place], None):
                children.append(_extend(rule, state, None, None, place, start.targets[place],
                                        event))

    for child in children:
        _arrive(rule, state, child, found, kept)
    state.cohorts = kept
    return found


def _step(
    rule: CompiledRule,
    state: RuleState,
    ev: _Evaluator,
    cohort: _Cohort,
    kept: list[_Cohort],
    children: list[_Cohort],
) -> None:
    """Offer the event to every member of ``cohort``: TAKE (children), IGNORE (kept).

    Whatever depends only on the cohort's letters and flags is decided once; conditions that
    read bindings are evaluated per member.
    """
    summary = rule.summary(cohort.letters)
    conditions, place_var, blocked = rule.conditions, rule.places, cohort.blocked
    took: list[list[int] | None] = []  # per fitting place: its members (None: all)
    moves: list[tuple[int, tuple[int, ...], list[int] | None]] = []
    for place, options in summary.takes.items():
        var = place_var[place]
        if not conditions[var].reads_variables:
            if not ev.fits(var, None):
                continue
            members = None
        else:
            members = ev.fitting(var, cohort)
            if members is not None and not members:
                continue
        if var not in rule.any_vars:
            # (Under `contiguity any for v`, taking the event as v leaves the member as well.)
            took.append(members)
        if len(options) == 1:
            letter, guards = options[0]
            if not guards & blocked:
                moves.append((place, (letter,), members))
        else:
            targets = (
                summary.targets[place] if not blocked
                else tuple(sorted({lt for lt, guards in options if not (guards & blocked)}))
            )
            if targets:
                moves.append((place, targets, members))

    if len(moves) == 1:
        place, targets, members = moves[0]
        children.append(_extend(rule, state, cohort, members, place, targets, ev.event))
    elif moves:
        # Children are born member by member, and place by place for one member.
        chosen = [None if members is None else set(members) for _, _, members in moves]
        for i in range(len(cohort.heads)):
            for (place, targets, _), which in zip(moves, chosen, strict=True):
                if which is None or i in which:
                    children.append(_extend(rule, state, cohort, [i], place, targets, ev.event))

    if took and rule.contiguity == "relaxed":
        # Under relaxed contiguity a member that fits a transition must take it.
        if None in took:
            return
        taken = set().union(*took)
        rest = cohort.select([i for i in range(len(cohort.heads)) if i not in taken])
        if rest is None:
            return
        cohort = rest
    if not summary.guards:
        kept.append(cohort)
        return
    take_guards = [guards for opts in summary.takes.values() for _, guards in opts]
    for now_blocked, members in _blocked_runs(rule, ev, cohort, summary.guards):
        if all(guards & now_blocked for guards in take_guards):
            continue
        part = cohort.select(members) if members is not None else cohort
        kept.append(part.with_blocked(now_blocked))


def _blocked_runs(
    rule: CompiledRule, ev: _Evaluator, cohort: _Cohort, guards: frozenset[int]
) -> list[tuple[frozenset[int], list[int] | None]]:
    """The cohort's guards blocked by the event: ``(blocked, members)`` per run of members that
    agree (``members`` None: all of them)."""
    conditions = rule.conditions
    if all(not conditions[rule.guards[g]].reads_variables for g in guards):
        return [(_block(rule, ev, None, cohort.blocked, guards), None)]
    runs: list[tuple[frozenset[int], list[int] | None]] = []
    heads = cohort.heads
    for lo, hi, tail in cohort.segments():
        for i in range(lo, hi):
            blocked = _block(rule, ev, heads[i], cohort.blocked, guards, tail)
            if runs and runs[-1][0] == blocked:
                runs[-1][1].append(i)
            else:
                runs.append((blocked, [i]))
    return runs


def _members_since(cohorts: list[_Cohort], field: str, lowest: float) -> list[_Cohort]:
    """The members whose ``field`` (``start_pos`` or ``start_ts``) is at least ``lowest``."""
    out: list[_Cohort] = []
    for cohort in cohorts:
        if field == "start_ts" and cohort.earliest >= lowest:
            out.append(cohort)
            continue
        values = getattr(cohort, field)
        if min(values) >= lowest:
            out.append(cohort)
            continue
        rest = cohort.select([i for i, v in enumerate(values) if v >= lowest])
        if rest is not None:
            out.append(rest)
    return out


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
    tail: _Binding | None = None,
) -> frozenset[int]:
    fresh = [g for g in guards if g not in blocked and ev.fits(rule.guards[g], node, tail)]
    return blocked | frozenset(fresh) if fresh else blocked


def _extend(
    rule: CompiledRule,
    state: RuleState,
    parent: _Cohort | None,
    members: list[int] | None,
    place: int,
    targets: tuple[int, ...],
    event: _Event,
) -> _Cohort:
    """The children of ``parent``'s members (None: all) taking ``event`` at ``place``; a new
    partial match when ``parent`` is None. One binding link per segment of the parent, or per
    child in small segments (see :class:`cep.nfa.state._Cohort`)."""
    supersedes: tuple[int, ...] = ()
    after_reluctant = False
    if parent is None:
        heads: list[_Binding | None] = [_Binding(None, place, event)]
        ends, tails = ONE_MEMBER, NO_TAIL
        start_pos, start_ts, earliest = [event.pos], [event.ts], event.ts
    else:
        if parent.supersedes or parent.after_reluctant:
            tails = {rule.letters[t].tail for t in targets}
            # The event extends the match inside a trailing quantifier when any derivation
            # takes it there (a fixed repetition like (a{1,3}){2} also reaches a's outside the
            # tail).
            if TAIL_GREEDY in tails:
                supersedes = parent.supersedes
            if TAIL_RELUCTANT in tails:
                after_reluctant = parent.after_reluctant
        source = parent.select(members) if members is not None else parent
        heads = source.heads
        if len(heads) == 1 and source.tails[0] is None:  # the most common case, inline
            heads, ends, tails = [_Binding(heads[0], place, event)], ONE_MEMBER, NO_TAIL
        else:
            heads, ends, tails = source.taken(place, event)
        start_pos, start_ts = source.start_pos, source.start_ts
        if source is parent:  # a cohort owns its lists
            start_pos, start_ts = start_pos.copy(), start_ts.copy()
        earliest = source.earliest
    born = state.born
    state.born += len(heads)
    return _Cohort(
        targets, _NO_GUARDS, supersedes, after_reluctant, heads, ends, tails, start_pos,
        start_ts, range(born + 1, state.born + 1), earliest,
    )


def _arrive(
    rule: CompiledRule, state: RuleState, child: _Cohort, found: list, kept: list[_Cohort]
) -> None:
    """Handle partial matches that just took an event (plain and absence accepts); keep
    those that may take more."""
    summary = rule.summary(child.letters)
    if not summary.accepts:
        if summary.takes:
            kept.append(child)
        return
    out = [child]
    plain = any(not guards for guards in summary.accepts)
    absent = tuple(guards for guards in summary.accepts if guards)
    # Matches and absences need each member's whole binding list.
    if (plain and not child.after_reluctant) or (absent and rule.within_ms is not None):
        nodes = child.nodes()
    if plain:
        if child.supersedes:
            for held in state.held:
                if held.id in child.supersedes:
                    held.superseded = True
        if not child.after_reluctant:
            if summary.greedy_tail_take:
                # Each match is held on its own and remembers which hold it extends.
                within = rule.within_ms
                out = []
                for node, start_pos, start_ts, born in zip(
                    nodes, child.start_pos, child.start_ts, child.born, strict=True
                ):
                    state.held_ids += 1
                    deadline = start_ts + within if within is not None else _INF
                    state.held.append(_Held(state.held_ids, node, deadline))
                    out.append(_Cohort(
                        child.letters, child.blocked, child.supersedes + (state.held_ids,),
                        child.after_reluctant, [node], ONE_MEMBER, NO_TAIL, [start_pos], [start_ts],
                        [born],
                    ))
            else:
                found.extend((node, None) for node in nodes)
        if any(rule.letters[t].tail == TAIL_RELUCTANT for opts in summary.takes.values()
               for t, _ in opts):
            for cohort in out:
                cohort.after_reluctant = True
    if absent and rule.within_ms is not None:
        within = rule.within_ms
        state.absences.extend(
            _Absence(node, absent, frozenset(), start_ts + within)
            for node, start_ts in zip(nodes, child.start_ts, strict=True)
        )
    if summary.takes:
        kept.extend(out)


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
        if not (state.runs or state.cohorts or state.held or state.absences):
            state.born = 0  # runs alive together are ordered; with none, count afresh
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
        state.cohorts = []
    elif within is not None:
        state.cohorts = _members_since(state.cohorts, "start_ts", watermark - within)


def _enforce_caps(rule: CompiledRule, state: RuleState) -> None:
    if rule.partials == "latest":
        if state.cohorts:
            # The newest partial match per NFA state: the last member of the last cohort.
            claimed: set[tuple[int, ...]] = set()
            newest: list[_Cohort] = []
            for cohort in reversed(state.cohorts):
                if cohort.letters not in claimed:
                    claimed.add(cohort.letters)
                    newest.append(cohort.drop_oldest(len(cohort.heads) - 1))
            state.cohorts = newest[::-1]
        if state.runs:
            _latest_strict(state)
    over = state.partial_count - rule.max_partials
    if over <= 0:
        return
    if state.cohorts:
        # Cohorts are in born order: the oldest partial matches are a prefix.
        cohorts = state.cohorts
        first = drop = 0
        while first < len(cohorts) and drop + len(cohorts[first].heads) <= over:
            drop += len(cohorts[first].heads)
            first += 1
        rest = cohorts[first:]
        if rest and drop < over:
            rest[0] = rest[0].drop_oldest(over - drop)
            drop = over
        state.cohorts = rest
        state.dropped_partials += drop
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
