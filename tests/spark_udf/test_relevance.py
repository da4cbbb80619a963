"""The operator's column-wise row filter: which rows a rule processor needs, and that skipping
the others changes no output."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

import spark_udf.batch as batch
from spark_udf.batch import SEQ_COLUMN, TIME_COLUMN, EventLayout, process_bucket
from spark_udf.bucket_state import BucketState
from spark_udf.relevance import needed_rows
from spark_udf.rules import processor_specs

STREAM = """
stream txn (card_id string, amount float, merchant string, ts timestamp)
  time ts unit ms lateness 5s
"""
RELAXED = STREAM + """
rule card_testing from txn by card_id
  pattern probe{3,} big
  define probe as amount < 1.00, big as amount > 500 and merchant != last(probe).merchant
  within 10m
"""
STRICT = STREAM + """
rule rising from txn by card_id contiguity strict
  pattern a b define a as amount > 10, b as amount > prev(amount)
"""
BASE_MS = 1_767_225_600_000


def _processor(program: str):
    (spec,), _ = processor_specs(program)
    return spec.processor


def _events(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        roll = rng.random()
        amount = 0.5 if roll < 0.05 else (900.0 if roll < 0.08 else 20.0 + roll)
        out.append({"stream": "txn", "card_id": f"c{rng.randrange(8)}", "amount": amount,
                    "merchant": f"m{rng.randrange(3)}", "ts": BASE_MS + i * 500,
                    SEQ_COLUMN: i})
    return out


def test_only_rows_some_variable_may_take_are_needed():
    events = _events(200)
    events[7] = {**events[7], "amount": "lots"}   # invalid: kept for its dead letter
    events[9] = None                               # unparsable row
    events[11] = {**events[11], "stream": "other"}
    keep = needed_rows(_processor(RELAXED), events)
    for i, event in enumerate(events):
        if i == 7:
            assert keep[i]
        elif event is None or event["stream"] != "txn":
            assert not keep[i]
        else:
            assert keep[i] == (event["amount"] < 1.0 or event["amount"] > 500), i
    assert 0 < keep.sum() < len(events) // 4
    # strict contiguity (and prev) must see every row
    assert needed_rows(_processor(STRICT), events) is not None
    assert needed_rows(_processor(STRICT), events)[[0, 1, 2]].all()


def test_skipping_rows_changes_no_output(monkeypatch):
    events = _events(3_000, seed=4)
    for i in range(100, 3_000, 300):   # card-testing bursts
        card = f"c{i % 8}"
        for j in range(4):
            events[i + j] = {**events[i + j], "card_id": card, "amount": 0.4,
                             "merchant": "m9"}
        events[i + 4] = {**events[i + 4], "card_id": card, "amount": 950.0, "merchant": "m1"}
    layout = EventLayout(event_columns=("stream", "card_id", "amount", "merchant", "ts",
                                        SEQ_COLUMN), int_columns=frozenset({"ts", SEQ_COLUMN}))
    frame = pd.DataFrame(events)
    frame[TIME_COLUMN] = frame["ts"]

    def run() -> list[str]:
        processor = _processor(RELAXED)
        bucket = BucketState()
        records = process_bucket(processor, bucket, [frame], layout, BASE_MS).records
        for text, slot in list(bucket.keys.items()):
            result = processor.close(tuple(json.loads(text)), slot.state)
            records += [{"payload": json.dumps(m)} for m in result.outputs]
        return sorted(r["payload"] for r in records)

    filtered = run()
    monkeypatch.setattr(batch, "needed_rows", lambda processor, events: None)
    assert filtered == run()
    assert len(filtered) >= 9


def _in_seconds(events: list[dict]) -> list[dict]:
    """The events stamped in epoch seconds (with fractions), as a `unit s` stream has them."""
    return [None if e is None else {**e, "ts": e["ts"] / 1000} for e in events]


def test_the_json_shortcut_agrees_with_the_row_by_row_filter():
    from spark_udf.relevance import needed_rows_from_json

    events = _events(500, seed=2)
    processor = _processor(RELAXED)
    texts = [json.dumps({k: v for k, v in e.items() if k != SEQ_COLUMN}) for e in events]
    times = [e["ts"] for e in events]
    keep = needed_rows_from_json(processor, texts, times, None)
    assert keep is not None and keep.sum() > 0
    assert (keep == needed_rows(processor, events)).all()
    # a stream stamped in epoch seconds: the same rows (the times reach it as instants)
    seconds = _processor(RELAXED.replace("unit ms", "unit s"))
    stamped = _in_seconds(events)
    texts_s = [json.dumps({k: v for k, v in e.items() if k != SEQ_COLUMN}) for e in stamped]
    keep_s = needed_rows_from_json(seconds, texts_s, times, None)
    assert keep_s is not None and (keep_s == keep).all()
    assert (keep_s == needed_rows(seconds, stamped)).all()
    # rows the declared types do not fit, non-objects and broken JSON: parse row by row
    for odd in ('{"amount": "lots", "stream": "txn"}', "[1, 2]", "{broken"):
        assert needed_rows_from_json(processor, [*texts[:5], odd], times[:6], None) is None
    # strict contiguity must see every row: no shortcut
    assert needed_rows_from_json(_processor(STRICT), texts, times, None) is None


@pytest.mark.parametrize("unit", ["ms", "s"])
def test_json_rows_skipped_by_the_shortcut_change_no_output(monkeypatch, unit):
    import spark_udf.relevance as relevance

    program = RELAXED.replace("unit ms", f"unit {unit}")
    events = _events(2_000, seed=6)
    for i in range(50, 2_000, 250):
        card = f"c{i % 8}"
        for j in range(3):
            events[i + j] = {**events[i + j], "card_id": card, "amount": 0.3, "merchant": "m9"}
        events[i + 3] = {**events[i + 3], "card_id": card, "amount": 700.0, "merchant": "m2"}
    stamped = events if unit == "ms" else _in_seconds(events)
    frame = pd.DataFrame({
        SEQ_COLUMN: [e[SEQ_COLUMN] for e in events],
        "_event": [json.dumps({k: v for k, v in e.items() if k not in ("stream", SEQ_COLUMN)})
                   for e in stamped],
        TIME_COLUMN: [e["ts"] for e in events],
    })
    layout = EventLayout(event_columns=(SEQ_COLUMN,), json_column="_event",
                         int_columns=frozenset({SEQ_COLUMN}), default_stream="txn")
    calls = []
    shortcut = relevance.needed_rows_from_json

    def counted(*args):
        result = shortcut(*args)
        calls.append(result is not None)
        return result

    def run() -> list[str]:
        processor = _processor(program)
        bucket = BucketState()
        # late rows (behind the watermark) are still reported, with their content
        records = process_bucket(processor, bucket, [frame], layout, BASE_MS + 2_000).records
        for text, slot in list(bucket.keys.items()):
            result = processor.close(tuple(json.loads(text)), slot.state)
            records += [{"payload": json.dumps(m)} for m in result.outputs]
        return sorted(r["payload"] for r in records)

    monkeypatch.setattr(batch, "needed_rows_from_json", counted)
    filtered = run()
    assert calls == [True]
    monkeypatch.setattr(batch, "needed_rows_from_json", lambda *args: None)
    monkeypatch.setattr(batch, "needed_rows", lambda processor, events: None)
    assert filtered == run()
    rows = [json.loads(p) for p in filtered]
    assert sum(r.get("reason") == "late" for r in rows) == 4   # BASE_MS + 0..1500 < 2 s
    assert sum(r.get("kind") == "rule" for r in rows) >= 8


def test_a_late_or_keyless_row_is_reported_for_what_is_wrong_with_it_first():
    # As the embedded engine: a bad value, then lateness, then a missing key.
    rows = [
        {"stream": "txn", "card_id": "c", "amount": "lots", "merchant": "m", "ts": BASE_MS},
        {"stream": "txn", "card_id": None, "amount": "lots", "merchant": "m",
         "ts": BASE_MS + 9_000},
        {"stream": "txn", "card_id": None, "amount": 0.5, "merchant": "m", "ts": BASE_MS},
        {"stream": "txn", "card_id": None, "amount": 0.5, "merchant": "m",
         "ts": BASE_MS + 9_000},
        {"stream": "txn", "card_id": "c", "amount": 20.0, "merchant": "m", "ts": BASE_MS},
    ]
    layout = EventLayout(event_columns=("stream", "card_id", "amount", "merchant", "ts",
                                        SEQ_COLUMN), int_columns=frozenset({"ts", SEQ_COLUMN}))
    frame = pd.DataFrame([{**row, SEQ_COLUMN: i} for i, row in enumerate(rows)])
    frame[TIME_COLUMN] = frame["ts"]
    run = process_bucket(_processor(RELAXED), BucketState(), [frame], layout, BASE_MS + 1)
    letters = sorted((json.loads(r["payload"])["line"], r["name"]) for r in run.records)
    assert letters == [(0, "wrong_type"), (1, "wrong_type"), (2, "late"), (3, "missing_key"),
                       (4, "late")]
