"""Cost of a restart of the embedded engine: ``Engine.snapshot()``, ``CheckpointStore.save()``
(with its fsyncs), ``load()`` and ``Engine.restore()`` for an engine holding partial matches
on many keys (``docs/semantics.md``, *Restarts and program edits*)::

    .venv/bin/python bench/bench_checkpoint.py --keys 10000 --partials 1 [--metric]

Times are the best of ``--repeat`` runs: process CPU time for the engine's work, wall time for
``save`` (its cost is the disk's).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import pandas as pd

from cep.engine import CheckpointStore, Engine

RULE = """
stream txn (card string, amount float, ts timestamp) time ts unit ms
rule probe from txn by card pattern small big within 1h
  define small as amount < 1, big as amount > 500
"""
METRIC = """
metric spend from txn by card window tumbling 1h select sum(amount) as total, count() as n
"""
T0_MS = 1_767_225_600_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partials", type=int, default=1, help="partial matches per key")
    parser.add_argument("--metric", action="store_true", help="add a metric over the keys")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    program = RULE + (METRIC if args.metric else "")
    engine = Engine()
    engine.register(program)
    n = args.keys * args.partials
    engine.feed_batch(pd.DataFrame({
        "card": [f"card-{i % args.keys}" for i in range(n)],
        "amount": [0.5] * n,
        "ts": [T0_MS + i for i in range(n)],
    }))
    store = CheckpointStore(tempfile.mkdtemp(prefix="vigil-bench-"))
    best: dict[str, float] = {}
    clock = time.process_time
    for _ in range(args.repeat):
        start = clock()
        data = engine.snapshot()
        snapshot = clock() - start
        start = time.perf_counter()
        store.save(data, {"offset": n})
        save = time.perf_counter() - start
        start = clock()
        saved = store.load()
        load = clock() - start
        restarted = Engine()
        restarted.register(program)
        start = clock()
        restarted.restore(saved.state)
        restore = clock() - start
        for name, value in (("snapshot", snapshot), ("save", save), ("load", load),
                            ("restore", restore)):
            best[name] = min(best.get(name, float("inf")), value)
    print(f"{engine.stats.keys} keys, {args.partials} partial match(es) each"
          f"{' + metric' if args.metric else ''}: snapshot of {len(data) / 1e6:.2f} MB")
    print("  ".join(f"{name} {value * 1000:.0f} ms" for name, value in best.items()))


if __name__ == "__main__":
    main()
