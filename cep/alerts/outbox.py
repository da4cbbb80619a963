"""Durable outbox: one SQLite (WAL) row per (match, endpoint), written before a match is acked.

Every state change of a message and the attempt that caused it are written in one
transaction, so a crash at any point leaves either the old or the new state — never a lost
message. A crash after a response but before its row is updated means the message is sent
again; receivers deduplicate on ``webhook-id``. A new message is on disk (``fsync``) before
:meth:`Outbox.store` returns; an attempt's record is not forced to disk (one ``fsync`` per
webhook would bound a busy endpoint's rate by the disk's): a power loss right after it is then
the crash before it, and the message is sent again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from .clock import Clock, SystemClock
from .endpoint import Endpoint
from .envelope import MATCH_EVENT_TYPE, checked_match_id, envelope_body
from .errors import AlertConfigError, OutboxError

__all__ = [
    "AttemptRecord",
    "DeadLetter",
    "DeliveryState",
    "EndpointStatus",
    "Message",
    "Outbox",
    "Outcome",
    "QueuedAlert",
    "replay",
    "status",
]

SCHEMA_VERSION = 2
"""Version 2 adds ``endpoints.conflicts``; a version-1 outbox is upgraded when opened."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS endpoints (
    name            TEXT PRIMARY KEY,
    url             TEXT NOT NULL,
    disabled_at     REAL,
    disabled_reason TEXT,
    duplicates      INTEGER NOT NULL DEFAULT 0,
    conflicts       INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS messages (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id          TEXT NOT NULL,
    endpoint        TEXT NOT NULL REFERENCES endpoints(name),
    event_type      TEXT NOT NULL,
    body            BLOB NOT NULL,
    state           TEXT NOT NULL
                    CHECK (state IN ('pending', 'delivered', 'failed', 'disabled')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    delivered_at    REAL,
    UNIQUE (msg_id, endpoint)
);
CREATE INDEX IF NOT EXISTS messages_by_state ON messages (state, endpoint, seq);
CREATE TABLE IF NOT EXISTS attempts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    seq             INTEGER NOT NULL REFERENCES messages(seq),
    msg_id          TEXT NOT NULL,
    endpoint        TEXT NOT NULL,
    url             TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    attempted_at    REAL NOT NULL,
    status          INTEGER,
    error           TEXT,
    latency_ms      REAL NOT NULL,
    outcome         TEXT NOT NULL,
    next_attempt_at REAL
);
CREATE INDEX IF NOT EXISTS attempts_by_message ON attempts (seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    seq             INTEGER NOT NULL UNIQUE REFERENCES messages(seq),
    msg_id          TEXT NOT NULL,
    endpoint        TEXT NOT NULL,
    reason          TEXT NOT NULL,
    last_status     INTEGER,
    attempts        INTEGER NOT NULL,
    dead_at         REAL NOT NULL
);
"""


class DeliveryState(StrEnum):
    """Lifecycle of one (match, endpoint) message."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    DISABLED = "disabled"


class Outcome(StrEnum):
    """What one attempt led to."""

    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True)
class Message:
    """One webhook to deliver: a match's envelope addressed to one endpoint.

    ``seq`` is the enqueue order; each endpoint receives its messages in ``seq`` order.
    """

    seq: int
    msg_id: str
    endpoint: str
    event_type: str
    body: bytes
    state: DeliveryState
    attempts: int
    next_attempt_at: float | None
    last_status: int | None
    last_error: str | None
    created_at: float
    delivered_at: float | None


@dataclass(frozen=True)
class QueuedAlert:
    """A match to store for its endpoints, checked and serialised (:meth:`Outbox.prepare`),
    not yet on disk."""

    msg_id: str
    body: bytes
    endpoints: tuple[Endpoint, ...]
    event_type: str
    created_at: float


@dataclass(frozen=True)
class AttemptRecord:
    """One row of the delivery log."""

    id: int
    seq: int
    msg_id: str
    endpoint: str
    url: str
    attempt: int
    attempted_at: float
    status: int | None
    error: str | None
    latency_ms: float
    outcome: Outcome
    next_attempt_at: float | None


