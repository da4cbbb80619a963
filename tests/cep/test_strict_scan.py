"""The strict-contiguity scan (``cep.nfa.strict``) against the per-event runtime and the reference.

Random strict patterns (sequence, alternation, groups, every quantifier greedy and reluctant)
with conditions on the current event and on ``prev``, random skip strategies, windows and
partial-match caps, over random streams cut into random calls: the scan must report exactly
the matches of :func:`cep.nfa.runtime.process_event`, in the same order, and leave the same state
bytes after every call; with the default cap it must also agree with the brute-force
reference matcher. The engine is checked end to end with out-of-order input in random batches.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_matcher import ReferenceMatcher, RefEvent, make_events, rule_decl
from test_differential import Names, _nullable, sub_pattern

from cep.engine.engine import Engine
from cep.nfa import strict
from cep.nfa.compiler import compile_rule
from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event


def _prev(ctx, n):
    return ctx.prev(n)


def _lt(a, b):
    return a is not None and b is not None and a < b


# (DSL text, the same condition as a row function for the reference matcher)
CONDITIONS = [
    ('type == "{t}"', lambda t: lambda f, c: f["type"] == t),
    ("v > 2", lambda t: lambda f, c: f["v"] > 2),
    ("v > prev(v)", lambda t: lambda f, c: _lt((_prev(c, 1) or {}).get("v"), f["v"])),
    ("v < prev(v)", lambda t: lambda f, c: _lt(f["v"], (_prev(c, 1) or {}).get("v"))),
    ("v >= prev(v, 2)", lambda t: lambda f, c: (
        _prev(c, 2) is not None and f["v"] >= _prev(c, 2)["v"])),
    ('type == "{t}" and v <= prev(v)', lambda t: lambda f, c: (
        f["type"] == t and _prev(c, 1) is not None and f["v"] <= _prev(c, 1)["v"])),
    ('prev(type) == "{t}" or v == 0', lambda t: lambda f, c: (
        (_prev(c, 1) is not None and _prev(c, 1)["type"] == t) or f["v"] == 0)),
]
TYPES = ["p", "q", "r"]


@st.composite
def strict_case(draw):
    names = Names()
    items = []
    for _ in range(draw(st.integers(1, 3))):
        if not names.bound:
            break
        items.append(draw(sub_pattern(names, 2)))
    if _nullable(items[0]) and names.bound:
        items.insert(0, sub_pattern_var(names))
    pattern = items[0] if len(items) == 1 else _seq(items)
    used = sorted(_vars(pattern))
    defines = {}
    for v in used:
        if draw(st.integers(0, 5)) == 0:
            continue  # undefined: any event
        text, factory = draw(st.sampled_from(CONDITIONS))
        t = draw(st.sampled_from(TYPES))
        defines[v] = (text.format(t=t), factory(t))
    skip = draw(st.sampled_from(["past_last", "to_next", "to_first", "to_last", "no_skip"]))
    skip_var = draw(st.sampled_from(used)) if skip in ("to_first", "to_last") else None
    within = draw(st.sampled_from([None, None, 3, 6]))
    cap = draw(st.sampled_from([None, None, None, 1, 2, 4]))
    n = draw(st.integers(0, 14))
    stream, ts = [], 0
    for _ in range(n):
        ts += draw(st.integers(0, 2))
        stream.append((draw(st.sampled_from(TYPES)), draw(st.integers(0, 4)), ts))
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=4))))
    return pattern, defines, skip, skip_var, within, cap, stream, cuts


def sub_pattern_var(names):
    from query_lang import ast

    return ast.PatVar(names.var())


def _seq(items):
    from query_lang import ast

    return ast.PatSeq(tuple(items))


def _vars(p) -> set[str]:
    from query_lang import ast

    if isinstance(p, ast.PatVar):
        return {p.name}
    if isinstance(p, ast.PatSeq):
        return set().union(*(_vars(i) for i in p.items))
    if isinstance(p, ast.PatAlt):
        return set().union(*(_vars(o) for o in p.options))
    return _vars(p.inner)


def _rule_text(pattern, defines, skip, skip_var, within) -> str:
    # The pattern is set on the parsed declaration: the printer's text of nested reluctant
    # quantifiers does not parse back, and the pattern is not under test here.
    lines = [f"rule r from s pattern {' '.join(sorted(_vars(pattern)))}", "contiguity strict"]
    if defines:
        lines.append("define " + ", ".join(f"{v} as {text}" for v, (text, _) in defines.items()))
    if within is not None:
        lines.append(f"within {within}ms")
    skip_text = {
        "past_last": "skip past last",
        "to_next": "skip to next",
        "to_first": f"skip to first {skip_var}",
        "to_last": f"skip to last {skip_var}",
        "no_skip": "no skip",
    }[skip]
    lines.append(f"after match {skip_text}")
    return "\n".join(lines) + "\n"


def _compile(case):
    pattern, defines, skip, skip_var, within, cap, _, _ = case
    text = _rule_text(pattern, defines, skip, skip_var, within)
    options = {} if cap is None else {"max_partials": cap}
    return compile_rule(dataclasses.replace(rule_decl(text), pattern=pattern), **options)


def _json(matches):
    return [m.to_json() for m in matches]


def _run_both(rule, stream, cuts):
    """Per-event runtime and scan over the same calls; their matches and state bytes."""
    events = make_events(stream)
    slow, fast = new_state(rule), new_state(rule)
    slow_out, fast_out = [], []
    bounds = [0, *[c for c in cuts if 0 < c < len(events)], len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        part = events[lo:hi]
        if lo:
            # A watermark at the first event's time never makes it late.
            slow_out += advance_watermark(rule, slow, part[0].ts)
            fast_out += advance_watermark(rule, fast, part[0].ts)
        for e in part:
            slow_out += process_event(rule, slow, e)
        bits = strict.condition_bits(rule, [(fast.history, part)])[0]
        fast_out += strict.process_events(rule, fast, part, bits)
        assert _json(fast_out) == _json(slow_out)
        assert fast.to_bytes() == slow.to_bytes()
        fast = RuleState.from_bytes(fast.to_bytes(), rule)
    slow_out += advance_watermark(rule, slow, math.inf)
    fast_out += advance_watermark(rule, fast, math.inf)
    assert _json(fast_out) == _json(slow_out)
    return fast_out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strict_case())
def test_scan_equals_runtime_and_reference(case):
    pattern, defines, skip, skip_var, within, cap, stream, cuts = case
    rule = _compile(case)
    assert strict.qualifies(rule)
    got = _run_both(rule, stream, cuts)
    if cap is None:
        reference = ReferenceMatcher(
            pattern, {v: fn for v, (_, fn) in defines.items()}, contiguity="strict", skip=skip,
            skip_var=skip_var, within_ms=within,
        )
        events = [
            RefEvent(i, ts, {"type": t, "v": v, "ts": ts}) for i, (t, v, ts) in enumerate(stream)
        ]
        expected = [(m.events, m.start_ms, m.end_ms) for m in reference.run(events)]
        assert [(m.events, m.start_ms, m.end_ms) for m in got] == expected


def test_v_shape_long_stream_in_uneven_calls():
    rule = compile_rule(rule_decl(
        "rule v from s pattern start down+ up+ contiguity strict\n"
        "define down as v < prev(v), up as v > prev(v)\n"
        "emit last(down).v as bottom, last(up).v as top\n"
    ))
    rng = np.random.default_rng(7)
    values = np.cumsum(rng.choice([-1, 0, 1], 3000, p=[0.45, 0.1, 0.45])).tolist()
    stream = [("p", int(v), i // 3) for i, v in enumerate(values)]
    cuts = sorted(set(rng.integers(0, 3000, 40).tolist()))
    matches = _run_both(rule, stream, cuts)
    assert len(matches) > 100
    assert all(m.values["top"] > m.values["bottom"] for m in matches)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pattern a b+ contiguity strict define b as v > prev(v)", True),
        ("pattern a b contiguity strict define b as v > a.v", False),
        ("pattern a b contiguity strict define b as count(a) > 0", False),
        ("pattern a !x b contiguity strict define x as v > 1", False),
        ("pattern a b contiguity strict partials latest", False),
        ("pattern a b define b as v > prev(v)", False),
        ("pattern a b contiguity strict define a as s where v > 1", True),
    ],
)
def test_which_rules_qualify(text, expected):
    assert strict.qualifies(compile_rule(rule_decl(f"rule r from s {text}\n"))) is expected


# ---------------------------------------------------------------- the engine end to end

STREAM = """
stream ev (id int, key string, kind string, price float, ts timestamp)
  time ts unit ms lateness 5ms id id
