"""Routing JSON rows before the shuffle (``spark_udf.routing``), without a JVM: each row's time
is the engine's own parse, every row of a key lands in one bucket whichever way its batch was
parsed, the need flags agree with the row-by-row filter, and processing the routed blobs under
any micro-batch split gives the direct run's outputs."""

from __future__ import annotations

import json
import random
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spark_support import ids

from cep.events.event import BadEventError, parse_timestamp
from spark_udf.batch import (
    BUCKET_COLUMN,
    END_MARK_MS,
    END_MARK_STREAM,
    SEQ_COLUMN,
    TIME_COLUMN,
    EventLayout,
    fire_due_keys,
    process_bucket,
)
from spark_udf.bucket_state import BucketState
from spark_udf.detectors import _unpacked
from spark_udf.errors import OperatorConfigError
from spark_udf.input_plan import json_route
from spark_udf.operator import reference_outputs
from spark_udf.packing import unpack_tables
from spark_udf.relevance import needed_rows
from spark_udf.routing import (
    MAX_TIME_COLUMN,
    NEED_COLUMN,
    NEED_NO,
    NEED_YES,
    JsonRoute,
    RoutePlan,
    StreamRoute,
    route_batches,
)
from spark_udf.rules import processor_specs, route_specs

PROGRAM = """
stream txn (card_id {key_type}, amount float, merchant string, ts timestamp)
  time ts unit ms lateness 2s

rule card_testing from txn by card_id
  pattern probe{{2,}} big
  define probe as amount < 1.00, big as amount > 500
  within 1m
"""
BASE_MS = 1_767_225_600_000
LAYOUT = EventLayout(event_columns=(SEQ_COLUMN,), json_column="_event",
                     int_columns=frozenset({SEQ_COLUMN}), default_stream="txn")


def _spec(key_type: str = "string"):
    (spec,), _ = processor_specs(PROGRAM.format(key_type=key_type))
    return spec


def _route(spec, buckets: int = 8) -> JsonRoute:
    route = json_route([SEQ_COLUMN, "_event"], "_event", spec.key_cols, spec.time_cols,
                       spec.time_units, spec.default_stream, buckets)
    assert route is not None
    return route


def _batches(texts: list[str], cuts: list[int]) -> list[pa.RecordBatch]:
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(texts)), len(texts)]
    return [
        pa.RecordBatch.from_pydict({
            SEQ_COLUMN: pa.array(range(lo, hi), pa.int64()),
            "_event": pa.array(texts[lo:hi], pa.string()),
        })
        for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo
    ]


def _rows(batches, route, processor) -> dict[int, dict]:
    """Every routed row by input position, with its bucket and its blob's max time."""
    out: dict[int, dict] = {}
    for packed in route_batches(batches, route, processor):
        for row in packed.to_pylist():
            (table,) = unpack_tables([row["_vigil_pack"]])
            for record in table.to_pylist():
                record[BUCKET_COLUMN] = row[BUCKET_COLUMN]
                record[MAX_TIME_COLUMN] = row[MAX_TIME_COLUMN]
                out[record[SEQ_COLUMN]] = record
    return out


ODD_ROWS = [
    lambda k, t: {"card_id": k, "amount": 0.5, "merchant": "m", "ts": "soon"},
    lambda k, t: {"card_id": k, "amount": 0.5, "merchant": "m"},
    lambda k, t: {"amount": 0.5, "merchant": "m", "ts": t},
    lambda k, t: {"card_id": k, "amount": "lots", "merchant": "m", "ts": t},
    lambda k, t: {"card_id": k, "amount": 0.5, "ts": "2026-01-01T00:00:00.250Z"},
    lambda k, t: {"stream": END_MARK_STREAM, "ts": 0},
    lambda k, t: {"stream": "other", "card_id": k, "ts": t},
]


