"""Errors of the Spark integration: one root, :class:`SparkOperatorError`, and subclasses that
also inherit the matching builtin so callers may catch either."""

from __future__ import annotations

from cep import errors as engine_errors
from query_lang.errors import VigilError

__all__ = [
    "BucketStateError",
    "CheckpointError",
    "OperatorConfigError",
    "RedisSourceError",
    "SinkError",
    "SourceError",
    "SparkOperatorError",
]


class SparkOperatorError(VigilError):
    """Root of every error raised by ``spark_udf`` (a :class:`~query_lang.errors.VigilError`)."""


class OperatorConfigError(SparkOperatorError, ValueError):
    """``detect``/``run_spark`` was called with arguments that cannot work (names what and why)."""


class BucketStateError(SparkOperatorError, ValueError):
    """Stored bucket state bytes are truncated, corrupted or of an unknown format version."""


class CheckpointError(SparkOperatorError, engine_errors.CheckpointError):
    """A Spark checkpoint cannot continue with this run: it holds the state of another program
    or bucket count, or its input changed behind the position it has read (names what changed
    and what to do). Also the embedded engine's :class:`cep.errors.CheckpointError` (and so a
    ``ValueError``)."""


class SourceError(SparkOperatorError, OSError):
    """A streaming source cannot be read (missing file, unreachable server)."""


class RedisSourceError(SourceError, ConnectionError):
    """A Redis command of the Redis Streams source failed: the server is unreachable, refused
    the credentials or answered with an error (redis-py's error is the ``__cause__``)."""


class SinkError(SparkOperatorError, OSError):
    """An output directory cannot be written or read back."""
