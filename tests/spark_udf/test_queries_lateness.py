"""Standing queries on Spark see lateness as the embedded engine does: an event behind the
watermark is dead-lettered ``late`` and not searched."""

from __future__ import annotations

import json

import pytest

from cep.engine.engine import Engine
from spark_udf import query_outputs

PROGRAM = """
stream news (id string, title text, ts timestamp) time ts unit ms lateness 2s
query acme from news match title:acme
"""
# n3 is 13 s behind n2 (the watermark is then 18 s): late. n4 is 1 s behind: within lateness.
EVENTS = [
    {"stream": "news", "id": "n1", "title": "ACME merger", "ts": 10_000},
    {"stream": "news", "id": "n2", "title": "Acme again", "ts": 20_000},
    {"stream": "news", "id": "n3", "title": "acme, late", "ts": 7_000},
    {"stream": "news", "id": "n4", "title": "acme, a bit out of order", "ts": 19_000},
]


def _embedded() -> tuple[list[str], list[tuple[str, int]]]:
    engine = Engine()
    engine.register(PROGRAM)
    for line, event in enumerate(EVENTS):
        engine.feed(event, line=line, position=line)
    engine.close()
    matches = sorted(m["match_id"] for m in engine.drain() if m["kind"] == "query")
    return matches, [(d["reason"], d["line"]) for d in engine.dead_letters()]


@pytest.mark.slow
def test_a_late_event_is_dead_lettered_not_searched_as_in_the_embedded_engine(spark):
    rows = [(line, json.dumps(event)) for line, event in enumerate(EVENTS)]
    # One task reads the rows in input order, as the embedded engine does.
    events = spark.createDataFrame(rows, "_seq long, _event string").coalesce(1)
    out = [row.asDict() for row in query_outputs(events, PROGRAM).collect()]
    matches = sorted(r["match_id"] for r in out if r["kind"] == "query")
    letters = [(r["name"], json.loads(r["payload"])["line"]) for r in out
               if r["kind"] == "dead_letter"]
    expected_matches, expected_letters = _embedded()
    assert expected_letters == [("late", 2)] and len(expected_matches) == 3
    assert letters == expected_letters
    assert matches == expected_matches
    (late,) = [json.loads(r["payload"]) for r in out if r["kind"] == "dead_letter"]
    assert "behind the watermark 1970-01-01T00:00:18.000Z" in late["detail"]
