"""Minimal HTTP POST over :mod:`http.client`: no redirects, bounded response reads.

The standard library rather than an HTTP client package: a signed alert must never follow a
redirect to another host, a response body is read only up to a bound, and delivery adds no
runtime dependency.
"""

from __future__ import annotations

import base64
import http.client
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote, urlsplit

from .errors import TransportError

__all__ = ["HttpResponse", "HttpTransport", "Transport"]

# Enough of a response body to explain a failure; the rest is discarded unread.
MAX_RESPONSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class HttpResponse:
    """What came back from one POST: status, lower-cased headers, and the start of the body."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


class Transport(Protocol):
    """Sends one POST and returns the response, or raises :class:`TransportError`."""

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> HttpResponse:
        """POST ``body`` to ``url``; raise TransportError on timeout or connection failure."""
        ...


class HttpTransport:
    """The standard-library transport: one connection per request, redirects not followed.

    Parameters
    ----------
    ssl_context : ssl.SSLContext, optional
        For ``https`` URLs; defaults to :func:`ssl.create_default_context`.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> HttpResponse:
        parts = urlsplit(url)
        request_headers = dict(headers)
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            token = base64.b64encode(credentials.encode()).decode("ascii")
            request_headers["Authorization"] = f"Basic {token}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            context = self._ssl_context or ssl.create_default_context()
            connection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=timeout_s, context=context
            )
        else:
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
        try:
            connection.request("POST", target, body=body, headers=request_headers)
            response = connection.getresponse()
            payload = response.read(MAX_RESPONSE_BYTES)
            return HttpResponse(
                status=response.status,
                headers={name.lower(): value for name, value in response.getheaders()},
                body=payload,
            )
        except TimeoutError:
            raise TransportError(f"timed out after {timeout_s:g} s", timed_out=True) from None
        except (OSError, http.client.HTTPException) as exc:
            # Exception texts from the socket layer name no URL, but keep only the class and
            # message so nothing request-specific leaks into logs.
            raise TransportError(f"{type(exc).__name__}: {exc}") from None
        finally:
            connection.close()
