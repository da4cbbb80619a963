"""Benchmark of the embedded CEP engine on four workloads, with peers run in their own venvs.

Generates a deterministic event file (default 1,000,000 events over 10,000 keys), runs each
workload through ``cep.Engine.feed_batch`` and reports events/s; in the same run, the Python
``eql`` engine runs the W1 sequence and PyFlink ``MATCH_RECOGNIZE`` runs W2, each as a
subprocess of its own virtualenv reading the same file::

    python3 -m venv .venv-eql && .venv-eql/bin/pip install eql
    python3 -m venv .venv-flink && .venv-flink/bin/pip install apache-flink==2.3.0
    .venv/bin/python bench/bench_cep.py [--events N] [--keys K] [--markdown bench/results/cep.md]

Workloads: W1 card testing (relaxed, selective conditions), W2 V-shape (strict, ``prev``),
W3 unpaid order (trailing absence), W4 a three-step ``contiguity any`` pattern in a short window.

``--caps 1000,2000,5000`` adds the worst case of the ``max_partials`` cap (issue #19): ``a b+ c``
with ``contiguity any`` on one key whose events are almost all ``b``, so every event extends every
kept partial match; it is timed on the key's runtime once the cap is reached, against
``partials latest`` and ``relaxed`` on the same events (``--workloads ''`` runs it alone;
``--cap-runs 3`` keeps the best of three runs of each, for a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cep.engine.engine import Engine  # noqa: E402
from cep.events.event import Event  # noqa: E402
from cep.nfa.compiler import compile_rule  # noqa: E402
from cep.nfa.runtime import RuleState, new_state, process_event  # noqa: E402
from query_lang import parse  # noqa: E402

STREAM = """
stream ev (id int, key string, kind string, amount float, merchant string, price float,
           ts timestamp)
  time ts unit ms lateness 5s id id
"""

WORKLOADS = {
    "W1": """
rule w1_card_testing "probes, then a large purchase at another merchant"
  from ev by key
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
  emit key, count(probe) as probes, big.amount as amount
""",
    "W2": """
rule w2_v_shape "price falls, then rises (strict, prev)"
  from ev by key
  pattern start down+ up+
  contiguity strict
  define down as price < prev(price),
         up   as price > prev(price)
  emit key, last(down).price as bottom, last(up).price as top
""",
    "W3": """
rule w3_unpaid "an order without a payment within 15 minutes"
  from ev by key
  pattern placed !paid
  define placed as kind == "order",
         paid   as kind == "payment"
  within 15m
""",
    "W4": """
rule w4_any "login, reset, logout in any combination within a minute"
  from ev by key
  pattern a b c
  contiguity any
  define a as kind == "login",
         b as kind == "reset",
         c as kind == "logout"
  within 1m
""",
}

DESCRIPTIONS = {
    "W1": "card testing: `probe{3,} big` relaxed, within 10m",
    "W2": "V-shape: `start down+ up+` strict, prev()",
    "W3": "unpaid order: `placed !paid` within 15m (trailing absence)",
    "W4": "`a b c` contiguity any, within 1m",
}

CAP_RULE = """
rule c1_any_at_cap "login, then resets, then logout: every reset extends every partial match"
  from ev by key
  pattern a b+ c
  contiguity {contiguity}
  partials {partials}
  define a as kind == "login",
         b as kind == "reset",
         c as kind == "logout"
"""

#: The cap case and its two references on the same events: (label, contiguity, partials).
CAP_VARIANTS = (
    ("any, partials all", "any", "all"),
    ("any, partials latest", "any", "latest"),
    ("relaxed, partials all", "relaxed", "all"),
)

KINDS = ["browse", "order", "payment", "login", "reset", "logout"]
KIND_P = [0.885, 0.03, 0.025, 0.025, 0.02, 0.015]


# ---------------------------------------------------------------------- data


def generate(n: int, keys: int, seed: int = 20261121) -> pd.DataFrame:
    """Deterministic events: ~10 ms apart, 5% out of order by up to 2 s (within lateness),
    a per-key random-walk price, rare probes and large amounts plus injected card-testing
    bursts."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(10.0, n)
    ts = (1_767_225_600_000 + np.cumsum(gaps)).astype(np.int64)
    disorder = rng.random(n) < 0.05
    ts[disorder] -= rng.integers(0, 2000, disorder.sum())
    key_ids = rng.integers(0, keys, n)
    kind = np.asarray(KINDS, dtype=object)[rng.choice(len(KINDS), n, p=KIND_P)]
    amount = np.round(rng.lognormal(3.5, 1.2, n), 2)
    merchant_ids = rng.integers(0, 50, n)
    steps = rng.choice([-1.0, 0.0, 1.0], n, p=[0.45, 0.1, 0.45])
    bursts = max(1, n // 2000)
    for _ in range(bursts):
        size = int(rng.integers(3, 7))
        start = int(rng.integers(0, max(1, n - 60 * (size + 1))))
        rows = start + np.arange(size + 1) * int(rng.integers(5, 60))
        rows = rows[rows < n]
        key_ids[rows] = rng.integers(0, keys)
        amount[rows[:-1]] = np.round(rng.uniform(0.05, 0.99, len(rows) - 1), 2)
        merchant_ids[rows[:-1]] = 50  # the probing merchant
        amount[rows[-1]] = np.round(rng.uniform(600, 3000), 2)
    price = 100.0 + pd.Series(steps).groupby(key_ids).cumsum().to_numpy()
    names = np.asarray([f"k{i:05d}" for i in range(keys)], dtype=object)
    merchants = np.asarray([f"m{i:02d}" for i in range(51)], dtype=object)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "key": names[key_ids],
            "kind": kind,
            "amount": amount,
            "merchant": merchants[merchant_ids],
            "price": price,
            "ts": ts,
        }
    )


