"""Fixtures of the embedded engine's tests: a throwaway Redis server for the Redis Streams
input (as ``tests/spark_udf/conftest.py`` starts one for the Spark source)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis


def free_port() -> int:
    """A local TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def redis_port(tmp_path, unavailable) -> Iterator[int]:
    """The port of a throwaway ``redis-server`` on 127.0.0.1 (no password, no persistence)."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    conf = tmp_path / "redis.conf"
    conf.write_text(f'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\ndir {tmp_path}\n')
    log = tmp_path / "redis.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                unavailable(f"redis-server did not start: {log.read_text()[-500:]}")
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
