"""The durable outbox: idempotent enqueue, state transitions, replay, persistence."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alerts_support import SPEC_SECRET, make_match

from cep.alerts import (
    AlertConfigError,
    DeliveryState,
    Endpoint,
    InvalidMatchError,
    ManualClock,
    Outbox,
    OutboxError,
    Outcome,
    replay,
    status,
)

OPS = Endpoint("ops", "https://user:pw@ops.example.com/hook?k=v", (SPEC_SECRET,))
SEC = Endpoint("sec", "https://sec.example.com/hook", (SPEC_SECRET,))


def _finish(outbox: Outbox, msg_id: str, endpoint: str, outcome: Outcome, **kwargs) -> None:
    (message,) = [m for m in outbox.messages(endpoint) if m.msg_id == msg_id]
    outbox.record_attempt(
        message,
        url="https://x/",
        attempted_at=kwargs.pop("at", message.created_at),
        status=kwargs.pop("http_status", 200),
        error=kwargs.pop("error", None),
        latency_ms=1.0,
        outcome=outcome,
        **kwargs,
    )


def test_enqueue_is_idempotent_per_match_and_endpoint(outbox: Outbox) -> None:
    assert outbox.enqueue(make_match(1), [OPS, SEC]) == 2
    assert outbox.enqueue(make_match(1), [OPS, SEC]) == 0
    assert outbox.enqueue(make_match(1), [OPS]) == 0
    assert outbox.enqueue(make_match(2), [OPS]) == 1
    messages = outbox.messages()
    assert [(m.msg_id, m.endpoint) for m in messages] == [
        ("card_testing-0001", "ops"),
        ("card_testing-0001", "sec"),
        ("card_testing-0002", "ops"),
    ]
    assert all(m.state is DeliveryState.PENDING and m.attempts == 0 for m in messages)
    counts = status(outbox)
    assert counts["ops"].pending == 2 and counts["ops"].duplicates == 2
    assert counts["sec"].pending == 1 and counts["sec"].duplicates == 1


def test_enqueue_many_is_one_transaction_with_the_same_outcomes(outbox: Outbox) -> None:
    """A batch's alerts in one write: each pair counted as enqueue counts it, and a batch
    with an unusable match stores nothing of itself."""
    batch = [(make_match(1), [OPS, SEC]), (make_match(2), [OPS]), (make_match(1), [OPS])]
    assert outbox.enqueue_many(batch) == 3  # the repeat of match 1 for ops is a duplicate
    assert outbox.enqueue_many(batch) == 0
    with pytest.raises(InvalidMatchError):
        outbox.enqueue_many([(make_match(3), [OPS]), ({"name": "no id"}, [OPS])])
    assert [m.msg_id for m in outbox.messages("ops")] == ["card_testing-0001",
                                                         "card_testing-0002"]
    assert status(outbox)["ops"].duplicates == 4  # one in the first batch, three again


def test_enqueue_after_delivery_is_still_a_duplicate(outbox: Outbox) -> None:
    outbox.enqueue(make_match(1), [OPS])
    _finish(outbox, "card_testing-0001", "ops", Outcome.DELIVERED)
    assert outbox.enqueue(make_match(1), [OPS]) == 0
    assert status(outbox)["ops"].delivered == 1
    assert status(outbox)["ops"].pending == 0


def test_every_endpoint_gets_the_same_body_and_id(outbox: Outbox) -> None:
    outbox.enqueue(make_match(7), [OPS, SEC])
    ops, sec = outbox.messages()
    assert ops.msg_id == sec.msg_id == "card_testing-0007"
    assert ops.body == sec.body


def test_enqueue_with_no_endpoints_stores_nothing_but_validates(outbox: Outbox) -> None:
    assert outbox.enqueue(make_match(1), []) == 0
    with pytest.raises(InvalidMatchError):
        outbox.enqueue({"name": "no id"}, [])
    with pytest.raises(AlertConfigError):
        outbox.enqueue(make_match(1), ["ops"])  # type: ignore[list-item]


def test_enqueue_is_committed_and_survives_reopening(outbox_path: Path, clock: ManualClock) -> None:
    with Outbox(outbox_path, clock=clock) as first:
        first.enqueue(make_match(1), [OPS])
        # Visible to an independent connection the moment enqueue returns: committed.
        other = sqlite3.connect(outbox_path)
        assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        other.close()
        _finish(
            first,
            "card_testing-0001",
            "ops",
            Outcome.RETRY,
            http_status=503,
            error="HTTP 503",
            next_attempt_at=clock.now() + 5,
        )
    with Outbox(outbox_path, clock=clock) as second:
        (message,) = second.messages()
        assert message.state is DeliveryState.PENDING
        assert message.attempts == 1
        assert message.last_status == 503
        assert message.next_attempt_at == clock.now() + 5
        assert second.enqueue(make_match(1), [OPS]) == 0


def test_failed_attempt_goes_to_dead_letters_with_reason(outbox: Outbox) -> None:
    outbox.enqueue(make_match(1), [OPS])
    _finish(
        outbox,
        "card_testing-0001",
        "ops",
        Outcome.FAILED,
        http_status=400,
        error="HTTP 400: bad",
        reason="permanent failure: HTTP 400: bad",
    )
    (dead,) = outbox.dead_letters()
    assert (dead.msg_id, dead.endpoint, dead.last_status, dead.attempts) == (
        "card_testing-0001",
        "ops",
        400,
        1,
    )
    assert dead.reason == "permanent failure: HTTP 400: bad"
    assert outbox.dead_letters("sec") == []
    assert status(outbox)["ops"].failed == 1
    (attempt,) = outbox.attempts()
    assert attempt.outcome is Outcome.FAILED and attempt.attempt == 1


def test_disable_parks_pending_messages_until_enabled(outbox: Outbox, clock: ManualClock) -> None:
    for i in range(3):
        outbox.enqueue(make_match(i), [OPS, SEC])
    _finish(outbox, "card_testing-0000", "ops", Outcome.DISABLED, http_status=410)
    counts = status(outbox)
    assert counts["ops"].endpoint_disabled and counts["ops"].disabled == 3
    assert counts["sec"].pending == 3 and not counts["sec"].endpoint_disabled
    assert [head.endpoint for head in outbox.heads()] == ["sec"]
    # New matches for a disabled endpoint are kept, parked too.
    outbox.enqueue(make_match(3), [OPS])
    assert status(outbox)["ops"].disabled == 4
    clock.advance(60)
    assert outbox.enable_endpoint("ops") == 4
    resumed = outbox.messages("ops")
    assert [m.state for m in resumed] == [DeliveryState.PENDING] * 4
    assert outbox.heads()[0].msg_id == "card_testing-0000"
    assert outbox.disable_endpoint("ops", "maintenance") == 4
    with pytest.raises(AlertConfigError, match="no endpoint named"):
        outbox.enable_endpoint("nope")


def test_replay_requeues_delivered_and_failed_since(outbox: Outbox, clock: ManualClock) -> None:
    start = datetime.fromtimestamp(clock.now(), UTC)
    outbox.enqueue(make_match(0), [OPS, SEC])
    clock.advance(3600)
    outbox.enqueue(make_match(1), [OPS, SEC])
    outbox.enqueue(make_match(2), [OPS])
    for endpoint in ("ops", "sec"):
        for i in (0, 1):
            _finish(outbox, f"card_testing-000{i}", endpoint, Outcome.DELIVERED)
    _finish(outbox, "card_testing-0002", "ops", Outcome.FAILED, http_status=400, reason="bad")
    assert len(outbox.dead_letters()) == 1

    since = start + timedelta(minutes=30)
    assert replay(outbox, since, "ops") == 2
    ops = {m.msg_id: m for m in outbox.messages("ops")}
    assert ops["card_testing-0000"].state is DeliveryState.DELIVERED
    for msg_id in ("card_testing-0001", "card_testing-0002"):
        assert ops[msg_id].state is DeliveryState.PENDING
        assert ops[msg_id].attempts == 0 and ops[msg_id].delivered_at is None
    assert outbox.dead_letters() == []
    assert status(outbox)["sec"].delivered == 2
    assert replay(outbox, start) == 3  # ops 0 and sec 0, 1; pending ones are left alone
    assert replay(outbox, start) == 0


def test_replay_argument_errors(outbox: Outbox) -> None:
    outbox.enqueue(make_match(0), [OPS])
    with pytest.raises(AlertConfigError, match="timezone-aware"):
        outbox.replay(datetime(2026, 1, 1))
    with pytest.raises(AlertConfigError, match="no endpoint named"):
        outbox.replay(datetime(2026, 1, 1, tzinfo=UTC), "nope")


def test_heads_are_the_oldest_pending_per_endpoint(outbox: Outbox) -> None:
    for i in range(3):
        outbox.enqueue(make_match(i), [OPS])
        outbox.enqueue(make_match(i, rule="other"), [SEC])
    _finish(outbox, "card_testing-0000", "ops", Outcome.DELIVERED)
    heads = {head.endpoint: head.msg_id for head in outbox.heads()}
    assert heads == {"ops": "card_testing-0001", "sec": "other-0000"}
    assert outbox.pending_count() == 5


def test_retry_requires_a_time(outbox: Outbox) -> None:
    outbox.enqueue(make_match(0), [OPS])
    with pytest.raises(AlertConfigError, match="next_attempt_at"):
        _finish(outbox, "card_testing-0000", "ops", Outcome.RETRY)


def test_outbox_stores_no_secret_and_no_url_credentials(outbox_path: Path) -> None:
    with Outbox(outbox_path) as box:
        box.enqueue(make_match(0), [OPS])
        assert box.status()["ops"].url == "https://***@ops.example.com/hook?***"
    raw = b"".join(path.read_bytes() for path in outbox_path.parent.glob("outbox.sqlite*"))
    assert SPEC_SECRET.encode() not in raw and b"MfKQ9r8G" not in raw
    assert b"user:pw" not in raw and b"k=v" not in raw


def test_files_that_are_not_outboxes_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(OutboxError, match="not a usable outbox"):
        Outbox(garbage)
    foreign = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE customers (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(OutboxError, match="not an outbox"):
        Outbox(foreign)
    future = tmp_path / "future.sqlite"
    Outbox(future).close()
    db = sqlite3.connect(future)
    db.execute("PRAGMA user_version=99")
    db.commit()
    db.close()
    with pytest.raises(OutboxError, match="schema version 99") as caught:
        Outbox(future)
    assert isinstance(caught.value, RuntimeError)
