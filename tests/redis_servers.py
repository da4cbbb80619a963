"""Throwaway Redis servers for the tests of both engines' Redis Streams inputs."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis


def free_port() -> int:
    """A local TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def redis_server(
    directory: Path, config: Sequence[str], client_url: str, unavailable: Callable[[str], None]
) -> Iterator[None]:
    """Run ``redis-server`` with ``config`` (``redis.conf`` lines; no persistence) in
    ``directory`` until the block ends, once ``client_url`` answers ``PING``."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed (apt-get install -y redis-server)")
    conf = directory / "redis.conf"
    conf.write_text("\n".join([
        "bind 127.0.0.1", 'save ""', "appendonly no", f"dir {directory}", *config,
    ]) + "\n")
    log = directory / "redis.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                unavailable(f"redis-server did not start: {log.read_text()[-500:]}")
            try:
                with redis.Redis.from_url(client_url, socket_timeout=1) as client:
                    client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)
