"""The demo receiver: verification, deduplication, callbacks, lifecycle."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest
from alerts_support import OTHER_SECRET, SPEC_SECRET, make_match
from standardwebhooks.webhooks import Webhook

from cep.alerts import AlertConfigError, ManualClock, ReceivedAlert, WebhookReceiver, sign
from cep.alerts.receiver import main


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())["status"]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["status"]


def _signed(msg_id: str, data: dict, secret: str = SPEC_SECRET, at: int | None = None) -> tuple:
    timestamp = int(time.time()) if at is None else at
    body = json.dumps({"type": "vigil.match", "timestamp": "t", "data": data}).encode()
    headers = {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(msg_id, timestamp, body, secret),
    }
    return body, headers


def test_accepts_a_delivery_signed_by_the_reference_library() -> None:
    match = make_match(1)
    body = json.dumps({"type": "vigil.match", "timestamp": "t", "data": match})
    now = datetime.now(tz=UTC)
    headers = {
        "webhook-id": match["match_id"],
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SPEC_SECRET).sign(match["match_id"], now, body),
    }
    received: list[ReceivedAlert] = []
    with WebhookReceiver(SPEC_SECRET, on_alert=received.append) as receiver:
        assert _post(receiver.url, body.encode(), headers) == (200, "received")
    (alert,) = received
    assert alert.webhook_id == match["match_id"]
    assert alert.event_type == "vigil.match" and alert.data == match
    assert receiver.alerts == received


def test_deduplicates_by_webhook_id() -> None:
    with WebhookReceiver(SPEC_SECRET) as receiver:
        body, headers = _signed("m1", make_match(1))
        assert _post(receiver.url, body, headers) == (200, "received")
        assert _post(receiver.url, body, headers) == (200, "duplicate")
        body2, headers2 = _signed("m2", make_match(2))
        assert _post(receiver.url, body2, headers2) == (200, "received")
    assert receiver.webhook_ids == ["m1", "m2"]
    assert (receiver.deliveries, receiver.duplicates, receiver.rejected) == (3, 1, 0)


def test_rejects_bad_signatures_and_stale_timestamps() -> None:
    clock = ManualClock(start=time.time())
    with WebhookReceiver(SPEC_SECRET, clock=clock) as receiver:
        body, headers = _signed("m1", make_match(1), secret=OTHER_SECRET)
        assert _post(receiver.url, body, headers) == (401, "no matching v1 signature")
        body, headers = _signed("m1", make_match(1))
        assert _post(receiver.url, body + b" ", headers)[0] == 401
        clock.advance(301)
        assert _post(receiver.url, body, headers) == (401, "webhook-timestamp is too old")
        assert _post(receiver.url, body, {})[0] == 401
    assert receiver.alerts == [] and receiver.rejected == 4


def test_accepts_any_of_its_secrets() -> None:
    with WebhookReceiver([SPEC_SECRET, OTHER_SECRET]) as receiver:
        for i, secret in enumerate((SPEC_SECRET, OTHER_SECRET)):
            assert _post(receiver.url, *_signed(f"m{i}", {}, secret=secret))[0] == 200
    assert receiver.webhook_ids == ["m0", "m1"]


def test_rejects_signed_bodies_that_are_not_envelopes_and_oversized_ones() -> None:
    with WebhookReceiver(SPEC_SECRET, max_body_bytes=4096) as receiver:
        timestamp = int(time.time())
        body = b"[1, 2, 3]"
        headers = {
            "webhook-id": "m1",
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign("m1", timestamp, body, SPEC_SECRET),
        }
        assert _post(receiver.url, body, headers)[0] == 400
        big_body, big_headers = _signed("m2", {"pad": "x" * 5000})
        assert _post(receiver.url, big_body, big_headers) == (413, "body too large")
    assert receiver.alerts == []


def test_failing_callback_answers_500_so_the_sender_retries() -> None:
    calls: list[str] = []

    def flaky(alert: ReceivedAlert) -> None:
        calls.append(alert.webhook_id)
        if len(calls) == 1:
            raise RuntimeError("downstream unavailable")

    with WebhookReceiver(SPEC_SECRET, on_alert=flaky) as receiver:
        body, headers = _signed("m1", make_match(1))
        assert _post(receiver.url, body, headers) == (500, "alert callback failed")
        assert _post(receiver.url, body, headers) == (200, "received")
    assert calls == ["m1", "m1"] and receiver.webhook_ids == ["m1"]


def test_lifecycle() -> None:
    receiver = WebhookReceiver(SPEC_SECRET)
    with pytest.raises(RuntimeError, match="not started"):
        _ = receiver.url
    receiver.start()
    url = receiver.url
    with pytest.raises(RuntimeError, match="already started"):
        receiver.start()
    receiver.stop()
    receiver.stop()
    with pytest.raises(urllib.error.URLError):
        _post(url, *_signed("m1", {}))
    with pytest.raises(AlertConfigError):
        WebhookReceiver([])
    with pytest.raises(AlertConfigError):
        WebhookReceiver("not-a-secret")


def test_command_line_needs_the_secret_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VIGIL_WEBHOOK_SECRET", raising=False)
    with pytest.raises(SystemExit) as caught:
        main(["--port", "0"])
    assert caught.value.code == 2
