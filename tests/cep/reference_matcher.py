"""A brute-force matcher written directly from docs/semantics.md, to test the NFA runtime against.

It knows nothing of NFAs: it enumerates candidate event subsequences of a small, fully known
stream with a backtracking regex matcher over the pattern's syntax tree, filters them by the
rules of the semantics one by one, works out when each reported match would be emitted, and
applies the after-match skip strategy in emission order. Exponential on purpose; keep streams
small.

A candidate binds its events to *places*, the occurrences of variables in the pattern text:
the matcher renames each occurrence (``a b a`` becomes ``a#0 b#1 a#2``) and works on the
renamed pattern, so two parses that give the events the same variables are two candidates.
Conditions, reported events and skip targets see variables: the union of their places.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from query_lang import ast

Predicate = Callable[[Mapping[str, Any], Any], bool]

GREEDY = "greedy"
RELUCTANT = "reluctant"


@dataclass(frozen=True)
class RefEvent:
    id: Any
    ts: int
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class RefMatch:
    """A reported match: ``events`` maps each variable to its event ids, in order."""

    events: dict[str, list[Any]]
    start_ms: int
    end_ms: int


class RefContext:
    """The match context a condition sees: earlier bindings, the candidate, prev().

    ``binds`` holds ``(pos, place)`` pairs; a variable's events are those of all its places.
    """

    def __init__(self, stream, binds, var, pos):
        self.stream = stream
        self.binds = binds
        self.var = var
        self.pos = pos

    def bound(self, var: str):
        out = [self.stream[p].fields for p, v in self.binds if variable_of(v) == var]
        if var == self.var:
            out.append(self.stream[self.pos].fields)
        return out

    def prev(self, n: int = 1):
        p = self.pos - n
        return self.stream[p].fields if 0 <= p and n >= 1 else None


def variable_of(place: str) -> str:
    """The variable of a place name made by :func:`with_places` (``a#2`` -> ``a``)."""
    return place.rpartition("#")[0]


def with_places(p):
    """The pattern with each variable occurrence renamed ``name#k`` (k-th occurrence in text)."""
    counter = iter(range(1 << 30))

    def walk(q):
        if isinstance(q, ast.PatVar):
            return ast.PatVar(f"{q.name}#{next(counter)}")
        if isinstance(q, ast.PatAbsent):
            return ast.PatAbsent(f"{q.name}#{next(counter)}")
        if isinstance(q, ast.PatSeq):
            return ast.PatSeq(tuple(walk(i) for i in q.items))
        if isinstance(q, ast.PatAlt):
            return ast.PatAlt(tuple(walk(o) for o in q.options))
        return ast.PatQuant(walk(q.inner), q.min, q.max, q.greedy)

    return walk(p)


def _nullable(p) -> bool:
    if isinstance(p, ast.PatVar):
        return False
    if isinstance(p, ast.PatAbsent):
        return True
    if isinstance(p, ast.PatSeq):
        return all(_nullable(i) for i in p.items)
    if isinstance(p, ast.PatAlt):
        return any(_nullable(o) for o in p.options)
    return p.min == 0 or _nullable(p.inner)


def tail_vars(pattern) -> dict[str, str]:
    """Variables inside a trailing quantifier of the pattern, with that quantifier's kind.

    A quantifier is trailing when nothing but nullable elements follow it up to the end of the
    pattern (a trailing ``!x`` ends the tail); the outermost trailing quantifier decides.
    """
    out: dict[str, str] = {}

    def visit(p, trailing: bool, kind: str | None) -> None:
        if isinstance(p, ast.PatVar):
            if kind is not None:
                out.setdefault(p.name, kind)
        elif isinstance(p, ast.PatSeq):
            last_absent = max(
                (i for i, x in enumerate(p.items) if isinstance(x, ast.PatAbsent)), default=-1
            )
            for i, item in enumerate(p.items):
                t = trailing and i > last_absent and all(_nullable(x) for x in p.items[i + 1:])
                visit(item, t, kind)
        elif isinstance(p, ast.PatAlt):
            for o in p.options:
                visit(o, trailing, kind)
        elif isinstance(p, ast.PatQuant):
            variable = p.max is None or p.max != p.min
            if trailing and kind is None and variable:
                # Every variable inside a trailing quantifier belongs to it.
                kind = GREEDY if p.greedy else RELUCTANT
            visit(p.inner, trailing, kind)

    visit(pattern, True, None)
    return out


# ---------------------------------------------------------------- the regex over words


def _words(p, word: Sequence[str], i: int, k: Callable[[int], bool], prefix: bool) -> bool:
    """Backtracking match of ``p`` against ``word[i:]``; ``k`` continues with the end index.

    With ``prefix``, running out of word inside the pattern counts as success: every
    sub-pattern's language is non-empty, so any partial parse can be completed.
    """
    if isinstance(p, ast.PatVar):
        if i == len(word):
            return prefix
        return word[i] == p.name and k(i + 1)
    if isinstance(p, ast.PatAbsent):
        return k(i)
    if isinstance(p, ast.PatSeq):
        def seq(idx: int, j: int) -> bool:
            if idx == len(p.items):
                return k(j)
            return _words(p.items[idx], word, j, lambda e: seq(idx + 1, e), prefix)
        return seq(0, i)
    if isinstance(p, ast.PatAlt):
        return any(_words(o, word, i, k, prefix) for o in p.options)

    def rep(count: int, j: int) -> bool:
        if count >= p.min and k(j):
            return True
        if p.max is not None and count >= p.max:
            return False
        if prefix and j == len(word):
            return True
        return _words(
            p.inner, word, j, lambda e: (e > j or count < p.min) and rep(count + 1, e), prefix
        )

    return rep(0, i)


def in_language(pattern, word: Sequence[str]) -> bool:
    return _words(pattern, word, 0, lambda j: j == len(word), False)


def viable(pattern, word: Sequence[str]) -> bool:
    """True when ``word`` is a prefix of some word of the pattern's language."""
    return _words(pattern, word, 0, lambda j: j == len(word), True)


# ---------------------------------------------------------------- the matcher


@dataclass
class ReferenceMatcher:
    """Matches one partition's fully known event list against a rule, by the semantics."""

    pattern: Any
    conditions: Mapping[str, Predicate]
    contiguity: str = "relaxed"
    #: ``contiguity any for v``: under relaxed, an event fitting a transition into one of these
    #: variables may be skipped (the partial match that takes it stays as well).
    any_for: frozenset[str] = frozenset()
    skip: str = "past_last"
    skip_var: str | None = None
    within_ms: int | None = None

    def __post_init__(self) -> None:
        # From here on "variable" in the matcher means a place (see the module docstring).
        self.pattern = with_places(self.pattern)
        names: list[str] = []
        absent: list[str] = []
        self._collect(self.pattern, names, absent)
        self.variables = names
        self.rank = {v: i for i, v in enumerate(dict.fromkeys(self._order(self.pattern)))}
        self.tails = tail_vars(self.pattern)

    def _collect(self, p, names, absent) -> None:
        if isinstance(p, ast.PatVar):
            if p.name not in names:
                names.append(p.name)
        elif isinstance(p, ast.PatAbsent):
            absent.append(p.name)
        elif isinstance(p, ast.PatSeq):
            for i in p.items:
                self._collect(i, names, absent)
        elif isinstance(p, ast.PatAlt):
            for o in p.options:
                self._collect(o, names, absent)
        else:
            self._collect(p.inner, names, absent)

    def _order(self, p):
        if isinstance(p, ast.PatVar | ast.PatAbsent):
            yield p.name
        elif isinstance(p, ast.PatSeq):
            for i in p.items:
                yield from self._order(i)
        elif isinstance(p, ast.PatAlt):
            for o in p.options:
                yield from self._order(o)
        else:
            yield from self._order(p.inner)

    # -- conditions

    def fits(self, stream, place, pos, binds) -> bool:
        var = variable_of(place)
        cond = self.conditions.get(var)
        if cond is None:
            return True
        return bool(cond(stream[pos].fields, RefContext(stream, binds, var, pos)))

    def deadline(self, stream, binds) -> float:
        return stream[binds[0][0]].ts + self.within_ms if self.within_ms is not None else math.inf

    # -- slots: when a match is emitted, as a sortable key

    @staticmethod
    def event_slot(stream, pos):
        return (stream[pos].ts, 0, pos)

    @staticmethod
    def deadline_slot(d: float):
        return (d, 1, 0)

    # -- entry point

    def run(self, stream: Sequence[RefEvent]) -> list[RefMatch]:
        if self.contiguity == "strict":
            reported = self._strict(stream)
        else:
            reported = self._non_strict(stream)
        reported.sort(key=lambda r: (r[0], r[1][0][0], self._pref(r[1])))
        out: list[RefMatch] = []
        resume = 0
        seen: set[tuple] = set()
        for slot, binds, end in reported:
            first = binds[0][0]
            if first < resume:
                continue
            # Two parses that give the same events the same variables, emitted at the same
            # moment, are one match.
            labelled = (slot, tuple((p, variable_of(v)) for p, v in binds))
            if labelled in seen:
                continue
            seen.add(labelled)
            events: dict[str, list[Any]] = {}
            for p, v in binds:
                events.setdefault(variable_of(v), []).append(stream[p].id)
            out.append(RefMatch(events, stream[first].ts, end))
            resume = self._resume(binds, resume)
        return out

    def _pref(self, binds):
        return tuple((p, self.rank[v]) for p, v in binds)

    def _resume(self, binds, resume: int) -> int:
        first, last = binds[0][0], binds[-1][0]
        if self.skip == "past_last":
            return last + 1
        if self.skip == "to_next":
            return first + 1
        if self.skip == "no_skip":
            return resume
        positions = [p for p, v in binds if variable_of(v) == self.skip_var]
        if not positions:
            return first + 1
        target = positions[0] if self.skip == "to_first" else positions[-1]
        return target if target > first else first + 1

    # -- relaxed and any

    def _candidates(self, stream):
        """Rules (1) word prefix, (2) conditions, (3) within, (5) contiguity, by extension."""
        n = len(stream)
        out = []

        def extend(binds):
            word = [v for _, v in binds]
            if in_language(self.pattern, word):
                out.append(list(binds))
            last = binds[-1][0]
            for j in range(last + 1, n):
                if self.within_ms is not None and (
                    stream[j].ts - stream[binds[0][0]].ts > self.within_ms
                ):
                    break
                for v in self.variables:
                    if viable(self.pattern, word + [v]) and self.fits(stream, v, j, binds):
                        binds.append((j, v))
                        extend(binds)
                        binds.pop()
                if self.contiguity == "relaxed" and self._fits_viable(stream, j, binds, word):
                    # Event j fits a viable transition: no candidate may skip it.
                    break

        for i in range(n):
            for v in self.variables:
                if viable(self.pattern, [v]) and self.fits(stream, v, i, []):
                    extend([(i, v)])
        return out

    def _fits_viable(self, stream, j, binds, word) -> bool:
        return any(
            viable(self.pattern, word + [v]) and self.fits(stream, v, j, binds)
            for v in self.variables if variable_of(v) not in self.any_for
        )

    def _outcomes(self, stream, binds) -> set[str]:
        """Rule (4): derivations whose negations hold; 'plain' or 'absent' (trailing !x)."""
        found: set[str] = set()
        n = len(binds)

        def between_clear(i: int, pending) -> bool:
            lo, hi = binds[i - 1][0], binds[i][0]
            return not any(
                self.fits(stream, x, k, binds[:i]) for k in range(lo + 1, hi) for x in pending
            )

        def d(p, i, pending, k) -> bool:
            if isinstance(p, ast.PatVar):
                if i == n or binds[i][1] != p.name:
                    return False
                if pending and (i == 0 or not between_clear(i, pending)):
                    return False
                return k(i + 1, ())
            if isinstance(p, ast.PatAbsent):
                return k(i, pending + (p.name,))
            if isinstance(p, ast.PatSeq):
                def seq(idx, j, pend):
                    if idx == len(p.items):
                        return k(j, pend)
                    return d(p.items[idx], j, pend, lambda e, pe: seq(idx + 1, e, pe))
                return seq(0, i, pending)
            if isinstance(p, ast.PatAlt):
                return any(d(o, i, pending, k) for o in p.options)

            def rep(count, j, pend):
                if count >= p.min and k(j, pend):
                    return True
                if p.max is not None and count >= p.max:
                    return False
                return d(
                    p.inner, j, pend,
                    lambda e, pe: (e > j or count < p.min) and rep(count + 1, e, pe),
                )
            return rep(0, i, pending)

        def final(i, pending) -> bool:
            if i != n:
                return False
            if not pending:
                found.add("plain")
            elif self.within_ms is not None and self._absence_holds(stream, binds, pending):
                found.add("absent")
            return False  # keep exploring: collect every outcome

        d(self.pattern, 0, (), final)
        return found

    def _absence_holds(self, stream, binds, pending) -> bool:
        deadline = self.deadline(stream, binds)
        for k in range(binds[-1][0] + 1, len(stream)):
            if stream[k].ts > deadline:
                break
            if any(self.fits(stream, x, k, binds) for x in pending):
                return False
        return True

    def _non_strict(self, stream):
        cands = {}
        for binds in self._candidates(stream):
            outcomes = self._outcomes(stream, binds)
            if outcomes:
                cands[tuple(binds)] = outcomes
        plain = {b for b, o in cands.items() if "plain" in o}
        reported = []
        for binds, outcomes in cands.items():
            if "absent" in outcomes:
                d = self.deadline(stream, binds)
                reported.append((self.deadline_slot(d), list(binds), int(d)))
            if "plain" not in outcomes:
                continue
            if self._extended(binds, plain, GREEDY, longer=True):
                continue
            if self._extended(binds, plain, RELUCTANT, longer=False):
                continue
            word = [v for _, v in binds]
            grows = any(
                self.tails.get(v) == GREEDY and viable(self.pattern, word + [v])
                for v in self.variables
            )
            last = binds[-1][0]
            if grows:
                slot = self.deadline_slot(self.deadline(stream, binds))
            else:
                slot = self.event_slot(stream, last)
            reported.append((slot, list(binds), stream[last].ts))
        return reported

    def _extended(self, binds, plain, kind: str, longer: bool) -> bool:
        """Rule (6): a longer (greedy) / shorter (reluctant) form differing in tail events."""
        for other in plain:
            short, long_ = (binds, other) if longer else (other, binds)
            if len(long_) <= len(short) or long_[: len(short)] != short:
                continue
            if all(self.tails.get(v) == kind for _, v in long_[len(short):]):
                return True
        return False

    # -- strict: the first match in backtracking order per start position

    def _strict(self, stream):
        reported = []
        for s in range(len(stream)):
            found = self._strict_from(stream, s)
            if found is not None:
                reported.append(found)
        return reported

    def _strict_from(self, stream, s):
        n = len(stream)
        deaths: list[tuple] = []
        result: list = []

        def window_slot():
            if self.within_ms is None:
                return self.deadline_slot(math.inf)
            return self.deadline_slot(stream[s].ts + self.within_ms)

        def m(p, pos, binds, pending, k) -> bool:
            if isinstance(p, ast.PatVar):
                if pos >= n or (
                    self.within_ms is not None and stream[pos].ts - stream[s].ts > self.within_ms
                ):
                    deaths.append(window_slot())
                    return False
                if not self.fits(stream, p.name, pos, binds):
                    deaths.append(self.event_slot(stream, pos))
                    return False
                return k(pos + 1, binds + [(pos, p.name)], ())
            if isinstance(p, ast.PatAbsent):
                return k(pos, binds, pending + (p.name,))
            if isinstance(p, ast.PatSeq):
                def seq(idx, q, b, pend):
                    if idx == len(p.items):
                        return k(q, b, pend)
                    return m(p.items[idx], q, b, pend, lambda e, bb, pe: seq(idx + 1, e, bb, pe))
                return seq(0, pos, binds, pending)
            if isinstance(p, ast.PatAlt):
                return any(m(o, pos, binds, pending, k) for o in p.options)

            def more(count, q, b, pend):
                if p.max is not None and count >= p.max:
                    return False
                return m(
                    p.inner, q, b, pend,
                    lambda e, bb, pe: (e > q or count < p.min) and rep(count + 1, e, bb, pe),
                )

            def rep(count, q, b, pend):
                stop = count >= p.min
                if p.greedy:
                    return more(count, q, b, pend) or (stop and k(q, b, pend))
                return (stop and k(q, b, pend)) or more(count, q, b, pend)

            return rep(0, pos, binds, pending)

        def final(pos, binds, pending) -> bool:
            if not binds:
                return False
            if pending:
                if self.within_ms is None:
                    return False
                d = stream[s].ts + self.within_ms
                for k in range(binds[-1][0] + 1, n):
                    if stream[k].ts > d:
                        break
                    if any(self.fits(stream, x, k, binds) for x in pending):
                        deaths.append(self.event_slot(stream, k))
                        return False
                result.append((max([*deaths, self.deadline_slot(d)]), binds, int(d)))
                return True
            last = binds[-1][0]
            slot = max([*deaths, self.event_slot(stream, last)])
            result.append((slot, binds, stream[last].ts))
            return True

        m(self.pattern, s, [], (), final)
        return result[0] if result else None


# ---------------------------------------------------------------- harness for the NFA tests
# Kept here (next to the reference) so every test module drives the runtime the same way.

HEADER = "stream s (type string, v int, ts timestamp) time ts\n"


def rule_decl(text: str) -> ast.RuleDecl:
    """Parse ``rule ...`` text; stream ``s`` with fields ``type``, ``v``, ``ts`` is declared."""
    from query_lang.parser import parse

    return parse(HEADER + text).of_type(ast.RuleDecl)[0]


def is_type(t: str):
    """A condition ``type == t`` built from a plain lambda."""
    from cep.nfa.compiler import Condition

    return Condition(predicate=lambda f, ctx, t=t: f.get("type") == t)


def cond(fn: Predicate, *, variables: bool = False, prev: int = 0):
    """A condition from a lambda, flagging whether it reads bindings or ``prev``."""
    from cep.nfa.compiler import Condition

    return Condition(predicate=fn, reads_variables=variables, prev_depth=prev)


def compile_text(text: str, conditions: Mapping[str, Any] | None = None, **kw):
    from cep.nfa.compiler import compile_rule

    return compile_rule(rule_decl(text), conditions=conditions or {}, **kw)


def make_events(spec: Sequence[tuple], stream: str = "s") -> list:
    """``(type, v, ts)`` tuples -> events with ids 0, 1, 2 ..."""
    from cep.events.event import Event

    return [
        Event(id=i, stream=stream, ts=ts, seq=i, fields={"type": t, "v": v, "ts": ts})
        for i, (t, v, ts) in enumerate(spec)
    ]


def run_rule(rule, evs: Sequence[Any], *, watermarks: Mapping[int, float] | None = None,
             roundtrip: bool = True, end: bool = True) -> list:
    """Feed events one by one (``watermarks[i]`` is advanced to before event i), round-tripping
    the state through bytes between calls; end of input unless ``end`` is False."""
    from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event

    state = new_state(rule)
    out: list = []
    for i, e in enumerate(evs):
        if watermarks and i in watermarks:
            out += advance_watermark(rule, state, watermarks[i])
            if roundtrip:
                state = RuleState.from_bytes(state.to_bytes(), rule)
        out += process_event(rule, state, e)
        if roundtrip:
            state = RuleState.from_bytes(state.to_bytes(), rule)
    if end:
        out += advance_watermark(rule, state, math.inf)
    return out


def bound(matches) -> list[dict[str, list]]:
    return [m.events for m in matches]
