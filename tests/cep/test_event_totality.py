"""Every event path is total: whatever one line holds, ``vigil run`` (embedded) and the
``Engine`` report a match, a dead letter with its reason, or nothing else, and never stop.

Each case puts one bad line after 5,000 good events and before more: the run exits 0, writes
the good events' matches (the same as a run without the bad line) and the bad line's dead
letter, and counts every line once."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from cep.cli import main
from cep.engine import Engine
from cep.events.event import BadEventError, checked_value, parse_json_line
from cep.events.limits import MAX_EVENT_BYTES, MAX_EVENT_DEPTH, decode_line, nesting_depth

RULES = """
stream txn (id string, card_id string, amount float, merchant string, ts timestamp)
  time ts lateness 30s

rule big from txn by card_id pattern b define b as amount > 500

query m1 from txn match merchant:m1

query nested from txn match n:2 AND n.k:v
"""
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
GOOD_BEFORE, GOOD_AFTER = 5_000, 300


def good_event(i: int) -> dict:
    return {
        "id": f"e{i}", "card_id": f"c{i % 7}", "amount": 900.0 if i % 11 == 0 else 2.5,
        "merchant": f"m{i % 3}", "ts": T0 + i,
    }


def _line(fields: str, i: int = GOOD_BEFORE) -> bytes:
    """A line of event ``i`` with ``fields`` (JSON text) added."""
    text = json.dumps(good_event(i))
    return (text[:-1] + ", " + fields + "}").encode("utf-8")


DEEP = "[" * 1_000 + "]" * 1_000

#: (id, the bad line, its dead letter's reason)
BAD_LINES = [
    ("deep", _line(f'"n": {DEEP}'), "too_deep"),
    ("deep-object", _line('"n": ' + '{"a": ' * 70 + "1" + "}" * 70), "too_deep"),
    ("infinity", _line('"amount": Infinity').replace(b'"amount": 2.5, ', b""), "non_finite"),
    ("minus-infinity", _line('"x": -Infinity'), "non_finite"),
    ("nan", _line('"x": [1, NaN]'), "non_finite"),
    ("overflow", _line('"x": 1e400'), "non_finite"),
    ("huge-integer", _line('"x": 1' + "0" * 400), "non_finite"),
    ("invalid-utf8", _line('"note": "caf_"').replace(b"caf_", b"caf\xe9"), "invalid_utf8"),
    ("lone-surrogate", _line('"note": "\\ud800"'), "invalid_utf8"),
    ("too-large", _line('"note": "' + "x" * MAX_EVENT_BYTES + '"'), "too_large"),
]


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "p.vigil"
    path.write_text(RULES)
    return path


def _events(bad: bytes | None) -> list[bytes]:
    lines = [json.dumps(good_event(i)).encode() for i in range(GOOD_BEFORE)]
    if bad is not None:
        lines.append(bad)
    lines.extend(json.dumps(good_event(i)).encode()
                 for i in range(GOOD_BEFORE + 1, GOOD_BEFORE + 1 + GOOD_AFTER))
    return lines


def _strict_json(line: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def _run(tmp_path, rules, lines: list[bytes], capsys) -> tuple[list[dict], list[dict], str]:
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    out, dead = tmp_path / "out.jsonl", tmp_path / "dead.jsonl"
    code = main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(out), "--dead-letter", str(dead)])
    err = capsys.readouterr().err
    assert code == 0, err
    # Output is JSON, always: no bare NaN or Infinity, valid UTF-8.
    matches = [_strict_json(line) for line in out.read_text("utf-8").splitlines()]
    letters = [_strict_json(line) for line in dead.read_text("utf-8").splitlines()]
    return matches, letters, err


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, rules):
    engine = Engine()
    engine.register(RULES)
    for line in _events(None):
        engine.feed(json.loads(line))
    engine.close()
    return sorted(m["match_id"] for m in engine.drain())


@pytest.mark.parametrize(("bad", "reason"), [c[1:] for c in BAD_LINES],
                         ids=[c[0] for c in BAD_LINES])
def test_vigil_run_dead_letters_the_bad_line_and_keeps_going(
    tmp_path, rules, baseline, capsys, bad, reason
) -> None:
    lines = _events(bad)
    matches, letters, err = _run(tmp_path, rules, lines, capsys)
    assert sorted(m["match_id"] for m in matches) == baseline
    [letter] = letters
    assert (letter["reason"], letter["line"]) == (reason, GOOD_BEFORE + 1)
    assert letter["raw"] is not None and "\x00" not in letter["raw"]
    # every line counted once: received = good + dead-lettered (+ late: none here)
    assert f"vigil run: {len(lines)} event(s)" in err
    assert ", 0 late, 1 bad" in err


def test_invalid_utf8_is_shown_with_its_bytes_escaped(tmp_path, rules, capsys) -> None:
    bad = {case: line for case, line, _ in BAD_LINES}["invalid-utf8"]
    _, [letter], _ = _run(tmp_path, rules, _events(bad), capsys)
    assert "caf\\xe9" in letter["raw"] and "\ufffd" not in letter["raw"]
    assert letter["detail"].startswith("the line is not valid UTF-8")


def test_the_dead_letter_names_the_field_holding_a_non_finite_number() -> None:
    with pytest.raises(BadEventError) as caught:
        parse_json_line('{"a": 1, "b": {"c": [2, -Infinity]}}')
    assert caught.value.reason == "non_finite"
    assert caught.value.detail == "field 'b.c[1]' holds -Infinity, which no JSON number is"
    with pytest.raises(BadEventError, match="field 'x' holds 1e400, beyond the range"):
        parse_json_line('{"x": 1e400}')


def test_a_list_of_lists_is_searched_as_one_list(tmp_path, rules, capsys) -> None:
    """The percolator flattens nested lists (and lists of objects) as Elasticsearch does, so
    the event is good: its matches are reported, and no line is dead-lettered."""
    odd = _line('"n": [[1, [2]], [{"k": "v"}]]')
    lines = _events(odd)
    matches, letters, err = _run(tmp_path, rules, lines, capsys)
    assert letters == []
    odd_id = f"e{GOOD_BEFORE}"
    assert [m["name"] for m in matches if m.get("document_id") == odd_id] == ["nested"]
    assert f"vigil run: {len(lines)} event(s)" in err and ", 0 bad" in err


def test_vigil_run_reads_stdin_bytes_too(rules, capsys, monkeypatch) -> None:
    import io
    import sys

    lines = [json.dumps(good_event(0)).encode(), b'{"id": "x\xff"}', b"   ",
             json.dumps(good_event(11)).encode()]
    stdin = io.TextIOWrapper(io.BytesIO(b"\n".join(lines) + b"\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["run", str(rules), "--events", "-", "--engine", "embedded"]) == 0
    err = capsys.readouterr().err
    assert "3 event(s)" in err and "1 bad" in err


def test_a_run_with_an_outbox_survives_a_non_finite_amount(tmp_path, capsys, monkeypatch):
    """An Infinity amount used to reach the outbox as a match value and stop the run."""
    monkeypatch.setenv("TEST_TOTALITY_SECRET", "whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHg=")
    rules = tmp_path / "alerting.vigil"
    rules.write_text(RULES + 'webhook fraud url "http://127.0.0.1:9/hook" secret env '
                     "TEST_TOTALITY_SECRET\n"
                     "rule huge from txn by card_id pattern b define b as amount > 1000 "
                     "notify fraud\n")
    events = tmp_path / "events.jsonl"
    lines = [_line('"amount": Infinity').replace(b'"amount": 2.5, ', b""),
             json.dumps({**good_event(1), "amount": 5000.0}).encode()]
    events.write_bytes(b"\n".join(lines) + b"\n")
    code = main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(tmp_path / "out.jsonl"), "--outbox", str(tmp_path / "o.sqlite"),
                 "--delivery-deadline", "0"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "1 queued" in err and "1 bad" in err


# ---------------------------------------------------------------------- Engine.feed


def _deep_list(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


#: (id, the bad event as a dict, its dead letter's reason); dicts need no parsing, so a line's
#: text problems (UTF-8, size) are fed with feed_record below.
BAD_EVENTS = [
    ("deep", {"n": _deep_list(1_000)}, "too_deep"),
    ("infinity", {"amount": math.inf}, "non_finite"),
    ("minus-infinity-undeclared", {"x": -math.inf}, "non_finite"),
    ("nan-in-a-list", {"x": [1.0, math.nan]}, "non_finite"),
    ("huge-integer", {"amount": 10**400}, "non_finite"),
]


def _feed_all(engine: Engine, bad_feed) -> None:
    for i in range(GOOD_BEFORE):
        engine.feed(good_event(i), position=i)
    bad_feed(engine)
    for i in range(GOOD_BEFORE + 1, GOOD_BEFORE + 1 + GOOD_AFTER):
        engine.feed(good_event(i), position=i)
    engine.close()


def _check_engine(engine: Engine, baseline: list[str], reason: str | None) -> None:
    assert sorted(m["match_id"] for m in engine.drain()) == baseline
    letters = engine.dead_letters()
    assert [d["reason"] for d in letters] == ([reason] if reason else [])
    stats = engine.stats
    assert stats.events == GOOD_BEFORE + 1 + GOOD_AFTER
    assert stats.accepted + stats.late + stats.bad == stats.events
    json.dumps(letters, allow_nan=False)  # a dead letter is JSON too


@pytest.mark.parametrize(("extra", "reason"), [c[1:] for c in BAD_EVENTS],
                         ids=[c[0] for c in BAD_EVENTS])
def test_engine_feed_dead_letters_a_bad_event_and_keeps_going(baseline, extra, reason) -> None:
    engine = Engine()
    engine.register(RULES)
    _feed_all(engine, lambda e: e.feed({**good_event(GOOD_BEFORE), **extra},
                                       position=GOOD_BEFORE))
    _check_engine(engine, baseline, reason)


@pytest.mark.parametrize(("bad", "reason"), [c[1:] for c in BAD_LINES],
                         ids=[c[0] for c in BAD_LINES])
def test_engine_feed_record_dead_letters_a_bad_line(baseline, bad, reason) -> None:
    engine = Engine()
    engine.register(RULES)
    _feed_all(engine, lambda e: e.feed_record(decode_line(bad), line=GOOD_BEFORE + 1,
                                              position=GOOD_BEFORE))
    _check_engine(engine, baseline, reason)
    assert "\x00" not in engine.dead_letters()[0]["raw"]


def test_engine_feed_takes_a_list_of_lists() -> None:
    engine = Engine()
    engine.register(RULES)
    engine.feed({**good_event(1), "n": [[1, 2]], "o": [{"k": [["v"]]}]})
    engine.feed({**good_event(2), "n": [[1, 2], [{"k": "v"}]]})
    engine.close()
    assert [m["name"] for m in engine.drain()] == ["m1", "nested"]
    assert engine.dead_letters() == []


def test_engine_feed_batch_dead_letters_infinities_in_any_float_column() -> None:
    import numpy as np
    import pandas as pd

    engine = Engine()
    engine.register(RULES)
    frame = pd.DataFrame([good_event(i) for i in range(4)])
    frame.loc[1, "amount"] = np.inf
    frame["extra"] = [1.0, 2.0, -np.inf, np.nan]
    engine.feed_batch(frame)
    engine.close()
    letters = engine.dead_letters()
    assert [(d["reason"], d["detail"]) for d in letters] == [
        ("non_finite", "field 'amount' holds inf, which no JSON number is"),
        ("non_finite", "field 'extra' holds -inf, which no JSON number is"),
    ]
    assert engine.stats.accepted == 2  # NaN is pandas' missing value: null, not a dead letter
    json.dumps(letters, allow_nan=False)


def test_a_too_deep_event_becomes_a_dead_letter_that_can_be_written() -> None:
    engine = Engine()
    engine.register(RULES)
    engine.feed({**good_event(0), "amount": _deep_list(2_000)})  # a declared field
    engine.close()
    [letter] = engine.dead_letters()
    assert letter["reason"] == "wrong_type"
    assert json.dumps(letter)  # rendered to the depth limit, not recursing without end


# ---------------------------------------------------------------------- the limits


def test_the_limits_are_exact() -> None:
    at_limit = "[" * (MAX_EVENT_DEPTH - 1) + "]" * (MAX_EVENT_DEPTH - 1)
    assert parse_json_line('{"n": ' + at_limit + "}")
    with pytest.raises(BadEventError, match="nests 65 levels"):
        parse_json_line('{"n": [' + at_limit + "]}")
    # brackets inside strings do not count
    assert nesting_depth('{"n": "' + "[" * 500 + '"}') == 1
    assert parse_json_line('{"n": "' + "[" * 500 + '"}')
    filler = MAX_EVENT_BYTES - len('{"n": ""}')
    assert parse_json_line('{"n": "' + "x" * filler + '"}')
    with pytest.raises(BadEventError, match="too_large"):
        parse_json_line('{"n": "' + "x" * (filler - 1) + 'é"}')  # é takes two bytes
    with pytest.raises(BadEventError, match="too_deep"):
        checked_value(_deep_list(MAX_EVENT_DEPTH), "n")
    assert checked_value(_deep_list(MAX_EVENT_DEPTH - 1), "n")


def test_a_missing_key_is_reported_for_the_events_a_rule_could_take_on_every_path() -> None:
    # "e1" has no key and amount > 500: the rule would take it (missing_key). "e2" has no key
    # either but no condition takes it: nothing to report. Row by row and column-wise agree,
    # and the keyless events still reach the query.
    rows = [
        {"id": "e0", "card_id": "c", "amount": 900.0, "merchant": "m1", "ts": T0},
        {"id": "e1", "amount": 900.0, "merchant": "m1", "ts": T0 + 1},
        {"id": "e2", "amount": 2.5, "merchant": "m1", "ts": T0 + 2},
    ]
    results = []
    for batch in (False, True):
        engine = Engine()
        engine.register(RULES)
        if batch:
            engine.feed_batch(pd.DataFrame(rows))
        else:
            for row in rows:
                engine.feed(row)
        engine.close()
        letters = [(d["reason"], d["event"]["id"]) for d in engine.dead_letters()]
        stats = engine.stats
        results.append((letters, stats.accepted, stats.bad, stats.unkeyed, stats.matches))
    assert results[0] == results[1]
    assert results[0][:4] == ([("missing_key", "e1")], 3, 0, 1)
    assert results[0][4]["m1"] == 3 and results[0][4]["big"] == 1
