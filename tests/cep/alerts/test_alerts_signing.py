"""Signing and verification against the Standard Webhooks test vector and reference library."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from alerts_support import OTHER_SECRET, SPEC_SECRET
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from cep.alerts import AlertConfigError, SignatureError, decode_secret, new_secret, sign, verify

VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_BODY = '{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def _headers(msg_id: str, timestamp: int, signature: str) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }


def test_reference_library_reproduces_the_published_vector() -> None:
    when = datetime.fromtimestamp(VECTOR_TIMESTAMP, tz=UTC)
    assert Webhook(SPEC_SECRET).sign(VECTOR_ID, when, VECTOR_BODY) == VECTOR_SIGNATURE


def test_sign_matches_the_published_vector() -> None:
    assert sign(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY, SPEC_SECRET) == VECTOR_SIGNATURE
    assert sign(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY.encode(), [SPEC_SECRET]) == (
        VECTOR_SIGNATURE
    )


def test_verify_accepts_the_published_vector() -> None:
    headers = _headers(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_SIGNATURE)
    assert verify(VECTOR_BODY, headers, SPEC_SECRET, now=VECTOR_TIMESTAMP + 10) == VECTOR_ID


def test_rotation_signs_with_every_secret_and_either_verifies() -> None:
    signature = sign("m1", VECTOR_TIMESTAMP, b"{}", (SPEC_SECRET, OTHER_SECRET))
    parts = signature.split(" ")
    assert len(parts) == 2
    assert parts[0] == sign("m1", VECTOR_TIMESTAMP, b"{}", SPEC_SECRET)
    assert parts[1] == sign("m1", VECTOR_TIMESTAMP, b"{}", OTHER_SECRET)
    headers = _headers("m1", VECTOR_TIMESTAMP, signature)
    for secret in (SPEC_SECRET, OTHER_SECRET):
        assert verify(b"{}", headers, secret, now=VECTOR_TIMESTAMP) == "m1"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"body": b'{"test": 2432232315}'}, "no matching"),
        ({"msg_id": "msg_other"}, "no matching"),
        ({"secret": OTHER_SECRET}, "no matching"),
        ({"now": VECTOR_TIMESTAMP + 301}, "too old"),
        ({"now": VECTOR_TIMESTAMP - 301}, "future"),
        ({"signature": "v2," + VECTOR_SIGNATURE[3:]}, "no matching"),
        ({"signature": "v1,not-base64!"}, "no matching"),
        ({"signature": ""}, "missing"),
        ({"timestamp": "soon"}, "not an integer"),
    ],
)
def test_verify_rejects(change: dict, reason: str) -> None:
    body = change.get("body", VECTOR_BODY)
    headers = {
        "Webhook-Id": change.get("msg_id", VECTOR_ID),
        "Webhook-Timestamp": str(change.get("timestamp", VECTOR_TIMESTAMP)),
        "Webhook-Signature": change.get("signature", VECTOR_SIGNATURE),
    }
    with pytest.raises(SignatureError, match=reason) as caught:
        verify(
            body,
            headers,
            change.get("secret", SPEC_SECRET),
            now=change.get("now", VECTOR_TIMESTAMP),
        )
    assert isinstance(caught.value, ValueError)


def test_verify_accepts_timestamps_at_the_tolerance_edges() -> None:
    headers = _headers(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_SIGNATURE)
    for now in (VECTOR_TIMESTAMP - 300, VECTOR_TIMESTAMP + 300):
        assert verify(VECTOR_BODY, headers, SPEC_SECRET, now=now) == VECTOR_ID


@pytest.mark.parametrize(
    "secret",
    [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no prefix
        "whsec_",  # empty key
        "whsec_c2hvcnQ=",  # 5 bytes: too short
        "whsec_not base64 at all!!",
    ],
)
def test_bad_secrets_are_configuration_errors(secret: str) -> None:
    with pytest.raises(AlertConfigError) as caught:
        decode_secret(secret)
    assert isinstance(caught.value, ValueError)
    key = secret.removeprefix("whsec_")
    if len(key) > 2:
        assert key not in str(caught.value)


def test_new_secret_is_usable_and_random() -> None:
    first, second = new_secret(), new_secret()
    assert first != second
    assert len(decode_secret(first)) == 32


@given(
    msg_id=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1),
    body=st.text(),
    timestamp=st.integers(min_value=0, max_value=2**33),
    key=st.binary(min_size=24, max_size=64),
)
def test_sign_agrees_with_the_reference_library(
    msg_id: str, body: str, timestamp: int, key: bytes
) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    when = datetime.fromtimestamp(timestamp, tz=UTC)
    ours = sign(msg_id, timestamp, body, secret)
    assert ours == Webhook(secret).sign(msg_id, when, body)
    assert verify(body, _headers(msg_id, timestamp, ours), secret, now=timestamp) == msg_id


def test_reference_library_rejects_what_we_reject() -> None:
    # An independent check that a wrong key fails in the reference verifier too.
    now = int(time.time())
    signature = sign("m1", now, b"{}", OTHER_SECRET)
    with pytest.raises(WebhookVerificationError):
        Webhook(SPEC_SECRET).verify(b"{}", _headers("m1", now, signature))
