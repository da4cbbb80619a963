"""The operator's logic without a JVM: bucket state bytes, output rows, per-bucket processing
under arbitrary micro-batch splits, and the Spark processor class under ``TwsTester``."""

from __future__ import annotations

import json
import os

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spark_pairs import PairProcessor
from spark_support import BASE_MS, ids, random_events

from cep.nfa.match import Match
from spark_udf import (
    BatchSink,
    BucketState,
    BucketStateError,
    OperatorConfigError,
    parse_lateness,
    read_outputs,
)
from spark_udf.batch import (
    SEQ_COLUMN,
    TIME_COLUMN,
    EventLayout,
    backtest_frame,
    fire_due_keys,
    process_bucket,
)
from spark_udf.bucket_state import KeySlot
from spark_udf.operator import reference_outputs
from spark_udf.packing import pack_batches
from spark_udf.records import dead_letter_record, match_record, records_frame

WITHIN = 3_000
LAYOUT = EventLayout(
    event_columns=("stream", "k", "ts", "kind", SEQ_COLUMN),
    int_columns=frozenset({"ts", SEQ_COLUMN}),
)


def _frame(events: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(events, columns=list(LAYOUT.event_columns))
    frame[TIME_COLUMN] = frame["ts"]
    return frame


# ---------------------------------------------------------------- bucket state


def test_bucket_state_round_trips_and_forgets_empty_keys():
    bucket = BucketState(registered_ms=42)
    bucket.set('["a"]', b"\x00state", 40)
    bucket.set('["b"]', None, 41)          # a timer but no state
    bucket.set('["é"]', b"", None)         # empty but present state
    bucket.set('["gone"]', None, None)     # nothing left: not stored
    again = BucketState.from_bytes(bucket.to_bytes())
    assert again == bucket
    assert set(again.keys) == {'["a"]', '["b"]', '["é"]'}
    assert again.earliest_due() == 40
    assert BucketState.from_bytes(None) == BucketState() == BucketState.from_bytes(b"")


def test_bucket_state_records_its_bucket_count_and_refuses_another():
    data = BucketState({'["a"]': KeySlot(b"s", None)}, None, buckets=16).to_bytes()
    assert BucketState.from_bytes(data, buckets=16).buckets == 16
    assert BucketState.from_bytes(data).buckets == 16
    assert BucketState.from_bytes(None, buckets=8) == BucketState(buckets=8)
    with pytest.raises(BucketStateError, match=r"hashed into 16 buckets .* uses 64: run it "
                       r"with buckets=16 \(vigil run --buckets 16\) or start from a new"):
        BucketState.from_bytes(data, buckets=64)
    # Written before the count was recorded (format 2): refused, not misread.
    old = b"VGBK\x02" + data[5:13] + data[17:]
    with pytest.raises(BucketStateError, match="format version 2 is not supported"):
        BucketState.from_bytes(old, buckets=16)


FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


def test_bucket_state_is_stored_compressed_and_a_format_4_bucket_is_read_and_continued():
    # Written by 108e93c (format 4, never compressed): three keys, one a 2,000-byte state.
    with open(os.path.join(FIXTURES, "bucket_state_v4.bin"), "rb") as f:
        old = f.read()
    assert old[:5] == b"VGBK\x04"
    bucket = BucketState.from_bytes(old, buckets=16)
    expected = {'["a"]': KeySlot(b"state-a", 40), '["b"]': KeySlot(None, 7),
                '["c"]': KeySlot(b"x" * 2000, None)}
    assert dict(bucket.keys.items()) == expected
    assert (bucket.registered_ms, bucket.buckets, bucket.earliest_due()) == (7, 16, 7)
    bucket.set('["d"]', b"y" * 3000, 9)
    data = bucket.to_bytes()
    # Written back in format 5: the body (over 1 KiB) zstd-compressed, flagged in its header.
    assert data[:6] == b"VGBK\x05\x02" and len(data) < 500
    again = BucketState.from_bytes(data, buckets=16)
    assert dict(again.keys.items()) == {**expected, '["d"]': KeySlot(b"y" * 3000, 9)}
    small = BucketState({'["a"]': KeySlot(b"s", 1)}, buckets=16).to_bytes()
    assert small[:6] == b"VGBK\x05\x00"  # a small body is stored as it is
    # A compressed body that does not decompress is a clear error, not a misread bucket.
    with pytest.raises(BucketStateError, match="bucket state is corrupted: its zstd body does "
                       "not decompress"):
        BucketState.from_bytes(data[:40] + bytes(len(data) - 40))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:10], "too short"),
        (lambda b: b"XXXX" + b[4:], "not a Vigil bucket state"),
        (lambda b: b[:4] + b"\x09" + b[5:], "format version 9"),
        (lambda b: b[:-3], "truncated"),
        (lambda b: b + b"junk", "trailing"),
    ],
)
def test_corrupted_bucket_state_is_a_clear_error(mutate, message):
    data = BucketState({'["a"]': KeySlot(b"payload", 5)}, 5).to_bytes()
    with pytest.raises(BucketStateError, match=message) as info:
        BucketState.from_bytes(mutate(data))
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------- output rows


