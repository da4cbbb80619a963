"""Redaction of endpoint secrets and URL credentials for logs, reprs and the outbox."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["SECRET_PREFIX", "mask_secret", "mask_url"]

SECRET_PREFIX = "whsec_"
_SHOWN = 2


def mask_secret(secret: str) -> str:
    """Return a secret with all but its first two key characters hidden.

    Examples
    --------
    >>> mask_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    'whsec_Mf…***'
    """
    prefix = SECRET_PREFIX if secret.startswith(SECRET_PREFIX) else ""
    key = secret[len(prefix) :]
    return f"{prefix}{key[:_SHOWN]}…***"


def mask_url(url: str) -> str:
    """Return ``url`` with its user-info and query string replaced by ``***``.

    Examples
    --------
    >>> mask_url("https://bot:hunter2@hooks.example.com/alerts?token=abc")
    'https://***@hooks.example.com/alerts?***'
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"***@{netloc}"
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
