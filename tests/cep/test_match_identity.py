"""Match ids never collide across runs, files and reused event ids, and a replay gives the same
ids (the scheme: :mod:`cep.events.identity`); the outbox never drops a different alert that
reuses an id."""

from __future__ import annotations

import json
import sqlite3

import pytest

from cep import Engine
from cep.alerts import Endpoint, Outbox, WebhookReceiver, new_secret
from cep.cli import main

RULES = """
stream txn (card_id string, amount float, ts timestamp) time ts
webhook fraud url "{url}" secret env TEST_IDENTITY_SECRET
rule big from txn by card_id pattern b define b as amount > 100 notify fraud
query huge from txn match amount:[500 TO *] notify fraud
metric spend from txn by card_id window tumbling 1h select count() as n notify fraud
"""

PROGRAM = """
stream txn (id string, card_id string, amount float, ts timestamp) time ts
rule big from txn by card_id pattern b define b as amount > 100
query huge from txn match amount:[500 TO *]
metric spend from txn by card_id window tumbling 1h select count() as n, sum(amount) as total
"""


def _event(ts: str, amount: float, card: str = "c1", **extra) -> dict:
    return {"card_id": card, "amount": amount, "ts": ts, **extra}


DAY1 = [_event("2026-01-01T10:00:00Z", 600.0), _event("2026-01-01T10:05:00Z", 5.0)]
DAY2 = [_event("2026-01-02T10:00:00Z", 700.0), _event("2026-01-02T10:05:00Z", 6.0)]


def _run(program: str, events: list[dict]) -> list[dict]:
    engine = Engine()
    engine.register(program)
    for event in events:
        engine.feed(event)
    engine.close()
    assert not engine.dead_letters()
    return engine.drain()


def _ids(matches: list[dict]) -> dict[str, list[str]]:
    by_kind: dict[str, list[str]] = {}
    for m in matches:
        if "match_id" in m and "reason" not in m:
            by_kind.setdefault(m["kind"], []).append(m["match_id"])
    return by_kind


def test_two_runs_over_inputs_without_ids_never_share_a_match_id() -> None:
    day1, day2 = _ids(_run(PROGRAM, DAY1)), _ids(_run(PROGRAM, DAY2))
    assert sorted(day1) == sorted(day2) == ["metric", "query", "rule"]
    for kind in day1:
        assert not set(day1[kind]) & set(day2[kind]), kind


def test_a_replay_of_the_same_input_gives_the_same_ids() -> None:
    assert _ids(_run(PROGRAM, DAY1)) == _ids(_run(PROGRAM, DAY1))


def test_different_events_reusing_one_id_give_different_match_ids() -> None:
    first = _ids(_run(PROGRAM, [_event("2026-01-01T10:00:00Z", 600.0, id="e1")]))
    other = _ids(_run(PROGRAM, [_event("2026-01-01T10:00:00Z", 650.0, id="e1")]))
    for kind in ("rule", "query"):
        assert first[kind] != other[kind], kind


def test_metric_results_of_one_window_from_two_runs_differ_when_their_values_do() -> None:
    one = _ids(_run(PROGRAM, [_event("2026-01-01T10:00:00Z", 1.0)]))["metric"]
    two = _ids(_run(PROGRAM, [_event("2026-01-01T10:10:00Z", 2.0)]))["metric"]
    assert one != two


def test_undeclared_fields_are_not_part_of_an_events_identity() -> None:
    plain = _ids(_run(PROGRAM, DAY1))
    noted = _ids(_run(PROGRAM, [dict(e, note="from another pipeline") for e in DAY1]))
    assert plain == noted


def test_vigil_run_on_day_two_delivers_its_alerts(tmp_path, monkeypatch, capsys) -> None:
    """The issue's case: day 1 and day 2 files without ids, one outbox: nothing dropped."""
    secret = new_secret()
    monkeypatch.setenv("TEST_IDENTITY_SECRET", secret)
    outbox = tmp_path / "outbox.sqlite"
    with WebhookReceiver((secret,)) as receiver:
        rules = tmp_path / "rules.vigil"
        rules.write_text(RULES.format(url=receiver.url), encoding="utf-8")
        counts = []
        for day, events in (("day1", DAY1), ("day2", DAY2), ("day1", DAY1)):
            path = tmp_path / f"{day}.jsonl"
            path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
            code = main(["run", str(rules), "--events", str(path), "--engine", "embedded",
                         "--out", str(tmp_path / f"{day}.out.jsonl"),
                         "--outbox", str(outbox), "--delivery-deadline", "10"])
            assert code == 0
            counts.append(len(receiver.webhook_ids))
        err = capsys.readouterr().err
    # day 1: rule + query + metric; day 2 the same again, under new ids; day 1 replayed: none
    assert counts == [3, 6, 6]
    assert len(set(receiver.webhook_ids)) == 6 and receiver.rejected == 0
    assert "reused a match_id" not in err