def _texts(seed: int, n: int, odd: float, numeric_keys: bool) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        key = rng.randrange(4) if numeric_keys else f"c{rng.randrange(4)}"
        if numeric_keys and rng.random() < 0.3:
            key = float(key)   # 2 and 2.0 are one key of a float or int field
        t = BASE_MS + i * 100 - rng.randrange(1_000)
        roll = rng.random()
        if roll < odd / 2:
            texts.append(rng.choice(["{broken", "[1, 2]", "null"]))
        elif roll < odd:
            texts.append(json.dumps(rng.choice(ODD_ROWS)(key, t)))
        else:
            amount = 0.5 if roll < 0.4 else (900.0 if roll < 0.5 else 20.0)
            texts.append(json.dumps({"card_id": key, "amount": amount, "merchant": "m", "ts": t}))
    return texts


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(1, 59), max_size=4),
    odd=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    key_type=st.sampled_from(["string", "int", "float"]),
)
def test_routed_rows_carry_the_engine_time_one_bucket_per_key_and_a_sound_need(
    seed, cuts, odd, key_type
):
    spec = _spec(key_type)
    processor = spec.processor
    texts = _texts(seed, 60, odd, numeric_keys=key_type != "string")
    rows = _rows(_batches(texts, cuts), _route(spec), processor)
    assert sorted(rows) == list(range(len(texts)))
    buckets: dict[tuple, int] = {}
    for seq, text in enumerate(texts):
        row = rows[seq]
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        event = dict(value, stream=value.get("stream", "txn")) if isinstance(value, dict) else None
        if event is None:
            expected_time = None
        elif event["stream"] == END_MARK_STREAM:
            expected_time = END_MARK_MS
        else:
            try:
                expected_time = parse_timestamp(event.get("ts"), 1, "ts")
            except BadEventError:
                expected_time = None
        assert row[TIME_COLUMN] == expected_time, text
        assert row[MAX_TIME_COLUMN] is None or row[MAX_TIME_COLUMN] >= (expected_time or 0)
        key = processor.key_of(event) if event is not None else None
        if key is not None and event["stream"] == "txn":
            # One bucket per key the processor sees, wherever its rows were parsed.
            assert buckets.setdefault(key, row[BUCKET_COLUMN]) == row[BUCKET_COLUMN], text
    # A row flagged "not needed" is one the row-by-row filter drops too.
    events = []
    for seq, text in enumerate(texts):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        events.append({**value, "stream": value.get("stream", "txn"), SEQ_COLUMN: seq}
                      if isinstance(value, dict) else None)
    keep = needed_rows(processor, events)
    assert keep is not None
    for seq in range(len(texts)):
        if rows[seq][NEED_COLUMN] == NEED_NO and events[seq] is not None \
                and events[seq]["stream"] == "txn":
            assert not keep[seq], texts[seq]
    if odd == 0.0 and key_type != "int":
        # Clean input is decided column-wise, exactly as the row-by-row filter decides it: the
        # rows no rule can take never become Python objects. (2.0 in an int field makes
        # pyarrow refuse the batch: it is then routed row by row, undecided.)
        flags = [rows[seq][NEED_COLUMN] for seq in range(len(texts))]
        assert flags == [NEED_YES if k else NEED_NO for k in keep]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(1, 299), max_size=6),
    odd=st.sampled_from([0.0, 0.02]),
)
def test_routed_micro_batches_give_the_direct_run(seed, cuts, odd):
    """Route a stream in arbitrary micro-batches, process each bucket's blobs with Spark's
    watermark rule and timers between batches: the matches and dead letters equal one direct
    run of the same events (late rows included)."""
    spec = _spec()
    route = _route(spec, buckets=4)
    processor = spec.processor
    texts = _texts(seed, 300, odd, numeric_keys=False)
    lateness = 2_000
    states = {b: BucketState() for b in range(4)}
    outputs: list[dict] = []
    watermark = 0
    bounds = [0, *sorted(set(cuts)), len(texts)]
    seen_max = None
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi <= lo:
            continue
        (batch,) = _batches(texts[lo:hi], [])
        batch = batch.set_column(0, SEQ_COLUMN, pa.array(range(lo, hi), pa.int64()))
        blobs: dict[int, list[bytes]] = {}
        for packed in route_batches([batch], route, processor):
            for row in packed.to_pylist():
                blobs.setdefault(row[BUCKET_COLUMN], []).append(row["_vigil_pack"])
                if row[MAX_TIME_COLUMN] is not None:
                    seen_max = max(seen_max or 0, row[MAX_TIME_COLUMN])
        for bucket, payloads in blobs.items():
            frames, filtered = _unpacked(payloads[::-1], watermark)
            run = process_bucket(processor, states[bucket], frames, LAYOUT, watermark,
                                 filtered=filtered)
            outputs += run.records
        if seen_max is not None:
            watermark = max(watermark, seen_max - lateness)
        for bucket in states.values():
            outputs += fire_due_keys(processor, bucket, watermark)
    for bucket in states.values():
        outputs += fire_due_keys(processor, bucket, 2**63 - 1)
    # The direct run: the same rows, as Spark-free per-key calls with the same lateness.
    matches = [json.loads(r["payload"]) for r in outputs if r["kind"] != "dead_letter"]
    events = []
    for seq, text in enumerate(texts):
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("stream", "txn") == "txn":
            events.append({**value, "stream": "txn", SEQ_COLUMN: seq})
    late = {json.loads(r["payload"])["line"] for r in outputs
            if r["kind"] == "dead_letter" and r["name"] == "late"}
    expected = reference_outputs(processor, [e for e in events if e[SEQ_COLUMN] not in late],
                                 2**63 - 1)
    assert ids(matches) == ids(expected)
    # Every row behind the watermark of its micro-batch was reported late, none silently lost.
    assert all(isinstance(line, int) for line in late)


