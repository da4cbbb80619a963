"""Streaming inputs that need no Maven package: Vigil's Python sources for JSON-lines files
(:mod:`~spark_udf.sources.jsonl`) and Redis Streams (:mod:`~spark_udf.sources.redis_stream`),
plus helpers for Spark's own file, socket and rate sources. The Python sources give ``(_seq,
_event)`` rows (the event's position in its input, from 0, and its JSON text: what
:func:`spark_udf.detect` reads with ``json_col="_event"``) and take positions as offsets, so a
restarted query re-reads exactly the uncommitted range."""

from __future__ import annotations

from spark_udf.sources.jsonl import JsonLinesIndex, JsonLinesSource, read_slice
from spark_udf.sources.readers import (
    read_files,
    read_jsonl,
    read_rate_demo,
    read_redis,
    read_socket,
    register_sources,
)
from spark_udf.sources.redis_stream import (
    STREAM_URL_SCHEMES,
    RedisStreamSource,
    check_server,
    redis_client,
    split_stream_url,
)
from spark_udf.sources.rows import EVENT_COLUMN, SOURCE_SCHEMA, SOURCE_TYPES

__all__ = [
    "EVENT_COLUMN",
    "SOURCE_SCHEMA",
    "SOURCE_TYPES",
    "STREAM_URL_SCHEMES",
    "JsonLinesIndex",
    "JsonLinesSource",
    "RedisStreamSource",
    "check_server",
    "read_files",
    "read_jsonl",
    "read_rate_demo",
    "read_redis",
    "read_slice",
    "read_socket",
    "redis_client",
    "register_sources",
    "split_stream_url",
]
