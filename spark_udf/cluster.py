"""What a run needs to know about the cluster it runs on: how many cores it has (to size a new
checkpoint's shuffle partitions and buckets), which hosts run its executors, and whether a
checkpoint path is one every one of them sees."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection
from typing import Any
from urllib.parse import urlparse

from spark_udf.errors import CheckpointError
from spark_udf.routing import DEFAULT_BUCKETS

__all__ = [
    "MIN_PARTITIONS",
    "TaskFailures",
    "NETWORK_FILESYSTEMS",
    "buckets_for",
    "check_shared_checkpoint",
    "executor_hosts",
    "local_only_problem",
    "new_checkpoint_partitions",
    "parallelism",
    "partitions_for",
]

MIN_PARTITIONS = 4
"""The fewest shuffle partitions a new checkpoint gets (``local[2]`` measured best with 4)."""

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "glusterfs", "ceph", "beegfs",
    "fuse.sshfs", "fuse.glusterfs", "fuse.cephfs", "fuse.juicefs", "fuse.gcsfuse", "9p",
})
"""Filesystem types of ``/proc/mounts`` whose local paths other hosts can also see."""

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def partitions_for(cores: int) -> int:
    """Shuffle partitions for a new checkpoint on ``cores`` cores: one per core, at least
    :data:`MIN_PARTITIONS`. They are the stateful operator's tasks per micro-batch, each with
    a state store to commit, so more than the cores only adds commits.

    Examples
    --------
    >>> partitions_for(2), partitions_for(32)
    (4, 32)
    """
    return max(MIN_PARTITIONS, int(cores))


def buckets_for(partitions: int) -> int:
    """Hash buckets per processor for a new checkpoint over ``partitions`` shuffle partitions:
    two per partition, at least :data:`~spark_udf.routing.DEFAULT_BUCKETS`. A bucket is the
    stateful operator's unit of parallelism (all of a bucket's keys are one Python call), so
    fewer buckets than partitions would leave partitions idle; each bucket also costs a call
    and a state write per micro-batch, so not many more.

    Examples
    --------
    >>> buckets_for(4), buckets_for(32)
    (16, 64)
    """
    return max(DEFAULT_BUCKETS, 2 * int(partitions))


def new_checkpoint_partitions(spark: Any, requested: int | None = None) -> int:
    """Shuffle partitions for a new checkpoint, set on ``spark``'s session: ``requested``,
    else those set when the session was built (``shuffle_partitions=``, a ``--conf``), else
    :func:`partitions_for` the cores registered now."""
    if requested is None:
        built = spark.sparkContext.getConf().get("spark.sql.shuffle.partitions", None)
        requested = int(built) if built else partitions_for(parallelism(spark))
    spark.conf.set("spark.sql.shuffle.partitions", str(requested))
    return int(requested)


def parallelism(spark: Any, *, wait_s: float = 30.0) -> int:
    """The cores Spark schedules on (``defaultParallelism``). On a cluster, executors register
    after the session starts: wait up to ``wait_s`` for the first one, so the count is not the
    empty cluster's floor of 2."""
    context = spark.sparkContext
    if not context.master.startswith("local"):
        deadline = time.monotonic() + wait_s
        while len(_block_managers(spark)) <= 1 and time.monotonic() < deadline:
            time.sleep(0.25)
    return int(context.defaultParallelism)


def executor_hosts(spark: Any) -> list[str]:
    """Hosts of the registered executors (without the driver)."""
    managers = _block_managers(spark)
    if len(managers) <= 1:  # the driver's alone
        return []
    hosts = [manager.rpartition(":")[0] for manager in managers]
    driver = spark.sparkContext.getConf().get("spark.driver.host", "")
    if driver in hosts:
        hosts.remove(driver)
    return hosts


def _block_managers(spark: Any) -> set[str]:
    """``host:port`` of the block managers Spark knows, the driver's among them (none on a
    local master)."""
    context = spark.sparkContext
    if context.master.startswith("local"):
        return set()
    return {f"{info.host}:{info.port}" for info in context.statusTracker().getExecutorInfos()}


