"""Contiguity modes: strict (consecutive events), relaxed (skip-till-next-match), any."""

from __future__ import annotations

from reference_matcher import bound, compile_text, is_type, make_events, run_rule

TYPES = {v: is_type(v) for v in "abc"}

# a b x b c: "x" fits nothing; the second b fits b.
STREAM = make_events([("a", 0, 1), ("b", 0, 2), ("x", 0, 3), ("b", 0, 4), ("c", 0, 5)])


def matches(contiguity: str, pattern: str = "a b c", skip: str = "no skip"):
    rule = compile_text(
        f"rule r from s pattern {pattern} contiguity {contiguity} after match {skip}", TYPES
    )
    return bound(run_rule(rule, STREAM))


def test_strict_requires_consecutive_events():
    assert matches("strict") == []
    assert matches("strict", "a b") == [{"a": [0], "b": [1]}]
    assert matches("strict", "b c") == [{"b": [3], "c": [4]}]


def test_relaxed_skips_events_that_fit_nothing_but_not_those_that_fit():
    # After a b, the second b fits no transition of `a b c` (c is next): it is skipped, and so
    # is x. From a alone, b0 must be taken: a b(3) c is not a match.
    assert matches("relaxed") == [{"a": [0], "b": [1], "c": [4]}]


def test_relaxed_takes_the_next_fitting_event():
    rule = compile_text("rule r from s pattern a b after match no skip", TYPES)
    assert bound(run_rule(rule, STREAM)) == [{"a": [0], "b": [1]}]


def test_any_reports_every_combination():
    assert matches("any") == [
        {"a": [0], "b": [1], "c": [4]},
        {"a": [0], "b": [3], "c": [4]},
    ]


def test_relaxed_branches_when_an_event_fits_two_transitions():
    conditions = {"a": is_type("a"), "b": is_type("b"), "c": is_type("b")}
    rule = compile_text("rule r from s pattern a (b | c) after match no skip", conditions)
    got = bound(run_rule(rule, make_events([("a", 0, 1), ("b", 0, 2)])))
    assert got == [{"a": [0], "b": [1]}, {"a": [0], "c": [1]}]


def test_strict_prefers_left_alternative_per_start():
    conditions = {"a": is_type("a"), "b": is_type("b"), "c": is_type("b")}
    rule = compile_text("rule r from s pattern a (c | b) contiguity strict", conditions)
    got = bound(run_rule(rule, make_events([("a", 0, 1), ("b", 0, 2)])))
    assert got == [{"a": [0], "c": [1]}]


def test_strict_is_flagged_as_needing_every_event():
    assert compile_text("rule r from s pattern a b contiguity strict", TYPES).needs_every_event
    assert not compile_text("rule r from s pattern a b", TYPES).needs_every_event
    assert not compile_text("rule r from s pattern a b contiguity any", TYPES).needs_every_event
