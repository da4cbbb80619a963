"""Device clock correction on Spark: rows route with the corrected time the processor's events
carry (column-wise and row by row), so Spark's watermark is the embedded engine's, and
``run_spark`` reports what the embedded engine reports."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from spark_support import ids, run_both

from spark_udf.batch import SEQ_COLUMN, TIME_COLUMN
from spark_udf.errors import OperatorConfigError
from spark_udf.packing import unpack_tables
from spark_udf.routing import MAX_TIME_COLUMN, route_batches
from spark_udf.rules import detect_specs, processor_specs, route_specs
from spark_udf.sources import read_jsonl

PROGRAM = """
stream app (user string, action string, ts timestamp, sent_at timestamp,
             received_at timestamp)
  time ts unit ms sent sent_at received received_at lateness 5s

rule login_buy from app by user pattern l b
  define l as action == "login", b as action == "buy"
  within 1m
  emit user, b.ts as bought, b.ts_device as device
"""
BASE_MS = 1_767_225_600_000
HOUR = 3_600_000


def _plan_route(program: str = PROGRAM):
    (spec,), _ = processor_specs(program)
    plan = route_specs({SEQ_COLUMN: "bigint", "_event": "string"}, [spec], stream="app")
    ((route, _, _),) = plan.entries
    return spec, route


def _routed_times(texts: list[str], route, processor) -> list[int | None]:
    batch = pa.RecordBatch.from_pydict({
        SEQ_COLUMN: pa.array(range(len(texts)), pa.int64()),
        "_event": pa.array(texts, pa.string()),
    })
    out: dict[int, int | None] = {}
    for packed in route_batches([batch], route, processor):
        for row in packed.to_pylist():
            (table,) = unpack_tables([row["_vigil_pack"]])
            for record in table.to_pylist():
                out[record[SEQ_COLUMN]] = record[TIME_COLUMN]
                assert row[MAX_TIME_COLUMN] is None or row[MAX_TIME_COLUMN] < BASE_MS + HOUR
    return [out.get(i) for i in range(len(texts))]


@pytest.mark.parametrize("odd", [False, True])
def test_rows_route_with_the_corrected_time(odd: bool) -> None:
    """Column-wise, and row by row when a line the checks refuse (``NaN``) is in the batch."""
    spec, route = _plan_route()
    assert {r.clock is not None for r in route.streams.values()} == {True}
    rows = [
        {"user": "u", "action": "x", "ts": BASE_MS - 2 * HOUR, "sent_at": BASE_MS - 2 * HOUR,
         "received_at": BASE_MS + 7},
        {"user": "u", "action": "x", "ts": BASE_MS + 1, "received_at": BASE_MS + 99},
        {"user": "u", "action": "x", "ts": BASE_MS + 2, "sent_at": "soon",
         "received_at": BASE_MS},
        # corrected years ahead: no time, so it moves no watermark
        {"user": "u", "action": "x", "ts": BASE_MS, "sent_at": BASE_MS,
         "received_at": BASE_MS + 10**13},
    ]
    texts = [json.dumps(r) for r in rows]
    if odd:
        texts.append('{"user": "u", "action": NaN, "ts": 1}')
    times = _routed_times(texts, route, spec.processor)
    assert times[:4] == [BASE_MS + 7, BASE_MS + 1, None, None]


TWO = PROGRAM + """
stream txn (card string, amount float, ts timestamp) time ts unit ms
rule big from txn by card pattern b define b as amount > 100
"""


@pytest.mark.parametrize("odd", [False, True])
def test_another_processors_rows_take_their_corrected_time(odd: bool) -> None:
    """A processor of one stream (txn) routes every row; the rows of the clock-corrected
    stream of another processor take their corrected time there too, so that a device's clock
    (here six hours ahead) never moves the watermark."""
    specs, _ = processor_specs(TWO)
    plan = route_specs({SEQ_COLUMN: "bigint", "_event": "string"}, specs)
    rows = [
        {"stream": "app", "user": "u", "action": "x", "ts": BASE_MS + 6 * HOUR,
         "sent_at": BASE_MS + 6 * HOUR, "received_at": BASE_MS + 5},
        {"stream": "txn", "card": "c", "amount": 1.0, "ts": BASE_MS + 3},
    ]
    texts = [json.dumps(r) for r in rows]
    if odd:
        texts.append('{"stream": "txn", "card": "c", "amount": NaN, "ts": 1}')
    for route, processor, _ in plan.entries:
        times = _routed_times(texts, route, processor)  # asserts no time an hour ahead
        assert times[:2] in ([BASE_MS + 5, BASE_MS + 3], [BASE_MS + 5, None]), times


def test_spark_refuses_clock_correction_over_its_own_time_expressions(spark) -> None:
    (spec,), _ = processor_specs(PROGRAM)
    frame = spark.createDataFrame([('{"user": "u"}',)], "_event string")
    with pytest.raises(OperatorConfigError, match="stream 'app' corrects its device clock"):
        detect_specs(frame, [spec])


def _events(n: int) -> list[dict]:
    """Three devices with clocks hours off, some events without sent or received, a few late
    by their corrected time, arriving as the server receives them."""
    rng = random.Random(25)
    skews = {"u1": -3 * HOUR, "u2": 0, "u3": 5 * HOUR}
    out = []
    for i in range(n):
        user = rng.choice(sorted(skews))
        happened = BASE_MS + i * 2_000 - rng.randint(0, 8_000)
        sent = happened + rng.randint(0, 3_000)
        received = sent + rng.randint(0, 500)
        event = {"user": user, "action": rng.choice(["login", "buy", "view"]),
                 "ts": happened + skews[user], "sent_at": sent + skews[user],
                 "received_at": received}
        # old app versions send no sent_at: on a right clock harmless, on a phone hours
        # behind the event keeps its device time and is late
        if rng.random() < {"u1": 0.05, "u2": 0.3, "u3": 0.0}[user]:
            del event["sent_at"]
        out.append(event)
    return sorted(out, key=lambda e: e["received_at"])


@pytest.mark.slow
def test_run_spark_equals_the_embedded_engine(spark, tmp_path) -> None:
    engine, got, dead = run_both(spark, tmp_path, PROGRAM, _events(300), "app.vigil")
    expected = engine.drain()
    assert len(expected) > 5 and engine.stats.uncorrected > 0 and engine.stats.late > 0
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    assert ids(got) == ids(expected)
    assert sorted(d["reason"] for d in dead) == sorted(
        d["reason"] for d in engine.drain_dead_letters()
    )
    # with the shared static file reader the refusal names the stream
    with pytest.raises(OperatorConfigError, match="stream 'app'"):
        detect_specs(read_jsonl(spark, str(tmp_path / "events.jsonl"), streaming=False),
                     processor_specs(str(tmp_path / "app.vigil"))[0])


@pytest.mark.slow
def test_run_spark_with_another_stream_equals_the_embedded_engine(spark, tmp_path) -> None:
    """Several micro-batches of a clock-corrected stream and another one: the other
    processor's rows must not see the devices' clocks (one phone is five hours ahead), or
    the watermark would run ahead and later events be late on Spark only."""
    sample = []
    for i, event in enumerate(_events(200)):
        sample.append({"stream": "app", **event})
        sample.append({"stream": "txn", "card": f"c{i % 7}", "amount": 50.0 + (i % 5) * 40,
                       "ts": event["received_at"]})
    engine, got, dead = run_both(spark, tmp_path, TWO, sample, "two.vigil")
    expected = engine.drain()
    assert {m["name"] for m in expected} == {"big", "login_buy"}
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    assert sorted(d["reason"] for d in dead) == sorted(
        d["reason"] for d in engine.drain_dead_letters()
    )