# ---------------------------------------------------------------------- our engine


class _Rates:
    """Events per second of a timed run, by the wall clock and by CPU time."""

    events: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else float("inf")

    @property
    def cpu_rate(self) -> float:
        return self.events / self.cpu_seconds if self.cpu_seconds else float("inf")


@dataclass
class Result(_Rates):
    workload: str
    events: int
    seconds: float
    cpu_seconds: float
    matches: int
    late: int


def run_engine(workload: str, frame: pd.DataFrame, batch_rows: int) -> Result:
    engine = Engine()
    engine.register(STREAM + WORKLOADS[workload])
    matches = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    for lo in range(0, len(frame), batch_rows):
        engine.feed_batch(frame.iloc[lo : lo + batch_rows])
        matches += len(engine.drain())
    engine.close()
    matches += len(engine.drain())
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    return Result(workload, len(frame), seconds, cpu_seconds, matches, engine.stats.late)


# ---------------------------------------------------------------------- the cap's worst case


@dataclass
class CapResult(_Rates):
    label: str
    cap: int
    warm: int
    events: int
    seconds: float
    cpu_seconds: float
    kept: int
    dropped: int
    state_bytes: int
    matches: int
    segments: int


def cap_events(n: int) -> list[Event]:
    """One key: a login, then resets with a login every 100 events, and no logout."""
    return [
        Event(i, "ev", i, i, {"id": i, "key": "k0", "kind": "reset" if i % 100 else "login"})
        for i in range(n)
    ]


def run_cap(
    label: str, contiguity: str, partials: str, cap: int, timed: int, warm: int | None
) -> CapResult:
    """Feed one key's runtime ``warm`` events, then time the next ``timed``.

    ``warm=None`` warms up until the cap has dropped a partial match, so every timed event
    runs at the cap.
    """
    stream, decl = parse(
        STREAM + CAP_RULE.format(contiguity=contiguity, partials=partials)
    ).declarations
    rule = compile_rule(decl, streams={stream.name: stream}, max_partials=cap)
    state = new_state(rule)
    events = cap_events((warm if warm is not None else 4 * cap.bit_length()) + timed)
    matches = i = 0
    while state.dropped_partials == 0 if warm is None else i < warm:
        matches += len(process_event(rule, state, events[i]))
        i += 1
    started, cpu_started = time.perf_counter(), time.process_time()
    for event in events[i : i + timed]:
        matches += len(process_event(rule, state, event))
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    return CapResult(
        label, cap, i, timed, seconds, cpu_seconds, state.partial_count,
        state.dropped_partials, len(state.to_bytes()), matches,
        sum(len(cohort.ends) for cohort in state.cohorts),
    )


def run_caps(caps: list[int], timed: int, runs: int = 1) -> list[CapResult]:
    """Each cap's rule and its references, the best (CPU) of ``runs`` runs of each."""
    out = []
    for cap in caps:
        warm = None
        for label, contiguity, partials in CAP_VARIANTS:
            tries = []
            for _ in range(runs):
                tries.append(run_cap(label, contiguity, partials, cap, timed, warm))
                warm = tries[-1].warm
            result = max(tries, key=lambda r: r.cpu_rate)
            out.append(result)
            print(
                f"cap {cap:,} {label}: {result.cpu_rate:,.0f} events/s CPU after {warm} "
                f"warm-up events, {result.kept:,} kept, {result.dropped:,} dropped "
                f"(best of {runs}: {', '.join(f'{r.cpu_rate:,.0f}' for r in tries)}; "
                f"load {os.getloadavg()[0]:.1f})",
                file=sys.stderr,
            )
    return out


