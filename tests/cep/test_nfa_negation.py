"""Negation ``a !x b`` and trailing absence ``a !x`` (with ``within``)."""

from __future__ import annotations

import pytest
from reference_matcher import bound, compile_text, cond, is_type, make_events, run_rule

from cep.nfa.errors import RuleCompileError
from cep.nfa.runtime import advance_watermark, new_state, process_event

TYPES = {v: is_type(v) for v in "abcx"}


def run(text: str, spec, **kw):
    return bound(run_rule(compile_text(text, TYPES), make_events(spec), **kw))


def test_negation_between_two_elements():
    text = "rule r from s pattern a !x b after match no skip"
    assert run(text, [("a", 0, 1), ("b", 0, 2)]) == [{"a": [0], "b": [1]}]
    assert run(text, [("a", 0, 1), ("x", 0, 2), ("b", 0, 3)]) == []
    # The x lies before the second a: a(2) b(3) still matches, a(0) b(3) does not.
    got = run(text, [("a", 0, 1), ("x", 0, 2), ("a", 0, 3), ("b", 0, 4)])
    assert got == [{"a": [2], "b": [3]}]
    assert run(text, [("x", 0, 1), ("a", 0, 2), ("b", 0, 3)]) == [{"a": [1], "b": [2]}]


def test_negation_after_a_quantifier_counts_from_its_last_event():
    text = "rule r from s pattern a+ !x b after match skip past last"
    # x between a(0) and a(2): fine, only events between the last a and b count.
    got = run(text, [("a", 0, 1), ("x", 0, 2), ("a", 0, 3), ("b", 0, 4)])
    assert got == [{"a": [0, 2], "b": [3]}]


def test_negation_condition_reads_the_bindings_so_far():
    conditions = dict(TYPES)
    conditions["x"] = cond(lambda f, ctx: f["v"] == ctx.bound("a")[-1]["v"], variables=True)
    rule = compile_text("rule r from s pattern a !x b", conditions)
    same = make_events([("a", 7, 1), ("c", 7, 2), ("b", 0, 3)])
    other = make_events([("a", 7, 1), ("c", 8, 2), ("b", 0, 3)])
    assert bound(run_rule(rule, same)) == []
    assert bound(run_rule(rule, other)) == [{"a": [0], "b": [2]}]


def test_trailing_absence_fires_at_the_deadline_with_end_at_the_deadline():
    rule = compile_text("rule r from s pattern a !x within 10ms", TYPES)
    state = new_state(rule)
    assert process_event(rule, state, make_events([("a", 0, 5)])[0]) == []
    assert state.next_timer_ms == 16
    assert advance_watermark(rule, state, 15) == []
    (m,) = advance_watermark(rule, state, 16)
    assert (m.events, m.start_ms, m.end_ms) == ({"a": [0]}, 5, 15)
    assert m.to_json()["end"] == "1970-01-01T00:00:00.015Z"


def test_trailing_absence_is_cancelled_by_an_event_up_to_the_deadline():
    text = "rule r from s pattern a !x within 10ms"
    assert run(text, [("a", 0, 5), ("x", 0, 15)]) == []
    assert run(text, [("a", 0, 5), ("x", 0, 16)]) == [{"a": [0]}]


def test_trailing_absence_under_strict_contiguity():
    text = "rule r from s pattern a b !x contiguity strict within 10ms"
    assert run(text, [("a", 0, 1), ("b", 0, 2), ("c", 0, 3)]) == [{"a": [0], "b": [1]}]
    assert run(text, [("a", 0, 1), ("b", 0, 2), ("x", 0, 3)]) == []


def test_trailing_absence_needs_within():
    with pytest.raises(RuleCompileError, match="needs `within D`"):
        compile_text("rule r from s pattern a !x", TYPES)


@pytest.mark.parametrize("pattern", ["!x a", "(!x a) b", "a | !x b"])
def test_negation_may_not_start_a_pattern(pattern):
    with pytest.raises(RuleCompileError, match="must follow another pattern element"):
        compile_text(f"rule r from s pattern {pattern} within 1m", TYPES)


def test_negation_makes_the_rule_need_every_event():
    assert compile_text("rule r from s pattern a !x b", TYPES).needs_every_event
