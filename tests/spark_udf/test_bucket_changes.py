"""A Spark bucket applies its changelog rows column-wise (``spark_udf.batch
._take_changes_by_column``) with exactly the tables, matches and reports of the row-wise path:
random changelogs with bad rows (wrong types, missing keys, unknown ops, tombstones, broken
JSON, late rows) interleaved with events, routed and run bucket by bucket over micro-batches
as the Spark operator runs them, without a JVM."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spark_udf.batch as batch
from cep.events.watermark import END_OF_INPUT, NO_WATERMARK
from spark_udf.batch import BUCKET_COLUMN, SEQ_COLUMN, fire_due_keys, process_bucket
from spark_udf.bucket_state import BucketState
from spark_udf.detectors import _unpacked
from spark_udf.packing import PACKED_COLUMN
from spark_udf.routing import MAX_TIME_COLUMN, resolve_processor, route_plan_batches
from spark_udf.rules import processor_specs, route_specs

# The embedded suite's as-of reference, shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cep"))
import test_tables as as_of  # noqa: E402

PROGRAM = """
stream card_changes (card_id string, home string, limit float, n int, op string, ts timestamp)
  time ts unit ms lateness 5s
stream payments (card_id string, country string, amount float, ts timestamp)
  time ts unit ms lateness 5s
table cards from card_changes key card_id op op

rule abroad from payments by card_id
  pattern a
  define a as amount > 100 and country != lookup(cards, card_id).home
  emit card_id, country, lookup(cards, card_id).home as home, lookup(cards, card_id).n as n

rule over_limit from payments by card_id
  pattern a !b within 20s
  define a as amount > lookup(cards, card_id).limit, b as amount < 1
  emit card_id, lookup(cards, card_id).limit as lim
