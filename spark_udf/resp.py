"""A minimal Redis client speaking RESP2 over a socket: enough for Redis Streams (``XADD``,
``XREAD``, ``XRANGE``) without a client library dependency."""

from __future__ import annotations

import socket
from typing import Any

from spark_udf.errors import RespError

__all__ = ["RedisConnection", "encode_command"]

RespValue = bytes | int | str | list[Any] | None


def encode_command(*args: str | bytes | int) -> bytes:
    """A command as a RESP array of bulk strings.

    Examples
    --------
    >>> encode_command("XLEN", "events")
    b'*2\\r\\n$4\\r\\nXLEN\\r\\n$6\\r\\nevents\\r\\n'
    """
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        parts.append(f"${len(data)}\r\n".encode())
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


class RedisConnection:
    """One blocking connection to a Redis server.

    Parameters
    ----------
    host, port:
        Where the server listens.
    timeout:
        Socket timeout in seconds for connecting and for each reply.

    Examples
    --------
    >>> with RedisConnection("127.0.0.1", 6379) as redis:       # doctest: +SKIP
    ...     redis.command("XADD", "events", "*", "event", '{"k": 1}')
    b'1700000000000-0'
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, *, timeout: float = 10.0):
        self.host = host
        self.port = port
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise RespError(f"cannot connect to Redis at {host}:{port}: {exc}") from exc
        self._buffer = bytearray()

    def __enter__(self) -> RedisConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def command(self, *args: str | bytes | int) -> RespValue:
        """Send one command and return its decoded reply (bulk strings stay ``bytes``).

        Raises
        ------
        RespError
            When the server replies with an error or the connection breaks.
        """
        try:
            self._sock.sendall(encode_command(*args))
            return self._reply()
        except OSError as exc:
            raise RespError(f"Redis at {self.host}:{self.port}: {exc}") from exc

    def _line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 2]
                return line
            self._fill()

    def _exact(self, n: int) -> bytes:
        while len(self._buffer) < n + 2:
            self._fill()
        data = bytes(self._buffer[:n])
        del self._buffer[: n + 2]
        return data

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise RespError(f"Redis at {self.host}:{self.port} closed the connection")
        self._buffer.extend(chunk)

    def _reply(self) -> RespValue:
        line = self._line()
        if not line:
            raise RespError("empty RESP reply line")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode("utf-8")
        if kind == b"-":
            raise RespError(f"Redis error: {rest.decode('utf-8', 'replace')}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exact(size)
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._reply() for _ in range(size)]
        raise RespError(f"not a RESP2 reply: {line[:40]!r}")