def test_match_rows_carry_the_engine_match_object_unchanged():
    match = Match("card_testing", 1, {"card_id": "c1"}, {"probe": [1, 2, 3], "big": [4]},
                  {"probes": 3}, BASE_MS, BASE_MS + 5_000, "high").to_json()
    row = match_record(match)
    assert row["kind"] == "rule" and row["name"] == "card_testing"
    assert row["match_id"] == match["match_id"]
    assert row["key"] == '{"card_id":"c1"}'
    assert (row["start_ms"], row["end_ms"]) == (BASE_MS, BASE_MS + 5_000)
    assert json.loads(row["payload"]) == match
    frame = records_frame([row, dead_letter_record({"reason": "late"}, time_ms=None)])
    assert list(frame.columns) == ["kind", "name", "match_id", "key", "payload", "start", "end"]
    assert str(frame["start"].dtype) == "datetime64[ns, UTC]"
    assert frame["start"][0] == pd.Timestamp(BASE_MS, unit="ms", tz="UTC")
    assert pd.isna(frame["start"][1])


def test_dead_letter_ids_are_deterministic_and_distinct():
    a = dead_letter_record({"reason": "late", "event": {"_seq": 1}})
    assert a == dead_letter_record({"event": {"_seq": 1}, "reason": "late"})
    assert a["match_id"] != dead_letter_record({"reason": "late", "event": {"_seq": 2}})["match_id"]


def test_lateness_parsing_names_the_bad_value():
    assert parse_lateness("500ms") == 500
    assert parse_lateness("1h") == 3_600_000
    for bad in ("soon", -1, "5 parsecs", True):
        with pytest.raises(OperatorConfigError, match="lateness"):
            parse_lateness(bad)


# ---------------------------------------------------------------- the idempotent sink


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_sink_replays_overwrite_their_batch_and_hook_sees_matches(tmp_path, fmt):
    match = Match("r", 1, {"k": "a"}, {"a": [1]}, {}, BASE_MS, BASE_MS, "low").to_json()
    rows = records_frame([match_record(match), dead_letter_record({"reason": "late"})])
    delivered = []
    sink = BatchSink(str(tmp_path / "out"), str(tmp_path / "dead"), fmt=fmt,
                     on_matches=lambda batch_id, ms: delivered.append((batch_id, ms)))
    sink.write_batch(rows, 7)
    sink.write_batch(rows, 7)  # Spark replays batch 7 after a crash: same file, no duplicate
    sink.write_batch(rows.iloc[:0], 8)
    got = read_outputs(str(tmp_path / "out"))
    dead = read_outputs(str(tmp_path / "dead"))
    if fmt == "jsonl":
        assert got == [match] and [d["reason"] for d in dead] == ["late"]
    else:
        assert [r["match_id"] for r in got] == [match["match_id"]]
        assert [(r["kind"], r["name"]) for r in dead] == [("dead_letter", "late")]
    assert sorted(os.listdir(tmp_path / "out")) == [f"part-000000000007.{fmt}"]
    assert delivered == [(7, [match]), (7, [match])]  # at-least-once: dedupe by match_id
    # A replay that now produces nothing removes the earlier attempt's file.
    sink.write_batch(rows.iloc[:0], 7)
    assert read_outputs(str(tmp_path / "out")) == []
    with pytest.raises(OperatorConfigError, match="format"):
        BatchSink(str(tmp_path / "x"), fmt="csv")


