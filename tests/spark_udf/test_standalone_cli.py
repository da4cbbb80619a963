"""``python -m spark_udf.standalone``, as the README has users run it: started in the
background, stopped with ``kill`` (SIGTERM), it leaves no master or worker running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _cluster_processes(work: Path) -> list[int]:
    """Processes whose environment names this cluster's log directory (its JVMs)."""
    marker = f"SPARK_LOG_DIR={work / 'logs'}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_stops_the_master_and_workers(tmp_path) -> None:
    work = tmp_path / "cluster"
    process = subprocess.Popen(
        [sys.executable, "-m", "spark_udf.standalone", "--workers", "1", "--dir", str(work),
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = process.stdout.readline()
        if not line.startswith("master spark://127.0.0.1:"):
            process.kill()
            pytest.fail(f"no master line; the output:\n{line}{process.stdout.read()}")
        assert len(_cluster_processes(work)) >= 2  # the master and the worker
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        give_up = time.monotonic() + 30
        while _cluster_processes(work) and time.monotonic() < give_up:
            time.sleep(0.2)
        assert _cluster_processes(work) == []
    finally:
        if process.poll() is None:
            process.kill()
        for pid in _cluster_processes(work):
            os.kill(pid, signal.SIGKILL)
