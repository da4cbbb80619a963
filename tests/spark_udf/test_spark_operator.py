"""The streaming operator, the static backtest and a direct run of the processor agree; late
rows become dead letters; absences fire from event-time timers."""

from __future__ import annotations

import json
import os

import pytest
from spark_pairs import PairProcessor
from spark_support import (
    EVENT_SCHEMA,
    ids,
    random_events,
    split_into_files,
    write_jsonl,
)

from cep.events.watermark import END_OF_INPUT
from spark_udf import (
    BatchSink,
    OperatorConfigError,
    detect,
    read_files,
    read_outputs,
    reference_outputs,
)
from spark_udf.records import match_record

pytestmark = pytest.mark.slow

WITHIN_MS = 3_000
LATENESS_MS = 1_000


def _stream(spark, src, tmp_path, name, *, layout="bucketed", buckets=4):
    frame = read_files(spark, str(src), EVENT_SCHEMA, fmt="json", max_files_per_trigger=1)
    out = detect(frame, PairProcessor(WITHIN_MS), key_cols=["k"], time_col="ts",
                 lateness=LATENESS_MS, buckets=buckets, layout=layout)
    sink = BatchSink(str(tmp_path / f"{name}-out"), str(tmp_path / f"{name}-dead"))
    query = (
        out.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / f"{name}-ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sink, query


def test_streaming_equals_direct_run_and_backtest(spark, tmp_path):
    events = random_events(1, 240)
    src = tmp_path / "src"
    split_into_files(str(src), events, cuts=[37, 90, 91, 201])
    final_wm = max(e["ts"] for e in events) - LATENESS_MS
    expected = ids(reference_outputs(PairProcessor(WITHIN_MS), events, final_wm))
    assert sum(expected.values()) > 20
    assert {name for name, _ in expected} == {"pair", "no_b"}

    sink, query = _stream(spark, src, tmp_path, "bucketed")
    assert sink.counters.batches >= 5
    assert ids(read_outputs(sink.out)) == expected
    assert read_outputs(sink.dead_letter) == []

    sink2, _ = _stream(spark, src, tmp_path, "per_key", layout="per_key")
    assert ids(read_outputs(sink2.out)) == expected

    static = spark.read.schema(EVENT_SCHEMA).json(str(src))
    backtest = detect(static, PairProcessor(WITHIN_MS), key_cols=["k"], time_col="ts",
                      lateness=LATENESS_MS, final_watermark_ms=final_wm)
    assert ids([json.loads(r.payload) for r in backtest.collect()]) == expected

    everything = detect(static, PairProcessor(WITHIN_MS), key_cols=["k"], time_col="ts",
                        lateness=LATENESS_MS)
    full = ids(reference_outputs(PairProcessor(WITHIN_MS), events, END_OF_INPUT))
    rows = everything.collect()
    assert ids([json.loads(r.payload) for r in rows]) == full
    assert sum(full.values()) > sum(expected.values())
    assert {r.kind for r in rows} == {"rule"}


def test_event_time_absence_from_timers_and_late_rows_to_dead_letters(spark, tmp_path):
    src = tmp_path / "src"
    os.makedirs(src)
    base = 1_767_225_600_000
    # "lonely" sees one ``a`` and nothing else: only the watermark, pushed by other keys'
    # events, closes its window, so its absence can only come from a timer firing.
    write_jsonl(str(src / "f0.jsonl"), [
        {"stream": "ev", "k": "lonely", "ts": base, "kind": "a", "_seq": 0},
        {"stream": "ev", "k": "x", "ts": base + 60_000, "kind": "a", "_seq": 1},
    ], 0)
    write_jsonl(str(src / "f1.jsonl"), [
        {"stream": "ev", "k": "x", "ts": base + 1_000, "kind": "b", "_seq": 2},  # 59 s late
        {"stream": "ev", "k": "y", "ts": base + 59_500, "kind": "a", "_seq": 3},  # in time
    ], 1)
    sink, query = _stream(spark, src, tmp_path, "event-time", buckets=8)
    rows = read_outputs(sink.out)
    assert [(r["name"], r["key"]) for r in rows] == [("no_b", {"k": "lonely"})]
    assert match_record(rows[0])["end_ms"] == base + WITHIN_MS
    dead = read_outputs(sink.dead_letter)
    assert [(d["reason"], d["event"]["_seq"]) for d in dead] == [("late", 2)]
    assert "behind the watermark" in dead[0]["detail"]
    assert sink.counters.late == 1
    # x's and y's windows are still open at the final watermark (60 s - 1 s): nothing else.
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in progress] == [2, 2]


def test_a_restart_with_another_bucket_count_stops_naming_the_checkpoints(spark, tmp_path):
    events = random_events(5, 120)
    src = tmp_path / "src"
    split_into_files(str(src), events[:60], cuts=[30])
    _stream(spark, src, tmp_path, "buckets", buckets=4)
    write_jsonl(str(src / "events-0009.jsonl"), events[60:], 9)
    # Another count would hash keys into other buckets and lose their state: refused.
    with pytest.raises(Exception, match="hashed into 4 buckets per processor, this query uses 8"):
        _stream(spark, src, tmp_path, "buckets", buckets=8)
    # The checkpoint's own count continues where the first run stopped.
    sink, _ = _stream(spark, src, tmp_path, "buckets", buckets=4)
    final_wm = max(e["ts"] for e in events) - LATENESS_MS
    expected = ids(reference_outputs(PairProcessor(WITHIN_MS), events, final_wm))
    first = read_outputs(str(tmp_path / "buckets-out"))
    assert ids(first) == expected and sum(expected.values()) > 5


def test_bad_arguments_name_what_is_wrong(spark):
    frame = spark.createDataFrame([("ev", "k1", 5, "a", 0)], EVENT_SCHEMA)
    ok = {"key_cols": ["k"], "time_col": "ts", "lateness": "1s"}
    cases = [
        ({"layout": "sideways"}, "layout must be one of"),
        ({"buckets": 0}, "buckets must be a positive int"),
        ({"key_cols": ["card"]}, "key_cols: column\\(s\\) 'card' not in the input"),
        ({"time_col": "when"}, "time_col: column\\(s\\) 'when' not in the input"),
        ({"time_col": "kind", "time_unit": "weeks"}, "time_unit must be 'ms' or 's'"),
        ({"lateness": "a while"}, "lateness must be a duration"),
        ({"key_cols": {"ev": ["k"], "other": ["k", "kind"]}}, "same number of fields"),
        ({"json_col": "_event"}, "json_col: column\\(s\\) '_event' not in the input"),
    ]
    for change, message in cases:
        with pytest.raises(OperatorConfigError, match=message):
            detect(frame, PairProcessor(WITHIN_MS), **{**ok, **change})
    with pytest.raises(OperatorConfigError, match="reserved prefix"):
        detect(frame.withColumnRenamed("kind", "_vigil_kind"), PairProcessor(WITHIN_MS), **ok)
