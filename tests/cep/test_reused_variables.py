"""Patterns that name one variable at several places (``a b a``): the variable binds every
event taken at any of them, as in MATCH_RECOGNIZE; a partial match is a parse (which place
took each event), not a labelling (docs/semantics.md, rule 1 and §7)."""

from __future__ import annotations

import pytest
from reference_matcher import bound, compile_text, make_events, run_rule
from test_differential import _reference, _runtime
from test_strict_scan import _run_both

from cep.nfa import strict
from cep.nfa.errors import StateFormatError
from cep.nfa.runtime import process_event
from cep.nfa.state import RuleState, new_state
from query_lang import ast

V = ast.PatVar


def _q(inner, lo, hi, greedy=True):
    return ast.PatQuant(inner, lo, hi, greedy)


def _both(pattern, events, conds=None, contiguity="relaxed", skip="past_last", skip_var=None,
          within=None):
    case = (pattern, conds or {}, contiguity, skip, skip_var, within, events)
    return _reference(*case), _runtime(*case, [1])


def _types(pattern, events, **kw):
    """Run both engines with ``v`` fitting events of type ``v`` (``x`` fits nothing)."""
    names = _vars(pattern)
    conds = {
        v: (f"type == {v}", (lambda t: lambda f, c: f["type"] == t)(v), False, 0) for v in names
    }
    stream = [(t, 0, ts) for ts, t in enumerate(events)]
    return _both(pattern, stream, conds, **kw)


def _vars(p) -> set[str]:
    if isinstance(p, ast.PatVar):
        return {p.name}
    if isinstance(p, ast.PatSeq):
        return set().union(*(_vars(i) for i in p.items))
    if isinstance(p, ast.PatAlt):
        return set().union(*(_vars(o) for o in p.options))
    return _vars(p.inner)


def test_a_variable_named_twice_binds_the_events_of_both_places():
    events = [("p", 0, t) for t in range(4)]
    for pattern in (ast.PatSeq((V("a"), V("b"), V("a"))),
                    ast.PatSeq((V("a"), _q(V("b"), 1, None), V("a")))):
        reference, runtime = _both(pattern, events)
        assert runtime == reference == [({"a": [0, 2], "b": [1]}, 0, 2)]


def test_a_b_plus_a_over_typed_events():
    pattern = ast.PatSeq((V("a"), _q(V("b"), 1, None), V("a")))
    reference, runtime = _types(pattern, ["a", "b", "x", "b", "a", "b", "a"])
    assert runtime == reference == [({"a": [0, 4], "b": [1, 3]}, 0, 4)]


def test_preference_between_two_places_of_one_variable():
    # a (b c)? b?? over two events: the preferred parses through (b c) fail at end of input,
    # so `a` alone (b?? reluctant, empty) is the match at event 0, then `a` at event 1 — what
    # the same pattern with a fresh name for the last variable reports.
    events = [("p", 0, 0), ("p", 0, 0)]
    group = _q(ast.PatSeq((V("b"), V("c"))), 0, 1)
    renamed = _both(ast.PatSeq((V("a"), group, _q(V("d"), 0, 1, False))), events)
    assert renamed[0] == renamed[1] == [({"a": [0]}, 0, 0), ({"a": [1]}, 0, 0)]
    reference, runtime = _both(ast.PatSeq((V("a"), group, _q(V("b"), 0, 1, False))), events)
    assert runtime == reference == renamed[1]


def test_reuse_inside_an_alternation():
    pattern = ast.PatSeq((ast.PatAlt((V("a"), ast.PatSeq((V("b"), V("a"))))), V("a")))
    # b0 a1 a2: the parse b a a starts first; a a (from a1) is emitted at the same moment.
    reference, runtime = _types(pattern, ["b", "a", "a"], skip="no_skip")
    assert runtime == reference == [
        ({"b": [0], "a": [1, 2]}, 0, 2),
        ({"a": [1, 2]}, 1, 2),
    ]
    reference, runtime = _types(pattern, ["b", "a", "a"])
    assert runtime == reference == [({"b": [0], "a": [1, 2]}, 0, 2)]


