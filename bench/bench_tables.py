"""What a table lookup costs a rule: a table of ``--keys`` cards fed by ``--changes`` changelog
rows, and ``--events`` transactions of the same cards, each tested against its card's home
country as of the transaction's time (``lookup``, docs/language.md)::

    .venv/bin/python bench/bench_tables.py [--keys 1000000] [--changes 1000000]
        [--events 1000000] [--batch 100000] [--rounds 2] [--check]

The changes and the transactions are spread over one hour, interleaved in time order, and fed
together (one frame of both streams per ``feed_batch`` call, arrival order = time order, so no
row is late). Each round runs, on the same rows, alternately:

* **A, with the lookup**: the table declared, and
  ``define a as amount > 900 and country != lookup(cards, card_id).home_country``;
* **B, without**: no table (the changes are rows of a stream nothing reads), and
  ``define a as amount > 900 and country != "ZZ"``;
* **C, table only** (decomposition, once): the table declared and fed, B's rule;
* **D, a lookup per transaction** (once): the table declared and fed, and
  ``define a as lookup(cards, card_id).home_country == "ZZ"`` (never true). In A the columnar
  prefilter (the conjunct ``amount > 900``) lets only ~0.3 % of transactions reach the lookup;
  D has no current-event conjunct, so every transaction becomes an event and reads the table.

Times are process CPU time (``time.process_time``) of the feeding and ``close``; rates are
transactions per CPU second (and all rows per CPU second). The issue's goal, "the lookup costs
less than a third of the rule's own throughput", holds when A's rate ≥ 2/3 of B's. State bytes
per table row: ``len(VersionedTable.to_bytes()) / keys`` after the last change (before
``close``, not timed), and an in-memory estimate from ``sys.getsizeof`` over a sample of keys.

``--metrics`` runs, alternately, a metric reading the table (**M**: transactions abroad per
purchase country and minute, ``where country != lookup(cards, card_id).home_country``, each
transaction held until the watermark passes it and evaluated row by row) against the same
metric without the lookup (**N**: ``where country != "ZZ"``, column-wise), both with the table
fed, and prints M's share of N's rate.

``--check`` compares A's matches with a brute-force as-of join (best on small sizes).

``--spark N`` also runs A and B on Spark (``local[2]``, ``vigil run``'s path: the rows as a
JSON-lines file, micro-batches of ``--spark-batch`` rows) over the first ``N`` rows, alternately,
then C (unless ``--no-split``), timing each query's wall clock; A's matches must equal the
embedded engine's on those rows.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cep.engine import Engine  # noqa: E402

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, epoch seconds
SPAN_S = 3_600
COUNTRIES = np.asarray(["FR", "DE", "ES", "IT", "GB", "US", "NL", "BE"], dtype=object)
DELETE_SHARE = 0.01

STREAMS = """
stream card_changes (card_id string, home_country string, op string, ts timestamp)
  time ts lateness 10s
stream txn (card_id string, country string, amount float, ts timestamp) time ts lateness 10s
"""
TABLE = "table cards from card_changes key card_id op op\n"
RULE_LOOKUP = """
rule abroad from txn by card_id
  pattern a
  define a as amount > 900 and country != lookup(cards, card_id).home_country
  emit card_id, lookup(cards, card_id).home_country as home
"""
RULE_PLAIN = """
rule abroad from txn by card_id
  pattern a
  define a as amount > 900 and country != "ZZ"
  emit card_id
"""
RULE_DENSE = """
rule abroad from txn by card_id
  pattern a
  define a as lookup(cards, card_id).home_country == "ZZ"
"""
RULE_UNREACHED = """
rule abroad from txn by card_id
  pattern a
  define a as amount > 1000000000 and country != lookup(cards, card_id).home_country
  emit card_id, lookup(cards, card_id).home_country as home
"""
METRIC_LOOKUP = """
metric abroad from txn by country window tumbling 1m
  where country != lookup(cards, card_id).home_country
  select count() as n, sum(amount) as total
"""
METRIC_PLAIN = """
metric abroad from txn by country window tumbling 1m
  where country != "ZZ"
  select count() as n, sum(amount) as total
