"""Building the SparkSession Vigil runs on: Python workers on this interpreter (or on a packed
environment shipped to the executors), RocksDB state with changelog checkpointing, UTC, quiet
logs."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from spark_udf.cluster import parallelism, partitions_for
from spark_udf.errors import OperatorConfigError

__all__ = ["INLINE_COMMAND_BYTES", "PACKED_PYTHON", "ROCKSDB_PROVIDER", "pack_conf", "session"]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PACKED_PYTHON = "./environment/bin/python"
"""The executors' Python with a packed environment: ``spark.archives`` unpacks the archive as
``environment`` in each executor's working directory."""
INLINE_COMMAND_BYTES = 1 << 30
"""``spark.broadcast.UDFCompressionThreshold`` of the sessions built here. Above it PySpark
broadcasts a pickled Python command (default 1 MiB), and the transformWithState operator's
driver-side runner cannot load a broadcast one (``BROADCAST_VARIABLE_NOT_LOADED``): a program of
~250 rules and more pickles above 1 MiB (1,000 W5 rules: 4.4 MB), so it stays inline."""
_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def session(
    master: str | None = None,
    *,
    app_name: str = "vigil",
    shuffle_partitions: int | None = None,
    pack: str | os.PathLike | None = None,
    conf: Mapping[str, Any] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """Get or create the SparkSession the operator needs.

    Parameters
    ----------
    master:
        Spark master URL (``local[2]``, ``spark://host:7077`` ...). ``None``: in an
        application run by ``spark-submit``, the master it was given, else ``local[*]``.
    shuffle_partitions:
        ``spark.sql.shuffle.partitions``; also the number of state-store partitions of a new
        checkpoint (fixed for its lifetime). ``None``: one per core Spark schedules on, at
        least 4 (:func:`spark_udf.cluster.partitions_for`), which ``run_spark`` works out
        again when it creates a checkpoint (executors register after the session starts).
    pack:
        An archive of the Python environment (``vigil pack OUT.tar.gz``) shipped to the
        executors with ``spark.archives``; their Python is then the archive's
        (:data:`PACKED_PYTHON`), and nothing needs to be installed on the workers. The
        driver keeps this interpreter.
    conf:
        Extra Spark settings, applied last.
    log_level:
        Spark's log level (``ERROR`` keeps the console to Vigil's own output).

    Notes
    -----
    Without ``pack``, ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` are set to this interpreter
    so executors import the same Vigil and dependencies as the driver (a local master, or
    workers with the same environment at the same path). In an application run by
    ``spark-submit`` they are left as it set them (``--archives``, ``PYSPARK_PYTHON``: see
    ``docs/deploy.md``).
    """
    packed = pack_conf(pack) if pack is not None else {}
    # spark-submit starts the JVM first and hands the Python driver its gateway.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if packed or not submitted:
        # PySpark reads PYSPARK_PYTHON when the context starts: every Python worker's command.
        os.environ["PYSPARK_PYTHON"] = PACKED_PYTHON if packed else sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if master is None and not submitted:
        master = "local[*]"
    builder = (
        SparkSession.builder
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.broadcast.UDFCompressionThreshold", str(INLINE_COMMAND_BYTES))
        # Hadoop's FileContext renames shell out to `readlink` on a local disk (~50 processes
        # per micro-batch); the FileSystem-based manager renames in-process. Checkpoints on a
        # store whose rename is not atomic (object stores) should set their own manager.
        .config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_MANAGER)
    )
    if master is not None:
        builder = builder.master(master)
    java_options = "-Dlog4j2.level=error"
    if packed:
        # Java resolves files against user.dir, which stays this process's directory; only
        # the Python processes the JVM starts see the launch directory (see _launch_dir).
        java_options += f" -Duser.dir={os.getcwd()}"
    builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for name, value in {**packed, **(conf or {})}.items():
        builder = builder.config(name, str(value))
    if packed:
        with _launch_dir():
            spark = builder.getOrCreate()
    else:
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # Set on the session, not the context's conf: run_spark tells the two apart.
        cores = parallelism(spark, wait_s=0)
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions_for(cores)))
    return spark


@contextmanager
def _launch_dir() -> Iterator[None]:
    """Start the driver's JVM in a directory where ``./environment`` is this interpreter's
    environment.

    PySpark gives one Python command to every Python process of a query; with a packed
    environment it is :data:`PACKED_PYTHON`, relative to the working directory. The
    executors' is where ``spark.archives`` unpacked the archive; but the driver's JVM also
    starts Python processes (the Python data sources' planning, the state schema of
    ``transformWithStateInPandas``), in its own working directory: there ``./environment``
    must be the driver's environment. The JVM keeps the directory of the process that
    launched it, so this process moves there for the launch and back.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:  # the JVM runs already: its directory is set
        process = getattr(gateway, "proc", None)
        jvm_dir = f"/proc/{process.pid}/cwd" if process is not None else None
        if jvm_dir and os.path.isdir(jvm_dir) and not os.path.exists(
            os.path.join(jvm_dir, "environment")
        ):
            raise OperatorConfigError(
                "session(pack=...) must start Spark's JVM, and this process started one "
                "without it: build the packed session first, or in a process of its own"
            )
        yield
        return
    here = os.getcwd()
    launch = tempfile.mkdtemp(prefix="vigil-driver-")
    os.symlink(sys.prefix, os.path.join(launch, "environment"))
    atexit.register(shutil.rmtree, launch, True)
    os.chdir(launch)
    try:
        yield
    finally:
        os.chdir(here)


def pack_conf(pack: str | os.PathLike) -> dict[str, str]:
    """The Spark settings that ship a packed environment and run the executors' Python from
    it.

    Examples
    --------
    >>> conf = pack_conf("hdfs:///apps/vigil/env.tar.gz")
    >>> conf["spark.archives"], conf["spark.executorEnv.PYSPARK_PYTHON"]
    ('hdfs:///apps/vigil/env.tar.gz#environment', './environment/bin/python')
    """
    location = os.fspath(pack)
    if "://" not in location:
        if not os.path.isfile(location):
            raise OperatorConfigError(f"pack={location!r}: no such archive (vigil pack OUT.tar.gz)")
        location = os.path.abspath(location)
    return {
        "spark.archives": f"{location}#environment",
        # Executors only: the driver's own Python is already running.
        "spark.executorEnv.PYSPARK_PYTHON": PACKED_PYTHON,
    }
