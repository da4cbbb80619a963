"""The rows every Vigil Python source produces: ``_seq`` (the event's position in its input,
from 0) and ``_event`` (the event's JSON text), as Arrow batches, plus option parsing they
share."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

from spark_udf.errors import OperatorConfigError

__all__ = [
    "ARROW_SCHEMA",
    "EVENT_COLUMN",
    "SOURCE_SCHEMA",
    "SOURCE_TYPES",
    "positive_int",
    "source_batch",
]

EVENT_COLUMN = "_event"
SOURCE_SCHEMA = "_seq bigint, _event string"
SOURCE_TYPES = {"_seq": T.LongType(), EVENT_COLUMN: T.StringType()}
"""The Python sources' columns with their Spark types."""
ARROW_SCHEMA = pa.schema([("_seq", pa.int64()), ("_event", pa.string())])


def positive_int(options: dict[str, str], name: str, default: int) -> int:
    """The integer option ``name`` (``default`` when absent); anything else than a positive
    integer is an :class:`~spark_udf.errors.OperatorConfigError`.

    Examples
    --------
    >>> positive_int({"maxrecordsperbatch": "500"}, "maxRecordsPerBatch", 100)
    500
    >>> positive_int({}, "port", 6379)
    6379
    """
    # Spark hands options over case-insensitively, with lower-cased keys.
    raw = options.get(name, options.get(name.lower(), default))
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise OperatorConfigError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def source_batch(seqs: list[int], texts: list[str]) -> pa.RecordBatch:
    """One Arrow batch of ``(_seq, _event)`` rows."""
    return pa.RecordBatch.from_arrays(
        [pa.array(seqs, pa.int64()), pa.array(texts, pa.string())], schema=ARROW_SCHEMA
    )
