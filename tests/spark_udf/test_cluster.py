"""Vigil on a real Spark cluster: a standalone master and two workers on loopback, started
once for the test session, whose environment has no Vigil (nor this virtualenv) on its path;
the executors run the environment ``vigil pack`` shipped. The examples give exactly the
embedded engine's matches, and still do when a worker is SIGKILLed mid-run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cluster_driver import program_files

from cep.cli import main
from spark_udf import read_outputs
from spark_udf.standalone import StandaloneCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "examples" / "events"
DRIVER = Path(__file__).resolve().parent / "cluster_driver.py"


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


def _embedded(files: list[str], out: Path, events: Path = EVENTS) -> list[dict]:
    """The embedded engine's matches of ``files`` over ``events``."""
    assert main(["run", *files, "--events", str(events), "--engine", "embedded",
                 "--no-alerts", "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def embedded(tmp_path_factory):
    """The embedded engine's matches over the examples."""
    return _embedded([str(ROOT / "examples")],
                     tmp_path_factory.mktemp("embedded") / "matches.jsonl")


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


def test_vigil_run_with_pack_on_the_cluster_gives_the_embedded_matches(
    cluster_env, embedded, tmp_path
):
    cluster, pack = cluster_env
    out = tmp_path / "out"
    seen: list[tuple[str, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_executor_pythons, args=(cluster.work_dir, seen, stop))
    watcher.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cep.cli", "run", str(ROOT / "examples"), "--events",
             str(EVENTS), "--master", cluster.url, "--pack", str(pack), "--out", str(out),
             "--no-alerts"],
            cwd=tmp_path, env=_driver_env(), capture_output=True, text=True, timeout=900,
        )
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr[-3000:] + cluster.log_tails()
    assert f"Spark ({cluster.url})" in done.stderr
    _assert_embedded_matches(read_outputs(str(out)), embedded)
    # The executors' Python is the shipped archive's, unpacked in their working directories.
    assert seen, "no executor Python process was seen"
    for command, cwd in seen:
        assert command == "./environment/bin/python", command
        assert (Path(cwd) / "environment" / "lib").is_dir()
    record = json.loads((out / "_checkpoint" / "vigil.json").read_text())["layout"]
    assert (record["shuffle_partitions"], record["buckets"]) == (4, 16)  # 2 cores


# Last in the file: it leaves the cluster with one worker.
def test_a_worker_killed_after_the_first_micro_batch_changes_nothing(cluster_env, tmp_path):
    cluster, pack = cluster_env
    # Several micro-batches over the examples' events, those of the device-clock stream
    # (app_events) among them: between micro-batches their devices' clocks, hours off, must not
    # move Spark's watermark (the other processors time their rows by the corrected time).
    events = tmp_path / "events"
    events.mkdir()
    for part in sorted(EVENTS.glob("*.jsonl")):
        (events / part.name).write_text(part.read_text())
    embedded = _embedded([str(p) for p in program_files()], tmp_path / "embedded.jsonl",
                         events)
    out, go = tmp_path / "out", tmp_path / "go"
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), cluster.url, str(pack), str(events), str(out), "600",
         str(go)],
        cwd=tmp_path, env=_driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[dict] = []
    killed_after: int | None = None
    try:
        assert driver.stdout is not None
        for line in driver.stdout:
            if not line.startswith("{"):
                continue
            lines.append(json.loads(line))
            if "batch" in lines[-1] and killed_after is None:
                cluster.kill_worker(1)  # the worker and its executor, as a lost node
                killed_after = len(lines)
                go.touch()
        driver.wait(timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    stderr = driver.stderr.read() if driver.stderr else ""
    assert driver.returncode == 0, stderr[-3000:] + cluster.log_tails()
    executors = lines[0]["executors"]
    for executable, module in executors:
        # sys.executable of the executors' Python, and Vigil imported from beside it.
        assert executable.startswith(str(cluster.work_dir)), executable
        assert executable.endswith("/environment/bin/python"), executable
        environment = executable.removesuffix("/bin/python")
        assert module.startswith(environment + "/lib/"), module
        assert not module.startswith(sys.prefix)
    after = [line for line in lines[killed_after:] if "batch" in line]
    assert after, "the run ended before the worker was killed"
    # The progress reports name the lost executor (and its tasks' failures, if it had some).
    lost = [address for line in after for address in line["executorsLost"] or ()]
    assert len(lost) == 1 and lost[0].startswith("127.0.0.1:"), after
    assert lines[-1]["summary"]["batches"] >= 3
    _assert_embedded_matches(read_outputs(str(out)), embedded)
