"""Tables on Spark: changelog rows route by the table's key into the buckets of the rules'
keys (or, for a table looked up by another key, into every bucket), each bucket keeps its keys'
rows as of each event time beside their state, and ``run_spark`` reports what the embedded
engine reports (matches and dead letters) over several micro-batches of changes and events out
of order within the lateness."""

from __future__ import annotations

import json
import random

import pytest
from spark_support import embedded, run_both

from spark_udf.errors import OperatorConfigError
from spark_udf.rules import detect_specs, processor_specs

PROGRAM = """
stream card_changes (card_id string, home string, limit float, op string, ts timestamp)
  time ts unit ms lateness 20s
stream payments (card_id string, merchant string, country string, amount float, ts timestamp)
  time ts unit ms lateness 20s
stream merchant_changes (merchant string, watched bool, op string, ts timestamp)
  time ts unit ms lateness 20s
table cards from card_changes key card_id op op
table merchants from merchant_changes key merchant op op

rule watched from payments by card_id
  pattern a
  define a as lookup(merchants, merchant).watched == true and amount > 100
  emit card_id, merchant

rule abroad from payments by card_id
  pattern a
  define a as amount > 100 and country != lookup(cards, card_id).home
  emit card_id, country, lookup(cards, card_id).home as home

rule over_limit from payments by card_id
  pattern a !b within 1m
  define a as amount > lookup(cards, card_id).limit, b as amount < 1
  emit card_id, lookup(cards, card_id).limit as lim
"""
METRICS = """
metric abroad_spend from payments by card_id window tumbling 1m
  select count() as n, sum(amount) as total, max(lookup(cards, card_id).limit) as lim
  where country != lookup(cards, card_id).home

metric watched_spend from payments by country window tumbling 1m
  select count() as n, sum(amount) as total
  where lookup(merchants, merchant).watched == true
"""
BASE_MS = 1_767_225_600_000


def _events(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ts = BASE_MS + i * 1_000
        card = f"c{rng.randrange(12)}"
        if rng.random() < 0.1:
            row = {"stream": "merchant_changes", "merchant": f"m{rng.randrange(5)}",
                   "watched": rng.random() < 0.5, "op": rng.choice(["u", "u", "d", "?"]),
                   "ts": ts}
        elif rng.random() < 0.35:
            op = rng.choice(["c", "u", "u", "d", "zz"])
            row = {"stream": "card_changes", "card_id": card, "home": rng.choice(["FR", "DE"]),
                   "limit": rng.choice([150.0, 400.0, None]), "op": op, "ts": ts}
            if rng.random() < 0.05:
                del row["card_id"]
        else:
            row = {"stream": "payments", "card_id": card, "merchant": f"m{rng.randrange(5)}",
                   "country": rng.choice(["FR", "DE"]),
                   "amount": rng.choice([0.5, 50.0, 200.0, 500.0]), "ts": ts}
        rows.append((ts + rng.randrange(15_000), i, row))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in rows]


@pytest.mark.slow
def test_run_spark_with_a_table_equals_the_embedded_engine(spark, tmp_path) -> None:
    engine, got, dead = run_both(spark, tmp_path, PROGRAM + METRICS, _events(400), "cards.vigil")
    expected = engine.drain()
    assert {m["name"] for m in expected} == {
        "abroad", "over_limit", "watched", "abroad_spend", "watched_spend"
    }
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    letters = engine.drain_dead_letters()
    assert {d["reason"] for d in letters} >= {"unknown_op", "missing_key"}
    assert sorted((d["reason"], d.get("detail")) for d in dead) == sorted(
        (d["reason"], d.get("detail")) for d in letters
    )


def test_a_table_read_by_another_key_reaches_every_bucket() -> None:
    specs, _ = processor_specs(PROGRAM)
    (spec,) = specs
    assert spec.key_cols == {"card_changes": ("card_id",), "merchant_changes": ("merchant",),
                             "payments": ("card_id",)}
    assert sorted(feed.name for feed in spec.processor.tables.feeds()) == ["cards", "merchants"]
    assert spec.broadcast == frozenset({"merchant_changes"})


def test_a_metric_keeps_the_tables_it_reads_by_its_groups_or_whole() -> None:
    specs, _ = processor_specs(PROGRAM + METRICS)
    by_name = {spec.rules: spec for spec in specs}
    abroad = by_name[("abroad_spend",)]
    assert [feed.name for feed in abroad.processor.tables.feeds()] == ["cards"]
    assert abroad.broadcast == frozenset()  # looked up by its own group: partitioned
    assert abroad.key_cols == {"card_changes": ("card_id",), "payments": ("card_id",)}
    watched = by_name[("watched_spend",)]
    assert [feed.name for feed in watched.processor.tables.feeds()] == ["merchants"]
    assert watched.broadcast == frozenset({"merchant_changes"})


def test_rules_reading_a_broadcast_changelog_as_events_are_refused() -> None:
    program = PROGRAM + """
rule merchant_flap from merchant_changes by card_id pattern a
  define a as lookup(merchants, merchant).watched == true
"""
    program = program.replace("stream merchant_changes (merchant string,",
                              "stream merchant_changes (card_id string, merchant string,")
    with pytest.raises(OperatorConfigError, match="read stream 'merchant_changes' as events and "
                       "look up a table it feeds by another key"):
        processor_specs(program)


def test_the_per_key_layout_refuses_tables_before_any_spark_work(spark) -> None:
    specs, _ = processor_specs(PROGRAM)
    frame = spark.createDataFrame([('{"stream": "payments"}',)], "_event string")
    with pytest.raises(OperatorConfigError, match="rules watched, abroad, over_limit look up "
                       "tables, which live in the buckets of the bucketed layout"):
        detect_specs(frame, specs, layout="per_key")


@pytest.mark.slow
def test_detect_over_a_static_frame_reads_the_tables_as_the_embedded_engine(spark) -> None:
    """A batch DataFrame holds the whole input: its changes go into the tables before any key
    runs, and each lookup reads them as of its event's time (a table looked up by the rules'
    own key; one read by another key is refused there)."""
    from spark_udf import detect

    program = PROGRAM.split("rule watched")[0] + "rule abroad" + \
        PROGRAM.split("rule abroad")[1] + METRICS.split("metric watched_spend")[0]
    sample = _events(300, seed=11)
    engine = embedded(program, sample)
    expected = engine.drain()
    assert {m["name"] for m in expected} == {"abroad", "over_limit", "abroad_spend"}
    frame = spark.createDataFrame(
        [(i, json.dumps(e)) for i, e in enumerate(sample)], "_seq long, value string"
    )
    rows = detect(frame, program, buckets=4).collect()
    got = [json.loads(r.payload) for r in rows if r.kind in ("rule", "metric")]
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    # A bad change is reported by each processor keeping the table (the rules', the metric's):
    # the same letter, which run_spark's sink writes once.
    letters = {r.match_id: json.loads(r.payload) for r in rows if r.kind == "dead_letter"}
    assert sorted((d["reason"], d["stream"]) for d in letters.values()) == sorted(
        (d["reason"], d["stream"]) for d in engine.drain_dead_letters()
        if d["stream"] == "card_changes"  # the embedded engine keeps the unread table too
    )
