"""W5: thousands of rules on one stream — what each registered rule costs per event.

N generated rules of a realistic mix over the CEP benchmark's events (``bench_cep.generate``,
plus a ``flags`` stream for joins): card-testing thresholds (``probe{k,} big``), sequences of
rare event kinds (``a b c``), trailing absences (``placed !paid``), joins of two streams, and
strict ``prev`` conditions, each with its own thresholds and window, tuned so that matches stay
rare. For each N it reports events/s (CPU time, ``Engine.feed_batch``), matches per 1,000
events, the rules looked at per event (``Engine.rules_touched``: what the rule index,
``--index``, saves), the time and memory to register the set, and the memory per live partial
match; and
the *sharing factor*: the CPU time of the rules run one at a time (a sample of them, scaled to
N) over the time of running them together — above 1 when registering a rule alongside others
costs less than running it alone::

    .venv/bin/python bench/bench_rules.py --events 200000 --rules 10,100,1000
    .venv/bin/python bench/bench_rules.py --events 200000 --rules 10,100 --index none
    .venv/bin/python bench/bench_rules.py --events 1000000 --rules 10,100,1000,10000 \\
        --markdown bench/results/rules.md
    .venv/bin/python bench/bench_rules.py --events 50000 --eql 10,100      # the eql peer
    .venv/bin/python bench/bench_rules.py --events 50000 --spark 100,1000  # Spark local[2]
    .venv/bin/python bench/bench_rules.py --events 20000 --keys 1000 --scale 10000

Issue #23's goal is a cost per event that follows what an event can advance, not what is
registered; the 1-rule and N-rule rows of the table show how far that holds.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_cep import generate  # noqa: E402

from cep.engine.engine import Engine  # noqa: E402
from cep.engine.rule_index import RULE_INDEXES  # noqa: E402

STREAMS = """
stream ev (id int, key string, kind string, amount float, merchant string, price float,
           ts timestamp)
  time ts unit ms lateness 5s id id
stream flags (key string, level int, ts timestamp) time ts unit ms lateness 5s
"""
SHAPES = ("threshold", "sequence", "absence", "join", "prev")
RARE_KINDS = ("order", "payment", "login", "reset", "logout")


def rule_text(i: int, rng: random.Random) -> str:
    """Rule ``i`` of the mix (shape by ``i``, parameters by ``rng``)."""
    return rule_pair(i, rng)[0]


def rule_pair(i: int, rng: random.Random) -> tuple[str, str | None]:
    """Rule ``i`` of the mix in Vigil, and the closest EQL query the ``eql`` package's engine
    runs (``None`` for the strict ``prev`` shape, which EQL cannot say). EQL has no
    ``probe{k,}`` (k probe steps say exactly k), no ``last(probe).merchant`` and no absence
    that fires when a window closes, so the EQL threshold and absence are approximations of
    the same cost: the peer's figure is a throughput, not a match-for-match reference."""
    shape = SHAPES[i % len(SHAPES)]
    window = rng.choice(["1m", "2m", "5m", "10m", "30m"])
    if shape == "threshold":
        probes, low = rng.randint(3, 5), round(rng.uniform(0.2, 1.0), 2)
        high = rng.choice([500, 800, 1200, 2000])
        return (f"rule r{i} from ev by key pattern probe{{{probes},}} big\n"
                f"  define probe as amount < {low},\n"
                f"         big as amount > {high} and merchant != last(probe).merchant\n"
                f"  within {window}\n",
                f"sequence by key with maxspan={window}\n"
                + f"  [ev where amount < {low}]\n" * probes
                + f"  [ev where amount > {high}]")
    if shape == "sequence":
        a, b, c = (rng.choice(RARE_KINDS) for _ in range(3))
        above = rng.choice([50, 100, 200, 400])
        return (f"rule r{i} from ev by key pattern a b c\n"
                f'  define a as kind == "{a}" and amount > {above}, b as kind == "{b}",\n'
                f'         c as kind == "{c}"\n'
                f"  within {window}\n",
                f"sequence by key with maxspan={window}\n"
                f'  [ev where kind == "{a}" and amount > {above}]\n'
                f'  [ev where kind == "{b}"] [ev where kind == "{c}"]')
    if shape == "absence":
        above = rng.choice([800, 1500, 3000, 5000])
        return (f"rule r{i} from ev by key pattern placed !paid\n"
                f'  define placed as kind == "order" and amount > {above},\n'
                f'         paid as kind == "payment"\n'
                f"  within {window}\n",
                f"sequence by key with maxspan={window}\n"
                f'  [ev where kind == "order" and amount > {above}]\n'
                f'  ![ev where kind == "payment"]')
    if shape == "join":
        level, above = rng.randint(7, 9), rng.choice([300, 600, 1000])
        return (f"rule r{i} from flags, ev by key pattern f e\n"
                f"  define f as flags where level >= {level},\n"
                f"         e as ev where amount > {above}\n"
                f"  within {window}\n",
                f"sequence by key with maxspan={window}\n"
                f"  [flags where level >= {level}] [ev where amount > {above}]")
    rise = rng.choice([3, 4, 5])
    above = rng.choice([200, 400, 800])
    return (f"rule r{i} from ev by key pattern a b contiguity strict\n"
            f"  define a as amount > {above}, b as price > prev(price) + {rise}\n", None)


