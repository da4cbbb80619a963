"""The window operator of a compiled ``metric``: absorbs events in event time, emits each window's
final row when the watermark passes its end and corrections for late events, and writes its whole
state as versioned bytes. It is pure (batches and watermarks in, result rows out); see
``docs/metrics.md`` for the semantics."""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from cep.events.watermark import NO_WATERMARK, iso_ms
from cep.metrics.aggregates import HLL_PRECISION, TDIGEST_COMPRESSION, Seen
from cep.metrics.columns import (
    ValueColumn,
    from_masked,
    group_codes,
    hash_column,
    scalar_column,
    scalar_hashable,
    scalar_value,
    segment_slices,
    time_column,
)
from cep.metrics.compiler import (
    CompiledMetric,
    aggregate_slot,
    compile_metric,
    metric_match_id,
)
from cep.metrics.errors import MetricInputError, MetricStateError
from cep.metrics.groups import GroupState, RowBuffer, WindowState
from cep.metrics.state import CODEC, StateReader, StateWriter
from cep.metrics.windows import (
    FIXED,
    SESSION,
    SLIDING_EVENT,
    assign_fixed,
    fixed_starts,
    session_runs,
)
from query_lang.compiler import normalise_value
from sketches import hash_value

__all__ = ["MetricOperator"]
# Re-exported for callers outside cep.metrics that still import them from here (cep/__init__.py,
# cep/engine/queries.py, spark_udf/rules.py, spark_udf/aggregates.py,
# tests/spark_udf/test_aggregates_spark.py); new code imports them from cep.metrics.
__all__ += ["HLL_PRECISION", "TDIGEST_COMPRESSION", "compile_metric"]


