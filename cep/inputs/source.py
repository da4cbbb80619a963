"""What every input is to the reader: a source of blocks of lines that can say where it stands
(a cursor) and start again from there, and how often a followed one looks for more."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Protocol

from cep.inputs.chunks import Chunk, _Idle
from cep.inputs.lines import LineBlock

__all__ = ["POLL_INTERVAL_S", "Cursor", "LineSource", "StopSignal"]

POLL_INTERVAL_S = 0.02
"""How long a followed input waits before it looks again for new lines, files or entries."""

Cursor = dict[str, Any]
"""Where an input stands, as JSON: its ``kind`` (``file``, ``directory``, ``stdin``,
``redis``), what it read up to (a byte offset and line number per file, a Redis entry id) and
the ``position`` of its next event."""


class StopSignal(threading.Event):
    """Set to end a followed input's wait for more (the run is stopping)."""


class LineSource(Protocol):
    """An input as the reader sees it."""

    position: int
    """The position of the first event it gives (from its cursor, else 0)."""

    def blocks(self, stop: StopSignal) -> Iterator[LineBlock | _Idle]:
        """Its lines; a followed input yields ``IDLE`` whenever it has nothing more for now,
        and ends when ``stop`` is set."""

    def marks(self) -> dict[str, dict[str, Any]]:
        """Where each of its sources stood when it started (from its cursor)."""

    def cursor(self, chunk: Chunk) -> Cursor:
        """Where it stands once ``chunk`` is fed."""
