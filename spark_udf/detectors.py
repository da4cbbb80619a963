"""The stateful processors Spark's ``transformWithStateInPandas`` calls for the streaming
operator: :class:`BucketedDetector` (one call per hash bucket, the default) and
:class:`PerKeyDetector` (one call per key, the baseline), with their state and timers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from cep.events.keyed import KeyedProcessor
from cep.events.watermark import END_OF_INPUT
from percolator.collector import collector_paused
from spark_udf.batch import (
    END_WATERMARK_MS,
    TIME_COLUMN,
    EventLayout,
    fire_due_keys,
    process_bucket,
)
from spark_udf.bucket_state import BucketState
from spark_udf.errors import OperatorConfigError
from spark_udf.packing import unpack_tables
from spark_udf.records import records_frame, uncorrected_record
from spark_udf.routing import (
    NEED_COLUMN,
    NEED_NO,
    NEED_UNKNOWN,
    ProcessorSource,
    RoutePlan,
    resolve_processor,
    uncorrected_in,
)

__all__ = ["BUCKET_STATE", "BucketedDetector", "PerKeyDetector"]

BUCKET_STATE = "bucket"
"""Name of the ``ValueState`` (one column, ``data binary``) holding a bucket's
:class:`~spark_udf.bucket_state.BucketState`: what the end-of-input flush reads back from a
checkpoint (:mod:`spark_udf.flush`)."""


def _engine_watermark(spark_watermark_ms: int) -> int:
    """The watermark the processors see: Spark's, or end of input once the end-of-input mark
    has moved Spark's past :data:`~spark_udf.batch.END_WATERMARK_MS`."""
    return END_OF_INPUT if spark_watermark_ms >= END_WATERMARK_MS else spark_watermark_ms


def _register_end_timer(handle: StatefulProcessorHandle, spark_watermark_ms: int) -> None:
    # Every group holding state is woken at end of input (a finite stream's mark), whether or
    # not one of its keys asked for a timer: matches waiting to grow and open windows flush.
    # Called when a group starts holding state; the timer outlives the state being cleared,
    # and registering it again at the same time is a no-op.
    if spark_watermark_ms < END_WATERMARK_MS:
        handle.registerTimer(END_WATERMARK_MS)


def _named(frames: Iterator[pd.DataFrame], columns: tuple[str, ...]) -> Iterator[pd.DataFrame]:
    # Spark 4.3 rebuilds each chunk from ``itertuples`` rows, which renames columns that are
    # not identifiers (``_seq`` arrives as ``_4``); the column order is kept, so restore names.
    for frame in frames:
        if len(frame.columns) != len(columns):
            raise OperatorConfigError(
                f"the operator expected columns {list(columns)}, Spark handed over "
                f"{list(frame.columns)}"
            )
        frame.columns = list(columns)
        yield frame


def _unpacked(payloads: list[bytes], watermark_ms: int) -> tuple[list[pd.DataFrame], bool | None]:
    """A bucket's blobs as frames. Routed blobs (see :mod:`spark_udf.routing`) flag the rows
    no rule can take: only the others, late rows and rows without a time become pandas rows;
    the flag says whether every row was decided column-wise (``None`` for plain blobs)."""
    tables = list(unpack_tables(payloads))
    if not tables or NEED_COLUMN not in tables[0].column_names:
        return [t.to_pandas() for t in tables], None
    table = pa.concat_tables(tables)
    need = table.column(NEED_COLUMN).to_numpy()
    times = table.column(TIME_COLUMN)
    late = pc.fill_null(pc.less(times, watermark_ms), True).to_numpy(zero_copy_only=False)
    keep = (need != NEED_NO) | late
    table = table.filter(pa.array(keep)).drop_columns([NEED_COLUMN])
    return [table.to_pandas()], not bool((need == NEED_UNKNOWN).any())


def _records_out(records: list[dict[str, Any]]) -> Iterator[pd.DataFrame]:
    if records:
        yield records_frame(records)


