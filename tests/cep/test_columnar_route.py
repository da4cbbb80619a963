"""Streams read only by scan rules wait as columns (``cep.events.columnar``) instead of events.

The engine with that route must report exactly what it reports event by event: the same
matches in the same order, the same dead letters and stats, and byte-identical key state after
every batch, however the input is cut, with out-of-order and late rows, null keys, rules
registered and removed mid-stream and rows fed one at a time in between.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_matcher import make_events
from test_strict_scan import SCAN_RULES, STREAM, _compile, strict_case

from cep.engine.engine import Engine
from cep.events.columnar import Block, Chunk
from cep.events.event import StreamSchema
from cep.nfa import strict
from query_lang.parser import parse

LATE_SCAN_RULE = """
rule dip from ev by key
  pattern d u
  contiguity strict
  define d as price < prev(price), u as kind == "y"
  after match skip past last
"""

ROW_RULE = """
rule relaxed from ev by key
  pattern a b
  define a as kind == "x", b as kind == "y" and price > a.price
"""

# Modes: the columnar route (default engine), the scan without it, and event by event.


def _engine(mode: str, max_partials: int | None) -> Engine:
    engine = Engine(fast_strict=mode != "events", max_partials=max_partials)
    if mode == "scan":
        engine._plan_columns = lambda: None  # type: ignore[method-assign]
    elif mode == "columnar":
        engine._route.most_rules = 10  # the route for the several scan rules of the cases
    return engine


def _key_bytes(engine: Engine) -> dict:
    return {
        (signature, key): group.processor.encode(state)
        for signature, group in engine._groups.items()
        for key, state in group.states.items()
    }


def _rule_bytes(seen: list) -> list:
    """Per batch, each key's rule states as bytes by rule name. The per-event dispatch runs a
    key's rules in another order than the scan does, so its key states list them in another
    order."""
    out = []
    for matches, stats, keys in seen:
        states = {}
        for key, data in keys.items():
            engine = Engine()
            engine.register(STREAM + SCAN_RULES + LATE_SCAN_RULE + ROW_RULE)
            processor = next(iter(engine._groups.values())).processor
            states[key] = {n: st.to_bytes() for n, st in processor.decode(data).rules.items()}
        out.append((matches, stats, states))
    return out


@st.composite
def rows_strategy(draw, max_rows: int = 60):
    n = draw(st.integers(1, max_rows))
    rows, ts = [], 0
    for i in range(n):
        ts += draw(st.integers(0, 3))
        late = draw(st.integers(0, 8)) if draw(st.integers(0, 4)) == 0 else 0
        key = draw(st.sampled_from(["k1", "k2", "k3", "k1", "k2", None]))
        price = draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, None]))
        rows.append(
            {"id": i, "key": key, "kind": draw(st.sampled_from(["x", "y", "z"])),
             "price": price, "ts": max(0, ts - late)}
        )
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=5))))
    return rows, cuts


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["price"] = frame["price"].astype(float)
    return frame


def _run(mode, rows, cuts, steps, max_partials=None):
    """Feed ``rows`` cut at ``cuts``; ``steps`` maps a batch number to an action done before
    it (register / unregister a rule, feed the batch's first row alone)."""
    engine = _engine(mode, max_partials)
    engine.register(STREAM + SCAN_RULES)
    seen = []
    held = False
    bounds = [0, *cuts, len(rows)]
    for number, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        action = steps.get(number)
        if action == "single" and hi > lo:
            row = {k: v for k, v in rows[lo].items() if v is not None}
            engine.feed(row, "ev")
            lo += 1
        elif action == "scan rule":
            engine.register(LATE_SCAN_RULE)
        elif action == "row rule":
            engine.register(ROW_RULE)
        elif action == "drop":
            engine.unregister("twice")
        if hi > lo:
            engine.feed_batch(_frame(rows[lo:hi]), "ev")
        held = held or bool(engine._route.columns)
        seen.append((engine.drain(), engine.stats, _key_bytes(engine)))
    engine.close()
    seen.append((engine.drain(), engine.stats, _key_bytes(engine)))
    return seen, engine.drain_dead_letters(), held


def _assert_same(rows, cuts, steps=None, max_partials=None):
    steps = steps or {}
    columnar, dead, held = _run("columnar", rows, cuts, steps, max_partials)
    scan, scan_dead, _ = _run("scan", rows, cuts, steps, max_partials)
    assert columnar == scan
    assert dead == scan_dead
    events, events_dead, _ = _run("events", rows, cuts, steps, max_partials)
    assert _rule_bytes(columnar) == _rule_bytes(events)
    assert dead == events_dead
    return columnar, held


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_strategy(), st.sampled_from([None, None, 2]))
def test_columnar_route_equals_scan_and_events(case, max_partials):
    rows, cuts = case
    _assert_same(rows, cuts, max_partials=max_partials)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows_strategy(),
    st.lists(st.sampled_from(["single", "scan rule", "row rule", "drop"]), unique=True),
    st.lists(st.integers(0, 5), min_size=4, max_size=4),
)
def test_rules_and_single_rows_mid_stream(case, actions, batches):
    rows, cuts = case
    _assert_same(rows, cuts, dict(zip(batches, actions, strict=False)))


