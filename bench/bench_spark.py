"""Throughput and micro-batch latency of the Spark operator on a card-testing workload: the
bucketed layout (one Python call per hash bucket and micro-batch) against the per-key layout
(one call per key), both on ``local[2]`` with RocksDB state.

Usage: ``python bench/bench_spark.py [--events N] [--keys K] [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from cep.events.keyed import ProcessResult
from spark_udf import BatchSink, read_outputs, session
from spark_udf.operator import detect_plan
from spark_udf.routing import DEFAULT_BUCKETS
from spark_udf.rules import ProcessorSpec, detect_specs, processor_specs, route_specs
from spark_udf.run import lines_read
from spark_udf.sources import EVENT_COLUMN, SOURCE_TYPES, read_jsonl

PROGRAM = """
stream txn (card_id string, amount float, merchant string, ts timestamp)
  time ts unit ms lateness 5s

rule card_testing "Tiny probe charges, then a large purchase on the same card"
  from txn
  by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
  emit card_id, count(probe) as probes, sum(probe.amount) as probed, big.amount as amount
"""

BASE_MS = 1_767_225_600_000

# W1 as the CEP benchmark defines it (bench/bench_cep.py): the same generator and rule, so the
# embedded engine and the Spark operator are measured on the same events.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cep  # noqa: E402

W1_PROGRAM = bench_cep.STREAM + bench_cep.WORKLOADS["W1"]
DATASETS = {
    # name: (program, stream, key field)
    "w1": (W1_PROGRAM, "ev", "key"),
    "probes": (PROGRAM, "txn", "card_id"),
}


def write_w1_events(path: str, events: int, keys: int) -> None:
    """bench_cep's W1 events as JSON lines (0.2 % probes, 1.2 % large amounts, ~500 injected
    card-testing bursts per 1M events)."""
    frame = bench_cep.generate(events, keys)
    with open(path, "w", encoding="utf-8") as handle:
        for record in frame.to_dict("records"):
            handle.write(json.dumps(record) + "\n")


def write_events(path: str, events: int, keys: int, seed: int = 7) -> None:
    """A probe-heavy stress case: 30 % probes (< 1.00), 10 % large purchases, ~10 ms apart with
    up to 2 s of disorder (below the 5 s lateness: nothing is late)."""
    rng = random.Random(seed)
    merchants = [f"m{i}" for i in range(50)]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(events):
            roll = rng.random()
            amount = round(rng.uniform(0.1, 0.99), 2) if roll < 0.3 else (
                round(rng.uniform(501, 2000), 2) if roll < 0.4 else round(rng.uniform(2, 200), 2)
            )
            handle.write(json.dumps({
                "card_id": f"c{rng.randrange(keys)}", "amount": amount,
                "merchant": rng.choice(merchants), "ts": BASE_MS + i * 10 - rng.randint(0, 2000),
            }) + "\n")


class CountingProcessor:
    """A minimal keyed processor (counts each key's events in its state bytes): measures what
    the operator itself costs, without the rule engine's per-event work."""

    def __init__(self, field: str) -> None:
        self.field = field

    def key_of(self, event: dict) -> tuple | None:
        card = event.get(self.field)
        return None if card is None else (card,)

    def process(self, key, state, events, watermark_ms) -> ProcessResult:
        count = int(state or b"0") + len(events)
        return ProcessResult(state=str(count).encode())

    def on_timer(self, key, state, timer_ms, watermark_ms) -> ProcessResult:
        return ProcessResult(state=state)


def _specs(engine: str, data: str) -> list[ProcessorSpec]:
    program, stream, key = DATASETS[data]
    if engine == "rules":
        return processor_specs(program)[0]
    return [ProcessorSpec(CountingProcessor(key), ("count",), {stream: (key,)},
                          {stream: "ts"}, {stream: "ms"}, 5_000, stream)]


def run_layout(
    spark: Any, events_path: str, work: str, layout: str, batch: int, buckets: int,
    engine: str = "rules", data: str = "w1",
) -> dict[str, Any]:
    """Run the whole input through one layout; returns throughput and batch latencies."""
    specs = _specs(engine, data)
    if layout == "fused":
        # the source routes its own rows (what `vigil run` does): no event row enters the JVM
        plan = route_specs(SOURCE_TYPES, specs, json_col=EVENT_COLUMN, buckets=buckets)
        assert plan is not None
        frame = read_jsonl(spark, events_path, max_records_per_batch=batch, route=plan)
        outputs = detect_plan(frame, plan)
    else:
        frame = read_jsonl(spark, events_path, max_records_per_batch=batch)
        outputs = detect_specs(frame, specs, json_col=EVENT_COLUMN, buckets=buckets,
                               layout=layout)
    name = f"{engine}-{layout}-{os.path.basename(events_path)}"
    out = os.path.join(work, f"{name}-out")
    sink = BatchSink(out, os.path.join(work, f"{name}-dead"))
    query = (
        outputs.writeStream.foreachBatch(sink)
        .option("checkpointLocation", os.path.join(work, f"{name}-ck"))
        .trigger(availableNow=True)
        .start()
    )
    started = time.monotonic()
    query.awaitTermination()
    wall = time.monotonic() - started
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    # events = input lines (a routing source reports blobs as its rows)
    rows = sum(lines_read(p) for p in progress)
    latencies = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    steady = latencies[1:] or latencies  # the first batch also pays the query's start-up
    return {
        "data": data,
        "engine": engine,
        "layout": layout,
        "events": rows,
        "wall_s": round(wall, 2),
        "events_per_s": round(rows / wall),
        "batches": len(progress),
        "batch_s_median": round(statistics.median(latencies), 2) if latencies else None,
        "batch_s_max": round(max(latencies), 2) if latencies else None,
        "steady_events_per_s": round(sum(lines_read(p) for p in progress[1:] or progress)
                                     / sum(steady)) if steady else None,
        "matches": len(read_outputs(out)),
        "dead_letters": sink.counters.dead_letters,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="100k events")
    parser.add_argument("--batch", type=int, default=150_000, help="events per micro-batch")
    parser.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    parser.add_argument("--naive-events", type=int, default=None,
                        help="events for the per-key layout (default: same as --events)")
    parser.add_argument("--layouts", default="fused,bucketed,per_key",
                        help="fused: the source routes its rows (vigil run); bucketed: "
                        "detect() on a frame of JSON text; per_key: one call per key")
    parser.add_argument("--engine", choices=("rules", "counting"), default="rules",
                        help="the card_testing rule, or a counting processor (operator cost)")
    parser.add_argument("--data", choices=tuple(DATASETS), default="w1",
                        help="w1: bench_cep's W1 events (default); probes: 30 %% probes")
    parser.add_argument("--warmup", type=int, default=0,
                        help="events each layout first runs as a separate query (not measured), "
                        "so the measured run meets a warm JVM as a long-running job does")
    parser.add_argument("--out", help="append the JSON results to this file")
    args = parser.parse_args(argv)
    events = 100_000 if args.quick else args.events
    work = tempfile.mkdtemp(prefix="vigil-bench-spark-")
    spark = session("local[2]", shuffle_partitions=2, app_name="vigil-bench")
    results = []
    try:
        for layout in args.layouts.split(","):
            n = (args.naive_events or events) if layout == "per_key" else events
            path = os.path.join(work, f"events-{args.data}-{n}.jsonl")
            writer = write_w1_events if args.data == "w1" else write_events
            if not os.path.exists(path):
                writer(path, n, args.keys)
            if args.warmup:
                warm = os.path.join(work, f"warmup-{args.data}-{args.warmup}.jsonl")
                if not os.path.exists(warm):
                    writer(warm, args.warmup, args.keys)
                run_layout(spark, warm, work, layout, min(args.batch, args.warmup),
                           args.buckets, args.engine, args.data)
            result = run_layout(spark, path, work, layout, min(args.batch, n), args.buckets,
                                args.engine, args.data)
            result.update(warmup=args.warmup)
            result.update(keys=args.keys, buckets=args.buckets)
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    naive = next((r for r in results if r["layout"] == "per_key"), None)
    if naive is not None and naive["events_per_s"]:
        for result in results:
            if result is not naive:
                print(json.dumps({
                    "layout": result["layout"], "vs": "per_key",
                    "speedup": round(result["events_per_s"] / naive["events_per_s"], 1),
                    "steady_speedup": round(result["steady_events_per_s"]
                                            / naive["steady_events_per_s"], 1),
                }))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as handle:
            for result in results:
                handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
