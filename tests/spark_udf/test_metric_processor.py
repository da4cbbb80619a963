"""Metrics as keyed processors, without a JVM: one ``by`` group per key gives the embedded
engine's window rows, in a replay of the input order (late events, corrections) and under
arbitrary micro-batch splits with Spark's watermark rule and timers."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.engine.engine import Engine
from cep.events.watermark import END_OF_INPUT
from cep.metrics import MetricProcessor
from spark_udf.batch import (
    ARRIVAL_COLUMN,
    LATE_COLUMN,
    SEQ_COLUMN,
    TIME_COLUMN,
    EventLayout,
    backtest_frame,
    fire_due_keys,
    process_bucket,
)
from spark_udf.bucket_state import BucketState
from spark_udf.operator import reference_outputs
from spark_udf.rules import processor_specs

BASE_MS = 1_767_225_600_000
LATENESS = 5_000
PROGRAM = f"""
stream txn (card_id string, amount float, merchant string, ts timestamp)
  time ts unit ms lateness {LATENESS // 1000}s

metric spend "spend per merchant and minute" from txn by merchant window tumbling 1m
  select count() as n, sum(amount) as total, approx_distinct(card_id) as cards
metric bursts "a card's sessions of two or more charges" from txn by card_id
  window session gap 20s
  select count() as n, max(amount) as top, min(amount) as least
  having n >= 2
metric p99 "every minute, the last two minutes' p99" from txn window hopping 2m every 1m
  select approx_percentile(amount, 0.99) as p99, count() as n
metric known_cards "merchants whose every card of the minute was seen before" from txn
  by merchant window tumbling 1m
  select count() as n, seen(card_id) as known
"""
LAYOUT = EventLayout(
    event_columns=("stream", "card_id", "amount", "merchant", "ts", SEQ_COLUMN),
    int_columns=frozenset({"ts", SEQ_COLUMN}),
)


def _events(seed: int, n: int, *, late_every: int = 0) -> list[dict]:
    """Card charges about every 0.4 s, shuffled within the lateness; with ``late_every``, one
    event in that many is 3-60 s behind (some within the retention, some beyond)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = BASE_MS + i * 400 - rng.randint(0, LATENESS - 1)
        if late_every and i > 50 and i % late_every == 0:
            ts -= rng.randint(3_000, 60_000)
        out.append({
            "stream": "txn", "card_id": f"c{rng.randrange(25)}",
            "amount": round(rng.lognormvariate(3, 1.2), 2), "merchant": f"m{rng.randrange(4)}",
            "ts": ts, SEQ_COLUMN: i,
        })
    return out


def _embedded(events: list[dict]) -> list[dict]:
    engine = Engine()
    engine.register(PROGRAM)
    for event in events:
        engine.feed({k: v for k, v in event.items() if k not in ("stream", SEQ_COLUMN)})
    engine.close()
    return [m for m in engine.drain() if m["kind"] == "metric"]


def _metric_processors() -> list[MetricProcessor]:
    specs, skipped = processor_specs(PROGRAM)
    assert skipped == []
    assert [s.rules for s in specs] == [("spend",), ("bursts",), ("p99",), ("known_cards",)]
    assert specs[2].key_cols == {"txn": ()}   # no `by`: one group
    return [s.processor for s in specs]


def _canonical(rows: list[dict]) -> list[str]:
    """Rows as sorted JSON, floats to 12 significant digits: a sum's last bits depend on the
    order of the additions, which differs between one batch and group-by-group calls."""

    def fix(value):
        if isinstance(value, float) and math.isfinite(value):
            return float(f"{value:.12g}")
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return sorted(json.dumps(fix(r), sort_keys=True) for r in rows)


def _arrivals(events: list[dict]) -> list[int | None]:
    """The watermark each event meets in input order (what the static path computes)."""
    out, top = [], None
    for event in events:
        out.append(None if top is None else top - LATENESS)
        top = event["ts"] if top is None else max(top, event["ts"])
    return out


def test_groups_replayed_in_input_order_equal_the_embedded_engine_with_late_events():
    events = _events(7, 2_500, late_every=37)
    expected = _embedded(events)
    assert any(r["correction"] for r in expected)   # late events within the retention
    got, dead = [], []
    marks = _arrivals(events)
    for processor in _metric_processors():
        groups: dict[tuple, list[int]] = {}
        for i, event in enumerate(events):
            groups.setdefault(processor.key_of(event), []).append(i)
        for key, rows in groups.items():
            result = processor.replay(
                key, [events[i] for i in rows], [marks[i] for i in rows], END_OF_INPUT
            )
            assert result.state is None or not result.next_timer_ms
            got += result.outputs
            dead += result.dead_letters
    assert _canonical(got) == _canonical(expected)
    assert dead and {d["reason"] for d in dead} == {"late"}


def test_static_backtest_frame_replays_late_rows_like_the_embedded_engine():
    events = _events(8, 1_200, late_every=29)
    frame = pd.DataFrame(events, columns=list(LAYOUT.event_columns))
    frame[TIME_COLUMN] = frame["ts"]
    marks = _arrivals(events)
    frame[ARRIVAL_COLUMN] = pd.array(marks, dtype="Int64")
    frame[LATE_COLUMN] = [m is not None and e["ts"] < m for e, m in zip(events, marks,
                                                                          strict=True)]
    got = []
    for processor in _metric_processors():
        run = backtest_frame(processor, frame.sample(frac=1, random_state=3), LAYOUT,
                             END_OF_INPUT)
        got += [json.loads(r["payload"]) for r in run.records if r["kind"] == "metric"]
    assert _canonical(got) == _canonical(_embedded(events))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_micro_batches_with_timers_give_the_embedded_rows(seed, cuts):
    """Spark's rule: a micro-batch meets the watermark of the batches before it; windows close
    from timers. Events out of order within the lateness only, so no batching makes one late."""
    events = _events(seed, 400)  # 160 s of charges: tumbling, hopping and session windows
    outputs: list[dict] = []
    for processor in _metric_processors():
        bucket = BucketState()
        watermark = -(2**62)
        bounds = [0, *sorted(cuts), len(events)]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            chunk = events[lo:hi]
            if chunk:
                frame = pd.DataFrame(chunk[::-1], columns=list(LAYOUT.event_columns))
                frame[TIME_COLUMN] = frame["ts"]
                run = process_bucket(processor, bucket, [frame], LAYOUT, watermark)
                assert not [r for r in run.records if r["kind"] == "dead_letter"]
                outputs += run.records
                watermark = max(watermark, max(e["ts"] for e in events[:hi]) - LATENESS)
            outputs += fire_due_keys(processor, bucket, watermark)
        outputs += fire_due_keys(processor, bucket, END_OF_INPUT)
        assert not bucket.keys or all(s.due_ms is None for s in bucket.keys.values())
    got = [json.loads(r["payload"]) for r in outputs]
    assert _canonical(got) == _canonical(_embedded(events))


def test_a_group_state_survives_bytes_and_the_reference_path_agrees():
    events = _events(4, 800)
    got = []
    for processor in _metric_processors():
        got += [json.loads(r["payload"]) for r in
                reference_outputs(processor, events, END_OF_INPUT)]
    assert _canonical(got) == _canonical(_embedded(events))


def test_bad_events_become_dead_letters_naming_the_field():
    (spend, *_) = _metric_processors()
    good = _events(1, 3)
    bad = {**good[1], "amount": "lots"}
    result = spend.process(("m1",), None, [good[0], bad], None)
    assert [d["reason"] for d in result.dead_letters] == ["wrong_type"]
    assert "amount" in result.dead_letters[0]["detail"]
    assert result.state is not None and result.next_timer_ms


def test_metric_processor_needs_input_positions():
    (spend, *_) = _metric_processors()
    event = {k: v for k, v in _events(1, 1)[0].items() if k != SEQ_COLUMN}
    with pytest.raises(Exception, match="_seq"):
        spend.process(("m1",), None, [event], None)
