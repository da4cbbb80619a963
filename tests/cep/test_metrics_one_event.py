"""The metric operator's one-event path (``process`` and ``late``, what ``Engine.feed`` and the
Spark operator run) against absorbing each event as a one-row batch: the same rows, bit for bit,
and the same state bytes, for every aggregate kind and window shape, over events with values of
every kind, out of order and late."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.metrics import MetricOperator, compile_metric
from cep.metrics.columns import scalar_column
from cep.metrics.windows import assign_fixed, fixed_starts
from query_lang import load_program
from query_lang.compiler import normalise_value

STREAM = "stream ev (g string, v float, w string, ts timestamp) time ts lateness 3s\n"
SELECT = (
    "select count() as n, count(v) as nv, sum(v) as total, avg(v) as mean, min(v) as low, "
    "max(v) as high, min(w) as first, max(w) as last, approx_distinct(v) as dv, "
    "approx_distinct(w) as dw, approx_percentile(v, 0.5) as median, seen(w) as known, "
    "seen(v) as known_v"
)
WINDOWS = (
    "window tumbling 10s",
    "window hopping 10s every 3s",
    "window sliding 10s every 5s",
    "window sliding 10s",
    "window session gap 4s",
)
END = 2**62


class OneRowBatchOperator(MetricOperator):
    """The operator absorbing one event as a one-row batch of columns: the path ``process``
    took before it had its own."""

    def _ingest_event(self, event_fields: Mapping[str, Any], ts_ms: int) -> tuple | None:
        compiled = self.compiled
        if compiled.where_event is not None and not compiled.where_event(event_fields):
            return None
        key = tuple(normalise_value(event_fields.get(f)) for f in compiled.by)
        columns = [scalar_column(f(event_fields)) for f in compiled.args_event]
        self._ingest(np.array([ts_ms], dtype=np.int64), [key], np.zeros(1, np.int64), columns)
        return key


def compiled(window: str, by: str):
    text = STREAM + f"metric m from ev {by} {window} {SELECT}\n"
    program = load_program(text=text)
    (metric,) = program.metrics.values()
    return compile_metric(metric, streams=program.streams)


VALUES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.integers(2**62, 2**64),
    st.sampled_from([0.5, -0.0, 2.25, 1e300, float("inf"), float("-inf"), float("nan")]),
    st.booleans(),
    st.sampled_from(["a", "b", "ab", ""]),
    st.lists(st.integers(0, 2), max_size=2),
)
EVENTS = st.lists(
    st.tuples(st.sampled_from(["x", "y", None]), st.integers(0, 40_000), VALUES, VALUES),
    min_size=1,
    max_size=40,
)


def run(operator: MetricOperator, events: list[tuple]) -> tuple[list[str], list[bytes]]:
    """Feed events one by one as the engine does (late ones to ``late``); the rows as JSON
    text (so -0.0 and 0.0 differ) and the state bytes along the way."""
    rows: list[dict] = []
    states: list[bytes] = []
    top = None
    for i, (g, ts, v, w) in enumerate(events):
        top = ts if top is None else max(top, ts)
        watermark = top - 3_000
        fields = {"g": g, "v": v, "w": w, "ts": ts}
        if ts >= operator.watermark:
            rows += operator.process(fields, ts, watermark)
        else:
            rows.append({"late": operator.late(fields, ts, watermark)})
        if i % 7 == 3:
            states.append(operator.to_bytes())
    rows += operator.advance_watermark(END)
    states.append(operator.to_bytes())
    return [json.dumps(r, sort_keys=True, default=repr) for r in rows], states


@given(
    ts=st.integers(-(2**40), 2**40),
    every=st.integers(1, 50_000),
    times=st.integers(1, 5),
    extra=st.integers(0, 49_999),
)
def test_fixed_starts_are_those_assign_fixed_gives_one_event(ts, every, times, extra):
    size = every * times + extra % every if times > 1 else every
    _, starts = assign_fixed(np.array([ts]), size, every)
    assert fixed_starts(ts, size, every) == starts.tolist()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.sampled_from(WINDOWS),
    by=st.sampled_from(["by g", ""]),
    events=EVENTS,
)
def test_one_event_path_equals_one_row_batches(window, by, events):
    metric = compiled(window, by)
    fast = run(MetricOperator(metric), events)
    reference = run(OneRowBatchOperator(metric), events)
    assert fast[0] == reference[0]
    assert fast[1] == reference[1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.sampled_from(WINDOWS),
    events=st.lists(
        st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 40_000),
                  st.integers(-50, 50), st.sampled_from(["a", "b", "c"])),
        min_size=1,
        max_size=40,
    ),
)
def test_one_event_at_a_time_equals_one_batch(window, events):
    """With integer values (exact sums) and no late event, feeding events one by one gives
    the rows of one column-wise batch."""
    metric = compiled(window, "by g")
    events = sorted(events, key=lambda e: e[1])
    one_by_one = MetricOperator(metric)
    rows = []
    for g, ts, v, w in events:
        rows += one_by_one.process({"g": g, "v": v, "w": w, "ts": ts}, ts)
    rows += one_by_one.advance_watermark(END)
    batch = MetricOperator(metric)
    frame = pd.DataFrame(
        [{"g": g, "v": v, "w": w, "ts": ts, "_seq": i} for i, (g, ts, v, w) in enumerate(events)]
    )
    expected = batch.process_batch(frame, END)

    def shown(rows: list[dict]) -> list[str]:
        return sorted(json.dumps({k: r[k] for k in ("key", "window", "values")}, sort_keys=True)
                      for r in rows)

    assert shown(rows) == shown(expected)
