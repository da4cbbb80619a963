"""Restarts of the embedded engine (``cep.engine.checkpoint``).

The property: feeding events 1..k, taking a snapshot, restoring it into a new engine with the
same program and feeding k+1..n reports exactly the matches, dead letters, metric rows and stats
of one engine fed 1..n, with absences and timers pending at the split, metric windows open,
events waiting in the reorder buffer and rows held as columns, fed row by row or as batches.
Then program edits, the format's refusals, and the store's behaviour when the process dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from event_lines import EXAMPLES, PROGRAM, T0_MS, bad_line, good_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.engine import CheckpointStore, Engine
from cep.engine import checkpoint as ck
from cep.errors import CheckpointError
from cep.events.event import BadEventError, dead_letter, parse_json_line

# event_lines' program (a rule with `within`, two queries, a tumbling metric) plus a trailing
# absence, a greedy quantifier, a second stream whose only rule runs as a column-wise scan
# (its rows wait as columns) and a session metric.
DIFF_PROGRAM = PROGRAM + """
rule quiet from txn by card_id
  pattern a !b within 20s define a as amount < 10, b as amount > 500
rule grows from txn by card_id
  pattern a b+ within 15s define a as amount < 10, b as amount > 20

stream tick (id string, key string, price float, kind string, ts timestamp)
  time ts unit ms lateness 3s
rule dip from tick by key
  pattern d u contiguity strict
  define d as price < prev(price), u as kind == "y"
  after match skip past last