def program(n: int, seed: int = 23) -> str:
    rng = random.Random(seed)
    return STREAMS + "\n".join(rule_text(i, rng) for i in range(n))


def flags_frame(events: pd.DataFrame, seed: int = 5) -> pd.DataFrame:
    """One flag per 1,000 events, on a key that has events, levels 0-9."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(events), size=max(1, len(events) // 1000), replace=False)
    rows.sort()
    picked = events.iloc[rows]
    return pd.DataFrame({"stream": "flags", "key": picked["key"].to_numpy(),
                         "level": rng.integers(0, 10, len(rows)),
                         "ts": picked["ts"].to_numpy() - 1})


def mixed(events: pd.DataFrame) -> pd.DataFrame:
    """The ``ev`` events and their flags in one frame, in arrival order."""
    ev = events.assign(stream="ev")
    both = pd.concat([ev, flags_frame(events)], ignore_index=True)
    return both.sort_values("ts", kind="stable").reset_index(drop=True)


@dataclass
class Row:
    rules: int
    events: int
    cpu_s: float
    matches: int
    touched: int
    register_s: float
    register_bytes: int
    partials: int
    partial_bytes: int

    @property
    def rate(self) -> float:
        return self.events / self.cpu_s if self.cpu_s else float("inf")


def _partials(engine: Engine) -> int:
    return sum(
        getattr(st, "partial_count", 0)
        for group in engine._groups.values()  # noqa: SLF001 - a benchmark looks inside
        for state in group.states.values()
        for st in state.rules.values()
    )


def feed(engine: Engine, frame: pd.DataFrame, batch: int) -> tuple[float, int]:
    """Feed ``frame`` in batches: the CPU seconds it took and the matches drained on the way
    (end of input excluded)."""
    matches = 0
    cpu = time.process_time()
    for lo in range(0, len(frame), batch):
        engine.feed_batch(frame.iloc[lo : lo + batch])
        matches += len(engine.drain())
        engine.drain_dead_letters()
    return time.process_time() - cpu, matches


def run(text: str, frame: pd.DataFrame, batch: int, index: str = "starts") -> Row:
    """Time the rules over ``frame`` (no tracing), then measure their memory on a prefix."""
    gc.collect()
    started = time.perf_counter()
    engine = Engine(rule_index=index)
    engine.register(text)
    register_s = time.perf_counter() - started
    cpu_s, matches = feed(engine, frame, batch)
    engine.close()
    matches += len(engine.drain())
    registered, partials, held = _memory(text, frame.iloc[:MEMORY_PREFIX], batch, index)
    return Row(len(engine.rules), len(frame), cpu_s, matches, engine.rules_touched, register_s,
               registered, partials, held)


MEMORY_PREFIX = 50_000
"""Events fed under tracemalloc (which slows Python several times) to measure memory."""


def _memory(text: str, frame: pd.DataFrame, batch: int, index: str) -> tuple[int, int, int]:
    """Bytes held by the registered rules, live partial matches after ``frame``, and the bytes
    the engine's state grew by."""
    gc.collect()
    tracemalloc.start()
    try:
        engine = Engine(rule_index=index)
        engine.register(text)
        registered = tracemalloc.get_traced_memory()[0]
        for lo in range(0, len(frame), batch):
            engine.feed_batch(frame.iloc[lo : lo + batch])
            engine.drain()
            engine.drain_dead_letters()
        gc.collect()
        return registered, _partials(engine), tracemalloc.get_traced_memory()[0] - registered
    finally:
        tracemalloc.stop()


