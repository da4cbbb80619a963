"""The last events posted to each stream, kept in a bounded ring per stream: the console tries
an edited rule or query over them before it is saved (``POST /try``), and opens a rule's match
to the events it names (``GET /events/recent``). With a file (``recent.sqlite`` in the state
directory) the rings survive a restart; a query's match carries its document in the match log
instead (:func:`query_documents`).

A match names its events by their arrival position in the engine (a rule's ``events``). Every
line posted takes the next position, event or dead letter, in the order the engine fed the
batches; the ring gives each event its position from the batches' numbers and sizes
(``IngestResult``), starting at the engine's count when the service started.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cep.inputs import EventBatch, Piece

__all__ = ["MAX_DOCUMENT", "RECENT", "RECENT_FILE", "KeptEvent", "RecentEvents", "query_documents"]

log = logging.getLogger("vigil.serve")

RECENT = 1000
"""Events kept per stream by default."""

RECENT_FILE = "recent.sqlite"
"""The rings' file in a service's state directory."""

MAX_STREAMS = 256
"""Streams kept at most: a client naming a new stream per line cannot grow the rings forever."""

MAX_WAITING = 1024
"""Answered batches held while an earlier one is missing; past it, positions are given up."""

MAX_DOCUMENT = 64 << 10
"""The longest event line (characters) a query match carries as its ``document``."""

FLUSH_S = 1.0
"""How long new events wait in memory before they are written to the rings' file: writes are
grouped (at most a ring's size per stream each time), and a ``kill -9`` loses at most this."""

KeptEvent = tuple[int, int | None, dict[str, Any]]
"""(order across streams, arrival position in the engine or ``None``, the event)."""

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    stream TEXT NOT NULL,
    position INTEGER,
    event TEXT NOT NULL
);
CREATE INDEX events_by_stream ON events (stream, seq)
"""


class RecentEvents:
    """The newest ``size`` events of each stream, as the JSON objects they were posted as.

    Parameters
    ----------
    size:
        Events kept per stream (0: none).
    path:
        A SQLite file the rings are read from now and written to (within :data:`FLUSH_S` of
        each change, and by :meth:`close`): they survive a restart. It holds what the rings
        hold, no more. ``None``: in memory only.

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

    def __init__(self, size: int = RECENT, path: str | os.PathLike[str] | None = None, *,
                 flush_s: float = FLUSH_S) -> None:
        self.size = size
        self.flush_s = flush_s
        self._rings: dict[str, deque[KeptEvent]] = {}
        self._index: dict[int, tuple[str, dict[str, Any]]] = {}
        self._seq = 0  # the order of events across streams, for a trial that reads several
        self._position: int | None = None
        self._next_batch = 0
        self._waiting: dict[int, tuple[list[Piece], str | None, int, str | None]] = {}
        self._lock = threading.Lock()
        self.restored = 0
        """Events read back from ``path`` when the rings were made."""
        self._store: _RingFile | None = None
        if path is not None and size > 0:
            try:
                self._store = _RingFile(os.fspath(path))
                self._restore()
            except sqlite3.DatabaseError:  # a convenience: never a reason not to start
                log.exception("vigil serve: the recent events in %s cannot be read; they are "
                              "kept in memory only", path)
                if self._store is not None:
                    self._store.abandon()
                self._store = None
                self._rings.clear()
                self._index.clear()
                self.restored = 0

    @property
    def persistent(self) -> bool:
        """Whether the rings are kept in a file (and survive a restart)."""
        return self._store is not None

    def start(self, position: int, batch: int) -> None:
        """The engine's next arrival position and the number of the next batch it will feed."""
        with self._lock:
            self._position, self._next_batch = position, batch
            self._waiting.clear()
            # Kept from a past the engine no longer has (its checkpoint was deleted): those
            # positions will name other events.
            for stale in [p for p in self._index if p >= position]:
                del self._index[stale]

    def add(self, pieces: list[Piece], stream: str | None, *, batch: int | None = None,
            received: int = 0, sole: str | None = None) -> None:
        """Keep the events of a posted body (its pieces, :func:`cep.service.intake.parse_events`);
        ``stream`` binds every line, else each event's ``stream`` field says it, else ``sole``
        (the program's only stream, which the engine gives such events). ``batch`` and
        ``received`` are its number and line count as the engine fed it; batches may be added
        in any order, their events are kept in the engine's."""
        if self.size <= 0:
            return
        with self._lock:
            if batch is None or self._position is None:
                self._keep(pieces, stream, None, sole)
            else:
                self._waiting[batch] = (pieces, stream, received, sole)
                while self._next_batch in self._waiting:
                    pieces, stream, received, sole = self._waiting.pop(self._next_batch)
                    self._keep(pieces, stream, self._position, sole)
                    self._position += received
                    self._next_batch += 1
                if len(self._waiting) > MAX_WAITING:
                    self._give_up_positions()
        if self._store is not None:
            self._store.flush_soon(self.flush_s, self._flush)

    def add_at(self, pieces: list[Piece], stream: str | None, position: int,
               sole: str | None = None) -> None:
        """Keep the events of a posted body whose first line took arrival position
        ``position`` (known to whoever placed the lines: a Redis stream's length before them);
        ``stream`` and ``sole`` as :meth:`add` takes them."""
        if self.size <= 0:
            return
        with self._lock:
            self._keep(pieces, stream, position, sole)
        if self._store is not None:
            self._store.flush_soon(self.flush_s, self._flush)

    def lost_batch(self) -> None:
        """A batch failed in the engine: the positions of later events are not known."""
        with self._lock:
            self._give_up_positions()

    def _give_up_positions(self) -> None:
        waiting = [self._waiting[b] for b in sorted(self._waiting)]
        self._position = None
        self._waiting.clear()
        for pieces, stream, _, sole in waiting:
            self._keep(pieces, stream, None, sole)

    def _keep(self, pieces: list[Piece], stream: str | None, position: int | None,
              sole: str | None = None) -> None:
        for piece, first in _positions(pieces, position):
            if not isinstance(piece, EventBatch):
                continue
            raw = piece.raw
            # Only the tail can stay in the rings: parse no more of a large batch than that
            # (of a body of several streams, a longer tail, for the streams posted less).
            tail = self.size if stream is not None else self.size * 4
            for i in range(max(0, len(raw) - tail), len(raw)):
                event = _object(raw[i])
                if event is None:
                    continue
                name = stream if stream is not None else event.get("stream", sole)
                if isinstance(name, str):
                    self._append(name, None if first is None else first + i, event)

    def _append(self, name: str, position: int | None, event: dict[str, Any],
                seq: int | None = None) -> None:
        ring = self._rings.get(name)
        if ring is None:
            if len(self._rings) >= MAX_STREAMS:
                return
            ring = self._rings[name] = deque()
        if len(ring) >= self.size:
            _, old, _ = ring.popleft()
            if old is not None:
                self._index.pop(old, None)
        if seq is None:
            seq = self._seq
        ring.append((seq, position, event))
        self._seq = max(self._seq, seq + 1)
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

    def describe(self) -> dict[str, Any]:
        """What the console says of the rings: events kept per stream, the most a ring keeps,
        whether they survive a restart and how many were read back at the start."""
        return {"streams": self.streams(), "size": max(self.size, 0),
                "persistent": self.persistent, "restored": self.restored}

    # ------------------------------------------------------------------ the file

    def close(self) -> None:
        """Write what the file lacks and close it; the rings stay, in memory only."""
        store, self._store = self._store, None
        if store is not None:
            store.close(self._flush)

    def _restore(self) -> None:
        assert self._store is not None
        for seq, name, position, event in self._store.read():
            self._append(name, position, event, seq)
        self.restored = sum(len(ring) for ring in self._rings.values())
        self._store.flushed = self._seq - 1
        # A smaller size than the file was written with, or more streams: drop the rest there.
        self._store.trim(self._oldest())

    def _oldest(self) -> dict[str, int]:
        return {name: ring[0][0] for name, ring in self._rings.items() if ring}

    def _flush(self, store: _RingFile) -> None:
        """Write the events kept since the last flush, and forget those the rings dropped."""
        with self._lock:
            after = store.flushed
            rows = sorted((seq, name, position, event)
                          for name, ring in self._rings.items()
                          for seq, position, event in _newer(ring, after))
            oldest = self._oldest()
            top = self._seq - 1
        if rows or top != after:
            store.write(rows, oldest)
            store.flushed = top


