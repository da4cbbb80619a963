"""The match log of ``vigil serve``: every match and dead letter the engine reported, each under
a monotonic cursor, and the event batches posted since the last engine checkpoint — all in one
SQLite file (``serve.sqlite`` in the state directory).

A batch's matches, dead letters and events are written in one transaction, the one that
acknowledges its ``POST /events``: after a crash the log holds each acknowledged batch whole
and nothing of the others. The batches are the engine's write-ahead log: a restart restores the
latest checkpoint and feeds the batches after it again, discarding what they report (it is in
the log already), so that the engine's state is the one it had when it died
(:mod:`cep.service.runner`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchRecord", "MatchLog", "Notifier", "Subscription"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE matches (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    batch INTEGER NOT NULL,
    name TEXT NOT NULL,
    registry_version INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX matches_by_name ON matches (name, cursor);
CREATE TABLE dead_letters (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    batch INTEGER NOT NULL,
    reason TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX dead_letters_by_reason ON dead_letters (reason, cursor);
CREATE TABLE batches (
    batch INTEGER PRIMARY KEY,
    registry_version INTEGER NOT NULL,
    stream TEXT,
    body BLOB NOT NULL
)
"""

# The two logs a client can page through: table, the column ``name`` filters on.
_LOGS = {"matches": "name", "dead_letters": "reason"}


@dataclass
class BatchRecord:
    """One posted batch as the engine fed it: its number, the registry version it ran under,
    its body and stream (for a replay), and what it reported.

    ``documents`` gives, by index in ``matches``, the arrival position and the posted event of
    a query's match (:func:`cep.service.recent.query_documents`): the log stores them with the
    match as ``document_position`` and ``document``, for a reader to see what it matched."""

    batch: int
    registry_version: int
    body: bytes
    stream: str | None = None
    matches: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    documents: dict[int, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)


