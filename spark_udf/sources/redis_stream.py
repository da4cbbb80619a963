"""The ``vigil_redis`` source: the entries of a Redis Stream, in stream order, read with redis-py
through Spark's Python Data Source API; offsets are entry ids, so a restarted query re-reads
exactly the uncommitted entries."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import redis
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cep.events.limits import decode_line
from cep.inputs.redis_stream import entry_text
from cep.inputs.redis_stream import split_stream_url as split_url
from spark_udf.errors import OperatorConfigError, RedisSourceError
from spark_udf.sources.rows import SOURCE_SCHEMA, live_of, pinned, positive_int, source_batch

__all__ = [
    "STREAM_URL_SCHEMES",
    "RedisStreamSource",
    "StreamRange",
    "check_server",
    "redis_client",
    "split_stream_url",
]

_DEFAULT_MAX_RECORDS = 10_000
_ENTRIES_PER_READ = 10_000
_TIMEOUT_S = 10.0


def redis_client(
    url: str | None = None, *, host: str = "127.0.0.1", port: int = 6379
) -> redis.Redis:
    """A redis-py client for ``url`` (``redis://[user:password@]host:port/db``, ``rediss://``
    for TLS, ``unix://``; see ``redis.Redis.from_url``), or for ``host``/``port`` without one.
    Replies stay bytes; connecting and each reply time out after 10 s unless the URL says
    otherwise.

    Examples
    --------
    >>> client = redis_client("rediss://reader:secret@cache.example:6380/2")
    >>> kwargs = client.connection_pool.connection_kwargs
    >>> kwargs["username"], kwargs["password"], kwargs["port"], kwargs["db"]
    ('reader', 'secret', 6380, 2)
    >>> client.connection_pool.connection_class.__name__
    'SSLConnection'
    """
    timeouts = {"socket_timeout": _TIMEOUT_S, "socket_connect_timeout": _TIMEOUT_S}
    if url:
        return redis.Redis.from_url(url, **timeouts)
    return redis.Redis(host=host, port=port, **timeouts)


STREAM_URL_SCHEMES = ("redis://", "rediss://")
"""Schemes of a stream URL (:func:`split_stream_url`)."""


def split_stream_url(url: str) -> tuple[str, str]:
    """The server URL and the stream key of ``redis://[user:password@]HOST:PORT[/DB]/KEY``, as
    :func:`cep.inputs.split_stream_url` reads them; a URL that is not one is an
    :class:`~spark_udf.errors.OperatorConfigError`.

    Examples
    --------
    >>> split_stream_url("redis://127.0.0.1:6379/2/events")
    ('redis://127.0.0.1:6379/2', 'events')
    """
    try:
        return split_url(url)
    except ValueError as exc:
        raise OperatorConfigError(str(exc)) from None


def check_server(url: str) -> None:
    """Raise :class:`~spark_udf.errors.RedisSourceError` unless the server of ``url`` answers
    ``PING``: a run says so before it starts Spark, not from inside a failed query."""
    try:
        with redis_client(url) as client:
            client.ping()
    except redis.RedisError as exc:
        where = urlsplit(url).netloc.rpartition("@")[2]  # without user and password
        raise RedisSourceError(f"Redis at {where}: {exc}") from exc


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _entry_json(fields: Mapping[bytes | str, bytes | str], field: str) -> str:
    """The event JSON of an entry, as the embedded engine reads it
    (:func:`cep.inputs.entry_text`), decoded as a line of a file is: text that is not UTF-8
    marked so that the operator dead-letters it as ``invalid_utf8``.

    Examples
    --------
    >>> _entry_json({b"event": b'{"a": 1}'}, "event")
    '{"a": 1}'
    >>> from cep.events.limits import shown_line
    >>> print(shown_line(_entry_json({b"a": b"caf\\xe9"}, "event")))
    {"a": "caf\\\\xe9"}
    """
    return decode_line(entry_text(fields, field))


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """Entries after ``after_id`` up to and including ``last_id``; ``first_seq`` numbers the
    first of them."""

    after_id: str
    last_id: str
    first_seq: int


class _RedisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options.get("url") or None
        self.host = options.get("host", "127.0.0.1")
        self.port = positive_int(options, "port", 6379)
        self.key = options["stream"]
        self.field = options.get("field", "event")
        self.max_records = positive_int(options, "maxRecordsPerBatch", _DEFAULT_MAX_RECORDS)
        self.live = live_of(options)
        self.target: str | None = None

    @contextmanager
    def _connect(self) -> Iterator[redis.Redis]:
        # One client per call, as the reader is pickled to the executors that read.
        where = "Redis" if self.url else f"Redis at {self.host}:{self.port}"
        try:
            with redis_client(self.url, host=self.host, port=self.port) as client:
                yield client
        except redis.RedisError as exc:
            raise RedisSourceError(f"{where}: {exc}") from exc

    def initialOffset(self) -> dict:
        return {"id": "0-0", "seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        with self._connect() as client:
            last = client.xrevrange(self.key, "+", "-", count=1)
        self.target = _text(last[0][0]) if last else "0-0"

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        count = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if count is None and not isinstance(limit, ReadAllAvailable):
            count = self.max_records
        # The entries after the start id (XRANGE with an exclusive start: XREAD's entries,
        # in the same reply shape whichever RESP version the URL asks for).
        with self._connect() as client:
            entries = client.xrange(self.key, f"({start['id']}", "+", count=count)
        ids = [_text(entry_id) for entry_id, _ in entries]
        if self.target is not None:
            target = _parse_id(self.target)
            ids = [i for i in ids if _parse_id(i) <= target]
        if not ids:
            return pinned(self.live, {"id": start["id"], "seq": int(start["seq"])})
        return pinned(self.live, {"id": ids[-1], "seq": int(start["seq"]) + len(ids)})

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if start["id"] == end["id"]:
            return []
        return [StreamRange(start["id"], end["id"], int(start["seq"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRange)
        seq = partition.first_seq
        after = partition.after_id
        with self._connect() as client:
            while True:
                entries = client.xrange(
                    self.key, f"({after}", partition.last_id, count=_ENTRIES_PER_READ
                )
                if not entries:
                    return
                seqs = list(range(seq, seq + len(entries)))
                texts = [_entry_json(fields, self.field) for _, fields in entries]
                yield source_batch(seqs, texts)
                seq += len(entries)
                after = _text(entries[-1][0])
                if after == partition.last_id:
                    return


class RedisStreamSource(DataSource):
    """``spark.readStream.format("vigil_redis")``: the entries of a Redis Stream, in stream
    order, as ``(_seq, _event)`` rows (``_seq`` counts entries from 0).

    Options: ``stream`` (the key, required), ``url`` (``redis://user:password@host:port/db``,
    ``rediss://`` for TLS; see :func:`redis_client`) or ``host``/``port`` (default
    127.0.0.1:6379), ``field`` (entry field holding the event JSON, default ``event``; entries
    without it become a JSON object of all their fields), ``maxRecordsPerBatch`` (default
    10000), ``live`` (see :func:`spark_udf.sources.rows.pinned`: the offsets pin a live
    query's newest program to each micro-batch).
    """

    @classmethod
    def name(cls) -> str:
        return "vigil_redis"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = dict(self.options)
        if not options.get("stream"):
            raise OperatorConfigError("the vigil_redis source needs a 'stream' option")
        return _RedisStreamReader(options)
