"""Events with ``json`` fields on Spark: members and the elements of json lists read in rule
conditions, emits and metrics, with partial matches (and their nested events) kept in the keys'
state between micro-batches: ``run_spark`` reports what the embedded engine reports."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from spark_support import embedded, run_both

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "query_lang"))
from test_json_fields import PROGRAM  # noqa: E402


def _events(n: int, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        items = [{"sku": rng.choice(["s1", "s2", "s3"]), "qty": rng.randrange(4),
                  "note": rng.choice([None, {"gift": True}, ["x"]])}
                 for _ in range(rng.randrange(3))]
        payload = {"kind": rng.choice(["view", "buy"]), "sku": rng.choice(["s1", "s2", "s3"]),
                   "basket": {"user": rng.choice(["u1", "u2"]), "items": items}}
        rows.append({"id": f"e{i}", "user": rng.choice(["ann", "bob", "cy"]), "n": i, "tags": [],
                     "ts": 1_767_225_600 + i * 3,
                     "payload": rng.choice([payload, payload, payload, None, "text"])})
    return rows


@pytest.mark.slow
def test_run_spark_over_json_fields_equals_the_embedded_engine(spark, tmp_path) -> None:
    engine, got, dead = run_both(spark, tmp_path, PROGRAM, _events(300), "json.vigil")
    expected = engine.drain()
    assert not dead
    assert {m["name"] for m in expected} == {"same_user_basket", "u1_buys", "big_baskets"}
    assert sum(m["name"] == "same_user_basket" for m in expected) > 5
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )


@pytest.mark.slow
def test_detect_over_struct_columns_equals_the_embedded_engine(spark) -> None:
    # A user's frame with typed columns: json fields as Spark structs and arrays of structs,
    # which reach the operator as Arrow cells (dicts holding numpy arrays).
    from spark_udf import detect

    sample = [e for e in _events(200, seed=8) if isinstance(e["payload"], dict)]
    for e in sample:
        for item in e["payload"]["basket"]["items"]:
            item.pop("note")  # (a value of several types has no Spark type)
    schema = ("id string, user string, n long, tags array<string>, payload struct<kind: string, "
              "sku: string, basket: struct<user: string, items: array<struct<sku: string, "
              "qty: long>>>>, ts long")
    frame = spark.createDataFrame(sample, schema)
    rows = detect(frame, PROGRAM, buckets=4).collect()
    expected = embedded(PROGRAM, sample).drain()
    assert {m["name"] for m in expected} == {"same_user_basket", "u1_buys", "big_baskets"}
    assert sorted(r.match_id for r in rows if r.kind != "dead_letter") == sorted(
        m["match_id"] for m in expected)