def test_two_parses_of_one_labelling_emitted_together_are_one_match():
    # (a | a) b: a0 is taken at either place; both parses bind a0 to a and b1 to b.
    pattern = ast.PatSeq((ast.PatAlt((V("a"), V("a"))), V("b")))
    reference, runtime = _types(pattern, ["a", "b"], skip="no_skip", contiguity="any")
    assert runtime == reference == [({"a": [0], "b": [1]}, 0, 1)]


def test_two_parses_of_one_labelling_emitted_apart_are_reported_apart_under_no_skip():
    # a (b | b+) within 5 on a0 b1: b at the first place is emitted with b1; b in the
    # trailing greedy b+ when the window closes. Other strategies drop the later one.
    pattern = ast.PatSeq((V("a"), ast.PatAlt((V("b"), _q(V("b"), 1, None)))))
    one = ({"a": [0], "b": [1]}, 0, 1)
    reference, runtime = _types(pattern, ["a", "b"], skip="no_skip", within=5)
    assert runtime == reference == [one, one]
    reference, runtime = _types(pattern, ["a", "b"], skip="to_next", within=5)
    assert runtime == reference == [one]


def test_conditions_read_the_events_of_every_place():
    rule = compile_text(
        'rule r from s pattern a b a\n'
        'define a as type == "a" and (count(a) == 1 or v > first(a).v),\n'
        '       b as type == "b" and v < last(a).v\n'
        'emit count(a) as n, first(a).v as first_v, last(a).v as last_v\n',
        conditions=None,
    )
    assert rule.reuses_variables and rule.places == (0, 1, 0)
    # a2 (v=3) is not above first(a).v = 5, so it is skipped; a3 (v=7) is.
    evs = make_events([("a", 5, 0), ("b", 2, 1), ("a", 3, 2), ("a", 7, 3)])
    matches = run_rule(rule, evs)
    assert bound(matches) == [{"a": [0, 3], "b": [1]}]
    assert matches[0].values == {"n": 2, "first_v": 5, "last_v": 7}


def test_count_of_a_reused_variable_runs_over_both_places():
    # count(a) <= 2 in a's own condition: the second place sees the first one's event.
    rule = compile_text(
        'rule r from s pattern a+ b a+ define a as type == "a" and count(a) <= 2,'
        ' b as type == "b"\n'
    )
    evs = make_events([("a", 0, 0), ("b", 0, 1), ("a", 0, 2), ("a", 0, 3)])
    assert bound(run_rule(rule, evs)) == [{"a": [0, 2], "b": [1]}]


def test_partials_latest_keeps_one_partial_match_per_place():
    text = 'rule r from s pattern a b a define a as type == "a", b as type == "b"\n'
    evs = make_events([("a", 0, 0), ("a", 0, 1), ("b", 0, 2), ("a", 0, 3)])
    every = bound(run_rule(compile_text(text + "after match no skip"), evs))
    assert every == [{"a": [0, 3], "b": [2]}, {"a": [1, 3], "b": [2]}]
    # a1 replaces a0 at the first place; a3 at the last place completes the newest one.
    latest = bound(run_rule(compile_text(text + "partials latest after match no skip"), evs))
    assert latest == [{"a": [1, 3], "b": [2]}]


def test_partials_latest_on_a_variable_named_twice_in_a_row():
    text = 'rule r from s pattern a a contiguity any define a as type == "a"\n'
    evs = make_events([("a", 0, 0), ("a", 0, 1), ("a", 0, 2)])
    every = bound(run_rule(compile_text(text + "after match no skip"), evs))
    assert every == [{"a": [0, 1]}, {"a": [0, 2]}, {"a": [1, 2]}]
    latest = bound(run_rule(compile_text(text + "partials latest after match no skip"), evs))
    assert latest == [{"a": [0, 1]}, {"a": [1, 2]}]


@pytest.mark.parametrize(
    "skip",
    ["skip past last", "skip to next", "skip to first a", "skip to last a", "skip to first b",
     "no skip"],
)
def test_partials_latest_with_each_skip_strategy(skip):
    # a3 replaces a2 at the first place (same NFA state), so a2 b4 a5 never completes, under
    # every strategy; a3 b4 a5 starts after every resume position a0 b1 a2 sets.
    rule = compile_text(
        'rule r from s pattern a b a define a as type == "a", b as type == "b"\n'
        f"partials latest after match {skip}\n"
    )
    evs = make_events([(t, 0, i) for i, t in enumerate("abaaba")])
    assert bound(run_rule(rule, evs)) == [{"a": [0, 2], "b": [1]}, {"a": [3, 5], "b": [4]}]


