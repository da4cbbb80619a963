"""Minimal HTTP POST over :mod:`http.client`: no redirects, bounded response reads, and a
connection kept open between requests to the same server (keep-alive).

The standard library rather than an HTTP client package: a signed alert must never follow a
redirect to another host, a response body is read only up to a bound, and delivery adds no
runtime dependency.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote, urlsplit

from .errors import TransportError

__all__ = ["HttpResponse", "HttpTransport", "Transport"]

# Enough of a response body to explain a failure; the rest is discarded unread.
MAX_RESPONSE_BYTES = 64 * 1024

KEEP_IDLE_S = 4.0
"""Longest a connection is kept unused for the next request: under the idle timeout of common
servers (5 s for nginx's and uvicorn's keep-alive), so that it is rarely found closed."""

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)
"""Linux's option that acknowledges received data at once instead of after a delay."""

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
          ConnectionAbortedError)
"""How a kept connection that the server closed in the meantime fails, before any response."""


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
    """The standard-library transport: redirects not followed; the connection to a server is
    kept open for its next request (a webhook after the first costs no new connection, nor
    TLS handshake) while the server keeps it open, for up to :data:`KEEP_IDLE_S` unused.

    A request on a kept connection that the server had closed meanwhile (it fails before any
    response) is made again once on a new connection: the server may, rarely, have taken it
    already, which receivers deduplicate as any resend (``webhook-id``).

    Parameters
    ----------
    ssl_context : ssl.SSLContext, optional
        For ``https`` URLs; defaults to :func:`ssl.create_default_context`.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str | None, int | None], list[_Kept]] = {}

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
        server = (parts.scheme, parts.hostname, parts.port)
        connection = self._take(server, timeout_s)
        reused = connection is not None
        if connection is None:
            connection = self._connect(parts.scheme, parts.hostname, parts.port, timeout_s)
        keep = False
        try:
            try:
                response, payload = _exchange(connection, target, body, request_headers)
            except _STALE:
                if not reused:
                    raise
                connection.close()  # closed by the server while kept: once more, anew
                connection = self._connect(parts.scheme, parts.hostname, parts.port, timeout_s)
                response, payload = _exchange(connection, target, body, request_headers)
            # Kept only when the whole response was read and the server keeps it open.
            keep = response.isclosed() and not response.will_close
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
            if keep:
                self._keep(server, connection)
            else:
                connection.close()

    def close(self) -> None:
        """Close the connections kept open."""
        with self._lock:
            kept = [k for pool in self._idle.values() for k in pool]
            self._idle.clear()
        for k in kept:
            k.connection.close()

    def _connect(
        self, scheme: str, host: str | None, port: int | None, timeout_s: float
    ) -> http.client.HTTPConnection:
        if scheme == "https":
            context = self._ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
        return http.client.HTTPConnection(host, port, timeout=timeout_s)

    def _take(
        self, server: tuple[str, str | None, int | None], timeout_s: float
    ) -> http.client.HTTPConnection | None:
        """A connection to ``server`` kept open, if one is fresh enough."""
        now = time.monotonic()
        stale = []
        found = None
        with self._lock:
            pool = self._idle.get(server, [])
            while pool:
                kept = pool.pop()
                if now - kept.since <= KEEP_IDLE_S:
                    found = kept.connection
                    break
                stale.append(kept.connection)
        for connection in stale:
            connection.close()
        if found is not None:
            found.timeout = timeout_s
            if found.sock is not None:
                found.sock.settimeout(timeout_s)
        return found

    def _keep(
        self, server: tuple[str, str | None, int | None], connection: http.client.HTTPConnection
    ) -> None:
        with self._lock:
            self._idle.setdefault(server, []).append(_Kept(connection, time.monotonic()))


@dataclass(frozen=True)
class _Kept:
    connection: http.client.HTTPConnection
    since: float


def _exchange(
    connection: http.client.HTTPConnection, target: str, body: bytes,
    headers: Mapping[str, str],
) -> tuple[http.client.HTTPResponse, bytes]:
    """One request on ``connection``: the response, and its body up to the bound."""
    connection.request("POST", target, body=body, headers=dict(headers))
    if _QUICKACK is not None and connection.sock is not None:
        # A server that writes its reply's head and body apart with Nagle's algorithm on
        # would hold the body until this side's delayed ACK (40 ms) on a kept connection.
        with contextlib.suppress(OSError):
            connection.sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
    response = connection.getresponse()
    return response, response.read(MAX_RESPONSE_BYTES)