def run_eql(queries: list[str], frame: pd.DataFrame) -> tuple[float, int]:
    """CPU seconds and matches of the queries registered together on one
    ``eql.PythonEngine`` streaming ``frame``'s events (in time order, as it requires)."""
    import eql

    events = []
    for record in frame.sort_values("ts", kind="stable").to_dict("records"):
        data = {k: v for k, v in record.items() if v == v and k != "stream"}
        events.append(eql.Event(record["stream"], int(record["ts"]), data))
    matches = [0]

    def count(_result) -> None:
        matches[0] += 1

    engine = eql.PythonEngine({"time_unit": 1000})  # event times are epoch milliseconds
    engine.add_output_hook(count)
    # Missing events `![...]` are Elasticsearch's syntax, which the package parses on request.
    with eql.parser.ParserConfig(elasticsearch_syntax=True, allow_negation=True):
        for query in queries:
            engine.add_query(eql.parse_query(query))
    cpu = time.process_time()
    engine.stream_events(events)
    return time.process_time() - cpu, matches[0]


def eql_peer(pairs: list[tuple[str, str | None]], frame: pd.DataFrame, counts: list[int],
             batch: int, index: str) -> list[str]:
    """Vigil and the ``eql`` package's engine on the same rules (the mix without its ``prev``
    rules, which EQL cannot say) and events, in the same run: rates and their ratio."""
    lines = ["| rules (without `prev`) | Vigil events/s (CPU) | eql events/s (CPU) | "
             "Vigil / eql | Vigil matches | eql matches |", "|---:|---:|---:|---:|---:|---:|"]
    for n in counts:
        chosen = [(v, q) for v, q in pairs[:n] if q is not None]
        row = run(STREAMS + "\n".join(v for v, _ in chosen), frame, batch, index)
        eql_cpu, eql_matches = run_eql([q for _, q in chosen], frame)
        line = (f"| {len(chosen):,} | {row.rate:,.0f} | {len(frame) / eql_cpu:,.0f} | "
                f"{eql_cpu / row.cpu_s:.1f}x | {row.matches:,} | {eql_matches:,} |")
        print(line, file=sys.stderr, flush=True)
        lines.append(line)
    return lines


def steady_rate(progress: list[dict]) -> str:
    """Events per second of wall time over the micro-batches after the first that read
    events (the first carries the query's start: planning, Python workers, imports), from
    the query's own progress reports; ``-`` with fewer than two such batches."""
    read = [p for p in progress if p.get("eventRows")]
    later = read[1:]
    if not later:
        return "-"
    rows = sum(p["eventRows"] for p in later)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    return f"{rows / seconds:,.0f}" if seconds else "-"


