"""Matches to webhooks through the outbox: notify, throttle, secrets, and `vigil alerts`."""

from __future__ import annotations

import pytest

from cep.alerts import AlertConfigError, WebhookReceiver, new_secret
from cep.alerts.routing import AlertSink, endpoints_from_program
from cep.cli import main
from query_lang import load_program

RULES = """
stream txn (card_id string, amount float, ts timestamp) time ts
webhook fraud url "{url}" secret env TEST_FRAUD_SECRET
rule big from txn by card_id pattern b define b as amount > 100 notify fraud throttle 10m
rule quiet from txn by card_id pattern q define q as amount < 0
"""


def match(name, card, end, mid):
    return {"kind": "rule", "name": name, "version": 1, "match_id": mid,
            "key": {"card_id": card}, "events": {"b": [1]}, "values": {},
            "start": end, "end": end, "severity": "medium"}


@pytest.fixture
def secret():
    return new_secret()


def test_sink_delivers_signed_throttled_alerts_once(tmp_path, secret):
    with WebhookReceiver((secret,)) as receiver:
        program = load_program(text=RULES.format(url=receiver.url))
        env = {"TEST_FRAUD_SECRET": secret}
        outbox_path = str(tmp_path / "out" / "outbox.sqlite")
        sink = AlertSink.open(program, outbox_path, env)
        assert sink.submit(match("big", "c1", "2026-01-01T00:00:00Z", "m1"))
        # same key within 10 minutes of event time: throttled
        assert not sink.submit(match("big", "c1", "2026-01-01T00:05:00Z", "m2"))
        # another key, and the first key after the interval: delivered
        assert sink.submit(match("big", "c2", "2026-01-01T00:05:00Z", "m3"))
        assert sink.submit(match("big", "c1", "2026-01-01T00:11:00Z", "m4"))
        # no notify: not enqueued
        assert not sink.submit(match("quiet", "c1", "2026-01-01T00:00:00Z", "m5"))
        assert sink.throttled == 1
        result = sink.drain(deadline_s=10)
        assert result.delivered == 3 and result.pending == 0
        sink.close()
        assert sorted(receiver.webhook_ids) == ["m1", "m3", "m4"]

        # a rerun over the same matches delivers no new webhook-id
        again = AlertSink.open(program, outbox_path, env)
        for card, end, mid in (("c1", "2026-01-01T00:00:00Z", "m1"),
                               ("c2", "2026-01-01T00:05:00Z", "m3"),
                               ("c1", "2026-01-01T00:11:00Z", "m4")):
            again.submit(match("big", card, end, mid))
        again.drain(deadline_s=10)
        again.close()
        assert sorted(set(receiver.webhook_ids)) == ["m1", "m3", "m4"]
        # the receiver verified every signature and saw no duplicates it had to drop twice
        assert receiver.rejected == 0
        assert receiver.alerts[0].data["name"] == "big"


def test_missing_secret_names_webhook_and_variable(secret):
    program = load_program(text=RULES.format(url="http://127.0.0.1:9/x"))
    with pytest.raises(AlertConfigError, match=r"'fraud' .* \$TEST_FRAUD_SECRET"):
        endpoints_from_program(program, env={})


def test_alerts_cli_status_replay_and_log(tmp_path, secret, capsys, monkeypatch):
    rules = tmp_path / "r.vigil"
    with WebhookReceiver((secret,)) as receiver:
        rules.write_text(RULES.format(url=receiver.url))
        program = load_program([str(rules)])
        outbox = str(tmp_path / "o.sqlite")
        sink = AlertSink.open(program, outbox, {"TEST_FRAUD_SECRET": secret})
        sink.submit(match("big", "c1", "2026-01-01T00:00:00Z", "m1"))
        sink.close()
        monkeypatch.setenv("TEST_FRAUD_SECRET", secret)
        assert main(["alerts", "status", "--outbox", outbox]) == 0
        assert "fraud" in capsys.readouterr().out
        assert main(["alerts", "drain", str(rules), "--outbox", outbox, "--deadline", "10"]) == 0
        assert "delivered 1" in capsys.readouterr().out
        assert main(["alerts", "replay", "--since", "2000-01-01", "--outbox", outbox]) == 0
        assert "queued 1" in capsys.readouterr().out
        assert main(["alerts", "drain", str(rules), "--outbox", outbox]) == 0
        assert receiver.webhook_ids.count("m1") >= 1 and set(receiver.webhook_ids) == {"m1"}
        assert main(["alerts", "log", "--outbox", outbox]) == 0
        log = capsys.readouterr().out
        assert '"msg_id": "m1"' in log and secret not in log
    assert main(["alerts", "status", "--outbox", str(tmp_path / "none.sqlite")]) == 2


