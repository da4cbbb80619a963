"""``vigil run --engine embedded --follow``: a directory's new and growing files, a file's
appended lines through rotation and truncation, and stdin, read as they come; SIGTERM or
SIGINT stops the run after the batch being fed, with what was written flushed, exit code 130
and the message that a rerun continues. Each test runs ``python -m cep.cli`` in a subprocess
and writes its input while it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cep.inputs import IDLE, FileSource, StopSignal

RULES = """
stream txn (card_id string, amount float, ts timestamp) time ts
rule big from txn by card_id pattern b define b as amount > 100
"""

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
DEADLINE_S = 60.0  # a loaded machine starts Python slowly; a quiet one takes a second or two


def _event(i: int, amount: float = 500.0) -> str:
    return json.dumps({"card_id": f"c{i}", "amount": amount, "ts": T0 + i}) + "\n"


def _start(tmp_path: Path, events: str, *extra: str, stdin=None) -> tuple[subprocess.Popen, Path]:
    rules = tmp_path / "rules.vigil"
    rules.write_text(RULES)
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", events,
         "--engine", "embedded", "--follow", "--out", str(out), "--no-alerts", *extra],
        stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path,
    )
    return proc, out


def _wait_for(out: Path, cards: list[str], proc: subprocess.Popen) -> None:
    """Wait until ``out`` holds a match for each card (in any order)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if out.exists():
            got = [json.loads(line)["key"]["card_id"] for line in out.read_text().splitlines()]
            if sorted(got) == sorted(cards):
                return
            assert len(got) <= len(cards), got
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError(f"no matches for {cards} in {out}: {out.read_text()!r}")


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> str:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, err
    assert "stopped; nothing was checkpointed" in err
    return err


def test_a_followed_directory_reads_new_files_and_grown_ones(tmp_path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    (events / "1.jsonl").write_text(_event(1))
    proc, out = _start(tmp_path, str(events))
    try:
        _wait_for(out, ["c1"], proc)
        (events / "2.jsonl").write_text(_event(2) + _event(3, amount=5.0))
        _wait_for(out, ["c1", "c2"], proc)
        with open(events / "1.jsonl", "a") as grown:  # a file read already grows
            grown.write(_event(4))
        (events / "_hidden.jsonl").write_text(_event(9))
        _wait_for(out, ["c1", "c2", "c4"], proc)
    finally:
        if proc.poll() is None:
            err = _stop(proc)
    assert "3 event(s)" not in err and "4 event(s)" in err  # c9 is hidden: never read


def test_a_followed_file_survives_rotation_and_truncation(tmp_path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_text(_event(1))
    proc, out = _start(tmp_path, str(path))
    try:
        _wait_for(out, ["c1"], proc)
        with open(path, "a") as log:
            log.write(_event(2))
            log.flush()
            log.write(_event(3)[:10])  # half a line: waits for the rest
        _wait_for(out, ["c1", "c2"], proc)
        with open(path, "a") as log:
            log.write(_event(3)[10:])
        _wait_for(out, ["c1", "c2", "c3"], proc)
        os.rename(path, tmp_path / "app.jsonl.1")  # rotation: rename, then a new file
        path.write_text(_event(4))
        _wait_for(out, ["c1", "c2", "c3", "c4"], proc)
        with open(path, "w") as log:  # truncated (shorter than what was read): from its start
            log.write(json.dumps({"card_id": "c5", "amount": 500, "ts": T0 + 5},
                                 separators=(",", ":")) + "\n")
        _wait_for(out, ["c1", "c2", "c3", "c4", "c5"], proc)
    finally:
        if proc.poll() is None:
            _stop(proc)


def test_followed_stdin_is_fed_as_it_comes_and_sigint_stops_it(tmp_path) -> None:
    proc, out = _start(tmp_path, "-", stdin=subprocess.PIPE)
    try:
        proc.stdin.write(_event(1))
        proc.stdin.flush()
        _wait_for(out, ["c1"], proc)  # fed before 20,000 lines or the end of input came
        proc.stdin.write(_event(2))
        proc.stdin.flush()
        _wait_for(out, ["c1", "c2"], proc)
    finally:
        if proc.poll() is None:
            _stop(proc, signal.SIGINT)


def test_follow_reads_one_input(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text(_event(1))
    proc, _ = _start(tmp_path, str(tmp_path / "a.jsonl"), "--events", str(tmp_path / "a.jsonl"))
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 2 and "--follow reads one --events input" in err


# ---------------------------------------------------------------------- in-process


def _follow(source: FileSource, stop: StopSignal, blocks: list) -> threading.Thread:
    def run() -> None:
        for item in source.blocks(stop):
            if item is not IDLE:
                blocks.append(item)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _lines(blocks: list) -> list[tuple[int, str]]:
    return [(b.first_line + i, b.text(i)) for b in blocks for i in range(len(b))]


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.02)


def test_a_followed_file_numbers_the_lines_of_each_file_it_reads(tmp_path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_text("a\nb\n")
    stop, blocks = StopSignal(), []
    thread = _follow(FileSource(str(path), follow=True), stop, blocks)
    try:
        _until(lambda: len(_lines(blocks)) == 2)
        os.rename(path, tmp_path / "old.jsonl")
        with open(tmp_path / "old.jsonl", "a") as old:
            old.write("c")  # the rotated file's last line, without its break
        path.write_text("d\n")
        _until(lambda: len(_lines(blocks)) == 4)
        assert _lines(blocks) == [(1, "a"), (2, "b"), (3, "c"), (1, "d")]
    finally:
        stop.set()
        thread.join(5)
