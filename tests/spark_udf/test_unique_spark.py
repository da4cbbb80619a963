"""A rule's ``unique`` on Spark: the values a key reported live in the key's state across
micro-batches, so ``run_spark`` reports the matches the embedded engine reports, and no more;
and ``having``, which filters a rule's matches in the same processor."""

from __future__ import annotations

import json
import random

import pytest
from spark_support import embedded, run_both_summary

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

rule same_parent from proc by host
  pattern a b within 30s
  define a as name != "x", b as name != "x"
  emit a.pid as first, b.pid as second
  having b.parent == a.parent
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
    engine, got, _, summary = run_both_summary(spark, tmp_path, PROGRAM, _events(300),
                                               "unique.vigil")
    expected = engine.drain()
    held = engine.stats.suppressed
    assert {m["name"] for m in expected} == {"first_start", "pair_daily", "quiet_once",
                                             "same_parent"}
    # Each rule held back some matches, so the comparison covers the filter's state.
    assert set(held) == {"first_start", "pair_daily", "quiet_once"}, held
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    # and the run's summary counts what each rule held back, as the embedded engine does
    assert dict(summary.held) == dict(held)


@pytest.mark.slow
def test_vigil_run_on_spark_says_what_unique_held_back_as_the_embedded_engine(
    spark, tmp_path, capsys
) -> None:
    from cep.cli import main

    rules = tmp_path / "unique.vigil"
    rules.write_text(PROGRAM)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in _events(150, seed=3)))

    def held_lines(argv: list[str]) -> list[str]:
        assert main(["run", str(rules), "--events", str(events), *argv]) == 0
        err = capsys.readouterr().err
        return sorted(line.strip() for line in err.splitlines() if "held back" in line)

    embedded = held_lines(["--engine", "embedded", "--no-alerts",
                           "--out", str(tmp_path / "e.jsonl")])
    assert len(embedded) == 3, embedded  # every rule held some back
    assert held_lines(["--master", "local[2]", "--out", str(tmp_path / "spark")]) == embedded


@pytest.mark.slow
def test_detect_over_a_static_frame_gives_the_matches_and_no_counts(spark) -> None:
    from spark_udf import detect

    sample = _events(120, seed=5)
    engine = embedded(PROGRAM, sample)
    assert engine.stats.suppressed  # something was held back
    frame = spark.createDataFrame([(json.dumps(e),) for e in sample], "value string")
    rows = detect(frame, PROGRAM, buckets=4).collect()
    assert {r.kind for r in rows} == {"rule"}  # the held-back counts stay inside run_spark
    assert sorted(r.match_id for r in rows) == sorted(m["match_id"] for m in engine.drain())
