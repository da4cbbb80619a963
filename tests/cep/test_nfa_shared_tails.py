"""Shared tails: the members of a cohort's segment that take an event together take it with one
binding link (``cep.nfa.state._Cohort``), and that must change nothing anyone can see.

With tails shared from segments of 1, 2 or 3 members (the threshold is lowered so that small
streams reach it), ``contiguity any`` / ``relaxed`` patterns with quantifiers at caps of 1 to 8
must report the same matches in the same order, keep the same partial matches (same binding
lists, steps, start, age) and drop as many after every event as with a link per partial match,
the representation before shared tails; when the cap dropped nothing, the matches are the
brute-force reference's. The state is round-tripped through its bytes at random points.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from itertools import accumulate

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_matcher import (
    ReferenceMatcher,
    RefEvent,
    compile_text,
    cond,
    is_type,
    make_events,
    rule_decl,
)
from test_differential import _reference, _runtime, scenario

from cep.nfa import state as state_module
from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event
from cep.nfa.state import _Binding, _Cohort, _Event, join_cohorts

#: CI runs this many examples per test; set VIGIL_SHARED_TAIL_EXAMPLES for a longer local run.
EXAMPLES = int(os.environ.get("VIGIL_SHARED_TAIL_EXAMPLES", "200"))

#: A threshold no segment reaches: every partial match takes an event with a link of its own.
PER_MATCH = 10**9


@contextmanager
def shared_tail_at(members: int):
    saved = state_module.SHARED_TAIL_AT
    state_module.SHARED_TAIL_AT = members
    try:
        yield
    finally:
        state_module.SHARED_TAIL_AT = saved


def _last_a_at_most(f, c):
    """``b``: a ``b`` whose v is at least the last ``a``'s (reads the bindings so far)."""
    seen = c.bound("a")
    return f["type"] == "b" and (not seen or f["v"] >= seen[-1]["v"])


def _few_bs(f, c):
    """``b``: at most three ``b``s so far, this one included (reads its own bindings)."""
    return f["type"] == "b" and len(c.bound("b")) <= 3


def _x_over_last_b(f, c):
    """``x`` (negated): an ``x`` whose v is at least the last ``b``'s."""
    seen = c.bound("b")
    return f["type"] == "x" and bool(seen) and f["v"] >= seen[-1]["v"]


TYPES = {v: is_type(v) for v in "abcx"}
B_CONDITIONS = {
    "type": None,
    "last a": cond(_last_a_at_most, variables=True),
    "count": cond(_few_bs, variables=True),
}
REFERENCE_B = {"last a": _last_a_at_most, "count": _few_bs}
X_CONDITIONS = {"type": None, "last b": cond(_x_over_last_b, variables=True)}

PATTERNS = [
    "a b+ c",
    "a b* c",
    "a+ b",
    "a b+",
    "a b+ c+",
    "a b+? c",
    "a+? b+ c",
    "a (b | c)+ a",
    "(a | b)+ c",
    "a b{2,} c",
    "a !x b+ c",
    "a b+ !x c",
    "a b+ c within 5ms",
    "a b+ !x within 4ms",
]


def _rule_text(pattern: str, contiguity: str, partials: str, skip: str) -> str:
    return (
        f"rule r from s pattern {pattern} contiguity {contiguity} partials {partials} "
        f"after match {skip}"
    )


def _snapshot(state: RuleState) -> list[tuple]:
    """What the cap and the runtime may see of the partial matches, oldest first."""
    return [
        (
            [(b.event.pos, b.place) for b in p.node.chain()], p.letters, sorted(p.blocked),
            p.supersedes, p.after_reluctant, p.start_pos, p.start_ts, p.born,
        )
        for p in state.partials
    ]


def _run(rule, events, round_trips: set[int]) -> tuple[list, list]:
    """Matches (events, start, end) in order, and after every event the dropped count and the
    partial matches; the state goes through its bytes after the events in ``round_trips``."""
    state = new_state(rule)
    out, trace = [], []
    for i, e in enumerate(events):
        out += process_event(rule, state, e)
        trace.append((state.dropped_partials, _snapshot(state), len(state.held)))
        if i in round_trips:
            data = state.to_bytes()
            state = RuleState.from_bytes(data, rule)
            assert state.to_bytes() == data
    out += advance_watermark(rule, state, math.inf)
    trace.append((state.dropped_partials, _snapshot(state), len(state.held)))
    return [(m.events, m.start_ms, m.end_ms) for m in out], trace


