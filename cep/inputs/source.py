"""What every input is to the reader: a source of blocks of lines that can say where it stands
(a cursor) and start again from there, how often a followed one looks for more when nothing
tells it, and the signal that ends its wait."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from cep.inputs.chunks import Chunk, _Idle
from cep.inputs.lines import LineBlock

__all__ = ["POLL_INTERVAL_S", "Cursor", "LineSource", "StopSignal"]

POLL_INTERVAL_S = 0.02
"""How long a followed input waits before it looks again for new lines, files or entries,
when nothing wakes it sooner (a file or directory where inotify cannot watch it; stdin and
Redis wait in ``select`` and ``XREAD BLOCK``, which return as soon as something comes)."""

Cursor = dict[str, Any]
"""Where an input stands, as JSON: its ``kind`` (``file``, ``directory``, ``stdin``,
``redis``), what it read up to (a byte offset and line number per file, a Redis entry id) and
the ``position`` of its next event."""


class StopSignal(threading.Event):
    """Set to end a followed input's wait for more (the run is stopping).

    A wait that is not on the event itself (``select`` on a file descriptor) registers a
    callback with :meth:`on_set` that wakes it. :meth:`set` may run in a signal handler, so a
    callback takes no lock (a write to a pipe does it).
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        for callback in tuple(self._callbacks):
            callback()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the signal is set (now, if it is); returns what unregisters
        it."""
        self._callbacks.append(callback)
        if self.is_set():
            callback()

        def forget() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return forget


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
