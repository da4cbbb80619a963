"""The DataFrames of Vigil's inputs: the Python sources (``vigil_jsonl``, ``vigil_redis``)
registered and read, plus helpers for Spark's own file, socket and rate sources."""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_udf.errors import OperatorConfigError, SourceError
from spark_udf.routing import RoutePlan
from spark_udf.sources.jsonl import JsonLinesSource, route_option
from spark_udf.sources.redis_stream import RedisStreamSource
from spark_udf.sources.rows import EVENT_COLUMN, option_text

__all__ = [
    "read_files",
    "read_jsonl",
    "read_rate_demo",
    "read_redis",
    "read_socket",
    "register_sources",
]


def register_sources(spark: SparkSession) -> None:
    """Make ``vigil_jsonl`` and ``vigil_redis`` available to ``spark.read(Stream).format``.

    Examples
    --------
    >>> register_sources(spark)
    >>> spark.readStream.format("vigil_redis").option("stream", "events").load().columns
    ['_seq', '_event']
    """
    spark.dataSource.register(JsonLinesSource)
    spark.dataSource.register(RedisStreamSource)


def read_jsonl(
    spark: SparkSession,
    path: str,
    *,
    streaming: bool = True,
    max_records_per_batch: int = 100_000,
    end_of_input: bool = False,
    route: RoutePlan | None = None,
    live: Any = None,
) -> DataFrame:
    """Events of a JSON-lines file or directory as ``(_seq, _event)``, streaming or static.

    With ``live`` (a :class:`spark_udf.live.LiveProgram`; streaming) each micro-batch runs the
    program its offsets pin: the newest of the program log when Spark planned it (with a
    ``route``, its rows are routed by that program's plan).

    With a ``route`` (streaming; see :func:`spark_udf.rules.route_specs`) the rows come out
    already routed for :func:`spark_udf.operator.detect_plan`: the reading tasks parse, key
    and pack the events, and no event row crosses into the JVM.

    With ``end_of_input`` a streaming query run with ``trigger(availableNow=True)`` reads one
    more row after the last line, the end-of-input mark, which moves the watermark past every
    event: the operator then flushes as the embedded engine does at the end of a file (pending
    absences fire, open windows close). A checkpoint that has read the mark is finished: later
    lines of the same input would all be late. (:func:`spark_udf.run.run_spark` therefore
    flushes beside its checkpoint instead, see :mod:`spark_udf.flush`.)

    Examples
    --------
    A static read (``spark`` is a SparkSession): blank lines are positions without a row.

    >>> import os, shutil, tempfile
    >>> work = tempfile.mkdtemp()
    >>> path = os.path.join(work, "events.jsonl")
    >>> with open(path, "w") as handle:
    ...     _ = handle.write('{"n": 0}\\n\\n{"n": 2}\\n')
    >>> sorted(tuple(row) for row in read_jsonl(spark, path, streaming=False).collect())
    [(0, '{"n": 0}'), (2, '{"n": 2}')]
    >>> read_jsonl(spark, path).isStreaming
    True
    >>> shutil.rmtree(work)
    """
    if not os.path.exists(path):
        raise SourceError(f"events path {path!r} does not exist")
    register_sources(spark)
    reader = spark.readStream if streaming else spark.read
    reader = (
        reader.format("vigil_jsonl")
        .option("path", os.path.abspath(path))
        .option("maxRecordsPerBatch", max_records_per_batch)
        .option("endOfInput", str(bool(end_of_input)).lower())
    )
    if route is not None:
        if not streaming:
            raise OperatorConfigError("read_jsonl: route is for streaming reads")
        reader = reader.option("route", route_option(route))
    if live is not None:
        if not streaming:
            raise OperatorConfigError("read_jsonl: live is for streaming reads")
        reader = reader.option("live", option_text(live))
    if streaming:
        reader = reader.option("minPartitions", spark.sparkContext.defaultParallelism)
    return reader.load()


def read_redis(
    spark: SparkSession,
    stream: str,
    *,
    url: str | None = None,
    host: str = "127.0.0.1",
    port: int = 6379,
    field: str = "event",
    max_records_per_batch: int = 10_000,
    live: Any = None,
) -> DataFrame:
    """A Redis Stream as a streaming ``(_seq, _event)`` DataFrame.

    The server is ``url`` when given (``redis://user:password@host:port/db``, ``rediss://``
    for TLS; see :func:`spark_udf.sources.redis_stream.redis_client`), else ``host``/``port``.
    With ``live`` (a :class:`spark_udf.live.LiveProgram`) the offsets pin the newest program
    of its log to each micro-batch.

    Examples
    --------
    The frame reads nothing until a streaming query over it starts:

    >>> frame = read_redis(spark, "events", url="rediss://reader:secret@cache.example:6380/2")
    >>> frame.isStreaming, frame.columns
    (True, ['_seq', '_event'])
    """
    register_sources(spark)
    reader = spark.readStream.format("vigil_redis").option("stream", stream)
    if url:
        reader = reader.option("url", url)
    if live is not None:
        reader = reader.option("live", option_text(live))
    return (
        reader.option("host", host)
        .option("port", port)
        .option("field", field)
        .option("maxRecordsPerBatch", max_records_per_batch)
        .load()
    )


def read_files(
    spark: SparkSession,
    path: str,
    schema: str,
    *,
    fmt: str = "json",
    max_files_per_trigger: int = 1,
) -> DataFrame:
    """Spark's own file source over a directory of JSON-lines or Parquet files, one column per
    field; new files are picked up in modification-time order.

    Examples
    --------
    >>> import tempfile
    >>> read_files(spark, tempfile.mkdtemp(), "card_id string, ts long").columns
    ['card_id', 'ts']
    """
    if fmt not in ("json", "parquet"):
        raise OperatorConfigError(f"file format must be 'json' or 'parquet', got {fmt!r}")
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", max_files_per_trigger)
        .format(fmt)
        .load(path)
    )


def read_socket(spark: SparkSession, host: str, port: int) -> DataFrame:
    """Demo input: JSON lines from a TCP socket (Spark's socket source; not fault tolerant).

    Examples
    --------
    >>> read_socket(spark, "127.0.0.1", 9999).columns
    ['_event']
    """
    return (
        spark.readStream.format("socket").option("host", host).option("port", port).load()
        .select(F.col("value").alias(EVENT_COLUMN))
    )


def read_rate_demo(
    spark: SparkSession, *, rows_per_second: int = 1000, keys: int = 100, stream: str = "ev"
) -> DataFrame:
    """Demo input from Spark's rate source: events ``(stream, k, ts, kind, _seq)`` with
    ``kind`` cycling over ``a``/``b``/``c`` per key.

    Examples
    --------
    >>> read_rate_demo(spark, rows_per_second=10, keys=3).columns
    ['stream', 'k', 'ts', 'kind', '_seq']
    """
    return spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).load().select(
        F.lit(stream).alias("stream"),
        F.concat(F.lit("k"), (F.col("value") % keys).cast("string")).alias("k"),
        F.unix_millis(F.col("timestamp")).alias("ts"),
        F.element_at(F.array(F.lit("a"), F.lit("b"), F.lit("c")),
                     ((F.col("value") / keys).cast("long") % 3 + 1).cast("int")).alias("kind"),
        F.col("value").alias("_seq"),
    )
