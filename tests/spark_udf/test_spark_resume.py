"""Spark runs that continue over a grown input: a finite run's end-of-input flush stays out of
the checkpoint, so a rerun reads exactly the new files, lines or stream entries with the state
the first run left; a checkpoint that cannot continue is refused with what changed; and
``--follow`` keeps the query running until SIGTERM.

"Flush rows" below are the rows of a run's ``part-<batch>-end.*`` files. The rows of run 1 and
run 2 without run 1's flush rows are exactly one run's rows over the whole input: run 1's flush
is what the input's end looked like then, and run 2 supersedes it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from cep.cli import main
from spark_udf.errors import CheckpointError
from spark_udf.run import run_spark
from spark_udf.sinks import END_TAG

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

PROGRAM = """
stream txn (card_id string, amount float, merchant string, ts timestamp)
  time ts unit ms lateness 5s

rule two_big "two large charges on one card within an hour"
  from txn by card_id
  pattern a b
  define a as amount > 100, b as amount > 100
  within 1h

rule big_then_quiet "a very large charge, then nothing on the card for ten minutes"
  from txn by card_id
  pattern a !b
  define a as amount > 500, b as amount > 0
  within 10m

rule probes_then_big "tiny charges, then large ones (greedy, no window: ends with the input)"
  from txn by card_id
  pattern s b+
  define s as amount < 1, b as amount > 100

metric per_merchant from txn by merchant window tumbling 1m
  select count() as n, sum(amount) as total
