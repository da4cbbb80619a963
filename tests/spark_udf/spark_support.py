"""Helpers shared by the Spark operator tests: random event streams and running queries."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from typing import Any

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
EVENT_SCHEMA = "stream string, k string, ts long, kind string, _seq long"

# Input rows for the dead-letter tests: one good event per stream of a program declaring
# ``news`` (id, title text, views int, ts) and ``txn`` (card_id, amount float, ts), and every
# kind of bad row: a wrong type in each stream, no JSON, an undeclared stream, no stream.
BAD_ROWS = [
    '{"stream": "news", "id": "d1", "title": "ACME merger", "views": 3, "ts": 1767225600}',
    '{"stream": "news", "id": "d2", "title": "ACME again", "views": "lots", "ts": 1767225601}',
    "not json at all",
    '{"stream": "txn", "card_id": "c1", "amount": "many", "ts": 1767225602}',
    '{"stream": "nope", "x": 1, "ts": 1767225603}',
    '{"id": "d3", "title": "acme", "ts": 1767225604}',
    '{"stream": "txn", "card_id": "c1", "amount": 500, "ts": 1767225605}',
]


def random_events(
    seed: int, n: int, *, keys: int = 6, step_ms: int = 400, jitter_ms: int = 1_000
) -> list[dict[str, Any]]:
    """Events with bounded disorder: no event is more than ``jitter_ms`` older than any event
    before it, so with a lateness of at least ``jitter_ms`` nothing is ever late."""
    rng = random.Random(seed)
    events = []
    for seq in range(n):
        ts = BASE_MS + seq * step_ms - rng.randint(0, jitter_ms)
        kind = rng.choices(["a", "b", "c"], weights=[3, 2, 1])[0]
        events.append({"stream": "ev", "k": f"k{rng.randrange(keys)}", "ts": ts, "kind": kind,
                       "_seq": seq})
    return events


def split_into_files(directory: str, events: list[dict[str, Any]], cuts: list[int]) -> None:
    """Write ``events`` as JSON-lines files cut at the given positions (one file a batch)."""
    os.makedirs(directory, exist_ok=True)
    bounds = [0, *sorted(cuts), len(events)]
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if hi > lo:
            write_jsonl(os.path.join(directory, f"events-{i:04d}.jsonl"), events[lo:hi], i)


def write_jsonl(path: str, events: list[dict[str, Any]], order: int = 0) -> None:
    """Write a JSON-lines file; ``order`` sets its modification time, which is the order in
    which Spark's file source (``maxFilesPerTrigger``) reads new files."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        for event in events:
            handle.write(json.dumps(event) + "\n")
    os.utime(tmp, (1_700_000_000 + order, 1_700_000_000 + order))
    os.replace(tmp, path)


def ids(rows: list[dict[str, Any]]) -> Counter:
    """Multiset of (name, match_id): what equivalence compares."""
    return Counter((r["name"], r["match_id"]) for r in rows)


def embedded(program: str, sample: list[dict[str, Any]]) -> Any:
    """The embedded engine with ``program`` (a path or DSL text), fed ``sample`` row by row,
    closed."""
    from cep.engine.engine import Engine

    engine = Engine()
    engine.register(program)
    for event in sample:
        engine.feed(event)
    engine.close()
    return engine


def run_both(spark: Any, tmp_path: Any, program: str, sample: list[dict[str, Any]],
             name: str = "program.vigil") -> tuple[Any, list[dict], list[dict]]:
    """``program`` over ``sample`` with ``run_spark`` (micro-batches of 100 rows, 4 buckets)
    and with the embedded engine fed row by row: the closed engine, and Spark's matches and
    dead letters."""
    engine, matches, dead, _ = run_both_summary(spark, tmp_path, program, sample, name)
    return engine, matches, dead


def run_both_summary(spark: Any, tmp_path: Any, program: str, sample: list[dict[str, Any]],
                     name: str = "program.vigil") -> tuple[Any, list[dict], list[dict], Any]:
    """:func:`run_both`, with ``run_spark``'s summary last."""
    from spark_udf import read_outputs
    from spark_udf.run import run_spark

    rules = tmp_path / name
    rules.write_text(program)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in sample))
    summary = run_spark(str(rules), str(events), out=str(tmp_path / "out"),
                        dead_letter=str(tmp_path / "dead"), spark=spark,
                        max_records_per_batch=100, buckets=4)
    engine = embedded(str(rules), sample)
    return (engine, read_outputs(str(tmp_path / "out")), read_outputs(str(tmp_path / "dead")),
            summary)

