"""A Spark standalone cluster on this machine's loopback: a master and workers started with
PySpark's own ``bin/spark-class`` (the pip package has no ``sbin`` scripts), each worker in an
environment without this interpreter's packages, for trying ``--pack`` and for the cluster
tests and benchmark.

``python -m spark_udf.standalone --workers 2 --dir /tmp/cluster`` runs one until Ctrl-C or
``kill`` (SIGTERM, SIGHUP), which stop its master and workers too.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "spark_home", "worker_environment"]

_HOST = "127.0.0.1"


def spark_home() -> Path:
    """The PySpark package's directory, which is a Spark distribution (``bin``, ``jars``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def worker_environment(work_dir: Path) -> dict[str, str]:
    """The environment of the master and workers: this one without this interpreter's
    environment (its ``bin`` off ``PATH``, no ``VIRTUAL_ENV``, ``PYTHONPATH`` or
    ``PYSPARK_PYTHON``), so an executor's Python is only what the application ships."""
    own_bin = os.path.join(sys.prefix, "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != own_bin]
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                       "PYTHONHOME", "SPARK_CONF_DIR")
    }
    env.update({
        "PATH": os.pathsep.join(path),
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": _HOST,
        "SPARK_LOG_DIR": str(work_dir / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
    })
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) under ``work_dir``.

    Use as a context manager, or :meth:`start` and :meth:`stop` (which kills every process
    it started, executors included: each worker runs in its own process group).
    """

    work_dir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    master_port: int = field(default_factory=_free_port)
    ui_port: int = field(default_factory=_free_port)
    processes: list[subprocess.Popen] = field(default_factory=list)
    worker_processes: dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The master's URL (``spark://127.0.0.1:PORT``)."""
        return f"spark://{_HOST}:{self.master_port}"

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args], env=env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: executors die with it
            )
        finally:
            log.close()

    def start(self, timeout_s: float = 300.0) -> StandaloneCluster:
        """Start the master and the workers, and wait until every worker is registered."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = worker_environment(self.work_dir)
        master_env = {**env, "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        self.processes.append(self._spawn("master", [
            "org.apache.spark.deploy.master.Master", "--host", _HOST,
            "--port", str(self.master_port), "--webui-port", str(self.ui_port),
        ], master_env))
        for index in range(self.workers):
            self.start_worker(index, env)
        self.wait_for_workers(self.workers, timeout_s)
        return self

    def start_worker(self, index: int, env: dict[str, str] | None = None) -> None:
        """Start worker ``index`` (its files in ``work_dir/worker<index>``)."""
        work = self.work_dir / f"worker{index}"
        work.mkdir(parents=True, exist_ok=True)
        env = env or worker_environment(self.work_dir)
        process = self._spawn(f"worker{index}", [
            "org.apache.spark.deploy.worker.Worker", self.url, "--host", _HOST,
            "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(work), "--webui-port", "0",
        ], {**env, "SPARK_WORKER_DIR": str(work)})
        self.processes.append(process)
        self.worker_processes[index] = process

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        url = f"http://{_HOST}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        """Workers the master sees alive (0 while it is not up)."""
        try:
            workers = self.status().get("workers", [])
        except (OSError, ValueError, http.client.HTTPException):
            return 0  # not listening yet, or a page cut off or malformed while Jetty starts
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def wait_for_workers(self, count: int, timeout_s: float) -> None:
        """Wait until ``count`` workers are alive; ``TimeoutError`` (with the logs' tails)
        when they are not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < count:
            for process in [self.processes[0], *self.worker_processes.values()]:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster process exited: {self.log_tails()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} workers not alive in {timeout_s:.0f} s: "
                                   f"{self.log_tails()}")
            time.sleep(0.5)

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and its executors (their process group), as a lost node."""
        process = self.worker_processes.pop(index)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def log_tails(self, lines: int = 15) -> str:
        tails = []
        for log in sorted(self.work_dir.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(tails)

    def stop(self) -> None:
        """Kill every process this cluster started (workers first), executors included."""
        for process in reversed(self.processes):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            process.wait()
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_udf.standalone", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--memory", default="1g")
    parser.add_argument("--dir", default="spark-standalone")
    parser.add_argument("--port", type=int, default=7077,
                        help="the master's port (0: a free one)")
    args = parser.parse_args(argv)
    work = Path(args.dir).resolve()
    if work.exists():
        shutil.rmtree(work)
    ports = {"master_port": args.port} if args.port else {}
    stopped: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        stopped.append(signum)

    # Ctrl-C, `kill` (SIGTERM) and a closed terminal all stop the master and workers; a
    # process started with `&` by a script ignores SIGINT unless told otherwise.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    with StandaloneCluster(work, args.workers, args.cores, args.memory, **ports) as cluster:
        print(f"master {cluster.url}, UI http://{_HOST}:{cluster.ui_port}; Ctrl-C or kill "
              "stops", flush=True)
        while not stopped:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
