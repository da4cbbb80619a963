"""Device clock correction in the embedded engine: event time = happened + (received - sent),
the device's time kept as ``<time>_device``, the reorder buffer and watermark on the corrected
time, and the fallback for events without a sent or received time (uncorrected, counted)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.engine.engine import Engine

NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BASE_MS = NOW_MS - 3_600_000
RULE = """
rule login_buy from app by user pattern l b
  define l as action == "login", b as action == "buy"
  within 1m
  emit user, b.ts as bought
"""
CORRECTED = (
    "stream app (user string, action string, ts int, sent_at int, received_at int)\n"
    "  time ts unit ms sent sent_at received received_at lateness 5s\n" + RULE
)
PLAIN = (
    "stream app (user string, action string, ts int) time ts unit ms lateness 5s\n" + RULE
)


def _run(program: str, events: list[dict[str, Any]], *, batch: bool = False) -> Engine:
    engine = Engine(now_ms=NOW_MS)
    engine.register(program)
    if batch:
        engine.feed_batch(pd.DataFrame(events))
    else:
        for event in events:
            engine.feed(event)
    engine.close()
    return engine


def _shape(engine: Engine) -> list[tuple]:
    return sorted(
        (m["name"], json.dumps(m["key"]), json.dumps(m["events"], sort_keys=True), m["start"],
         m["end"], json.dumps(m["values"], sort_keys=True))
        for m in engine.drain()
    )


#: One event: (user, action, true time offset ms, queue delay ms, network delay ms).
_EVENT = st.tuples(
    st.sampled_from(["u1", "u2", "u3"]),
    st.sampled_from(["login", "buy", "view"]),
    st.integers(0, 200_000),
    st.integers(0, 30_000),
    st.integers(0, 2_000),
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(_EVENT, max_size=40),
    st.dictionaries(st.sampled_from(["u1", "u2", "u3"]), st.integers(-10**8, 10**8)),
    st.integers(-10**8, 10**8),
    st.booleans(),
)
def test_a_shifted_device_clock_gives_the_same_matches(
    rows: list[tuple], skews: dict[str, int], shift: int, batch: bool
) -> None:
    """Each device's clock is off by its own skew (hours either way); shifting it by a further
    constant changes nothing, and the matches are those of a plain stream stamped with the
    corrected times (the true time plus the network delay)."""
    def events(extra: int) -> list[dict[str, Any]]:
        out = []
        for user, action, at, queued, network in rows:
            device = skews.get(user, 0) + extra
            sent_true = BASE_MS + at + queued
            out.append({
                "user": user, "action": action, "ts": BASE_MS + at + device,
                "sent_at": sent_true + device, "received_at": sent_true + network,
            })
        # Events arrive as the server receives them.
        return sorted(out, key=lambda e: e["received_at"])

    first = events(0)
    plain = [
        {"user": e["user"], "action": e["action"], "ts": e["ts"] + e["received_at"] - e["sent_at"]}
        for e in first
    ]
    unshifted = _run(CORRECTED, first, batch=batch)
    shifted = _run(CORRECTED, events(shift), batch=batch)
    reference = _run(PLAIN, plain, batch=batch)
    expected = _shape(reference)
    assert _shape(unshifted) == expected
    assert _shape(shifted) == expected
    late = [d["reason"] for d in reference.drain_dead_letters()]
    for engine in (unshifted, shifted):
        assert engine.stats.uncorrected == 0
        assert [d["reason"] for d in engine.drain_dead_letters()] == late


def _app(**fields: Any) -> dict[str, Any]:
    return {"user": "u1", "action": "view", **fields}


def test_event_time_is_corrected_and_the_device_time_kept() -> None:
    program = CORRECTED + (
        "rule viewed from app by user pattern v define v as action == \"view\"\n"
        "  emit v.ts as at, v.ts_device as device, v.ts_device < v.ts as behind\n"
    )
    for batch in (False, True):
        engine = _run(program, [_app(ts=BASE_MS, sent_at=BASE_MS + 10, received_at=NOW_MS)],
                      batch=batch)
        match, = engine.drain()
        assert match["values"] == {"at": NOW_MS - 10, "device": BASE_MS, "behind": True}
        assert match["start"] == "2025-12-31T23:59:59.990Z"
        assert engine.stats.uncorrected == 0


def test_the_watermark_follows_the_corrected_time() -> None:
    """A device two hours behind: its events are on time by the corrected time, and a later
    event behind the corrected watermark is late although its device time is ahead."""
    behind = 2 * 3_600_000
    events = [
        _app(action="login", ts=BASE_MS - behind, sent_at=BASE_MS - behind + 5,
             received_at=BASE_MS + 5),
        # another device, correct clock, 30 s later
        {"user": "u2", "action": "view", "ts": BASE_MS + 30_000},
        # the skewed device's buy: device time far behind the watermark, corrected on time
        _app(action="buy", ts=BASE_MS - behind + 31_000, sent_at=BASE_MS - behind + 31_005,
             received_at=BASE_MS + 31_005),
        # late by its corrected time (10 s behind 30 s - 5 s of lateness)
        _app(action="view", ts=BASE_MS + 10_000, sent_at=BASE_MS + 10_000,
             received_at=BASE_MS + 10_000),
    ]
    for batch in (False, True):
        engine = _run(CORRECTED, events, batch=batch)
        matches = engine.drain()
        assert [(m["name"], m["key"]) for m in matches] == [("login_buy", {"user": "u1"})]
        assert matches[0]["values"]["bought"] == BASE_MS + 31_000
        assert [d["reason"] for d in engine.drain_dead_letters()] == ["late"]
        assert (engine.stats.late, engine.stats.uncorrected) == (1, 1)  # u2's event


def test_events_without_sent_or_received_are_uncorrected_and_counted() -> None:
    events = [
        _app(action="login", ts=BASE_MS),  # neither
        _app(action="view", ts=BASE_MS + 1, sent_at=None, received_at=BASE_MS + 9),
        _app(action="view", ts=BASE_MS + 2, sent_at=BASE_MS + 2),  # no received
        _app(action="buy", ts=BASE_MS + 3, sent_at=BASE_MS + 3, received_at=BASE_MS + 3),
    ]
    for batch in (False, True):
        engine = _run(CORRECTED, events, batch=batch)
        match, = engine.drain()
        assert match["values"]["bought"] == BASE_MS + 3
        assert match["start"] == pd.Timestamp(BASE_MS, unit="ms", tz="UTC").strftime(
            "%Y-%m-%dT%H:%M:%S.000Z")
        assert engine.stats.uncorrected == 3
        assert engine.stats.bad == 0


def test_the_count_of_uncorrected_events_is_kept_across_a_checkpoint_restore() -> None:
    """As the engine's other counters (events, late, bad, ...): a resumed run goes on
    counting from what the snapshot held."""
    engine = Engine(now_ms=NOW_MS)
    engine.register(CORRECTED)
    engine.feed(_app(action="login", ts=BASE_MS))
    engine.feed(_app(action="view", ts=BASE_MS + 1, sent_at=BASE_MS + 1, received_at=None))
    engine.feed(_app(action="view", ts=BASE_MS + 2, sent_at=BASE_MS + 2,
                     received_at=BASE_MS + 2))
    restored = Engine(now_ms=NOW_MS)
    restored.register(CORRECTED)
    restored.restore(engine.snapshot())
    assert restored.stats.uncorrected == engine.stats.uncorrected == 2
    restored.feed(_app(action="buy", ts=BASE_MS + 3, received_at=BASE_MS + 3))
    assert restored.stats.uncorrected == 3


def test_bad_sent_or_received_values_are_dead_letters() -> None:
    program = CORRECTED.replace("sent_at int, received_at int", "sent_at timestamp, "
                                "received_at timestamp")
    events = [
        _app(ts=BASE_MS, sent_at="soon", received_at=BASE_MS),
        _app(ts=BASE_MS, sent_at=BASE_MS, received_at=True),
        # corrected more than `ahead 1d` past the wall clock
        _app(ts=BASE_MS, sent_at=BASE_MS, received_at=NOW_MS + 2 * 86_400_000),
        # a device time past the wall clock is fine once corrected
        _app(ts=NOW_MS + 5 * 86_400_000, sent_at=NOW_MS + 5 * 86_400_000, received_at=BASE_MS),
    ]
    for batch in (False, True):
        engine = _run(program, events, batch=batch)
        letters = engine.drain_dead_letters()
        assert [d["reason"] for d in letters] == [
            "bad_timestamp", "bad_timestamp", "too_far_ahead"
        ]
        assert "field 'sent_at'" in letters[0]["detail"]
        assert letters[2]["detail"].startswith("clock-corrected event time 2026-01-03T")
        assert (engine.stats.accepted, engine.stats.bad, engine.stats.uncorrected) == (1, 3, 0)


def test_row_and_frame_paths_agree_on_mixed_input() -> None:
    events = [
        _app(action="login", ts=BASE_MS + 7_000_000, sent_at=BASE_MS + 7_000_100,
             received_at=BASE_MS + 200),
        _app(action="buy", ts=BASE_MS + 300),
        _app(action="login", ts=None, sent_at=BASE_MS, received_at=BASE_MS),
        _app(action="buy", ts=BASE_MS + 7_010_000, sent_at=BASE_MS + 7_010_000,
             received_at=BASE_MS + 10_100),
    ]
    rows, frame = _run(CORRECTED, events), _run(CORRECTED, events, batch=True)
    assert _shape(rows) == _shape(frame)
    assert [(d["reason"], d["detail"]) for d in rows.drain_dead_letters()] == [
        (d["reason"], d["detail"]) for d in frame.drain_dead_letters()
    ]
    assert rows.stats == frame.stats


def test_vigil_run_corrects_and_reports(tmp_path) -> None:
    rules = tmp_path / "app.vigil"
    rules.write_text(CORRECTED)
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(json.dumps(e) for e in [
        _app(action="login", ts=BASE_MS - 3_600_000, sent_at=BASE_MS - 3_600_000,
             received_at=BASE_MS),
        _app(action="buy", ts=BASE_MS + 20_000),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", str(events),
         "--engine", "embedded", "--no-alerts", "--out", str(out)],
        capture_output=True, text=True, env={"VIGIL_NOW_MS": str(NOW_MS),
                                             "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    match, = [json.loads(line) for line in out.read_text().splitlines()]
    assert match["values"]["bought"] == BASE_MS + 20_000
    # the buy has neither a sent nor a received time: kept as it is, and said so
    assert "1 with their device's clock uncorrected" in done.stderr


def test_several_inputs_interleave_by_the_corrected_time(tmp_path) -> None:
    """``vigil run`` with two inputs merges their lines by event time: the corrected one."""
    rules = tmp_path / "app.vigil"
    rules.write_text(CORRECTED)
    phone = tmp_path / "phone.jsonl"
    server = tmp_path / "server.jsonl"
    # the phone is three hours behind: by device time its login would come first by far
    phone.write_text(json.dumps(_app(
        action="login", ts=BASE_MS - 3 * 3_600_000 + 50_000,
        sent_at=BASE_MS - 3 * 3_600_000 + 50_000, received_at=BASE_MS + 50_000,
    )) + "\n")
    server.write_text("".join(json.dumps(_app(action=a, ts=BASE_MS + t)) + "\n" for a, t in [
        ("view", 0), ("buy", 20_000), ("buy", 60_000), ("view", 200_000),
    ]))
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", f"app={phone}",
         "--events", f"app={server}", "--no-alerts", "--out", str(out)],
        capture_output=True, text=True, env={"VIGIL_NOW_MS": str(NOW_MS),
                                             "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    match, = [json.loads(line) for line in out.read_text().splitlines()]
    assert match["values"]["bought"] == BASE_MS + 60_000
    assert "0 late" in done.stderr
