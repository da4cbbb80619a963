"""API tokens of ``vigil serve``: bearer tokens with a scope, stored only as SHA-256 digests in
SQLite, shown once when created, revocable.

A token is ``vgl_`` and 32 random bytes in URL-safe base64 (256 bits): its SHA-256 is what the
store keeps, and a request's token is found by its digest and compared in constant time. The
digest of a token that random needs no salt or slow hash: nothing can be guessed from it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Principal", "Scope", "TokenError", "TokenInfo", "TokenStore"]

TOKEN_PREFIX = "vgl_"
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    name       TEXT PRIMARY KEY,
    scope      TEXT NOT NULL CHECK (scope IN ('read', 'write')),
    digest     TEXT NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
)
"""


class TokenError(ValueError):
    """A token that cannot be created or revoked (a bad name, a name in use, unknown)."""


class Scope(StrEnum):
    """What a token may do: ``read`` (every GET, ``/check``) or ``write`` (also changes and
    ingestion)."""

    READ = "read"
    WRITE = "write"

    def allows(self, needed: Scope) -> bool:
        return self is Scope.WRITE or needed is Scope.READ


@dataclass(frozen=True)
class Principal:
    """Who a request is: the token's name (the author of the registry changes it makes) and
    its scope."""

    name: str
    scope: Scope


@dataclass(frozen=True)
class TokenInfo:
    """A token as ``vigil serve token list`` shows it (never its value nor its digest)."""

    name: str
    scope: Scope
    created_ms: int
    revoked_ms: int | None


class TokenStore:
    """The tokens of a service, in ``tokens.sqlite`` under its state directory.

    Examples
    --------
    >>> import tempfile
    >>> store = TokenStore(tempfile.mkdtemp())
    >>> token = store.create("ana", Scope.WRITE)
    >>> token.startswith("vgl_"), store.authenticate(token)
    (True, Principal(name='ana', scope=<Scope.WRITE: 'write'>))
    >>> store.authenticate("vgl_guess") is None
    True
    >>> store.revoke("ana")
    >>> store.authenticate(token) is None
    True
    >>> store.close()
    """

    FILENAME = "tokens.sqlite"

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(os.fspath(state_dir), self.FILENAME)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)

    def create(self, name: str, scope: Scope | str) -> str:
        """A new token named ``name``; returns its value, which is stored nowhere.

        Raises
        ------
        TokenError
            When the name is not 1-64 of ``A-Z a-z 0-9 _ . @ -``, or a token not revoked
            already has it.
        """
        if not _NAME.fullmatch(name):
            raise TokenError(f"a token name is 1-64 of A-Z a-z 0-9 _ . @ -, not {name!r}")
        scope = Scope(scope)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            row = self._db.execute(
                "SELECT revoked_ms FROM tokens WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] is None:
                raise TokenError(f"a token named {name!r} exists; revoke it first")
            self._db.execute(
                "INSERT OR REPLACE INTO tokens VALUES (?, ?, ?, ?, NULL)",
                (name, scope.value, _digest(token), _now_ms()),
            )
        return token

    def revoke(self, name: str) -> None:
        """Revoke the token ``name`` (from the next request on, also in a running service).

        Raises
        ------
        TokenError
            When no token that is not revoked has that name.
        """
        with self._lock:
            done = self._db.execute(
                "UPDATE tokens SET revoked_ms = ? WHERE name = ? AND revoked_ms IS NULL",
                (_now_ms(), name),
            ).rowcount
        if not done:
            raise TokenError(f"no active token named {name!r}")

    def list(self) -> list[TokenInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, scope, created_ms, revoked_ms FROM tokens ORDER BY name"
            ).fetchall()
        return [TokenInfo(r[0], Scope(r[1]), r[2], r[3]) for r in rows]

    def authenticate(self, token: str) -> Principal | None:
        """The principal of an active token, else ``None``."""
        digest = _digest(token)
        with self._lock:
            row = self._db.execute(
                "SELECT name, scope, digest FROM tokens WHERE digest = ? AND revoked_ms IS NULL",
                (digest,),
            ).fetchone()
        if row is None or not hmac.compare_digest(row[2], digest):
            return None
        return Principal(row[0], Scope(row[1]))

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _now_ms() -> int:
    return int(time.time() * 1000)
