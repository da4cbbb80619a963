"""The last events posted to each stream, kept in a bounded ring per stream: the console tries
an edited rule or query over them before it is saved (``POST /try``), and opens a match to the
events it names (``GET /events/recent``).

A match names its events by their arrival position in the engine (a rule's ``events``, a
query's ``document_id``). Every line posted takes the next position, event or dead letter, in
the order the engine fed the batches; the ring gives each event its position from the batches'
numbers and sizes (``IngestResult``), starting at the engine's count when the service started.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from cep.inputs import EventBatch, Piece

__all__ = ["RECENT", "KeptEvent", "RecentEvents"]

RECENT = 1000
"""Events kept per stream by default."""

MAX_STREAMS = 256
"""Streams kept at most: a client naming a new stream per line cannot grow the rings forever."""

MAX_WAITING = 1024
"""Answered batches held while an earlier one is missing; past it, positions are given up."""

KeptEvent = tuple[int, int | None, dict[str, Any]]
"""(order across streams, arrival position in the engine or ``None``, the event)."""


class RecentEvents:
    """The newest ``size`` events of each stream, as the JSON objects they were posted as.

    Examples
    --------
    >>> from cep.service.intake import parse_events
    >>> ring = RecentEvents(size=2)
    >>> ring.start(position=10, batch=1)
    >>> body = (b'{"stream": "s", "v": 1}\\n{oops\\n'
    ...         b'{"stream": "s", "v": 2}\\n{"stream": "s", "v": 3}\\n')
    >>> ring.add(parse_events(body), None, batch=1, received=4)
    >>> [(position, e["v"]) for _, position, e in ring.last("s", 10)]
    [(12, 2), (13, 3)]
    >>> ring.at([13, 10])
    {13: ('s', {'stream': 's', 'v': 3})}
    """

    def __init__(self, size: int = RECENT) -> None:
        self.size = size
        self._rings: dict[str, deque[KeptEvent]] = {}
        self._index: dict[int, tuple[str, dict[str, Any]]] = {}
        self._seq = 0  # the order of events across streams, for a trial that reads several
        self._position: int | None = None
        self._next_batch = 0
        self._waiting: dict[int, tuple[list[Piece], str | None, int]] = {}
        self._lock = threading.Lock()

    def start(self, position: int, batch: int) -> None:
        """The engine's next arrival position and the number of the next batch it will feed."""
        with self._lock:
            self._position, self._next_batch = position, batch
            self._waiting.clear()

    def add(self, pieces: list[Piece], stream: str | None, *, batch: int | None = None,
            received: int = 0) -> None:
        """Keep the events of a posted body (its pieces, :func:`cep.service.intake.parse_events`);
        ``stream`` binds every line, else each event's ``stream`` field says it. ``batch`` and
        ``received`` are its number and line count as the engine fed it; batches may be added
        in any order, their events are kept in the engine's."""
        if self.size <= 0:
            return
        with self._lock:
            if batch is None or self._position is None:
                self._keep(pieces, stream, None)
                return
            self._waiting[batch] = (pieces, stream, received)
            while self._next_batch in self._waiting:
                pieces, stream, received = self._waiting.pop(self._next_batch)
                self._keep(pieces, stream, self._position)
                self._position += received
                self._next_batch += 1
            if len(self._waiting) > MAX_WAITING:
                self._give_up_positions()

    def lost_batch(self) -> None:
        """A batch failed in the engine: the positions of later events are not known."""
        with self._lock:
            self._give_up_positions()

    def _give_up_positions(self) -> None:
        waiting = [self._waiting[b] for b in sorted(self._waiting)]
        self._position = None
        self._waiting.clear()
        for pieces, stream, _ in waiting:
            self._keep(pieces, stream, None)

    def _keep(self, pieces: list[Piece], stream: str | None, position: int | None) -> None:
        for piece, first in _positions(pieces, position):
            if not isinstance(piece, EventBatch):
                continue
            raw = piece.raw
            # Only the tail can stay in the rings: parse no more of a large batch than that
            # (of a body of several streams, a longer tail, for the streams posted less).
            tail = self.size if stream is not None else self.size * 4
            for i in range(max(0, len(raw) - tail), len(raw)):
                try:
                    event = json.loads(raw[i])
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                name = stream if stream is not None else event.get("stream")
                if isinstance(name, str):
                    self._append(name, None if first is None else first + i, event)

    def _append(self, name: str, position: int | None, event: dict[str, Any]) -> None:
        ring = self._rings.get(name)
        if ring is None:
            if len(self._rings) >= MAX_STREAMS:
                return
            ring = self._rings[name] = deque()
        if len(ring) >= self.size:
            _, old, _ = ring.popleft()
            if old is not None:
                self._index.pop(old, None)
        ring.append((self._seq, position, event))
        self._seq += 1
        if position is not None:
            self._index[position] = (name, event)

    def last(self, stream: str, count: int) -> list[KeptEvent]:
        """The newest ``count`` events of ``stream``, oldest first."""
        with self._lock:
            ring = self._rings.get(stream)
            if ring is None or count <= 0:
                return []
            return list(ring)[-count:]

    def at(self, positions: Iterable[int]) -> dict[int, tuple[str, dict[str, Any]]]:
        """The kept events at these arrival positions (the others are no longer kept)."""
        with self._lock:
            return {p: self._index[p] for p in positions if p in self._index}

    def streams(self) -> dict[str, int]:
        """Events kept per stream."""
        with self._lock:
            return {name: len(ring) for name, ring in sorted(self._rings.items())}


def _positions(pieces: list[Piece], position: int | None) -> Iterable[tuple[Piece, int | None]]:
    """Each piece with the arrival position of its first line: the engine gives every line,
    event or dead letter, the next one."""
    for piece in pieces:
        yield piece, position
        if position is not None:
            position += len(piece) if isinstance(piece, EventBatch) else 1
