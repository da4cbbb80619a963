"""Shared fixtures of the Spark operator tests: one local SparkSession for the whole run, and
a throwaway TLS Redis server for the Redis Streams source (a plain one: ``tests/conftest.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import spark_pairs
from redis_servers import free_port, redis_server


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
    with redis_server(tmp_path, config, url, unavailable):
        yield url
