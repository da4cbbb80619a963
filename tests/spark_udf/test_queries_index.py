"""The query index on Spark's Python workers: built once per worker, rebuilt when the queries
change (no JVM needed)."""

from __future__ import annotations

import gc
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spark_support import BAD_ROWS

from cep.engine.engine import Engine
from cep.events.event import BadEventError, parse_json_line
from spark_udf import queries


@pytest.fixture(autouse=True)
def _collectable_again():
    # Building an index freezes what the process holds (as a Spark worker wants); the rest of
    # the test session keeps a normal collector.
    yield
    gc.unfreeze()

PROGRAM = """
stream news (id string, title text, ts timestamp) time ts
query acme from news match title:acme
"""


def test_a_worker_builds_the_index_once_per_set_of_queries():
    decls, streams = queries._queries(PROGRAM)
    first, schemas = queries._index("v1", decls, streams)
    again, _ = queries._index("v1", decls, streams)
    assert again is first and set(schemas) == {"news"}
    changed_decls, changed_streams = queries._queries(PROGRAM.replace("acme", "globex"))
    changed, _ = queries._index("v2", changed_decls, changed_streams)
    assert changed is not first and list(queries._INDEXES) == ["v2"]
    assert changed.names == ["globex"] and first.names == ["acme"]
    assert gc.get_freeze_count() > 0  # the worker's index is out of the collector's way


MIXED = """
stream news (id string, title text, ts timestamp) time ts
stream posts (id string, body text, ts timestamp) time ts
query acme from news match title:acme
query acme_posts from posts match body:acme OR body:globex
query layoffs from news, posts match layoff*
"""


def test_a_worker_matches_interleaved_streams_in_event_order_as_one_event_at_a_time():
    decls, streams = queries._queries(MIXED)
    standing, schemas = queries._index("mixed", decls, streams)
    rows = [
        ("news", {"id": "n1", "title": "ACME layoffs", "ts": 1}),
        ("news", {"id": "n2", "title": "nothing here", "ts": 2}),
        ("posts", {"id": "p1", "body": "globex and acme", "ts": 3}),
        ("news", {"id": "n3", "title": "acme again", "ts": 4}),
        ("posts", {"id": "p2", "body": "layoffs at globex", "ts": 5}),
        ("posts", {"id": "p3", "body": "quiet", "ts": 6}),
    ]
    events = [
        schemas[name].normalise({"stream": name, **fields}, seq=i, position=i)
        for i, (name, fields) in enumerate(rows)
    ]
    batched = standing.match_events(events)
    one_by_one = [(event, match) for event in events for match in standing.accept(event)]
    assert [(e.id, m["name"]) for e, m in batched] == [
        ("n1", "acme"), ("n1", "layoffs"), ("p1", "acme_posts"), ("n3", "acme"),
        ("p2", "acme_posts"), ("p2", "layoffs"),
    ]
    assert [(e.id, m) for e, m in batched] == [(e.id, m) for e, m in one_by_one]
    assert batched[1][1]["highlights"] == {"title": [[5, 12]]}
    assert standing.match_events([]) == []


CHECKED = """
stream news (id string, title text, views int, ts timestamp) time ts
stream txn (card_id string, amount float, ts timestamp) time ts
query acme from news match title:acme
rule big from txn by card_id pattern b define b as amount > 100
"""
# The bad rows of a file, a row that is JSON but no object, the source's end-of-input mark.
ROWS = [*BAD_ROWS, '["an", "array"]', '{"stream": "_vigil_end"}']


def _frame_letters(program: str, checked: frozenset[str]) -> tuple[list, list]:
    decls, streams = queries._queries(program)
    standing, schemas = queries._index(program, decls, streams)
    frame = pd.DataFrame({"_seq": range(len(ROWS)), "_event": ROWS})
    rows = queries.frame_outputs(frame, standing, schemas, checked=checked)
    letters = [json.loads(r["payload"]) for r in rows if r["kind"] == "dead_letter"]
    matches = [(json.loads(r["payload"])["document_id"], r["start_ms"]) for r in rows
               if r["kind"] == "query"]
    return [(d["reason"], d["line"]) for d in letters], matches


def test_a_worker_dead_letters_the_rows_no_keyed_operator_checks():
    # The rule operator checks txn (and reports rows that are not JSON objects): the worker
    # reports the rest, so that together they lose no bad row.
    letters, matches = _frame_letters(CHECKED, frozenset({"txn"}))
    assert letters == [("wrong_type", 1), ("unknown_stream", 4), ("no_stream", 5)]
    assert matches == [("d1", 1767225600000)]
    # Alone (a program of queries only), it reports every bad row, as the embedded engine.
    alone, _ = _frame_letters(CHECKED, frozenset())
    assert alone == [
        ("wrong_type", 1), ("invalid_json", 2), ("wrong_type", 3), ("unknown_stream", 4),
        ("no_stream", 5), ("not_an_object", 7),
    ]


# CHECKED with a query on the stream the rule operator checks as well.
BOTH = CHECKED + "query cheap from txn match amount < 5\n"
# Row shapes of a JSON-lines input for its two streams, good and bad.
SHAPES = [
    '{{"stream": "news", "id": "n{i}", "title": "acme {i}", "views": {i}, "ts": {ts}}}',
    '{{"stream": "news", "id": "n{i}", "title": "nothing", "ts": {ts}}}',
    '{{"stream": "news", "id": "n{i}", "title": "acme", "views": "many", "ts": {ts}}}',
    '{{"stream": "news", "id": "n{i}", "title": ["acme"], "ts": {ts}}}',
    '{{"stream": "txn", "card_id": "c{i}", "amount": {i}.5, "ts": {ts}}}',
    '{{"stream": "txn", "card_id": "c{i}", "amount": "x", "ts": {ts}}}',
    '{{"stream": "txn", "amount": 3.0, "ts": "not a time"}}',
    '{{"stream": "wire", "id": "w{i}", "ts": {ts}}}',
    '{{"stream": 7, "ts": {ts}}}',
    '{{"id": "x{i}", "title": "acme", "ts": {ts}}}',
    "not json {i}",
    "[{i}]",
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(SHAPES) - 1), max_size=40), st.booleans())
def test_a_worker_reports_what_the_embedded_engine_does_minus_the_operators_part(shapes, rules):
    rows = [SHAPES[s].format(i=i, ts=1_767_225_600 + i) for i, s in enumerate(shapes)]
    checked = frozenset({"txn"}) if rules else frozenset()
    decls, streams = queries._queries(BOTH)
    standing, schemas = queries._index(BOTH, decls, streams)
    frame = pd.DataFrame({"_seq": range(len(rows)), "_event": rows})
    out = queries.frame_outputs(frame, standing, schemas, checked=checked)
    got = [(r["name"], json.loads(r["payload"])["line"]) for r in out
           if r["kind"] == "dead_letter"]

    engine = Engine()
    engine.register(BOTH)
    expected = []
    for line, text in enumerate(rows):
        try:
            raw = parse_json_line(text)
        except BadEventError as exc:
            if not checked:  # the keyed operator reports rows that are not JSON objects
                expected.append((exc.reason, line))
            continue
        before = len(engine.dead_letters())
        engine.feed(raw, line=line, position=line)
        for letter in engine.dead_letters()[before:]:
            if raw.get("stream") not in checked:  # nor the bad events of its streams
                expected.append((letter["reason"], line))
    assert sorted(got) == sorted(expected)
    wanted = sorted(m["match_id"] for m in engine.drain() if m["kind"] == "query")
    assert sorted(r["match_id"] for r in out if r["kind"] == "query") == wanted
