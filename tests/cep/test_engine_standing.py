"""Queries and metrics registered on the embedded engine next to rules."""

from __future__ import annotations

import pandas as pd

from cep import Engine

PROGRAM = """
stream news (id string, title text, source string, views int, ts timestamp) time ts lateness 1m
stream txn (card_id string, amount float, merchant string, ts timestamp) time ts lateness 1m
query acme from news match title:acme AND NOT source:tabloid AND views >= 10
metric spend from txn by merchant window tumbling 1m
  select count() as n, sum(amount) as total, approx_distinct(card_id) as cards
rule big from txn by card_id pattern b define b as amount > 100
"""
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, seconds


def test_queries_metrics_and_rules_run_together():
    engine = Engine()
    assert engine.register(PROGRAM) == ["big", "acme", "spend"]
    engine.feed({"stream": "news", "id": "d1", "title": "ACME merger", "source": "wire",
                 "views": 50, "ts": T0})
    engine.feed({"stream": "news", "id": "d2", "title": "ACME gossip", "source": "tabloid",
                 "views": 50, "ts": T0 + 1})
    frame = pd.DataFrame({
        "stream": "txn",
        "card_id": ["a", "b", "a", "c"],
        "amount": [5.0, 200.0, 7.0, 1.0],
        "merchant": ["m1", "m1", "m1", "m2"],
        "ts": [T0 + 2, T0 + 3, T0 + 4, T0 + 65],
    })
    engine.feed_batch(frame)
    engine.close()
    out = engine.drain()
    queries = [m for m in out if m["kind"] == "query"]
    assert [(m["name"], m["document_id"]) for m in queries] == [("acme", "d1")]
    assert queries[0]["highlights"] == {"title": [[0, 4]]}
    metrics = sorted((m["key"]["merchant"], m["window"]["start"], m["values"]["n"],
                      m["values"]["total"], m["values"]["cards"]) for m in out
                     if m["kind"] == "metric")
    assert metrics == [
        ("m1", "2026-01-01T00:00:00.000Z", 3, 212.0, 2),
        ("m2", "2026-01-01T00:01:00.000Z", 1, 1.0, 1),
    ]
    assert [m["key"] for m in out if m["kind"] == "rule"] == [{"card_id": "b"}]
    assert engine.stats.matches == {"big": 1, "acme": 1, "spend": 2}


def test_metric_window_waits_for_the_watermark_and_late_event_corrects_it():
    engine = Engine()
    engine.register(PROGRAM)
    engine.feed({"stream": "txn", "card_id": "a", "amount": 1.0, "merchant": "m", "ts": T0})
    assert engine.drain() == []  # the minute is still open
    # 2.5 minutes later the watermark (max ts - 1m lateness) is past the window's end; the
    # fired window stays retained for one more lateness (until 00:02:00)
    engine.feed({"stream": "txn", "card_id": "b", "amount": 2.0, "merchant": "m",
                 "ts": T0 + 150})
    (first,) = [m for m in engine.drain() if m["kind"] == "metric"]
    assert first["final"] and not first["correction"] and first["values"]["n"] == 1
    # an event behind the watermark whose window is still retained: a correction...
    engine.feed({"stream": "txn", "card_id": "c", "amount": 4.0, "merchant": "m",
                 "ts": T0 + 30})
    (fix,) = [m for m in engine.drain() if m["kind"] == "metric"]
    assert fix["correction"] and fix["revision"] == 1 and fix["values"]["n"] == 2
    assert fix["match_id"] != first["match_id"]
    # ...and, for rules, it is still late: counted and dead-lettered
    assert engine.stats.late == 1
    assert engine.drain_dead_letters()[0]["reason"] == "late"
    # past the retention the event is only a dead letter
    engine.feed({"stream": "txn", "card_id": "d", "amount": 8.0, "merchant": "m",
                 "ts": T0 + 400})
    engine.drain()
    engine.feed({"stream": "txn", "card_id": "e", "amount": 8.0, "merchant": "m",
                 "ts": T0 + 10})
    assert [m for m in engine.drain() if m.get("correction")] == []
    assert engine.stats.late == 2


def test_a_batch_gives_late_rows_to_the_metrics_where_feeding_row_by_row_would():
    # The rows of the test above (a window fired, a correction, a window forgotten) with
    # on-time rows around them, in one frame: the same metric rows, ids and dead letters.
    rows = [("a", 1.0, 0), ("b", 2.0, 150), ("c", 4.0, 30), ("x", 1.0, 160), ("y", 1.0, 20),
            ("d", 8.0, 400), ("e", 8.0, 10), ("z", 3.0, 401)]
    frame = pd.DataFrame({
        "stream": "txn", "card_id": [r[0] for r in rows], "amount": [r[1] for r in rows],
        "merchant": "m", "ts": [T0 + r[2] for r in rows],
    })
    one_by_one, batch = Engine(), Engine()
    for engine in (one_by_one, batch):
        engine.register(PROGRAM)
    for record in frame.to_dict("records"):
        one_by_one.feed(record)
    batch.feed_batch(frame)
    results = []
    for engine in (one_by_one, batch):
        engine.close()
        metrics = [m for m in engine.drain() if m["kind"] == "metric"]
        letters = [(d["reason"], d["detail"]) for d in engine.dead_letters()]
        rows_out = sorted((m["match_id"], m["correction"], m["values"]["n"]) for m in metrics)
        results.append((rows_out, letters, engine.stats.late))
    assert results[0] == results[1]
    metrics, letters, late = results[0]
    assert late == 3 and [reason for reason, _ in letters] == ["late"] * 3
    # the first minute: 1 event, corrected to 2 by "c" (30 s); "y" (20 s) finds the window
    # still retained (watermark 100 s) and corrects it to 3; "e" (10 s) comes after it is gone
    assert sorted((c, n) for _, c, n in metrics if c) == [(True, 2), (True, 3)]


def test_unregister_a_query_keeps_the_others():
    engine = Engine()
    engine.register(PROGRAM)
    engine.unregister("acme")
    assert engine.standing == ["spend"]
    engine.feed({"stream": "news", "id": "d1", "title": "ACME", "source": "wire", "views": 50,
                 "ts": T0})
    engine.close()
    assert [m for m in engine.drain() if m["kind"] == "query"] == []


def test_a_programs_queries_are_indexed_as_one_segment_and_later_ones_live():
    queries = "\n".join(
        f"query q{i} from news match title:w{i} AND views >= {i}" for i in range(300)
    )
    engine = Engine()
    engine.register(PROGRAM + queries)
    assert engine._standing._percolators == {}  # nothing indexed before a document needs it
    index = engine._standing.index("news")
    stats = index.stats()
    # One segment for the 301 queries registered together (not the log of segments adding them
    # one by one leaves, each probed for every document), nothing in the live delta.
    assert (stats.queries, stats.segments, stats.delta) == (301, 1, 0)
    engine.register("query late from news match title:w7")
    assert engine._standing.index("news") is index
    assert (index.stats().segments, index.stats().delta) == (1, 1)
    engine.feed({"stream": "news", "id": "d1", "title": "w7 acme", "source": "wire",
                 "views": 50, "ts": T0})
    engine.close()
    found = sorted(m["name"] for m in engine.drain() if m["kind"] == "query")
    assert found == ["acme", "late", "q7"]