metric visits from tick by key window session gap 4s select count() as n, max(price) as top
"""


@st.composite
def input_lines(draw, max_events: int = 40) -> list[str]:
    """Lines of a mixed input: txn and tick events with times out of order (some late), null
    keys, and now and then a broken line."""
    lines: list[str] = []
    for i in range(draw(st.integers(1, max_events))):
        roll = draw(st.integers(0, 19))
        jitter = draw(st.integers(-7_000, 2_000))
        if roll < 10:
            event = {**good_event(i), "stream": "txn", "ts": T0_MS + i * 1_000 + jitter}
            event["amount"] = draw(st.sampled_from([2.5, 600.0, 40.0, 25.0]))
            if draw(st.integers(0, 12)) == 0:
                event["card_id"] = None
            lines.append(json.dumps(event))
        elif roll < 18:
            event = {
                "stream": "tick", "id": f"t{i}",
                "key": draw(st.sampled_from(["k1", "k2", "k3", None])) if roll == 17 else
                draw(st.sampled_from(["k1", "k2", "k3"])),
                "price": float(draw(st.integers(0, 5))),
                "kind": draw(st.sampled_from(["x", "y"])),
                "ts": T0_MS + i * 1_000 + jitter,
            }
            lines.append(json.dumps(event))
        else:
            line = draw(bad_line(i))
            if len(line) > 4_000:  # the fuzz suites cover huge lines; keep these runs quick
                line = line[:100]
            if line.startswith(b"{") and len(line) > 2:
                line = b'{"stream": "txn", ' + line[1:]
            lines.append(line.decode("utf-8", "replace"))
    return lines


@st.composite
def restart_case(draw):
    lines = draw(input_lines())
    chunks: list[tuple[int, str]] = []  # (size, how it is fed)
    left = len(lines)
    while left:
        size = draw(st.integers(1, min(left, 12)))
        chunks.append((size, draw(st.sampled_from(["feed", "batch"]))))
        left -= size
    split = draw(st.integers(0, len(chunks)))
    return lines, chunks, split


def _feed(engine: Engine, lines: list[str], start: int, how: str) -> None:
    """Feed ``lines`` (positions from ``start``) one by one, or as the command line does:
    runs of parsed events as one batch, broken lines as dead letters in their place."""
    if how == "feed":
        for offset, text in enumerate(lines):
            engine.feed_record(text, line=start + offset + 1, position=start + offset)
        return
    run: list[tuple[int, str, dict]] = []

    def flush() -> None:
        if run:
            engine.feed_batch(
                pd.DataFrame.from_records([event for _, _, event in run]),
                lines=[pos + 1 for pos, _, _ in run],
                positions=[pos for pos, _, _ in run],
                raw=[text for _, text, _ in run],
            )
            run.clear()

    for offset, text in enumerate(lines):
        try:
            run.append((start + offset, text, parse_json_line(text)))
        except BadEventError as exc:
            flush()
            engine.reject(
                dead_letter(exc.reason, exc.detail, line=start + offset + 1, raw=text)
            )
    flush()


NOW_MS = T0_MS + 86_400_000
"""The wall clock of every engine here: a time too far ahead is reported against it."""


def _engine(program: str = DIFF_PROGRAM, **options) -> Engine:
    engine = Engine(now_ms=NOW_MS, **options)
    engine.register(program)
    return engine


def _run(lines, chunks, split=None, *, restart=True, program=DIFF_PROGRAM, after=None):
    """Feed the chunks; at chunk boundary ``split``, drain, take a snapshot and (``restart``)
    continue in a new engine restored from it (of ``after``'s program when given)."""
    engine = _engine(program)
    matches: list[dict] = []
    dead: list[dict] = []
    position = 0
    data = report = None
    for index, (size, how) in enumerate([*chunks, (0, "feed")]):
        if index == split:
            matches += engine.drain()
            dead += engine.drain_dead_letters()
            data = engine.snapshot()
            if restart:
                engine = _engine(after or program)
                report = engine.restore(data)
        if size:
            _feed(engine, lines[position : position + size], position, how)
            position += size
    engine.close()
    matches += engine.drain()
    dead += engine.drain_dead_letters()
    return matches, dead, engine.stats, data, report


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(restart_case())
def test_a_restart_reports_what_one_run_reports(case):
    lines, chunks, split = case
    expected = _run(lines, chunks)
    restarted = _run(lines, chunks, split)
    untouched = _run(lines, chunks, split, restart=False)
    assert restarted[0] == expected[0]
    assert restarted[1] == expected[1]
    assert restarted[2] == expected[2]
    # Taking a snapshot changes nothing in the engine that keeps running.
    assert untouched[:3] == expected[:3]
    # A restored engine's own snapshot is the one it was restored from: nothing is lost.
    data = restarted[3]
    again = _engine()
    again.restore(data)
    assert again.snapshot() == data


def test_the_split_holds_pending_state():
    """A fixed case where every kind of pending state is live at the split, so the property
    is not satisfied vacuously."""
    events = []
    for i in range(30):
        events.append(json.dumps({
            **good_event(i), "stream": "txn", "amount": [2.5, 600.0, 40.0][i % 3],
            "ts": T0_MS + i * 1_000 - (3_000 if i % 4 else 0),
        }))
        events.append(json.dumps({"stream": "tick", "id": f"t{i}", "key": f"k{i % 2}",
                                  "price": float(5 - i % 4), "kind": "xy"[i % 3 == 2],
                                  "ts": T0_MS + i * 1_000}))
    chunks = [(20, "batch"), (20, "batch"), (10, "feed"), (10, "batch")]
    engine = _engine()
    _feed(engine, events[:20], 0, "batch")
    _feed(engine, events[20:40], 20, "batch")
    assert engine._route.columns  # tick rows held as columns
    assert len(engine._buffer)  # txn events waiting for the watermark
    assert engine._timers.live()  # absences and `within` deadlines
    assert engine._standing.operators["per_card"].open_windows
    assert engine._standing.operators["visits"].open_windows
    expected = _run(events, chunks)
    restarted = _run(events, chunks, split=2)
    assert restarted[:3] == expected[:3]
    names = {m["name"] for m in expected[0]}
    assert {"probe_then_big", "quiet", "grows", "dip", "per_card", "visits"} <= names


def test_undrained_output_is_part_of_the_snapshot():
    engine = _engine(PROGRAM)
    for i in range(3):
        engine.feed({**good_event(i), "amount": [2.5, 600.0, 1.0][i]})
    engine.feed({"card_id": "c0", "ts": "not a time"})
    engine.advance_watermark(T0_MS + 10 * 60_000)
    matches, dead = engine.matches(), engine.dead_letters()
    assert matches and dead
    restored = _engine(PROGRAM)
    restored.restore(engine.snapshot())
    assert restored.drain() == matches
    assert restored.drain_dead_letters() == dead


# ------------------------------------------------------------------------- program edits

EDIT_STREAM = """
stream txn (id string, card_id string, user string, amount float, ts timestamp)
  time ts unit ms lateness 3s
"""
KEEP = """
rule keep from txn by card_id
  pattern a b within 20s define a as amount < 10, b as amount > 500
metric spend from txn by card_id window tumbling 10s select sum(amount) as total
query big from txn match amount:[500 TO *]
"""
CHANGED_BEFORE = """
rule change from txn by card_id
  pattern a b within 20s define a as amount < 10, b as amount > 100
"""
CHANGED_AFTER = CHANGED_BEFORE.replace("amount > 100", "amount > 300")
REMOVED = """
rule gone from txn by card_id pattern a !b within 10s define a as amount < 10, b as amount > 5
"""
ADDED = """
rule by_user from txn by user
  pattern a b within 30s define a as amount < 10, b as amount > 100
"""
BEFORE = EDIT_STREAM + KEEP + CHANGED_BEFORE + REMOVED
AFTER = EDIT_STREAM + KEEP + CHANGED_AFTER + ADDED


@st.composite
def edit_case(draw):
    lines = []
    for i in range(draw(st.integers(4, 40))):
        lines.append(json.dumps({
            "id": f"e{i}", "card_id": draw(st.sampled_from(["c1", "c2", "c3"])),
            "user": draw(st.sampled_from(["u1", "u2"])),
            "amount": draw(st.sampled_from([2.5, 150.0, 400.0, 700.0])),
            "ts": T0_MS + i * 1_000 + draw(st.integers(-2_500, 500)),
        }))
    cut = draw(st.integers(1, len(lines) - 1))
    return lines, [(cut, draw(st.sampled_from(["feed", "batch"]))),
                   (len(lines) - cut, draw(st.sampled_from(["feed", "batch"])))]


def _named(matches: list[dict], *names: str) -> list[dict]:
    return [m for m in matches if m["name"] in names]


def _without_version(matches: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k not in ("version", "match_id")} for m in matches]


