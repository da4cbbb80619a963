"""The rows every Vigil Python source produces: ``_seq`` (the event's position in its input,
from 0) and ``_event`` (the event's JSON text), as Arrow batches, plus option parsing they
share."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import types as T

from spark_udf.errors import OperatorConfigError

__all__ = [
    "ARROW_SCHEMA",
    "EVENT_COLUMN",
    "SOURCE_SCHEMA",
    "SOURCE_TYPES",
    "live_of",
    "option_object",
    "option_text",
    "pinned",
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


def option_text(value: Any) -> str:
    """An object as the text of a source option (pickled, base64)."""
    return base64.b64encode(cloudpickle.dumps(value)).decode("ascii")


def option_object(text: str) -> Any:
    """The object :func:`option_text` wrote."""
    return cloudpickle.loads(base64.b64decode(text))


def live_of(options: dict[str, str]) -> Any:
    """The source's ``live`` option: a :class:`spark_udf.live.LiveProgram` (each micro-batch
    runs the log's entry its offsets pin, see :func:`pinned`), or ``None``."""
    text = options.get("live")
    return option_object(text) if text else None


def pinned(live: Any, offset: dict) -> dict:
    """``offset`` with the newest entry of ``live``'s program log written into it (Spark logs
    a batch's offsets before it runs the batch: that pins the entry to the batch, also for a
    replay). An offset that differs only by the entry starts a micro-batch without rows,
    which brings a new program into effect while the input is quiet."""
    if live is None:
        return offset
    return {**offset, "program": live.log().current()}
