"""The outbox's group commit: alerts handed to the writer thread count as queued only once on
disk, those handed over while a transaction is written go into the next one, a failed write
is raised to whoever waits, and the live delivery sends nothing that is not stored (nor holds
a new alert back behind a slow endpoint's request). The disk is held back by a second
connection holding SQLite's write lock (a real contention, as a slow disk or another writer
gives). Then the transport's kept connections."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from alerts_support import SPEC_SECRET, make_match

from cep.alerts import (
    AlertSink,
    Dispatcher,
    Endpoint,
    HttpTransport,
    Outbox,
    OutboxWriter,
    WebhookReceiver,
)
from cep.alerts.delivery import LiveDelivery
from query_lang import load_program

OPS = Endpoint("ops", "http://127.0.0.1:9/hook", (SPEC_SECRET,))


@contextmanager
def disk_held(path: Path) -> Iterator[None]:
    """SQLite's write lock on the outbox, held by another connection until the block ends:
    no transaction of the outbox can commit meanwhile."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def on_disk(path: Path) -> list[str]:
    """The message ids committed to the outbox, as another process would see them."""
    other = sqlite3.connect(path)
    try:
        return [row[0] for row in other.execute("SELECT msg_id FROM messages ORDER BY seq")]
    finally:
        other.close()


def test_an_alert_counts_as_queued_only_once_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path)
    writer = OutboxWriter(outbox)
    try:
        with disk_held(path):
            ticket = writer.put(outbox.prepare([(make_match(1), [OPS])]))
            assert not writer.wait(ticket, timeout=0.3)
            assert writer.durable < ticket and on_disk(path) == []
            # handed over while the first transaction waits for the disk
            tickets = [writer.put(outbox.prepare([(make_match(i), [OPS])])) for i in range(2, 12)]
            assert not writer.wait(timeout=0.1)
        assert writer.wait(tickets[-1], timeout=30)
        assert on_disk(path) == [make_match(i)["match_id"] for i in range(1, 12)]
        # one transaction for the first, one for all that came while it waited
        assert writer.transactions <= 2 and writer.stored == 11
    finally:
        writer.close()
        outbox.close()