@st.composite
def capped_case(draw):
    pattern = draw(st.sampled_from(PATTERNS))
    contiguity = draw(st.sampled_from(["any", "any", "relaxed"]))
    partials = draw(st.sampled_from(["all", "all", "all", "latest"]))
    skip = draw(st.sampled_from(["no skip", "skip past last", "skip to next"]))
    b_condition = draw(st.sampled_from(sorted(B_CONDITIONS)))
    x_condition = draw(st.sampled_from(sorted(X_CONDITIONS)))
    cap = draw(st.integers(1, 8))
    spec = draw(
        st.lists(
            st.tuples(st.sampled_from("aabbbcx"), st.integers(0, 3), st.integers(0, 2)),
            min_size=4,
            max_size=16,
        )
    )
    round_trips = set(draw(st.lists(st.integers(0, 15), max_size=4)))
    shared_at = draw(st.sampled_from([1, 2, 3]))
    conditions = (b_condition, x_condition)
    return pattern, contiguity, partials, skip, conditions, cap, spec, round_trips, shared_at


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capped_case())
def test_shared_tails_change_nothing_at_the_cap(case):
    pattern, contiguity, partials, skip, (b_condition, x_condition), cap, spec, round_trips, \
        shared_at = case
    text = _rule_text(pattern, contiguity, partials, skip)
    conditions = dict(TYPES)
    if B_CONDITIONS[b_condition] is not None:
        conditions["b"] = B_CONDITIONS[b_condition]
    if X_CONDITIONS[x_condition] is not None:
        conditions["x"] = X_CONDITIONS[x_condition]
    rule = compile_text(text, conditions, max_partials=cap)
    times = list(accumulate(gap for _, _, gap in spec))
    events = make_events([(t, v, ts) for (t, v, _), ts in zip(spec, times, strict=True)])
    with shared_tail_at(PER_MATCH):
        expected, expected_trace = _run(rule, events, round_trips)
    with shared_tail_at(shared_at):
        got, trace = _run(rule, events, round_trips)
    context = f"{text} cap={cap} b={b_condition} x={x_condition} shared_at={shared_at} {spec}"
    assert got == expected, context
    assert trace == expected_trace, context
    if partials == "all" and trace[-1][0] == 0:
        # Nothing dropped: the cap changed nothing, so the reference applies.
        decl = rule_decl(text)
        predicates = {v: (lambda f, c, v=v: f["type"] == v) for v in "abcx"}
        if b_condition in REFERENCE_B:
            predicates["b"] = REFERENCE_B[b_condition]
        if x_condition == "last b":
            predicates["x"] = _x_over_last_b
        matcher = ReferenceMatcher(
            decl.pattern, predicates, contiguity=contiguity, skip=decl.skip.kind,
            within_ms=rule.within_ms,
        )
        stream = [RefEvent(e.id, e.ts, e.fields) for e in events]
        assert got == [(m.events, m.start_ms, m.end_ms) for m in matcher.run(stream)], context


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.sampled_from([1, 2]))
def test_shared_tails_match_the_reference(case, shared_at):
    """The differential test's random patterns, with tails shared from 1 or 2 members."""
    pattern, conds, contiguity, skip, skip_var, within, stream, splits = case
    expected = _reference(pattern, conds, contiguity, skip, skip_var, within, stream)
    with shared_tail_at(shared_at):
        got = _runtime(pattern, conds, contiguity, skip, skip_var, within, stream, splits)
    assert got == expected


