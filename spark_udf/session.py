"""Building the SparkSession Vigil runs on: Python workers on this interpreter, RocksDB state
with changelog checkpointing, UTC, quiet logs."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["ROCKSDB_PROVIDER", "session"]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def session(
    master: str = "local[*]",
    *,
    app_name: str = "vigil",
    shuffle_partitions: int = 4,
    conf: Mapping[str, Any] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """Get or create the SparkSession the operator needs.

    Parameters
    ----------
    master:
        Spark master URL (``local[2]``, ``spark://host:7077`` ...).
    shuffle_partitions:
        ``spark.sql.shuffle.partitions``; also the number of state-store partitions of a new
        checkpoint (fixed for its lifetime). A few per core is right for local runs.
    conf:
        Extra Spark settings, applied last.
    log_level:
        Spark's log level (``ERROR`` keeps the console to Vigil's own output).

    Notes
    -----
    ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` are set to this interpreter so executors
    import the same Vigil and dependencies as the driver.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Hadoop's FileContext renames shell out to `readlink` on a local disk (~50 processes
        # per micro-batch); the FileSystem-based manager renames in-process. Checkpoints on a
        # store whose rename is not atomic (object stores) should set their own manager.
        .config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_MANAGER)
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
    )
    for name, value in (conf or {}).items():
        builder = builder.config(name, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
