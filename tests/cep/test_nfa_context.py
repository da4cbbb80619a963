"""What conditions and ``emit`` may read: ``a.f``, ``first(v).f``, ``last(v).f``, running
aggregates (including the current event for a variable's own condition) and ``prev(f, n)``.

These rules go through the parser and the real expression compiler.
"""

from __future__ import annotations

import math

import pytest

from cep.events.event import Event
from cep.nfa.compiler import compile_rule
from cep.nfa.runtime import advance_watermark, new_state, process_event
from query_lang import ast
from query_lang.parser import parse

HEADER = "stream s (k string, v int, ts timestamp) time ts\n"


def compiled(text: str):
    module = parse(HEADER + text)
    streams = {d.name: d for d in module.of_type(ast.StreamDecl)}
    return compile_rule(module.of_type(ast.RuleDecl)[0], streams=streams)


def run(text: str, values: list[int | None]):
    rule = compiled(text)
    state = new_state(rule)
    out = []
    for i, v in enumerate(values):
        fields = {"k": "x", "v": v, "ts": i}
        out += process_event(rule, state, Event(i, "s", i, i, fields))
    out += advance_watermark(rule, state, math.inf)
    return out


def test_field_of_an_earlier_variable():
    got = run("rule r from s by k pattern a b define b as v == a.v + 1 "
              "emit a.v as first, b.v as second", [3, 9, 4])
    assert [(m.events, m.values) for m in got] == [
        ({"a": [0], "b": [2]}, {"first": 3, "second": 4}),
    ]


def test_running_aggregates_include_the_current_event():
    # Each b must keep the running sum of b's at most 10; count(b) sees the candidate too.
    text = ("rule r from s by k pattern a b+ c define a as v == 0, b as sum(b.v) <= 10 and "
            "count(b) <= 3, c as v == 100 emit count(b) as n, sum(b.v) as total, "
            "avg(b.v) as mean, min(b.v) as lo, max(b.v) as hi contiguity strict")
    assert run(text, [0, 4, 5, 100])[0].values == {
        "n": 2, "total": 9, "mean": 4.5, "lo": 4, "hi": 5,
    }
    assert run(text, [0, 4, 5, 2, 100]) == []  # 4 + 5 + 2 > 10: the third b does not fit
    assert run(text, [0, 1, 1, 1, 1, 100]) == []  # count(b) would reach 4


def test_first_and_last_of_a_quantified_variable():
    text = ("rule r from s by k pattern a+ b define a as v > 0, "
            "b as v == first(a).v * 10 + last(a).v emit first(a).v as f, last(a).v as l")
    got = run(text, [1, 2, 3, 13])
    assert [(m.events, m.values) for m in got] == [
        ({"a": [0, 1, 2], "b": [3]}, {"f": 1, "l": 3}),
    ]


@pytest.mark.parametrize(("n", "expected"), [(1, [{"a": [2]}]), (2, [{"a": [2]}, {"a": [3]}])])
def test_prev_reads_the_partition_not_the_match(n, expected):
    text = f"rule r from s by k pattern a define a as v > prev(v, {n}) + 5"
    assert [m.events for m in run(text, [0, 1, 9, 8])] == expected


def test_prev_before_the_first_event_is_null_and_false():
    assert run("rule r from s by k pattern a define a as v > prev(v)", [5]) == []
    rule = compiled("rule r from s by k pattern a define a as v > prev(v, 3)")
    assert rule.prev_depth == 3 and rule.needs_every_event


def test_null_fields_never_fail_a_rule():
    text = "rule r from s by k pattern a b define b as v > a.v"
    assert [m.events for m in run(text, [None, 3, 4])] == [{"a": [1], "b": [2]}]


def test_emit_is_null_safe():
    got = run("rule r from s by k pattern a b emit a.v + b.v as total", [None, 2])
    assert got[0].values == {"total": None}


def test_without_emit_values_hold_the_key():
    got = run("rule r from s by k pattern a b", [1, 2])
    assert got[0].values == {"k": "x"} and got[0].key == {"k": "x"}
