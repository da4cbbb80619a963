"""Endpoint configuration, masking of secrets and URLs, the envelope, and the error hierarchy."""

from __future__ import annotations

import json

import pytest
from alerts_support import OTHER_SECRET, SPEC_SECRET, make_match

from cep.alerts import (
    AlertConfigError,
    AlertError,
    Endpoint,
    InvalidMatchError,
    OutboxError,
    SignatureError,
    ThrottleStateError,
    TransportError,
    checked_match_id,
    envelope_body,
    mask_secret,
    mask_url,
)


def test_endpoint_repr_masks_secrets_and_url_credentials() -> None:
    endpoint = Endpoint(
        "ops",
        "https://bot:hunter2@hooks.example.com:8443/in?token=abc",
        (SPEC_SECRET, OTHER_SECRET),
    )
    text = repr(endpoint)
    assert "whsec_Mf…***" in text
    assert SPEC_SECRET not in text and OTHER_SECRET not in text
    assert "MfKQ9r8G" not in text
    assert "hunter2" not in text and "bot" not in text and "token=abc" not in text
    assert "https://***@hooks.example.com:8443/in?***" in text
    assert str(endpoint) == text
    assert endpoint.masked_url == "https://***@hooks.example.com:8443/in?***"


def test_endpoint_normalises_secrets_and_timeout() -> None:
    endpoint = Endpoint("ops", "http://127.0.0.1:9/", [SPEC_SECRET], timeout_s=2)  # type: ignore[arg-type]
    assert endpoint.secrets == (SPEC_SECRET,)
    assert endpoint.timeout_s == 2.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "non-empty name"),
        ({"url": "ftp://example.com/"}, "must be http"),
        ({"url": "http:///nohost"}, "must be http"),
        ({"url": "http://example.com:99999/"}, "not a valid URL"),
        ({"url": "http://example.com/a b"}, "spaces or control"),
        ({"secrets": ()}, "at least one secret"),
        ({"secrets": SPEC_SECRET}, "not one string"),
        ({"secrets": ("whsec_c2hvcnQ=",)}, "at least 24"),
        ({"timeout_s": 0}, "positive"),
        ({"timeout_s": float("nan")}, "positive"),
        ({"timeout_s": "10"}, "number"),
    ],
)
def test_invalid_endpoints_are_rejected(kwargs: dict, message: str) -> None:
    arguments = {"name": "ops", "url": "https://example.com/", "secrets": (SPEC_SECRET,)}
    arguments.update(kwargs)
    with pytest.raises(AlertConfigError, match=message) as caught:
        Endpoint(**arguments)
    assert isinstance(caught.value, ValueError)
    assert SPEC_SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://example.com/a/b", "https://example.com/a/b"),
        ("https://u:p@example.com/a?x=1#frag", "https://***@example.com/a?***"),
        ("http://[::1]:8080/x?k=v", "http://[::1]:8080/x?***"),
        ("http://token@example.com", "http://***@example.com"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_mask_secret_keeps_two_characters() -> None:
    assert mask_secret(SPEC_SECRET) == "whsec_Mf…***"
    assert mask_secret("abcdef") == "ab…***"


def test_envelope_is_type_timestamp_data() -> None:
    match = make_match(1)
    envelope = json.loads(envelope_body(match, created_at=0.0))
    assert envelope == {"type": "vigil.match", "timestamp": match["end"], "data": match}
    without_end = {"match_id": "m1"}
    assert json.loads(envelope_body(without_end, created_at=86_400.0))["timestamp"] == (
        "1970-01-02T00:00:00Z"
    )
    assert envelope_body(match, created_at=0.0) == envelope_body(match, created_at=99.0)


@pytest.mark.parametrize(
    "match",
    [
        {},
        {"match_id": ""},
        {"match_id": 42},
        {"match_id": "has space"},
        {"match_id": "x" * 257},
        ["not", "a", "dict"],
    ],
)
def test_matches_without_a_usable_id_are_rejected(match: object) -> None:
    with pytest.raises(InvalidMatchError) as caught:
        checked_match_id(match)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)


def test_unserialisable_match_is_rejected() -> None:
    with pytest.raises(InvalidMatchError, match="JSON"):
        envelope_body({"match_id": "m1", "values": {"x": float("nan")}}, created_at=0.0)
    with pytest.raises(InvalidMatchError, match="JSON"):
        envelope_body({"match_id": "m1", "values": {1, 2}}, created_at=0.0)
    with pytest.raises(InvalidMatchError, match="event type"):
        envelope_body({"match_id": "m1"}, event_type="bad type!", created_at=0.0)


def test_every_error_has_one_root_and_a_builtin() -> None:
    assert issubclass(AlertConfigError, ValueError)
    assert issubclass(InvalidMatchError, ValueError)
    assert issubclass(SignatureError, ValueError)
    assert issubclass(ThrottleStateError, ValueError)
    assert issubclass(OutboxError, RuntimeError)
    assert issubclass(TransportError, OSError)
    for error in (
        AlertConfigError,
        InvalidMatchError,
        SignatureError,
        ThrottleStateError,
        OutboxError,
        TransportError,
    ):
        assert issubclass(error, AlertError)
    assert TransportError("timed out", timed_out=True).timed_out
