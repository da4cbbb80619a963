"""Standard Webhooks signatures: ``v1,`` + base64 HMAC-SHA256 of ``{id}.{timestamp}.{body}``.

The key is the base64-decoded part of a ``whsec_...`` secret. Several secrets (key rotation)
give several space-separated signatures, and a receiver accepts any one that matches.

A few lines of :mod:`hmac`, so delivery needs no extra dependency; the tests verify these
signatures with the reference implementation (the ``standardwebhooks`` package).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _random
import time
from collections.abc import Mapping, Sequence

from .errors import AlertConfigError, SignatureError
from .masking import SECRET_PREFIX, mask_secret

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "MIN_KEY_BYTES",
    "decode_secret",
    "new_secret",
    "sign",
    "verify",
]

DEFAULT_TOLERANCE_S = 300.0
MIN_KEY_BYTES = 24
_VERSION = "v1"


def decode_secret(secret: str) -> bytes:
    """Return the HMAC key of a ``whsec_``-prefixed base64 secret.

    Raises
    ------
    AlertConfigError
        If the prefix is missing, the key is not base64, or it is shorter than 24 bytes
        (the Standard Webhooks minimum).

    Examples
    --------
    >>> len(decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
    24
    """
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise AlertConfigError("a webhook secret must be a string starting with 'whsec_'")
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise AlertConfigError(
            f"webhook secret {mask_secret(secret)} is not valid base64 after 'whsec_'"
        ) from None
    if len(key) < MIN_KEY_BYTES:
        raise AlertConfigError(
            f"webhook secret {mask_secret(secret)} decodes to {len(key)} bytes;"
            f" at least {MIN_KEY_BYTES} are required"
        )
    return key


def new_secret(n_bytes: int = 32) -> str:
    """Return a fresh random ``whsec_`` secret holding ``n_bytes`` of key."""
    if n_bytes < MIN_KEY_BYTES:
        raise AlertConfigError(f"a secret needs at least {MIN_KEY_BYTES} bytes, got {n_bytes}")
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(n_bytes)).decode("ascii")


def _as_secret_list(secrets: str | Sequence[str]) -> tuple[str, ...]:
    listed = (secrets,) if isinstance(secrets, str) else tuple(secrets)
    if not listed:
        raise AlertConfigError("at least one webhook secret is required")
    return listed


def _as_bytes(body: bytes | str) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _digest(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return hmac.new(key, signed, hashlib.sha256).digest()


def sign(msg_id: str, timestamp: int, body: bytes | str, secrets: str | Sequence[str]) -> str:
    """Return the ``webhook-signature`` header value for one message.

    Parameters
    ----------
    msg_id : str
        The ``webhook-id`` header value.
    timestamp : int
        The ``webhook-timestamp`` header value, unix seconds.
    body : bytes or str
        The exact request body (str is encoded as UTF-8).
    secrets : str or sequence of str
        One ``whsec_`` secret, or several during key rotation (one signature each, in order).

    Examples
    --------
    >>> sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, '{"test": 2432232314}',
    ...      "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE='
    """
    payload = _as_bytes(body)
    signatures = []
    for secret in _as_secret_list(secrets):
        digest = _digest(decode_secret(secret), msg_id, int(timestamp), payload)
        signatures.append(f"{_VERSION},{base64.b64encode(digest).decode('ascii')}")
    return " ".join(signatures)


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secrets: str | Sequence[str],
    *,
    now: float | None = None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> str:
    """Check a received webhook and return its ``webhook-id``.

    Parameters
    ----------
    body : bytes or str
        The raw request body, exactly as received.
    headers : mapping of str to str
        Request headers; names are matched case-insensitively.
    secrets : str or sequence of str
        The secrets the receiver accepts; any one matching signature suffices.
    now : float, optional
        Current unix time; defaults to :func:`time.time`.
    tolerance_s : float
        How far the ``webhook-timestamp`` may be from ``now``, either way (replay protection).

    Raises
    ------
    SignatureError
        If a header is missing or malformed, the timestamp is outside the tolerance, or no
        signature matches.
    """
    keys = [decode_secret(secret) for secret in _as_secret_list(secrets)]
    lowered = {name.lower(): value for name, value in headers.items()}
    msg_id = lowered.get("webhook-id", "")
    raw_timestamp = lowered.get("webhook-timestamp", "")
    raw_signatures = lowered.get("webhook-signature", "")
    if not (msg_id and raw_timestamp and raw_signatures):
        raise SignatureError("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        timestamp = int(raw_timestamp)
    except ValueError:
        raise SignatureError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if timestamp < current - tolerance_s:
        raise SignatureError("webhook-timestamp is too old")
    if timestamp > current + tolerance_s:
        raise SignatureError("webhook-timestamp is too far in the future")

    payload = _as_bytes(body)
    expected = [_digest(key, msg_id, timestamp, payload) for key in keys]
    matched = False
    for versioned in raw_signatures.split():
        version, _, encoded = versioned.partition(",")
        if version != _VERSION:
            continue
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        # Compare against every key without stopping early, so timing reveals nothing.
        for digest in expected:
            matched |= hmac.compare_digest(digest, candidate)
    if not matched:
        raise SignatureError("no matching v1 signature")
    return msg_id
