"""`vigil run --engine embedded --checkpoint DIR`: a rerun over a grown input continues with the
state the first run left, and a follow run killed with SIGKILL resumes without losing a
match."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cep.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
stream txn (id string, card string, amount float, ts timestamp) time ts unit ms lateness 0s
rule probe_big from txn by card pattern a b define a as amount < 1, b as amount > 500 within 1h
"""
T0 = 1_767_225_600_000


def _events(start: int, count: int) -> str:
    """Card c{i % 5}: a probe, then (two events later) a large amount, again and again."""
    lines = []
    for i in range(start, start + count):
        amount = 0.5 if i % 3 == 0 else (900.0 if i % 3 == 2 else 20.0)
        lines.append(json.dumps({"id": f"e{i}", "card": f"c{i % 5}", "amount": amount,
                                 "ts": T0 + i * 1000}))
    return "\n".join(lines) + "\n"


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["match_id"] for line in path.read_text().splitlines() if line]


def test_a_rerun_over_a_grown_directory_continues_the_first_runs_state(tmp_path, capsys):
    rules, events = tmp_path / "r.vigil", tmp_path / "events"
    rules.write_text(PROGRAM)
    events.mkdir()
    (events / "a.jsonl").write_text(_events(0, 100))
    run = ["run", str(rules), "--events", str(events), "--engine", "embedded",
           "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "m.jsonl")]
    assert main(run) == 0
    # the second file continues partial matches the first one started (i = 99 is a probe)
    (events / "b.jsonl").write_text(_events(100, 100))
    assert main(run) == 0
    assert "continuing from" in capsys.readouterr().err
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "all.jsonl").write_text(_events(0, 200))
    assert main(["run", str(rules), "--events", str(whole), "--engine", "embedded",
                 "--out", str(tmp_path / "one.jsonl")]) == 0
    resumed, once = _ids(tmp_path / "m.jsonl"), _ids(tmp_path / "one.jsonl")
    assert sorted(resumed) == sorted(once) and len(once) > 50
    # a rerun over an input that did not grow adds nothing
    assert main(run) == 0
    assert sorted(_ids(tmp_path / "m.jsonl")) == sorted(once)


def _wait_until(done, what: str, timeout: float = 120.0) -> None:
    """Poll ``done()``; the runs are processes of their own, slow to start on a loaded host."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if done():
            return
        time.sleep(0.05)
    raise AssertionError(f"no {what} after {timeout}s")


def _wait_for(path: Path, count: int) -> None:
    _wait_until(lambda: path.exists() and len(set(_ids(path))) >= count,
                f"{count} matches in {path}")


def test_a_follow_run_killed_with_sigkill_resumes_without_losing_a_match(tmp_path):
    rules, events, out = tmp_path / "r.vigil", tmp_path / "events", tmp_path / "m.jsonl"
    rules.write_text(PROGRAM)
    events.mkdir()
    command = [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", str(events),
               "--engine", "embedded", "--follow", "--checkpoint", str(tmp_path / "ck"),
               "--checkpoint-interval", "0", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start() -> subprocess.Popen:
        return subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                                text=True)

    # how many matches the first file alone gives, once its last event is released
    part = tmp_path / "part.jsonl"
    part.write_text(_events(0, 60))
    assert main(["run", str(rules), "--events", str(part), "--engine", "embedded",
                 "--out", str(tmp_path / "part-out.jsonl")]) == 0
    first_count = len(set(_ids(tmp_path / "part-out.jsonl")))
    first = start()
    try:
        (events / "a.jsonl").write_text(_events(0, 60))
        _wait_for(out, first_count)
        # its checkpoint follows the write (saved after every batch)
        _wait_until(lambda: (tmp_path / "ck" / "engine.checkpoint").exists(), "a checkpoint")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    (events / "b.jsonl").write_text(_events(60, 60))
    expected = tmp_path / "one.jsonl"
    whole = tmp_path / "whole.jsonl"
    whole.write_text(_events(0, 120))
    assert main(["run", str(rules), "--events", str(whole), "--engine", "embedded",
                 "--out", str(expected)]) == 0
    second = start()
    try:
        _wait_for(out, len(set(_ids(expected))))
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
    assert second.returncode == 130, err
    assert "continuing from" in err and "rerun the same command to continue" in err
    # nothing lost; a match written after the last checkpoint may be written again, under
    # the same id (the outbox delivers it once)
    assert set(_ids(out)) == set(_ids(expected))
