"""One ``--events`` argument: a file, a directory of files, stdin or a Redis stream, maybe
bound to a declared stream."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["REDIS_SCHEMES", "EventInput"]

REDIS_SCHEMES = ("redis://", "rediss://")


@dataclass(frozen=True)
class EventInput:
    """One ``--events`` argument: a file, a directory of files, stdin (``-``) or a Redis
    stream, maybe bound to a stream (every event of it belongs to ``stream``).

    Examples
    --------
    >>> EventInput("-").is_stdin, EventInput("redis://127.0.0.1:6379/events").is_redis
    (True, True)
    """

    path: str
    stream: str | None = None

    @property
    def is_stdin(self) -> bool:
        return self.path == "-"

    @property
    def is_redis(self) -> bool:
        """A Redis stream: ``redis://HOST:PORT[/DB]/KEY`` (``rediss://`` with TLS)."""
        return self.path.startswith(REDIS_SCHEMES)

    @property
    def is_directory(self) -> bool:
        return not self.is_stdin and not self.is_redis and os.path.isdir(self.path)

    def files(self) -> list[str]:
        """The files to read, in order (a directory's regular files by name, skipping names
        that start with ``.`` or ``_``, which Spark's file source also treats as hidden)."""
        if self.is_stdin:
            return ["-"]
        if self.is_redis:
            return []
        if os.path.isdir(self.path):
            return directory_files(self.path)
        return [self.path]


def directory_files(path: str) -> list[str]:
    """The regular files of directory ``path`` by name, without hidden ones (``.``, ``_``)."""
    names = sorted(
        n
        for n in os.listdir(path)
        if not n.startswith((".", "_")) and os.path.isfile(os.path.join(path, n))
    )
    return [os.path.join(path, n) for n in names]
