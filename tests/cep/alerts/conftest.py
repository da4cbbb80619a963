"""Fixtures for the webhook delivery tests: clocks, outboxes, scripted servers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alerts_support import Responder, ScriptedServer

from cep.alerts import ManualClock, Outbox


@pytest.fixture
def scripted_server() -> Iterator[Callable[..., ScriptedServer]]:
    """Factory for scripted servers, all shut down after the test."""
    servers: list[ScriptedServer] = []

    def start(responder: Responder | None = None) -> ScriptedServer:
        server = ScriptedServer(responder)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock starting at the real current second, so real verifiers accept it."""
    return ManualClock(start=float(int(time.time())))


@pytest.fixture
def outbox_path(tmp_path: Path) -> Path:
    return tmp_path / "outbox.sqlite"


@pytest.fixture
def outbox(outbox_path: Path, clock: ManualClock) -> Iterator[Outbox]:
    with Outbox(outbox_path, clock=clock) as box:
        yield box