def test_late_rows_no_rule_can_take_are_still_reported():
    spec = _spec()
    route = _route(spec, buckets=1)
    texts = [json.dumps({"card_id": "c1", "amount": 20.0, "merchant": "m", "ts": BASE_MS + i})
             for i in range(3)]
    (packed,) = route_batches(_batches(texts, []), route, spec.processor)
    payloads = packed.column("_vigil_pack").to_pylist()
    frames, filtered = _unpacked(payloads, BASE_MS + 1)   # rows 0 is late, 1 and 2 are not
    assert filtered is True and [len(f) for f in frames] == [1]
    run = process_bucket(spec.processor, BucketState(), frames, LAYOUT, BASE_MS + 1,
                         filtered=filtered)
    assert [(r["name"], json.loads(r["payload"])["line"]) for r in run.records] == [("late", 0)]


def test_rows_of_the_frame_own_columns_keep_spark_expressions():
    spec = _spec()
    keys, times = spec.key_cols, spec.time_cols
    # card_id is a column of the frame: Spark expressions read it, no routing.
    assert json_route(["card_id", "_event"], "_event", keys, times, "ms", "txn", 4) is None
    route = json_route(["_event"], "_event", keys, times, "ms", "txn", 4)
    assert route is not None and route.streams[None].key_fields == ("card_id",)
    two = json_route(["_event"], "_event", {"a": ("k",), "b": ("j",)}, {"a": "t", "b": "u"},
                     {"a": "ms", "b": "s"}, None, 4)
    assert two.streams == {"a": StreamRoute(("k",), "t", 1), "b": StreamRoute(("j",), "u", 1000)}