class BucketedDetector(StatefulProcessor):
    """``transformWithStateInPandas`` processor grouped by hash bucket.

    One call receives every new row of one bucket — packed by :func:`spark_udf.packing
    .pack_batches` into Arrow blobs when ``packed`` (the default), else as plain rows with
    ``columns`` — the bucket's keys and their state bytes live in one ``ValueState`` (see
    :mod:`spark_udf.bucket_state`), and the bucket keeps a single event-time timer at its
    earliest due key.
    """

    def __init__(
        self,
        source: ProcessorSource,
        layout: EventLayout,
        columns: Sequence[str],
        *,
        packed: bool = True,
        plan: RoutePlan | None = None,
        buckets: int | None = None,
        live: Any = None,
    ) -> None:
        self._source = source
        self._layout = layout
        self._columns = tuple(columns)
        self._packed = packed
        self._plan = plan
        self._buckets = plan.buckets if plan is not None else buckets
        self._live = live

    @classmethod
    def for_plan(
        cls, plan: RoutePlan, columns: Sequence[str], live: Any = None
    ) -> BucketedDetector:
        """The detector of a :class:`~spark_udf.routing.RoutePlan`: one stateful operator for
        all its processors, each owning its range of groups. With ``live`` (a
        :class:`spark_udf.live.LiveProgram`) each micro-batch runs the plan of the program
        pinned to it instead."""
        _, source, layout = plan.entries[0]
        return cls(source, layout, columns, plan=plan, live=live)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._state = handle.getValueState(BUCKET_STATE, "data binary")
        if self._plan is None:
            self._owners = [(resolve_processor(self._source), self._layout)]
        else:
            self._owners = [(resolve_processor(source), layout)
                            for _, source, layout in self._plan.entries]

    def _owner(self, key: Any) -> tuple[KeyedProcessor, EventLayout] | None:
        if self._live is not None:
            compiled = self._live.for_task()
            index = None if compiled.plan is None else compiled.plan.owner(int(key[0]))
            return None if index is None else compiled.owners[index]
        if self._plan is None:
            return self._owners[0]
        index = self._plan.owner(int(key[0]))
        return None if index is None else self._owners[index]

    def _load(self) -> BucketState:
        stored = self._state.get()
        return BucketState.from_bytes(stored[0] if stored else None, self._buckets)

    def _save(self, bucket: BucketState, watermark_ms: int, was_empty: bool) -> None:
        if bucket.registered_ms is not None and bucket.registered_ms <= watermark_ms:
            # Spark fires timers at or below the watermark in this batch (before or after the
            # input rows); either way it no longer wakes the bucket later.
            bucket.registered_ms = None
        due = bucket.earliest_due()
        if due is not None and (bucket.registered_ms is None or due < bucket.registered_ms):
            at = max(due, watermark_ms + 1)
            self._handle.registerTimer(at)
            bucket.registered_ms = at
        if bucket.keys:
            self._state.update((bucket.to_bytes(),))
            if was_empty:
                _register_end_timer(self._handle, watermark_ms)
        else:
            self._state.clear()

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        with collector_paused():
            records = self._input_rows(key, rows, timerValues)
        yield from _records_out(records)

    def _input_rows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> list[dict[str, Any]]:
        watermark = timerValues.getCurrentWatermarkInMs()
        engine_watermark = _engine_watermark(watermark)
        bucket = self._load()
        was_empty = not bucket.keys
        owner = self._owner(key)
        if owner is None:  # routing never sends rows to a slot no processor owns
            raise OperatorConfigError(f"rows arrived for state group {key[0]}, which no "
                                      "processor of this program owns")
        processor, layout = owner
        filtered = None
        uncorrected: dict[str, int] = {}
        if self._packed:
            # The blob is the last column whatever name Spark's row regrouping gave it.
            payloads = [p for frame in rows for p in frame.iloc[:, -1].tolist()]
            # Counted once per input row where the rows were routed: reported by the group
            # whose blob carries the count, whatever processor owns it.
            uncorrected = uncorrected_in(payloads)
            frames, filtered = _unpacked(payloads, engine_watermark)
        else:
            frames = _named(rows, self._columns)
        run = process_bucket(
            processor, bucket, frames, layout, engine_watermark, filtered=filtered,
            bucket_index=int(key[0]) % self._buckets if self._buckets else None,
        )
        records = run.records
        records.extend(uncorrected_record(stream, count, f"group {int(key[0])}")
                       for stream, count in sorted(uncorrected.items()))
        due = bucket.registered_ms
        if due is not None and due <= watermark and engine_watermark < END_OF_INPUT:
            # The bucket's timer expires in this batch, and Spark handles expired timers after
            # the input rows: wake the due keys now, while the bucket is loaded, and drop the
            # timer, so the timer phase does not load and store the bucket a second time.
            records.extend(fire_due_keys(processor, bucket, engine_watermark))
            self._handle.deleteTimer(due)
            bucket.registered_ms = None
        self._save(bucket, watermark, was_empty)
        return records

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        owner = self._owner(key)
        if owner is None:
            # The state of a processor an earlier program of the checkpoint had (its rules or
            # metric were removed or changed): freed when its timer wakes it.
            self._state.clear()
            return
        with collector_paused():
            bucket = self._load()
            was_empty = not bucket.keys
            records = fire_due_keys(owner[0], bucket, _engine_watermark(watermark))
            self._save(bucket, watermark, was_empty)
        yield from _records_out(records)

    def close(self) -> None:
        """Nothing to release: state lives in Spark's store."""