class TaskFailures:
    """What went wrong in a streaming query's tasks since the last look: failed task attempts
    (each is retried, up to ``spark.task.maxFailures``), stages run again (a lost executor's
    shuffle output), executors lost. PySpark has no ``SparkListener``; this reads Spark's
    status tracker, for the jobs of the query's job group (its run id)."""

    def __init__(self, spark: Any, group: str) -> None:
        self._spark = spark
        self._tracker = spark.sparkContext.statusTracker()
        self._group = group
        self._failed: dict[tuple[int, int], int] = {}  # (stage, attempt) -> failures counted
        self._done: set[int] = set()  # jobs finished and counted
        self._executors = _block_managers(spark)

    def since_last(self) -> dict[str, Any]:
        """``failedTasks``, ``stageRetries`` and ``executorsLost`` (their ``host:port``)
        since the last call, and the ``executors`` registered now."""
        failed = retried = 0
        for job in self._tracker.getJobIdsForGroup(self._group):
            if job in self._done:
                continue
            info = self._tracker.getJobInfo(job)
            if info is None:
                continue
            for stage_id in info.stageIds:
                stage = self._tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                key = (stage_id, stage.currentAttemptId)
                if key not in self._failed and stage.currentAttemptId > 0:
                    retried += 1
                failed += max(0, stage.numFailedTasks - self._failed.get(key, 0))
                self._failed[key] = stage.numFailedTasks
            if str(info.status) in ("SUCCEEDED", "FAILED"):
                self._done.add(job)
        now = _block_managers(self._spark)
        lost = sorted(self._executors - now)  # the driver's is never lost
        self._executors = now
        return {"failedTasks": failed, "stageRetries": retried, "executorsLost": lost,
                "executors": max(0, len(now) - 1)}


def local_only_problem(
    path: str, driver_host: str, hosts: Collection[str], filesystem: str | None
) -> str | None:
    """Why ``path`` cannot hold a checkpoint for executors on ``hosts`` (a driver on
    ``driver_host``), or ``None``. A path is local-only when it has no scheme or ``file:``, is
    not on a network filesystem (``filesystem``, its ``/proc/mounts`` type) and some executor
    runs on another host than the driver.

    Examples
    --------
    >>> local_only_problem("/data/ckpt", "10.0.0.1", ["10.0.0.2"], "ext4")[:53]
    "checkpoint /data/ckpt is on this machine's disk (ext4"
    >>> local_only_problem("/data/ckpt", "10.0.0.1", ["10.0.0.1"], "ext4") is None
    True
    >>> local_only_problem("hdfs://nn/ckpt", "10.0.0.1", ["10.0.0.2"], None) is None
    True
    >>> local_only_problem("/mnt/shared/ckpt", "10.0.0.1", ["10.0.0.2"], "nfs4") is None
    True
    """
    scheme = urlparse(path).scheme
    if scheme not in ("", "file"):
        return None
    if filesystem in NETWORK_FILESYSTEMS:
        return None
    here = {driver_host, *_LOOPBACK, socket.gethostname()}
    others = sorted({host for host in hosts if host not in here})
    if not others:
        return None
    return (
        f"checkpoint {path} is on this machine's disk ({filesystem or 'local'} filesystem), "
        f"but executors run on {', '.join(others)}: their state-store files would stay on "
        "their own disks, and a task moved to another executor would not find them. Put the "
        "checkpoint (and --out, --dead-letter) on storage every node sees: hdfs://, s3a://, "
        "abfss://, gs://, or a network filesystem mounted at the same path on every node "
        "(see docs/deploy.md)"
    )


def check_shared_checkpoint(spark: Any, path: str) -> None:
    """Raise :class:`~spark_udf.errors.CheckpointError` when ``path`` is local-only (see
    :func:`local_only_problem`) for the executors registered (waiting for the first one, as
    :func:`parallelism` does)."""
    parallelism(spark)
    hosts = executor_hosts(spark)
    if not hosts:
        return
    driver = spark.sparkContext.getConf().get("spark.driver.host", "")
    local = urlparse(path).path if urlparse(path).scheme == "file" else path
    problem = local_only_problem(path, driver, hosts, _filesystem(os.path.abspath(local)))
    if problem:
        raise CheckpointError(problem)


def _filesystem(path: str) -> str | None:
    """The ``/proc/mounts`` type of the mount holding ``path`` (``None`` where unknown)."""
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            mounts = [line.split()[1:3] for line in handle if len(line.split()) >= 3]
    except OSError:
        return None
    best, kind = "", None
    for point, fs_type in mounts:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fs_type
    return kind