"""
BASE_MS = 1_767_225_600_000
BUCKETS = 3

_change = st.fixed_dictionaries(
    {
        "stream": st.just("card_changes"),
        "card_id": st.sampled_from(["c1", "c2", "c3", "c\"4", None]),
        "home": st.sampled_from(["FR", "DE", None]),
        "limit": st.sampled_from([150.0, 400, None, "lots"]),
        "n": st.sampled_from([1, 2**60 + 1, None, 2.5]),
        "op": st.sampled_from(["c", "u", "U", "d", "truncate", None]),
    },
    optional={"extra": st.just({"nested": [1]})},
)
_payment = st.fixed_dictionaries({
    "stream": st.just("payments"),
    "card_id": st.sampled_from(["c1", "c2", "c3", "c\"4"]),
    "country": st.sampled_from(["FR", "DE"]),
    "amount": st.sampled_from([0.5, 50.0, 200.0, 500.0]),
})


@st.composite
def _inputs(draw):
    rows = []
    for i in range(draw(st.integers(5, 60))):
        row = dict(draw(st.one_of(_change, _payment)))
        row = {k: v for k, v in row.items() if v is not None or draw(st.booleans())}
        text = json.dumps(row | {"ts": BASE_MS + i * 1_000 + draw(st.integers(-8_000, 8_000))})
        if draw(st.integers(0, 30)) == 0:
            text = draw(st.sampled_from([text[:-1], "null", '{"stream": "card_changes"}']))
        rows.append(text)
    cuts = sorted(draw(st.lists(st.integers(1, len(rows)), max_size=4, unique=True)))
    return rows, cuts


def _run(texts: list[str], cuts: list[int], program: str = PROGRAM) -> tuple[list[str], dict]:
    """Matches and reports (canonical JSON, sorted) and every bucket's slots, after the rows
    went through in micro-batches ``cuts`` apart and the input ended."""
    specs, _ = processor_specs(program)
    plan = route_specs({SEQ_COLUMN: "bigint", "_event": "string"}, specs, buckets=BUCKETS)
    processors = [resolve_processor(source) for _, source, _ in plan.entries]
    stored: dict[int, BucketState] = {}
    timers: dict[int, int] = {}  # each bucket's registered timer
    records: list[dict] = []
    watermark = NO_WATERMARK
    latest = None
    for lo, hi in zip([0, *cuts], [*cuts, len(texts)], strict=False):
        if lo == hi:
            continue
        arrow = pa.RecordBatch.from_pydict(
            {SEQ_COLUMN: list(range(lo, hi)), "_event": texts[lo:hi]}
        )
        blobs: dict[int, list[bytes]] = {}
        for packed in route_plan_batches([arrow], plan):
            for row in packed.to_pylist():
                blobs.setdefault(row[BUCKET_COLUMN], []).append(row[PACKED_COLUMN])
                if row[MAX_TIME_COLUMN] is not None:
                    latest = max(latest or row[MAX_TIME_COLUMN], row[MAX_TIME_COLUMN])
        for group in sorted(set(blobs) | set(stored)):
            # As the bucketed operator does: a bucket with input runs its rows, then wakes
            # its keys whose timer the watermark reached; one without input only the latter.
            owner = plan.owner(group)
            bucket = stored.setdefault(group, BucketState())
            if group in blobs:
                frames, filtered = _unpacked(blobs[group], watermark)
                records += process_bucket(
                    processors[owner], bucket, frames, plan.entries[owner][2], watermark,
                    filtered=filtered, bucket_index=group % BUCKETS,
                ).records
            if group in timers and timers[group] <= watermark:
                records += fire_due_keys(processors[owner], bucket, watermark)
            due = bucket.earliest_due()
            if due is None:
                timers.pop(group, None)
            else:
                timers[group] = max(due, watermark + 1)
        if latest is not None:
            watermark = max(watermark, latest - plan.lateness_ms)
    for group, bucket in sorted(stored.items()):
        records += fire_due_keys(processors[plan.owner(group)], bucket, END_OF_INPUT)
    out = sorted(json.dumps(r, sort_keys=True, default=str) for r in records)
    return out, {group: dict(bucket.keys) for group, bucket in stored.items()}


@settings(max_examples=60, deadline=None)
@given(_inputs())
def test_changes_taken_column_wise_equal_the_row_wise_path(inputs) -> None:
    texts, cuts = inputs
    column_wise = batch._take_changes_by_column
    try:
        got = _run(texts, cuts)
        batch._take_changes_by_column = lambda processor, opened, frame, layout, wm: frame
        expected = _run(texts, cuts)
    finally:
        batch._take_changes_by_column = column_wise
    assert got == expected


def test_the_column_wise_path_takes_the_good_changes() -> None:
    """The path is not idle: plain changes are taken column-wise, and the tables they build
    answer the rules (the differential test above would pass if it took nothing)."""
    texts = [
        json.dumps({"stream": "card_changes", "card_id": "c1", "home": "FR", "limit": 150.0,
                    "n": 2**60 + 1, "op": "c", "ts": BASE_MS}),
        json.dumps({"stream": "card_changes", "card_id": "c1", "home": "FR", "op": "u",
                    "ts": BASE_MS + 5_000}),  # n null: the column holds a null beside 2**60 + 1
        json.dumps({"stream": "card_changes", "card_id": "c2", "home": "DE", "op": "u",
                    "ts": BASE_MS + 10}),
        json.dumps({"stream": "card_changes", "card_id": "c3", "op": "truncate",
                    "ts": BASE_MS + 20}),
        json.dumps({"stream": "payments", "card_id": "c1", "country": "DE", "amount": 200.0,
                    "ts": BASE_MS + 1_000}),
    ]
    column_wise = batch._take_changes_by_column
    taken = []

    def counting(processor, opened, frame, layout, watermark_ms):
        left = column_wise(processor, opened, frame, layout, watermark_ms)
        taken.append(len(frame) - len(left))
        return left

    batch._take_changes_by_column = counting
    try:
        records, _ = _run(texts, [])
    finally:
        batch._take_changes_by_column = column_wise
    assert sum(taken) == 3  # the unknown op goes row by row, and is reported there
    found = [json.loads(r) for r in records]
    abroad = [json.loads(r["payload"]) for r in found if r["name"] == "abroad"]
    assert [(m["values"]["home"], m["values"]["n"]) for m in abroad] == [("FR", 2**60 + 1)]
    assert [r["name"] for r in found if r["kind"] == "dead_letter"] == ["unknown_op"]


class _Outputs:
    """What the Spark path reported, read as the embedded suite reads an engine."""

    def __init__(self, records: list[str]) -> None:
        rows = [json.loads(r) for r in records]
        self._matches = [json.loads(r["payload"]) for r in rows
                         if r["kind"] in ("rule", "metric")]
        # Every processor reading a stream reports its bad rows: the sink keeps one per id.
        letters = {r["match_id"]: r for r in rows if r["kind"] == "dead_letter"}
        self._letters = [json.loads(r["payload"]) for r in letters.values()]

    def drain(self) -> list[dict]:
        return self._matches

    def drain_dead_letters(self) -> list[dict]:
        return self._letters


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=as_of.streams(), cuts=st.lists(st.integers(0, 60), max_size=4))
def test_the_spark_path_matches_the_as_of_reference(rows, cuts) -> None:
    """The embedded suite's brute-force as-of lookup (tests/cep/test_tables.py: random
    changelogs with bad rows interleaved with transactions, out of order within the lateness),
    held against the Spark path: rows routed and run bucket by bucket, in micro-batches."""
    expected = as_of.reference(rows)
    bad = sum(1 for r in rows if r["stream"] == "card_changes"
              and ("card_id" not in r or r["op"] == "x"))
    texts = [json.dumps(row) for row in rows]
    records, _ = _run(texts, sorted({c % (len(rows) + 1) for c in cuts}), as_of.PROGRAM)
    assert as_of.outcome(_Outputs(records)) == (expected, bad)
