"""A local webhook receiver for demos and tests: verifies, deduplicates and records alerts.

Run it on its own with ``python -m cep.alerts.receiver`` (secret from ``VIGIL_WEBHOOK_SECRET``)
to print each alert received as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .clock import Clock, SystemClock
from .errors import AlertConfigError, SignatureError
from .signing import DEFAULT_TOLERANCE_S, decode_secret, verify

__all__ = ["AlertCallback", "ReceivedAlert", "WebhookReceiver", "main"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceivedAlert:
    """A verified, first-seen webhook."""

    webhook_id: str
    timestamp: int
    event_type: str
    data: Any
    received_at: float


AlertCallback = Callable[[ReceivedAlert], None]


class WebhookReceiver:
    """An HTTP server on loopback that accepts Standard Webhooks deliveries.

    Each POST is verified (signature, timestamp within ``tolerance_s``) and deduplicated by
    ``webhook-id``: a first-seen alert is recorded and passed to ``on_alert``; a repeat is
    acknowledged with 200 but not recorded again. If ``on_alert`` raises, the receiver
    answers 500 and forgets the id, so the sender's retry is processed.

    Parameters
    ----------
    secrets : str or sequence of str
        Accepted ``whsec_`` secrets (several during key rotation).
    on_alert : callable, optional
        Called with each new :class:`ReceivedAlert`, from the server's request thread.
    clock : Clock, optional
        Time source for timestamp checks (a ``ManualClock`` in tests of long outages).
    tolerance_s : float
        Allowed distance between ``webhook-timestamp`` and now.
    host, port : str, int
        Where to listen; port 0 picks a free port.
    max_body_bytes : int
        Larger requests are refused with 413.

    Examples
    --------
    >>> with WebhookReceiver("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") as receiver:
    ...     receiver.url.startswith("http://127.0.0.1:")
    True
    """

    def __init__(
        self,
        secrets: str | Sequence[str],
        *,
        on_alert: AlertCallback | None = None,
        clock: Clock | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = 1 << 20,
    ) -> None:
        self._secrets = (secrets,) if isinstance(secrets, str) else tuple(secrets)
        if not self._secrets:
            raise AlertConfigError("a receiver needs at least one secret")
        for secret in self._secrets:
            decode_secret(secret)
        self._on_alert = on_alert
        self._clock = clock or SystemClock()
        self._tolerance_s = tolerance_s
        self._host = host
        self._port = port
        self._max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._alerts: list[ReceivedAlert] = []
        self.deliveries = 0
        self.duplicates = 0
        self.rejected = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> WebhookReceiver:
        """Start serving in a background thread; returns ``self``."""
        if self._server is not None:
            raise RuntimeError("receiver already started")
        self._server = ThreadingHTTPServer((self._host, self._port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="vigil-webhook-receiver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._server = None
        self._thread = None

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL to configure as an endpoint, e.g. ``http://127.0.0.1:54321/``."""
        if self._server is None:
            raise RuntimeError("receiver not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    # -- what was received -----------------------------------------------------------------

    @property
    def alerts(self) -> list[ReceivedAlert]:
        """Alerts received, first delivery of each ``webhook-id`` only, in arrival order."""
        with self._lock:
            return list(self._alerts)

    @property
    def webhook_ids(self) -> list[str]:
        """The ``webhook-id`` of each alert in :attr:`alerts`."""
        return [alert.webhook_id for alert in self.alerts]

    # -- request handling ------------------------------------------------------------------

    def _handle(self, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        try:
            webhook_id = verify(
                body,
                headers,
                self._secrets,
                now=self._clock.now(),
                tolerance_s=self._tolerance_s,
            )
        except SignatureError as exc:
            with self._lock:
                self.rejected += 1
            return 401, exc.reason
        try:
            envelope = json.loads(body)
            event_type = str(envelope["type"])
            data = envelope["data"]
        except (ValueError, KeyError, TypeError):
            with self._lock:
                self.rejected += 1
            return 400, "body is not a {type, timestamp, data} JSON envelope"
        alert = ReceivedAlert(
            webhook_id=webhook_id,
            timestamp=int(headers["webhook-timestamp"]),
            event_type=event_type,
            data=data,
            received_at=self._clock.now(),
        )
        with self._lock:
            self.deliveries += 1
            if webhook_id in self._seen:
                self.duplicates += 1
                return 200, "duplicate"
            self._seen.add(webhook_id)
        try:
            if self._on_alert is not None:
                self._on_alert(alert)
        except Exception:
            logger.exception("alert callback failed for webhook %s", webhook_id)
            with self._lock:
                self._seen.discard(webhook_id)
            return 500, "alert callback failed"
        with self._lock:
            self._alerts.append(alert)
        return 200, "received"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The reply's head and body are two writes: with Nagle's algorithm on, the body
            # would wait for the sender's delayed ACK (40 ms) on a kept-alive connection.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = self.headers.get("Content-Length")
                if length is None or not length.isdigit():
                    self._reply(411, "Content-Length required")
                    return
                if int(length) > receiver._max_body_bytes:
                    self._reply(413, "body too large")
                    self.close_connection = True
                    return
                body = self.rfile.read(int(length))
                headers = {name.lower(): value for name, value in self.headers.items()}
                status, text = receiver._handle(headers, body)
                self._reply(status, text)

            def _reply(self, status: int, text: str) -> None:
                payload = json.dumps({"status": text}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("receiver: " + format, *args)

        return _Handler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted, printing each new alert as one JSON line."""
    parser = argparse.ArgumentParser(description="Local Vigil webhook receiver")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--secret-env",
        default="VIGIL_WEBHOOK_SECRET",
        help="environment variable holding the whsec_ secret (kept out of the process list)",
    )
    args = parser.parse_args(argv)
    secret = os.environ.get(args.secret_env)
    if not secret:
        parser.error(f"set {args.secret_env} to the endpoint's whsec_ secret")

    def print_alert(alert: ReceivedAlert) -> None:
        line = {"webhook_id": alert.webhook_id, "type": alert.event_type, "data": alert.data}
        print(json.dumps(line), flush=True)

    with WebhookReceiver(secret, on_alert=print_alert, port=args.port) as receiver:
        print(f"listening on {receiver.url}", file=sys.stderr, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
