"""Device clock correction on Spark: rows route with the corrected time the processor's events
carry (column-wise and row by row), so Spark's watermark is the embedded engine's, and
``run_spark`` reports what the embedded engine reports, the events that kept their device time
(no sent or received time) counted once each."""

from __future__ import annotations

import json
import random
import re

import pyarrow as pa
import pytest
from spark_support import embedded, ids, run_both, run_both_summary

from spark_udf.batch import SEQ_COLUMN, TIME_COLUMN
from spark_udf.errors import OperatorConfigError
from spark_udf.packing import unpack_tables
from spark_udf.records import records_frame, uncorrected_record
from spark_udf.routing import MAX_TIME_COLUMN, route_batches, route_plan_batches, uncorrected_in
from spark_udf.rules import detect_specs, processor_specs, route_specs
from spark_udf.sinks import BatchSink, read_outputs
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


# ---------------------------------------------------------------------------- uncorrected

READ_TWICE = """
stream app (user string, device string, action string, ts timestamp, sent_at timestamp,
             received_at timestamp)
  time ts unit ms sent sent_at received received_at lateness 5s
stream web (page string, ts timestamp, sent_at timestamp, received_at timestamp)
  time ts unit ms sent sent_at received received_at lateness 5s

rule login_buy from app by user pattern l b
  define l as action == "login", b as action == "buy"
  within 1m

rule device_logins from app by device pattern a b
  define a as action == "login", b as action == "login"
  within 30s
"""
"""A clock-corrected stream read by two processors (rules keyed by user and by device), and
one no keyed processor reads (its events are checked by the query pass)."""


def _read_twice_events(
    n: int, seed: int = 7, *, behind: bool = False
) -> tuple[list[dict], int]:
    """Events of :data:`READ_TWICE` in the order the server receives them, and how many are
    valid events that lack a sent or received time (missing or null). A few rows that lack one
    are dead letters (a wrong type, a bad time): not events, so not counted. With ``behind``,
    events of the device two hours behind lack one too: kept at their device time, they are
    late (and still counted)."""
    rng = random.Random(seed)
    skews = {"d1": -2 * HOUR, "d2": 0, "d3": 0}
    arrivals, uncorrected = [], 0
    for i in range(n):
        happened = BASE_MS + i * 1_500 - rng.randint(0, 4_000)
        device = rng.choice(sorted(skews))
        sent = happened + rng.randint(0, 1_000)
        received = sent + rng.randint(0, 300)
        event = {"stream": "app", "user": rng.choice(["u1", "u2", "u3"]), "device": device,
                 "action": rng.choice(["login", "buy", "view"]),
                 "ts": happened + skews[device], "sent_at": sent + skews[device],
                 "received_at": received}
        if i % 9 == 4:
            event = {"stream": "web", "page": rng.choice(["home", "checkout"]),
                     "ts": happened, "sent_at": sent, "received_at": received}
        lacking = rng.random() < ((0.15 if behind else 0.0) if skews[device] else 0.3)
        if lacking:
            field = rng.choice(["sent_at", "received_at"])
            if rng.random() < 0.5:
                del event[field]
            else:
                event[field] = None
        bad = i % 23 == 11
        if bad:
            if i % 2:
                event["ts"] = "soon"
            else:
                event = {**event, "stream": "app", "action": 5}
            event.pop("sent_at", None)
        uncorrected += lacking and not bad
        arrivals.append((received, i, event))
    arrivals.sort(key=lambda a: (a[0], a[1]))
    return [event for _, _, event in arrivals], uncorrected


def _routed_counts(plan, texts: list[str], per_batch: int) -> dict[str, int]:
    """What the routing of ``texts`` (in batches of ``per_batch`` rows) reports through its
    blobs."""
    batches = [
        pa.RecordBatch.from_pydict({
            SEQ_COLUMN: pa.array(range(lo, lo + len(texts[lo:lo + per_batch])), pa.int64()),
            "_event": pa.array(texts[lo:lo + per_batch], pa.string()),
        })
        for lo in range(0, len(texts), per_batch)
    ]
    routed = [row for out in route_plan_batches(batches, plan) for row in out.to_pylist()]
    # one blob carries a batch's count, however many groups and processors there are
    carriers = [row for row in routed if uncorrected_in([row["_vigil_pack"]])]
    assert len(carriers) <= len(batches)
    return uncorrected_in(row["_vigil_pack"] for row in routed)


