"""Times that cannot be right through the Spark operator (issue #19): epoch milliseconds on a
seconds stream become a ``too_far_ahead`` dead letter without moving Spark's watermark, so the
later events are not late: the result of the embedded engine, in a backtest and streaming."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cep import Engine
from spark_udf import BatchSink, read_outputs
from spark_udf.batch import SEQ_COLUMN, TIME_COLUMN, EventLayout, process_bucket
from spark_udf.bucket_state import BucketState
from spark_udf.rules import detect_specs, processor_specs
from spark_udf.sources.readers import read_jsonl

pytestmark = pytest.mark.slow

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, in seconds: behind the wall clock of any run
PROGRAM = """
stream txn (card_id string, amount float, ts int) time ts unit s lateness 5s
rule big from txn by card_id pattern b define b as amount > 100
"""
EVENTS = [
    {"card_id": "c1", "amount": 500.0, "ts": T0},
    {"card_id": "c2", "amount": 500.0, "ts": T0 * 1000 + 5},  # ms: year 57971 read as seconds
    {"card_id": "c3", "amount": 500.0, "ts": T0 + 10},
    {"card_id": "c4", "amount": 5.0, "ts": T0 + 20},
    {"card_id": "c5", "amount": 500.0, "ts": T0 + 30},
]


@pytest.fixture
def events_file(tmp_path):
    path = tmp_path / "txn.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    return path


def _embedded() -> tuple[list[tuple[str, str]], list[str]]:
    engine = Engine()
    engine.register(PROGRAM)
    for event in EVENTS:
        engine.feed(event)
    engine.close()
    matches = sorted((m["key"]["card_id"], m["start"]) for m in engine.drain())
    return matches, [d["reason"] for d in engine.drain_dead_letters()]


def _outcome(objects: list[dict]) -> tuple[list[tuple[str, str]], list[dict]]:
    matches = sorted((o["key"]["card_id"], o["start"]) for o in objects if o.get("kind") == "rule")
    dead = [o for o in objects if "reason" in o]
    return matches, dead


def test_a_far_ahead_row_is_a_dead_letter_and_moves_no_watermark(spark, events_file, tmp_path):
    expected_matches, expected_reasons = _embedded()
    assert [card for card, _ in expected_matches] == ["c1", "c3", "c5"]
    assert expected_reasons == ["too_far_ahead"]
    specs, _ = processor_specs(PROGRAM)

    # A backtest: late rows are those behind the running watermark of the input order.
    static = read_jsonl(spark, str(events_file), streaming=False)
    rows = detect_specs(static, specs, buckets=2).collect()  # few buckets: few Python calls
    objects = [json.loads(r.payload) for r in rows]
    matches, dead = _outcome(objects)
    assert matches == expected_matches
    assert [d["reason"] for d in dead] == expected_reasons
    assert "it looks like epoch milliseconds: declare `unit ms`" in dead[0]["detail"]
    assert [(r.name, r.start) for r in rows if r.kind == "dead_letter"] == [
        ("too_far_ahead", None)
    ]

    # Streaming, routed before the shuffle: the row gets no time, so no bucket's largest time
    # (Spark's watermark) is year 57971.
    stream = read_jsonl(spark, str(events_file), end_of_input=True)
    sink = BatchSink(str(tmp_path / "out"), str(tmp_path / "dead"))
    query = (
        detect_specs(stream, specs, buckets=2).writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    matches, _ = _outcome(read_outputs(sink.out))
    assert matches == expected_matches
    assert [d["reason"] for d in read_outputs(sink.dead_letter)] == expected_reasons


def test_a_late_epoch_seconds_time_on_a_ms_stream_names_the_unit_on_the_worker():
    """The Spark worker's ``late`` detail is the embedded engine's, unit hint included, whether
    the event is behind the watermark Spark computed or behind its key's own."""
    (spec,), _ = processor_specs(PROGRAM.replace("unit s", "unit ms"))
    layout = EventLayout(event_columns=(SEQ_COLUMN,), json_column="_event",
                         int_columns=frozenset({SEQ_COLUMN}), default_stream="txn")
    on_time = {"card_id": "c1", "amount": 5.0, "ts": (T0 + 60) * 1000, "_seq": 0}
    late = {"card_id": "c1", "amount": 500.0, "ts": T0, "_seq": 1}  # epoch seconds: 1970
    hint = "it looks like epoch seconds: drop `unit ms`"
    # behind the watermark Spark computed: the operator reports it
    frame = pd.DataFrame({SEQ_COLUMN: [1], "_event": [json.dumps(late)], TIME_COLUMN: [T0]})
    run = process_bucket(spec.processor, BucketState(), [frame], layout, (T0 + 60) * 1000)
    [letter] = [json.loads(r["payload"]) for r in run.records if r["kind"] == "dead_letter"]
    assert letter["reason"] == "late" and letter["detail"].endswith(hint)
    # behind its key's own watermark: the processor reports it
    first = spec.processor.process(("c1",), None, [{**on_time, "stream": "txn"}], None)
    later = spec.processor.process(("c1",), first.state, [{**late, "stream": "txn"}], None)
    [letter] = later.dead_letters
    assert letter["reason"] == "late" and letter["detail"].endswith(hint)