def _newer(ring: deque[KeptEvent], after: int) -> list[KeptEvent]:
    """The events of ``ring`` (in order) whose order is above ``after``."""
    out: list[KeptEvent] = []
    for kept in reversed(ring):
        if kept[0] <= after:
            break
        out.append(kept)
    return out


class _RingFile:
    """The rings in SQLite: one row per kept event. Each write is one transaction (the rows
    added and the rows the rings dropped), so the file holds a ring's size per stream at most;
    a crash loses the rows not yet written, never the file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.flushed = -1  # the newest order written
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # A power cut may lose the last write: the rings are a convenience, not a record.
            db.execute("PRAGMA synchronous=NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                with _Transaction(db):
                    for statement in _SCHEMA.split(";"):
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            elif version != _SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"{path} has schema version {version}; this vigil "
                                            f"reads {_SCHEMA_VERSION}")
        except BaseException:
            db.close()
            raise
        self._db: sqlite3.Connection | None = db

    def _transaction(self):
        return _Transaction(self._db)

    def read(self) -> list[tuple[int, str, int | None, dict[str, Any]]]:
        rows = self._db.execute(
            "SELECT seq, stream, position, event FROM events ORDER BY seq").fetchall()
        out = []
        for seq, stream, position, text in rows:
            event = _object(text)
            if event is not None:
                out.append((seq, stream, position, event))
        return out

    def trim(self, oldest: Mapping[str, int]) -> None:
        """Keep the rows of the streams in ``oldest`` from that order on; delete the rest."""
        with self._lock, self._transaction():
            self._delete_before(oldest)
            names = list(oldest)
            marks = ",".join("?" * len(names))
            self._db.execute(f"DELETE FROM events WHERE stream NOT IN ({marks})", names)

    def write(self, rows: Sequence[tuple[int, str, int | None, dict[str, Any]]],
              oldest: Mapping[str, int]) -> None:
        with self._lock:
            if self._db is None:  # closed meanwhile: its own flush wrote these
                return
            self._write(rows, oldest)

    def _write(self, rows: Sequence[tuple[int, str, int | None, dict[str, Any]]],
               oldest: Mapping[str, int]) -> None:
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?)",
                [(seq, name, position, json.dumps(event, ensure_ascii=False,
                                                  separators=(",", ":")))
                 for seq, name, position, event in rows])
            self._delete_before(oldest)

    def _delete_before(self, oldest: Mapping[str, int]) -> None:
        self._db.executemany("DELETE FROM events WHERE stream = ? AND seq < ?",
                             list(oldest.items()))

    def flush_soon(self, delay_s: float, flush) -> None:
        """Run ``flush(self)`` in ``delay_s`` unless a run is already due."""
        with self._lock:
            if self._timer is not None or self._db is None:
                return
            self._timer = threading.Timer(delay_s, self._run, (flush,))
            self._timer.daemon = True
            self._timer.start()

    def _run(self, flush) -> None:
        with self._lock:
            self._timer = None
            if self._db is None:
                return
        try:
            flush(self)
        except (sqlite3.Error, OSError):  # logged; the next change tries again
            log.exception("vigil serve: writing the recent events to %s failed", self.path)

    def abandon(self) -> None:
        """Close without writing."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def close(self, flush) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        try:
            flush(self)
        except (sqlite3.Error, OSError):
            log.exception("vigil serve: writing the recent events to %s failed", self.path)
        with self._lock:
            self._db.close()
            self._db = None


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, kind, value, traceback) -> None:
        self._db.execute("ROLLBACK" if kind is not None else "COMMIT")


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _positions(pieces: list[Piece], position: int | None) -> Iterable[tuple[Piece, int | None]]:
    """Each piece with the arrival position of its first line: the engine gives every line,
    event or dead letter, the next one."""
    for piece in pieces:
        yield piece, position
        if position is not None:
            position += len(piece) if isinstance(piece, EventBatch) else 1


