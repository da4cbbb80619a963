"""The registry's durable store: every declaration of the standing program (rules, queries,
metrics and the streams, lists and webhooks they need) with its full history, in SQLite.

Each accepted change set is one *registry version* (1, 2, ...): who made it, when, a summary,
and the entries it wrote. An entry is a declaration's canonical text under its name, or a
removal. The program at version V is, for every name, its newest entry at or before V unless
that entry is a removal. Names live in five spaces: ``standing`` (rules, queries and metrics
share one, as the engine requires), ``stream``, ``list``, ``table`` and ``webhook``.

Writes are transactions (``BEGIN IMMEDIATE``): a change set is stored whole or not at all,
and concurrent writers (a ``vigil serve`` and a ``vigil registry push``) serialise on SQLite's
lock. Journaling is WAL with ``synchronous=FULL``: an acknowledged version survives a crash.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["STANDING", "Change", "Entry", "RegistryError", "RegistryStore", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1

STANDING = "standing"
"""The name space rules, queries and metrics share (streams, lists and webhooks have one each)."""

_SCHEMA = """
CREATE TABLE changes (
    version INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    author TEXT NOT NULL,
    summary TEXT NOT NULL
);
CREATE TABLE entries (
    space TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL REFERENCES changes(version),
    kind TEXT NOT NULL,
    text TEXT,
    PRIMARY KEY (space, name, version)
);
CREATE TABLE applied (
    consumer TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    at_ms INTEGER NOT NULL
)
"""


class RegistryError(Exception):
    """A registry that cannot be opened or used (not a registry, another schema version)."""


@dataclass(frozen=True)
class Entry:
    """One declaration as a version wrote it; ``text`` is ``None`` for a removal."""

    space: str
    name: str
    kind: str
    version: int
    text: str | None

    @property
    def removed(self) -> bool:
        return self.text is None


@dataclass(frozen=True)
class Change:
    """An accepted change set: the registry version it made."""

    version: int
    at_ms: int
    author: str
    summary: str


class RegistryStore:
    """A registry in the SQLite file at ``path`` (created if missing).

    Examples
    --------
    >>> import tempfile, os
    >>> store = RegistryStore(os.path.join(tempfile.mkdtemp(), "registry.sqlite"))
    >>> store.write([Entry("stream", "txn", "stream", 0, "stream txn (ts timestamp) time ts")],
    ...             author="ana", summary="push s.vigil")
    1
    >>> [(e.name, e.version) for e in store.current()]
    [('txn', 1)]
    >>> store.close()
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            with self._transaction() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version == 0:
                    if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                        raise RegistryError(f"{self.path} is a SQLite database but not a registry")
                    for statement in _SCHEMA.split(";"):
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                elif version != SCHEMA_VERSION:
                    raise RegistryError(
                        f"registry {self.path} has schema version {version}; this version of "
                        f"vigil reads {SCHEMA_VERSION}"
                    )
        except sqlite3.DatabaseError as exc:
            raise RegistryError(f"{self.path} is not a usable registry: {exc}") from exc

    # ------------------------------------------------------------------ reading

    @property
    def version(self) -> int:
        """The newest registry version (0 when empty)."""
        row = self._query("SELECT max(version) FROM changes")[0]
        return int(row[0] or 0)

    def current(self, version: int | None = None, *, shared: bool = False) -> list[Entry]:
        """The declarations of the program at ``version`` (default: the newest), in the order
        they were first added; with ``shared``, its streams, lists and webhooks only (a few,
        where rules, queries and metrics may be thousands)."""
        upto = self.version if version is None else int(version)
        rows = self._query(
            f"""
            SELECT e.space, e.name, e.kind, e.version, e.text,
                   (SELECT min(version) FROM entries f
                     WHERE f.space = e.space AND f.name = e.name) AS first
            FROM entries e
            WHERE e.version = (SELECT max(version) FROM entries g
                                WHERE g.space = e.space AND g.name = e.name AND g.version <= ?)
                  {"AND e.space != ?" if shared else ""}
            ORDER BY first, e.space, e.name
            """,
            (upto, STANDING) if shared else (upto,),
        )
        return [Entry(r[0], r[1], r[2], r[3], r[4]) for r in rows if r[4] is not None]

    def named(self, name: str, version: int | None = None) -> list[Entry]:
        """The declarations called ``name`` in the program at ``version`` (default: the
        newest): one per name space at most."""
        upto = self.version if version is None else int(version)
        rows = self._query(
            """
            SELECT e.space, e.name, e.kind, e.version, e.text FROM entries e
            WHERE e.name = ?
              AND e.version = (SELECT max(version) FROM entries g
                                WHERE g.space = e.space AND g.name = e.name AND g.version <= ?)
            ORDER BY e.space
            """,
            (name, upto),
        )
        return [Entry(*r) for r in rows if r[4] is not None]

    def written(self, since: int, upto: int) -> list[Entry]:
        """What the versions after ``since`` up to ``upto`` wrote: the newest entry of each
        declaration they touched (a removal has ``text`` ``None``), oldest first — what turns
        the program at ``since`` into the program at ``upto`` without reading the whole."""
        rows = self._query(
            """
            SELECT e.space, e.name, e.kind, e.version, e.text FROM entries e
            WHERE e.version > ? AND e.version <= ?
              AND e.version = (SELECT max(version) FROM entries g
                                WHERE g.space = e.space AND g.name = e.name AND g.version <= ?)
            ORDER BY e.version, e.space, e.name
            """,
            (int(since), int(upto), int(upto)),
        )
        return [Entry(*r) for r in rows]

    def history(self, name: str) -> list[tuple[Entry, Change]]:
        """Every entry written under ``name`` (any space), oldest first, with its change."""
        rows = self._query(
            """
            SELECT e.space, e.name, e.kind, e.version, e.text, c.at_ms, c.author, c.summary
            FROM entries e JOIN changes c ON c.version = e.version
            WHERE e.name = ? ORDER BY e.version
            """,
            (name,),
        )
        return [
            (Entry(r[0], r[1], r[2], r[3], r[4]), Change(r[3], r[5], r[6], r[7])) for r in rows
        ]

    def changes(self, since: int = 0) -> list[Change]:
        """The change sets after version ``since``, oldest first."""
        rows = self._query(
            "SELECT version, at_ms, author, summary FROM changes WHERE version > ? "
            "ORDER BY version",
            (since,),
        )
        return [Change(*r) for r in rows]

    def applied(self) -> dict[str, tuple[int, int]]:
        """Consumer (a running engine) -> (registry version it applied, when, epoch ms)."""
        return {r[0]: (r[1], r[2]) for r in self._query("SELECT * FROM applied")}

    # ------------------------------------------------------------------ writing

    def write(self, entries: Sequence[Entry], *, author: str, summary: str) -> int:
        """Store ``entries`` as one new version (their ``version`` field is ignored); returns
        the version."""
        with self._transaction() as db:
            version = int(db.execute("SELECT coalesce(max(version), 0) FROM changes")
                          .fetchone()[0]) + 1
            db.execute("INSERT INTO changes VALUES (?, ?, ?, ?)",
                       (version, _now_ms(), author, summary))
            db.executemany(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?)",
                [(e.space, e.name, version, e.kind, e.text) for e in entries],
            )
        return version

    def mark_applied(self, consumer: str, version: int) -> None:
        """Record that ``consumer`` runs the program of ``version`` now."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO applied VALUES (?, ?, ?)",
                       (consumer, int(version), _now_ms()))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RegistryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sqlite

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()


def _now_ms() -> int:
    return int(time.time() * 1000)
