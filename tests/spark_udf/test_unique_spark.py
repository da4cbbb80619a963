"""A rule's ``unique`` on Spark: the values a key reported live in the key's state across
micro-batches, so ``run_spark`` reports the matches the embedded engine reports, and no more."""

from __future__ import annotations

import json
import random

import pytest
from spark_support import run_both

PROGRAM = """
stream proc (pid string, host string, name string, parent string, ts timestamp)
  time ts unit ms lateness 10s id pid

rule first_start from proc by host
  pattern a
  define a as name != "x"
  emit lower(a.name) as name
  unique lower(a.name)

rule pair_daily from proc by host
  pattern a b within 30s
  define a as name != "x", b as true
  emit a.parent as parent, b.name as child
  unique a.parent, b.name for 2m

rule quiet_once from proc
  pattern a !c within 20s
  define a as name == "a.exe", c as name == "x"
  unique a.host
"""
BASE_MS = 1_767_225_600_000


def _events(n: int, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ts = BASE_MS + i * 2_000
        row = {"pid": f"e{i}", "host": f"h{rng.randrange(6)}",
               "name": rng.choice(["a.exe", "A.EXE", "b.exe", "c.exe", "x"]),
               "parent": rng.choice(["p1", "p2", "p3"]), "ts": ts}
        rows.append((ts + rng.randrange(8_000), i, row))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in rows]


@pytest.mark.slow
def test_run_spark_with_unique_equals_the_embedded_engine(spark, tmp_path) -> None:
    engine, got, _ = run_both(spark, tmp_path, PROGRAM, _events(300), "unique.vigil")
    expected = engine.drain()
    held = engine.stats.suppressed
    assert {m["name"] for m in expected} == {"first_start", "pair_daily", "quiet_once"}
    # Each rule held back some matches, so the comparison covers the filter's state.
    assert set(held) == {"first_start", "pair_daily", "quiet_once"}, held
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
