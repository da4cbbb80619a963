"""``run_spark`` with a real Vigil program: same matches as the embedded engine; Ctrl-C stops
cleanly, SIGKILL loses nothing, and reruns from the checkpoint neither lose nor duplicate."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from spark_support import BAD_ROWS

from cep.engine.engine import Engine
from cep.events.event import BadEventError, parse_json_line
from spark_udf import read_outputs
from spark_udf.rules import detect_specs, processor_specs
from spark_udf.run import run_spark
from spark_udf.sources import read_jsonl

pytestmark = pytest.mark.slow

PROGRAM = """
stream txn (card_id string, amount float, merchant string, ts timestamp)
  time ts unit ms lateness 5s

rule card_testing "Tiny probe charges, then a large purchase on the same card"
  from txn
  by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
  emit card_id, count(probe) as probes, big.amount as amount
  severity high

query m1_seen "searched inside Spark too" from txn match merchant:m1
"""
BASE_MS = 1_767_225_600_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_inputs(tmp_path, n: int) -> tuple[str, str]:
    rules = tmp_path / "fraud.vigil"
    rules.write_text(PROGRAM)
    rng = random.Random(11)
    events = tmp_path / "events.jsonl"
    with open(events, "w") as handle:
        for i in range(n):
            roll = rng.random()
            amount = 0.5 if roll < 0.45 else (900.0 if roll < 0.6 else 20.0)
            ts = BASE_MS + i * 1_000 - rng.randint(0, 3_000)
            handle.write(json.dumps({
                "card_id": f"c{rng.randrange(40)}", "amount": amount,
                "merchant": f"m{rng.randrange(3)}", "ts": ts,
            }) + "\n")
        handle.write("not json\n")
    return str(rules), str(events)


def _embedded(
    rules: str, events: str, *, close: bool = False, kinds: tuple[str, ...] = ("rule",)
) -> tuple[list[dict], list[dict]]:
    """The embedded engine over the same file, left open (watermark = max time - lateness) or
    closed (end of input, where a finished run_spark and a backtest stand); only the matches
    of ``kinds``."""
    engine = Engine()
    engine.register(rules)
    with open(events) as handle:
        for line in handle:
            try:
                engine.feed(json.loads(line))
            except ValueError:
                continue
    if close:
        engine.close()
    wanted = [m for m in engine.drain() if m["kind"] in kinds]
    return wanted, engine.dead_letters()


def _ids(rows):
    return sorted(r["match_id"] for r in rows)


def test_run_spark_matches_the_embedded_engine(spark, tmp_path):
    rules, events = _write_inputs(tmp_path, 1_500)
    seen_batches = []
    summary = run_spark(
        rules, events, out=str(tmp_path / "out"), dead_letter=str(tmp_path / "dead"),
        spark=spark, max_records_per_batch=400, buckets=8,
        on_matches=lambda batch_id, matches: seen_batches.append((batch_id, len(matches))),
    )
    # a finite input ends with the end-of-input mark: Spark flushes as the engine's close()
    expected, _ = _embedded(rules, events, close=True, kinds=("rule", "query"))
    got = read_outputs(str(tmp_path / "out"))
    assert {m["kind"] for m in got} == {"rule", "query"}
    assert len(expected) > 20
    assert _ids(got) == _ids(expected)
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in expected
    )
    assert summary.input_rows == 1_501 and summary.matches == len(expected)
    assert summary.skipped == () and not summary.stopped_by_signal
    assert sum(n for _, n in seen_batches) == len(expected)
    dead = read_outputs(str(tmp_path / "dead"))
    assert [(d["reason"], d["line"]) for d in dead] == [("invalid_json", 1_500)]

    # The same program as a backtest over the static file: end of input closes every window.
    specs, skipped = processor_specs(rules)
    static = detect_specs(read_jsonl(spark, events, streaming=False), specs, buckets=8).collect()
    closed, _ = _embedded(rules, events, close=True)
    assert _ids([r for r in static if r.kind == "rule"]) == _ids(closed)
    assert [(r.kind, r.name) for r in static if r.kind != "rule"] == [
        ("dead_letter", "invalid_json")
    ]


def _command(rules, events, tmp_path, *extra):
    return [
        sys.executable, "-m", "spark_udf.run", "--program", rules, "--events", events,
        "--out", str(tmp_path / "out"), "--dead-letter", str(tmp_path / "dead"),
        "--checkpoint", str(tmp_path / "ck"), "--master", "local[2]",
        "--max-records-per-batch", "300", "--buckets", "8", *extra,
    ]


def _start(command, log):
    env = {**os.environ, "PYTHONPATH": ROOT}
    with open(log, "a") as stderr:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=stderr, start_new_session=True, text=True)


def _errors(log) -> str:
    with open(log) as handle:
        lines = [line for line in handle if "Error" in line or "Exception" in line]
    return "".join(lines[-20:])


def _wait_for_parts(directory, count, proc, log, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.isdir(directory):
            parts = [n for n in os.listdir(directory) if n.startswith("part-")]
            if len(parts) >= count:
                return
        assert proc.poll() is None, f"the run ended before it could be interrupted:\n{_errors(log)}"
        time.sleep(0.2)
    raise AssertionError(f"no {count} batch files in {directory} after {timeout}s")


def test_interrupt_kill_and_resume_lose_and_duplicate_nothing(tmp_path):
    rules, events = _write_inputs(tmp_path, 1_200)  # four micro-batches of 300 lines
    out = str(tmp_path / "out")

    # 1. Ctrl-C: the query stops cleanly and the run reports it.
    log = tmp_path / "runs.log"
    proc = _start(_command(rules, events, tmp_path, "--follow"), log)
    _wait_for_parts(out, 1, proc, log)
    os.kill(proc.pid, signal.SIGINT)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, _errors(log)
    first = json.loads(stdout.strip().splitlines()[-1])
    assert first["stopped_by_signal"] is True

    # 2. SIGKILL of the driver and its JVM in the middle of a later batch.
    proc = _start(_command(rules, events, tmp_path), log)
    _wait_for_parts(out, len(os.listdir(out)) + 1, proc, log)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)

    # 3. A rerun with the same checkpoint finishes the input.
    proc = _start(_command(rules, events, tmp_path), log)
    stdout, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, _errors(log)
    last = json.loads(stdout.strip().splitlines()[-1])
    assert last["stopped_by_signal"] is False

    expected, _ = _embedded(rules, events, close=True, kinds=("rule", "query"))
    got = read_outputs(out)
    assert len(got) == len({m["match_id"] for m in got}), "a match was written twice"
    assert _ids(got) == _ids(expected)
    assert len(expected) > 40


NEWS = "stream news (id string, title text, views int, ts timestamp) time ts\n"
TXN = "stream txn (card_id string, amount float, ts timestamp) time ts\n"
ACME = "query acme from news match title:acme\n"
BIG = "rule big from txn by card_id pattern b define b as amount > 100\n"


@pytest.mark.parametrize("program", [NEWS + TXN + ACME + BIG, NEWS + TXN + ACME, NEWS + TXN + BIG],
                         ids=["rules-and-queries", "queries-only", "rules-only"])
def test_run_spark_dead_letters_every_bad_row_the_embedded_engine_does(spark, tmp_path, program):
    rules = tmp_path / "p.vigil"
    rules.write_text(program)
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(BAD_ROWS) + "\n")
    summary = run_spark(str(rules), str(events), out=str(tmp_path / "out"),
                        dead_letter=str(tmp_path / "dead"), spark=spark)
    engine = Engine()
    engine.register(str(rules))
    expected = []
    for line, text in enumerate(BAD_ROWS):  # as the CLI feeds a file (lines counted from 0)
        try:
            engine.feed(parse_json_line(text), line=line, position=line)
        except BadEventError as exc:
            expected.append((exc.reason, line))
    engine.close()
    expected = sorted(expected + [(d["reason"], d["line"]) for d in engine.dead_letters()])
    assert len(expected) == 5
    got = sorted((d["reason"], d["line"]) for d in read_outputs(str(tmp_path / "dead")))
    assert got == expected and summary.dead_letters == len(expected)
    wanted = sorted(m["match_id"] for m in engine.drain())
    assert sorted(m["match_id"] for m in read_outputs(str(tmp_path / "out"))) == wanted