EVENTS = "".join(
    f'{{"card_id": "c{i}", "amount": {amount}, "ts": {1_767_225_600 + i}}}\n'
    for i, amount in enumerate([500.0, 5.0, 700.0])
)


def _run(tmp_path, *flags):
    rules, events = tmp_path / "r.vigil", tmp_path / "e.jsonl"
    events.write_text(EVENTS)
    return main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(tmp_path / "m.jsonl"), *flags])


def test_vigil_run_delivers_notify_alerts_by_default(tmp_path, secret, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_FRAUD_SECRET", secret)
    with WebhookReceiver((secret,)) as receiver:
        (tmp_path / "r.vigil").write_text(RULES.format(url=receiver.url))
        assert _run(tmp_path) == 0
        err = capsys.readouterr().err
        assert "go through the outbox .vigil/outbox.sqlite" in err
        assert "alerts: 2 queued, 0 delivered" not in err and "2 delivered" in err
        assert len(set(receiver.webhook_ids)) == 2 and receiver.rejected == 0
        # a rerun over the same events queues nothing new: the ids are the same
        assert _run(tmp_path) == 0
        assert "alerts: 0 queued" in capsys.readouterr().err
        assert len(receiver.webhook_ids) == 2
    assert main(["alerts", "status", "--outbox", ".vigil/outbox.sqlite"]) == 0


def test_no_alerts_and_a_missing_secret_are_said(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TEST_FRAUD_SECRET", raising=False)
    (tmp_path / "r.vigil").write_text(RULES.format(url="http://127.0.0.1:9/hook"))
    assert _run(tmp_path, "--no-alerts") == 0
    err = capsys.readouterr().err
    assert "--no-alerts: the matches of big are written but not delivered" in err
    assert not (tmp_path / ".vigil").exists()
    # no secret: the run goes on, says which webhook is left out and how many alerts
    assert _run(tmp_path) == 0
    err = capsys.readouterr().err
    assert "$TEST_FRAUD_SECRET, which is not set: its alerts will not be delivered" in err
    assert "2 alert(s) not delivered: no secret for fraud" in err
    assert (tmp_path / "m.jsonl").read_text().count('"name":"big"') == 2
    # asked for explicitly, the outbox refuses to run without it
    assert _run(tmp_path, "--outbox", str(tmp_path / "o.sqlite")) == 1
    assert "which is not set" in capsys.readouterr().err


def test_webhook_url_sends_a_webhook_elsewhere(tmp_path, secret, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_FRAUD_SECRET", secret)
    # declared on a port nothing listens on; the run sends to the receiver instead
    (tmp_path / "r.vigil").write_text(RULES.format(url="http://127.0.0.1:9/hook"))
    with WebhookReceiver((secret,)) as receiver:
        assert _run(tmp_path, "--webhook-url", f"fraud={receiver.url}hook") == 0
        assert "2 delivered" in capsys.readouterr().err
        assert len(set(receiver.webhook_ids)) == 2 and receiver.rejected == 0
    assert _run(tmp_path, "--webhook-url", "ops=http://127.0.0.1:9/") == 2
    assert ("vigil run: --webhook-url: no webhook ops is declared (declared: fraud)"
            in capsys.readouterr().err)
    assert _run(tmp_path, "--webhook-url", "fraud") == 2
    assert "--webhook-url fraud: expected NAME=URL" in capsys.readouterr().err
    assert _run(tmp_path, "--webhook-url", "fraud=ftp://x/") == 1
    assert "must be http(s)://host/" in capsys.readouterr().err