class PerKeyDetector(StatefulProcessor):
    """The classic layout: Spark groups by the partition key itself, one Python call per key
    and micro-batch, the key's state bytes in a ``ValueState`` and its timers registered one
    by one. Kept as the baseline the bucketed layout is measured against."""

    def __init__(
        self, source: ProcessorSource, layout: EventLayout, columns: Sequence[str]
    ) -> None:
        self._source = source
        self._layout = layout
        self._columns = tuple(columns)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._state = handle.getValueState("key", "data binary, key string")
        self._processor = resolve_processor(self._source)
        if getattr(self._processor, "tables", None):
            raise OperatorConfigError(
                "the per-key layout keeps one key's state and no table: run a program with "
                "tables in the bucketed layout (the default)"
            )
        if getattr(self._processor, "multi_key", False):
            raise OperatorConfigError(
                "the per-key layout keeps one key's state, and an event of a rule whose steps "
                "have their own `by` belongs to several keys: run it in the bucketed layout "
                "(the default)"
            )

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        # A one-key bucket reuses the bucketed code path exactly, so both layouts agree.
        stored = self._state.get()
        bucket = BucketState()
        if stored is not None:
            bucket.set(stored[1], stored[0], None)
        frames = _named(rows, self._columns)
        run = process_bucket(
            self._processor, bucket, frames, self._layout, _engine_watermark(watermark)
        )
        self._save(bucket, watermark, stored is None)
        yield from _records_out(run.records)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        stored = self._state.get()
        if stored is None:
            return
        bucket = BucketState()
        bucket.set(stored[1], stored[0], expiredTimerInfo.getExpiryTimeInMs())
        records = fire_due_keys(self._processor, bucket, _engine_watermark(watermark))
        self._save(bucket, watermark, False)
        yield from _records_out(records)

    def _save(self, bucket: BucketState, watermark_ms: int, was_empty: bool) -> None:
        if not bucket.keys:
            self._state.clear()
            return
        ((text, slot),) = bucket.keys.items()
        if slot.due_ms is not None and slot.due_ms < END_OF_INPUT:
            self._handle.registerTimer(max(slot.due_ms, watermark_ms + 1))
        if slot.state is None:
            self._state.clear()
        else:
            self._state.update((slot.state, text))
            if was_empty:
                _register_end_timer(self._handle, watermark_ms)

    def close(self) -> None:
        """Nothing to release: state lives in Spark's store."""