def test_a_source_with_a_route_plan_hands_over_routed_rows(tmp_path):
    from spark_udf.rules import route_specs
    from spark_udf.sources import SOURCE_TYPES, JsonLinesSource

    spec, other = _spec(), _spec("string")
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(_texts(3, 40, 0.05, numeric_keys=False)) + "\n")
    plan = route_specs(SOURCE_TYPES, [spec, other], json_col="_event", buckets=4)
    assert plan is not None and plan.lateness_ms == 2_000 and len(plan.entries) == 2
    from spark_udf.sources.jsonl import route_option

    source = JsonLinesSource({"path": str(path), "route": route_option(plan),
                              "endOfInput": "true"})
    assert source.schema().startswith(BUCKET_COLUMN)
    reader = source.streamReader(None)
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    rows = [row for part in reader.partitions(start, end) for batch in reader.read(part)
            for row in batch.to_pylist()]
    # Each processor routes every line into its own range of groups, once.
    for index in (0, 1):
        mine = [r for r in rows if plan.owner(r[BUCKET_COLUMN]) == index]
        seqs = sorted(s for r in mine for s in unpack_tables([r["_vigil_pack"]]).__next__()
                      .column(SEQ_COLUMN).to_pylist())
        assert seqs == list(range(40))
    # The end-of-input mark follows, routed like any row, with its far-future time.
    mark = reader.latestOffset(end, reader.getDefaultReadLimit())
    (part,) = reader.partitions(end, mark)
    marks = [row for batch in reader.read(part) for row in batch.to_pylist()]
    assert [r[MAX_TIME_COLUMN] for r in marks] == [END_MARK_MS, END_MARK_MS]


@pytest.mark.parametrize("buckets", [0, -1, 2.0, True])
def test_a_route_plan_needs_a_positive_int_bucket_count(buckets):
    with pytest.raises(OperatorConfigError, match="buckets must be a positive int"):
        RoutePlan((), buckets, 0)


def test_a_time_that_cannot_be_right_moves_no_watermark_on_either_parse():
    """A time years ahead of the wall clock routes with no time, whether its batch is parsed
    column-wise or, with a line the checks refuse (a ``NaN``), row by row: it cannot raise a
    blob's max time, so Spark's watermark stays where the good rows put it."""
    spec = _spec()
    far = '"8000-01-01T00:00:00Z"'
    texts = [
        f'{{"card_id": "c1", "amount": 1.0, "ts": {BASE_MS}}}',
        f'{{"card_id": "c1", "amount": 1.0, "ts": {far}}}',
        f'{{"card_id": "c1", "amount": NaN, "ts": {far}}}',
        f'{{"card_id": "c1", "amount": 2.0, "ts": {BASE_MS + 1}}}',
    ]
    rows = _rows(_batches(texts, []), _route(spec), spec.processor)
    assert [rows[i][TIME_COLUMN] for i in range(4)] == [BASE_MS, None, None, BASE_MS + 1]
    assert all(r[MAX_TIME_COLUMN] is None or r[MAX_TIME_COLUMN] <= BASE_MS + 1
               for r in rows.values())


def test_each_stream_routes_with_its_own_ahead_bound():
    """A time 5 hours ahead: within the default day, beyond this stream's ``ahead 1h``."""
    program = PROGRAM.format(key_type="string").replace("lateness 2s", "lateness 2s ahead 1h")
    (spec,), _ = processor_specs(program)
    # As `vigil run --engine spark` routes: the plan of the program's processors.
    plan = route_specs({SEQ_COLUMN: "bigint", "_event": "string"}, [spec], stream="txn")
    ((route, _, _),) = plan.entries
    assert {r.ahead_ms for r in route.streams.values()} == {3_600_000}
    soon = int(time.time() * 1000) + 5 * 3_600_000
    texts = [f'{{"card_id": "c1", "amount": 1.0, "ts": {soon}}}',
             f'{{"card_id": "c1", "amount": 1.0, "ts": {BASE_MS}}}']
    rows = _rows(_batches(texts, []), route, spec.processor)
    assert [rows[i][TIME_COLUMN] for i in range(2)] == [None, BASE_MS]
    default = _rows(_batches(texts, []), _route(_spec()), spec.processor)
    assert [default[i][TIME_COLUMN] for i in range(2)] == [soon, BASE_MS]