@pytest.mark.parametrize(
    ("skip", "skip_var", "expected"),
    [
        ("past_last", None, [{"a": [0, 2], "b": [1]}, {"a": [3, 5], "b": [4]}]),
        ("to_next", None, [{"a": [0, 2], "b": [1]}, {"a": [2, 5], "b": [4]},
                           {"a": [3, 5], "b": [4]}]),
        # skip to first a: a's first event is the match's first, so like `to next`.
        ("to_first", "a", [{"a": [0, 2], "b": [1]}, {"a": [2, 5], "b": [4]},
                           {"a": [3, 5], "b": [4]}]),
        # skip to last a: resume at the event of a's second place.
        ("to_last", "a", [{"a": [0, 2], "b": [1]}, {"a": [2, 5], "b": [4]}]),
        # skip to first b: after a2 b4 a5, resume at b4 drops a3 b4 a5.
        ("to_first", "b", [{"a": [0, 2], "b": [1]}, {"a": [2, 5], "b": [4]}]),
        ("no_skip", None, [{"a": [0, 2], "b": [1]}, {"a": [2, 5], "b": [4]},
                           {"a": [3, 5], "b": [4]}]),
    ],
)
def test_skip_strategies_with_a_reused_variable(skip, skip_var, expected):
    pattern = ast.PatSeq((V("a"), V("b"), V("a")))
    reference, runtime = _types(pattern, ["a", "b", "a", "a", "b", "a"], skip=skip,
                                skip_var=skip_var)
    assert [m[0] for m in runtime] == [m[0] for m in reference] == expected


def test_strict_contiguity_with_a_reused_variable():
    pattern = ast.PatSeq((V("a"), _q(V("b"), 1, None), V("a")))
    reference, runtime = _types(pattern, ["a", "b", "b", "a", "b", "a"], contiguity="strict")
    assert runtime == reference == [({"a": [0, 3], "b": [1, 2]}, 0, 3)]


def test_the_strict_scan_runs_a_w_shape_like_the_runtime():
    # `down` at two places: both runs of falling prices bind to it.
    rule = compile_text(
        "rule w from s pattern start down+ up+ down+ contiguity strict\n"
        "define down as v < prev(v), up as v > prev(v)\n"
        "emit count(down) as downs, last(down).v as bottom\n"
    )
    assert strict.qualifies(rule)
    stream = [("p", v, i) for i, v in enumerate([5, 4, 3, 4, 5, 4, 3, 6, 5, 4, 5, 4])]
    matches = _run_both(rule, stream, [3, 7])
    assert [(m.events, m.values) for m in matches] == [
        ({"start": [0], "down": [1, 2, 5, 6], "up": [3, 4]}, {"downs": 4, "bottom": 3}),
        ({"start": [7], "down": [8, 9, 11], "up": [10]}, {"downs": 3, "bottom": 4}),
    ]


def test_state_bytes_keep_the_place_of_each_binding():
    # After a0 b1 under `a (b c | b d)`, b1 is held at two places: two partial matches with
    # the same labelling. The bytes must tell them apart, and only this rule may read them.
    rule = compile_text("rule r from s pattern a (b c | b d) within 10ms\n")
    state = new_state(rule)
    for e in make_events([("p", 0, 0), ("p", 0, 1)]):
        process_event(rule, state, e)
    places = sorted(p.node.place for p in state.partials if p.node.parent is not None)
    assert places == [1, 3]
    data = state.to_bytes()
    again = RuleState.from_bytes(data, rule)
    assert again.to_bytes() == data
    assert sorted(p.node.place for p in again.partials if p.node.parent is not None) == places
    other = compile_text("rule r from s pattern a (b c | e d) within 10ms\n")
    with pytest.raises(StateFormatError, match="different compilation"):
        RuleState.from_bytes(data, other)
