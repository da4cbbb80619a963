"""Retry schedule, jitter, Retry-After parsing, and the circuit breaker as pure values."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cep.alerts import (
    DEFAULT_SCHEDULE,
    AlertConfigError,
    BreakerState,
    CircuitBreaker,
    ManualClock,
    RetryPolicy,
    parse_retry_after,
)


def test_default_schedule_is_the_documented_one() -> None:
    assert DEFAULT_SCHEDULE[:7] == (0, 5, 300, 1800, 7200, 18000, 36000)
    assert RetryPolicy().max_attempts == len(DEFAULT_SCHEDULE)


def test_no_jitter_follows_the_schedule_then_gives_up() -> None:
    policy = RetryPolicy(schedule=(0, 5, 300), jitter="none")
    rng = random.Random(0)
    assert [policy.delay_after(n, rng) for n in range(4)] == [0.0, 5.0, 300.0, None]


@given(seed=st.integers(0, 2**32), attempts=st.integers(0, len(DEFAULT_SCHEDULE) - 1))
def test_jitter_stays_in_its_bounds(seed: int, attempts: int) -> None:
    base = DEFAULT_SCHEDULE[attempts]
    proportional = RetryPolicy().delay_after(attempts, random.Random(seed))
    full = RetryPolicy(jitter="full").delay_after(attempts, random.Random(seed))
    assert proportional is not None and full is not None
    assert 0.8 * base <= proportional <= 1.2 * base
    assert 0.0 <= full <= base


def test_seeded_jitter_is_reproducible_and_actually_varies() -> None:
    policy = RetryPolicy()
    first = [policy.delay_after(3, random.Random(42)) for _ in range(2)]
    assert first[0] == first[1]
    spread = {policy.delay_after(3, random.Random(seed)) for seed in range(20)}
    assert len(spread) == 20


@pytest.mark.parametrize(
    "kwargs",
    [
        {"schedule": ()},
        {"schedule": (0, -1)},
        {"schedule": (0, math.inf)},
        {"jitter": "sometimes"},
        {"jitter_ratio": 1.5},
        {"max_retry_after_s": -1},
    ],
)
def test_invalid_policies(kwargs: dict) -> None:
    with pytest.raises(AlertConfigError):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("header", "now", "expected"),
    [
        ("120", 0.0, 120.0),
        (" 7 ", 0.0, 7.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 1445412480.0 - 90, 90.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 1445412480.0 + 90, 0.0),
        ("-5", 0.0, None),
        ("1.5", 0.0, None),
        ("tomorrow", 0.0, None),
        ("", 0.0, None),
        (None, 0.0, None),
    ],
)
def test_parse_retry_after(header: str | None, now: float, expected: float | None) -> None:
    assert parse_retry_after(header, now) == expected


def test_breaker_opens_after_threshold_consecutive_failures() -> None:
    breaker = CircuitBreaker(threshold=3, cooldown_s=60.0)
    for now in (0.0, 1.0):
        assert breaker.try_acquire(now)
        breaker.record_failure(now)
    assert breaker.state is BreakerState.CLOSED
    breaker.record_success()  # a success resets the count
    for now in (2.0, 3.0, 4.0):
        assert breaker.try_acquire(now)
        breaker.record_failure(now)
    assert breaker.state is BreakerState.OPEN
    assert breaker.ready_at() == 64.0
    assert not breaker.try_acquire(63.9)


def test_half_open_lets_exactly_one_probe_through() -> None:
    clock = ManualClock(start=0.0)
    breaker = CircuitBreaker(threshold=1, cooldown_s=30.0)
    breaker.record_failure(clock.now())
    clock.advance(30.0)
    assert breaker.try_acquire(clock.now())
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.ready_at() == math.inf
    assert [breaker.try_acquire(clock.now()) for _ in range(5)] == [False] * 5
    breaker.record_failure(clock.now())  # the probe failed: open again for a full cooldown
    assert breaker.state is BreakerState.OPEN
    assert not breaker.try_acquire(clock.now() + 29.0)
    assert breaker.try_acquire(clock.now() + 30.0)
    assert not breaker.try_acquire(clock.now() + 30.0)
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert all(breaker.try_acquire(clock.now() + 31.0) for _ in range(3))


def test_breaker_rejects_bad_settings() -> None:
    with pytest.raises(AlertConfigError):
        CircuitBreaker(threshold=0)
    with pytest.raises(AlertConfigError):
        CircuitBreaker(cooldown_s=-1)
