"""Errors raised by the webhook alert delivery subsystem, all rooted at :class:`AlertError`."""

from __future__ import annotations

from query_lang.errors import VigilError

__all__ = [
    "AlertConfigError",
    "AlertError",
    "InvalidMatchError",
    "OutboxError",
    "SignatureError",
    "ThrottleStateError",
    "TransportError",
]


class AlertError(VigilError):
    """Root of every error raised by ``cep.alerts``."""


class AlertConfigError(AlertError, ValueError):
    """An endpoint, secret, retry policy or argument is invalid."""


class InvalidMatchError(AlertError, ValueError):
    """A match cannot be turned into a webhook message (no usable ``match_id``, not JSON)."""


class SignatureError(AlertError, ValueError):
    """A webhook's headers or signature do not verify.

    Parameters
    ----------
    reason : str
        Why verification failed, safe to show to the sender (never contains a secret).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OutboxError(AlertError, RuntimeError):
    """The outbox database cannot be used (unknown schema version, not an outbox)."""


class ThrottleStateError(AlertError, ValueError):
    """Serialised throttle state cannot be decoded."""


class TransportError(AlertError, OSError):
    """An HTTP request did not produce a response (connection error or timeout).

    Parameters
    ----------
    message : str
        Description of the failure, free of URLs and secrets.
    timed_out : bool
        Whether the request ran past the endpoint's timeout.
    """

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
