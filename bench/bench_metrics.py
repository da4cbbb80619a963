"""Throughput of windowed metrics on the three paths that run them: the Spark operator's per-key
calls (``MetricProcessor.process`` through ``process_bucket``, one call per key and micro-batch,
the key's state carried as bytes between batches), the embedded engine fed one event at a time
(``Engine.feed``: followed inputs, the service's posted events) and fed column-wise
(``Engine.feed_batch``, the reference). A pandas group-by over window starts computes the
tumbling shape's exact aggregates in the same run, as a peer::

    .venv/bin/python bench/bench_metrics.py [--events 200000] [--keys 10000] [--markdown PATH]

Each metric shape runs alone, on the same events. Times are process CPU time (every path is
single-threaded), the best of ``--repeat`` runs; the rows of the three paths are compared (floats
to 12 significant digits, as a sum's last bits depend on the order of its additions).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

import cep
from cep.engine import Engine
from cep.events.watermark import END_OF_INPUT
from spark_udf.batch import SEQ_COLUMN, TIME_COLUMN, EventLayout, fire_due_keys, process_bucket
from spark_udf.bucket_state import BucketState
from spark_udf.rules import processor_specs

T0_MS = 1_767_225_600_000
LATENESS_MS = 5_000
STREAM = f"""
stream txn (card string, amount float, merchant string, ts timestamp)
  time ts unit ms lateness {LATENESS_MS // 1000}s
"""
SHAPES = {
    "tumbling count/sum": "window tumbling 1m select count() as n, sum(amount) as total",
    "hopping approx_percentile": (
        "window hopping 2m every 1m select approx_percentile(amount, 0.99) as p99, count() as n"
    ),
    "session max/min": (
        "window session gap 30s select count() as n, max(amount) as top, min(amount) as least"
    ),
    "approx_distinct": "window tumbling 1m select approx_distinct(merchant) as merchants",
    "seen": "window tumbling 1m select count() as n, seen(merchant) as known",
}
LAYOUT = EventLayout(
    event_columns=("stream", "card", "amount", "merchant", "ts", SEQ_COLUMN),
    int_columns=frozenset({"ts", SEQ_COLUMN}),
)
PATHS = ("spark", "feed", "feed_batch")
PATH_TITLES = {
    "spark": "Spark path (process per key and batch)",
    "feed": "Engine.feed (one event)",
    "feed_batch": "Engine.feed_batch",
}


def program(shape: str) -> str:
    return STREAM + f"metric m from txn by card {SHAPES[shape]}\n"


def make_events(n: int, keys: int, spacing_ms: int, seed: int) -> pd.DataFrame:
    """Charges every ``spacing_ms`` on average over ``keys`` cards, out of order within the
    lateness (so no event is late on any path), with a few merchants per card."""
    rng = np.random.default_rng(seed)
    ts = T0_MS + np.arange(n, dtype=np.int64) * spacing_ms
    ts -= rng.integers(0, LATENESS_MS, n)
    card = rng.integers(0, keys, n)
    merchant = (card * 7 + rng.integers(0, 4, n)) % 997
    return pd.DataFrame({
        "stream": "txn",
        "card": [f"card-{c}" for c in card.tolist()],
        "amount": np.round(rng.lognormal(3, 1.2, n), 2),
        "merchant": [f"m{m}" for m in merchant.tolist()],
        "ts": ts,
        SEQ_COLUMN: np.arange(n, dtype=np.int64),
    })


def chunks(frame: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    return [frame.iloc[lo:lo + size] for lo in range(0, len(frame), size)]


def run_spark(shape: str, frame: pd.DataFrame, batch: int) -> Callable[[], list[dict]]:
    """Spark's rule: each micro-batch meets the watermark of the batches before it; windows
    close from timers after each batch, and at the end of input."""
    (spec,), skipped = processor_specs(program(shape))
    assert not skipped
    processor = spec.processor
    parts = [part.assign(**{TIME_COLUMN: part["ts"]}) for part in chunks(frame, batch)]

    def run() -> list[dict]:
        bucket = BucketState()
        watermark = -(2**62)
        rows: list[dict] = []
        for part in parts:
            run = process_bucket(processor, bucket, [part], LAYOUT, watermark, filtered=True)
            rows += run.records
            watermark = max(watermark, int(part["ts"].max()) - LATENESS_MS)
            rows += fire_due_keys(processor, bucket, watermark)
        rows += fire_due_keys(processor, bucket, END_OF_INPUT)
        return [json.loads(r["payload"]) for r in rows if r["kind"] == "metric"]

    return run


def run_feed(shape: str, frame: pd.DataFrame, batch: int) -> Callable[[], list[dict]]:
    events = frame.drop(columns=["stream", SEQ_COLUMN]).to_dict("records")
    engine = Engine()
    engine.register(program(shape))

    def run() -> list[dict]:
        for event in events:
            engine.feed(event, "txn")
        engine.close()
        return [m for m in engine.drain() if m["kind"] == "metric"]

    return run


def run_feed_batch(shape: str, frame: pd.DataFrame, batch: int) -> Callable[[], list[dict]]:
    parts = chunks(frame.drop(columns=["stream", SEQ_COLUMN]), batch)
    engine = Engine()
    engine.register(program(shape))

    def run() -> list[dict]:
        for part in parts:
            engine.feed_batch(part, "txn")
        engine.close()
        return [m for m in engine.drain() if m["kind"] == "metric"]

    return run


RUNNERS: dict[str, Callable[[str, pd.DataFrame, int], Callable[[], list[dict]]]] = {
    "spark": run_spark,
    "feed": run_feed,
    "feed_batch": run_feed_batch,
}
"""Each path's set-up (compiling the program, preparing the input; not timed), returning the
timed run."""


def pandas_tumbling(frame: pd.DataFrame) -> pd.DataFrame:
    """The tumbling shape's rows, exactly: count and sum per card and minute."""
    start = frame["ts"].to_numpy() // 60_000 * 60_000
    return (
        frame.assign(start=start)
        .groupby(["card", "start"], sort=True)["amount"]
        .agg(n="size", total="sum")
        .reset_index()
    )


def canonical(rows: list[dict]) -> list[str]:
    def fix(value):
        if isinstance(value, float) and math.isfinite(value):
            return float(f"{value:.12g}")
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    keep = ("key", "window", "values", "revision")
    return sorted(json.dumps(fix({k: r[k] for k in keep}), sort_keys=True) for r in rows)


def timed(prepare: Callable[[], Callable[[], object]], repeat: int) -> tuple[float, object]:
    """The best CPU time of ``repeat`` runs (each on a fresh set-up, not timed)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        run = prepare()
        start = time.process_time()
        result = run()
        best = min(best, time.process_time() - start)
    return best, result


@dataclass
class ShapeResult:
    shape: str
    rates: dict[str, float]
    rows: int
    agree: bool


def bench_shape(
    shape: str, frame: pd.DataFrame, batch: int, repeat: int, paths: tuple[str, ...]
) -> ShapeResult:
    rates, outputs = {}, {}
    for path in paths:
        seconds, rows = timed(lambda p=path: RUNNERS[p](shape, frame, batch), repeat)
        rates[path] = len(frame) / seconds
        outputs[path] = canonical(rows)
        print(f"  {shape:28} {path:11} {rates[path]:>12,.0f} events/s  {len(rows):,} rows",
              file=sys.stderr)
    first = next(iter(outputs.values()))
    return ShapeResult(shape, rates, len(first), all(o == first for o in outputs.values()))


def bench_peer(frame: pd.DataFrame, repeat: int) -> tuple[float, int]:
    seconds, result = timed(lambda: lambda: pandas_tumbling(frame), repeat)
    return len(frame) / seconds, len(result)


def markdown(
    results: list[ShapeResult], paths: tuple[str, ...], peer: tuple[float, int] | None,
    args: argparse.Namespace,
) -> str:
    lines = [
        f"{args.events:,} events over {args.keys:,} keys (one every {args.spacing_ms} ms, out "
        f"of order within {LATENESS_MS // 1000} s), micro-batches of {args.batch:,}; events/s "
        f"by process CPU time, best of {args.repeat}; Python {platform.python_version()}.",
        "",
        "| metric shape | " + " | ".join(PATH_TITLES[p] for p in paths)
        + " | rows | paths agree |",
        "|---|" + "---:|" * len(paths) + "---:|---|",
    ]
    for r in results:
        cells = " | ".join(f"{r.rates[p]:,.0f}" for p in paths)
        lines.append(f"| {r.shape} | {cells} | {r.rows:,} | {'yes' if r.agree else 'NO'} |")
    if peer is not None:
        tumbling = next((r for r in results if r.shape == "tumbling count/sum"), None)
        lines += ["", f"pandas group-by over window starts (tumbling count/sum, exact): "
                  f"{peer[0]:,.0f} events/s, {peer[1]:,} rows."]
        if tumbling is not None:
            ratios = ", ".join(f"{PATH_TITLES[p]} {tumbling.rates[p] / peer[0]:.3f}x"
                               for p in paths)
            lines.append(f"Ours / pandas: {ratios}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--spacing-ms", type=int, default=5,
                        help="average time between events (default 5: 200k events in ~17 min)")
    parser.add_argument("--batch", type=int, default=20_000, help="events per micro-batch")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--shapes", nargs="*", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--paths", nargs="*", choices=PATHS, default=list(PATHS))
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args()
    print(f"cep from {cep.__file__}", file=sys.stderr)
    frame = make_events(args.events, args.keys, args.spacing_ms, args.seed)
    paths = tuple(args.paths)
    results = [bench_shape(s, frame, args.batch, args.repeat, paths) for s in args.shapes]
    peer = None
    if not args.no_peer and "tumbling count/sum" in args.shapes:
        peer = bench_peer(frame, max(args.repeat, 3))
        tumbling = next(r for r in results if r.shape == "tumbling count/sum")
        if peer[1] != tumbling.rows:
            print(f"pandas gives {peer[1]} rows, ours {tumbling.rows}", file=sys.stderr)
    text = markdown(results, paths, peer, args)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write(text)


if __name__ == "__main__":
    main()