@dataclass(frozen=True)
class DeadLetter:
    """A message that will not be delivered without a :func:`replay`, and why."""

    seq: int
    msg_id: str
    endpoint: str
    reason: str
    last_status: int | None
    attempts: int
    dead_at: float


@dataclass(frozen=True)
class EndpointStatus:
    """Per-endpoint message counts, as shown by ``vigil alerts status``."""

    endpoint: str
    url: str
    pending: int = 0
    delivered: int = 0
    failed: int = 0
    disabled: int = 0
    duplicates: int = 0
    conflicts: int = 0
    endpoint_disabled: bool = False


def _message(row: sqlite3.Row) -> Message:
    return Message(
        seq=row["seq"],
        msg_id=row["msg_id"],
        endpoint=row["endpoint"],
        event_type=row["event_type"],
        body=bytes(row["body"]),
        state=DeliveryState(row["state"]),
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        last_status=row["last_status"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        delivered_at=row["delivered_at"],
    )


class Outbox:
    """The on-disk queue of webhook messages (SQLite in WAL mode, synchronous=FULL).

    Safe to share between threads of one process. Run at most one :class:`Dispatcher` per
    outbox file at a time; several would each send the same due messages.

    Parameters
    ----------
    path : str or os.PathLike
        Database file; created with its schema if missing.
    clock : Clock, optional
        Source of ``created_at`` and replay times; defaults to the system clock.

    Raises
    ------
    OutboxError
        If the file is not a database or holds a schema this version does not know.

    Examples
    --------
    >>> import os, tempfile
    >>> from cep.alerts import Endpoint, new_secret
    >>> ops = Endpoint("ops", "https://hooks.example.com/in", (new_secret(),))
    >>> outbox = Outbox(os.path.join(tempfile.mkdtemp(), "outbox.sqlite"))
    >>> outbox.enqueue({"match_id": "m1", "name": "probe"}, [ops])
    1
    >>> outbox.enqueue({"match_id": "m1", "name": "probe"}, [ops])  # the same match again
    0
    >>> [(m.msg_id, m.endpoint, m.state.value) for m in outbox.messages()]
    [('m1', 'ops', 'pending')]
    >>> outbox.close()
    """

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock | None = None) -> None:
        self.path = os.fspath(path)
        self._clock = clock or SystemClock()
        # Two connections: new messages are stored through their own, so that reading the
        # outbox (the delivery's next message) never waits behind a store's fsync; the write
        # lock orders the write transactions of both, which SQLite would order by polling.
        self._lock = threading.RLock()
        self._store_lock = threading.RLock()
        self._write_lock = threading.RLock()
        self.conflicts = 0
        self._db = self._connect()
        try:
            self._initialise()
            self._store_db = self._connect()
            self._store_db.execute("PRAGMA synchronous=FULL")
            self._store_db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise OutboxError(f"{self.path!r} is not a usable outbox: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot open outbox {self.path!r}: {exc}") from exc
        db.row_factory = sqlite3.Row
        return db

    def _initialise(self) -> None:
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise OutboxError(f"outbox {self.path!r} needs WAL journaling, got {mode!r}")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if tables:
                    raise OutboxError(f"{self.path!r} is a SQLite database but not an outbox")
                # executescript() would commit the open transaction, so run statements one by one.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version == 1:
                db.execute(
                    "ALTER TABLE endpoints ADD COLUMN conflicts INTEGER NOT NULL DEFAULT 0"
                )
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise OutboxError(
                    f"outbox {self.path!r} has schema version {version};"
                    f" this version of vigil reads {SCHEMA_VERSION}"
                )

    @contextmanager
    def _transaction(
        self, *, synced: bool = True, storing: bool = False
    ) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``synced=False`` commits it without an ``fsync`` (it
        survives the process being killed, not a power loss; the next synced commit makes it
        durable too); ``storing`` runs it on the connection that stores new messages."""
        db, lock = (self._store_db, self._store_lock) if storing else (self._db, self._lock)
        with self._write_lock, lock:
            if not synced:
                db.execute("PRAGMA synchronous=NORMAL")
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            finally:
                if not synced:
                    db.execute("PRAGMA synchronous=FULL")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def close(self) -> None:
        """Close the database connections."""
        with self._write_lock, self._store_lock, self._lock:
            self._store_db.close()
            self._db.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Outbox({self.path!r})"

    # -- writing ---------------------------------------------------------------------------

    def enqueue(
        self,
        match: Mapping[str, Any],
        endpoints: Sequence[Endpoint],
        *,
        event_type: str = MATCH_EVENT_TYPE,
    ) -> int:
        """Durably store ``match`` for delivery to each endpoint; return how many were new.

        A (match_id, endpoint) pair already in the outbox, in any state, with the same match
        content is not stored again and is counted as a duplicate — so re-running over the
        same input sends nothing new. A *different* match under an id already used (which the
        engines' id scheme rules out, but another producer may not) is never dropped: it is
        stored under the id ``MATCH_ID.DIGEST`` (its content's digest, so a replay of it is a
        duplicate again) and counted in the endpoint's ``conflicts`` and in :attr:`conflicts`.
        Messages for a disabled endpoint are stored as ``disabled``.

        Raises
        ------
        InvalidMatchError
            If the match has no usable ``match_id`` or is not JSON-serialisable.
        """
        return self.enqueue_many([(match, endpoints)], event_type=event_type)

    def enqueue_many(
        self,
        items: Sequence[tuple[dict[str, Any], Sequence[Endpoint]]],
        *,
        event_type: str = MATCH_EVENT_TYPE,
    ) -> int:
        """Durably store each ``(match, endpoints)`` of ``items`` as :meth:`enqueue` does, all
        in one transaction (one write to disk for a batch's alerts, not one an alert); return
        how many were new.

        Raises
        ------
        InvalidMatchError
            If a match has no usable ``match_id`` or is not JSON-serialisable (nothing of
            ``items`` is stored then).
        """
        return self.store(self.prepare(items, event_type=event_type))

    def prepare(
        self,
        items: Sequence[tuple[dict[str, Any], Sequence[Endpoint]]],
        *,
        event_type: str = MATCH_EVENT_TYPE,
    ) -> list[QueuedAlert]:
        """Check and serialise each ``(match, endpoints)`` of ``items``, for :meth:`store`
        (in the thread that has the matches, so that a bad one is reported there).

        Raises
        ------
        InvalidMatchError
            If a match has no usable ``match_id`` or is not JSON-serialisable.
        """
        now = self._clock.now()
        prepared = []
        for match, endpoints in items:
            msg_id = checked_match_id(match)
            for endpoint in endpoints:
                if not isinstance(endpoint, Endpoint):
                    raise AlertConfigError(f"expected Endpoint, got {type(endpoint).__name__}")
            body = envelope_body(match, event_type=event_type, created_at=now)
            prepared.append(QueuedAlert(msg_id, body, tuple(endpoints), event_type, now))
        return prepared

    def store(self, alerts: Sequence[QueuedAlert]) -> int:
        """Durably store ``alerts`` (from :meth:`prepare`), all in one transaction, as
        :meth:`enqueue` does; return how many messages were new. Once it returns, they are on
        disk (``synchronous=FULL``)."""
        if not alerts:
            return 0
        stored = 0
        with self._transaction(storing=True) as db:
            for alert in alerts:
                stored += self._store(
                    db, alert.msg_id, alert.body, alert.endpoints, alert.event_type,
                    alert.created_at,
                )
        return stored

    def _store(
        self,
        db: sqlite3.Connection,
        msg_id: str,
        body: bytes,
        endpoints: Sequence[Endpoint],
        event_type: str,
        now: float,
    ) -> int:
        stored = 0
        for endpoint in endpoints:
            db.execute(
                "INSERT INTO endpoints (name, url) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET url = excluded.url",
                (endpoint.name, endpoint.masked_url),
            )
            disabled = db.execute(
                "SELECT disabled_at IS NOT NULL FROM endpoints WHERE name = ?",
                (endpoint.name,),
            ).fetchone()[0]
            state = DeliveryState.DISABLED if disabled else DeliveryState.PENDING
            row = (endpoint.name, event_type, body, state.value, now)
            if _insert(db, msg_id, *row):
                stored += 1
                continue
            conflict = not _same_match(db, msg_id, endpoint.name, body) and _insert(
                db, f"{msg_id}.{_digest(json.loads(body)['data'])}", *row
            )
            column = "conflicts" if conflict else "duplicates"
            db.execute(
                f"UPDATE endpoints SET {column} = {column} + 1 WHERE name = ?",
                (endpoint.name,),
            )
            if conflict:
                stored += 1
                self.conflicts += 1
        return stored

    def record_attempt(
        self,
        message: Message,
        *,
        url: str,
        attempted_at: float,
        status: int | None,
        error: str | None,
        latency_ms: float,
        outcome: Outcome,
        next_attempt_at: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Log one attempt and move its message to the state ``outcome`` implies, atomically.

        Parameters
        ----------
        message : Message
            The message as it was claimed (its ``attempts`` before this one).
        url : str
            The endpoint URL, already masked.
        outcome : Outcome
            ``DELIVERED``; ``RETRY`` (needs ``next_attempt_at``); ``FAILED`` (dead-letters the
            message with ``reason``); ``DISABLED`` (disables the endpoint and parks all of its
            pending messages).
        """
        if outcome is Outcome.RETRY and next_attempt_at is None:
            raise AlertConfigError("a retry needs next_attempt_at")
        attempt = message.attempts + 1
        # Not synced: lost with a power loss, the attempt is made again (see the module's doc).
        with self._transaction(synced=False) as db:
            db.execute(
                "INSERT INTO attempts (seq, msg_id, endpoint, url, attempt, attempted_at,"
                " status, error, latency_ms, outcome, next_attempt_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    message.seq,
                    message.msg_id,
                    message.endpoint,
                    url,
                    attempt,
                    attempted_at,
                    status,
                    error,
                    latency_ms,
                    outcome.value,
                    next_attempt_at if outcome is Outcome.RETRY else None,
                ),
            )
            state = {
                Outcome.DELIVERED: DeliveryState.DELIVERED,
                Outcome.RETRY: DeliveryState.PENDING,
                Outcome.FAILED: DeliveryState.FAILED,
                Outcome.DISABLED: DeliveryState.DISABLED,
            }[outcome]
            db.execute(
                "UPDATE messages SET state = ?, attempts = ?, next_attempt_at = ?,"
                " last_status = ?, last_error = ?, delivered_at = ? WHERE seq = ?",
                (
                    state.value,
                    attempt,
                    next_attempt_at if outcome is Outcome.RETRY else None,
                    status,
                    error,
                    attempted_at if outcome is Outcome.DELIVERED else None,
                    message.seq,
                ),
            )
            if outcome is Outcome.FAILED:
                db.execute(
                    "INSERT INTO dead_letters"
                    " (seq, msg_id, endpoint, reason, last_status, attempts, dead_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (seq) DO UPDATE SET"
                    " reason = excluded.reason, last_status = excluded.last_status,"
                    " attempts = excluded.attempts, dead_at = excluded.dead_at",
                    (
                        message.seq,
                        message.msg_id,
                        message.endpoint,
                        reason or error or f"HTTP {status}",
                        status,
                        attempt,
                        attempted_at,
                    ),
                )
            elif outcome is Outcome.DISABLED:
                self._disable(db, message.endpoint, reason or f"HTTP {status}", attempted_at)

    @staticmethod
    def _disable(db: sqlite3.Connection, endpoint: str, reason: str, at: float) -> int:
        db.execute(
            "UPDATE endpoints SET disabled_at = ?, disabled_reason = ? WHERE name = ?",
            (at, reason, endpoint),
        )
        return db.execute(
            "UPDATE messages SET state = 'disabled', next_attempt_at = NULL"
            " WHERE endpoint = ? AND state = 'pending'",
            (endpoint,),
        ).rowcount

    def disable_endpoint(self, name: str, reason: str) -> int:
        """Stop delivering to ``name``; its pending messages are parked as ``disabled``.

        Returns the number of messages parked.
        """
        with self._transaction() as db:
            self._require_endpoint(db, name)
            return self._disable(db, name, reason, self._clock.now())

    def enable_endpoint(self, name: str) -> int:
        """Resume delivering to ``name``; its disabled messages become due now, in order.

        Returns the number of messages resumed.
        """
        now = self._clock.now()
        with self._transaction() as db:
            self._require_endpoint(db, name)
            db.execute(
                "UPDATE endpoints SET disabled_at = NULL, disabled_reason = NULL WHERE name = ?",
                (name,),
            )
            return db.execute(
                "UPDATE messages SET state = 'pending', next_attempt_at = ?"
                " WHERE endpoint = ? AND state = 'disabled'",
                (now, name),
            ).rowcount

    @staticmethod
    def _require_endpoint(db: sqlite3.Connection, name: str) -> None:
        if db.execute("SELECT 1 FROM endpoints WHERE name = ?", (name,)).fetchone() is None:
            raise AlertConfigError(f"the outbox has no endpoint named {name!r}")

    def replay(self, since: datetime, endpoint: str | None = None) -> int:
        """Re-queue delivered and failed messages created at or after ``since``.

        They keep their ``webhook-id`` (receivers deduplicate) and restart the retry schedule.
        Messages of a disabled endpoint are re-queued as ``disabled``. Returns the count.

        Raises
        ------
        AlertConfigError
            If ``since`` is a naive datetime (ambiguous) or ``endpoint`` is unknown.
        """
        if since.tzinfo is None or since.utcoffset() is None:
            raise AlertConfigError("replay needs a timezone-aware datetime, e.g. with tz=UTC")
        cutoff = since.timestamp()
        now = self._clock.now()
        where = "state IN ('delivered', 'failed') AND created_at >= ?"
        params: list[Any] = [cutoff]
        if endpoint is not None:
            where += " AND endpoint = ?"
            params.append(endpoint)
        with self._transaction() as db:
            if endpoint is not None:
                self._require_endpoint(db, endpoint)
            db.execute(
                f"DELETE FROM dead_letters WHERE seq IN (SELECT seq FROM messages WHERE {where})",
                params,
            )
            return db.execute(
                "UPDATE messages SET"
                " state = CASE WHEN (SELECT disabled_at FROM endpoints"
                "   WHERE endpoints.name = messages.endpoint) IS NULL"
                "   THEN 'pending' ELSE 'disabled' END,"
                " attempts = 0, next_attempt_at = ?, delivered_at = NULL"
                f" WHERE {where}",
                [now, *params],
            ).rowcount

    # -- reading ---------------------------------------------------------------------------

    def heads(self) -> list[Message]:
        """Return each endpoint's oldest pending message (the only one it may be sent)."""
        rows = self._query(
            "SELECT m.* FROM messages AS m JOIN (SELECT min(seq) AS seq FROM messages"
            " WHERE state = 'pending' GROUP BY endpoint) AS head ON m.seq = head.seq"
            " ORDER BY m.seq"
        )
        return [_message(row) for row in rows]

    def messages(
        self, endpoint: str | None = None, state: DeliveryState | str | None = None
    ) -> list[Message]:
        """Return messages in enqueue order, optionally for one endpoint and/or state."""
        clauses, params = [], []
        if endpoint is not None:
            clauses.append("endpoint = ?")
            params.append(endpoint)
        if state is not None:
            clauses.append("state = ?")
            params.append(DeliveryState(state).value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return [
            _message(row)
            for row in self._query(f"SELECT * FROM messages{where} ORDER BY seq", params)
        ]

    def attempts(
        self, endpoint: str | None = None, msg_id: str | None = None
    ) -> list[AttemptRecord]:
        """Return the delivery log in the order attempts were made."""
        clauses, params = [], []
        if endpoint is not None:
            clauses.append("endpoint = ?")
            params.append(endpoint)
        if msg_id is not None:
            clauses.append("msg_id = ?")
            params.append(msg_id)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._query(f"SELECT * FROM attempts{where} ORDER BY id", params)
        return [
            AttemptRecord(
                id=row["id"],
                seq=row["seq"],
                msg_id=row["msg_id"],
                endpoint=row["endpoint"],
                url=row["url"],
                attempt=row["attempt"],
                attempted_at=row["attempted_at"],
                status=row["status"],
                error=row["error"],
                latency_ms=row["latency_ms"],
                outcome=Outcome(row["outcome"]),
                next_attempt_at=row["next_attempt_at"],
            )
            for row in rows
        ]

    def dead_letters(self, endpoint: str | None = None) -> list[DeadLetter]:
        """Return the messages that failed for good, oldest first, with the reason."""
        where, params = ("WHERE endpoint = ?", [endpoint]) if endpoint is not None else ("", [])
        rows = self._query(f"SELECT * FROM dead_letters {where} ORDER BY seq", params)
        return [
            DeadLetter(
                seq=row["seq"],
                msg_id=row["msg_id"],
                endpoint=row["endpoint"],
                reason=row["reason"],
                last_status=row["last_status"],
                attempts=row["attempts"],
                dead_at=row["dead_at"],
            )
            for row in rows
        ]

    def status(self) -> dict[str, EndpointStatus]:
        """Return per-endpoint counts of messages in each state."""
        counts: dict[str, dict[str, int]] = {}
        for row in self._query(
            "SELECT endpoint, state, count(*) AS n FROM messages GROUP BY endpoint, state"
        ):
            counts.setdefault(row["endpoint"], {})[row["state"]] = row["n"]
        result = {}
        for row in self._query("SELECT * FROM endpoints ORDER BY name"):
            by_state = counts.get(row["name"], {})
            result[row["name"]] = EndpointStatus(
                endpoint=row["name"],
                url=row["url"],
                pending=by_state.get("pending", 0),
                delivered=by_state.get("delivered", 0),
                failed=by_state.get("failed", 0),
                disabled=by_state.get("disabled", 0),
                duplicates=row["duplicates"],
                conflicts=row["conflicts"],
                endpoint_disabled=row["disabled_at"] is not None,
            )
        return result

    def pending_count(self) -> int:
        """Return how many messages are waiting to be delivered."""
        return self._query("SELECT count(*) FROM messages WHERE state = 'pending'")[0][0]


def _insert(
    db: sqlite3.Connection, msg_id: str, endpoint: str, event_type: str, body: bytes,
    state: str, now: float,
) -> bool:
    """Store a new message; False when ``(msg_id, endpoint)`` is already there."""
    return bool(db.execute(
        "INSERT OR IGNORE INTO messages"
        " (msg_id, endpoint, event_type, body, state, next_attempt_at, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (msg_id, endpoint, event_type, body, state, now, now),
    ).rowcount)


def _digest(data: Any) -> str:
    """16 hex digits of SHA-256 over the canonical JSON of a match."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _same_match(db: sqlite3.Connection, msg_id: str, endpoint: str, body: bytes) -> bool:
    """Whether the message stored as ``(msg_id, endpoint)`` carries the same match as ``body``
    (envelopes are compared by their ``data``: a match without an ``end`` is stamped with the
    time it was enqueued)."""
    row = db.execute(
        "SELECT body FROM messages WHERE msg_id = ? AND endpoint = ?", (msg_id, endpoint)
    ).fetchone()
    if row is None:
        return False
    try:
        stored = json.loads(row[0])["data"]
    except (ValueError, TypeError, KeyError):  # not an envelope: it cannot be this match
        return False
    return _what_matched(stored) == _what_matched(json.loads(body)["data"])


ANNOTATIONS = ("registry_version",)
"""Fields of a match that say under which program it ran, not what it matched: a match fed
again after a restart, when the registry moved on, is the same match (a duplicate)."""


def _what_matched(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k not in ANNOTATIONS}
    return data


def status(outbox: Outbox) -> dict[str, EndpointStatus]:
    """Return per-endpoint pending/delivered/failed/disabled counts (see :meth:`Outbox.status`)."""
    return outbox.status()


def replay(outbox: Outbox, since: datetime, endpoint: str | None = None) -> int:
    """Re-queue delivered/failed messages created since ``since`` (see :meth:`Outbox.replay`)."""
    return outbox.replay(since, endpoint)