def _edited_live(lines, chunks):
    """The reference of an edit: one engine that, at the split, unregisters the changed and
    removed rules and registers the new forms, as a program edit does mid-stream."""
    engine = _engine(BEFORE)
    (cut, first), (rest, second) = chunks
    _feed(engine, lines[:cut], 0, first)
    matches = engine.drain()
    for name in ("change", "gone"):
        engine.unregister(name)
    engine.register(CHANGED_AFTER + ADDED)
    _feed(engine, lines[cut:], cut, second)
    engine.close()
    return matches, engine.drain(), engine.drain_dead_letters()


@settings(max_examples=max(EXAMPLES // 2, 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(edit_case())
def test_a_program_edit_keeps_the_untouched_and_restarts_the_changed(case):
    lines, chunks = case
    unedited = _run(lines, chunks, program=BEFORE)
    edited = _run(lines, chunks, split=1, program=BEFORE, after=AFTER)
    before, after, dead = _edited_live(lines, chunks)
    report = edited[4]
    assert report.kept == ("keep", "spend", "big")
    assert report.reset == ("change",)
    assert report.added == ("by_user",)
    assert report.dropped == ("gone",)
    assert report.versions == {"keep": 1, "spend": 1, "change": 2, "by_user": 1}

    # Untouched rules, metrics and queries report what they report without the edit.
    assert _named(edited[0], "keep", "spend", "big") == _named(unedited[0], "keep", "spend", "big")
    # The changed rule starts fresh at the split, with a new version (hence new match ids).
    changed_after = _named(edited[0], "change")[len(_named(before, "change")):]
    assert all(m["version"] == 2 for m in changed_after)
    assert _without_version(changed_after) == _without_version(_named(after, "change"))
    # The added rule, with a key of its own, starts at the split; the removed one is gone.
    assert _named(edited[0], "by_user") == _named(after, "by_user")
    assert not _named(edited[0][len(before):], "gone")
    assert edited[1] == dead


def test_a_second_restart_keeps_the_new_version():
    lines = [json.dumps({"id": f"e{i}", "card_id": "c1", "user": "u1",
                         "amount": [2.5, 400.0][i % 2], "ts": T0_MS + i * 1_000})
             for i in range(6)]
    first = _engine(BEFORE)
    _feed(first, lines[:2], 0, "feed")
    second = _engine(AFTER)
    assert second.restore(first.snapshot()).versions["change"] == 2
    _feed(second, lines[2:4], 2, "feed")
    third = _engine(AFTER)
    report = third.restore(second.snapshot())
    assert (report.kept, report.versions["change"]) == (
        ("keep", "spend", "big", "change", "by_user"), 2)
    # A name that comes back after being dropped continues its numbering.
    fourth = _engine(BEFORE)
    report = fourth.restore(third.snapshot())
    assert report.added == ("gone",) and report.dropped == ("by_user",)
    assert report.versions["gone"] == 1 and report.versions["change"] == 3


def test_stream_and_list_changes_reach_the_rules_that_use_them():
    program = """
    stream txn (card string, amount float, ts timestamp) time ts
    stream other (card string, ts timestamp) time ts
    list vip ("c1", "c2")
    rule one from txn by card pattern a define a as card in vip
    rule two from txn by card pattern a define a as amount > 1
    rule three from other by card pattern a
    """
    engine = _engine(program)
    edited = program.replace('"c2"', '"c3"').replace(
        "stream other (card string,", "stream other (card string, n int,")
    report = _engine(edited).restore(engine.snapshot())
    assert report.kept == ("two",) and report.reset == ("one", "three")
    layout = program.replace("pattern a define", "\n      pattern a\n      define")
    assert _engine(layout).restore(engine.snapshot()).kept == ("one", "two", "three")


# ------------------------------------------------------------------------- refusals


def test_restore_refuses_an_engine_that_was_fed():
    engine = _engine(PROGRAM)
    engine.feed(good_event(0))
    with pytest.raises(CheckpointError, match="new engine"):
        engine.restore(_engine(PROGRAM).snapshot())


def test_a_closed_engine_has_no_snapshot():
    engine = _engine(PROGRAM)
    engine.close()
    with pytest.raises(CheckpointError, match="closed"):
        engine.snapshot()


def test_restore_refuses_another_fast_strict():
    with pytest.raises(CheckpointError, match="fast_strict"):
        _engine(PROGRAM, fast_strict=False).restore(_engine(PROGRAM).snapshot())


def test_an_event_value_json_cannot_hold_is_refused():
    engine = _engine(PROGRAM)
    engine.feed({**good_event(0), "extra": {1, 2}})
    with pytest.raises(CheckpointError, match="set"):
        engine.snapshot()


def test_corrupt_snapshots_are_refused_and_change_nothing():
    engine = _engine(PROGRAM)
    for i in range(4):
        engine.feed(good_event(i))
    data = engine.snapshot()
    fresh = _engine(PROGRAM)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    with pytest.raises(CheckpointError, match="checksum"):
        fresh.restore(bytes(flipped))
    with pytest.raises(CheckpointError, match="truncated"):
        fresh.restore(data[:-5])
    with pytest.raises(CheckpointError, match="format version 9 is not supported"):
        fresh.restore(data[:4] + bytes([9]) + data[5:])
    malformed = ck._CODEC.encode(b'{"engine": {}}', 14)
    with pytest.raises(CheckpointError, match="malformed"):
        fresh.restore(malformed)
    assert fresh.stats.events == 0 and fresh.snapshot() == _engine(PROGRAM).snapshot()
    fresh.restore(data)
    assert fresh.stats == engine.stats


# ------------------------------------------------------------------------- the store


def _snapshot_after(count: int) -> bytes:
    engine = _engine(PROGRAM)
    for i in range(count):
        engine.feed(good_event(i))
    return engine.snapshot()


def test_the_store_keeps_the_latest(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.load() is None
    store.save(_snapshot_after(2), {"offset": 2})
    store.save(_snapshot_after(5), {"offset": 5})
    loaded = store.load()
    assert loaded.cursor == {"offset": 5} and loaded.path == store.path
    restored = _engine(PROGRAM)
    restored.restore(loaded.state)
    assert restored.stats.events == 5
    assert [p.name for p in store.directory.iterdir()] == [CheckpointStore.FILENAME]
    with pytest.raises(CheckpointError, match="JSON"):
        store.save(_snapshot_after(1), {"offset": {1, 2}})


@pytest.mark.parametrize("damage", ["flip", "truncate", "version", "inner_version", "empty"])
def test_a_damaged_checkpoint_file_is_refused_naming_it(tmp_path, damage):
    store = CheckpointStore(tmp_path)
    inner = _snapshot_after(3)
    if damage == "inner_version":
        inner = inner[:4] + bytes([7]) + inner[5:]
    store.save(inner, {"offset": 3})
    data = store.path.read_bytes()
    if damage == "flip":
        data = data[:40] + bytes([data[40] ^ 1]) + data[41:]
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "version":
        data = data[:4] + bytes([2]) + data[5:]
    elif damage == "empty":
        data = b""
    store.path.write_bytes(data)
    with pytest.raises(CheckpointError) as error:
        store.load()
    assert str(store.path) in str(error.value)
    if damage in ("version", "inner_version"):
        assert "format version" in str(error.value)


def test_a_crash_before_the_rename_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.save(_snapshot_after(2), {"offset": 2})

    def crash(*args):
        raise OSError("power cut")

    with monkeypatch.context() as patched:
        patched.setattr(ck.os, "replace", crash)
        with pytest.raises(OSError, match="power cut"):
            store.save(_snapshot_after(4), {"offset": 4})
    assert store.load().cursor == {"offset": 2}
    # A process killed mid-write leaves its temporary file: never read, removed by the next save.
    stale = tmp_path / f".{CheckpointStore.FILENAME}.abc123.tmp"
    stale.write_bytes(store.path.read_bytes()[:50])
    assert store.load().cursor == {"offset": 2}
    store.save(_snapshot_after(4), {"offset": 4})
    assert not stale.exists() and store.load().cursor == {"offset": 4}


def test_a_killed_writer_leaves_a_readable_checkpoint(tmp_path):
    """A process saving checkpoints in a loop is killed (SIGKILL) at an arbitrary moment: the
    directory still holds one whole checkpoint."""
    if not hasattr(signal, "SIGKILL"):
        pytest.skip("needs SIGKILL")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_checkpoint import _snapshot_after
        from cep.engine import CheckpointStore
        store = CheckpointStore({str(tmp_path)!r})
        states = [_snapshot_after(n) for n in (1, 6)]
        count = 0
        print("ready", flush=True)
        while True:
            count += 1
            store.save(states[count % 2], {{"count": count, "events": 1 if count % 2 == 0 else 6}})
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.4)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    loaded = CheckpointStore(tmp_path).load()
    assert loaded is not None and loaded.cursor["count"] >= 1
    restored = _engine(PROGRAM)
    restored.restore(loaded.state)
    assert restored.stats.events == loaded.cursor["events"]
