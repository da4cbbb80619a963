"""Quantifiers ``? * + {n} {n,} {n,m} {,m}``, greedy and reluctant, and when they emit."""

from __future__ import annotations

import pytest
from reference_matcher import bound, compile_text, is_type, make_events, run_rule

from cep.nfa.errors import RuleCompileError
from cep.nfa.runtime import advance_watermark, new_state, process_event

TYPES = {v: is_type(v) for v in "abc"}


def run(pattern: str, spec, *, contiguity="relaxed", skip="no skip", within=""):
    rule = compile_text(
        f"rule r from s pattern {pattern} contiguity {contiguity} {within} after match {skip}",
        TYPES,
    )
    return bound(run_rule(rule, make_events(spec)))


ABBBC = [("a", 0, 1), ("b", 0, 2), ("b", 0, 3), ("b", 0, 4), ("c", 0, 5)]


@pytest.mark.parametrize(
    ("quantifier", "expected_bs"),
    [
        ("b*", [1, 2, 3]),
        ("b+", [1, 2, 3]),
        ("b{3}", [1, 2, 3]),
        ("b{2,}", [1, 2, 3]),
        ("b{1,3}", [1, 2, 3]),
        ("b{,3}", [1, 2, 3]),
    ],
)
def test_each_quantifier_in_the_middle(quantifier, expected_bs):
    got = run(f"a {quantifier} c", ABBBC, skip="skip past last")
    assert got == [{"a": [0], "b": expected_bs, "c": [4]}]


def test_optional_in_the_middle():
    # After a b, further b's fit no transition of `a b? c` and are skipped.
    assert run("a b? c", ABBBC) == [{"a": [0], "b": [1], "c": [4]}]
    assert run("a b? c", [("a", 0, 1), ("c", 0, 2)]) == [{"a": [0], "c": [1]}]


def test_bounded_quantifiers_reject_too_few_or_too_many():
    assert run("a b{4} c", ABBBC) == []
    assert run("a b{1,2} c", ABBBC, contiguity="strict") == []
    assert run("a b{,2} c", ABBBC, contiguity="strict") == []
    assert run("a b{3,5} c", ABBBC, contiguity="strict") == [{"a": [0], "b": [1, 2, 3], "c": [4]}]


def test_trailing_greedy_reports_the_longest_form_at_end_of_input():
    rule = compile_text("rule r from s pattern a b+", TYPES)
    state = new_state(rule)
    emitted = []
    for e in make_events(ABBBC[:4]):
        emitted += process_event(rule, state, e)
    assert emitted == []  # could still grow
    assert bound(advance_watermark(rule, state, float("inf"))) == [{"a": [0], "b": [1, 2, 3]}]


def test_trailing_greedy_emits_when_the_window_closes():
    rule = compile_text("rule r from s pattern a b+ within 10ms", TYPES)
    state = new_state(rule)
    for e in make_events(ABBBC[:3]):
        assert process_event(rule, state, e) == []
    assert advance_watermark(rule, state, 11) == []
    (m,) = advance_watermark(rule, state, 12)  # passes first.ts (1) + 10
    assert m.events == {"a": [0], "b": [1, 2]}


def test_trailing_bounded_greedy_emits_as_soon_as_it_cannot_grow():
    rule = compile_text("rule r from s pattern a b{1,2}", TYPES)
    state = new_state(rule)
    out = []
    for e in make_events(ABBBC[:3]):
        out += process_event(rule, state, e)
    assert bound(out) == [{"a": [0], "b": [1, 2]}]


def test_trailing_reluctant_reports_the_shortest_form_at_once():
    rule = compile_text("rule r from s pattern a b+? after match no skip", TYPES)
    state = new_state(rule)
    out = []
    for e in make_events(ABBBC):
        out += process_event(rule, state, e)
    assert bound(out) == [{"a": [0], "b": [1]}]


def test_strict_greedy_and_reluctant_preference():
    assert run("a b+", ABBBC, contiguity="strict") == [
        {"a": [0], "b": [1, 2, 3]},
    ]
    assert run("a b+?", ABBBC, contiguity="strict") == [{"a": [0], "b": [1]}]
    assert run("a b*? c", ABBBC, contiguity="strict") == [{"a": [0], "b": [1, 2, 3], "c": [4]}]


def test_strict_optional_prefers_taking():
    assert run("a b? ", ABBBC[:2], contiguity="strict") == [{"a": [0], "b": [1]}]
    assert run("a b?? ", ABBBC[:2], contiguity="strict") == [{"a": [0]}]


def test_group_quantifier():
    spec = [("a", 0, 1), ("b", 0, 2), ("a", 0, 3), ("b", 0, 4), ("c", 0, 5)]
    assert run("(a b){2} c", spec) == [{"a": [0, 2], "b": [1, 3], "c": [4]}]
    assert run("(a b)+ c", spec, skip="skip past last") == [{"a": [0, 2], "b": [1, 3], "c": [4]}]


def test_huge_bounds_are_rejected_with_a_clear_error():
    with pytest.raises(RuleCompileError, match="too large"):
        compile_text("rule r from s pattern a{1,5000}", TYPES)


@pytest.mark.parametrize(
    ("pattern", "spec", "contiguity", "expected"),
    [
        # The first iteration (mandatory) is empty, as a?? prefers; the optional ones may not
        # be, so each takes an event.
        ("(a??){1,3}", [("a", 0, 1), ("a", 0, 2)], "strict", [{"a": [0, 1]}]),
        ("(a?){2} b", [("a", 0, 1), ("a", 0, 2), ("b", 0, 3)], "strict",
         [{"a": [0, 1], "b": [2]}]),
        # (a? b?)* cannot loop on nothing: the match ends where the events stop fitting.
        ("c (a? b?)* c", [("c", 0, 1), ("a", 0, 2), ("b", 0, 3), ("b", 0, 4), ("c", 0, 5)],
         "strict", [{"c": [0, 4], "a": [1], "b": [2, 3]}]),
    ],
)
def test_quantified_elements_that_may_match_nothing(pattern, spec, contiguity, expected):
    assert run(pattern, spec, contiguity=contiguity, skip="skip past last") == expected
