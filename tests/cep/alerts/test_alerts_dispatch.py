"""Delivery against real loopback HTTP servers: outcomes, retries, order, breakers, isolation."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from alerts_support import OTHER_SECRET, SPEC_SECRET, Reply, ScriptedServer, make_match
from pytest_httpserver import HTTPServer
from standardwebhooks.webhooks import Webhook

from cep.alerts import (
    AlertConfigError,
    BreakerState,
    DeliveryState,
    Dispatcher,
    Endpoint,
    HttpResponse,
    ManualClock,
    Message,
    Outbox,
    Outcome,
    RetryPolicy,
    SystemClock,
    WebhookReceiver,
    replay,
    status,
    verify,
)

Scripted = Callable[..., ScriptedServer]
EXACT = RetryPolicy(schedule=(0, 5, 300, 1800), jitter="none")


def _endpoint(url: str, name: str = "ops", **kwargs) -> Endpoint:
    return Endpoint(name, url, kwargs.pop("secrets", (SPEC_SECRET,)), **kwargs)


def _enqueue(outbox: Outbox, endpoints: list[Endpoint], n: int, *, rule: str = "r") -> list[str]:
    for i in range(n):
        outbox.enqueue(make_match(i, rule=rule), endpoints)
    return [make_match(i, rule=rule)["match_id"] for i in range(n)]


def test_success_is_signed_per_standard_webhooks(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    endpoint = _endpoint(httpserver.url_for("/hook"), secrets=(SPEC_SECRET, OTHER_SECRET))
    with Outbox(tmp_path / "o.sqlite") as outbox:
        outbox.enqueue(make_match(1), [endpoint])
        result = Dispatcher(outbox, [endpoint]).drain(deadline_s=10.0)
        assert (result.attempts, result.delivered, result.pending) == (1, 1, 0)
        assert not result.deadline_reached and result.next_attempt_at is None
        (message,) = outbox.messages()
        assert message.state is DeliveryState.DELIVERED and message.delivered_at is not None
        (attempt,) = outbox.attempts()
        assert (attempt.status, attempt.outcome, attempt.attempt) == (200, Outcome.DELIVERED, 1)
        assert attempt.latency_ms > 0

    (request, _response), *_ = httpserver.log
    assert len(httpserver.log) == 1
    body = request.get_data()
    headers = dict(request.headers)
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["webhook-id"] == make_match(1)["match_id"]
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (SPEC_SECRET, OTHER_SECRET):  # the independent reference verifier
        envelope = Webhook(secret).verify(body, headers)
        assert envelope == {
            "type": "vigil.match",
            "timestamp": make_match(1)["end"],
            "data": make_match(1),
        }


def test_500s_then_success(httpserver: HTTPServer, outbox: Outbox, clock: ManualClock) -> None:
    for _ in range(2):
        httpserver.expect_ordered_request("/hook").respond_with_data("boom", status=500)
    httpserver.expect_ordered_request("/hook").respond_with_data("ok")
    endpoint = _endpoint(httpserver.url_for("/hook"))
    outbox.enqueue(make_match(1), [endpoint])
    t0 = clock.now()
    result = Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT).drain(deadline_s=3600)
    assert (result.attempts, result.retried, result.delivered) == (3, 2, 1)

    attempts = outbox.attempts()
    assert [a.status for a in attempts] == [500, 500, 200]
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert [a.attempted_at - t0 for a in attempts] == [0, 5, 305]
    assert [a.next_attempt_at and a.next_attempt_at - t0 for a in attempts] == [5, 305, None]
    assert attempts[0].error == "HTTP 500: boom"
    assert {a.url for a in attempts} == {endpoint.masked_url}

    ids = {request.headers["webhook-id"] for request, _ in httpserver.log}
    assert ids == {make_match(1)["match_id"]}  # stable across retries
    stamps = [int(request.headers["webhook-timestamp"]) for request, _ in httpserver.log]
    assert [stamp - int(t0) for stamp in stamps] == [0, 5, 305]  # time of each attempt
    for (request, _), stamp in zip(httpserver.log, stamps, strict=True):
        assert verify(request.get_data(), dict(request.headers), SPEC_SECRET, now=stamp)


def test_timeout_is_retried(scripted_server: Scripted, outbox: Outbox, clock: ManualClock) -> None:
    server = scripted_server(lambda i, h, b: Reply(delay_s=2.0 if i == 0 else 0.0))
    endpoint = _endpoint(server.url, timeout_s=0.2)
    outbox.enqueue(make_match(1), [endpoint])
    started = time.monotonic()
    result = Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT).drain(deadline_s=60)
    assert time.monotonic() - started < 1.5  # did not wait for the sleeping server
    assert (result.retried, result.delivered) == (1, 1)
    first, second = outbox.attempts()
    assert first.status is None and "timed out after 0.2 s" in first.error
    assert 190 < first.latency_ms < 1500
    assert first.outcome is Outcome.RETRY and second.outcome is Outcome.DELIVERED


def test_connection_refused_is_retried(outbox: Outbox, clock: ManualClock) -> None:
    endpoint = _endpoint("http://127.0.0.1:9/hook", timeout_s=0.5)  # discard port: closed
    outbox.enqueue(make_match(1), [endpoint])
    policy = RetryPolicy(schedule=(0, 5), jitter="none")
    result = Dispatcher(outbox, [endpoint], clock=clock, policy=policy).drain(deadline_s=60)
    assert (result.attempts, result.retried, result.failed) == (2, 1, 1)
    (dead,) = outbox.dead_letters()
    assert dead.reason.startswith("retries exhausted after 2 attempts; last: ")
    assert "Connection" in dead.reason


def test_410_disables_the_endpoint_and_keeps_its_messages(
    scripted_server: Scripted, outbox: Outbox, clock: ManualClock
) -> None:
    gone_answers = {"status": 410}
    gone = scripted_server(lambda i, h, b: Reply(status=gone_answers["status"]))
    fine = scripted_server()
    gone_endpoint, fine_endpoint = _endpoint(gone.url, "gone"), _endpoint(fine.url, "fine")
    ids = _enqueue(outbox, [gone_endpoint, fine_endpoint], 3)
    dispatcher = Dispatcher(outbox, [gone_endpoint, fine_endpoint], clock=clock, policy=EXACT)

    result = dispatcher.drain(deadline_s=3600)
    assert (result.disabled, result.delivered, result.pending) == (1, 3, 0)
    assert len(gone.requests) == 1 and [r.webhook_id for r in fine.requests] == ids
    counts = status(outbox)["gone"]
    assert counts.endpoint_disabled and counts.disabled == 3 and counts.pending == 0
    assert dispatcher.drain(deadline_s=3600).attempts == 0
    assert len(gone.requests) == 1  # not sent again while disabled

    gone_answers["status"] = 200
    assert outbox.enable_endpoint("gone") == 3
    result = dispatcher.drain(deadline_s=3600)
    assert result.delivered == 3
    assert [r.webhook_id for r in gone.requests] == [ids[0], *ids]


@pytest.mark.parametrize("http_status", [400, 401, 403, 404, 422])
def test_other_4xx_go_to_dead_letters(
    httpserver: HTTPServer, outbox: Outbox, clock: ManualClock, http_status: int
) -> None:
    httpserver.expect_ordered_request("/hook").respond_with_data("bad payload", status=http_status)
    httpserver.expect_ordered_request("/hook").respond_with_data("ok")
    endpoint = _endpoint(httpserver.url_for("/hook"))
    ids = _enqueue(outbox, [endpoint], 2)
    result = Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT).drain(deadline_s=60)
    assert (result.attempts, result.failed, result.delivered) == (2, 1, 1)
    (dead,) = outbox.dead_letters()
    assert dead.msg_id == ids[0] and dead.last_status == http_status and dead.attempts == 1
    assert dead.reason == f"permanent failure: HTTP {http_status}: bad payload"
    assert status(outbox)["ops"].failed == 1
    assert not status(outbox)["ops"].endpoint_disabled


@pytest.mark.parametrize("http_status", [408, 429, 502, 503, 504])
def test_transient_statuses_are_retried(
    scripted_server: Scripted, outbox: Outbox, clock: ManualClock, http_status: int
) -> None:
    server = scripted_server(lambda i, h, b: Reply(status=http_status if i == 0 else 200))
    endpoint = _endpoint(server.url)
    outbox.enqueue(make_match(1), [endpoint])
    result = Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT).drain(deadline_s=60)
    assert (result.retried, result.delivered, result.failed) == (1, 1, 0)


def _retry_after_date(clock: ManualClock) -> str:
    return format_datetime(datetime.fromtimestamp(clock.now() + 600, UTC), usegmt=True)


@pytest.mark.parametrize(
    ("header", "expected_wait"),
    [
        (lambda clock: "120", 120),
        (_retry_after_date, 600),
        (lambda clock: "999999999", 3600),  # capped by max_retry_after_s
        (lambda clock: "1", 5),  # the schedule's own delay is longer: it wins
        (lambda clock: "garbage", 5),
    ],
)
def test_retry_after_is_honoured(
    scripted_server: Scripted,
    outbox: Outbox,
    clock: ManualClock,
    header: Callable[[ManualClock], str],
    expected_wait: float,
) -> None:
    value = header(clock)
    server = scripted_server(
        lambda i, h, b: Reply(status=503, headers={"Retry-After": value}) if i == 0 else Reply()
    )
    endpoint = _endpoint(server.url)
    outbox.enqueue(make_match(1), [endpoint])
    policy = RetryPolicy(schedule=(0, 5, 300), jitter="none", max_retry_after_s=3600)
    Dispatcher(outbox, [endpoint], clock=clock, policy=policy).drain(deadline_s=7200)
    first, second = outbox.attempts()
    assert second.outcome is Outcome.DELIVERED
    assert second.attempted_at - first.attempted_at == pytest.approx(expected_wait)


def test_endpoint_down_for_an_hour_then_back_drains_backlog_in_order(
    scripted_server: Scripted, outbox: Outbox, clock: ManualClock
) -> None:
    back_at = clock.now() + 3600

    def down_then_up(index: int, headers: dict[str, str], body: bytes) -> Reply:
        verify(body, headers, SPEC_SECRET, now=clock.now())  # signed at the simulated time
        return Reply(status=503 if clock.now() < back_at else 200)

    server = scripted_server(down_then_up)
    endpoint = _endpoint(server.url)
    ids = _enqueue(outbox, [endpoint], 20)
    started = time.monotonic()
    dispatcher = Dispatcher(outbox, [endpoint], clock=clock, rng=random.Random(7), max_workers=8)
    result = dispatcher.drain(deadline_s=6 * 3600)
    assert time.monotonic() - started < 10  # hours of simulated time, seconds of real time

    assert result.delivered == 20 and result.pending == 0
    requests = server.requests
    failed = [r for r in requests if r.status == 503]
    # Only the head of the backlog was tried during the outage, on the backoff schedule.
    assert {r.webhook_id for r in failed} == {ids[0]}
    assert len(failed) == 4  # t=0, ~5 s, ~5 min, ~35 min; the ~2 h 35 min attempt succeeds
    delivered = [r.webhook_id for r in requests if r.status == 200]
    assert delivered == ids  # in enqueue order, each once
    assert server.max_concurrency == 1
    retry_times = [a.attempted_at for a in outbox.attempts() if a.outcome is Outcome.RETRY]
    gaps = [later - earlier for earlier, later in zip(retry_times, retry_times[1:], strict=False)]
    for gap, planned in zip(gaps, (5, 300, 1800), strict=False):
        assert 0.8 * planned <= gap <= 1.2 * planned
    assert min(a.attempted_at for a in outbox.attempts() if a.status == 200) >= back_at


def test_open_breaker_sends_one_probe_at_a_time(
    scripted_server: Scripted, outbox: Outbox, clock: ManualClock
) -> None:
    back_at = clock.now() + 400
    server = scripted_server(lambda i, h, b: Reply(status=503 if clock.now() < back_at else 200))
    endpoint = _endpoint(server.url)
    ids = _enqueue(outbox, [endpoint], 5)
    policy = RetryPolicy(schedule=(0,) + (1,) * 11, jitter="none")
    states = []

    def observe(message: Message, response: HttpResponse) -> None:
        states.append(dispatcher.breakers["ops"].state)  # while the request is in flight

    dispatcher = Dispatcher(
        outbox,
        [endpoint],
        clock=clock,
        policy=policy,
        breaker_threshold=3,
        breaker_cooldown_s=60,
        max_workers=8,
        on_response=observe,
    )
    t0 = clock.now()
    result = dispatcher.drain(deadline_s=3600)
    assert result.delivered == 5
    times = [a.attempted_at - t0 for a in outbox.attempts()]
    # Three quick failures open the breaker; then one probe per cooldown until it is back.
    assert times[:3] == [0, 1, 2]
    assert times[3:9] == [62, 122, 182, 242, 302, 362]
    assert times[9] == 422  # the probe that succeeds, then the backlog in order
    assert states[:3] == [BreakerState.CLOSED] * 3
    assert states[3:10] == [BreakerState.HALF_OPEN] * 7
    assert [r.webhook_id for r in server.requests if r.status == 200] == ids
    assert server.max_concurrency == 1
    assert dispatcher.breakers["ops"].state is BreakerState.CLOSED


def test_open_breaker_holds_back_the_next_message_after_a_dead_letter(
    scripted_server: Scripted, outbox: Outbox, clock: ManualClock
) -> None:
    server = scripted_server(lambda i, h, b: Reply(status=503))
    endpoint = _endpoint(server.url)
    ids = _enqueue(outbox, [endpoint], 3)
    policy = RetryPolicy(schedule=(0, 1, 1), jitter="none")
    dispatcher = Dispatcher(
        outbox, [endpoint], clock=clock, policy=policy, breaker_threshold=3, breaker_cooldown_s=60
    )
    t0 = clock.now()
    dispatcher.drain(deadline_s=100)
    by_message = [(a.msg_id, a.attempted_at - t0) for a in outbox.attempts()]
    assert by_message[:3] == [(ids[0], 0), (ids[0], 1), (ids[0], 2)]
    # ids[1] is due at once, but the breaker opened at t=2: it goes out as the t=62 probe.
    assert by_message[3] == (ids[1], 62)
    assert len(by_message) == 4
    assert [d.msg_id for d in outbox.dead_letters()] == [ids[0]]


def test_slow_endpoint_does_not_delay_others(scripted_server: Scripted, outbox: Outbox) -> None:
    slow = scripted_server(lambda i, h, b: Reply(delay_s=0.5))
    fast = scripted_server()
    slow_endpoint = _endpoint(slow.url, "slow", timeout_s=5)
    fast_endpoint = _endpoint(fast.url, "fast", timeout_s=5)
    _enqueue(outbox, [slow_endpoint], 2, rule="s")
    _enqueue(outbox, [fast_endpoint], 10, rule="f")
    dispatcher = Dispatcher(outbox, [slow_endpoint, fast_endpoint], clock=SystemClock())
    result = dispatcher.drain(deadline_s=30)
    assert result.delivered == 12
    assert len(fast.requests) == 10
    assert max(r.finished for r in fast.requests) < min(r.finished for r in slow.requests)
    assert slow.max_concurrency == 1


def test_global_cap_bounds_requests_in_flight(scripted_server: Scripted, outbox: Outbox) -> None:
    lock = threading.Lock()
    active = {"now": 0, "max": 0}

    def counted(index: int, headers: dict[str, str], body: bytes) -> Reply:
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        time.sleep(0.1)
        with lock:
            active["now"] -= 1
        return Reply()

    servers = [scripted_server(counted) for _ in range(5)]
    endpoints = [_endpoint(s.url, f"ep{i}") for i, s in enumerate(servers)]
    _enqueue(outbox, endpoints, 2)
    result = Dispatcher(outbox, endpoints, clock=SystemClock(), max_workers=2).drain(30)
    assert result.delivered == 10
    assert active["max"] == 2
    assert all(server.max_concurrency == 1 for server in servers)


def test_each_endpoint_gets_the_same_webhook_id(scripted_server: Scripted, outbox: Outbox) -> None:
    first, second = scripted_server(), scripted_server()
    endpoints = [
        _endpoint(first.url, "first"),
        _endpoint(second.url, "second", secrets=(OTHER_SECRET,)),
    ]
    outbox.enqueue(make_match(3), endpoints)
    Dispatcher(outbox, endpoints, clock=SystemClock()).drain(deadline_s=10)
    (a,), (b,) = first.requests, second.requests
    assert a.webhook_id == b.webhook_id == make_match(3)["match_id"]
    assert a.body == b.body and a.payload["data"] == make_match(3)
    assert Webhook(SPEC_SECRET).verify(a.body, a.headers)
    assert Webhook(OTHER_SECRET).verify(b.body, b.headers)


def test_unknown_endpoints_stay_pending(scripted_server: Scripted, outbox: Outbox) -> None:
    server = scripted_server()
    known, ghost = _endpoint(server.url, "known"), _endpoint(server.url, "ghost")
    _enqueue(outbox, [known, ghost], 2)
    result = Dispatcher(outbox, [known], clock=SystemClock()).drain(deadline_s=10)
    assert result.delivered == 2 and result.pending == 2
    assert result.unknown_endpoints == ("ghost",)
    assert status(outbox)["ghost"].pending == 2


def test_deadline_leaves_pending_work_for_the_next_run(
    scripted_server: Scripted, outbox_path: Path, clock: ManualClock
) -> None:
    answer = {"status": 503}
    server = scripted_server(lambda i, h, b: Reply(status=answer["status"]))
    endpoint = _endpoint(server.url)
    with Outbox(outbox_path, clock=clock) as outbox:
        outbox.enqueue(make_match(1), [endpoint])
        assert Dispatcher(outbox, [endpoint], clock=clock).drain(deadline_s=0).attempts == 0
        t0 = clock.now()
        result = Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT).drain(deadline_s=60)
        assert (result.attempts, result.pending, result.deadline_reached) == (2, 1, False)
        assert result.next_attempt_at == t0 + 305

    # A restarted dispatcher honours the persisted schedule: nothing is due yet ...
    with Outbox(outbox_path, clock=clock) as outbox:
        restarted = Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT)
        assert restarted.drain(deadline_s=60).attempts == 0
        answer["status"] = 200
        clock.advance(245)
        result = restarted.drain(deadline_s=60)  # ... until it is.
        assert (result.attempts, result.delivered, result.pending) == (1, 1, 0)
        assert outbox.messages()[0].attempts == 3


def test_deadline_cuts_a_drain_short(scripted_server: Scripted, outbox: Outbox) -> None:
    server = scripted_server(lambda i, h, b: Reply(delay_s=0.2))
    endpoint = _endpoint(server.url)
    _enqueue(outbox, [endpoint], 10)
    result = Dispatcher(outbox, [endpoint], clock=SystemClock()).drain(deadline_s=0.3)
    assert result.deadline_reached
    assert 1 <= result.delivered <= 3 and result.pending == 10 - result.delivered
    assert len(server.requests) == result.attempts  # in-flight requests were recorded


def test_secrets_and_credentials_never_reach_logs(
    scripted_server: Scripted, outbox: Outbox, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    key = SPEC_SECRET.removeprefix("whsec_")
    replies: list[Reply] = []
    server = scripted_server(lambda i, h, b: replies[min(i, len(replies) - 1)])
    url = f"http://robot:hunter2@{server.url.removeprefix('http://')}?token=tok123"
    endpoint = Endpoint("ops", url, (SPEC_SECRET,), timeout_s=0.2)
    # A receiver echoing what it was sent must not get secrets into the logs either.
    replies += [
        Reply(status=500, body=f"bad key {SPEC_SECRET} / {key} at {url}".encode()),
        Reply(delay_s=0.5),
        Reply(status=400, body=f"echo {SPEC_SECRET}".encode()),
        Reply(),
    ]
    _enqueue(outbox, [endpoint], 2)
    caplog.set_level(logging.DEBUG)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("cep.alerts").info("configured %r", endpoint)
        Dispatcher(outbox, [endpoint], clock=clock, policy=EXACT).drain(deadline_s=3600)
    assert server.arrivals == 4
    assert server.requests[0].path == "/hook?token=tok123"  # the real URL was used
    assert server.requests[0].headers["authorization"].startswith("Basic ")
    texts = [caplog.text] + [f"{a.url} {a.error}" for a in outbox.attempts()]
    texts += [d.reason for d in outbox.dead_letters()]
    for text in texts:
        for forbidden in (SPEC_SECRET, key, key[2:10], "hunter2", "tok123", "robot"):
            assert forbidden not in text
    assert "whsec_Mf…***" in caplog.text
    assert "http://***@127.0.0.1" in caplog.text
    assert "timed out" in caplog.text and "HTTP 500" in caplog.text
    assert "permanent failure: HTTP 400: echo whsec_Mf…***" in caplog.text


def test_dispatcher_configuration_errors(outbox: Outbox) -> None:
    endpoint = _endpoint("http://127.0.0.1:9/")
    with pytest.raises(AlertConfigError, match="twice"):
        Dispatcher(outbox, [endpoint, endpoint])
    with pytest.raises(AlertConfigError, match="max_workers"):
        Dispatcher(outbox, [endpoint], max_workers=0)
    with pytest.raises(AlertConfigError, match="deadline_s"):
        Dispatcher(outbox, [endpoint]).drain(deadline_s=-1)


def test_body_on_the_wire_is_the_stored_body(scripted_server: Scripted, outbox: Outbox) -> None:
    server = scripted_server()
    endpoint = _endpoint(server.url)
    outbox.enqueue(make_match(5), [endpoint])
    stored = outbox.messages()[0].body
    Dispatcher(outbox, [endpoint], clock=SystemClock()).drain(deadline_s=10)
    assert server.requests[0].body == stored
    assert json.loads(stored)["data"]["match_id"] == make_match(5)["match_id"]


def test_rerun_over_the_same_input_sends_no_new_webhook(tmp_path: Path) -> None:
    with WebhookReceiver(SPEC_SECRET) as receiver, Outbox(tmp_path / "o.sqlite") as outbox:
        endpoint = _endpoint(receiver.url)
        for _run in range(2):
            ids = _enqueue(outbox, [endpoint], 5)
            Dispatcher(outbox, [endpoint]).drain(deadline_s=10)
        assert receiver.webhook_ids == ids
        assert (receiver.deliveries, receiver.duplicates) == (5, 0)
        assert status(outbox)["ops"].duplicates == 5


def test_replay_redelivers_with_the_same_webhook_ids(tmp_path: Path) -> None:
    with WebhookReceiver(SPEC_SECRET) as receiver, Outbox(tmp_path / "o.sqlite") as outbox:
        endpoint = _endpoint(receiver.url)
        ids = _enqueue(outbox, [endpoint], 4)
        Dispatcher(outbox, [endpoint]).drain(deadline_s=10)
        since = datetime.now(UTC) - timedelta(minutes=5)
        assert replay(outbox, since, endpoint="ops") == 4
        result = Dispatcher(outbox, [endpoint]).drain(deadline_s=10)
        assert result.delivered == 4
        assert receiver.webhook_ids == ids  # receivers deduplicate the replay
        assert (receiver.deliveries, receiver.duplicates) == (8, 4)
        assert [a.attempt for a in outbox.attempts(msg_id=ids[0])] == [1, 1]