# ---------------------------------------------------------------------- a query's document


def query_documents(
    matches: Sequence[Mapping[str, Any]],
    pieces: list[Piece],
    stream: str | None,
    first_position: int,
    id_fields: Mapping[str, str | None],
) -> dict[int, tuple[int, dict[str, Any] | None]]:
    """For each query match of a batch (by its index in ``matches``): the arrival position of
    the event it matched and that event as posted (``None`` when its line is over
    :data:`MAX_DOCUMENT`).

    The engine names a query's document by its ``document_id``: the value of its stream's id
    field (``id_fields``, ``id`` when ``None``), else its arrival position. ``pieces`` is the
    batch as the engine fed it from ``first_position`` on; ``stream`` binds its lines.

    Examples
    --------
    >>> from cep.service.intake import parse_events
    >>> pieces = parse_events(b'{"stream": "n", "t": "a"}\\n'
    ...                       b'{"stream": "n", "t": "b", "id": "x"}\\n')
    >>> found = query_documents([{"kind": "query", "stream": "n", "document_id": "8"},
    ...                          {"kind": "rule"},
    ...                          {"kind": "query", "stream": "n", "document_id": "x"}],
    ...                         pieces, None, 8, {"n": None})
    >>> found
    {0: (8, {'stream': 'n', 't': 'a'}), 2: (9, {'stream': 'n', 't': 'b', 'id': 'x'})}
    """
    lines = _BatchLines(pieces, stream, first_position)
    out = {}
    for index, match in enumerate(matches):
        if match.get("kind") != "query":
            continue
        name, wanted = match.get("stream"), match.get("document_id")
        if not isinstance(name, str) or wanted is None:
            continue
        found = lines.find(name, str(wanted), id_fields.get(name) or "id")
        if found is not None:
            out[index] = found
    return out


