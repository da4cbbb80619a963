"""Live changes through the service: a rule registered, replaced and deleted while events flow,
every match carrying the registry version that made it, the other rules untouched; state kept
across an engine rebuild; alerts delivered; matches followed as Server-Sent Events."""

from __future__ import annotations

import json
import time

import httpx
from service_support import STREAM, lines, rule, txn

from cep.alerts import WebhookReceiver, new_secret
from cep.engine import Engine
from cep.registry import Registry

PROBE = ("rule probe from txn by card pattern s b within 1h "
         "define s as amount < 1, b as amount > 500\n")


def test_register_replace_delete_while_events_flow(api):
    assert api.put("big", STREAM + rule("big", "amount > 100")).status_code == 201
    assert api.put("other", rule("other", "amount < 10")).status_code == 201  # version 2
    batches = [
        lines(txn("c1", 500, 0), txn("c2", 5, 1)),
        lines(txn("c1", 500, 2), txn("c1", 5000, 3), txn("c3", 1, 4)),
        lines(txn("c1", 5000, 5), txn("c4", 2, 6)),
    ]
    assert api.post(batches[0]).json()["registry_version"] == 2
    [first] = api.matches(name="big")
    assert (first["registry_version"], first["events"]) == (2, {"b": [0]})

    assert api.put("big", rule("big", "amount > 1000")).json()["registry_version"] == 3
    assert api.post(batches[1]).json()["registry_version"] == 3
    big = api.matches(name="big")
    assert [(m["registry_version"], m["values"]["card"]) for m in big] == [(2, "c1"), (3, "c1")]
    assert big[-1]["events"] == {"b": [3]}  # the 500 no longer matches; the 5000 does

    assert api.client.delete("/queries/big", headers=api.w).json()["registry_version"] == 4
    assert api.post(batches[2]).json()["registry_version"] == 4
    assert len(api.matches(name="big")) == 2  # deleted: nothing from the last batch

    # The other rule saw every event as if nothing else had changed.
    alone = Engine()
    alone.register(STREAM + rule("other", "amount < 10"))
    for batch in batches:
        for line in batch.decode().splitlines():
            alone.feed_record(line)
    expected = [m["match_id"] for m in alone.drain()]
    assert [m["match_id"] for m in api.matches(name="other")] == expected
    assert api.service.registry.store.applied()["serve"][0] == 4


def test_partial_matches_survive_a_rebuild_and_a_changed_stream_starts_fresh(api):
    api.put("probe", STREAM + PROBE)
    api.put("vip", 'list vip ("a")\n')
    api.post(lines(txn("c1", 0.5, 0)))  # a probe starts on c1
    api.put("vip", 'list vip ("a", "b")\n', wait="true")  # a list replaced: the engine rebuilds
    assert api.post(lines(txn("c1", 900, 60))).json()["matches"] == 1

    api.post(lines(txn("c2", 0.5, 120)))  # another starts on c2
    wider = STREAM.replace("ts timestamp", "ts timestamp, shop string")
    assert api.put("txn", wider, wait="true").json()["status"] == "replaced"
    # probe reads the changed stream: it starts fresh, without c2's partial match
    assert api.post(lines(txn("c2", 900, 180))).json()["matches"] == 0
    assert [m["registry_version"] for m in api.matches(name="probe")] == [3]


def test_alerts_of_notify_rules_are_delivered_and_reported(api_factory):
    secret = new_secret()
    with WebhookReceiver(secret) as receiver:
        api = api_factory(env={"OPS_SECRET": secret})
        hook = f'webhook ops url "{receiver.url}" secret env OPS_SECRET\n'
        assert api.put("ops", hook).status_code == 201
        api.put("big", STREAM + rule("big", "amount > 100", notify="ops"))
        answer = api.post(lines(txn("c1", 500, 0), txn("c1", 5, 1)))
        assert answer.json()["matches"] == 1
        [match] = api.matches()
        give_up = time.monotonic() + 20
        while receiver.webhook_ids != [match["match_id"]] and time.monotonic() < give_up:
            time.sleep(0.05)
        assert receiver.webhook_ids == [match["match_id"]]
        while time.monotonic() < give_up:
            status = api.client.get("/alerts", headers=api.r).json()
            if status["endpoints"] and status["endpoints"][0]["delivered"] == 1:
                break
            time.sleep(0.05)
        [ops] = status["endpoints"]
        assert (ops["endpoint"], ops["pending"], ops["delivered"], ops["failed"]) == (
            "ops", 0, 1, 0)
        assert ops["breaker"] == "closed" and status["enqueued"] == 1
        assert secret not in json.dumps(status)


def _sse(lines_, count: int) -> list[dict]:
    """The next ``count`` events of a stream's lines: their id, event and data."""
    events, current = [], {}
    for line in lines_:
        if not line:
            if "data" in current:
                events.append(current)
                if len(events) == count:
                    return events
            current = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(": ")
            current[field] = value
    raise AssertionError("the stream ended")


def test_a_client_following_matches_sees_one_posted_after_it_connected(live_factory):
    server, w, r = live_factory()
    with httpx.Client(base_url=server.url, timeout=20) as client:
        client.put("/queries/big", content=STREAM + rule("big", "amount > 100"), headers=w)
        client.post("/events", content=lines(txn("c0", 500, 0)), headers=w)  # before: not sent
        with client.stream("GET", "/matches/stream", headers=r) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines_ = stream.iter_lines()
            assert next(lines_) == "retry: 2000"  # connected
            client.post("/events", content=lines(txn("c1", 500, 1)), headers=w)
            [event] = _sse(lines_, 1)
        match = json.loads(event["data"])
        assert (event["event"], event["id"]) == ("match", "2")
        assert (match["cursor"], match["values"]["card"], match["registry_version"]) == (
            2, "c1", 1)
        # Resumed with Last-Event-ID: what came after it, nothing before.
        client.post("/events", content=lines(txn("c2", 500, 2), txn("c3", 500, 3)), headers=w)
        with client.stream("GET", "/matches/stream",
                           headers={**r, "Last-Event-ID": "2"}) as stream:
            events = _sse(stream.iter_lines(), 2)
        assert [e["id"] for e in events] == ["3", "4"]
        client.post("/events", content=b"{oops\n", headers=w)
        with client.stream("GET", "/dead-letters/stream", headers=r,
                           params={"after": 0}) as stream:
            [letter] = _sse(stream.iter_lines(), 1)
        assert letter["event"] == "dead_letter"
        assert json.loads(letter["data"])["reason"] == "invalid_json"
        assert client.get("/matches/stream").status_code == 401


def test_a_change_pushed_by_another_process_is_applied(api, tmp_path):
    api.put("big", STREAM + rule("big", "amount > 100"), wait="true")
    (tmp_path / "small.vigil").write_text(rule("small", "amount < 1"))
    with Registry(str(tmp_path / "registry.sqlite")) as other:  # as `vigil registry push`
        other.push([str(tmp_path / "small.vigil")], author="cli")
    give_up = time.monotonic() + 20
    while api.client.get("/status", headers=api.r).json()["applied_version"] < 2:
        assert time.monotonic() < give_up
        time.sleep(0.05)
    assert api.post(lines(txn("c1", 0.5, 0))).json()["matches"] == 1
