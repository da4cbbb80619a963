"""Every event path is total on Spark too: the bad lines of ``tests/cep/test_event_totality.py``
(nested lists, deep nesting, non-finite numbers, bytes that are not UTF-8, too large) through
``run_spark``, ``vigil run --engine spark`` and ``detect`` on a DataFrame, with the embedded
engine's dead letters; and a fuzz of the Spark worker path (source, routing, keyed operator,
query pass, all without a JVM) against the embedded engine's dead-letter reasons."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

from cep.cli import main
from cep.engine import StandingQueries
from cep.events.event import StreamSchema
from cep.events.limits import MAX_EVENT_BYTES
from cep.events.watermark import END_OF_INPUT
from spark_udf import read_outputs
from spark_udf.batch import BUCKET_COLUMN, fire_due_keys, process_bucket
from spark_udf.bucket_state import BucketState
from spark_udf.detectors import _unpacked
from spark_udf.operator import detect
from spark_udf.packing import PACKED_COLUMN
from spark_udf.queries import _queries, frame_outputs
from spark_udf.routing import resolve_processor, route_plan_batches
from spark_udf.rules import processor_specs, route_specs
from spark_udf.sources import EVENT_COLUMN, SOURCE_TYPES
from spark_udf.sources.jsonl import LineSlice, read_slice

# The fuzz's line generator is the embedded suite's (tests/cep), shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cep"))
from event_lines import EXAMPLES, RULE_AND_QUERIES, event_file  # noqa: E402

pytestmark = pytest.mark.slow

PROGRAM = """
stream txn (id string, card_id string, amount float, merchant string, ts timestamp)
  time ts lateness 30s

rule big from txn by card_id pattern b define b as amount > 500

