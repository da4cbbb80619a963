"""W1 (card testing) as an EQL sequence on the Python ``eql`` engine; runs inside .venv-eql.

Reads the benchmark CSV, streams its events through ``eql.PythonEngine`` and prints one JSON
line: ``{"engine", "events", "seconds", "cpu_seconds", "matches"}`` (both exclude reading
the file).
EQL cannot say ``probe{3,}`` or compare with the last probe's merchant, so the query is the
closest sequence it can express: three probes then a large amount, by key, within 10 minutes.
"""

from __future__ import annotations

import csv
import json
import sys
import time

import eql

QUERY = """
sequence by key with maxspan=10m
  [ev where amount < 1.0]
  [ev where amount < 1.0]
  [ev where amount < 1.0]
  [ev where amount > 500]
"""


def main(path: str) -> None:
    events = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            data = {
                "key": row["key"],
                "amount": float(row["amount"]),
                "merchant": row["merchant"],
                "ts": int(row["ts"]),
            }
            events.append(eql.Event("ev", data["ts"], data))
    # eql expects events in time order; the data is only slightly out of order.
    events.sort(key=lambda e: e.time)
    matches = []
    engine = eql.PythonEngine({"time_unit": 1000})  # event times are epoch milliseconds
    engine.add_output_hook(matches.append)
    with eql.ignore_missing_functions:
        engine.add_query(eql.parse_query(QUERY))
    started, cpu_started = time.perf_counter(), time.process_time()
    engine.stream_events(events)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    print(
        json.dumps(
            {
                "engine": f"eql {eql.__version__}",
                "events": len(events),
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "matches": len(matches),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