def _match(name: str, mid: str = "m1") -> dict:
    return {"kind": "rule", "name": name, "match_id": mid, "end": "2026-01-01T00:00:00.000Z"}


def test_the_outbox_keeps_a_different_match_under_a_used_id(tmp_path) -> None:
    ops = Endpoint("ops", "https://hooks.example.com/in", (new_secret(),))
    with Outbox(tmp_path / "o.sqlite") as outbox:
        assert outbox.enqueue(_match("a"), [ops]) == 1
        assert outbox.enqueue(_match("a"), [ops]) == 0  # the same match: a duplicate
        assert outbox.enqueue(_match("b"), [ops]) == 1  # another match, same id: kept
        assert outbox.enqueue(_match("b"), [ops]) == 0  # ... and its replay deduplicates
        ids = [m.msg_id for m in outbox.messages()]
        status = outbox.status()["ops"]
        assert outbox.conflicts == 1
    assert ids[0] == "m1" and ids[1].startswith("m1.") and len(ids) == 2
    assert (status.duplicates, status.conflicts) == (2, 1)


def test_a_match_fed_again_under_a_newer_registry_version_is_a_duplicate(tmp_path) -> None:
    """A followed run restarted from its checkpoint after the registry moved on feeds the
    events after the checkpoint again: their matches carry another registry_version but are
    the same matches, and alert nobody twice."""
    ops = Endpoint("ops", "https://hooks.example.com/in", (new_secret(),))
    with Outbox(tmp_path / "o.sqlite") as outbox:
        assert outbox.enqueue({**_match("a"), "registry_version": 3}, [ops]) == 1
        assert outbox.enqueue({**_match("a"), "registry_version": 4}, [ops]) == 0
        assert outbox.conflicts == 0 and len(outbox.messages()) == 1


def test_a_conflict_is_reported_by_vigil_run_and_alerts_status(tmp_path, monkeypatch,
                                                                capsys) -> None:
    secret = new_secret()
    monkeypatch.setenv("TEST_IDENTITY_SECRET", secret)
    outbox = tmp_path / "outbox.sqlite"
    rules = tmp_path / "rules.vigil"
    rules.write_text(RULES.format(url="http://127.0.0.1:9/down"), encoding="utf-8")
    events = tmp_path / "e.jsonl"
    events.write_text(json.dumps(DAY1[0]) + "\n", encoding="utf-8")
    args = ["run", str(rules), "--events", str(events), "--engine", "embedded",
            "--out", str(tmp_path / "out.jsonl"), "--outbox", str(outbox),
            "--delivery-deadline", "0"]
    assert main(args) == 0
    # Another producer put a different alert under the id of the rule match of this input.
    rule_id = next(json.loads(line)["match_id"]
                   for line in (tmp_path / "out.jsonl").read_text().splitlines()
                   if json.loads(line)["kind"] == "rule")
    with sqlite3.connect(outbox) as db:
        db.execute("UPDATE messages SET body = replace(body, '\"c1\"', '\"c9\"')"
                   " WHERE msg_id = ?", (rule_id,))
    capsys.readouterr()
    assert main(args) == 0
    assert "1 match(es) reused a match_id already in the outbox" in capsys.readouterr().err
    assert main(["alerts", "status", "--outbox", str(outbox)]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "conflicts" in header and row.split()[5] == "1"


def test_a_version_1_outbox_is_upgraded(tmp_path) -> None:
    path = tmp_path / "old.sqlite"
    with Outbox(path) as outbox:
        outbox.enqueue(_match("a"), [Endpoint("ops", "https://h.example.com", (new_secret(),))])
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE endpoints DROP COLUMN conflicts")
        db.execute("PRAGMA user_version=1")
    with Outbox(path) as outbox:
        assert outbox.status()["ops"].conflicts == 0
        assert [m.msg_id for m in outbox.messages()] == ["m1"]


@pytest.mark.parametrize("names", [None, ("card_id", "amount", "ts")])
def test_an_events_digest_depends_on_content_not_arrival(names) -> None:
    from cep.events.identity import event_digest

    fields = {"card_id": "c1", "amount": 5.0, "ts": 1000}
    assert event_digest("txn", 1000, fields, names) == event_digest(
        "txn", 1000, dict(reversed(fields.items())), names
    )
    assert event_digest("txn", 1000, fields, names) != event_digest("other", 1000, fields, names)