"""

SCAN_RULES = """
rule v_shape from ev by key
  pattern start down+ up+
  contiguity strict
  define down as price < prev(price), up as price > prev(price)
  emit key, last(down).price as bottom, last(up).price as top

rule twice from ev by key
  pattern a b{2,}?
  contiguity strict
  define a as kind == "x", b as price >= prev(price, 2) or prev(kind) == "y"
  within 8ms
  after match skip to next
"""
"""Strict rules the scan runs (shared with ``test_columnar_route``)."""

ENGINE_RULES = STREAM + SCAN_RULES + """
rule relaxed from ev by key
  pattern a b
  define a as kind == "x", b as kind == "y" and price > a.price
"""


@st.composite
def engine_case(draw):
    n = draw(st.integers(1, 60))
    rows, ts = [], 0
    for i in range(n):
        ts += draw(st.integers(0, 3))
        late = draw(st.integers(0, 6)) if draw(st.integers(0, 4)) == 0 else 0
        rows.append({
            "id": i,
            "key": draw(st.sampled_from(["k1", "k2", "k3"])),
            "kind": draw(st.sampled_from(["x", "y", "z"])),
            "price": float(draw(st.integers(0, 4))),
            "ts": max(0, ts - late),
        })
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=5))))
    return rows, cuts


def _engine_run(rows, cuts, fast):
    engine = Engine(fast_strict=fast)
    engine.register(ENGINE_RULES)
    out = []
    bounds = [0, *cuts, len(rows)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi > lo:
            engine.feed_batch(pd.DataFrame(rows[lo:hi]))
        out.append(engine.drain())
    engine.close()
    out.append(engine.drain())
    return out, engine.stats, engine.drain_dead_letters()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_case())
def test_engine_scan_equals_event_by_event(case):
    rows, cuts = case
    fast = _engine_run(rows, cuts, True)
    slow = _engine_run(rows, cuts, False)
    assert fast == slow


def test_engine_batches_do_not_change_the_result():
    rng = np.random.default_rng(3)
    n = 4000
    ts = np.cumsum(rng.integers(0, 3, n))
    ts = ts - np.where(rng.random(n) < 0.05, rng.integers(0, 5, n), 0)
    rows = pd.DataFrame({
        "id": np.arange(n),
        "key": rng.choice(["a", "b", "c", "d", "e"], n),
        "kind": rng.choice(["x", "y", "z"], n),
        "price": rng.integers(0, 6, n).astype(float),
        "ts": ts,
    })

    def run(batch: int, fast: bool) -> list[dict]:
        engine = Engine(fast_strict=fast)
        engine.register(ENGINE_RULES)
        for lo in range(0, n, batch):
            engine.feed_batch(rows.iloc[lo : lo + batch])
        engine.close()
        return engine.drain()

    whole = run(n, True)
    assert len(whole) > 100
    for batch in (1000, 333, 50):
        fast = run(batch, True)
        # Which matches are reported never depends on the batches; the order of matches of
        # different keys follows the watermark's releases, event by event and scanned alike.
        assert sorted(fast, key=repr) == sorted(whole, key=repr)
        assert fast == run(batch, False)


def test_rules_scanning_the_same_keys_read_their_events_once():
    """Two rules with different conditions over the same keys' events: with one ``columns``
    store, the second rule's bits read no event field the first did not, and each rule's
    bits equal those computed on its own."""
    first = compile_rule(rule_decl(
        "rule a from s pattern x y contiguity strict\n"
        '  define x as v > 2 and type != "r", y as v > prev(v)\n'))
    second = compile_rule(rule_decl(
        "rule b from s pattern x y contiguity strict\n"
        '  define x as type == "p", y as v < prev(v, 2)\n'))
    keys = [make_events([("p", 3, 0), ("q", 1, 1), ("p", 4, 2)]),
            make_events([("q", 5, 3), ("p", 2, 4)])]
    sequences = [([{"type": "q", "v": 1, "ts": -1}], keys[0]), ([], keys[1])]
    columns: dict = {}
    got_first = strict.condition_bits(first, sequences, columns)
    read = set(columns)
    got_second = strict.condition_bits(second, sequences, columns)
    assert set(columns) == read  # the same fields of the same events: nothing read again
    assert got_first == strict.condition_bits(first, sequences)
    assert got_second == strict.condition_bits(second, sequences)
    assert got_first != got_second
