"""What a rule's ``unique`` costs: ``--events`` process starts over ``--hosts`` hosts and
``--names`` program names, one rule matching every start (``pattern p define p as true``), fed
in frames of ``--batch`` rows::

    .venv/bin/python bench/bench_unique.py [--events 500000] [--hosts 1000] [--names 200]
        [--rounds 3]

Each round runs, on the same rows, alternately:

* **A, with unique**: ``unique lower(p.name)`` (the first start of each program per host);
* **B, without**: the same rule reporting every start (the peer: the work ``unique`` adds to);
* **P, pandas**: ``drop_duplicates`` of (host, lower(name)) over the frame sorted by time, the
  same answer computed in one pass over a finished table — the floor for the filter alone.

A's reported starts must equal pandas' rows. Times are process CPU time; rates are events per
CPU second, ratio A / B. State: the checkpoint's size per (host, name) pair kept.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from cep import Engine

HEAD = "stream proc (host string, name string, ts int) time ts unit ms lateness 0s\n"
RULE = "rule first from proc by host pattern p define p as true{}\n"


def rows(events: int, hosts: int, names: int, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    host = rng.integers(0, hosts, events)
    name = rng.zipf(1.3, events) % names
    upper = rng.random(events) < 0.1
    return pd.DataFrame({
        "host": [f"h{h}" for h in host],
        "name": [f"P{n}.EXE" if u else f"p{n}.exe" for n, u in zip(name, upper, strict=True)],
        "ts": np.arange(events, dtype=np.int64) * 10,
    })


def run(frame: pd.DataFrame, unique: bool, batch: int) -> tuple[float, list[dict], Engine]:
    engine = Engine()
    engine.register(HEAD + RULE.format(" unique lower(p.name)" if unique else ""))
    start = time.process_time()
    found = []
    for lo in range(0, len(frame), batch):
        engine.feed_batch(frame.iloc[lo : lo + batch], stream="proc")
        found.extend(engine.drain())
    engine.close()
    found.extend(engine.drain())
    return time.process_time() - start, found, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--hosts", type=int, default=1_000)
    parser.add_argument("--names", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    frame = rows(args.events, args.hosts, args.names)

    start = time.process_time()
    lowered = frame.assign(name=frame["name"].str.lower())
    firsts = lowered.drop_duplicates(["host", "name"])
    pandas_s = time.process_time() - start
    expected = sorted(zip(firsts["host"], firsts["ts"], strict=True))

    for r in range(args.rounds):
        a_s, a_found, engine = run(frame, True, args.batch)
        b_s, b_found, _ = run(frame, False, args.batch)
        got = sorted((m["key"]["host"], int(pd.Timestamp(m["start"]).value // 10**6))
                     for m in a_found)
        assert got == expected, "unique's matches differ from pandas' drop_duplicates"
        assert len(b_found) == args.events
        held = sum(engine.stats.suppressed.values())
        print(f"round {r}: A unique {args.events / a_s:,.0f} ev/s ({len(a_found):,} reported, "
              f"{held:,} held back), B without {args.events / b_s:,.0f} ev/s "
              f"({len(b_found):,} reported); A/B {b_s / a_s:.2f}")
    pairs = len(firsts)
    engine = Engine()
    engine.register(HEAD + RULE.format(" unique lower(p.name)"))
    engine.feed_batch(frame, stream="proc")
    engine.drain()  # a snapshot holds undrained matches
    size = len(engine.snapshot())
    print(f"pandas drop_duplicates {args.events / pandas_s:,.0f} ev/s; {pairs:,} (host, name) "
          f"pairs kept, zlib-compressed checkpoint {size / pairs:.0f} bytes per pair")


if __name__ == "__main__":
    main()
