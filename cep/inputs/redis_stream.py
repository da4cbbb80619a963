"""A Redis Stream as an input of the embedded engine: its entries in stream order, each the
JSON event in its ``event`` field (else a JSON object of all its fields), as the Spark source
``vigil_redis`` reads them; followed, new entries as they are added (``XREAD BLOCK``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import redis

from cep.errors import EngineError
from cep.events.limits import INVALID_UTF8_MARK, decode_line, shown_line
from cep.inputs.chunks import IDLE, Chunk, _Idle
from cep.inputs.lines import LineBlock
from cep.inputs.source import POLL_INTERVAL_S, Cursor, StopSignal

__all__ = ["EVENT_FIELD", "RedisInputError", "RedisSource", "entry_text", "split_stream_url"]

EVENT_FIELD = "event"
"""The entry field holding the event's JSON (the Spark source's default ``field``)."""

ENTRIES_PER_READ = 10_000
_TIMEOUT_S = 10.0


class RedisInputError(EngineError, ConnectionError):
    """The Redis server cannot be reached or refuses a command."""


def split_stream_url(url: str) -> tuple[str, str]:
    """The server URL (for ``redis.Redis.from_url``) and the stream key (the last segment of
    the path) of ``redis://[user:password@]HOST:PORT[/DB]/KEY``.

    Examples
    --------
    >>> split_stream_url("redis://127.0.0.1:6379/2/events")
    ('redis://127.0.0.1:6379/2', 'events')
    >>> split_stream_url("rediss://u:p@cache:6380/orders%2Feu?ssl_ca_certs=/ca.pem")
    ('rediss://u:p@cache:6380?ssl_ca_certs=/ca.pem', 'orders/eu')
    >>> split_stream_url("redis://cache:6379/events")  # no database: the default one
    ('redis://cache:6379', 'events')
    """
    parts = urlsplit(url)
    path = parts.path.lstrip("/")
    database, _, key = path.partition("/")
    if not key or not database.isdigit():
        database, key = "", path
    if parts.scheme not in ("redis", "rediss") or not key:
        raise ValueError(
            f"a Redis stream is redis://HOST:PORT[/DB]/KEY (rediss:// with TLS), got {url!r}"
        )
    server = urlunsplit((parts.scheme, parts.netloc, f"/{database}" if database else "",
                         parts.query, parts.fragment))
    return server, unquote(key)


def _shown_url(url: str) -> str:
    """``url`` without its password, as dead letters and messages name the input."""
    parts = urlsplit(url)
    if parts.password is None:
        return urlunsplit(parts._replace(query=""))
    netloc = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc, query=""))


def entry_text(fields: Mapping[bytes | str, bytes | str], field: str = EVENT_FIELD) -> bytes:
    """The event of an entry as the bytes of a JSON line: its ``field``, or a JSON object of
    all its fields (text that is not UTF-8 marked as a line of a file would be, so that it is
    dead-lettered as ``invalid_utf8``).

    Examples
    --------
    >>> entry_text({b"event": b'{"a": 1}'})
    b'{"a": 1}'
    >>> entry_text({b"a": b"1", b"b": b"x"})
    b'{"a": "1", "b": "x"}'
    """
    for name, value in fields.items():
        if (name.decode("utf-8", "replace") if isinstance(name, bytes) else name) == field:
            return value if isinstance(value, bytes) else str(value).encode("utf-8")
    pairs = {_decoded(name): _decoded(value) for name, value in fields.items()}
    bad = any(t.startswith(INVALID_UTF8_MARK) for pair in pairs.items() for t in pair)
    text = json.dumps(
        {shown_line(name): shown_line(value) for name, value in pairs.items()},
        ensure_ascii=False, sort_keys=True,
    )
    # Marked, the line is refused as invalid_utf8 and shows the bad bytes escaped.
    return ((INVALID_UTF8_MARK + text) if bad else text).encode("utf-8")


def _decoded(value: bytes | str) -> str:
    return decode_line(value) if isinstance(value, bytes) else str(value)


def _id(value: bytes | str) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def _ordered(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class RedisSource:
    """The entries of a Redis Stream after the cursor's entry id: without ``follow``, those
    there when the read starts; with it, new ones as they are added, until stopped.

    Each entry is one line: its number counts the entries read (from 1), and its position
    (and id when it carries none) the entries before it, as the Spark source's ``_seq``.
    """

    def __init__(self, url: str, *, follow: bool = False, cursor: Cursor | None = None) -> None:
        start = cursor or {}
        if start and start.get("kind") != "redis":
            raise ValueError(f"a {start.get('kind')} cursor cannot start a redis input")
        self.url = url
        self.server, self.key = split_stream_url(url)
        self.source = _shown_url(url)
        self.follow = follow
        self.position = int(start.get("position", 0))
        self._last = str(start.get("id", "0-0"))
        self._line = int(start.get("line", self.position + 1))

    def marks(self) -> dict[str, dict[str, Any]]:
        return {self.source: {"mark": self._last, "line": self._line, "identity": None}}

    def cursor(self, chunk: Chunk) -> Cursor:
        mark = chunk.marks.get(self.source) or self.marks()[self.source]
        return {"kind": "redis", "url": self.source, "key": self.key, "id": mark["mark"],
                "line": mark["line"], "position": chunk.position}

    def _client(self) -> redis.Redis:
        return redis.Redis.from_url(
            self.server, socket_timeout=_TIMEOUT_S + POLL_INTERVAL_S,
            socket_connect_timeout=_TIMEOUT_S,
        )

    def blocks(self, stop: StopSignal) -> Iterator[LineBlock | _Idle]:
        try:
            with self._client() as client:
                yield from self._entries(client, stop)
        except redis.RedisError as exc:
            raise RedisInputError(f"Redis {self.source}: {exc}") from exc

    def _entries(self, client: redis.Redis, stop: StopSignal) -> Iterator[LineBlock | _Idle]:
        target = None
        if not self.follow:
            last = client.xrevrange(self.key, "+", "-", count=1)
            if not last:
                return
            target = _id(last[0][0])
        while not stop.is_set():
            if self.follow:
                reply = client.xread(
                    {self.key: self._last}, count=ENTRIES_PER_READ,
                    block=int(POLL_INTERVAL_S * 1000),
                )
                entries = reply[0][1] if reply else []
                if not entries:
                    yield IDLE
                    continue
            else:
                if target is None or _ordered(self._last) >= _ordered(target):
                    return
                entries = client.xrange(self.key, f"({self._last}", target,
                                        count=ENTRIES_PER_READ)
                if not entries:
                    return
            yield self._block(entries)

    def _block(self, entries: list[tuple[Any, Any]]) -> LineBlock:
        texts = [entry_text(fields) for _, fields in entries]
        ids = [_id(entry_id) for entry_id, _ in entries]
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        starts = np.zeros(len(texts), dtype=np.int64)
        starts[1:] = np.cumsum(lengths + 1)[:-1]
        block = LineBlock(self.source, b"\n".join(texts), starts, starts + lengths,
                          self._line, ids)
        self._last = ids[-1]
        self._line += len(ids)
        return block
