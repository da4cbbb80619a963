"""Event-to-webhook latency of an always-on pipeline: ``vigil run --follow`` over a growing file,
alerts delivered through the outbox to a verifying receiver on loopback.

A writer appends events to the file at a fixed rate, each carrying the wall-clock time it was
written (``sent``); one event in ``--hot-every`` is "hot" and fires a rule whose alert carries
that time back (``emit a.sent as sent``). The receiver notes when each signed alert arrives, so
the latency of an alert is arrival - write: reading (woken by inotify), parsing, matching, the
outbox's durable write (fsync), the dispatcher, HTTP. Each rate runs for ``--seconds``; a rate
is *sustained* when every alert arrived and the writer kept its schedule. Reported per rate:
p50, p99 and max latency, alerts received/expected (and any delivered twice), the rate
achieved, the CPU seconds the run used while the events were written and the load average of
the machine (1 minute) when the rate ended::

    .venv/bin/python bench/bench_latency.py --engine embedded --rates 5000,20000,40000
    .venv/bin/python bench/bench_latency.py --engine spark --rates 10000,50000 --seconds 40 \
        --warm 60

``--tree DIR`` runs another checkout's ``vigil run`` (``git worktree add /tmp/before HEAD~1``)
with this script, and several trees alternate within each round (``--rounds``), so that a
before/after comparison sees the same load; ``--find-max`` instead raises the rate from the
first of ``--rates`` by ``--step`` while the median p99 of ``--rounds`` runs stays under
``--goal-ms``, and reports the highest rate that did::

    .venv/bin/python bench/bench_latency.py --tree /tmp/before --tree . --rates 20000 --rounds 3

Goals (issue #20): embedded p99 <= 50 ms at 20k events/s; Spark (local[2]) p99 <= 3 s at
50k events/s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cep.alerts import ReceivedAlert, WebhookReceiver, new_secret  # noqa: E402

PROGRAM = """
stream ev (k string, kind string, sent float, ts timestamp) time ts unit ms lateness 0s
webhook hook url "{url}" secret env BENCH_HOOK_SECRET
rule hot from ev by k pattern a define a as kind == "hot" emit a.sent as sent notify hook
"""
TICK_S = 0.005
"""The writer appends one slice of lines every tick."""


@dataclass
class Result:
    engine: str
    rate: int
    achieved: float
    expected: int
    received: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    duplicates: int = 0
    cpu_s: float = 0.0
    load: float = 0.0
    tree: str = ""

    @property
    def sustained(self) -> bool:
        return self.received == self.expected and self.achieved >= 0.95 * self.rate

    def row(self) -> str:
        return (f"{self.tree:<16} {self.engine:<9} {self.rate:>8,} {self.achieved:>9,.0f} "
                f"{self.received:>5}/{self.expected:<5} {self.duplicates:>4} {self.p50_ms:>8.1f} "
                f"{self.p99_ms:>8.1f} {self.max_ms:>8.1f} {self.cpu_s:>6.1f} {self.load:>5.2f}  "
                f"{self.sustained}")


HEADER = (f"{'tree':<16} {'engine':<9} {'rate/s':>8} {'achieved':>9} {'alerts':>11} {'dup':>4} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu s':>6} {'load':>5}  sustained")


def _line(i: int, hot: bool) -> str:
    now = time.time()
    return json.dumps({"k": f"k{i % 1000}", "kind": "hot" if hot else "cold", "sent": now,
                       "ts": int(now * 1000)}) + "\n"


def run_rate(engine: str, rate: int, seconds: float, hot_every: int, master: str,
             tree: Path = ROOT, warm_s: float = 0.0) -> Result:
    """One run of ``vigil run --follow`` (of the checkout ``tree``) at ``rate`` events/s,
    measured after ``warm_s`` seconds at that rate (the alerts of events written then are
    not counted)."""
    secret = new_secret()
    latencies: list[float] = []
    lock = threading.Lock()
    since = [0.0]  # alerts of events written before this wall-clock time are not counted

    def on_alert(alert: ReceivedAlert) -> None:
        sent = (alert.data or {}).get("values", {}).get("sent")
        if isinstance(sent, int | float) and sent >= since[0]:
            with lock:
                latencies.append(alert.received_at - float(sent))

    with WebhookReceiver(secret, on_alert=on_alert) as receiver, \
            tempfile.TemporaryDirectory(prefix="vigil-latency-") as tmp:
        rules, events, out = Path(tmp, "r.vigil"), Path(tmp, "events.jsonl"), Path(tmp, "out")
        rules.write_text(PROGRAM.format(url=receiver.url))
        events.write_text("")
        out_path = out if engine == "spark" else Path(tmp, "matches.jsonl")
        command = [sys.executable, "-m", "cep.cli", "run", str(rules), "--events", str(events),
                   "--engine", engine, "--follow", "--out", str(out_path),
                   "--outbox", str(Path(tmp, "outbox.sqlite"))]
        if engine == "spark":
            command += ["--master", master]
        env = {**os.environ, "BENCH_HOOK_SECRET": secret, "PYTHONPATH": str(tree)}
        log = open(Path(tmp, "run.log"), "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=log)
        try:
            # Warm up: one hot event, until its alert arrives (the pipeline is up).
            with events.open("a") as handle:
                handle.write(_line(0, True))
            give_up = time.monotonic() + (300 if engine == "spark" else 60)
            while not latencies:
                if proc.poll() is not None or time.monotonic() > give_up:
                    log.flush()
                    text = Path(tmp, "run.log").read_text()
                    raise RuntimeError(f"the run never delivered:\n{text}")
                time.sleep(0.05)
            with lock:
                latencies.clear()
            if warm_s > 0:
                _write(events, rate, warm_s, hot_every)
            since[0] = time.time()
            with lock:
                latencies.clear()
            cpu_start = _process_cpu(proc.pid)
            written, expected = _write(events, rate, seconds, hot_every)
            cpu_s = _process_cpu(proc.pid) - cpu_start
            achieved = written / seconds
            settle = time.monotonic() + (30 if engine == "spark" else 10)
            while time.monotonic() < settle:
                with lock:
                    if len(latencies) >= expected:
                        break
                time.sleep(0.05)
        finally:
            load = os.getloadavg()[0]
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        duplicates = receiver.duplicates
    with lock:
        got = sorted(latencies)
    ms = [x * 1000 for x in got] or [float("nan")]
    return Result(engine, rate, achieved, expected, len(got), statistics.median(ms),
                  ms[min(len(ms) - 1, int(0.99 * len(ms)))], ms[-1], duplicates,
                  cpu_s, load, _label(tree))


def _process_cpu(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used so far (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _label(tree: Path) -> str:
    """A tree as the table names it: the end of its directory's name ("this tree" for this
    checkout)."""
    if tree.resolve() == ROOT:
        return "this tree"
    return tree.name[-16:]


def _write(path: Path, rate: int, seconds: float, hot_every: int) -> tuple[int, int]:
    """Append ``rate`` lines a second for ``seconds``, on a fixed schedule; returns the lines
    written and how many were hot."""
    per_tick = max(1, round(rate * TICK_S))
    start = time.monotonic()
    written = hot = 0
    with path.open("a") as handle:
        tick = 0
        while True:
            due = start + tick * TICK_S
            now = time.monotonic()
            if now - start >= seconds:
                break
            if due > now:
                time.sleep(due - now)
            lines = []
            for _ in range(per_tick):
                written += 1
                is_hot = written % hot_every == 0
                hot += is_hot
                lines.append(_line(written, is_hot))
            handle.write("".join(lines))
            handle.flush()
            tick += 1
    return written, hot


def find_max(engine: str, start: int, args: argparse.Namespace, tree: Path) -> int | None:
    """The highest rate, from ``start`` up by ``--step`` each time, at which the run kept up
    and the median p99 of ``--rounds`` runs stayed under ``--goal-ms`` (``None`` when
    ``start`` already did not)."""
    best, rate = None, start
    while True:
        runs = []
        for _ in range(args.rounds):
            r = run_rate(engine, rate, args.seconds, args.hot_every, args.master, tree,
                         args.warm)
            print(r.row(), flush=True)
            runs.append(r)
        if not (all(r.sustained for r in runs)
                and statistics.median(r.p99_ms for r in runs) <= args.goal_ms):
            return best
        best, rate = rate, int(rate * args.step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["embedded", "spark"], default="embedded")
    parser.add_argument("--rates", default="5000,20000,40000")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warm", type=float, default=0.0, metavar="SECONDS",
                        help="write at the rate this long before measuring (a Spark query "
                        "takes some ten micro-batches to reach its speed; default 0)")
    parser.add_argument("--hot-every", type=int, default=200,
                        help="one event in N fires an alert (default 200)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--tree", action="append", type=Path, default=None,
                        help="a checkout whose vigil run is measured (repeatable: the trees "
                        "alternate; default this one)")
    parser.add_argument("--rounds", type=int, default=1, help="times each rate is run per tree")
    parser.add_argument("--find-max", action="store_true",
                        help="raise the rate from the first of --rates while p99 <= goal")
    parser.add_argument("--goal-ms", type=float, default=50.0)
    parser.add_argument("--step", type=float, default=1.25, help="--find-max: rate factor")
    args = parser.parse_args(argv)
    trees = args.tree or [ROOT]
    rates = [int(r) for r in args.rates.split(",")]
    print(HEADER)
    if args.find_max:
        for tree in trees:
            best = find_max(args.engine, rates[0], args, tree)
            print(f"{_label(tree)}: highest rate with a median p99 <= {args.goal_ms:g} ms: "
                  f"{'none' if best is None else f'{best:,}'} events/s", flush=True)
        return 0
    results: list[Result] = []
    for _ in range(args.rounds):
        for rate in rates:
            for tree in trees:
                r = run_rate(args.engine, rate, args.seconds, args.hot_every, args.master, tree,
                             args.warm)
                results.append(r)
                print(r.row(), flush=True)
    if args.rounds > 1:
        print("\nmedian over rounds (p50, p99, max in ms; load):")
        for rate in rates:
            for tree in trees:
                mine = [r for r in results if r.rate == rate and r.tree == _label(tree)]
                print(f"{_label(tree):<16} {rate:>8,}  p50 "
                      f"{statistics.median(r.p50_ms for r in mine):6.1f}  p99 "
                      f"{statistics.median(r.p99_ms for r in mine):6.1f}  max "
                      f"{statistics.median(r.max_ms for r in mine):6.1f}  p99 range "
                      f"{min(r.p99_ms for r in mine):.1f}-{max(r.p99_ms for r in mine):.1f}  "
                      f"load {statistics.median(r.load for r in mine):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
