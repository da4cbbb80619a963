"""Tests of the watermark (per-stream lateness, minimum over streams, vectorised == one by one)
and of the reorder buffer."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.events.watermark import END_OF_INPUT, NO_WATERMARK, ReorderBuffer, Watermark, iso_ms


def test_single_stream_watermark_is_max_minus_lateness() -> None:
    wm = Watermark({"s": 10})
    assert wm.current == NO_WATERMARK
    assert wm.observe("s", 100) is False
    assert wm.current == 90
    assert wm.observe("s", 95) is False  # out of order within lateness
    assert wm.current == 90  # never moves back
    assert wm.observe("s", 90) is False  # exactly at the watermark: on time
    assert wm.observe("s", 89) is True
    assert wm.max_ts == {"s": 100}


def test_engine_watermark_is_the_minimum_over_streams_that_have_events() -> None:
    wm = Watermark({"fast": 0, "slow": 50})
    wm.observe("fast", 1000)
    assert wm.current == 1000  # the slow stream has not produced anything yet
    wm.observe("slow", 1010)
    assert wm.current == 1000  # min(1000, 1010 - 50) = 960, but it never moves back
    wm.observe("fast", 2000)
    assert wm.current == 1000  # min(2000, 960) -> still 1000
    wm.observe("slow", 1100)
    assert wm.current == 1050
    assert wm.is_late(1049) and not wm.is_late(1050)


def test_advance_and_close() -> None:
    wm = Watermark({"s": 0})
    wm.advance_to(500)
    assert wm.observe("s", 499) is True
    wm.advance_to(100)
    assert wm.current == 500
    wm.close()
    assert wm.current == END_OF_INPUT


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 200)), max_size=40),
    cut=st.integers(0, 40),
    advance=st.one_of(st.none(), st.integers(0, 200)),
)
def test_observe_many_equals_observe_one_by_one(events, cut, advance) -> None:
    lateness = {"a": 0, "b": 15, "c": 40}
    one = Watermark(lateness)
    many = Watermark(lateness)
    if advance is not None:
        one.advance_to(advance)
        many.advance_to(advance)
    expected = [one.observe(s, t) for s, t in events]
    got: list[bool] = []
    for part in (events[:cut], events[cut:]):
        names = sorted({s for s, _ in part}) or ["a"]
        codes = np.array([names.index(s) for s, _ in part], dtype=np.int64)
        ts = np.array([t for _, t in part], dtype=np.int64)
        got += many.observe_many(names, codes, ts).tolist()
    assert got == expected
    assert many.current == one.current
    assert many.max_ts == one.max_ts


def test_reorder_buffer_releases_in_time_then_input_order() -> None:
    buf = ReorderBuffer()
    rng = random.Random(7)
    items = [(rng.randrange(20), seq) for seq in range(200)]
    for ts, seq in items:
        buf.push(ts, seq, f"e{seq}")
    first = buf.release(9)
    assert [(t, s) for t, s, _ in first] == sorted(i for i in items if i[0] <= 9)
    assert buf.earliest_ts == 10
    rest = buf.release(END_OF_INPUT)
    assert [(t, s) for t, s, _ in rest] == sorted(i for i in items if i[0] > 9)
    assert len(buf) == 0 and buf.earliest_ts is None and buf.release(100) == []


def test_reorder_buffer_push_sorted_merges_with_pending() -> None:
    buf = ReorderBuffer()
    buf.push(5, 0, "a")
    buf.push(9, 1, "b")
    buf.push_sorted([(3, 2, "c"), (9, 3, "d"), (12, 4, "e")])
    buf.push_sorted([(20, 5, "f")])  # appended without a merge
    assert [p for _, _, p in buf.entries()] == ["c", "a", "b", "d", "e", "f"]
    assert [p for _, _, p in buf.release(9)] == ["c", "a", "b", "d"]


def test_iso_ms() -> None:
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_500) == "1970-01-01T00:00:01.500Z"
    assert iso_ms(NO_WATERMARK) == "-inf" and iso_ms(END_OF_INPUT) == "+inf"
