"""Fixtures every test package shares."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from redis_servers import free_port, redis_server


@pytest.fixture
def unavailable() -> Callable[[str], None]:
    """Call with the reason when a tool, service or port a test needs is missing: the test is
    skipped on a developer's machine, and fails under ``CI=true``, where ``.ci/run`` provides
    everything (a skip there would hide a lost check)."""

    def give_up(reason: str) -> None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: .ci/run provides it, so this is a failure)")
        pytest.skip(reason)

    return give_up


@pytest.fixture
def redis_port(tmp_path, unavailable):
    """The port of a throwaway ``redis-server`` on 127.0.0.1 (no password, no TLS)."""
    port = free_port()
    with redis_server(tmp_path, [f"port {port}"], f"redis://127.0.0.1:{port}/0", unavailable):
        yield port


def pytest_collection_modifyitems(config, items):
    """Groups for ``pytest -n N --dist loadgroup`` (``.ci/run``): the tests of one module run
    in one worker (their module fixtures start once), except every test that uses the shared
    Spark session, which all run in one worker (one session for the run)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        spark = "spark" in getattr(item, "fixturenames", ())
        group = "spark-session" if spark else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
