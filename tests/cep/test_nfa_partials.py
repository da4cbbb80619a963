"""``partials latest`` (one partial match per NFA state and key) and the ``max_partials`` cap."""

from __future__ import annotations

import math
from itertools import accumulate

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


def _at_the_cap(cap: int, extra: int = 0):
    """``a b+ c`` with ``contiguity any`` fed an ``a`` then ``b``s until the cap drops partial
    matches (every ``b`` extends every partial match), then ``extra`` more ``b``s."""
    rule = compile_text("rule r from s pattern a b+ c contiguity any", TYPES, max_partials=cap)
    state = new_state(rule)
    events = make_events([("a", 0, 0)] + [("b", 0, i) for i in range(1, 4 * cap.bit_length())])
    i = 0
    while state.dropped_partials == 0:
        process_event(rule, state, events[i])
        i += 1
    for e in make_events([("b", 0, 100 + k) for k in range(extra)]):
        process_event(rule, state, e)
    return rule, state


def _chain(node) -> list[tuple[int, int]]:
    return [(b.event.pos, b.place) for b in node.chain()]


def _members(state: RuleState) -> list[tuple[int, int]]:
    """Per partial match, oldest first: the identities of its head and its segment's tail."""
    out = []
    for c in state.cohorts:
        for lo, hi, tail in c.segments():
            out += [(id(c.heads[i]), id(tail)) for i in range(lo, hi)]
    return out


def test_the_cap_drops_the_oldest_and_leaves_the_others_untouched():
    rule, state = _at_the_cap(50)
    before, links = state.partials, _members(state)
    assert len(before) == 50
    assert [p.born for p in before] == sorted(p.born for p in before)
    dropped = state.dropped_partials
    # A new `a` starts one partial match: the oldest one goes, the other 49 keep their
    # binding lists (the same links) and everything else.
    process_event(rule, state, make_events([("a", 0, 500)])[0])
    after = state.partials
    assert state.dropped_partials == dropped + 1
    assert len(after) == 50
    assert _members(state)[:-1] == links[1:]
    for old, new in zip(before[1:], after, strict=False):
        assert _chain(new.node) == _chain(old.node)
        assert (new.letters, new.start_pos, new.start_ts, new.born) == (
            old.letters, old.start_pos, old.start_ts, old.born
        )
    assert after[-1].node.parent is None and after[-1].born > before[-1].born


def test_at_the_cap_an_event_costs_a_binding_link_per_segment(monkeypatch):
    """The cap path costs what the cohorts' segments number, not the partial matches: each
    ``b`` extends every kept partial match, a segment with a shared tail by one link, a small
    one by a link per member, however many events and dropped partial matches came before;
    the state stays a few cohorts."""
    from cep.nfa import runtime
    from cep.nfa import state as state_module
    from cep.nfa.state import _Binding

    made = []

    class Counted(_Binding):
        __slots__ = ()

        def __init__(self, parent, place, event):
            made.append(1)
            super().__init__(parent, place, event)

    monkeypatch.setattr(state_module, "_Binding", Counted)
    monkeypatch.setattr(runtime, "_Binding", Counted)
    for cap in (100, 1000, 2000):
        rule, state = _at_the_cap(cap, extra=5)
        for e in make_events([("b", 0, 200 + k) for k in range(20)]):
            kept = state.partial_count
            cost = sum(
                1 if tail is not None or hi - lo >= state_module.SHARED_TAIL_AT else hi - lo
                for c in state.cohorts for lo, hi, tail in c.segments()
            )
            made.clear()
            process_event(rule, state, e)
            assert kept == state.partial_count == cap
            assert len(made) == cost <= cap // 20
            assert len(state.cohorts) <= 2
        # The Spark operator decodes the state on every call: it comes back the same.
        again = RuleState.from_bytes(state.to_bytes(), rule)
        assert len(again.cohorts) <= 2 and again.to_bytes() == state.to_bytes()
        assert [_chain(p.node) for p in again.partials] == [
            _chain(p.node) for p in state.partials
        ]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["a b c", "a b+ c", "a (b | c) c", "a !b c within 5ms", "a b{2} c"]),
    st.sampled_from(["relaxed", "any"]),
    st.integers(1, 4),
    st.lists(st.tuples(st.sampled_from("abc"), st.just(0), st.integers(0, 9)), max_size=10),
)
def test_the_cap_reports_a_subset_of_all(pattern, contiguity, cap, spec):
    spec = sorted(spec, key=lambda e: e[2])
    text = f"rule r from s pattern {pattern} contiguity {contiguity} after match no skip"
    everything = bound(run_rule(compile_text(text, TYPES), make_events(spec)))
    capped = bound(run_rule(compile_text(text, TYPES, max_partials=cap), make_events(spec)))
    assert all(m in everything for m in capped)


def _check_cohorts(state: RuleState, cap: int) -> None:
    """The partial matches' representation: oldest first across cohorts, each cohort's
    ``earliest`` exact, segments that cover its members with no two neighbours without a tail,
    no member list shared by two cohorts, at most ``cap`` partial matches."""
    born = [b for c in state.cohorts for b in c.born]
    assert born == sorted(born) and len(set(born)) == len(born) <= cap
    lists = [id(x) for c in state.cohorts for x in (c.heads, c.start_pos, c.start_ts, c.born)]
    assert len(set(lists)) == len(lists)
    for c in state.cohorts:
        assert type(c.ends) is tuple and type(c.tails) is tuple  # shared, never changed
        assert len(c.heads) == len(c.start_pos) == len(c.start_ts) == len(c.born) > 0
        assert c.earliest == min(c.start_ts)
        assert len(c.ends) == len(c.tails) and c.ends[-1] == len(c)
        assert all(lo < hi for lo, hi in zip([0, *c.ends], c.ends, strict=False))
        assert all(
            not (t is None and u is None) for t, u in zip(c.tails, c.tails[1:], strict=False)
        )
        for tail in c.tails:
            assert tail is None or tail.chain()[0].parent is None


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["a b c", "a b+ c", "a (b | c)+ c", "a !b c within 5ms", "(a | b)+ c?",
                     "a b* c within 4ms", "a b+? c"]),
    st.sampled_from(["relaxed", "any"]),
    st.sampled_from(["all", "latest"]),
    st.integers(1, 6),
    st.lists(st.tuples(st.sampled_from("abcx"), st.just(0), st.integers(0, 3)), max_size=16),
)
def test_partial_matches_stay_in_born_order_at_the_cap(pattern, contiguity, partials, cap, spec):
    text = f"rule r from s pattern {pattern} contiguity {contiguity} partials {partials}"
    rule = compile_text(text, TYPES, max_partials=cap)
    state = new_state(rule)
    times = accumulate(gap for _, _, gap in spec)
    events = make_events([(t, v, ts) for (t, v, _), ts in zip(spec, times, strict=True)])
    for i, e in enumerate(events):
        process_event(rule, state, e)
        _check_cohorts(state, cap)
        if i % 3 == 2:
            state = RuleState.from_bytes(state.to_bytes(), rule)
            _check_cohorts(state, cap)
