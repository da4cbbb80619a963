"""Times that cannot be right (issue #19): an event time beyond the wall clock plus the
stream's ``ahead`` is a ``too_far_ahead`` dead letter that never moves the watermark, a time
outside the years an event time may have is a ``bad_timestamp``, and the dead letters name the
likely unit of an epoch number sent in the wrong one. Each case runs through the engine API
(one event at a time and a DataFrame at a time) and through ``vigil run``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep import Engine
from cep.cli import main
from cep.events.event import BadEventError, StreamSchema, parse_timestamp, time_column_ms
from cep.events.time_bounds import (
    DEFAULT_AHEAD_MS,
    LATEST_EVENT_MS,
    NOW_ENV,
    unit_hint,
    wall_clock_ms,
)
from query_lang import check_program, parse, print_module

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, in seconds
NOW_MS = (T0 + 3600) * 1000  # the wall clock of these tests: an hour later

SECONDS = """
stream txn (card_id string, amount float, ts int) time ts unit s lateness 5s
rule big from txn by card_id pattern b define b as amount > 100
"""


def _txn(card: str, amount: float, ts) -> dict:
    return {"card_id": card, "amount": amount, "ts": ts}


# Good events around one whose time is epoch milliseconds on a seconds stream: read as
# seconds it is year 57971. A rule matches it (amount > 100), so accepting it would format a
# match at that time; it is also far ahead of every other event, so accepting it would make
# every later event late.
MIXED = [
    _txn("c1", 500.0, T0),
    _txn("c2", 500.0, T0 * 1000 + 5),
    _txn("c3", 500.0, T0 + 10),
    _txn("c4", 5.0, T0 + 20),
    _txn("c5", 500.0, T0 + 30),
]


def _run(source: str, events: list[dict], *, batch: bool, now_ms: int | None = NOW_MS):
    engine = Engine(now_ms=now_ms)
    engine.register(source)
    if batch:
        engine.feed_batch(pd.DataFrame(events))
    else:
        for event in events:
            engine.feed(event)
    engine.close()
    return engine.drain(), engine.drain_dead_letters(), engine


@pytest.mark.parametrize("batch", [False, True], ids=["feed", "feed_batch"])
def test_epoch_ms_on_a_seconds_stream_is_too_far_ahead_and_stalls_nothing(batch):
    matches, dead, engine = _run(SECONDS, MIXED, batch=batch)
    [letter] = dead
    assert letter["reason"] == "too_far_ahead"
    assert letter["detail"] == (
        "event time 1767225600005 read as seconds is year 57971, more than `ahead 1d` past "
        "the wall clock 2026-01-01T01:00:00.000Z; it looks like epoch milliseconds: "
        "declare `unit ms`"
    )
    # the later good events were neither late nor lost: the bad one moved no watermark
    assert [(m["key"]["card_id"], m["start"]) for m in matches] == [
        ("c1", "2026-01-01T00:00:00.000Z"),
        ("c3", "2026-01-01T00:00:10.000Z"),
        ("c5", "2026-01-01T00:00:30.000Z"),
    ]
    assert engine.stats.late == 0


def test_vigil_run_reports_the_far_ahead_event_and_matches_the_rest(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(NOW_ENV, str(NOW_MS))
    rules = tmp_path / "txn.vigil"
    rules.write_text(SECONDS)
    events = tmp_path / "txn.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in MIXED))
    out, dead = tmp_path / "matches.jsonl", tmp_path / "dead.jsonl"
    code = main(["run", str(rules), "--events", str(events), "--out", str(out),
                 "--dead-letter", str(dead), "--engine", "embedded"])
    assert code == 0
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(m["key"]["card_id"] for m in matches) == ["c1", "c3", "c5"]
    [letter] = [json.loads(line) for line in dead.read_text().splitlines()]
    assert (letter["reason"], letter["line"]) == ("too_far_ahead", 2)
    assert "year 57971" in letter["detail"] and "declare `unit ms`" in letter["detail"]
    assert "0 late" in capsys.readouterr().err


def test_vigil_run_interleaves_inputs_past_a_far_ahead_event(tmp_path, monkeypatch, capsys):
    # Several inputs are merged by event time: a time too far ahead must not hold back the
    # rest of its input until the others are read (they would then make it late).
    monkeypatch.setenv(NOW_ENV, str(NOW_MS))
    rules = tmp_path / "txn.vigil"
    rules.write_text(SECONDS)
    first = [_txn("c1", 500.0, T0), _txn("c9", 500.0, "2099-01-01T00:00:00Z"),
             _txn("c2", 500.0, T0 + 60)]
    second = [_txn("c3", 500.0, T0 + 30), _txn("c4", 500.0, T0 + 300)]
    for name, rows in (("a", first), ("b", second)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dead = tmp_path / "dead.jsonl"
    code = main(["run", str(rules), "--events", f"txn={tmp_path / 'a.jsonl'}",
                 "--events", f"txn={tmp_path / 'b.jsonl'}", "--dead-letter", str(dead)])
    assert code == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(m["key"]["card_id"] for m in out) == ["c1", "c2", "c3", "c4"]
    assert [json.loads(line)["reason"] for line in dead.read_text().splitlines()] == [
        "too_far_ahead"
    ]


@pytest.mark.parametrize("batch", [False, True], ids=["feed", "feed_batch"])
def test_the_widest_ahead_still_refuses_times_that_cannot_be_right(batch):
    # 36,500d (a hundred years) is the longest duration the language takes.
    source = SECONDS.replace("unit s", "ahead 36500d").replace("ts int", "ts timestamp")
    events = [
        _txn("c1", 500.0, "2026-01-01T00:00:00Z"),
        _txn("c2", 500.0, "9999-12-31"),
        _txn("c3", 500.0, T0 * 1000),  # year 57971
        _txn("c4", 500.0, -10**15),  # year -31686769
        _txn("c5", 500.0, 1e300),  # a float whose product with the unit overflows
        _txn("c6", 500.0, "2026-01-01T00:00:10Z"),
    ]
    matches, dead, _ = _run(source, events, batch=batch)
    assert [m["key"]["card_id"] for m in matches] == ["c1", "c6"]
    assert [d["reason"] for d in dead] == [
        "too_far_ahead", "too_far_ahead", "bad_timestamp", "too_far_ahead"
    ]
    assert "`ahead 36500d`" in dead[0]["detail"]
    assert "year 57971" in dead[1]["detail"] and "declare `unit ms`" in dead[1]["detail"]
    assert "year -31686769" in dead[2]["detail"]
    assert "read as seconds is a year of 293 digits" in dead[3]["detail"]


@pytest.mark.parametrize("batch", [False, True], ids=["feed", "feed_batch"])
def test_times_past_8999_are_refused_even_when_the_wall_clock_is_there(batch):
    # Only a wall clock in the far future lets a time past 8999 within `ahead`: the absolute
    # bound still holds, so every time accepted prints, and so does an absence's deadline.
    source = """
    stream s (k string, kind string, ts timestamp) time ts
    rule unanswered from s by k pattern a !b
      define a as kind == "a", b as kind == "b" within 1d
    """
    events = [{"k": "x", "kind": "a", "ts": "8999-12-31T23:59:59.999Z"},
              {"k": "y", "kind": "a", "ts": "9000-01-01T00:00:00Z"},
              {"k": "z", "kind": "a", "ts": "9999-12-31"}]
    now = 253_402_214_400_000  # 9999-12-31
    matches, dead, _ = _run(source, events, batch=batch, now_ms=now)
    assert [(m["start"], m["end"]) for m in matches] == [
        ("8999-12-31T23:59:59.999Z", "9000-01-01T23:59:59.999Z")
    ]
    assert [d["reason"] for d in dead] == ["bad_timestamp", "bad_timestamp"]
    assert dead[1]["detail"] == (
        'event time "9999-12-31" is 9999-12-31T00:00:00.000Z, outside the years 1 to 8999 '
        "an event time may have"
    )


def test_other_timestamp_fields_may_hold_any_time_iso_8601_can_carry():
    source = """
    stream s (k string, until timestamp, ts timestamp) time ts
    rule r from s by k pattern a define a as k == "x" emit until
    """
    events = [{"k": "x", "until": "9999-12-31T23:59:59Z", "ts": T0},
              {"k": "x", "until": 10**12, "ts": T0 + 1}]
    matches, dead, _ = _run(source, events, batch=False)
    assert [m["values"]["until"] for m in matches] == [253_402_300_799_000]
    [letter] = dead
    assert letter["reason"] == "bad_timestamp"
    assert letter["detail"].startswith("field 'until': 1000000000000 read as seconds is year")


@pytest.mark.parametrize("batch", [False, True], ids=["feed", "feed_batch"])
def test_ahead_is_per_stream(batch):
    source = """
    stream near (k string, ts timestamp) time ts ahead 1h
    stream far (k string, ts timestamp) time ts
    rule r from near, far by k pattern a define a as k == "x"
    """
    two_hours_ahead = "2026-01-01T03:00:00Z"
    events = [{"stream": "near", "k": "x", "ts": two_hours_ahead},
              {"stream": "far", "k": "x", "ts": two_hours_ahead}]
    matches, dead, _ = _run(source, events, batch=batch)
    [letter] = dead
    assert (letter["reason"], letter["event"]["stream"]) == ("too_far_ahead", "near")
    assert letter["detail"] == (
        'event time "2026-01-01T03:00:00Z" is 2026-01-01T03:00:00.000Z, more than `ahead 1h` '
        "past the wall clock 2026-01-01T01:00:00.000Z"
    )
    assert [m["start"] for m in matches] == ["2026-01-01T03:00:00.000Z"]


@pytest.mark.parametrize("batch", [False, True], ids=["feed", "feed_batch"])
def test_epoch_seconds_on_a_ms_stream_are_late_with_the_likely_unit(batch):
    source = SECONDS.replace("unit s", "unit ms")
    events = [_txn("c1", 5.0, T0 * 1000), _txn("c2", 500.0, T0), _txn("c3", 500.0, T0 * 1000 + 1)]
    matches, dead, _ = _run(source, events, batch=batch)
    [letter] = dead
    assert letter["reason"] == "late"
    assert letter["detail"] == (
        "event time 1970-01-21T10:53:45.600Z is behind the watermark 2025-12-31T23:59:55.000Z; "
        "it looks like epoch seconds: drop `unit ms`"
    )
    assert [m["key"]["card_id"] for m in matches] == ["c3"]


def test_the_wall_clock_is_read_as_events_arrive_unless_fixed(monkeypatch):
    monkeypatch.delenv(NOW_ENV, raising=False)
    assert abs(wall_clock_ms() - pd.Timestamp.now(tz="UTC").value // 10**6) < 60_000
    monkeypatch.setenv(NOW_ENV, "2026-01-01T01:00:00Z")
    assert wall_clock_ms() == NOW_MS
    # an Engine without now_ms follows the variable: two hours ahead of it is too far ahead
    # for `ahead 1h`
    _, dead, _ = _run(SECONDS.replace("unit s", "ahead 1h"), [_txn("c", 1.0, T0 + 3 * 3600)],
                      batch=False, now_ms=None)
    assert [d["reason"] for d in dead] == ["too_far_ahead"]
    monkeypatch.setenv(NOW_ENV, "soon")
    with pytest.raises(Exception, match="VIGIL_NOW_MS must be epoch milliseconds"):
        wall_clock_ms()


def test_int64_times_that_would_wrap_when_scaled_are_refused_not_wrapped():
    decl, _ = parse(SECONDS).declarations
    schema = StreamSchema.from_decl(decl, now_ms=NOW_MS)
    frame = pd.DataFrame({"card_id": ["a", "b", "c"], "amount": [1.0, 1.0, 1.0],
                          "ts": np.array([T0, 2**62, -(2**62)], dtype=np.int64)})
    normalised, ts, bad = schema.normalise_frame(frame)
    assert ts.tolist() == [T0 * 1000]
    assert [(pos, reason) for pos, reason, _ in bad] == [(1, "too_far_ahead"),
                                                          (2, "bad_timestamp")]
    with pytest.raises(BadEventError, match="bad_timestamp"):
        parse_timestamp(2**62)


def test_the_time_column_of_the_spark_routing_has_no_time_where_the_time_cannot_be_right():
    column = pd.Series([T0, T0 * 1000, None, T0 + 1])
    times = time_column_ms(column, "ts", 1000, now_ms=NOW_MS)
    assert np.isnan(times).tolist() == [False, True, True, False]
    assert time_column_ms(column, "ts", 1000, now_ms=NOW_MS, ahead_ms=10**18)[1] != \
        time_column_ms(column, "ts", 1000, now_ms=NOW_MS)[1]


_INTS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=T0 - 10**6, max_value=T0 + 10**6),
    st.integers(min_value=T0 * 1000 - 10**9, max_value=T0 * 1000 + 10**9),
)
_TEXTS = st.sampled_from(
    ["9999-12-31", "0001-01-01T00:00:00Z", "2026-01-01T02:00:00Z", "2026-01-01", "soon"]
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.lists(_INTS, min_size=1, max_size=6),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=6),
    st.lists(_TEXTS, min_size=1, max_size=6),
    st.lists(st.one_of(_INTS, _TEXTS), min_size=1, max_size=6),
), st.sampled_from(["s", "ms"]))
def test_one_at_a_time_and_column_wise_agree_on_every_time(times, unit):
    # Columns of ints, floats or ISO text take the vectorised paths, mixed ones the row-wise
    # one: every path must give each row the same time, or the same dead letter.
    decl, _ = parse(SECONDS.replace("unit s", f"unit {unit} ahead 1h")).declarations
    schema = StreamSchema.from_decl(decl, now_ms=NOW_MS)
    rows = [_txn("c", 1.0, t) for t in times]
    one_by_one = []
    for row in rows:
        try:
            one_by_one.append(schema.normalise(row, seq=0, position=0).ts)
        except BadEventError as exc:
            one_by_one.append((exc.reason, exc.detail))
    normalised, ts, bad = schema.normalise_frame(pd.DataFrame(rows))
    column_wise: list = [None] * len(rows)
    for pos, reason, detail in bad:
        column_wise[pos] = (reason, detail)
    for pos, value in zip(np.flatnonzero([c is None for c in column_wise]), ts.tolist(),
                          strict=True):
        column_wise[pos] = value
    assert column_wise == one_by_one


def test_unit_hints_name_a_reading_that_lands_in_a_plausible_time():
    assert unit_hint(T0 * 10**6, 1000, NOW_MS).endswith("epoch microseconds: send milliseconds "
                                                        "(`unit ms`) or seconds")
    assert unit_hint(T0 * 10**9, 1, NOW_MS).startswith("; it looks like epoch nanoseconds")
    assert unit_hint(5, 1) == "" and unit_hint(True, 1000) == ""
    assert DEFAULT_AHEAD_MS == 86_400_000 and LATEST_EVENT_MS == 221_845_391_999_999


# ---------------------------------------------------------------------- the language


def test_ahead_round_trips_through_vigil_format(tmp_path, capsys):
    text = "stream s (\n  at int\n) time at unit ms lateness 5s ahead 90m id at\n"
    path = tmp_path / "s.vigil"
    path.write_text(text)
    assert main(["format", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed == text
    [decl] = parse(printed).declarations
    assert decl.ahead.ms == 90 * 60_000
    assert print_module(parse(printed)) == printed


@pytest.mark.parametrize(("text", "message"), [
    ("stream s (a int) ahead 1h", "'ahead' needs a 'time' field"),
    ("stream s (ts timestamp) time ts ahead 0s", "'ahead' must be longer than zero"),
])
def test_ahead_is_checked(text, message):
    _, errors = check_program(text=text)
    assert [e.message for e in errors] == [message]


def test_ahead_twice_is_a_syntax_error():
    _, errors = check_program(text="stream s (ts timestamp) time ts ahead 1h ahead 2h")
    assert [e.message for e in errors] == ["stream 's' sets 'ahead' twice"]


def test_vigil_check_warns_of_an_epoch_number_time_field_without_unit(tmp_path, capsys):
    path = tmp_path / "w.vigil"
    path.write_text("stream a (at int) time at\nstream b (at float) time at unit ms\n"
                    "stream c (at float) time at unit s\nstream d (at timestamp) time at\n")
    assert main(["check", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("ok: 1 file(s)")
    assert captured.err.splitlines() == [
        f"{path}:1:11: warning: stream 'a' reads its time field 'at' (int) as epoch seconds: "
        "say so with `unit s`, or declare `unit ms` if it holds milliseconds",
        "  stream a (at int) time at",
        "            ^",
    ]
