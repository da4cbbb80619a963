"""The Vigil engine as a Spark operator: :func:`detect` turns a DataFrame of events into a
DataFrame of matches and dead letters, streaming (``transformWithStateInPandas`` with event-time
timers) or static (a backtest through ``applyInPandas``), with the same results.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from cep.events.keyed import KeyedProcessor
from cep.events.time_bounds import DEFAULT_AHEAD_MS
from cep.events.watermark import END_OF_INPUT
from spark_udf.batch import (
    ARRIVAL_COLUMN,
    BUCKET_COLUMN,
    LATE_COLUMN,
    SEQ_COLUMN,
    TIME_COLUMN,
    backtest_frame,
    run_key,
)
from spark_udf.detectors import BucketedDetector, PerKeyDetector
from spark_udf.errors import OperatorConfigError
from spark_udf.input_plan import (
    DetectPlan,
    ahead_of,
    check_reserved,
    column_types,
    json_route,
    prepare_input,
    routed_layout,
    with_seq,
)
from spark_udf.packing import PACKED_SCHEMA, pack_batches
from spark_udf.records import OUTPUT_COLUMNS, key_text, match_record, records_frame
from spark_udf.routing import (
    DEFAULT_BUCKETS,
    MAX_TIME_COLUMN,
    ROUTED_SCHEMA,
    ProcessorSource,
    RoutePlan,
    check_buckets,
    resolve_processor,
    route_plan_batches,
)
from spark_udf.session import INLINE_COMMAND_BYTES

__all__ = [
    "LAYOUTS",
    "OUTPUT_SCHEMA",
    "detect",
    "detect_plan",
    "parse_lateness",
    "reference_outputs",
]

_SPARK_TYPES = {"string": T.StringType(), "timestamp": T.TimestampType()}
OUTPUT_SCHEMA = T.StructType(
    [T.StructField(name, _SPARK_TYPES[kind], True) for name, kind in OUTPUT_COLUMNS]
)
"""Spark schema of :func:`detect`'s output (see :data:`spark_udf.records.OUTPUT_COLUMNS`)."""

LAYOUTS = ("bucketed", "per_key")
"""``bucketed``: one Python call per hash bucket and micro-batch (the default, fast);
``per_key``: one call per key (the classic layout, kept for comparison)."""