"""
VARIANTS = {
    "A": ("with lookup", STREAMS + TABLE + RULE_LOOKUP),
    "B": ("without lookup, no table", STREAMS + RULE_PLAIN),
    "C": ("table fed, rule without lookup", STREAMS + TABLE + RULE_PLAIN),
    "D": ("every transaction looks up", STREAMS + TABLE + RULE_DENSE),
    "E": ("table fed and kept, no transaction reaches the lookup",
          STREAMS + TABLE + RULE_UNREACHED),
    "M": ("metric reading the table", STREAMS + TABLE + METRIC_LOOKUP),
    "N": ("the same metric without lookup, table fed", STREAMS + TABLE + METRIC_PLAIN),
}


# ---------------------------------------------------------------------- data


def make_rows(keys: int, changes: int, events: int, seed: int = 20261127) -> pd.DataFrame:
    """Changes and transactions in time order (ties in random order), one frame.

    The first ``keys`` changes cover every card once (when ``changes >= keys``), the rest hit
    cards uniformly; 1 % of changes are deletes. Transactions hit cards uniformly; ``amount``
    is log-normal (about 0.3 % above 900), ``country`` uniform over 8 countries.
    """
    rng = np.random.default_rng(seed)
    names = np.asarray([f"card-{i:07d}" for i in range(keys)], dtype=object)
    if changes >= keys:
        change_cards = np.concatenate(
            [rng.permutation(keys), rng.integers(0, keys, changes - keys)]
        )
    else:
        change_cards = rng.choice(keys, changes, replace=False)
    change_ts = T0 + rng.integers(0, SPAN_S, changes)
    deletes = rng.random(changes) < DELETE_SHARE
    home = COUNTRIES[rng.integers(0, len(COUNTRIES), changes)]
    home[deletes] = None
    op = np.where(deletes, "d", np.where(rng.random(changes) < 0.5, "c", "u")).astype(object)

    txn_cards = rng.integers(0, keys, events)
    txn_ts = T0 + rng.integers(0, SPAN_S, events)
    amount = np.round(rng.lognormal(3.5, 1.2, events), 2)
    country = COUNTRIES[rng.integers(0, len(COUNTRIES), events)]

    n = changes + events
    is_change = np.zeros(n, dtype=bool)
    is_change[:changes] = True
    ts = np.concatenate([change_ts, txn_ts])
    order = np.lexsort((rng.random(n), ts))

    def both(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return np.concatenate([first, second])[order]

    none_c = np.full(changes, None, dtype=object)
    none_e = np.full(events, None, dtype=object)
    frame = pd.DataFrame({
        "stream": np.where(is_change, "card_changes", "txn").astype(object)[order],
        "card_id": names[np.concatenate([change_cards, txn_cards])][order],
        "home_country": both(home, none_e),
        "op": both(op, none_e),
        "country": both(none_c, country),
        "amount": both(np.full(changes, np.nan), amount),
        "ts": ts[order],
    })
    return frame


def batches(frame: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    return [frame.iloc[lo : lo + size] for lo in range(0, len(frame), size)]


# ---------------------------------------------------------------------- runs


@dataclass
class Run:
    variant: str
    order: int
    cpu_seconds: float
    rows: int
    events: int
    matches: list[dict]
    dead_letters: int
    table_keys: int | None = None
    table_versions: int | None = None
    state_bytes: int | None = None
    memory_per_key: float | None = None
    load: float = 0.0

    @property
    def event_rate(self) -> float:
        return self.events / self.cpu_seconds

    @property
    def row_rate(self) -> float:
        return self.rows / self.cpu_seconds


def memory_per_key(table, sample: int = 10_000, seed: int = 1) -> float:
    """Estimated bytes per key of a :class:`cep.tables.VersionedTable` in memory: the key
    dict's own size per key, plus ``sys.getsizeof`` of each sampled key's tuple, versions
    (tuples, list) and row values; an object met twice in the sample (a shared country string)
    counts once."""
    rows = table._rows
    if not rows:
        return 0.0
    keys = list(rows)
    picked = random.Random(seed).sample(keys, min(sample, len(keys)))
    seen: set[int] = set()

    def size(obj) -> int:
        if id(obj) in seen or obj is None:
            return 0
        seen.add(id(obj))
        total = sys.getsizeof(obj)
        if isinstance(obj, tuple | list):
            total += sum(size(x) for x in obj)
        return total

    deep = sum(size(k) + size(rows[k]) for k in picked)
    return sys.getsizeof(rows) / len(rows) + deep / len(picked)


def run(variant: str, parts: list[pd.DataFrame], events: int, order: int, state: bool) -> Run:
    engine = Engine()
    engine.register(VARIANTS[variant][1])
    rows = sum(len(p) for p in parts)
    started = time.process_time()
    for part in parts:
        engine.feed_batch(part)
    fed = time.process_time() - started
    out = Run(variant, order, 0.0, rows, events, [], 0)
    if state and "cards" in engine._tables:
        table = engine._tables._feeds["cards"].table
        out.table_keys, out.table_versions = table.size()
        out.state_bytes = len(table.to_bytes())
        out.memory_per_key = memory_per_key(table)
    started = time.process_time()
    engine.close()
    out.cpu_seconds = fed + time.process_time() - started
    out.matches = [m for m in engine.drain() if m["kind"] in ("rule", "metric")]
    out.dead_letters = len(engine.drain_dead_letters())
    out.load = os.getloadavg()[0]
    return out


# ---------------------------------------------------------------------- check


def expected_matches(frame: pd.DataFrame) -> dict[int, str]:
    """Brute force: for each transaction, its card's newest change at or before its time (ties:
    the later row), a match when ``amount > 900`` and the home country is known and differs."""
    history: dict[str, list[tuple[int, int, str | None]]] = {}
    records = frame.to_dict("records")
    for pos, r in enumerate(records):
        if r["stream"] == "card_changes":
            row = None if r["op"] == "d" else r["home_country"]
            history.setdefault(r["card_id"], []).append((int(r["ts"]), pos, row))
    for versions in history.values():
        versions.sort()
    out = {}
    for pos, r in enumerate(records):
        if r["stream"] != "txn" or not r["amount"] > 900:
            continue
        versions = history.get(r["card_id"], [])
        i = bisect.bisect_right(versions, (int(r["ts"]), float("inf"))) - 1
        home = versions[i][2] if i >= 0 else None
        if home is not None and home != r["country"]:
            out[pos] = home
    return out


def check(frame: pd.DataFrame, result: Run) -> bool:
    want = expected_matches(frame)
    got = {m["events"]["a"][0]: m["values"].get("home") for m in result.matches}
    ok = got == want
    print(f"check: {len(got):,} matches, brute force {len(want):,}: "
          f"{'equal' if ok else 'DIFFERENT'}", file=sys.stderr)
    if not ok:
        for pos in sorted(set(got) ^ set(want) | {p for p in got if got[p] != want.get(p)})[:10]:
            print(f"  row {pos}: engine {got.get(pos)!r}, brute force {want.get(pos)!r}: "
                  f"{frame.iloc[pos].to_dict()}", file=sys.stderr)
    return ok


# ---------------------------------------------------------------------- Spark


def spark_runs(frame: pd.DataFrame, rows: int, batch: int, rounds: int,
               split: bool = False) -> None:
    """A and B on Spark (local[2]) over the first ``rows`` rows, alternately (then E with
    ``split``: on Spark a table lives in the state of the rules that read it, so C keeps no
    table; E keeps and feeds it but never reaches the lookup): wall-clock rates and their
    ratios, and A's matches against the embedded engine's on the same rows."""
    from spark_udf import read_outputs
    from spark_udf.run import run_spark
    from spark_udf.session import session

    part = frame.iloc[:rows]
    events = int((part["stream"] == "txn").sum())
    work = tempfile.mkdtemp(prefix="vigil-bench-tables-")
    path = os.path.join(work, "events.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for record in part.to_dict("records"):
            out.write(json.dumps({k: v for k, v in record.items() if v == v}) + "\n")
    embedded = Engine()
    embedded.register(VARIANTS["A"][1])
    embedded.feed_batch(part)
    embedded.close()
    expected = sorted(m["match_id"] for m in embedded.drain())
    spark = session("local[2]", shuffle_partitions=2, app_name="vigil-bench-tables")
    rates: dict[str, list[float]] = {"A": [], "B": [], "E": []}
    try:
        # Untimed: the session's first query starts the JVM's code paths and the Python
        # workers (~40 s at this size), which would otherwise be charged to A alone.
        warm = os.path.join(work, "warm.jsonl")
        with open(path, encoding="utf-8") as source, open(warm, "w", encoding="utf-8") as out:
            out.writelines(itertools.islice(source, 100_000))
        program = os.path.join(work, "warm.vigil")
        Path(program).write_text(VARIANTS["A"][1])
        started = time.perf_counter()
        run_spark(program, warm, out=os.path.join(work, "out-warm"), spark=spark,
                  max_records_per_batch=batch)
        print(f"spark warm-up (A over the first {min(rows, 100_000):,} rows, untimed): "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
        for i, variant in enumerate(["A", "B"] * rounds + (["E"] if split else [])):
            program = os.path.join(work, f"{variant}.vigil")
            Path(program).write_text(VARIANTS[variant][1])
            out_dir = os.path.join(work, f"out-{i}")
            started = time.perf_counter()
            run_spark(program, path, out=out_dir, spark=spark, max_records_per_batch=batch)
            seconds = time.perf_counter() - started
            rates[variant].append(events / seconds)
            got = read_outputs(out_dir)
            same = "" if variant != "A" else (
                f", matches equal to the embedded engine's: "
                f"{sorted(m['match_id'] for m in got) == expected}")
            print(f"spark {variant}: {seconds:.1f} s wall, {events / seconds:,.0f} "
                  f"transactions/s, {len(got)} matches{same}", file=sys.stderr)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    a, b = (sum(v) / len(v) for v in (rates["A"], rates["B"]))
    print(f"Spark local[2], {rows:,} rows ({events:,} transactions), micro-batches of "
          f"{batch:,}: A {a:,.0f} transactions/s, B {b:,.0f}; A keeps {a / b:.1%} of B's rate")
    if rates["E"]:
        e = sum(rates["E"]) / len(rates["E"])
        print(f"E (table fed and kept, no lookup reached) {e:,.0f} transactions/s: A keeps "
              f"{a / e:.1%} of E's rate (the lookup), E {e / b:.1%} of B's (feeding the table)")


# ---------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000, help="rows per feed_batch call")
    parser.add_argument("--rounds", type=int, default=2, help="A, B pairs, run alternately")
    parser.add_argument("--no-split", action="store_true", help="skip runs C and D")
    parser.add_argument("--check", action="store_true", help="compare A's matches (brute force)")
    parser.add_argument("--metrics", action="store_true",
                        help="run M and N (a metric with and without the lookup) instead")
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--spark", type=int, default=0, metavar="N",
                        help="also run A and B on Spark local[2] over the first N rows")
    parser.add_argument("--spark-batch", type=int, default=100_000)
    parser.add_argument("--spark-only", action="store_true", help="skip the embedded runs")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    frame = make_rows(args.keys, args.changes, args.events, args.seed)
    parts = batches(frame, args.batch)
    print(f"data: {args.changes:,} changes over {args.keys:,} cards, {args.events:,} "
          f"transactions, {len(parts)} batches of {args.batch:,} rows "
          f"({time.perf_counter() - started:.1f}s)", file=sys.stderr)

    if args.spark:
        spark_runs(frame, args.spark, args.spark_batch, args.rounds, split=not args.no_split)
        if args.spark_only:
            return 0
    if args.metrics:
        return metric_runs(parts, args.events, args.rounds)
    schedule = ["A", "B"] * args.rounds + ([] if args.no_split else ["C", "D"])
    runs: list[Run] = []
    for i, variant in enumerate(schedule):
        result = run(variant, parts, args.events, i + 1, state=(variant == "A" and i == 0))
        runs.append(result)
        print(f"run {i + 1} {variant} ({VARIANTS[variant][0]}): {result.cpu_seconds:.2f} s CPU, "
              f"{result.event_rate:,.0f} transactions/s, {result.row_rate:,.0f} rows/s, "
              f"{len(result.matches):,} matches, {result.dead_letters} dead letters "
              f"(load {result.load:.1f})", file=sys.stderr)
    ok = check(frame, runs[0]) if args.check else None

    a = [r for r in runs if r.variant == "A"]
    b = [r for r in runs if r.variant == "B"]
    c = [r for r in runs if r.variant == "C"]
    d = [r for r in runs if r.variant == "D"]
    cpu_a = sum(r.cpu_seconds for r in a)
    cpu_b = sum(r.cpu_seconds for r in b)
    rate_a, rate_b = args.events * len(a) / cpu_a, args.events * len(b) / cpu_b
    first = a[0]
    print()
    print(f"{args.keys:,} cards, {args.changes:,} changes, {args.events:,} transactions, "
          f"batches of {args.batch:,} rows (Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} cores; load at the end "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())})")
    print()
    print("| run | variant | CPU s | transactions/s | all rows/s | matches | load |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r.order} | {r.variant}: {VARIANTS[r.variant][0]} | {r.cpu_seconds:.2f} | "
              f"{r.event_rate:,.0f} | {r.row_rate:,.0f} | {len(r.matches):,} | {r.load:.1f} |")
    print()
    print(f"A (with lookup), all runs: {rate_a:,.0f} transactions/s "
          f"({args.events * len(a):,} in {cpu_a:.2f} s CPU)")
    print(f"B (without), all runs: {rate_b:,.0f} transactions/s "
          f"({args.events * len(b):,} in {cpu_b:.2f} s CPU)")
    print(f"B / A: {rate_b / rate_a:.2f}x; A keeps {rate_a / rate_b:.1%} of B's rate "
          f"(the table and its lookups cost {1 - rate_a / rate_b:.1%})")
    holds = rate_a >= 2 / 3 * rate_b
    print(f"goal (A >= 2/3 x B): {rate_a:,.0f} {'>=' if holds else '<'} "
          f"2/3 x {rate_b:,.0f} = {2 / 3 * rate_b:,.0f}: {'holds' if holds else 'does not hold'}")
    if c:
        cpu_c = sum(r.cpu_seconds for r in c) / len(c)
        per_a, per_b = cpu_a / len(a), cpu_b / len(b)
        print(f"split of A - B ({per_a - per_b:.2f} s CPU per run): feeding the table "
              f"(C - B) {cpu_c - per_b:.2f} s, the rule reading it (A - C) {per_a - cpu_c:.2f} s")
    if c and d:
        cpu_d = sum(r.cpu_seconds for r in d) / len(d)
        print(f"every transaction evaluated row-wise with its lookup (D - C): "
              f"{cpu_d - cpu_c:.2f} s CPU = "
              f"{(cpu_d - cpu_c) / args.events * 1e6:.2f} µs per transaction; D: "
              f"{args.events / cpu_d:,.0f} transactions/s = {args.events / cpu_d / rate_b:.1%} "
              f"of B's rate")
    if first.table_keys:
        print(f"table after the last change: {first.table_keys:,} keys, "
              f"{first.table_versions:,} versions; state {first.state_bytes:,} bytes = "
              f"{first.state_bytes / first.table_keys:.1f} bytes per key (to_bytes, JSON); "
              f"in memory ~{first.memory_per_key:.0f} bytes per key (sys.getsizeof, "
              f"{min(10_000, first.table_keys):,} sampled keys + the dict)")
    same = len({len(r.matches) for r in a}) == 1
    print(f"matches: A {len(a[0].matches):,} (same in every run: {same}), "
          f"B {len(b[0].matches):,}" + ("" if ok is None else f"; brute-force check: "
                                        f"{'equal' if ok else 'DIFFERENT'}"))
    return 0 if ok is not False else 1


def metric_runs(parts: list[pd.DataFrame], events: int, rounds: int) -> int:
    """M and N alternately, ``rounds`` times each; their window rows must be the same size."""
    runs = []
    for i, variant in enumerate(["M", "N"] * rounds):
        result = run(variant, parts, events, i + 1, state=False)
        runs.append(result)
        print(f"run {i + 1} {variant} ({VARIANTS[variant][0]}): {result.cpu_seconds:.2f} s CPU, "
              f"{result.event_rate:,.0f} transactions/s, {len(result.matches):,} window rows "
              f"(load {result.load:.1f})", file=sys.stderr)
    m = [r for r in runs if r.variant == "M"]
    n = [r for r in runs if r.variant == "N"]
    rate_m = events * len(m) / sum(r.cpu_seconds for r in m)
    rate_n = events * len(n) / sum(r.cpu_seconds for r in n)
    print()
    print("| run | variant | CPU s | transactions/s | window rows | load |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r.order} | {r.variant}: {VARIANTS[r.variant][0]} | {r.cpu_seconds:.2f} | "
              f"{r.event_rate:,.0f} | {len(r.matches):,} | {r.load:.1f} |")
    print()
    print(f"M (metric reading the table): {rate_m:,.0f} transactions/s; N (without): "
          f"{rate_n:,.0f}; M keeps {rate_m / rate_n:.1%} of N's rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