"""


def _event(i: int, card: str, amount: float, seconds: float) -> str:
    return json.dumps({"card_id": card, "amount": amount, "merchant": f"m{i % 3}",
                       "ts": BASE_MS + int(seconds * 1000)})


def _parts() -> list[list[str]]:
    """Three parts of an input in time order (disorder within the lateness), a bad line in
    the first and the last, and two cards planted at the boundary between parts 2 and 3: the
    first charge of ``span``'s two large ones ends part 2, the second starts part 3; ``gap``'s
    very large charge ends part 2 and its next charge starts part 3 within ten minutes."""
    amounts = (0.5, 0.5, 20.0, 150.0, 40.0, 700.0, 0.5, 250.0)
    lines = [_event(i, f"c{(i * 7) % 5}", amounts[(i * 3) % len(amounts)],
                    i * 9 - (i % 3)) for i in range(240)]
    first, second, third = lines[:80], lines[80:160], lines[160:]
    first.insert(40, "not json")
    second += [_event(1, "span", 200.0, 159 * 9 + 1), _event(2, "gap", 900.0, 159 * 9 + 2)]
    third[:0] = [_event(0, "span", 300.0, 160 * 9 - 4), _event(1, "gap", 5.0, 160 * 9 - 3)]
    third.append(json.dumps({"card_id": "c1", "amount": "lots", "ts": BASE_MS + 2_200_000}))
    return [first, second, third]


def _write(path: str, lines: list[str], mode: str = "w") -> None:
    with open(path, mode, encoding="utf-8") as handle:
        handle.writelines(line + "\n" for line in lines)


def _rows(directory: str, *, flushes: bool | None = None) -> list[dict]:
    """The objects of a directory's part files: every file, only flush files (``True``), or
    only micro-batch files (``False``)."""
    rows = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        is_flush = name.partition(".")[0].endswith(f"-{END_TAG}")
        if name.startswith("part-") and (flushes is None or flushes == is_flush):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                rows.extend(json.loads(line) for line in handle if line.strip())
    return rows


def _by_id(rows: list[dict]) -> dict[str, dict]:
    return {row["match_id"]: row for row in rows}


def _comparable(row: dict) -> str:
    # Sums of floats may differ in their last bits when events arrive in other batches.
    values = row.get("values")
    if isinstance(values, dict):
        row = {**row, "values": {k: round(v, 9) if isinstance(v, float) else v
                                 for k, v in values.items()}}
    return json.dumps(row, sort_keys=True)


@pytest.fixture(scope="module")
def whole(spark, tmp_path_factory):
    """One run over the whole input (one file): its matches, dead letters and line count."""
    work = tmp_path_factory.mktemp("whole")
    rules = work / "rules.vigil"
    rules.write_text(PROGRAM)
    lines = [line for part in _parts() for line in part]
    _write(str(work / "events.jsonl"), lines)
    summary = run_spark(str(rules), str(work / "events.jsonl"), out=str(work / "out"),
                        dead_letter=str(work / "dead"), spark=spark, buckets=4)
    assert summary.input_rows == len(lines) and summary.flushed_after is not None
    matches = _rows(str(work / "out"))
    assert {m["name"] for m in matches} == {"two_big", "big_then_quiet", "probes_then_big",
                                            "per_merchant"}
    return matches, _rows(str(work / "dead")), len(lines)


@pytest.mark.parametrize("growth", ["new file", "appended lines"])
def test_a_rerun_reads_exactly_what_the_input_gained(spark, tmp_path, whole, growth):
    expected, expected_dead, total = whole
    rules = tmp_path / "rules.vigil"
    rules.write_text(PROGRAM)
    first, second, third = _parts()
    if growth == "new file":
        events = tmp_path / "events"
        events.mkdir()
        _write(str(events / "part-0.jsonl"), first)
        _write(str(events / "part-1.jsonl"), second)
    else:
        events = tmp_path / "events.jsonl"
        _write(str(events), first + second)
    out, dead = str(tmp_path / "out"), str(tmp_path / "dead")

    def run():
        return run_spark(str(rules), str(events), out=out, dead_letter=dead, spark=spark,
                         buckets=4)

    one = run()
    assert one.resumed_after is None and one.flushed_after is not None
    flush_one = _rows(out, flushes=True)
    flush_files = {n for n in os.listdir(out) if f"-{END_TAG}." in n}
    if growth == "new file":
        _write(str(events / "part-2.jsonl"), third)
    else:
        _write(str(events), third, mode="a")
    two = run()
    assert two.resumed_after == one.flushed_after
    assert one.input_rows + two.input_rows == total  # every line read once, none again

    # Run 1's flush rows aside, runs 1 and 2 wrote one run's rows over the whole input.
    batches = _rows(out, flushes=False)
    assert len({r["match_id"] for r in batches}) == len(batches), "a match was written twice"
    kept = [row for name in sorted(os.listdir(out)) if name.startswith("part-")
            and name not in flush_files for row in _rows_of(out, name)]
    assert sorted(map(_comparable, kept)) == sorted(map(_comparable, expected))
    assert sorted(map(_comparable, _rows(dead))) == sorted(map(_comparable, expected_dead))
    assert [d["reason"] for d in expected_dead] == ["invalid_json", "wrong_type"]

    # The match whose events lie on both sides of the boundary is found.
    spanning = [m for m in _rows(out, flushes=False) if m["name"] == "two_big"
                and m["key"] == {"card_id": "span"}]
    assert len(spanning) == 1
    # What run 1's flush said about the input's end, run 2 superseded: the absence of a
    # charge after gap's large one (the next charge came in run 2), and the last minute's
    # merchant windows (counted again with run 2's events, under new ids).
    superseded = [row for row in flush_one if row["match_id"] not in _by_id(expected)]
    assert {"big_then_quiet", "per_merchant"} <= {row["name"] for row in superseded}
    assert {"card_id": "gap"} in [r["key"] for r in superseded if r["name"] == "big_then_quiet"]

    if growth == "new file":
        # Nothing new: no micro-batch, no flush again (run 2 flushed this state).
        three = run()
        assert (three.input_rows, three.batches, three.flushed_after) == (0, 0, None)
        assert three.resumed_after == two.flushed_after


def _rows_of(directory: str, name: str) -> list[dict]:
    with open(os.path.join(directory, name), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def test_a_checkpoint_that_cannot_continue_is_refused_with_what_changed(spark, tmp_path,
                                                                      capsys):
    rules = tmp_path / "rules.vigil"
    rules.write_text(PROGRAM)
    events = tmp_path / "events"
    events.mkdir()
    first, second, _ = _parts()
    _write(str(events / "part-1.jsonl"), first)
    out = str(tmp_path / "out")
    assert main(["run", str(rules), "--events", str(events), "--out", out, "--buckets", "4",
                 "--engine", "spark", "--master", "local[2]", "--no-alerts"]) == 0
    capsys.readouterr()

    def rerun(*extra: str) -> str:
        code = main(["run", str(rules), "--events", str(events), "--out", out,
                     "--engine", "spark", "--master", "local[2]", "--no-alerts", *extra])
        err = capsys.readouterr().err
        assert code == 2, err
        return err

    assert "hashed into 4 buckets per processor, this run uses 8 (rerun with --buckets 4)" in (
        rerun("--buckets", "8")
    )
    # A file sorting before the one read would move every position the checkpoint holds.
    _write(str(events / "part-0.jsonl"), second)
    assert "part-0.jsonl now stands where part-1.jsonl, read by the checkpoint, stood" in (
        rerun("--buckets", "4")
    )
    os.remove(events / "part-0.jsonl")
    with pytest.raises(CheckpointError, match="fewer than the 81 this checkpoint has read"):
        _write(str(events / "part-1.jsonl"), first[:10])
        run_spark(str(rules), str(events), out=out, spark=spark, buckets=4)


def _wait_for(predicate, proc=None, log=None, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{open(log).read()[-3000:]}")
        time.sleep(0.3)
    raise AssertionError(f"timed out:\n{open(log).read()[-3000:] if log else ''}")


BIG = """
stream txn (card_id string, amount float, ts timestamp) time ts unit ms lateness 5s
rule big from txn by card_id pattern b define b as amount > 100
"""


def _big_events(cards: list[str], start_s: int) -> list[str]:
    """A large charge per card, then a small one 30 s later: the watermark (lateness 5 s) then
    passes the large ones, which the rule takes in time order."""
    times = [start_s + i for i in range(len(cards))] + [start_s + 30]
    return [json.dumps({"card_id": card, "amount": amount, "ts": BASE_MS + t * 1000})
            for card, amount, t in zip([*cards, "tick"], [500.0] * len(cards) + [1.0], times,
                                       strict=True)]


def _cards(out: str) -> set[str]:
    return {m["key"]["card_id"] for m in _rows(out)}


def test_follow_reads_new_files_until_sigterm_and_says_how_to_resume(tmp_path):
    rules = tmp_path / "big.vigil"
    rules.write_text(BIG)
    events = tmp_path / "events"
    events.mkdir()
    _write(str(events / "a.jsonl"), _big_events(["c1", "c2"], 0))
    out, log = str(tmp_path / "out"), str(tmp_path / "stderr.log")
    command = [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", str(events),
               "--out", out, "--engine", "spark", "--follow", "--master", "local[2]",
               "--buckets", "2", "--no-alerts"]
    with open(log, "w") as stderr:
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait_for(lambda: _cards(out) == {"c1", "c2"}, proc, log)
        # A new file, written aside and renamed in (names starting with "." are not read).
        _write(str(events / ".b.jsonl"), _big_events(["c3"], 60))
        os.replace(events / ".b.jsonl", events / "b.jsonl")
        _wait_for(lambda: "c3" in _cards(out), proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    err = open(log).read()
    assert "following" in err and "rerun the same command" in err
    assert not [n for n in os.listdir(out) if f"-{END_TAG}." in n]  # no end of input flushed


def test_follow_on_a_redis_stream_matches_entries_added_while_it_runs(spark, tmp_path,
                                                                     redis_port):
    rules = tmp_path / "big.vigil"
    rules.write_text(BIG)
    out = str(tmp_path / "out")
    client = redis.Redis(port=redis_port)
    for line in _big_events(["r1"], 0):
        client.xadd("txn", {"event": line})
    stop = threading.Event()
    result: dict = {}

    def follow() -> None:
        try:
            result["summary"] = run_spark(
                str(rules), f"redis://127.0.0.1:{redis_port}/0/txn", out=out, spark=spark,
                available_now=False, trigger_interval="500 milliseconds", buckets=2, stop=stop,
            )
        except BaseException as exc:  # reported by the assertion below
            result["error"] = exc

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        _wait_for(lambda: "r1" in _cards(out) or "error" in result)
        for line in _big_events(["r2", "r3"], 60):
            client.xadd("txn", {"event": line})
        _wait_for(lambda: {"r2", "r3"} <= _cards(out) or "error" in result)
    finally:
        stop.set()
        thread.join(timeout=120)
        client.close()
    assert "error" not in result, result.get("error")
    summary = result["summary"]
    assert summary.stopped_by_signal and summary.flushed_after is None
    assert summary.input_rows == 5 and _cards(out) == {"r1", "r2", "r3"}

    # Without --follow: what the stream holds now (nothing new), then stop; the position is
    # the checkpoint's.
    client = redis.Redis(port=redis_port)
    client.xadd("txn", {"event": _big_events(["r4"], 120)[0]})
    client.close()
    again = run_spark(str(rules), f"redis://127.0.0.1:{redis_port}/0/txn", out=out,
                      spark=spark, buckets=2)
    # r4 is the last event: the end-of-input flush takes it past the watermark
    assert again.input_rows == 1 and again.flushed_after is not None
    assert _cards(out) == {"r1", "r2", "r3", "r4"}


EDITED = (PROGRAM.replace("within 1h", "within 2h")  # two_big changes: reset to version 2
        .replace(PROGRAM[PROGRAM.index("rule big_then_quiet"):PROGRAM.index("rule probes")], "")
        + """