def spark_runs(texts: list[str], frame: pd.DataFrame, counts: list[int], batch: int) -> list[str]:
    """The first N rules through ``run_spark`` on ``local[2]`` (``vigil run``'s path: the rows
    as a JSON-lines file, micro-batches of ``batch`` rows), after a one-rule warm-up query on the
    same session: wall-clock rates (the whole query, and its micro-batches after the first),
    and the matches against the embedded engine's."""
    import json
    import os
    import shutil
    import tempfile

    from spark_udf import read_outputs
    from spark_udf.run import run_spark
    from spark_udf.session import session

    work = tempfile.mkdtemp(prefix="vigil-bench-rules-")
    path = os.path.join(work, "events.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for record in frame.to_dict("records"):
            out.write(json.dumps({k: v for k, v in record.items() if v == v}) + "\n")
    spark = session("local[2]", shuffle_partitions=2, app_name="vigil-bench-rules")
    lines = ["| rules | Spark local[2] events/s (wall) | steady: micro-batches after the "
             "first, events/s | matches | equal to the embedded engine's |",
             "|---:|---:|---:|---:|---|"]
    try:
        for i, n in enumerate([1, *counts]):
            program = os.path.join(work, f"p{i}.vigil")
            text = STREAMS + "\n".join(texts[:n])
            Path(program).write_text(text)
            out_dir = os.path.join(work, f"out-{i}")
            progress: list[dict] = []
            started = time.perf_counter()
            run_spark(program, path, out=out_dir, spark=spark, max_records_per_batch=batch,
                      on_progress=progress.append)
            seconds = time.perf_counter() - started
            got = sorted(m["match_id"] for m in read_outputs(out_dir))
            if i == 0:
                print(f"spark warm-up (1 rule): {seconds:.1f} s", file=sys.stderr)
                continue
            engine = Engine()
            engine.register(text)
            engine.feed_batch(frame)
            engine.close()
            expected = sorted(m["match_id"] for m in engine.drain())
            line = (f"| {n:,} | {len(frame) / seconds:,.0f} | {steady_rate(progress)} | "
                    f"{len(got):,} | {got == expected} |")
            print(line, file=sys.stderr, flush=True)
            lines.append(line)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return lines


def scale(pairs: list[tuple[str, str | None]], n: int, frame: pd.DataFrame, batch: int) -> str:
    """Register ``n`` rules (wall time, bytes held per rule), add one more to the running
    engine, then feed ``frame`` (CPU): rate, rules looked at, rule states kept, peak memory."""
    import resource

    texts = [vigil for vigil, _ in pairs]
    gc.collect()
    started = time.perf_counter()
    engine = Engine()
    engine.register(STREAMS + "\n".join(texts[:n]))
    register_s = time.perf_counter() - started
    started = time.perf_counter()
    engine.register(STREAMS + texts[n])
    one_s = time.perf_counter() - started
    gc.collect()
    tracemalloc.start()
    try:
        other = Engine()
        other.register(STREAMS + "\n".join(texts[:n]))
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del other
    cpu_s, matches = feed(engine, frame, batch)
    per_key = [state.rules for group in engine._groups.values()  # noqa: SLF001
               for state in group.states.values()]
    states = sum(len(rules) for rules in per_key)
    # Idle `prev` rules alike share one state object per key (RuleState.shared).
    objects = sum(len({id(st) for st in rules.values()}) for rules in per_key)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return (f"| {n:,} | {register_s:.1f} | {one_s:.2f} | {held / n:,.0f} | "
            f"{len(frame) / cpu_s:,.0f} | {engine.rules_touched / len(frame):.2f} | "
            f"{matches:,} | {states:,} | {objects:,} | {rss / 1e9:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rules", default="10,100,1000")
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--alone", type=int, default=10,
                        help="rules of the mix run one at a time for the sharing factor")
    parser.add_argument("--index", default="starts", choices=sorted(RULE_INDEXES),
                        help="the engine's rule index (none: every rule offered every event)")
    parser.add_argument("--markdown", help="write the table to this file")
    parser.add_argument("--eql", metavar="N,N",
                        help="only run the eql package's engine and Vigil on the first N rules "
                             "of the mix (without its prev rules), alternately")
    parser.add_argument("--spark", metavar="N,N",
                        help="only run the first N rules on Spark local[2] (wall clock)")
    parser.add_argument("--spark-batch", type=int, default=50_000,
                        help="rows per Spark micro-batch")
    parser.add_argument("--scale", type=int, metavar="N",
                        help="only register N rules (and one more), then feed the events: "
                             "registration time, bytes per rule, rate, states, peak memory")
    args = parser.parse_args(argv)
    frame = mixed(generate(args.events, args.keys))
    print(f"data: {len(frame):,} events ({args.events:,} ev + flags), {args.keys:,} keys",
          file=sys.stderr)
    counts = [int(n) for n in (args.eql or args.spark or args.rules).split(",")]
    rng = random.Random(23)
    pairs = [rule_pair(i, rng) for i in range(max(*counts, (args.scale or 0) + 1))]
    texts = [vigil for vigil, _ in pairs]
    if args.scale:
        print("| rules | register (s) | one more (s) | bytes / rule | events/s (CPU) | "
              "rules looked at / event | matches | rule states | objects holding them | "
              "peak RSS (GB) |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
              + scale(pairs, args.scale, frame, args.batch))
        return 0
    if args.eql or args.spark:
        lines = (eql_peer(pairs, frame, counts, args.batch, args.index) if args.eql
                 else spark_runs(texts, frame, counts, args.spark_batch))
        print("\n".join(lines))
        return 0
    alone_rows = [run(STREAMS + texts[i], frame, args.batch, args.index)
                  for i in range(min(args.alone, len(texts)))]
    alone_cpu = sum(r.cpu_s for r in alone_rows) / len(alone_rows)
    print(f"one rule alone: {len(frame) / alone_cpu:,.0f} events/s (mean of {len(alone_rows)})",
          file=sys.stderr)
    lines = [
        "| rules | events/s (CPU) | matches / 1,000 events | rules looked at / event | "
        "register (s) | bytes / rule | live partials | bytes / partial | sharing factor |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in (int(x) for x in args.rules.split(",")):
        row = run(STREAMS + "\n".join(texts[:n]), frame, args.batch, args.index)
        sharing = alone_cpu * n / row.cpu_s
        per_partial = row.partial_bytes / row.partials if row.partials else float("nan")
        line = (f"| {n:,} | {row.rate:,.0f} | {1000 * row.matches / len(frame):.2f} | "
                f"{row.touched / len(frame):.2f} | {row.register_s:.2f} | "
                f"{row.register_bytes / n:,.0f} | {row.partials:,} | "
                f"{per_partial:,.0f} | {sharing:.1f} |")
        print(line, file=sys.stderr, flush=True)
        lines.append(line)
    table = "\n".join(lines) + "\n"
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
