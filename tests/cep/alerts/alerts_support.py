"""Test support for the webhook delivery tests: secrets, matches and a scripted HTTP server."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

# The Standard Webhooks specification's published test secret, and a second key for rotation.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def make_match(i: int, *, rule: str = "card_testing") -> dict:
    """A match shaped like the engine's output, with a deterministic match_id."""
    return {
        "kind": "rule",
        "name": rule,
        "version": 1,
        "match_id": f"{rule}-{i:04d}",
        "key": {"card": f"c{i % 3}"},
        "events": {"attempts": [i]},
        "values": {"count": i},
        "start": "2026-11-21T10:00:00Z",
        "end": "2026-11-21T10:05:00Z",
        "severity": "high",
    }


@dataclass(frozen=True)
class Reply:
    """How a scripted server answers one request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    body: bytes = b"ok"


@dataclass(frozen=True)
class SeenRequest:
    """One request as the scripted server saw it."""

    index: int
    arrived: float
    finished: float
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def payload(self) -> dict:
        return json.loads(self.body)


Responder = Callable[[int, dict[str, str], bytes], Reply]


class _QuietServerThreads(logging.Filter):
    """Drops werkzeug's per-request access lines written by scripted-server threads.

    The access line names the request URL, query string included; tests that check what reaches
    the logs (credentials, tokens) must see only what the code under test logged. Warnings and
    errors, such as a responder's traceback, still get through.
    """

    def __init__(self) -> None:
        super().__init__()
        self._threads = threading.local()

    def mark_current_thread(self) -> None:
        self._threads.scripted = True

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not getattr(self._threads, "scripted", False)


_QUIET = _QuietServerThreads()
logging.getLogger("werkzeug").addFilter(_QUIET)


class _HTTPServer(HTTPServer):
    """pytest-httpserver's server, polling for shutdown often so that close() is quick."""

    def thread_target(self) -> None:
        assert self.server is not None
        self.server.serve_forever(poll_interval=0.05)


class ScriptedServer:
    """A threaded loopback HTTP server whose answers a test scripts, recording every request.

    Built on pytest-httpserver: every POST to ``/hook`` goes to :meth:`_handle`, which asks the
    responder for a :class:`Reply`, waits its ``delay_s`` and records the request.
    """

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda index, headers, body: Reply())
        self._lock = threading.Lock()
        self._requests: list[SeenRequest] = []
        self._arrivals = 0
        self._active = 0
        self.max_concurrency = 0
        self._server = _HTTPServer(host="127.0.0.1", threaded=True)
        self._server.expect_request("/hook", method="POST").respond_with_handler(self._handle)
        self._server.start()

    def _handle(self, request: Request) -> Response:
        _QUIET.mark_current_thread()
        arrived = time.monotonic()
        body = request.get_data()
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self._lock:
            index = self._arrivals
            self._arrivals += 1
            self._active += 1
            self.max_concurrency = max(self.max_concurrency, self._active)
        try:
            reply = self.responder(index, headers, body)
            if reply.delay_s:
                time.sleep(reply.delay_s)
        finally:
            with self._lock:
                self._active -= 1
        path = request.environ["RAW_URI"]  # the request target as sent, query string included
        seen = SeenRequest(index, arrived, time.monotonic(), path, headers, body, reply.status)
        with self._lock:
            self._requests.append(seen)
        # A client that timed out has closed its socket by now: werkzeug drops the answer quietly.
        return Response(reply.body, status=reply.status, headers=reply.headers)

    @property
    def url(self) -> str:
        return self._server.url_for("/hook")

    @property
    def arrivals(self) -> int:
        """Requests received so far, including ones still being answered."""
        with self._lock:
            return self._arrivals

    @property
    def requests(self) -> list[SeenRequest]:
        with self._lock:
            return sorted(self._requests, key=lambda request: request.index)

    def close(self) -> None:
        self._server.stop()