def test_the_route_is_taken_and_batches_do_not_change_the_result():
    rng = np.random.default_rng(7)
    n = 3000
    ts = np.cumsum(rng.integers(0, 3, n))
    ts = ts - np.where(rng.random(n) < 0.05, rng.integers(0, 5, n), 0)
    rows = [
        {"id": i, "key": str(k), "kind": str(kind), "price": float(p), "ts": int(t)}
        for i, (k, kind, p, t) in enumerate(zip(
            rng.choice(["a", "b", "c", "d", "e"], n), rng.choice(["x", "y", "z"], n),
            rng.integers(0, 6, n), ts, strict=True,
        ))
    ]
    whole, held = _assert_same(rows, [])
    assert held
    matches = [m for batch, _, _ in whole for m in batch]
    assert len(matches) > 100
    for cuts in ([1000, 2000], list(range(50, n, 333))):
        seen, held = _assert_same(rows, cuts)
        assert held
        again = [m for batch, _, _ in seen for m in batch]
        assert sorted(again, key=repr) == sorted(matches, key=repr)


def test_one_scan_rule_is_held_as_columns_and_several_go_as_events():
    """Several scan rules of a stream run faster as events, where a key's idle rules alike
    share one state (``column_route.MOST_RULES``)."""
    engine = Engine()
    engine.register(STREAM + LATE_SCAN_RULE)
    assert set(engine._route.streams) == {"ev"}
    engine.register(SCAN_RULES)
    assert engine._route.streams == {}
    engine.unregister("twice")
    engine.unregister("v_shape")
    assert set(engine._route.streams) == {"ev"}


def test_only_streams_of_scan_rules_are_held_as_columns():
    engine = Engine()
    engine._route.most_rules = 10
    engine.register(STREAM + SCAN_RULES)
    assert set(engine._route.streams) == {"ev"}
    engine.register(ROW_RULE)
    assert engine._route.streams == {}
    engine.unregister("relaxed")
    assert set(engine._route.streams) == {"ev"}
    assert Engine(fast_strict=False)._route.streams == {}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries({
            "id": st.one_of(st.none(), st.integers(0, 5)),
            "key": st.one_of(st.none(), st.sampled_from(["a", "b"])),
            # (an infinite price is a dead letter, non_finite: not a row of a chunk)
            "price": st.one_of(
                st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32)
            ),
            "ts": st.integers(0, 10**6),
        }),
        min_size=1, max_size=20,
    ),
    st.randoms(use_true_random=False),
)
def test_chunk_events_equal_the_frame_events(rows, random):
    schema = StreamSchema.from_decl(parse(STREAM).declarations[0])
    frame, ts, bad = schema.normalise_frame(pd.DataFrame(rows))
    assert not bad
    seqs = np.arange(100, 100 + len(frame))
    positions = np.arange(len(frame)) * 3
    expected = schema.events_from_frame(frame, seqs, positions)
    chunk = Chunk(schema, frame, ts, seqs, positions, 1)
    assert [chunk.event(i) for i in range(len(frame))] == expected
    order = np.array(random.sample(range(len(frame)), len(frame)))
    block = Block("ev", [chunk], np.zeros(len(frame), dtype=np.int64), order)
    view = block.view(0, len(block))
    assert list(view) == [expected[i] for i in order]
    assert view[1:3] == [expected[i] for i in order[1:3]]
    ids, stream, times, records, lo = view.event_columns()
    assert [(ids[i], stream, times[i], records[i]) for i in range(lo, len(order))] == [
        (e.id, e.stream, e.ts, e.fields) for e in (expected[i] for i in order)
    ]
    with pytest.raises(IndexError):
        view[len(order)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strict_case(), st.lists(st.integers(0, 4), min_size=1, max_size=4), st.data())
def test_block_bits_equal_condition_bits(case, sizes, data):
    rule = _compile(case)
    events = make_events(case[6])
    if not events:
        return
    sequences = []
    start = 0
    for size in sizes:
        part = events[start : start + size]
        start += size
        history = [e.fields for e in events[: data.draw(st.integers(0, 3))]]
        sequences.append((history, part))
    expected = [b for bits in strict.condition_bits(rule, sequences) for b in bits]
    flat = [e for _, part in sequences for e in part]
    columns = {}

    def column(name):
        return columns.setdefault(name, [e.fields.get(name) for e in flat])

    segments, lo = [], 0
    for history, part in sequences:
        segments.append((history, lo, lo + len(part)))
        lo += len(part)
    assert strict.block_bits(rule, "s", column, segments) == expected
