"""Rules whose steps have their own ``by`` (EQL's per-step join keys) on Spark: an event
belongs to several keys (a process is a parent under its pid, a child under its parent's), so
rows are routed by the rule's own ``by`` alone and each bucket splits them by their keys.
Routed by the whole key, a child never reached its parent's key: no match, silently. A step's
key may be an expression of its event's fields (``by pid * 2``)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from spark_support import embedded, ids, run_both

from spark_udf.errors import OperatorConfigError
from spark_udf.rules import detect_specs, processor_specs
from spark_udf.sources import read_jsonl

PROGRAM = """
stream proc (host string, pid int, ppid int, name string, ts timestamp) time ts lateness 5s

rule shell_spawns_ps from proc by host
  pattern parent child
  define parent as name == "bash" by pid,
         child  as name == "ps" by ppid
  within 30s

rule doubled_key from proc by host
  pattern parent child
  define parent as name == "sh" by pid * 2,
         child  as name == "ls" by ppid * 2
  within 30s

rule any_host_child from proc
  pattern parent child+
  contiguity any for child
  define parent as name == "ls" by pid,
         child  as name != "ls" by ppid
  within 20s
"""


def _processes(n: int, seed: int = 7) -> list[dict]:
    """Processes on two hosts, each one's parent one of the 15 before it (or one that never ran);
    times disordered within the lateness; a few rows of a wrong type."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        parent = 100 + rng.randrange(max(0, i - 15), max(1, i)) if rng.random() < 0.9 else 7
        event = {"stream": "proc", "host": f"h{rng.randrange(2)}", "pid": 100 + i, "ppid": parent,
                 "name": rng.choice(["bash", "ps", "ls", "sh"]),
                 "ts": 1_767_225_600 + i - rng.randint(0, 3)}
        if i % 97 == 50:
            event["pid"] = "not a number"
        out.append(event)
    return out


@pytest.mark.slow
def test_run_spark_equals_the_embedded_engine(spark, tmp_path) -> None:
    engine, got, dead = run_both(spark, tmp_path, PROGRAM, _processes(400))
    expected = engine.drain()
    by_rule = Counter(m["name"] for m in expected)
    assert min(by_rule[r] for r in ("shell_spawns_ps", "doubled_key", "any_host_child")) > 5
    assert ids(got) == ids(expected)
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    # A bad row is reported once, not once per key it would have had.
    reasons = sorted(d["reason"] for d in engine.drain_dead_letters())
    assert reasons == ["wrong_type"] * 4
    assert sorted(d["reason"] for d in dead) == reasons


def test_rows_route_by_the_rules_own_by_alone() -> None:
    specs, _ = processor_specs(PROGRAM)
    routed = {spec.rules: spec.key_cols for spec in specs}
    assert routed == {("shell_spawns_ps",): {"proc": ("host",)},
                      ("doubled_key",): {"proc": ("host",)},
                      ("any_host_child",): {"proc": ()}}


@pytest.mark.slow
def test_static_detect_equals_the_embedded_engine(spark, tmp_path) -> None:
    sample = [dict(e, _seq=i) for i, e in enumerate(_processes(200, seed=3))]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in sample), encoding="utf-8")
    (tmp_path / "p.vigil").write_text(PROGRAM, encoding="utf-8")
    specs, _ = processor_specs(str(tmp_path / "p.vigil"))
    frame = read_jsonl(spark, str(path), streaming=False)
    got = [r.asDict() for r in detect_specs(frame, specs).collect()]
    engine = embedded(PROGRAM, sample)
    expected = engine.drain()
    assert len(expected) > 3
    # Each processor reports a bad row; the sinks keep one row per dead letter's id.
    dead = {r["match_id"] for r in got if r["kind"] == "dead_letter"}
    assert len(dead) == len(engine.drain_dead_letters()) == 2
    assert {r["name"] for r in got if r["kind"] == "rule"} >= {"shell_spawns_ps", "doubled_key"}
    assert Counter(r["match_id"] for r in got if r["kind"] == "rule") == Counter(
        m["match_id"] for m in expected
    )


def test_the_per_key_layout_refuses_a_rule_whose_events_have_several_keys(spark,
                                                                         tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(_processes(1)[0]) + "\n", encoding="utf-8")
    specs, _ = processor_specs(PROGRAM)
    frame = read_jsonl(spark, str(path), streaming=True)
    with pytest.raises(OperatorConfigError, match="several keys"):
        detect_specs(frame, specs[:1], layout="per_key")
