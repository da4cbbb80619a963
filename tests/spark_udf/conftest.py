"""Shared fixtures of the Spark operator tests: one local SparkSession for the whole run, and
throwaway Redis servers for the Redis Streams source."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import spark_pairs
from spark_support import free_port


@pytest.fixture(scope="session")
def spark():
    """A ``local[2]`` session with the UI off and two shuffle partitions (shared, stopped last)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import cloudpickle

    from spark_udf import session

    # Test-only processors live in the tests tree, which executors cannot import by name.
    cloudpickle.register_pickle_by_value(spark_pairs)
    spark = session("local[2]", shuffle_partitions=2, app_name="vigil-tests")
    yield spark
    spark.stop()


@contextmanager
def _redis_server(
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


@pytest.fixture
def redis_port(tmp_path, unavailable):
    """The port of a throwaway ``redis-server`` on 127.0.0.1 (no password, no TLS)."""
    port = free_port()
    with _redis_server(tmp_path, [f"port {port}"], f"redis://127.0.0.1:{port}/0", unavailable):
        yield port


@pytest.fixture
def redis_tls_url(tmp_path, unavailable):
    """A ``rediss://`` URL, with user, password and database 3, of a throwaway TLS-only
    ``redis-server`` whose self-signed certificate the URL trusts."""
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("openssl is not installed, to make the TLS test server's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    port = free_port()
    config = [
        "port 0", f"tls-port {port}", f"tls-cert-file {cert}", f"tls-key-file {key}",
        f"tls-ca-cert-file {cert}", "tls-auth-clients no",
        "user default off", "user reader on >secret ~* &* +@all",
    ]
    url = f"rediss://reader:secret@127.0.0.1:{port}/3?ssl_ca_certs={cert}"
    with _redis_server(tmp_path, config, url, unavailable):
        yield url