class MetricOperator:
    """Runs one compiled metric over events in event time.

    The engine calls :meth:`process_batch` with on-time events and the current watermark (or
    :meth:`process` for one event), :meth:`advance_watermark` when time moves without events,
    and :meth:`late` for an event older than the watermark. Each returns result rows (dicts,
    see ``docs/metrics.md``) in the order (window end, window start, key).

    Parameters
    ----------
    compiled:
        The metric, from :func:`~cep.metrics.compiler.compile_metric`.

    Examples
    --------
    >>> import pandas as pd
    >>> from cep.metrics import compile_metric
    >>> from query_lang import parse
    >>> stream, decl = parse(
    ...     "stream txn (card string, amount float, ts timestamp) time ts\\n"
    ...     "metric spend from txn by card window tumbling 1m select sum(amount) as total\\n"
    ... ).declarations
    >>> operator = MetricOperator(compile_metric(decl, streams={"txn": stream}))
    >>> batch = pd.DataFrame(
    ...     {"card": ["a", "b", "a", "a"], "amount": [5.0, 1.0, 7.0, 2.0],
    ...      "ts": [1_000, 2_000, 30_000, 61_000]}
    ... )
    >>> for row in operator.process_batch(batch, watermark_ms=60_000):
    ...     print(row["key"], row["start"], row["end"], row["values"])
    {'card': 'a'} 1970-01-01T00:00:00.000Z 1970-01-01T00:01:00.000Z {'total': 12.0}
    {'card': 'b'} 1970-01-01T00:00:00.000Z 1970-01-01T00:01:00.000Z {'total': 1.0}

    A metric whose ``where`` or an aggregate's argument reads a table (``lookup``) holds each
    event until the watermark passes its time, so that the table holds every change up to
    then, and reads it as of that time (``CompiledMetric.reads_tables``).

    A late event corrects a window still retained (here with no lateness: none is):

    >>> operator.late({"card": "b", "amount": 4.0}, 50_000, 60_000) is None
    True
    >>> [(row["key"], row["values"]) for row in operator.advance_watermark(120_000)]
    [({'card': 'a'}, {'total': 2.0})]
    """

    def __init__(self, compiled: CompiledMetric) -> None:
        self.compiled = compiled
        self.watermark = NO_WATERMARK
        self._groups: dict[tuple, GroupState] = {}
        self._fire_queue: list[tuple[int, int, tuple, int]] = []
        self._purge_queue: list[tuple[int, int, tuple, int]] = []
        self._tiebreak = 0
        self._next_session = 0
        self._seen_slots = [i for i, a in enumerate(compiled.aggregates) if isinstance(a, Seen)]
        # Events waiting for the watermark (a metric that reads tables): one at a time, as
        # (time, arrival, fields), and batches, as (earliest time, rows with their `ts`).
        self._held: list[tuple[int, int, dict[str, Any]]] = []
        self._held_frames: list[tuple[int, pd.DataFrame]] = []
        self._arrivals = 0

    # ------------------------------------------------------------ public API

    @property
    def open_windows(self) -> int:
        """Windows held (open, or fired and retained for corrections), over all groups."""
        return sum(len(g.windows) for g in self._groups.values())

    @property
    def is_empty(self) -> bool:
        """Whether the operator holds nothing: no group has a window or a ``seen`` history,
        no event waits for the watermark."""
        return not self._groups and not self._held and not self._held_frames

    @property
    def next_due_ms(self) -> int | None:
        """The smallest watermark at which :meth:`advance_watermark` has work (a window to fire
        or to forget, an event held to take), or ``None``: where a caller that stores the
        operator sets its timer."""
        heads = [queue[0][0] for queue in (self._fire_queue, self._purge_queue) if queue]
        if self._held:
            heads.append(self._held[0][0])
        heads.extend(earliest for earliest, _ in self._held_frames)
        return min(heads) if heads else None

    def process_batch(self, df: pd.DataFrame, watermark_ms: int | None = None) -> list[dict]:
        """Absorb a batch of events, then move to ``watermark_ms`` and return what closed.

        Parameters
        ----------
        df:
            One row per event of the metric's stream(s): the fields, ``ts`` (epoch ms, or a
            datetime column) and optionally ``_seq`` (input order, to order equal times).
        watermark_ms:
            The engine's watermark after this batch; ``None`` leaves it where it is.

        Raises
        ------
        MetricInputError
            When ``ts`` is missing or null, or an event is older than the operator's
            watermark (those must go through :meth:`late`).
        """
        if len(df):
            ts = time_column(df, self.compiled.name)
            self._check_on_time(int(ts.min()))
            if self.compiled.reads_tables:
                # Until the watermark passes them; the lookups read this `ts` (ms).
                self._held_frames.append((int(ts.min()), df.assign(ts=ts)))
            else:
                self._ingest_frame(df, ts)
        return self.advance_watermark(watermark_ms) if watermark_ms is not None else []

    def _ingest_frame(self, df: pd.DataFrame, ts: np.ndarray) -> None:
        """Absorb a batch of on-time events (``ts``: their times in ms), column-wise."""
        if "_seq" in df.columns:
            order = np.lexsort((df["_seq"].to_numpy(), ts))
        else:
            order = np.argsort(ts, kind="stable")
        if not np.array_equal(order, np.arange(len(order))):
            df = df.iloc[order]
            ts = ts[order]
        if self.compiled.where_batch is not None:
            keep = self.compiled.where_batch(df)
            if not keep.all():
                df, ts = df[keep], ts[keep]
        if len(df):
            keys, codes = group_codes(df, self.compiled.by)
            columns = [from_masked(f(df)) for f in self.compiled.args_batch]
            self._ingest(ts, keys, codes, columns)

    def process(
        self, event_fields: Mapping[str, Any], ts_ms: int, watermark_ms: int | None = None
    ) -> list[dict]:
        """Absorb one event (fields by name, event time in ms); with ``watermark_ms``, then move
        the watermark and return what closed. Same results as :meth:`process_batch`."""
        ts_ms = int(ts_ms)
        self._check_on_time(ts_ms)
        if self.compiled.reads_tables:
            self._hold(ts_ms, event_fields)
        else:
            self._ingest_event(event_fields, ts_ms)
        return self.advance_watermark(watermark_ms) if watermark_ms is not None else []

    def advance_watermark(self, wm_ms: int) -> list[dict]:
        """Move the watermark to ``wm_ms`` (it never moves back): emit the final result of every
        window whose end is at or before it, and forget windows retained long enough."""
        wm_ms = int(wm_ms)
        if wm_ms < self.watermark:
            return []
        # At the same watermark there can still be work: windows a late event left to forget.
        self.watermark = wm_ms
        self._take_held()
        rows, _ = self._fire_due()
        self._purge()
        return _ordered(rows)

    def late(
        self, event_fields: Mapping[str, Any], ts_ms: int, watermark_ms: int
    ) -> list[dict] | None:
        """Handle an event older than the watermark.

        Returns ``None`` when a window it belongs to has already been forgotten (the engine
        dead-letters it as ``late``); otherwise counts it and returns the corrections of the
        windows whose results changed (possibly none). An event the metric's ``where``
        rejects is not needed, so it returns ``[]``.
        """
        ts_ms = int(ts_ms)
        where = self.compiled.where_event
        if where is not None and not where(
            event_fields, _At(ts_ms) if self.compiled.reads_tables else None
        ):
            return []
        if ts_ms >= self.watermark:
            if self.compiled.reads_tables:
                self._hold(ts_ms, event_fields)
            else:
                self._ingest_event(event_fields, ts_ms)
            return []
        if not self._retained(ts_ms, max(self.watermark, int(watermark_ms))):
            return None
        key = self._ingest_event(event_fields, ts_ms)
        rows, fired_now = self._fire_due()
        group = self._groups.get(key)
        if group is not None:
            for wid, window in sorted(group.windows.items(), key=lambda kv: kv[1].end):
                if window.fired and window.end > ts_ms and (key, wid) not in fired_now:
                    row = self._evaluate(group, window)
                    if row is not None:
                        rows.append(row)
        return _ordered(rows)

    # ------------------------------------------------------------ ingestion

    def _check_on_time(self, oldest: int) -> None:
        if self.watermark != NO_WATERMARK and oldest < self.watermark:
            raise MetricInputError(
                f"metric '{self.compiled.name}': an event at {iso_ms(oldest)} is older than "
                f"the watermark {iso_ms(self.watermark)}; hand late events to late()"
            )

    def _retained(self, ts_ms: int, watermark: int) -> bool:
        shape = self.compiled.shape
        lateness = self.compiled.lateness_ms
        if shape.mode == SESSION:
            # A session closed before wm - lateness may have been forgotten; an event there
            # could have bridged it, so only later events can be counted exactly.
            return ts_ms >= watermark - lateness
        return shape.earliest_end(ts_ms) + lateness > watermark

    def _hold(self, ts_ms: int, event_fields: Mapping[str, Any]) -> None:
        """Keep an event until the watermark passes its time (a metric that reads tables)."""
        self._arrivals += 1
        fields = {name: normalise_value(value) for name, value in event_fields.items()}
        heapq.heappush(self._held, (ts_ms, self._arrivals, fields))

    def _take_held(self) -> None:
        """Absorb the held events the watermark has passed (at or before it): the tables they
        read hold every change up to their times by now. Batches stay column-wise (each its
        own, so its columns keep their types); the rest stays held."""
        wm = self.watermark
        if self._held_frames and min(e for e, _ in self._held_frames) <= wm:
            kept = []
            for earliest, frame in self._held_frames:
                if earliest > wm:
                    kept.append((earliest, frame))
                    continue
                ts = frame["ts"].to_numpy(dtype=np.int64)
                due = ts <= wm
                if due.all():
                    self._ingest_frame(frame, ts)
                    continue
                self._ingest_frame(frame[due], ts[due])
                kept.append((int(ts[~due].min()), frame[~due]))
            self._held_frames = kept
        held = self._held
        while held and held[0][0] <= wm:
            ts_ms, _, fields = heapq.heappop(held)
            self._ingest_event(fields, ts_ms)

    def _held_rows(self) -> list[list]:
        """Every held event as ``[time, fields]``, by time and arrival (for the state bytes)."""
        rows = [(ts, n, fields) for ts, n, fields in self._held]
        later = self._arrivals  # the batches' rows after every row held one at a time
        for _, frame in self._held_frames:
            times = frame["ts"].to_numpy(dtype=np.int64).tolist()
            records = frame.drop(columns=["ts", "_seq"], errors="ignore").to_dict("records")
            for ts, record in zip(times, records, strict=True):
                later += 1
                fields = {name: normalise_value(value) for name, value in record.items()}
                rows.append((ts, later, fields))
        return [[ts, fields] for ts, _, fields in sorted(rows, key=lambda r: (r[0], r[1]))]

    def _ingest_event(self, event_fields: Mapping[str, Any], ts_ms: int) -> tuple | None:
        """Absorb one event; returns its group key, or None when ``where`` rejects it."""
        compiled = self.compiled
        at = _At(ts_ms) if compiled.reads_tables else None
        if compiled.where_event is not None and not compiled.where_event(event_fields, at):
            return None
        key = tuple(normalise_value(event_fields.get(f)) for f in compiled.by)
        if compiled.shape.mode == SLIDING_EVENT:
            # Its windows are computed from the group's rows, which are columns anyway.
            columns = [scalar_column(f(event_fields, at)) for f in compiled.args_event]
            self._ingest(np.array([ts_ms], dtype=np.int64), [key], np.zeros(1, np.int64), columns)
        else:
            values = [scalar_value(f(event_fields, at)) for f in compiled.args_event]
            self._ingest_one(ts_ms, key, values)
        return key

    def _ingest_one(self, ts_ms: int, key: tuple, values: list[Any]) -> None:
        """:meth:`_ingest` of one event, with plain values: the same windows, and each aggregate
        absorbs the partial a one-row batch would give (``Aggregate.partial_one``), so the
        states are those of the column-wise path."""
        group = self._group(key)
        aggregates = self.compiled.aggregates
        for h, slot in enumerate(self._seen_slots):
            value = values[aggregates[slot].arg]
            if scalar_hashable(value):
                group.history[h].add_one(hash_value(value), ts_ms)
        partials = [
            a.partial_one(None if a.arg is None else values[a.arg]) for a in aggregates
        ]
        shape = self.compiled.shape
        if shape.mode == SESSION:
            states = [a.absorb(a.empty(), p) for a, p in zip(aggregates, partials, strict=True)]
            self._merge_session(key, group, ts_ms, ts_ms, states)
            return
        for start in fixed_starts(ts_ms, shape.size_ms, shape.every_ms):
            states = self._fixed_window(group, key, start).states
            for j, aggregate in enumerate(aggregates):
                states[j] = aggregate.absorb(states[j], partials[j])

    def _group(self, key: tuple) -> GroupState:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = GroupState(key, len(self._seen_slots))
        return group

    def _schedule(self, queue: list, due: int, key: tuple, wid: int) -> None:
        self._tiebreak += 1
        heapq.heappush(queue, (due, self._tiebreak, key, wid))

    def _ingest(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[ValueColumn]
    ) -> None:
        """Absorb events that passed ``where``, sorted by time: ``keys[codes[i]]`` is event
        ``i``'s group, ``columns`` the values of each aggregate argument."""
        shape = self.compiled.shape
        if self._seen_slots:
            self._record_history(ts, keys, codes, columns)
        if shape.mode == FIXED:
            self._ingest_fixed(ts, keys, codes, columns)
        elif shape.mode == SLIDING_EVENT:
            self._ingest_sliding(ts, keys, codes, columns)
        else:
            self._ingest_sessions(ts, keys, codes, columns)

    def _record_history(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[ValueColumn]
    ) -> None:
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        for h, slot in enumerate(self._seen_slots):
            hashes, valid = hash_column(columns[self.compiled.aggregates[slot].arg])
            hashes, valid, times = hashes[order], valid[order], ts[order]
            for lo, hi in segment_slices(bounds, len(order)):
                group = self._group(keys[sorted_codes[lo]])
                keep = valid[lo:hi]
                group.history[h].add(hashes[lo:hi][keep], times[lo:hi][keep])

    def _partials(self, columns: list[ValueColumn], order: np.ndarray, bounds: np.ndarray) -> list:
        """Per aggregate, the partial results of each segment of the rows ``order`` picks."""
        taken: dict[int, ValueColumn] = {}
        result = []
        n = len(order)
        for aggregate in self.compiled.aggregates:
            column = None
            if aggregate.arg is not None:
                column = taken.get(aggregate.arg)
                if column is None:
                    column = taken[aggregate.arg] = columns[aggregate.arg].take(order)
            result.append(aggregate.partials(column, bounds, n))
        return result

    def _fresh_states(self) -> list[Any]:
        return [a.empty() for a in self.compiled.aggregates]

    def _fixed_window(self, group: GroupState, key: tuple, start: int) -> WindowState:
        """The group's fixed window starting at ``start``, opened (and its firing scheduled)
        when the group has none there yet."""
        window = group.windows.get(start)
        if window is None:
            end = start + self.compiled.shape.size_ms
            window = group.windows[start] = WindowState(start, end, self._fresh_states())
            self._schedule(self._fire_queue, end, key, start)
        return window

    def _ingest_fixed(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[ValueColumn]
    ) -> None:
        shape = self.compiled.shape
        rows, starts = assign_fixed(ts, shape.size_ms, shape.every_ms)
        pair_codes = codes[rows]
        order = np.lexsort((starts, pair_codes))
        rows, starts, pair_codes = rows[order], starts[order], pair_codes[order]
        change = np.empty(len(starts), dtype=bool)
        change[:1] = True
        change[1:] = (pair_codes[1:] != pair_codes[:-1]) | (starts[1:] != starts[:-1])
        bounds = np.flatnonzero(change)
        partials = self._partials(columns, rows, bounds)
        aggregates = self.compiled.aggregates
        for i, lo in enumerate(bounds.tolist()):
            key = keys[pair_codes[lo]]
            start = int(starts[lo])
            states = self._fixed_window(self._group(key), key, start).states
            for j, aggregate in enumerate(aggregates):
                states[j] = aggregate.absorb(states[j], partials[j][i])

    def _ingest_sliding(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[ValueColumn]
    ) -> None:
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        for lo, hi in segment_slices(bounds, len(order)):
            key = keys[sorted_codes[lo]]
            group = self._group(key)
            picked = order[lo:hi]
            group_ts = ts[picked]
            group_columns = [c.take(picked) for c in columns]
            if group.rows is None:
                group.rows = RowBuffer(group_ts, group_columns)
            else:
                group.rows.add(group_ts, group_columns)
            size = self.compiled.shape.size_ms
            for t in np.unique(group_ts).tolist():
                # A time already reported is recomputed by the late path, not re-created.
                if t not in group.windows:
                    group.windows[t] = WindowState(t - size + 1, t + 1, None)
                    self._schedule(self._fire_queue, t + 1, key, t)

    def _ingest_sessions(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[ValueColumn]
    ) -> None:
        gap = self.compiled.shape.size_ms
        order = np.lexsort((ts, codes))
        sorted_codes, sorted_ts = codes[order], ts[order]
        group_bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        runs = []
        for lo, hi in segment_slices(group_bounds, len(order)):
            runs.extend((lo + r) for r in session_runs(sorted_ts[lo:hi], gap).tolist())
        bounds = np.array(sorted(set(runs)), dtype=np.int64)
        partials = self._partials(columns, order, bounds)
        aggregates = self.compiled.aggregates
        for i, (lo, hi) in enumerate(segment_slices(bounds, len(order))):
            key = keys[sorted_codes[lo]]
            group = self._group(key)
            first, last = int(sorted_ts[lo]), int(sorted_ts[hi - 1])
            states = self._fresh_states()
            for j, aggregate in enumerate(aggregates):
                states[j] = aggregate.absorb(states[j], partials[j][i])
            self._merge_session(key, group, first, last, states)

    def _merge_session(
        self, key: tuple, group: GroupState, first: int, last: int, states: list[Any]
    ) -> None:
        gap = self.compiled.shape.size_ms
        overlapping = [
            (sid, w) for sid, w in group.windows.items()
            if w.start < last + gap and first < w.end
        ]
        aggregates = self.compiled.aggregates
        if len(overlapping) == 1:
            sid, window = overlapping[0]
            if window.start <= first and last <= window.last_ts:
                # Inside a known session: its extent (and so its identity) stays.
                for j, aggregate in enumerate(aggregates):
                    window.states[j] = aggregate.combine(window.states[j], states[j])
                return
        revision = -1
        for sid, window in overlapping:
            del group.windows[sid]
            first = min(first, window.start)
            last = max(last, window.last_ts)
            revision = max(revision, window.revision)
            states = [
                aggregate.combine(window.states[j], states[j])
                for j, aggregate in enumerate(aggregates)
            ]
        sid = self._next_session
        self._next_session += 1
        merged = WindowState(first, last + gap, states, last_ts=last)
        merged.revision = revision
        group.windows[sid] = merged
        self._schedule(self._fire_queue, merged.end, key, sid)

    # ------------------------------------------------------------ firing and purging

    def _fire_due(self) -> tuple[list[dict], set[tuple[tuple, int]]]:
        """Fire every window whose end the watermark reached; the rows and which fired."""
        rows = []
        fired: set[tuple[tuple, int]] = set()
        queue = self._fire_queue
        while queue and queue[0][0] <= self.watermark:
            due, _, key, wid = heapq.heappop(queue)
            group = self._groups.get(key)
            window = None if group is None else group.windows.get(wid)
            if window is None or window.fired or window.end != due:
                continue  # replaced: a session that grew or merged
            window.fired = True
            fired.add((key, wid))
            self._schedule(self._purge_queue, window.end + self.compiled.lateness_ms, key, wid)
            row = self._evaluate(group, window)
            if row is not None:
                rows.append(row)
        return rows, fired

    def _purge(self) -> None:
        queue = self._purge_queue
        touched: dict[tuple, GroupState] = {}
        while queue and queue[0][0] <= self.watermark:
            due, _, key, wid = heapq.heappop(queue)
            group = self._groups.get(key)
            window = None if group is None else group.windows.get(wid)
            if window is None or not window.fired or window.end + self.compiled.lateness_ms != due:
                continue
            del group.windows[wid]
            touched[key] = group
        for key, group in touched.items():
            self._tidy(key, group)

    def _horizon(self, group: GroupState) -> int:
        """Earliest start of any window of ``group`` that may still be evaluated."""
        shape = self.compiled.shape
        lateness = self.compiled.lateness_ms
        if shape.mode == SESSION:
            starts = [w.start for w in group.windows.values()]
            return min([*starts, self.watermark - lateness])
        return self.watermark - shape.size_ms - lateness

    def _tidy(self, key: tuple, group: GroupState) -> None:
        horizon = self._horizon(group)
        for history in group.history:
            history.fold(horizon)
        if group.rows is not None:
            group.rows.drop_before(horizon)
            if len(group.rows.ts) == 0:
                group.rows = None
        if not group.windows and group.rows is None and not group.history:
            del self._groups[key]

    def _window_states(self, group: GroupState, window: WindowState) -> list[Any]:
        if window.states is not None:
            return window.states
        # A per-event sliding window: fold the rows of (t - D, t] into fresh states.
        rows = group.rows
        lo = int(np.searchsorted(rows.ts, window.start, side="left"))
        hi = int(np.searchsorted(rows.ts, window.end, side="left"))
        index = np.arange(lo, hi)
        partials = self._partials(rows.columns, index, np.zeros(1, dtype=np.int64))
        return [
            aggregate.absorb(aggregate.empty(), partials[j][0])
            for j, aggregate in enumerate(self.compiled.aggregates)
        ]

    def _evaluate(self, group: GroupState, window: WindowState) -> tuple[tuple, dict] | None:
        """Compute a window's result; when it changed and passes ``having``, returns its row
        with the key rows of one call are ordered by."""
        compiled = self.compiled
        states = self._window_states(group, window)
        row: dict[str, Any] = dict(zip(compiled.by, group.key, strict=True))
        seen_index = 0
        for j, aggregate in enumerate(compiled.aggregates):
            if isinstance(aggregate, Seen):
                history = group.history[seen_index]
                seen_index += 1
                row[aggregate_slot(j)] = history.all_seen_before(states[j], window.start)
            else:
                row[aggregate_slot(j)] = aggregate.result(states[j])
        values = tuple(select(row) for select in compiled.select)
        if window.last is not None and values == window.last:
            return None
        window.revision += 1
        window.last = values
        named = dict(zip(compiled.select_names, values, strict=True))
        if compiled.having is not None:
            if not compiled.having({**dict(zip(compiled.by, group.key, strict=True)), **named}):
                return None
        if compiled.shape.mode == SLIDING_EVENT:
            start_ms, end_ms = window.start - 1, window.end - 1  # shown as (t - D, t]
        else:
            start_ms, end_ms = window.start, window.end
        key = dict(zip(compiled.by, group.key, strict=True))
        window_json = {"start": iso_ms(start_ms), "end": iso_ms(end_ms)}
        order = (end_ms, start_ms, json.dumps(key, sort_keys=True, default=str), window.revision)
        shown = {name: _json_value(v) for name, v in named.items()}
        return order, {
            "kind": "metric",
            "name": compiled.name,
            "version": compiled.version,
            "match_id": metric_match_id(
                compiled.name, compiled.version, key, start_ms, end_ms, window.revision, shown
            ),
            "key": key,
            "window": window_json,
            "values": shown,
            "final": True,
            "correction": window.revision > 0,
            "revision": window.revision,
            "severity": compiled.severity,
            "start": window_json["start"],
            "end": window_json["end"],
        }

    # ------------------------------------------------------------ state bytes

    def to_bytes(self) -> bytes:
        """The operator's whole state: watermark, groups, windows and their sketches.

        The format is versioned and explicit (sketches in their own byte format); it records
        the metric's fingerprint, so it only loads into an operator of the same definition.
        """
        out = StateWriter()
        out.i64(self.watermark)
        out.i64(self._next_session)
        out.u32(len(self._groups))
        for group in self._groups.values():
            group.write(out, self.compiled.aggregates)
        if self.compiled.reads_tables:
            held = self._held_rows()
            out.blob(json.dumps(held, separators=(",", ":")).encode("utf-8"))
        return CODEC.encode(out.finish(), self.compiled.fingerprint)

    @classmethod
    def from_bytes(cls, compiled: CompiledMetric, data: bytes) -> MetricOperator:
        """Rebuild an operator of ``compiled`` from :meth:`to_bytes` output.

        Raises
        ------
        MetricStateError
            When the bytes are truncated or corrupted, of another format version, or were
            written by an operator of another metric definition.
        """
        (fingerprint,), body = CODEC.decode(data, context=f"metric '{compiled.name}'")
        if fingerprint != compiled.fingerprint:
            raise MetricStateError(
                f"metric '{compiled.name}': the state was written for another definition of "
                "the metric"
            )
        src = StateReader(body, compiled.name)
        operator = cls(compiled)
        operator.watermark = src.i64()
        operator._next_session = src.i64()
        n_seen = len(operator._seen_slots)
        for _ in range(src.u32()):
            group = GroupState.read(src, compiled.aggregates, n_seen, len(compiled.by))
            operator._groups[group.key] = group
            for wid, window in group.windows.items():
                if window.fired:
                    due = window.end + compiled.lateness_ms
                    operator._schedule(operator._purge_queue, due, group.key, wid)
                else:
                    operator._schedule(operator._fire_queue, window.end, group.key, wid)
        if compiled.reads_tables:
            for ts_ms, fields in json.loads(src.blob().decode("utf-8")):
                operator._hold(int(ts_ms), fields)
        src.done()
        return operator


class _At:
    """The match context of one event of a metric: its time, which ``lookup`` reads a table as
    of (a metric has no pattern variables or previous events)."""

    __slots__ = ("ts_ms",)

    def __init__(self, ts_ms: int) -> None:
        self.ts_ms = ts_ms

    def bound(self, var: str) -> list:
        return []

    def prev(self, n: int) -> None:
        return None

    def time(self) -> int:
        return self.ts_ms


def _ordered(rows: list[tuple[tuple, dict]]) -> list[dict]:
    """Rows in the order (window end, window start, key, revision)."""
    return [row for _, row in sorted(rows, key=lambda pair: pair[0])]


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value

