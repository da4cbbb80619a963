"""`vigil run --engine embedded --follow --checkpoint DIR` with alerts, killed with SIGKILL
between a match and the outbox's write of its alert: the checkpoint never moves past events
whose alerts are not on disk, so the rerun queues them again, and every alert reaches the
receiver once — none lost, none sent twice.

The outbox's write is held back by another connection holding SQLite's write lock, as a slow
disk would: the engine goes on matching (the alerts wait in the writer's queue) while the
checkpoint waits for them."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cep.alerts import WebhookReceiver, new_secret
from cep.cli import main
from cep.engine.checkpoint import CheckpointStore

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
stream txn (id string, card string, amount float, ts timestamp) time ts unit ms lateness 0s
webhook ops url "{url}" secret env KILL_TEST_SECRET
rule big from txn by card pattern b define b as amount > 500 notify ops
"""
T0 = 1_767_225_600_000
DEADLINE_S = 60.0


def _events(start: int, count: int) -> str:
    """Every odd event is large (a match and its alert)."""
    return "".join(
        json.dumps({"id": f"e{i}", "card": f"c{i % 3}", "amount": 900.0 if i % 2 else 10.0,
                    "ts": T0 + i * 1000}) + "\n"
        for i in range(start, start + count)
    )


def _append(path: Path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


def _matched(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["match_id"] for line in path.read_text().splitlines() if line}


def _until(condition, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended ({proc.returncode}) while waiting for {what}: "
                        f"{proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _outbox_rows(path: Path) -> dict[str, tuple[int, str]]:
    """msg_id -> (how many rows, state), as another process sees the outbox."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT msg_id, count(*), max(state) FROM messages GROUP BY msg_id"
        ).fetchall()
    finally:
        db.close()
    return {msg_id: (n, state) for msg_id, n, state in rows}


def test_a_kill_between_a_match_and_its_alerts_write_loses_and_duplicates_nothing(tmp_path):
    secret = new_secret()
    events, out = tmp_path / "events.jsonl", tmp_path / "m.jsonl"
    outbox, checkpoint = tmp_path / "outbox.sqlite", tmp_path / "ck"
    events.write_text("")
    with WebhookReceiver(secret) as receiver:
        rules = tmp_path / "r.vigil"
        rules.write_text(PROGRAM.format(url=receiver.url))
        command = [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", str(events),
                   "--engine", "embedded", "--follow", "--checkpoint", str(checkpoint),
                   "--checkpoint-interval", "0", "--out", str(out), "--outbox", str(outbox)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "KILL_TEST_SECRET": secret}

        def start() -> subprocess.Popen:
            return subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                                    text=True)

        # what the whole input gives, run once
        whole = tmp_path / "whole.jsonl"
        whole.write_text(_events(0, 30))
        assert main(["run", str(rules), "--events", str(whole), "--engine", "embedded",
                     "--no-alerts", "--out", str(tmp_path / "once.jsonl")]) == 0
        expected = _matched(tmp_path / "once.jsonl")
        assert len(expected) == 15

        first = start()
        try:
            _append(events, _events(0, 10))
            _until(lambda: len(receiver.webhook_ids) == 5, "the first alerts", first)
            _until(lambda: all(s == "delivered" for _, s in _outbox_rows(outbox).values()),
                   "their deliveries to be recorded", first)
            held = sqlite3.connect(outbox, isolation_level=None)
            held.execute("BEGIN IMMEDIATE")  # the outbox's writes wait from now on
            try:
                _append(events, _events(10, 10))
                _until(lambda: len(_matched(out)) == 10, "the next matches", first)
                time.sleep(0.3)  # the run waits for the disk to save its checkpoint
                unwritten = _matched(out) - set(_outbox_rows(outbox))
                assert len(unwritten) == 5  # matched, handed to the writer, not on disk
                saved = CheckpointStore(str(checkpoint)).load()
                assert saved is not None and saved.cursor["position"] <= 10
                assert len(receiver.webhook_ids) == 5  # nothing sent that is not stored
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=DEADLINE_S)
            finally:
                held.execute("ROLLBACK")
                held.close()
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
            first.stderr.close()

        _append(events, _events(20, 10))
        second = start()
        try:
            _until(lambda: set(receiver.webhook_ids) == expected, "every alert", second)
        finally:
            second.send_signal(signal.SIGTERM)
            _, err = second.communicate(timeout=DEADLINE_S)
        assert second.returncode == 130, err
        assert "continuing from" in err

    # every alert reached the receiver once, and the outbox holds each match once, delivered
    assert sorted(receiver.webhook_ids) == sorted(expected)
    assert receiver.duplicates == 0
    assert _outbox_rows(outbox) == {match_id: (1, "delivered") for match_id in expected}