@pytest.mark.parametrize("odd", [False, True])
def test_routing_counts_each_uncorrected_event_once(odd: bool) -> None:
    """Two processors read ``app``: each of its events that kept its device time is counted
    once per input row, as the embedded engine counts it, column-wise and row by row (a line
    the checks refuse, and sent times as text beside numbers, which no column-wise parse
    takes)."""
    specs, _ = processor_specs(READ_TWICE)
    assert len(specs) == 2
    plan = route_specs({SEQ_COLUMN: "bigint", "_event": "string"}, specs)
    assert plan.clock_streams == {"app"}  # web: no keyed processor, the query pass counts it
    sample, _ = _read_twice_events(150, behind=True)
    sample = [event for event in sample if event["stream"] == "app"]
    if odd:
        sample[5] = {**sample[5], "sent_at": "2026-01-01T00:00:00Z"}
        sample[6] = {**sample[6], "sent_at": "2026-01-01T00:00:00Z", "received_at": None}
    texts = [json.dumps(event) for event in sample] + ["not json", "{}"]
    if odd:
        texts.insert(40, '{"stream": "app", "user": "u1", "action": NaN, "ts": 1}')
    engine = embedded(READ_TWICE, [json.loads(t) for t in texts if t.startswith("{")
                                   and "NaN" not in t])
    expected = engine.stats.uncorrected
    assert engine.stats.late > 0  # some of them late: counted all the same
    truth = sum(
        1 for event in sample
        if (event.get("sent_at") is None or event.get("received_at") is None)
        and isinstance(event["action"], str) and isinstance(event["ts"], int)
    )
    assert expected == truth > 5
    assert _routed_counts(plan, texts, 40) == {"app": expected}
    assert _routed_counts(plan, texts, len(texts)) == {"app": expected}


def test_the_sink_adds_up_the_counts_and_writes_none(tmp_path) -> None:
    rows = records_frame([
        uncorrected_record("app", 2, "group 0"), uncorrected_record("app", 3, "group 5"),
        uncorrected_record("web", 1, "seq 0"),
    ])
    sink = BatchSink(str(tmp_path / "out"), str(tmp_path / "dead"))
    sink.write_batch(rows, 0)
    assert (sink.counters.uncorrected, sink.counters.matches, sink.counters.dead_letters) == (
        6, 0, 0)
    assert read_outputs(sink.out) == [] and read_outputs(sink.dead_letter) == []


@pytest.mark.slow
def test_run_spark_counts_uncorrected_events_as_the_embedded_engine(spark, tmp_path) -> None:
    """Over several micro-batches, with ``app`` read by two processors and ``web`` by none:
    the run's count is the embedded engine's and the true one, each event counted once."""
    sample, truth = _read_twice_events(260)
    engine, got, dead, summary = run_both_summary(spark, tmp_path, READ_TWICE, sample,
                                                  "twice.vigil")
    expected = engine.drain()
    assert {m["name"] for m in expected} == {"login_buy", "device_logins"}
    assert summary.batches >= 3
    assert summary.uncorrected == engine.stats.uncorrected == truth > 10
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    assert sorted(d["reason"] for d in dead) == sorted(
        d["reason"] for d in engine.drain_dead_letters()
    )


def _uncorrected_said(err: str) -> list[int]:
    return [int(n) for n in re.findall(r"(\d+) with their device's clock uncorrected", err)]


@pytest.mark.slow
def test_vigil_run_on_spark_says_how_many_were_uncorrected_as_the_embedded_engine(
    spark, tmp_path, capsys
) -> None:
    from cep.cli import main

    rules = tmp_path / "twice.vigil"
    rules.write_text(READ_TWICE)
    events = tmp_path / "events.jsonl"
    sample, truth = _read_twice_events(150, seed=3)
    events.write_text("".join(json.dumps(e) + "\n" for e in sample))

    def said(argv: list[str]) -> list[int]:
        assert main(["run", str(rules), "--events", str(events), *argv]) == 0
        return _uncorrected_said(capsys.readouterr().err)

    embedded_said = said(["--engine", "embedded", "--no-alerts",
                          "--out", str(tmp_path / "e.jsonl")])
    assert embedded_said == [truth] and truth > 5
    assert said(["--master", "local[2]", "--max-records-per-batch", "60",
                 "--out", str(tmp_path / "spark")]) == embedded_said


@pytest.mark.slow
def test_detect_over_a_stream_gives_no_count_rows(spark, tmp_path) -> None:
    """The counts stay inside ``run_spark``: ``spark_udf.detect`` gives results only."""
    from spark_udf import detect

    sample, _ = _read_twice_events(120, seed=5)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in sample))
    kinds: set[str] = set()
    frame = detect(read_jsonl(spark, str(path), max_records_per_batch=50), READ_TWICE,
                   buckets=2)
    query = (
        frame.writeStream.foreachBatch(lambda batch, _: kinds.update(
            row.kind for row in batch.select("kind").collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert "rule" in kinds and kinds <= {"rule", "dead_letter"}, kinds
