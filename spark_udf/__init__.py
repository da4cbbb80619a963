"""Vigil on Spark: the keyed CEP engine as a Structured Streaming operator, backtests over static
DataFrames, Python streaming sources (JSON lines, Redis Streams) and idempotent sinks."""

from __future__ import annotations

from spark_udf.aggregates import approx_distinct, approx_percentile, sketch_agg
from spark_udf.batch import EventLayout
from spark_udf.bucket_state import BucketState
from spark_udf.detectors import BucketedDetector, PerKeyDetector
from spark_udf.errors import (
    BucketStateError,
    CheckpointError,
    OperatorConfigError,
    RedisSourceError,
    SinkError,
    SourceError,
    SparkOperatorError,
)
from spark_udf.operator import LAYOUTS, OUTPUT_SCHEMA, parse_lateness, reference_outputs
from spark_udf.pipeline import detect
from spark_udf.queries import query_outputs
from spark_udf.records import DEAD_LETTER, OUTPUT_COLUMNS
from spark_udf.rules import ProcessorSpec, detect_specs, processor_specs
from spark_udf.session import session
from spark_udf.sinks import BatchSink, read_outputs
from spark_udf.sources import (
    read_files,
    read_jsonl,
    read_rate_demo,
    read_redis,
    read_socket,
    register_sources,
)

__all__ = [
    "DEAD_LETTER",
    "LAYOUTS",
    "OUTPUT_COLUMNS",
    "OUTPUT_SCHEMA",
    "BatchSink",
    "BucketState",
    "BucketStateError",
    "BucketedDetector",
    "CheckpointError",
    "EventLayout",
    "OperatorConfigError",
    "PerKeyDetector",
    "ProcessorSpec",
    "RedisSourceError",
    "RunSummary",
    "SinkError",
    "SourceError",
    "SparkOperatorError",
    "approx_distinct",
    "approx_percentile",
    "detect",
    "detect_specs",
    "parse_lateness",
    "processor_specs",
    "query_outputs",
    "read_files",
    "read_jsonl",
    "read_outputs",
    "read_rate_demo",
    "read_redis",
    "read_socket",
    "reference_outputs",
    "register_sources",
    "run_spark",
    "session",
    "sketch_agg",
]


def __getattr__(name: str):
    # ``spark_udf.run`` is also a script (``python -m spark_udf.run``); importing it eagerly
    # here would make runpy warn that the module was imported before it ran.
    if name in ("RunSummary", "run_spark"):
        from spark_udf import run

        return getattr(run, name)
    raise AttributeError(f"module 'spark_udf' has no attribute {name!r}")