# ---------------------------------------------------------------- per-bucket processing


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(0, 80), max_size=6),
)
def test_bucket_processing_does_not_depend_on_the_micro_batch_split(seed, cuts):
    """Feed a stream in arbitrary micro-batches, with Spark's watermark rule (max time of the
    earlier batches minus lateness) and timers fired between batches: the outputs equal one
    direct run up to the same final watermark."""
    lateness = 1_000
    events = random_events(seed, 80, keys=3, jitter_ms=lateness)
    processor = PairProcessor(WITHIN)
    bucket = BucketState()
    outputs: list[dict] = []
    watermark = 0
    bounds = [0, *sorted(cuts), len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        chunk = events[lo:hi]
        if chunk:
            # Rows of one micro-batch arrive in no particular order.
            run = process_bucket(processor, bucket, [_frame(chunk[::-1])], LAYOUT, watermark)
            outputs += run.records
            assert run.late == 0
            watermark = max(watermark, max(e["ts"] for e in events[:hi]) - lateness)
        outputs += fire_due_keys(processor, bucket, watermark)
    expected = reference_outputs(PairProcessor(WITHIN), events, watermark)
    assert ids([json.loads(r["payload"]) for r in outputs]) == ids(expected)


def test_late_rows_and_keyless_rows_become_dead_letters():
    processor = PairProcessor(WITHIN)
    bucket = BucketState()
    rows = [
        {"stream": "ev", "k": "x", "ts": BASE_MS, "kind": "a", "_seq": 0},
        {"stream": "ev", "k": None, "ts": BASE_MS + 10, "kind": "a", "_seq": 1},
        {"stream": "other", "k": "x", "ts": BASE_MS + 20, "kind": "b", "_seq": 2},
    ]
    run = process_bucket(processor, bucket, [_frame(rows)], LAYOUT, BASE_MS + 1)
    letters = sorted((r["name"], json.loads(r["payload"])["line"]) for r in run.records)
    # The "other" stream is not read by this processor: ignored, not a dead letter.
    assert letters == [("late", 0), ("missing_key", 1)]
    assert run.late == 1 and bucket.keys == {}


def test_json_rows_keep_undeclared_fields_and_report_bad_json():
    layout = EventLayout(event_columns=(SEQ_COLUMN,), json_column="_event",
                         int_columns=frozenset({SEQ_COLUMN}), default_stream="ev")
    frame = pd.DataFrame({
        SEQ_COLUMN: [0, 1, 2],
        "_event": ['{"k": "x", "ts": 5, "kind": "a", "extra": [1]}', "{oops", "[1]"],
        TIME_COLUMN: [5, None, None],
    })
    seen = []

    class Spy(PairProcessor):
        def process(self, key, state, events, watermark_ms):
            seen.extend(events)
            return super().process(key, state, events, watermark_ms)

    run = process_bucket(Spy(WITHIN), BucketState(), [frame], layout, 0)
    assert seen == [{"k": "x", "ts": 5, "kind": "a", "extra": [1], "_seq": 0, "stream": "ev"}]
    assert sorted(r["name"] for r in run.records) == ["invalid_json", "not_an_object"]


def test_backtest_reports_rows_late_in_input_order():
    events = random_events(3, 30, keys=2)
    frame = _frame(events)
    frame["_vigil_late"] = False
    frame.loc[5, "_vigil_late"] = True
    run = backtest_frame(PairProcessor(WITHIN), frame, LAYOUT, 2**63 - 1)
    late = [json.loads(r["payload"]) for r in run.records if r["kind"] == "dead_letter"]
    assert [d["line"] for d in late] == [5] and run.late == 1
    kept = [e for e in events if e["_seq"] != 5]
    expected = reference_outputs(PairProcessor(WITHIN), kept, 2**63 - 1)
    got = [json.loads(r["payload"]) for r in run.records if r["kind"] != "dead_letter"]
    assert ids(got) == ids(expected)


# ---------------------------------------------------------------- the Spark processor class


def test_bucketed_detector_under_tws_tester_fires_absence_from_a_timer():
    from pyspark.sql.streaming import TwsTester

    from spark_udf import BucketedDetector

    columns = [*LAYOUT.event_columns, TIME_COLUMN, "_vigil_k0", "_vigil_bucket"]
    detector = BucketedDetector(PairProcessor(WITHIN), LAYOUT, columns)
    # Real queries hide the event time from Spark's late filter (the operator reports late
    # rows itself), so the tester's filter must let every packed row through.
    tester = TwsTester(detector, timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    rows = _frame([{"stream": "ev", "k": "x", "ts": BASE_MS, "kind": "a", "_seq": 0},
                   {"stream": "ev", "k": "y", "ts": BASE_MS + 100, "kind": "a", "_seq": 1}])
    rows["_vigil_k0"] = rows["k"]
    rows["_vigil_bucket"] = 3
    (packed,) = pack_batches([pa.RecordBatch.from_pandas(rows, preserve_index=False)],
                             "_vigil_bucket")
    assert tester.testInPandas(3, packed.to_pandas()).empty
    stored = BucketState.from_bytes(tester.peekValueState("bucket", 3)[0])
    assert set(stored.keys) == {'["x"]', '["y"]'} and stored.registered_ms == BASE_MS
    tester.setWatermark(BASE_MS + 50)   # releases x's event; nothing to report yet
    fired = tester.setWatermark(BASE_MS + WITHIN + 60)   # x's window closed, y's not yet
    assert [(r.name, json.loads(r.key)) for r in fired.itertuples()] == [("no_b", {"k": "x"})]
    fired = tester.setWatermark(BASE_MS + WITHIN + 200)
    assert [(r.name, json.loads(r.key)) for r in fired.itertuples()] == [("no_b", {"k": "y"})]
    assert tester.peekValueState("bucket", 3) is None


class _FakeHandle:
    """The parts of ``StatefulProcessorHandle`` the bucketed detector uses, for one group."""

    class _Value:
        def __init__(self) -> None:
            self.value: tuple | None = None

        def get(self):
            return self.value

        def update(self, value) -> None:
            self.value = value

        def clear(self) -> None:
            self.value = None

    def __init__(self) -> None:
        self.state = self._Value()
        self.timers: set[int] = set()

    def getValueState(self, name, schema):
        return self.state

    def registerTimer(self, at: int) -> None:
        self.timers.add(at)

    def deleteTimer(self, at: int) -> None:
        self.timers.discard(at)


class _Now:
    def __init__(self, watermark_ms: int) -> None:
        self.watermark_ms = watermark_ms

    def getCurrentWatermarkInMs(self) -> int:
        return self.watermark_ms


def test_a_bucket_with_input_wakes_its_due_keys_itself_and_drops_its_timer():
    # Spark handles expired timers after the batch's input rows. A bucket that has input in a
    # batch where its timer expires wakes the due keys in that call and deletes the timer, so
    # the timer phase does not load and store the bucket again: same outputs, one call less.
    from spark_udf import BucketedDetector
    from spark_udf.batch import END_WATERMARK_MS

    columns = [*LAYOUT.event_columns, TIME_COLUMN, "_vigil_k0", "_vigil_bucket"]

    def packed(events):
        rows = _frame(events)
        rows["_vigil_k0"] = rows["k"]
        rows["_vigil_bucket"] = 3
        (blob,) = pack_batches([pa.RecordBatch.from_pandas(rows, preserve_index=False)],
                               "_vigil_bucket")
        return [blob.to_pandas()]

    detector = BucketedDetector(PairProcessor(WITHIN), LAYOUT, columns)
    handle = _FakeHandle()
    detector.init(handle)
    first = [{"stream": "ev", "k": "x", "ts": BASE_MS, "kind": "a", "_seq": 0}]
    out = list(detector.handleInputRows((3,), iter(packed(first)), _Now(BASE_MS - 1)))
    assert out == []
    assert BucketState.from_bytes(handle.state.get()[0]).registered_ms == BASE_MS
    assert handle.timers == {BASE_MS, END_WATERMARK_MS}

    # x's window has closed by this batch's watermark; y arrives in the same bucket.
    second = [{"stream": "ev", "k": "y", "ts": BASE_MS + WITHIN + 500, "kind": "a", "_seq": 1}]
    watermark = BASE_MS + WITHIN + 60
    (frame,) = detector.handleInputRows((3,), iter(packed(second)), _Now(watermark))
    assert [(r.name, json.loads(r.key)) for r in frame.itertuples()] == [("no_b", {"k": "x"})]
    # No timer left at or below the watermark: the timer phase has nothing to do here.
    assert all(t > watermark for t in handle.timers)
    stored = BucketState.from_bytes(handle.state.get()[0])
    assert set(stored.keys) == {'["y"]'} and stored.registered_ms in handle.timers

    # The same batches through TwsTester, where the timer fires on its own, report the same.
    from pyspark.sql.streaming import TwsTester

    tester = TwsTester(BucketedDetector(PairProcessor(WITHIN), LAYOUT, columns),
                       timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    assert tester.testInPandas(3, packed(first)[0]).empty
    fired = tester.setWatermark(watermark)
    assert [(r.name, json.loads(r.key)) for r in fired.itertuples()] == [("no_b", {"k": "x"})]