def test_a_large_cohort_takes_an_event_with_one_link():
    """Above the threshold every member's list grows by the same shared link; the lists read
    back (matches, bytes) are those of a link per partial match."""
    rule = compile_text("rule r from s pattern a b+ c contiguity any", TYPES)
    spec = [("a", 0, i) for i in range(40)] + [("b", 0, 40 + i) for i in range(3)]
    results = []
    for shared_at in (PER_MATCH, state_module.SHARED_TAIL_AT):
        with shared_tail_at(shared_at):
            state = new_state(rule)
            for e in make_events(spec):
                process_event(rule, state, e)
            results.append((_snapshot(state), state.to_bytes(), state))
    (per_match, _, _), (shared, data, state) = results
    assert per_match == shared
    big = max(state.cohorts, key=len)
    assert len(big) >= 40 and big.tails[-1] is not None
    # The 40 a's that took all three b's share one tail of three links.
    assert len(big.tails[-1].chain()) == 3 and big.ends[-1] - big.ends[-2] >= 40
    again = RuleState.from_bytes(data, rule)
    assert _snapshot(again) == shared and again.to_bytes() == data
    tail = make_events(spec + [("c", 0, 99)])[-1:]
    assert [m.events for m in process_event(rule, state, tail[0])] == [
        m.events for m in process_event(rule, again, tail[0])
    ]


# ---------------------------------------------------------------- the cohort's operations


def _lists(cohort: _Cohort) -> list[list[tuple[int, int]]]:
    return [[(b.event.pos, b.place) for b in n.chain()] if n else [] for n in cohort.nodes()]


def _check(cohort: _Cohort, model: list[list[tuple[int, int]]]) -> None:
    """``cohort`` holds the binding lists ``model`` (one per member, in order), read any way."""
    assert _lists(cohort) == model
    assert [
        [(b.event.pos, b.place) for b in cohort.member(i).node.chain()] for i in range(len(model))
    ] == model
    assert len(cohort) == len(model) == len(cohort.start_pos) == len(cohort.born)
    assert cohort.ends[-1] == len(model) and len(cohort.ends) == len(cohort.tails)
    spans = list(cohort.segments())
    assert [lo for lo, _, _ in spans] == [0, *cohort.ends[:-1]]
    assert all(lo < hi for lo, hi, _ in spans)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(0, 2)),
        st.tuples(st.just("select"), st.lists(st.booleans(), min_size=1, max_size=40)),
        st.tuples(st.just("drop"), st.integers(0, 39)),
        st.tuples(st.just("join"), st.integers(0, 5)),
    ),
    max_size=25,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(1, 12), st.sampled_from([1, 2, 3, 4]), OPS)
def test_cohort_operations_keep_every_members_binding_list(size, shared_at, ops):
    """Take, select, drop the oldest and join, in any order, on segments with and without
    tails: each member's list is what a list per member would say, and a cohort that gave
    children, a selection or its oldest members away is left as it was."""
    pos = iter(range(10**6))

    def event() -> _Event:
        p = next(pos)
        return _Event(p, p, "s", p, {})

    heads = [_Binding(None, 0, event()) for _ in range(size)]
    cohort = _Cohort((0,), frozenset(), (), False, heads, (size,), (None,), list(range(size)),
                     list(range(size)), list(range(size)))
    model = [[(h.event.pos, 0)] for h in heads]
    with shared_tail_at(shared_at):
        for op, arg in ops:
            before, before_model = cohort, model
            if op == "take":
                e = event()
                cohort = _Cohort((0,), frozenset(), (), False, *cohort.taken(arg, e),
                                 cohort.start_pos.copy(), cohort.start_ts.copy(), cohort.born)
                model = [m + [(e.pos, arg)] for m in model]
            elif op == "select":
                members = [i for i in range(len(model)) if arg[i % len(arg)]]
                if not members:
                    continue
                cohort = cohort.select(members)
                model = [model[i] for i in members]
            elif op == "drop":
                if arg >= len(model):
                    continue
                cohort = cohort.drop_oldest(arg)
                model = model[arg:]
            else:
                # Joining appends a newer cohort (here: a selection of this one) to the older.
                members = list(range(arg % len(model), len(model)))
                newer = cohort.select(members)
                if newer is cohort:  # all of them: a copy
                    newer = _Cohort(
                        (0,), frozenset(), (), False, list(cohort.heads), cohort.ends,
                        cohort.tails, list(cohort.start_pos), list(cohort.start_ts),
                        list(cohort.born),
                    )
                (cohort,) = join_cohorts([cohort, newer])
                model = model + [model[i] for i in members]
                _check(cohort, model)
                continue
            _check(cohort, model)
            if cohort is not before:
                _check(before, before_model)
