"""``partials latest`` (one partial match per NFA state and key) and the ``max_partials`` cap."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from reference_matcher import bound, compile_text, is_type, make_events, run_rule

from cep.nfa.runtime import RuleState, new_state, process_event

TYPES = {v: is_type(v) for v in "abc"}


def test_latest_keeps_only_the_newest_partial_match_per_state():
    spec = [("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("b", 0, 4)]
    all_ = compile_text("rule r from s pattern a b after match no skip", TYPES)
    latest = compile_text("rule r from s pattern a b partials latest after match no skip", TYPES)
    assert bound(run_rule(all_, make_events(spec))) == [
        {"a": [0], "b": [3]}, {"a": [1], "b": [3]}, {"a": [2], "b": [3]},
    ]
    assert bound(run_rule(latest, make_events(spec))) == [{"a": [2], "b": [3]}]


def test_latest_bounds_memory():
    rule = compile_text("rule r from s pattern a b c partials latest", TYPES)
    state = new_state(rule)
    for e in make_events([("a", 0, i) for i in range(200)] + [("b", 0, 300)]):
        process_event(rule, state, e)
    assert state.partial_count <= 2


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["a b c", "a b+ c", "a (b | c) c", "a !b c within 5ms", "a b{2} c"]),
    st.sampled_from(["relaxed", "any", "strict"]),
    st.lists(st.tuples(st.sampled_from("abc"), st.just(0), st.integers(0, 9)), max_size=9),
)
def test_latest_reports_a_subset_of_all(pattern, contiguity, spec):
    spec = sorted(spec, key=lambda e: e[2])
    text = f"rule r from s pattern {pattern} contiguity {contiguity} after match no skip"
    all_ = compile_text(text, TYPES)
    latest = compile_text(text.replace("pattern", "partials latest pattern"), TYPES)
    everything = bound(run_rule(all_, make_events(spec)))
    subset = bound(run_rule(latest, make_events(spec)))
    assert all(m in everything for m in subset)


def test_overflow_drops_the_oldest_partial_and_counts_it():
    rule = compile_text("rule r from s pattern a b after match no skip", TYPES, max_partials=3)
    state = new_state(rule)
    for e in make_events([("a", 0, i) for i in range(5)]):
        assert process_event(rule, state, e) == []
        state = RuleState.from_bytes(state.to_bytes(), rule)
    assert state.partial_count == 3
    assert state.dropped_partials == 2
    out = process_event(rule, state, make_events([("b", 0, 9)])[0])
    # The two oldest a's (ids 0 and 1) were dropped; ids in these events restart at 0, so
    # compare the start times instead.
    assert sorted(m.start_ms for m in out) == [2, 3, 4]


def test_overflow_never_crashes_on_strict_runs():
    rule = compile_text("rule r from s pattern a+ b contiguity strict", TYPES, max_partials=2)
    state = new_state(rule)
    for e in make_events([("a", 0, i) for i in range(6)]):
        process_event(rule, state, e)
    assert state.partial_count <= 2 and state.dropped_partials > 0
    assert math.isfinite(state.dropped_partials)


def test_latest_under_strict_keeps_one_alternative_per_step():
    rule = compile_text("rule r from s pattern a+ b contiguity strict partials latest", TYPES)
    state = new_state(rule)
    for e in make_events([("a", 0, i) for i in range(6)]):
        process_event(rule, state, e)
        letters = [entry[0] for run in state.runs for entry in run.entries]
        assert len(letters) == len(set(letters))
    out = process_event(rule, state, make_events([("b", 0, 9)])[0])
    # Only the newest run survives: it started at the last a.
    assert [m.start_ms for m in out] == [5]