rule merchant_pair "two large charges at one merchant within ten minutes (a new key)"
  from txn by merchant
  pattern a b
  define a as amount > 200, b as amount > 200
  within 10m
""")


def _embedded(rules, events, out, checkpoint) -> None:
    assert main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--checkpoint", str(checkpoint), "--out", str(out), "--no-alerts"]) == 0


def test_an_edited_program_continues_the_state_of_what_it_did_not_change(
    spark, tmp_path, whole, capsys
):
    """Run 1 over two parts, then the program is edited (a rule changed, one removed, one
    added on a new key definition) and run 2 reads the third part from the same checkpoint:
    the untouched rule and metric continue as if nothing had changed (their rows equal one
    unedited run's), and the changed and new rules give what the embedded engine gives with
    the same edit at the same place."""
    expected, _, _ = whole
    rules = tmp_path / "rules.vigil"
    rules.write_text(PROGRAM)
    first, second, third = _parts()
    events = tmp_path / "events"
    events.mkdir()
    _write(str(events / "part-0.jsonl"), first + second)
    out = str(tmp_path / "out")
    run = ["run", str(rules), "--events", str(events), "--out", out, "--buckets", "4",
           "--engine", "spark", "--master", "local[2]", "--no-alerts"]
    assert main(run) == 0
    flush_files = {n for n in os.listdir(out) if f"-{END_TAG}." in n}
    # The embedded engine, given the same edit at the same place.
    embedded_ck, mine = tmp_path / "embedded_ck", tmp_path / "embedded"
    mine.mkdir()
    _embedded(rules, events, mine / "one.jsonl", embedded_ck)

    rules.write_text(EDITED)
    _write(str(events / "part-1.jsonl"), third)
    capsys.readouterr()
    assert main(run) == 0
    err = capsys.readouterr().err
    assert re.search(r"continuing after micro-batch \d+ of the checkpoint: kept 2 "
                     r"\(probes_then_big, per_merchant\), reset 1 \(two_big v2\), added 1 "
                     r"\(merchant_pair\), dropped 1 \(big_then_quiet\)", err), err
    _embedded(rules, events, mine / "two.jsonl", embedded_ck)

    rows = [row for name in sorted(os.listdir(out)) if name.startswith("part-")
            and name not in flush_files for row in _rows_of(out, name)]
    assert len({r["match_id"] for r in rows}) == len(rows), "a match was written twice"
    untouched = {"probes_then_big", "per_merchant"}
    assert sorted(_comparable(r) for r in rows if r["name"] in untouched) == sorted(
        _comparable(r) for r in expected if r["name"] in untouched)
    # Run 2 wrote nothing of the rule the edit dropped.
    assert {r["name"] for r in _rows(out) if r["match_id"] not in {
        m["match_id"] for name in flush_files for m in _rows_of(out, name)}} <= {
        "two_big", "big_then_quiet", "merchant_pair", *untouched}
    assert not [r for r in _rows_of(str(mine), "two.jsonl") if r["name"] == "big_then_quiet"]

    def second_run(found: list[dict]) -> list[str]:
        return sorted(_comparable(r) for r in found
                      if r["name"] in ("two_big", "merchant_pair") and r["version"] > 0
                      and (r["name"] == "merchant_pair" or r["version"] == 2))

    ran_two = second_run(rows)
    assert ran_two and {json.loads(r)["name"] for r in ran_two} == {"two_big",
                                                                     "merchant_pair"}
    assert ran_two == second_run(_rows_of(str(mine), "two.jsonl"))
    # two_big started afresh at version 2: the charge pair spanning the edit is not a match.
    assert not [r for r in rows if r["name"] == "two_big" and r["key"] == {"card_id": "span"}]
    assert {r["version"] for r in rows if r["name"] == "two_big"} == {1, 2}
