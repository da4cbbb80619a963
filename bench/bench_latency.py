"""Event-to-webhook latency of an always-on pipeline: ``vigil run --follow`` over a growing file,
alerts delivered through the outbox to a verifying receiver on loopback.

A writer appends events to the file at a fixed rate, each carrying the wall-clock time it was
written (``sent``); one event in ``--hot-every`` is "hot" and fires a rule whose alert carries
that time back (``emit a.sent as sent``). The receiver notes when each signed alert arrives, so
the latency of an alert is arrival - write: reading (the follow poll), parsing, matching, the
outbox's durable write (fsync), the dispatcher, HTTP. Each rate runs for ``--seconds``; a rate
is *sustained* when every alert arrived and the writer kept its schedule. Reported per rate:
p50, p99 and max latency, alerts received/expected, the rate achieved::

    .venv/bin/python bench/bench_latency.py --engine embedded --rates 5000,20000,40000
    .venv/bin/python bench/bench_latency.py --engine spark --rates 10000,50000 --seconds 40

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

    @property
    def sustained(self) -> bool:
        return self.received == self.expected and self.achieved >= 0.95 * self.rate


def _line(i: int, hot: bool) -> str:
    now = time.time()
    return json.dumps({"k": f"k{i % 1000}", "kind": "hot" if hot else "cold", "sent": now,
                       "ts": int(now * 1000)}) + "\n"


def run_rate(engine: str, rate: int, seconds: float, hot_every: int, master: str) -> Result:
    secret = new_secret()
    latencies: list[float] = []
    lock = threading.Lock()

    def on_alert(alert: ReceivedAlert) -> None:
        sent = (alert.data or {}).get("values", {}).get("sent")
        if isinstance(sent, int | float):
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
        env = {**os.environ, "BENCH_HOOK_SECRET": secret}
        log = open(Path(tmp, "run.log"), "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
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
            written, expected = _write(events, rate, seconds, hot_every)
            achieved = written / seconds
            settle = time.monotonic() + (30 if engine == "spark" else 10)
            while time.monotonic() < settle:
                with lock:
                    if len(latencies) >= expected:
                        break
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    with lock:
        got = sorted(latencies)
    ms = [x * 1000 for x in got] or [float("nan")]
    return Result(engine, rate, achieved, expected, len(got), statistics.median(ms),
                  ms[min(len(ms) - 1, int(0.99 * len(ms)))], ms[-1])


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["embedded", "spark"], default="embedded")
    parser.add_argument("--rates", default="5000,20000,40000")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--hot-every", type=int, default=200,
                        help="one event in N fires an alert (default 200)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    print(f"{'engine':<9} {'rate/s':>8} {'achieved':>9} {'alerts':>11} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'max ms':>8}  sustained")
    for rate in (int(r) for r in args.rates.split(",")):
        r = run_rate(args.engine, rate, args.seconds, args.hot_every, args.master)
        print(f"{r.engine:<9} {r.rate:>8,} {r.achieved:>9,.0f} {r.received:>5}/{r.expected:<5} "
              f"{r.p50_ms:>8.1f} {r.p99_ms:>8.1f} {r.max_ms:>8.1f}  {r.sustained}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
