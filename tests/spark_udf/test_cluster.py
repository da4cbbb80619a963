"""Vigil on a real Spark cluster: a standalone master and two workers on loopback, started
once for the test session, whose environment has no Vigil (nor this virtualenv) on its path;
the executors run the environment ``vigil pack`` shipped. The examples give exactly the
embedded engine's matches, and still do when a worker is SIGKILLed mid-run."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cep.cli import main
from spark_udf import read_outputs
from spark_udf.standalone import StandaloneCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "examples" / "events"


@pytest.fixture(scope="session")
def cluster_env(tmp_path_factory):
    """``(cluster, pack)``: the cluster (torn down at the end of the session, every process
    killed) and the packed environment, built once."""
    work = tmp_path_factory.mktemp("cluster")
    cluster = StandaloneCluster(work / "spark", workers=2, cores=1, memory="1g")
    try:
        # The JVMs start while the environment is packed (both take a while).
        starting = threading.Thread(target=cluster.start, daemon=True)
        starting.start()
        pack = work / "env.tar.gz"
        assert main(["pack", str(pack)]) == 0
        starting.join()
        cluster.wait_for_workers(2, 300)
        yield cluster, pack
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def embedded(tmp_path_factory):
    """The embedded engine's matches over the examples."""
    out = tmp_path_factory.mktemp("embedded") / "matches.jsonl"
    assert main(["run", str(ROOT / "examples"), "--events", str(EVENTS), "--engine",
                 "embedded", "--no-alerts", "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _driver_env() -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}


def _assert_embedded_matches(got: list[dict], want: list[dict]) -> None:
    ids = [m["match_id"] for m in got]
    assert len(ids) == len(set(ids)), "a match_id twice"
    by_id = {m["match_id"]: m for m in got}
    assert set(by_id) == {m["match_id"] for m in want}
    for row in want:
        _assert_same_row(by_id[row["match_id"]], row)


def _assert_same_row(a: dict, b: dict) -> None:
    """Equal rows; sums of floats may differ in their last bits (order of the additions)."""
    if a.get("kind") != "metric":
        assert a == b
        return
    assert {**a, "values": None} == {**b, "values": None}
    for name, value in a["values"].items():
        other = b["values"][name]
        if isinstance(value, float):
            assert math.isclose(value, other, rel_tol=1e-12), (name, value, other)
        else:
            assert value == other, (name, value, other)


def _executor_pythons(work: Path, seen: list[tuple[str, str]], stop: threading.Event) -> None:
    """Collect (command, working directory) of the Python processes the executors start."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(work)) and b"pyspark.daemon" in argv:
                seen.append((argv[0].decode(), cwd))
        stop.wait(0.2)


def test_vigil_run_with_pack_survives_a_worker_killed_after_the_first_micro_batch(
    cluster_env, embedded, tmp_path
):
    """The user's command on the cluster, in micro-batches of 1,200 lines (three over the
    examples' events, those of the device-clock stream among them: between micro-batches their
    devices' clocks, hours off, must not move Spark's watermark); one worker and its executor
    are SIGKILLed, as a lost node, once the first micro-batch is reported."""
    cluster, pack = cluster_env
    out = tmp_path / "out"
    seen: list[tuple[str, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_executor_pythons, args=(cluster.work_dir, seen, stop))
    watcher.start()
    err_lines: list[str] = []
    killed_at: int | None = None
    driver = subprocess.Popen(
        [sys.executable, "-m", "cep.cli", "run", str(ROOT / "examples"), "--events",
         str(EVENTS), "--master", cluster.url, "--pack", str(pack), "--out", str(out),
         "--no-alerts", "--max-records-per-batch", "1200"],
        cwd=tmp_path, env=_driver_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stderr is not None
        for line in driver.stderr:
            err_lines.append(line)
            if killed_at is None and line.lstrip().startswith("micro-batch 0:"):
                cluster.kill_worker(1)  # the worker and its executor, as a lost node
                killed_at = len(err_lines)
        driver.wait(timeout=900)
    finally:
        stop.set()
        watcher.join()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    err = "".join(err_lines)
    assert driver.returncode == 0, err[-3000:] + cluster.log_tails()
    assert f"Spark ({cluster.url})" in err
    assert killed_at is not None, err
    # Three micro-batches of events; the kill came before the second.
    batches = [line for line in err_lines if line.lstrip().startswith("micro-batch ")]
    assert sum(" event(s) in " in line for line in batches) == 3, err
    after = "".join(err_lines[killed_at:])
    assert [line for line in batches[1:] if " event(s) in " in line], err  # input was left
    # A progress line names the lost executor.
    lost = re.findall(r"executor\(s\) lost: ([^;]+);", after)
    assert len(lost) == 1 and lost[0].startswith("127.0.0.1:"), err
    _assert_embedded_matches(read_outputs(str(out)), embedded)
    # The executors' Python is the shipped archive's, unpacked in their working directories.
    assert seen, "no executor Python process was seen"
    for command, cwd in seen:
        assert command == "./environment/bin/python", command
        assert (Path(cwd) / "environment" / "lib").is_dir()
    record = json.loads((out / "_checkpoint" / "vigil.json").read_text())["layout"]
    assert (record["shuffle_partitions"], record["buckets"]) == (4, 16)  # 2 cores