_WATERMARK_COLUMN = "_vigil_wm"
_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_lateness(value: int | str | Any) -> int:
    """Milliseconds of a lateness given as int ms, ``"30s"``-style text or an AST ``Duration``.

    Examples
    --------
    >>> parse_lateness("30s"), parse_lateness(250), parse_lateness("2m")
    (30000, 250, 120000)
    """
    if isinstance(value, bool):
        raise OperatorConfigError(f"lateness must be a duration such as 30s, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise OperatorConfigError(f"lateness must not be negative, got {value} ms")
        return value
    ms = getattr(value, "ms", None)
    if isinstance(ms, int):
        return parse_lateness(ms)
    if isinstance(value, str):
        text = value.strip()
        for unit in ("ms", "s", "m", "h", "d"):
            number = text[: -len(unit)]
            if text.endswith(unit) and number.isdigit():
                return int(number) * _DURATION_UNITS[unit]
    raise OperatorConfigError(f"lateness must be a duration such as 30s or 500ms, got {value!r}")


def detect(
    df: DataFrame,
    processor: ProcessorSource,
    *,
    key_cols: Sequence[str] | Mapping[str, Sequence[str]],
    time_col: str | Mapping[str, str],
    lateness: int | str | Any,
    time_unit: str | Mapping[str, str] = "ms",
    buckets: int = DEFAULT_BUCKETS,
    layout: str = "bucketed",
    stream: str | None = None,
    json_col: str | None = None,
    final_watermark_ms: int = END_OF_INPUT,
    late_in_input_order: bool = True,
    ahead_ms: int | Mapping[str, int] | None = None,
) -> DataFrame:
    """Run a keyed processor over a DataFrame of events; returns matches and dead letters.

    Parameters
    ----------
    df:
        Events, streaming or static. Either one column per field (plus optional ``stream`` and
        ``_seq``), or a JSON text column (``json_col``) holding each whole event.
    processor:
        A :class:`cep.events.keyed.KeyedProcessor` (pickled to the executors), or a zero-argument
        callable building one on each executor (for processors that do not pickle).
    key_cols:
        Columns (fields) that make up the partition key, in the order of the processor's key;
        a mapping ``stream -> columns`` when streams name their key differently.
    time_col:
        The event-time field: a timestamp, epoch number (``time_unit``: ``ms`` or ``s``) or
        ISO-8601 text; a mapping ``stream -> field`` (and ``time_unit`` mapping) when streams
        differ.
    lateness:
        Bounded out-of-orderness (``"30s"``, ms as int): the watermark is the largest event
        time seen minus this; rows behind it are ``late`` dead letters.
    buckets:
        Number of hash buckets of the key: Spark calls Python once per bucket and micro-batch,
        so a few per core of the cluster (the default suits up to 8 cores; see
        ``docs/spark.md``). Fixed for the life of a checkpoint: a restart with another count
        stops with an error naming the checkpoint's.
    layout:
        ``bucketed`` (default) or ``per_key`` (one call per key; the slow baseline).
    stream:
        Stream of events that carry no ``stream`` field.
    final_watermark_ms:
        Static input only: the watermark at the end of the input (default: end of input, every
        window closes and every absence fires).
    late_in_input_order:
        Static input with a ``_seq`` column only: mark rows behind the running watermark of
        the input order as late, as the embedded engine reading the same file would.
    ahead_ms:
        How far an event time may run ahead of the wall clock (ms; a mapping ``stream ->
        ms``); default: each stream's ``ahead`` as the processor's schemas hold it, else one
        day. A row beyond it (or outside the years an event time may have) gets no event time,
        so it never moves the watermark, and the processor makes it a dead letter
        (``too_far_ahead``, ``bad_timestamp``).

    Returns
    -------
    DataFrame
        Columns ``kind, name, match_id, key, payload, start, end`` (see ``docs/spark.md``).
        Streaming: append mode, one row per match when it is final. Dead letters have kind
        ``dead_letter`` and their reason as ``name``.

    Examples
    --------
    A program's rule (compiled by :func:`spark_udf.rules.processor_specs`) over a static
    frame of JSON text, with ``spark`` a SparkSession (:func:`spark_udf.session`):

    >>> from spark_udf.rules import processor_specs
    >>> (spec,), _ = processor_specs('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... ''')
    >>> events = spark.createDataFrame([
    ...     ('{"card_id": "c1", "amount": 500, "ts": "2026-01-01T00:00:00Z"}',),
    ...     ('{"card_id": "c2", "amount": 5, "ts": "2026-01-01T00:00:01Z"}',),
    ...     ('{"card_id": "c3", "amount": "lots", "ts": "2026-01-01T00:00:02Z"}',),
    ... ], "_event string")
    >>> out = detect(events, spec.processor, key_cols=["card_id"], time_col="ts",
    ...              lateness="5s", json_col="_event", stream="txn")
    >>> sorted((row.kind, row.name, row.key) for row in out.collect())
    [('dead_letter', 'wrong_type', '["c3"]'), ('rule', 'big', '{"card_id":"c1"}')]
    """
    if layout not in LAYOUTS:
        raise OperatorConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_buckets(buckets)
    lateness_ms = parse_lateness(lateness)
    ahead_ms = ahead_ms if ahead_ms is not None else ahead_of(processor) or DEFAULT_AHEAD_MS
    route = json_route(df.columns, json_col, key_cols, time_col, time_unit, stream, buckets,
                       ahead_ms)
    if df.isStreaming and layout == "bucketed" and route is not None:
        event_layout = routed_layout(column_types(df), route.json_column, stream)
        return detect_plan(df, RoutePlan(((route, processor, event_layout),), buckets,
                                         lateness_ms))
    prepared, plan = prepare_input(
        df, key_cols=key_cols, time_col=time_col, time_unit=time_unit, lateness_ms=lateness_ms,
        stream=stream, json_col=json_col, buckets=buckets,
        ahead_ms=ahead_ms,
    )
    if df.isStreaming:
        return _detect_streaming(prepared, processor, plan, layout)
    return _detect_static(prepared, processor, plan, layout, final_watermark_ms,
                          late_in_input_order and SEQ_COLUMN in df.columns)


def detect_plan(df: DataFrame, plan: RoutePlan, live: Any = None) -> DataFrame:
    """Run every processor of ``plan`` in one stateful operator over a streaming frame: its
    JSON rows, routed here (``mapInArrow``), or rows a source already routed (columns
    :data:`~spark_udf.routing.ROUTED_SCHEMA`, see :func:`spark_udf.read_jsonl`'s ``route``).
    With ``live`` (:class:`spark_udf.live.LiveProgram`) each micro-batch routes its rows and
    runs the processors of the program pinned to it; ``plan`` then gives the watermark's
    delay, fixed when the query starts.
    """
    if MAX_TIME_COLUMN in df.columns:
        routed = df
    else:
        check_reserved(df)
        routed = with_seq(df, df.columns).mapInArrow(
            lambda batches: _route_batches(batches, plan, live), ROUTED_SCHEMA
        )
    # The watermark is defined on each blob's largest event time: the same maximum as over
    # the rows themselves.
    watermarked = (
        routed.withColumn(_WATERMARK_COLUMN, F.timestamp_millis(F.col(MAX_TIME_COLUMN)))
        .withWatermark(_WATERMARK_COLUMN, f"{plan.lateness_ms} milliseconds")
        .drop(_WATERMARK_COLUMN)
    )
    stateful = BucketedDetector.for_plan(plan, tuple(watermarked.columns), live)
    check_inline(df, stateful)
    return watermarked.groupBy(BUCKET_COLUMN).transformWithStateInPandas(
        statefulProcessor=stateful,
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="EventTime",
    )


def broadcast_threshold(df: DataFrame) -> int:
    """The size above which PySpark broadcasts a pickled command in ``df``'s session."""
    context = df.sparkSession.sparkContext
    return int(context._jvm.PythonUtils.getBroadcastThreshold(context._jsc))


def check_inline(df: DataFrame, stateful: StatefulProcessor) -> None:
    """Refuse, with what to do, a stateful processor that pickles above the session's
    ``spark.broadcast.UDFCompressionThreshold``: PySpark would broadcast it, and the
    transformWithState operator's driver-side runner cannot load a broadcast command (the query
    would fail at its start with ``BROADCAST_VARIABLE_NOT_LOADED``). Sessions built by
    :func:`spark_udf.session.session` raise the threshold."""
    limit = broadcast_threshold(df)
    if limit >= INLINE_COMMAND_BYTES:
        return  # the session's own setting: no program comes near it, and pickling costs
    size = len(cloudpickle.dumps(stateful))
    if size > limit:
        raise OperatorConfigError(
            f"the compiled program pickles to {size:,} bytes, above this session's "
            f"spark.broadcast.UDFCompressionThreshold ({limit:,}): PySpark would broadcast it, "
            "which the transformWithState operator cannot load; build the session with "
            "spark_udf.session() or set spark.broadcast.UDFCompressionThreshold to at least "
            f"{size:,} when you build it"
        )


def _route_batches(batches: Iterator[Any], plan: RoutePlan, live: Any) -> Iterator[Any]:
    """Route a task's rows by ``plan``, or by the plan of the program pinned to the task's
    micro-batch (``live``; nothing when that program has no keyed processor)."""
    if live is not None:
        plan = live.for_task().plan
        if plan is None:
            return
    yield from route_plan_batches(batches, plan)


def _detect_streaming(
    prepared: DataFrame, source: ProcessorSource, plan: DetectPlan, layout: str
) -> DataFrame:
    watermarked = (
        prepared.withColumn(_WATERMARK_COLUMN, F.timestamp_millis(F.col(TIME_COLUMN)))
        .withWatermark(_WATERMARK_COLUMN, f"{plan.lateness_ms} milliseconds")
        # Spark drops rows behind the watermark before a stateful operator when the watermark
        # column reaches it; without the column every row arrives and the operator reports the
        # late ones as dead letters instead.
        .drop(_WATERMARK_COLUMN)
    )
    if layout == "bucketed":
        columns = tuple(watermarked.columns)
        packed = watermarked.mapInArrow(
            lambda batches: pack_batches(batches, BUCKET_COLUMN), PACKED_SCHEMA
        )
        grouped = packed.groupBy(BUCKET_COLUMN)
        stateful: StatefulProcessor = BucketedDetector(
            source, plan.layout, columns, buckets=plan.buckets
        )
    else:
        grouped = watermarked.groupBy(*plan.key_columns)
        stateful = PerKeyDetector(source, plan.layout, watermarked.columns)
    check_inline(prepared, stateful)
    return grouped.transformWithStateInPandas(
        statefulProcessor=stateful,
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="EventTime",
    )


def _detect_static(
    prepared: DataFrame,
    source: ProcessorSource,
    plan: DetectPlan,
    layout: str,
    final_watermark_ms: int,
    late_in_input_order: bool,
) -> DataFrame:
    if late_in_input_order:
        seen = Window.orderBy(SEQ_COLUMN).rowsBetween(Window.unboundedPreceding, -1)
        arrival = F.max(TIME_COLUMN).over(seen) - F.lit(plan.lateness_ms)
        prepared = prepared.withColumns(
            {ARRIVAL_COLUMN: arrival, LATE_COLUMN: F.col(TIME_COLUMN) < arrival}
        )
    event_layout = plan.layout

    def run(frame: pd.DataFrame) -> pd.DataFrame:
        processor = resolve_processor(source)
        outcome = backtest_frame(processor, frame, event_layout, final_watermark_ms)
        return records_frame(outcome.records)

    group = [BUCKET_COLUMN] if layout == "bucketed" else list(plan.key_columns)
    return prepared.groupBy(*group).applyInPandas(run, schema=OUTPUT_SCHEMA)


def reference_outputs(
    processor: KeyedProcessor, events: Sequence[Mapping[str, Any]], watermark_ms: int
) -> list[dict[str, Any]]:
    """Run events through the processor directly, one call per key, with no Spark: the result
    the streaming and static operators must reproduce (matches as ``match_record`` rows)."""
    by_key: dict[str, tuple[tuple, list[Mapping[str, Any]]]] = {}
    multi_key = getattr(processor, "multi_key", False)
    for event in events:
        if multi_key:
            keys = processor.keys_of(event)  # type: ignore[attr-defined]
        else:
            key = processor.key_of(event)
            keys = [] if key is None else [key]
        for key in keys:
            by_key.setdefault(key_text(key), (key, []))[1].append(event)
    out: list[dict[str, Any]] = []
    for key, key_events in by_key.values():
        results, _ = run_key(processor, key, key_events, watermark_ms)
        out.extend(match_record(m) for r in results for m in r.outputs)
    return out