FOOTPRINT_RULE = """
rule c2_footprint "login, reset, logout in any combination"
  from ev by key
  pattern a b c
  contiguity any
  define a as kind == "login",
         b as kind == "reset",
         c as kind == "logout"
"""


def cap_footprint(cap: int, repeats: int = 5) -> dict[str, float]:
    """What ``cap`` partial matches of ``a b c`` (``contiguity any``, one key) cost: memory per
    partial match (tracemalloc), state bytes, one ``b`` extending them all (then the cap drops
    as many), and decoding the state (docs/semantics.md, section 4)."""
    stream, decl = parse(STREAM + FOOTPRINT_RULE).declarations
    rule = compile_rule(decl, streams={stream.name: stream}, max_partials=cap)
    logins = [
        Event(i, "ev", i, i, {"id": i, "key": "k0", "kind": "login"}) for i in range(cap)
    ]
    reset = Event(cap, "ev", cap, cap, {"id": cap, "key": "k0", "kind": "reset"})
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    state = new_state(rule)
    for event in logins:
        process_event(rule, state, event)
    memory = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    data = state.to_bytes()
    event_s, decode_s = [], []
    for _ in range(repeats):
        started = time.process_time()
        fresh = RuleState.from_bytes(data, rule)
        decode_s.append(time.process_time() - started)
        started = time.process_time()
        process_event(rule, fresh, reset)
        event_s.append(time.process_time() - started)
    return {
        "cap": cap, "bytes_per_partial": memory / cap, "memory_mb": memory / 1e6,
        "state_kb": len(data) / 1e3, "event_ms": statistics.median(event_s) * 1e3,
        "decode_ms": statistics.median(decode_s) * 1e3,
    }


def footprint_report(caps: list[int]) -> list[str]:
    lines = [
        "",
        "What the cap keeps: `a b c`, `contiguity any`, one key, `cap` logins (one partial "
        "match each), then one reset that extends them all (CPU time, median of 5).",
        "",
        "| partial matches | memory | bytes each | state bytes (compressed) | one event "
        "| decode the state |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for cap in caps:
        f = cap_footprint(cap)
        lines.append(
            f"| {cap:,} | {f['memory_mb']:.2f} MB | {f['bytes_per_partial']:.0f} | "
            f"{f['state_kb']:.0f} KB | {f['event_ms']:.2f} ms | {f['decode_ms']:.1f} ms |"
        )
    return lines


def cap_report(results: list[CapResult]) -> list[str]:
    lines = [
        "",
        "Worst case of the partials cap (issue #19): `a b+ c` on one key, a login then resets "
        "(a login every 100 events, no logout); timed once the `contiguity any` rule has "
        "reached its cap, the references on the same events (load average "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the end). Segments: the "
        "partial matches' segments at the end (`cep.nfa.state._Cohort`); a step costs a "
        "binding link per segment of `SHARED_TAIL_AT` partial matches or more and one per "
        "partial match of the smaller ones.",
        "",
        "| rule | cap | events timed | events/s (CPU) | µs per event | µs per kept partial "
        "| kept | segments | dropped | state bytes | `any, all` / this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    capped: dict[int, CapResult] = {}  # per cap, the `any, partials all` run (listed first)
    for r in results:
        base = capped.setdefault(r.cap, r)
        per_event = 1e6 / r.cpu_rate
        lines.append(
            f"| {r.label} | {r.cap:,} | {r.events:,} | {r.cpu_rate:,.0f} | {per_event:,.1f} | "
            f"{per_event / max(r.kept, 1):.2f} | {r.kept:,} | {r.segments:,} | {r.dropped:,} | "
            f"{r.state_bytes:,} | {base.cpu_rate / r.cpu_rate:.3f}x |"
        )
    return lines


# ---------------------------------------------------------------------- peers


def run_peer(venv: str, script: str, args: list[str], timeout: float) -> dict | None:
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        print(f"  {venv} not found: skipping (see the module docstring)", file=sys.stderr)
        return None
    cmd = [str(python), str(ROOT / "bench" / "peers" / script), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "VIRTUAL_ENV"))}
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {script} timed out after {timeout:.0f}s", file=sys.stderr)
        return {"timeout": timeout}
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"  {script} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = wall
    return result