class _BatchLines:
    """The event lines of one batch by arrival position, parsed as they are asked for."""

    def __init__(self, pieces: list[Piece], stream: str | None, first: int) -> None:
        self.stream = stream
        self.batches = [(start, piece) for piece, start in _positions(pieces, first)
                        if isinstance(piece, EventBatch)]
        self.starts = [start for start, _ in self.batches]
        self._parsed: dict[int, dict[str, Any] | None] = {}

    def find(self, name: str, wanted: str,
             id_field: str) -> tuple[int, dict[str, Any] | None] | None:
        if wanted.isdigit():  # the position of an event without an id, most likely
            position = int(wanted)
            event = self._event(position)
            if event is not None and self._of(event, name) and event.get(id_field) is None:
                return position, self._document(position, event)
        for start, piece in self.batches:  # else by its id: the lines that hold it
            for i, raw in enumerate(piece.raw):
                if wanted not in raw:
                    continue
                event = self._event(start + i)
                if event is not None and self._of(event, name) and \
                        wanted in _id_texts(event.get(id_field)):
                    return start + i, self._document(start + i, event)
        return None

    def _of(self, event: dict[str, Any], name: str) -> bool:
        return (self.stream if self.stream is not None else event.get("stream")) == name

    def _raw(self, position: int) -> str | None:
        at = bisect.bisect_right(self.starts, position) - 1
        if at < 0:
            return None
        start, piece = self.batches[at]
        return piece.raw[position - start] if position - start < len(piece) else None

    def _event(self, position: int) -> dict[str, Any] | None:
        if position not in self._parsed:
            raw = self._raw(position)
            self._parsed[position] = None if raw is None else _object(raw)
        return self._parsed[position]

    def _document(self, position: int, event: dict[str, Any]) -> dict[str, Any] | None:
        raw = self._raw(position)
        return event if raw is not None and len(raw) <= MAX_DOCUMENT else None


def _id_texts(value: Any) -> set[str]:
    """The names the engine may give a document whose id field holds ``value`` (``Event.id``;
    a whole float is an int where the field is declared one)."""
    if value is None:
        return set()
    if isinstance(value, float) and value.is_integer():
        return {str(value), str(int(value))}
    return {str(value)}
