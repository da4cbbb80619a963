"""``within D``: matches span at most D of event time; older partial matches are discarded."""

from __future__ import annotations

from reference_matcher import bound, compile_text, is_type, make_events, run_rule

from cep.nfa.runtime import advance_watermark, new_state, process_event

TYPES = {v: is_type(v) for v in "ab"}


def run(text, spec):
    return bound(run_rule(compile_text(text, TYPES), make_events(spec)))


def test_within_is_inclusive():
    text = "rule r from s pattern a b within 5ms"
    assert run(text, [("a", 0, 0), ("b", 0, 5)]) == [{"a": [0], "b": [1]}]
    assert run(text, [("a", 0, 0), ("b", 0, 6)]) == []


def test_within_under_strict_contiguity():
    text = "rule r from s pattern a b+ contiguity strict within 5ms"
    got = run(text, [("a", 0, 0), ("b", 0, 2), ("b", 0, 5), ("b", 0, 6)])
    assert got == [{"a": [0], "b": [1, 2]}]


def test_watermark_discards_expired_partial_matches():
    rule = compile_text("rule r from s pattern a b within 5ms", TYPES)
    state = new_state(rule)
    process_event(rule, state, make_events([("a", 0, 10)])[0])
    assert not state.is_empty
    assert state.next_timer_ms == 16
    assert advance_watermark(rule, state, 15) == [] and not state.is_empty
    assert advance_watermark(rule, state, 16) == [] and state.is_empty
    assert state.next_timer_ms is None


def test_without_within_partial_matches_wait_for_the_end_of_input():
    rule = compile_text("rule r from s pattern a b", TYPES)
    state = new_state(rule)
    process_event(rule, state, make_events([("a", 0, 10)])[0])
    assert advance_watermark(rule, state, 10**15) == [] and not state.is_empty
    assert state.next_timer_ms is None
    assert advance_watermark(rule, state, float("inf")) == [] and state.is_empty


def test_an_event_implies_the_watermark_of_its_key():
    # A later event of the key passes the window of earlier partial matches by itself.
    rule = compile_text("rule r from s pattern a b+ within 5ms", TYPES)
    state = new_state(rule)
    out = []
    for e in make_events([("a", 0, 0), ("b", 0, 1), ("a", 0, 20)]):
        out += process_event(rule, state, e)
    assert bound(out) == [{"a": [0], "b": [1]}]
