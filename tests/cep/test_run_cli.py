"""End-to-end tests of ``vigil run`` on small files: matches, dead letters, stdin, stream
bindings, directories, progress, summary and exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from cep.cli import main

RULES = """
stream txn (card_id string, amount float, merchant string, ts timestamp) time ts lateness 30s

rule card_testing "Tiny probe charges, then a large purchase on the same card"
  from txn by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
  emit card_id, count(probe) as probes, big.amount as amount
"""

ORDERS = """
stream orders (order_id string, status string, amount float, ts timestamp) time ts lateness 5s
stream payments (order_id string, amount float, ts timestamp) time ts lateness 5s

rule unpaid_order
  from orders, payments
  by order_id
  pattern placed !paid
  define placed as orders where status == "placed",
         paid   as payments
  within 15m
  emit order_id, placed.amount as amount
"""

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def _txn_lines() -> list[str]:
    rows = [{"card_id": "c1", "amount": 0.5, "merchant": "m1", "ts": T0 + i} for i in range(3)]
    rows.append({"card_id": "c1", "amount": 900.0, "merchant": "m2", "ts": T0 + 60})
    lines = [json.dumps(r) for r in rows]
    lines.insert(1, "{broken")
    lines.insert(3, json.dumps({"card_id": "c2", "amount": "lots", "ts": T0 + 2}))
    lines.append(json.dumps({"card_id": "c3", "amount": 0.5, "merchant": "m", "ts": T0 - 600}))
    return lines


@pytest.fixture
def fraud(tmp_path):
    rules = tmp_path / "fraud.vigil"
    rules.write_text(RULES)
    events = tmp_path / "txn.jsonl"
    events.write_text("\n".join(_txn_lines()) + "\n")
    return tmp_path, rules, events


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_writes_matches_dead_letters_and_a_summary(fraud, capsys) -> None:
    tmp, rules, events = fraud
    out, dead = tmp / "matches.jsonl", tmp / "dead.jsonl"
    code = main(
        [
            "run",
            str(rules),
            "--events",
            str(events),
            "--out",
            str(out),
            "--dead-letter",
            str(dead),
            "--engine",
            "embedded",
        ]
    )
    assert code == 0
    [match] = _jsonl(out)
    assert match["name"] == "card_testing" and match["kind"] == "rule"
    assert match["values"] == {"card_id": "c1", "probes": 3, "amount": 900.0}
    assert match["events"] == {"probe": [0, 2, 4], "big": [5]}  # ids: line positions, from 0
    letters = _jsonl(dead)
    assert [(d["reason"], d["line"]) for d in letters] == [
        ("invalid_json", 2),
        ("wrong_type", 4),
        ("late", 7),
    ]
    assert all(d["input"] == str(events) for d in letters)
    assert letters[0]["raw"] == "{broken"
    assert letters[1]["detail"] == "field 'amount' expected float, got string \"lots\""
    err = capsys.readouterr().err
    assert "7 event(s)" in err and "1 match(es), 1 late, 2 bad" in err
    assert "card_testing: 1 match(es)" in err


def test_run_reads_stdin_and_writes_stdout(fraud, capsys, monkeypatch) -> None:
    _, rules, events = fraud
    monkeypatch.setattr(sys, "stdin", io.StringIO(events.read_text()))
    assert main(["run", str(rules), "--events", "-"]) == 0
    captured = capsys.readouterr()
    [match] = [json.loads(line) for line in captured.out.splitlines()]
    assert match["values"]["probes"] == 3
    assert "(use --dead-letter PATH" in captured.err
    assert "\r[" not in captured.err  # no progress bar for stdin


def test_run_binds_inputs_to_streams_and_interleaves_them_by_time(tmp_path, capsys) -> None:
    (tmp_path / "orders.vigil").write_text(ORDERS)
    orders = [
        {"order_id": "o1", "status": "placed", "amount": 10.0, "ts": T0},
        {"order_id": "o2", "status": "placed", "amount": 20.0, "ts": T0 + 60},
    ]
    # Payments are a separate file whose events come later than every order; read one input
    # after the other they would make no order late, but the reverse order would.
    payments = [
        {"order_id": "o1", "amount": 10.0, "ts": T0 + 300},
        {"order_id": "o9", "amount": 1.0, "ts": T0 + 4000},
    ]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in payments))
    (tmp_path / "o.jsonl").write_text("".join(json.dumps(r) + "\n" for r in orders))
    code = main(
        [
            "run",
            str(tmp_path / "orders.vigil"),
            "--events",
            f"payments={tmp_path / 'p.jsonl'}",
            "--events",
            f"orders={tmp_path / 'o.jsonl'}",
        ]
    )
    assert code == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(m["key"], m["values"]["amount"], m["end"]) for m in out] == [
        ({"order_id": "o2"}, 20.0, "2026-01-01T00:16:00.000Z")
    ]


def test_run_reads_a_directory_in_name_order_with_progress(fraud, capsys) -> None:
    tmp, rules, _ = fraud
    folder = tmp / "events"
    folder.mkdir()
    lines = [line for line in _txn_lines() if "broken" not in line and "lots" not in line]
    (folder / "b.jsonl").write_text("\n".join(lines[2:]) + "\n")
    (folder / "a.jsonl").write_text("\n".join(lines[:2]) + "\n")
    (folder / ".hidden").write_text("ignored\n")
    assert main(["run", str(rules), "--events", str(folder), "--progress",
                 "--engine", "embedded"]) == 0
    captured = capsys.readouterr()
    [match] = [json.loads(line) for line in captured.out.splitlines()]
    assert match["values"]["probes"] == 3
    assert "\r[" in captured.err and "100.0%" in captured.err


def test_run_exit_code_1_on_rule_errors(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.vigil"
    bad.write_text(RULES.replace("within 10m", "within 10 parsecs"))
    events = tmp_path / "e.jsonl"
    events.write_text("")
    assert main(["run", str(bad), "--events", str(events)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "^" in err and "error(s) in 1 file(s)" in err


def test_run_exit_code_1_on_missing_list_file(tmp_path, capsys) -> None:
    rules = tmp_path / "r.vigil"
    rules.write_text(
        RULES + '\nlist stolen from "nope.txt"\n'
        "rule stolen_use from txn by card_id pattern t define t as card_id in stolen\n"
    )
    (tmp_path / "e.jsonl").write_text("")
    assert main(["run", str(rules), "--events", str(tmp_path / "e.jsonl")]) == 1
    assert "cannot read list 'stolen'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("events_arg", "message"),
    [
        ("missing.jsonl", "no such file or directory"),
        ("nostream=x.jsonl", "stream 'nostream' is not declared"),
    ],
)
def test_run_exit_code_2_on_usage_errors(fraud, capsys, events_arg, message) -> None:
    _, rules, _ = fraud
    assert main(["run", str(rules), "--events", events_arg]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_run_rejects_a_bucket_count_that_is_not_positive(fraud, capsys, value) -> None:
    _, rules, events = fraud
    assert main(["run", str(rules), "--events", str(events), "--buckets", value]) == 2
    assert f"--buckets: must be a positive integer, got '{value}'" in capsys.readouterr().err


def test_spark_only_options_are_named_when_the_embedded_engine_ignores_them(fraud, capsys):
    tmp, rules, events = fraud
    assert main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(tmp / "m.jsonl"), "--buckets", "4",
                 "--max-records-per-batch", "10"]) == 0
    err = capsys.readouterr().err
    assert ("vigil run: --buckets, --max-records-per-batch apply to --engine spark only; the "
            "embedded engine ignores them") in err
    assert main(["run", str(rules), "--events", str(events), "--max-records-per-batch", "0"]) == 2
    assert "--max-records-per-batch: must be a positive integer, got '0'" in (
        capsys.readouterr().err)


def test_run_exit_code_2_on_missing_rule_file(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "none.vigil"), "--events", "-"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_run_max_partials_is_passed_to_the_engine(fraud, capsys) -> None:
    _, rules, events = fraud
    assert main(["run", str(rules), "--events", str(events), "--max-partials", "0"]) == 2
    assert "--max-partials: must be a positive integer, got '0'" in capsys.readouterr().err
    assert main(["run", str(rules), "--events", str(events), "--max-partials", "1",
                 "--engine", "embedded"]) == 0
    out = capsys.readouterr()
    # with one partial match per key, the probes cannot accumulate: no match, drops counted
    assert out.out == ""
    assert "dropped by --max-partials" in out.err


def test_vigil_run_as_a_process(fraud) -> None:
    _, rules, events = fraud
    proc = subprocess.run(
        [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", "-"],
        input=events.read_text(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "card_testing"


def test_run_runs_queries_next_to_rules(fraud, capsys) -> None:
    tmp, rules, events = fraud
    rules.write_text(
        RULES + "\nstream news (id string, title text, ts timestamp) time ts\n"
        "query acme_news from news match title:acme\n"
    )
    news = tmp / "news.jsonl"
    news.write_text(
        '{"id": "n1", "title": "ACME wins", "ts": "2026-01-01T00:00:00Z"}\n'
        '{"id": "n2", "title": "Other news", "ts": "2026-01-01T00:00:01Z"}\n'
    )
    code = main(["run", str(rules), "--events", f"txn={events}", "--events", f"news={news}"])
    assert code == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(m["kind"], m["name"]) for m in out} == {("rule", "card_testing"),
                                                     ("query", "acme_news")}
    assert [m["document_id"] for m in out if m["kind"] == "query"] == ["n1"]


def test_spark_is_the_default_engine_for_one_file_or_directory(capsys) -> None:
    from argparse import Namespace

    from cep.cli.run import EventInput, _engine_choice

    default = Namespace(engine=None)
    assert _engine_choice(default, [EventInput("events/")]) == "spark"
    assert _engine_choice(default, [EventInput("-")]) == "embedded"
    assert _engine_choice(Namespace(engine="embedded"), [EventInput("e.jsonl")]) == "embedded"
    assert _engine_choice(default, [EventInput("a", "txn"), EventInput("b", "news")]) == (
        "embedded"
    )
    assert "several --events inputs run in the embedded engine" in capsys.readouterr().err


def test_spark_progress_lines_name_lost_executors_and_retries(capsys):
    from cep.cli.run import _spark_progress

    _spark_progress({"batchId": 3, "eventRows": 10, "durationMs": {"triggerExecution": 1000},
                     "executorsLost": ["10.0.0.7:41233"], "failedTasks": 2, "stageRetries": 1})
    _spark_progress({"batchId": 4, "eventRows": 10, "durationMs": {"triggerExecution": 1000}})
    lines = capsys.readouterr().err.splitlines()
    assert lines[1] == ("    executor(s) lost: 10.0.0.7:41233; 2 task attempt(s) failed and "
                        "retried, 1 stage(s) retried")
    assert len(lines) == 3  # a quiet micro-batch says nothing of executors
