"""Test support for the webhook delivery tests: secrets, matches and a scripted HTTP server."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class ScriptedServer:
    """A threaded loopback HTTP server whose answers a test scripts, recording every request."""

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda index, headers, body: Reply())
        self._lock = threading.Lock()
        self._requests: list[SeenRequest] = []
        self._arrivals = 0
        self._active = 0
        self.max_concurrency = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                arrived = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                with server._lock:
                    index = server._arrivals
                    server._arrivals += 1
                    server._active += 1
                    server.max_concurrency = max(server.max_concurrency, server._active)
                try:
                    reply = server.responder(index, headers, body)
                    if reply.delay_s:
                        time.sleep(reply.delay_s)
                finally:
                    with server._lock:
                        server._active -= 1
                with server._lock:
                    server._requests.append(
                        SeenRequest(
                            index, arrived, time.monotonic(), self.path, headers, body, reply.status
                        )
                    )
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the client gave up (timeout); nothing to answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hook"

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
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
