"""Alert throttling per (rule, key): decisions, counters, and the bytes round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cep.alerts import AlertConfigError, Throttle, ThrottleStateError


def test_same_rule_and_key_alert_at_most_once_per_interval() -> None:
    throttle = Throttle(interval_ms=1000)
    decisions = [throttle.allow("r", {"card": "c1"}, t) for t in (0, 1, 999, 1000, 1500, 2000)]
    assert decisions == [True, False, False, True, False, True]
    assert throttle.suppressed == 3 and throttle.suppressed_by_rule == {"r": 3}


def test_rules_and_keys_are_independent_and_key_order_does_not_matter() -> None:
    throttle = Throttle(interval_ms=1000)
    assert throttle.allow("r", {"a": 1, "b": 2}, 0)
    assert not throttle.allow("r", {"b": 2, "a": 1}, 10)
    assert throttle.allow("r", {"a": 1, "b": 3}, 10)
    assert throttle.allow("other", {"a": 1, "b": 2}, 10)
    assert throttle.allow("r", "a", 10) and not throttle.allow("r", "a", 20)
    assert throttle.suppressed_by_rule == {"r": 2}


def test_late_events_are_suppressed() -> None:
    throttle = Throttle(interval_ms=1000)
    assert throttle.allow("r", "k", 5000)
    assert not throttle.allow("r", "k", 100)


def test_zero_interval_allows_everything() -> None:
    throttle = Throttle(interval_ms=0)
    assert all(throttle.allow("r", "k", 7) for _ in range(3))


def test_prune_forgets_only_expired_slots() -> None:
    throttle = Throttle(interval_ms=1000)
    throttle.allow("r", "old", 0)
    throttle.allow("r", "new", 900)
    assert throttle.prune(watermark_ms=1000) == 1
    assert len(throttle) == 1
    assert not throttle.allow("r", "new", 1500)
    assert throttle.allow("r", "old", 1500)


def test_round_trip_and_format_header() -> None:
    throttle = Throttle(interval_ms=60_000)
    throttle.allow("r", {"card": "ü"}, 0)
    throttle.allow("r", {"card": "ü"}, 5)
    data = throttle.to_bytes()
    assert data[:5] == b"VTHR\x01"
    restored = Throttle.from_bytes(data)
    assert restored == throttle and restored.to_bytes() == data
    assert not restored.allow("r", {"card": "ü"}, 10)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated"),
        (b"XXXX\x01{}", "bad magic"),
        (b"VTHR\x02{}", "format version 2"),
        (b"VTHR\x01{not json", "corrupt"),
        (b'VTHR\x01{"interval_ms": -1, "last_allowed": [], "suppressed": {}}', "corrupt"),
        (b'VTHR\x01{"interval_ms": 5}', "corrupt"),
    ],
)
def test_bad_state_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(ThrottleStateError, match=message) as caught:
        Throttle.from_bytes(data)
    assert isinstance(caught.value, ValueError)


def test_bad_arguments() -> None:
    with pytest.raises(AlertConfigError):
        Throttle(interval_ms=-1)
    with pytest.raises(AlertConfigError):
        Throttle(interval_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(AlertConfigError, match="JSON"):
        Throttle(10).allow("r", {1, 2}, 0)


events = st.lists(
    st.tuples(st.sampled_from(["r1", "r2"]), st.sampled_from(["a", "b", "c"]), st.integers(0, 50)),
    max_size=60,
)


@given(interval=st.integers(0, 20), steps=events, split=st.integers(0, 60))
def test_matches_a_brute_force_reference_across_a_round_trip(
    interval: int, steps: list[tuple[str, str, int]], split: int
) -> None:
    # Events arrive in time order, as an engine would feed them per key.
    steps = sorted(steps, key=lambda step: step[2])
    throttle = Throttle(interval)
    allowed_times: dict[tuple[str, str], list[int]] = {}
    suppressed = 0
    for index, (rule, key, t) in enumerate(steps):
        if index == split:
            throttle = Throttle.from_bytes(throttle.to_bytes())
        previous = allowed_times.get((rule, key), [])
        expected = all(t - earlier >= interval for earlier in previous)
        assert throttle.allow(rule, key, t) == expected
        if expected:
            allowed_times.setdefault((rule, key), []).append(t)
        else:
            suppressed += 1
    assert throttle.suppressed == suppressed
