"""After-match skip strategies (SQL:2016 AFTER MATCH SKIP)."""

from __future__ import annotations

import pytest
from reference_matcher import bound, compile_text, is_type, make_events, run_rule

from cep.nfa.errors import RuleCompileError

TYPES = {v: is_type(v) for v in "ab"}

# a a b b: with `any` contiguity the candidates of `a+ b` are many; the skip decides.
STREAM = make_events([("a", 0, 1), ("a", 0, 2), ("b", 0, 3), ("b", 0, 4)])


def run(skip: str, pattern: str = "a b", contiguity: str = "any"):
    rule = compile_text(
        f"rule r from s pattern {pattern} contiguity {contiguity} after match {skip}", TYPES
    )
    return bound(run_rule(rule, STREAM))


def test_no_skip_reports_every_match():
    assert run("no skip") == [
        {"a": [0], "b": [2]}, {"a": [1], "b": [2]}, {"a": [0], "b": [3]}, {"a": [1], "b": [3]},
    ]


def test_skip_past_last_resumes_after_the_last_event():
    assert run("skip past last") == [{"a": [0], "b": [2]}, ]


def test_skip_to_next_resumes_after_the_first_event():
    assert run("skip to next") == [{"a": [0], "b": [2]}, {"a": [1], "b": [2]}]


def test_skip_to_first_and_last_variable():
    pattern = "a+ b"
    assert run("skip to first b", pattern, "strict") == [{"a": [0, 1], "b": [2]}]
    # skip to last a: resume at the last a (1) -> the strict run started at 1 is reported.
    assert run("skip to last a", pattern, "strict") == [
        {"a": [0, 1], "b": [2]}, {"a": [1], "b": [2]},
    ]


def test_skip_to_a_variable_at_the_first_position_behaves_like_to_next():
    # skip to first a would resume at the match's own start: fall back to `to next`.
    assert run("skip to first a") == run("skip to next")


def test_skip_to_an_unknown_variable_is_rejected():
    with pytest.raises(RuleCompileError, match="names no variable"):
        compile_text("rule r from s pattern a b after match skip to first z", TYPES)
