"""Fixtures every test package shares."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest


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
