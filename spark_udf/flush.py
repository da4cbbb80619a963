"""The end of a finite run: every key the checkpoint's state holds is run to end of input, as the
embedded engine's ``close()`` does, from a read of Spark's state store that leaves the checkpoint
as it was; a later run over the grown input continues from the state before the flush."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cep.events.watermark import END_OF_INPUT
from spark_udf.batch import BUCKET_COLUMN, fire_due_keys
from spark_udf.bucket_state import BucketState
from spark_udf.detectors import BUCKET_STATE
from spark_udf.operator import OUTPUT_SCHEMA
from spark_udf.records import OUTPUT_COLUMNS, records_frame
from spark_udf.routing import RoutePlan, resolve_processor

__all__ = ["end_of_input_rows", "flush_buckets"]


def flush_buckets(
    plan: RoutePlan, groups: list[int], blobs: list[bytes | None]
) -> list[dict[str, Any]]:
    """The output records of running each stored bucket (its group and state bytes) to end of
    input: every key of the bucket gets ``on_timer`` at
    :data:`~cep.events.watermark.END_OF_INPUT` (pending absences fire, windows close,
    matches waiting to grow are emitted) — what the operator does when the end-of-input mark
    passes (:func:`spark_udf.batch.fire_due_keys`).

    Examples
    --------
    A processor that reports, at end of input, how many events each key still held:

    >>> from cep.events.keyed import ProcessResult
    >>> from spark_udf.bucket_state import KeySlot
    >>> from spark_udf.routing import JsonRoute, StreamRoute
    >>> class Held:
    ...     def key_of(self, event): return (event.get("k"),)
    ...     def process(self, key, state, events, watermark_ms): return ProcessResult(None)
    ...     def on_timer(self, key, state, timer_ms, watermark_ms):
    ...         match = {"kind": "rule", "name": "held", "match_id": f"m-{key[0]}",
    ...                  "key": {"k": key[0]}, "held": int(state)}
    ...         return ProcessResult(None, outputs=[match])
    >>> route = JsonRoute("_event", {None: StreamRoute(("k",), "ts", 1)}, "s", 4)
    >>> plan = RoutePlan(((route, Held(), None),), 4, 0)
    >>> stored = BucketState({'["a"]': KeySlot(b"3", None)}, buckets=4).to_bytes()
    >>> [(r["name"], r["match_id"]) for r in flush_buckets(plan, [2], [stored])]
    [('held', 'm-a')]
    """
    owners = [resolve_processor(source) for _, source, _ in plan.entries]
    records: list[dict[str, Any]] = []
    for group, blob in zip(groups, blobs, strict=True):
        if not blob:
            continue
        bucket = BucketState.from_bytes(blob, plan.buckets)
        owner = plan.owner(group)
        if owner is not None:  # else: a processor an earlier program had (spark_udf.edits)
            records.extend(fire_due_keys(owners[owner], bucket, END_OF_INPUT))
    return records


def end_of_input_rows(spark: SparkSession, checkpoint: str, plan: RoutePlan) -> pd.DataFrame:
    """The rows (:data:`~spark_udf.operator.OUTPUT_SCHEMA`) the end-of-input flush emits over
    the state of the last micro-batch committed to ``checkpoint``, a query of ``plan``'s
    operator (:func:`spark_udf.operator.detect_plan`).

    The state is read with Spark's state data source (``format("statestore")``) as a static
    frame, and each bucket is flushed in the executor that reads it; nothing is written to the
    checkpoint, so it keeps the state before the flush (a run over more input continues from
    there, and flushing it again gives the same rows).
    """
    stored = (
        spark.read.format("statestore")
        .option("stateVarName", BUCKET_STATE)
        .load(checkpoint)
        .select(F.col(f"key.{BUCKET_COLUMN}").alias("group"), F.col("value.data").alias("data"))
    )

    def flush(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            records = flush_buckets(
                plan, [int(g) for g in frame["group"]], frame["data"].tolist()
            )
            if records:
                yield records_frame(records)

    rows = stored.mapInPandas(flush, OUTPUT_SCHEMA).toPandas()
    return rows[[name for name, _ in OUTPUT_COLUMNS]]
