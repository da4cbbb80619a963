"""W2 (V-shape) as ``MATCH_RECOGNIZE`` on PyFlink in local mode; runs inside .venv-flink.

Reads the benchmark CSV with Flink's filesystem connector, finds ``start down+ up+`` per key
(strict contiguity is MATCH_RECOGNIZE's only mode; Flink has no ``PREV`` within a
partition, so "the previous row" is written as the previous row of the match, which strict
contiguity makes the same thing, as in Flink's own V-shape example; Flink rejects a greedy
quantifier at the end of a pattern, so ``up+`` is closed by the first row that does not rise,
and the next match may start at that row, which is what Vigil's greedy ``up+`` does — only the
last V of a key, still rising at end of input, is not reported) and prints one JSON line:
``{"engine", "events", "seconds", "cpu_seconds", "matches", "startup_seconds"}``. ``seconds`` is
the second of two runs in the same JVM (the first, on a tiny file, pays for start-up and class
loading); ``cpu_seconds`` is the CPU time the Python driver and the JVM (all its threads) used
during that run, read from ``/proc``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from pyflink.table import EnvironmentSettings, TableEnvironment

SOURCE = """
CREATE TEMPORARY TABLE ev_{name} (
  id BIGINT, `key` STRING, kind STRING, amount DOUBLE, merchant STRING, price DOUBLE,
  ts BIGINT,
  rowtime AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rowtime AS rowtime - INTERVAL '5' SECOND
) WITH (
  'connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv',
  'csv.ignore-parse-errors' = 'false'
)
"""

SINK = """
CREATE TEMPORARY TABLE out_{name} (`key` STRING, bottom DOUBLE, top DOUBLE)
WITH ('connector' = 'blackhole')
"""

MATCH = """
SELECT `key`, bottom, top FROM ev_{name}
MATCH_RECOGNIZE (
  PARTITION BY `key`
  ORDER BY rowtime
  MEASURES LAST(D.price) AS bottom, LAST(U.price) AS top
  ONE ROW PER MATCH
  AFTER MATCH SKIP TO LAST E
  PATTERN (S D+ U+ E)
  DEFINE
    D AS (LAST(D.price, 1) IS NULL AND D.price < S.price) OR D.price < LAST(D.price, 1),
    U AS (LAST(U.price, 1) IS NULL AND U.price > LAST(D.price)) OR U.price > LAST(U.price, 1),
    E AS E.price <= LAST(U.price)
)
"""


def process_cpu_seconds() -> float:
    """CPU time (user + system) of this process and every process it started (the JVM)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(times.get(pid, 0.0) for pid in mine)


def run(env: TableEnvironment, name: str, path: str) -> tuple[float, int, float]:
    env.execute_sql(SOURCE.format(name=name, path=path))
    env.execute_sql(SINK.format(name=name))
    started, cpu_started = time.perf_counter(), process_cpu_seconds()
    env.execute_sql(f"INSERT INTO out_{name} " + MATCH.format(name=name)).wait()
    seconds = time.perf_counter() - started
    cpu_seconds = process_cpu_seconds() - cpu_started
    # The match count comes from a second, untimed query.
    count = 0
    with env.execute_sql(MATCH.format(name=name)).collect() as rows:
        for _ in rows:
            count += 1
    return seconds, count, cpu_seconds


def main(path: str) -> None:
    started = time.perf_counter()
    settings = EnvironmentSettings.in_streaming_mode()
    env = TableEnvironment.create(settings)
    env.get_config().set("parallelism.default", "1")
    env.get_config().set("table.exec.resource.default-parallelism", "1")
    with open(path) as handle:
        header = handle.readline()
        lines = [handle.readline() for _ in range(1000)]
        events = 1000 + sum(1 for _ in handle)
    with tempfile.TemporaryDirectory() as tmp:
        # Flink's CSV format has no header option: hand it headerless copies.
        small = os.path.join(tmp, "small.csv")
        with open(small, "w") as out:
            out.writelines(lines)
        full = os.path.join(tmp, "full.csv")
        with open(path) as src, open(full, "w") as out:
            src.readline()
            for chunk in iter(lambda: src.read(1 << 20), ""):
                out.write(chunk)
        run(env, "warm", small)
        startup = time.perf_counter() - started
        seconds, matches, cpu_seconds = run(env, "full", full)
    del header
    import pyflink

    version = getattr(pyflink, "__version__", "2.3")
    print(
        json.dumps(
            {
                "engine": f"PyFlink {version}",
                "events": events,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "matches": matches,
                "startup_seconds": startup,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