class MatchLog:
    """The log at ``state_dir/serve.sqlite`` (created if missing).

    One connection writes (the engine's thread), another reads (the API's threads): WAL
    journaling lets reads go on during a write. ``synchronous=FULL``: a committed batch
    survives a power cut.

    Examples
    --------
    >>> import tempfile
    >>> log = MatchLog(tempfile.mkdtemp())
    >>> log.commit([BatchRecord(1, 3, b'{"x": 1}\\n',
    ...                         matches=[{"name": "big", "match_id": "m1"}])])
    >>> log.read("matches", after=0, limit=10)
    [{'name': 'big', 'match_id': 'm1', 'registry_version': 3, 'batch': 1, 'cursor': 1}]
    >>> [(b.batch, b.body) for b in log.batches(after=0)]
    [(1, b'{"x": 1}\\n')]
    >>> log.close()
    """

    FILENAME = "serve.sqlite"

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(os.fspath(state_dir), self.FILENAME)
        self.notifier = Notifier()
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._writer = self._connect()
        with self._transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"{self.path} has schema version {version}; this vigil reads "
                    f"{SCHEMA_VERSION}"
                )
        self._reader = self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=30.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    # ------------------------------------------------------------------ writing

    def commit(self, records: Sequence[BatchRecord]) -> None:
        """Store batches with their matches and dead letters, all or nothing; then wake the
        readers that wait for more (:meth:`Notifier.subscribe`)."""
        if not records:
            return
        with self._transaction() as db:
            for record in records:
                db.execute(
                    "INSERT INTO batches VALUES (?, ?, ?, ?)",
                    (record.batch, record.registry_version, record.stream, record.body),
                )
                db.executemany(
                    "INSERT INTO matches (batch, name, registry_version, body) "
                    "VALUES (?, ?, ?, ?)",
                    [
                        (record.batch, str(m.get("name", "")), record.registry_version,
                         _json({**m, **_document(record, i),
                                "registry_version": record.registry_version,
                                "batch": record.batch}))
                        for i, m in enumerate(record.matches)
                    ],
                )
                db.executemany(
                    "INSERT INTO dead_letters (batch, reason, body) VALUES (?, ?, ?)",
                    [(record.batch, str(d.get("reason", "")), _json({**d, "batch": record.batch}))
                     for d in record.dead_letters],
                )
        self.notifier.notify()

    def add_dead_letters(self, letters: Sequence[dict[str, Any]], batch: int) -> None:
        """Store dead letters that belong to no logged batch (under number ``batch``), then
        wake the readers."""
        if not letters:
            return
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO dead_letters (batch, reason, body) VALUES (?, ?, ?)",
                [(batch, str(d.get("reason", "")), _json(d)) for d in letters],
            )
        self.notifier.notify()

    def forget_batches(self, upto: int) -> None:
        """Drop the events of batches ``<= upto`` (a checkpoint holds their effect now)."""
        with self._transaction() as db:
            db.execute("DELETE FROM batches WHERE batch <= ?", (upto,))

    # ------------------------------------------------------------------ reading

    def batches(self, after: int) -> list[BatchRecord]:
        """The batches after number ``after``, in order (their events only)."""
        with self._read_lock:
            rows = self._reader.execute(
                "SELECT batch, registry_version, stream, body FROM batches WHERE batch > ? "
                "ORDER BY batch", (after,),
            ).fetchall()
        return [BatchRecord(r[0], r[1], bytes(r[3]), r[2]) for r in rows]

    def last_batch(self, default: int = 0) -> int:
        """The largest batch number logged (``default`` when none is)."""
        with self._read_lock:
            found = self._reader.execute("SELECT max(batch) FROM batches").fetchone()[0]
        return default if found is None else int(found)

    def read(
        self, log: str, *, after: int, limit: int, name: str | None = None
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` entries of ``log`` (``matches`` or ``dead_letters``) after cursor
        ``after``, oldest first, each with its ``cursor``; ``name`` filters on the match's
        name (a dead letter's reason)."""
        column = _LOGS[log]
        where, params = "cursor > ?", [after]
        if name is not None:
            where += f" AND {column} = ?"
            params.append(name)
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT cursor, body FROM {log} WHERE {where} ORDER BY cursor LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [{**json.loads(body), "cursor": cursor} for cursor, body in rows]

    def newest(self, log: str, *, limit: int, name: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` entries of ``log`` (of ``name``), oldest first."""
        column = _LOGS[log]
        where, params = ("", []) if name is None else (f"WHERE {column} = ?", [name])
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT cursor, body FROM {log} {where} ORDER BY cursor DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [{**json.loads(body), "cursor": cursor} for cursor, body in reversed(rows)]

    def last_cursor(self, log: str) -> int:
        """The newest cursor of ``log`` (0 when empty)."""
        if log not in _LOGS:
            raise ValueError(f"no log named {log!r}")
        with self._read_lock:
            row = self._reader.execute(f"SELECT max(cursor) FROM {log}").fetchone()
        return int(row[0] or 0)

    def close(self) -> None:
        with self._write_lock, self._read_lock:
            self._writer.close()
            self._reader.close()


def _document(record: BatchRecord, index: int) -> dict[str, Any]:
    found = record.documents.get(index)
    if found is None:
        return {}
    position, document = found
    if document is None:  # too large to copy into every match of it
        return {"document_position": position}
    return {"document_position": position, "document": document}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


class Subscription:
    """A reader waiting for new entries: :meth:`wait` returns when a commit happened since the
    last :meth:`arm` (so a commit between reading and waiting is never missed)."""

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def arm(self) -> None:
        """Call before reading: a commit from now on wakes :meth:`wait`."""
        self._event.clear()

    async def wait(self, timeout_s: float) -> bool:
        """Whether a commit came (``False``: the timeout passed first)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _wake(self) -> None:
        self._loop.call_soon_threadsafe(self._event.set)

    def __enter__(self) -> Subscription:
        self._notifier._add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._notifier._remove(self)


class Notifier:
    """Wakes the API's waiting readers (Server-Sent Events) from the engine's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: set[Subscription] = set()

    def subscribe(self) -> Subscription:
        """A subscription for the running event loop (use it as a context manager)."""
        return Subscription(self)

    def notify(self) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            try:
                subscription._wake()
            except RuntimeError:  # its loop closed: the client is gone
                self._remove(subscription)

    def _add(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions.add(subscription)

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions.discard(subscription)
