"""`vigil run --engine spark` end to end over the examples: Spark's rule matches are the
embedded engine's, the planted situations are found, queries and metrics are reported too."""

from __future__ import annotations

import glob
import json

import pytest

from cep.cli import main
from cep.sample import write_sample

pytestmark = pytest.mark.slow


def _read(paths):
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            out.extend(json.loads(line) for line in fh if line.strip())
    return out


def test_vigil_run_on_spark_matches_the_embedded_engine(tmp_path, capsys):
    events = tmp_path / "events"
    planted = write_sample(str(events), 1500, seed=5, files=2)
    embedded = tmp_path / "embedded.jsonl"
    assert main(["run", "examples/", "--events", str(events), "--out", str(embedded)]) == 0
    spark_out = tmp_path / "spark"
    code = main(["run", "examples/", "--events", str(events), "--engine", "spark",
                 "--master", "local[2]", "--out", str(spark_out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "micro-batch" in err
    spark = _read(sorted(glob.glob(str(spark_out / "*.jsonl"))))
    local = _read([embedded])
    spark_rules = {m["match_id"]: m for m in spark if m["kind"] == "rule"}
    local_rules = {m["match_id"]: m for m in local if m["kind"] == "rule"}
    # identical match objects; the embedded run also flushes at end of input (matches still
    # waiting for a greedy quantifier to stop growing), which a stream never reaches
    assert spark_rules and set(spark_rules) <= set(local_rules)
    for match_id, match in spark_rules.items():
        assert match == local_rules[match_id]
    for name in ("card_testing", "account_takeover", "brute_force_success",
                 "impossible_travel", "stolen_card_use", "unpaid_order"):
        keys = {str(v) for m in spark_rules.values() if m["name"] == name
                for v in m["key"].values()}
        assert set(getattr(planted, name)) <= keys, name
    # queries run inside Spark (in the micro-batch files), metrics in the embedded engine
    # (standing.jsonl); both give the embedded engine's match objects
    batches = _read(sorted(glob.glob(str(spark_out / "part-*.jsonl"))))
    spark_queries = {m["match_id"]: m for m in batches if m["kind"] == "query"}
    local_queries = {m["match_id"]: m for m in local if m["kind"] == "query"}
    assert spark_queries and spark_queries == local_queries
    metrics = _read([spark_out / "standing.jsonl"])
    assert {m["kind"] for m in metrics} == {"metric"}
    assert sorted(m["match_id"] for m in metrics) == sorted(
        m["match_id"] for m in local if m["kind"] == "metric")
    assert f"spark: {sum(1 for f in glob.glob(str(events / 'part-*')) for _ in open(f)):,} " \
        "event(s)" in err