query m1 from txn match merchant:m1
query nested from txn match n:2 AND n.k:v
"""
T0 = 1_767_225_600


def good_event(i: int) -> dict:
    return {"id": f"e{i}", "card_id": f"c{i % 7}", "amount": 900.0 if i % 11 == 0 else 2.5,
            "merchant": f"m{i % 3}", "ts": T0 + i}


def _line(i: int, fields: str) -> bytes:
    text = json.dumps(good_event(i))
    return (text[:-1] + ", " + fields + "}").encode("utf-8")


#: The rows of tests/cep/test_event_totality.py: (the bad line, its reason; None: a good event)
ROWS = [
    (_line(0, '"n": [[1, [2]], [{"k": "v"}]]'), None),
    (_line(0, '"n": ' + "[" * 1_000 + "]" * 1_000), "too_deep"),
    (_line(0, '"x": -Infinity'), "non_finite"),
    (_line(0, '"x": [1, NaN]'), "non_finite"),
    (_line(0, '"x": 1e400'), "non_finite"),
    (_line(0, '"amount": Infinity').replace(b'"amount": 900.0, ', b""), "non_finite"),
    (_line(0, '"note": "caf_"').replace(b"caf_", b"caf\xe9"), "invalid_utf8"),
    (_line(0, '"note": "\\ud800"'), "invalid_utf8"),
    (_line(0, '"note": "' + "x" * MAX_EVENT_BYTES + '"'), "too_large"),
]


def _input(tmp_path: Path) -> tuple[Path, Path, list[bytes], list[tuple[int, str]]]:
    """Good events with every row between them, and the rows' expected dead letters
    ``(position from 0, reason)``. Each row's event is one no rule takes: the row checks must
    not depend on some rule wanting the row."""
    lines: list[bytes] = []
    expected: list[tuple[int, str]] = []
    for k, (row, reason) in enumerate(ROWS):
        lines.extend(json.dumps(good_event(i)).encode() for i in range(k * 30, k * 30 + 30))
        if reason is not None:
            expected.append((len(lines), reason))
        lines.append(row.replace(b'"id": "e0"', f'"id": "odd{k}"'.encode())
                     .replace(b'"card_id": "c0"', b'"card_id": "c9"'))
    rules, events = tmp_path / "p.vigil", tmp_path / "events.jsonl"
    rules.write_text(PROGRAM)
    events.write_bytes(b"\n".join(lines) + b"\n")
    return rules, events, lines, expected


def _embedded(rules: Path, events: Path, tmp_path: Path) -> tuple[list[dict], list[dict]]:
    out, dead = tmp_path / "embedded.jsonl", tmp_path / "embedded-dead.jsonl"
    assert main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(out), "--dead-letter", str(dead)]) == 0
    read = lambda path: [json.loads(x) for x in path.read_text("utf-8").split("\n") if x]  # noqa: E731
    return read(out), read(dead)


def _strict(record: dict) -> dict:
    json.dumps(record, allow_nan=False).encode("utf-8")
    return record


def test_vigil_run_on_spark_dead_letters_each_row_as_the_embedded_engine(
    spark, tmp_path, capsys
) -> None:
    """``vigil run --engine spark`` (run_spark: the routed source, the stateful operator, the
    query pass) over good events with the rows between them: it finishes, and its matches and
    dead letters are the embedded engine's."""
    rules, events, lines, expected = _input(tmp_path)
    out, dead = tmp_path / "out", tmp_path / "dead"
    code = main(["run", str(rules), "--events", str(events), "--engine", "spark",
                 "--master", "local[2]", "--buckets", "2", "--out", str(out),
                 "--dead-letter", str(dead)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"spark: {len(lines)} event(s)" in err
    got = [_strict(d) for d in read_outputs(str(dead))]
    assert sorted((d["line"], d["reason"]) for d in got) == expected
    raw = {d["line"]: d["raw"] for d in got if d["reason"] == "invalid_utf8"}
    assert any("caf\\xe9" in text for text in raw.values())
    matches = [_strict(m) for m in read_outputs(str(out))]
    local, local_dead = _embedded(rules, events, tmp_path)
    # the embedded engine numbers lines from 1, Spark's positions from 0
    assert sorted((d["line"] - 1, d["reason"]) for d in local_dead) == expected
    assert sorted(m["match_id"] for m in matches) == sorted(m["match_id"] for m in local)
    assert any(m["name"] == "nested" for m in matches)  # the list of lists is searched


def test_detect_on_a_dataframe_dead_letters_an_infinite_float(spark) -> None:
    """A DataFrame's float column holding an infinity: the row is a dead letter
    (``non_finite``), as the embedded engine's feed_batch reports it; NaN is a null."""
    (spec,), _ = processor_specs(PROGRAM.replace("query", "# query"))
    frame = pd.DataFrame([good_event(i) for i in range(4)]).assign(stream="txn")
    frame.loc[1, "amount"] = math.inf
    frame.loc[2, "amount"] = math.nan
    frame.loc[3, "amount"] = 900.0
    rows = detect(spark.createDataFrame(frame), spec.processor, key_cols=spec.key_cols,
                  time_col=spec.time_cols, time_unit=spec.time_units, lateness="30s").collect()
    letters = [json.loads(r.payload) for r in rows if r.kind == "dead_letter"]
    assert [(d["reason"], d["detail"]) for d in letters] == [
        ("non_finite", "field 'amount' holds inf, which no JSON number is")
    ]
    assert sorted(r.name for r in rows if r.kind == "rule") == ["big", "big"]
    assert all(_strict(json.loads(r.payload)) for r in rows)


# ---------------------------------------------------------------------- the worker path


def _worker_letters(tmp_path: Path, lines: list[bytes]) -> list[tuple[int, str]]:
    """The dead letters of one micro-batch (no watermark yet) and the end of input through the
    Spark worker code: the vigil_jsonl source's reading, the routing of every keyed processor,
    their bucket calls and timers, and the query pass; ``(line from 1, reason)``."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    batches = list(read_slice(LineSlice(str(path), 0, 0, len(lines), 0)))
    specs, _ = processor_specs(RULE_AND_QUERIES)
    plan = route_specs(SOURCE_TYPES, specs, json_col=EVENT_COLUMN, buckets=3)
    records: list[dict] = []
    blobs: dict[int, list[bytes]] = {}
    for packed in route_plan_batches(batches, plan):
        for row in packed.to_pylist():
            blobs.setdefault(row[BUCKET_COLUMN], []).append(row[PACKED_COLUMN])
    processors = [resolve_processor(source) for _, source, _ in plan.entries]
    for group, payloads in sorted(blobs.items()):
        owner = plan.owner(group)
        _, _, layout = plan.entries[owner]
        bucket = BucketState()
        frames, filtered = _unpacked(payloads, 0)
        records += process_bucket(processors[owner], bucket, frames, layout, 0,
                                  filtered=filtered).records
        records += fire_due_keys(processors[owner], bucket, END_OF_INPUT)
    decls, streams = _queries(RULE_AND_QUERIES)
    standing = StandingQueries()
    standing.add(standing.compile(decls, streams, {}), streams)
    schemas = {name: StreamSchema.from_decl(d) for name, d in streams.items()}
    checked = {name for spec in specs for name in spec.key_cols}
    for batch in batches:
        records += frame_outputs(batch.to_pandas(), standing, schemas, column=EVENT_COLUMN,
                                 checked=checked)
    letters = {}
    for record in records:
        payload = _strict(json.loads(record["payload"]))
        if record["kind"] == "dead_letter":
            letters[record["match_id"]] = (payload["line"] + 1, payload["reason"])
    return sorted(letters.values())


@settings(max_examples=max(3, EXAMPLES // 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(lines=event_file(max_lines=25))
def test_the_worker_path_dead_letters_what_the_embedded_engine_does(
    tmp_path_factory, lines
) -> None:
    tmp_path = tmp_path_factory.mktemp("worker")
    got = _worker_letters(tmp_path, lines)
    rules, events = tmp_path / "p.vigil", tmp_path / "input.jsonl"
    rules.write_text(RULE_AND_QUERIES)
    events.write_bytes(b"\n".join(lines) + b"\n")
    _, local_dead = _embedded(rules, events, tmp_path)
    # Lateness is Spark's own here (one micro-batch, no watermark yet), and a missing key
    # depends on it (a late event is reported late): compare the other reasons, which a late
    # row reports first on both engines.
    skip = ("late", "missing_key")
    want = Counter((d["line"], d["reason"]) for d in local_dead if d["reason"] not in skip)
    assert Counter(x for x in got if x[1] not in skip) == want
