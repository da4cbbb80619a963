"""`vigil run` on Spark (its default for files) end to end over the examples: Spark's rule,
query and metric rows are the embedded engine's, and the planted situations are found."""

from __future__ import annotations

import glob
import json
import math

import pytest

from cep.cli import main
from cep.cli.sample import write_sample

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
    assert main(["run", "examples/", "--events", str(events), "--out", str(embedded),
                 "--engine", "embedded", "--no-alerts"]) == 0
    spark_out = tmp_path / "spark"
    code = main(["run", "examples/", "--events", str(events), "--master", "local[2]",
                 "--out", str(spark_out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "micro-batch" in err
    spark = _read(sorted(glob.glob(str(spark_out / "*.jsonl"))))
    local = _read([embedded])
    # the input ends with the end-of-input mark, so Spark reports exactly what the embedded
    # engine reports, flush at end of input included
    for kind in ("rule", "query", "metric"):
        got = {m["match_id"]: m for m in spark if m["kind"] == kind}
        want = {m["match_id"]: m for m in local if m["kind"] == kind}
        assert got and set(got) == set(want), kind
        for match_id, row in got.items():
            _assert_same_row(row, want[match_id])
    for name in ("card_testing", "account_takeover", "brute_force_success",
                 "impossible_travel", "stolen_card_use", "unpaid_order"):
        keys = {str(v) for m in spark if m["name"] == name for v in m["key"].values()}
        assert set(getattr(planted, name)) <= keys, name
    assert f"spark: {sum(1 for f in glob.glob(str(events / 'part-*')) for _ in open(f)):,} " \
        "event(s)" in err


def _assert_same_row(a: dict, b: dict) -> None:
    """Equal rows; sums of floats may differ in their last bits (order of the additions)."""
    if a.get("kind") != "metric":
        assert a == b
        return
    assert {**a, "values": None} == {**b, "values": None}
    assert a["values"].keys() == b["values"].keys()
    for name, value in a["values"].items():
        other = b["values"][name]
        if isinstance(value, float):
            assert math.isclose(value, other, rel_tol=1e-12), (name, value, other)
        else:
            assert value == other, (name, value, other)


RULES = """
stream txn (card_id string, amount float, merchant string, ts timestamp) time ts lateness 5s
rule big_spend from txn by card_id pattern big define big as amount > 100
metric per_merchant from txn by merchant window tumbling 1m select count() as n
"""


def test_vigil_run_prints_spark_matches_to_stdout_by_default(tmp_path, capsys):
    rules = tmp_path / "r.vigil"
    rules.write_text(RULES)
    events = tmp_path / "e.jsonl"
    rows = [{"card_id": f"c{i % 3}", "amount": 50.0 + 40 * (i % 4), "merchant": f"m{i % 2}",
             "ts": f"2026-01-01T00:{i // 6:02d}:{(i * 10) % 60:02d}Z"} for i in range(60)]
    events.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    assert main(["run", str(rules), "--events", str(events), "--engine", "embedded"]) == 0
    local = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    code = main(["run", str(rules), "--events", str(events), "--master", "local[2]",
                 "--buckets", "4"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = [json.loads(line) for line in captured.out.splitlines()]
    assert "Spark (local[2])" in captured.err and "1 dead letter(s)" in captured.err
    assert "end of input, the watermark passes every event" in captured.err
    assert "big_spend: 30 match(es)" in captured.err
    # rules, metrics and the end of input: exactly the embedded engine's rows
    assert sorted(m["match_id"] for m in printed) == sorted(m["match_id"] for m in local)
    assert {m["kind"] for m in printed} == {"rule", "metric"}
