"""Webhook endpoint configuration: where to send, with which secrets, how long to wait."""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import AlertConfigError
from .masking import mask_secret, mask_url
from .signing import decode_secret

__all__ = ["Endpoint"]

_MAX_NAME = 200


@dataclass(frozen=True, repr=False)
class Endpoint:
    """A webhook receiver a match can be notified to.

    Parameters
    ----------
    name : str
        Stable identifier; the outbox records deliveries under it, so renaming an endpoint
        orphans its pending messages.
    url : str
        ``http`` or ``https`` URL the alert is POSTed to. Credentials and query are masked in
        every repr and log.
    secrets : tuple of str
        ``whsec_`` secrets; every delivery is signed with each (key rotation: add the new
        secret, let receivers switch, then drop the old one).
    timeout_s : float
        Seconds to wait for the connection and for each read of the response.

    Examples
    --------
    >>> Endpoint("ops", "https://u:p@hooks.example.com/in?token=x",
    ...          ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",))
    Endpoint(name='ops', url='https://***@hooks.example.com/in?***', secrets=('whsec_Mf…***',), timeout_s=10.0)
    """  # noqa: E501

    name: str
    url: str
    secrets: tuple[str, ...]
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise AlertConfigError("an endpoint needs a non-empty name")
        if len(self.name) > _MAX_NAME or not self.name.isprintable():
            raise AlertConfigError(
                f"endpoint name {self.name[:40]!r} must be printable and at most"
                f" {_MAX_NAME} characters"
            )
        self._check_url()
        if isinstance(self.secrets, str):
            raise AlertConfigError(
                f"endpoint {self.name!r}: secrets must be a tuple of strings, not one string"
            )
        secrets = tuple(self.secrets)
        if not secrets:
            raise AlertConfigError(f"endpoint {self.name!r} needs at least one secret")
        for secret in secrets:
            decode_secret(secret)
        object.__setattr__(self, "secrets", secrets)
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float):
            raise AlertConfigError(f"endpoint {self.name!r}: timeout_s must be a number")
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise AlertConfigError(
                f"endpoint {self.name!r}: timeout_s must be positive, got {self.timeout_s}"
            )
        object.__setattr__(self, "timeout_s", float(self.timeout_s))

    def _check_url(self) -> None:
        if not isinstance(self.url, str):
            raise AlertConfigError(f"endpoint {self.name!r}: url must be a string")
        if any(ch.isspace() or not ch.isprintable() for ch in self.url):
            raise AlertConfigError(
                f"endpoint {self.name!r}: url must not contain spaces or control characters"
            )
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - parsing the port validates it
        except ValueError:
            raise AlertConfigError(
                f"endpoint {self.name!r}: url {mask_url(self.url)} is not a valid URL"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AlertConfigError(
                f"endpoint {self.name!r}: url {mask_url(self.url)} must be http(s)://host/..."
            )

    @property
    def masked_url(self) -> str:
        """The URL with credentials and query hidden, for logs and the outbox."""
        return mask_url(self.url)

    def __repr__(self) -> str:
        secrets = tuple(mask_secret(secret) for secret in self.secrets)
        return (
            f"Endpoint(name={self.name!r}, url={self.masked_url!r}, secrets={secrets!r},"
            f" timeout_s={self.timeout_s!r})"
        )

    __str__ = __repr__