# ---------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100_000, help="rows per feed_batch call")
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--data", default=str(ROOT / "out" / "bench_cep"), help="data directory")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument(
        "--reuse-peers", action="store_true", help="reuse the peers' results of an earlier run"
    )
    parser.add_argument("--peer-timeout", type=float, default=1800.0)
    parser.add_argument("--markdown", help="write the results table to this file")
    parser.add_argument(
        "--caps", default="", help="max_partials values for the cap's worst case (issue #19)"
    )
    parser.add_argument(
        "--cap-events", type=int, default=300, help="events timed at the cap, per rule and cap"
    )
    parser.add_argument(
        "--cap-runs", type=int, default=1, help="runs per rule and cap; the best one is reported"
    )
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    caps = [int(c) for c in args.caps.split(",") if c]
    if not workloads:
        table = "\n".join(
            cap_report(run_caps(caps, args.cap_events, args.cap_runs)) + footprint_report(caps)
        ) + "\n"
        print(table)
        if args.markdown:
            Path(args.markdown).write_text(table)
        return 0

    data_dir = Path(args.data)
    data_dir.mkdir(parents=True, exist_ok=True)
    csv_path = data_dir / f"events_{args.events}_{args.keys}.csv"
    started = time.perf_counter()
    frame = generate(args.events, args.keys)
    if not csv_path.exists():
        frame.to_csv(csv_path, index=False)
    print(
        f"data: {len(frame):,} events, {args.keys:,} keys, {csv_path} "
        f"({time.perf_counter() - started:.1f}s)",
        file=sys.stderr,
    )
    # The engine is measured on data already in memory, like the peers' processing time;
    # reading the CSV is reported separately.
    load_started = time.perf_counter()
    frame = pd.read_csv(csv_path, engine="pyarrow")
    load_seconds = time.perf_counter() - load_started

    results: dict[str, Result] = {}
    for workload in workloads:
        result = run_engine(workload, frame, args.batch)
        results[workload] = result
        print(
            f"{workload}: {result.rate:,.0f} events/s ({result.seconds:.2f}s, "
            f"CPU {result.cpu_rate:,.0f}/s), "
            f"{result.matches:,} matches, {result.late} late",
            file=sys.stderr,
        )

    peers: dict[str, dict | None] = {}
    cache = data_dir / f"peers_{args.events}_{args.keys}.json"
    if args.reuse_peers and cache.exists():
        peers = json.loads(cache.read_text())
        print(f"peers: reusing {cache}", file=sys.stderr)
    elif not args.no_peers:
        peers["eql"] = run_peer(".venv-eql", "eql_w1.py", [str(csv_path)], args.peer_timeout)
        print(f"eql W1: {peers['eql']}", file=sys.stderr)
        peers["flink"] = run_peer(".venv-flink", "flink_w2.py", [str(csv_path)], args.peer_timeout)
        print(f"flink W2: {peers['flink']}", file=sys.stderr)
        cache.write_text(json.dumps(peers))

    table = report(args, results, peers, load_seconds)
    if caps:
        table += "\n".join(
            cap_report(run_caps(caps, args.cap_events, args.cap_runs)) + footprint_report(caps)
        ) + "\n"
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0


def report(args, results: dict[str, Result], peers: dict, load_seconds: float) -> str:
    lines = [
        f"Embedded engine, `feed_batch` in batches of {args.batch:,} rows, "
        f"{args.events:,} events over {args.keys:,} keys "
        f"(Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores; "
        f"reading the CSV took {load_seconds:.2f}s and is not included).",
        "",
        "| workload | what | events/s (wall) | events/s (CPU) | seconds | matches | late |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {DESCRIPTIONS[name]} | {r.rate:,.0f} | {r.cpu_rate:,.0f} | "
            f"{r.seconds:.2f} | {r.matches:,} | {r.late} |"
        )
    lines += [
        "",
        "| peer | workload | events/s (wall) | seconds (processing) | process wall (incl. "
        "start-up) | matches | Vigil / peer (wall) | Vigil / peer (CPU) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for peer, workload in (("eql", "W1"), ("flink", "W2")):
        data = peers.get(peer)
        ours = results.get(workload)
        if not data or "seconds" not in data or ours is None:
            lines.append(f"| {peer} | {workload} | n/a | n/a | n/a | n/a | n/a | n/a |")
            continue
        rate = data["events"] / data["seconds"]
        cpu = data.get("cpu_seconds")
        cpu_ratio = f"{ours.cpu_rate / (data['events'] / cpu):.1f}x" if cpu else "n/a (JVM)"
        lines.append(
            f"| {data['engine']} | {workload} | {rate:,.0f} | {data['seconds']:.2f} | "
            f"{data['wall_seconds']:.2f} | {data['matches']:,} | {ours.rate / rate:.1f}x | "
            f"{cpu_ratio} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