def test_a_failed_write_is_raised_and_nothing_more_is_acknowledged(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    writer = OutboxWriter(outbox)
    assert writer.wait(writer.put(outbox.prepare([(make_match(1), [OPS])])), timeout=30)
    prepared = outbox.prepare([(make_match(2), [OPS])])
    outbox.close()  # the database goes away under the writer
    ticket = writer.put(prepared)
    with pytest.raises(sqlite3.ProgrammingError):
        writer.wait(ticket, timeout=30)
    assert writer.durable == ticket - 1
    with pytest.raises(sqlite3.ProgrammingError):
        writer.put(prepared)
    with pytest.raises(sqlite3.ProgrammingError):
        writer.close()


def test_close_stores_what_was_handed_over(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path)
    writer = OutboxWriter(outbox)
    for i in range(5):
        writer.put(outbox.prepare([(make_match(i), [OPS])]))
    writer.close()
    assert len(on_disk(path)) == 5
    outbox.close()


RULES = """
webhook ops url "{url}" secret env TEST_OPS_SECRET
stream txn (card string, amount float, ts timestamp) time ts
rule card_testing from txn by card pattern b define b as amount > 100 notify ops
"""


def _sink(tmp_path: Path, url: str) -> AlertSink:
    program = load_program(text=RULES.format(url=url))
    env = {"TEST_OPS_SECRET": SPEC_SECRET}
    return AlertSink.open(program, str(tmp_path / "outbox.sqlite"), env)


def test_the_live_delivery_sends_an_alert_only_once_it_is_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    with WebhookReceiver(SPEC_SECRET) as receiver:
        sink = _sink(tmp_path, receiver.url)
        sink.start_delivery()
        try:
            sink.queue_many([make_match(0)])
            assert sink.flush(timeout=30)
            _wait_for(lambda: len(receiver.webhook_ids) == 1)
            with disk_held(path):
                assert sink.queue_many([make_match(1), make_match(2)]) == 2
                assert not sink.flush(timeout=0.5)
                # matched, handed over, not on disk: neither acknowledged nor sent
                assert receiver.webhook_ids == [make_match(0)["match_id"]]
                assert on_disk(path) == [make_match(0)["match_id"]]
            assert sink.flush(timeout=30)
            _wait_for(lambda: len(receiver.webhook_ids) == 3)
            result = sink.drain(deadline_s=10)
        finally:
            sink.close()
        assert receiver.webhook_ids == [make_match(i)["match_id"] for i in range(3)]
        assert receiver.duplicates == 0 and result.delivered == 3 and sink.enqueued == 3


def test_submit_after_queue_keeps_their_order_and_waits_for_the_disk(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    sink = _sink(tmp_path, "http://127.0.0.1:9/hook")
    try:
        sink.queue_many([make_match(1), make_match(2)])
        assert sink.submit_many([make_match(3)]) == 1
        # submit returns once its alert is on disk, and those queued before it are too
        assert on_disk(path) == [make_match(i)["match_id"] for i in (1, 2, 3)]
        assert sink.enqueued == 3
    finally:
        sink.close()


def test_a_slow_endpoints_request_holds_back_no_new_alert_of_another(tmp_path: Path) -> None:
    slow = _CountingServer(delay_s=5.0)
    with WebhookReceiver(SPEC_SECRET) as fast_receiver:
        outbox = Outbox(tmp_path / "outbox.sqlite")
        slow_end = Endpoint("slow", slow.url, (SPEC_SECRET,), timeout_s=30)
        fast_end = Endpoint("fast", fast_receiver.url, (SPEC_SECRET,))
        live = LiveDelivery(Dispatcher(outbox, [slow_end, fast_end]))
        live.start()
        try:
            outbox.enqueue(make_match(1), [slow_end])
            live.wake()
            _wait_for(lambda: slow.started == 1)
            outbox.enqueue(make_match(2), [fast_end])
            live.wake()
            _wait_for(lambda: fast_receiver.webhook_ids == [make_match(2)["match_id"]])
            assert slow.requests == 0  # still answering the first: the new one did not wait
            result = live.stop(deadline_s=30)
        finally:
            outbox.close()
            slow.close()
    assert result.delivered == 2 and slow.requests == 1


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.01)


# ---------------------------------------------------------------------- keep-alive


class _CountingServer:
    """A plain HTTP/1.1 server counting connections, requests begun (``started``) and answered
    (``requests``); ``close_after`` closes each connection after that many requests without
    saying so (as a server's idle timeout does); each answer takes ``delay_s``."""

    def __init__(self, close_after: int | None = None, delay_s: float = 0.0) -> None:
        self.connections = 0
        self.started = 0
        self.requests = 0
        counter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                counter.connections += 1
                self.served = 0

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                counter.started += 1
                time.sleep(delay_s)
                counter.requests += 1
                self.served += 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if close_after is not None and self.served >= close_after:
                    self.close_connection = True

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_requests_to_one_server_share_a_kept_connection() -> None:
    server = _CountingServer()
    transport = HttpTransport()
    try:
        for _ in range(5):
            assert transport.post(server.url, b"{}", {}, 5.0).status == 200
        assert (server.requests, server.connections) == (5, 1)
    finally:
        transport.close()
        server.close()


def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    server = _CountingServer(close_after=1)
    transport = HttpTransport()
    try:
        for _ in range(3):
            assert transport.post(server.url, b"{}", {}, 5.0).status == 200
            time.sleep(0.05)  # the server's close reaches this side
        assert server.requests == 3 and server.connections == 3
    finally:
        transport.close()
        server.close()
