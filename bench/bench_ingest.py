"""Ingest benchmark: events/s of ``vigil run --engine embedded`` reading JSON lines from a file,
against ``pyarrow``'s JSON reader alone on the same file (the limit of a column-wise parse).

Writes the CEP benchmark's W1 events (``bench_cep.generate``: 1,000,000 events over 10,000
keys) as one JSON object a line, then, in the same run and alternating, times:

* ``pyarrow.json.read_json`` of the whole file, one thread (and all threads, for reference);
* ``pyarrow.json`` per chunk of 20,000 lines, and the frames built from its tables;
* ``cep.inputs.InputReader`` alone: the reading path without the engine (parse, frames);
* the engine alone on the frames the reader gave (``Engine.feed_batch``);
* ``vigil run RULES --events FILE --engine embedded --out FILE``, in process: end to end;
* with ``--before``, the same command as it was at ``git show REV:cep/cli/run.py`` (line by
  line), loaded beside the current code.

::

    .venv/bin/python bench/bench_ingest.py [--events N] [--repeat 2] [--before HEAD]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_cep import STREAM, WORKLOADS, generate  # noqa: E402

from cep.cli import main as vigil  # noqa: E402
from cep.engine import Engine  # noqa: E402
from cep.inputs import CHUNK_ROWS, EventBatch, EventInput, InputReader  # noqa: E402


def write_events(path: Path, n: int, keys: int) -> float:
    started = time.perf_counter()
    generate(n, keys).to_json(path, orient="records", lines=True)
    return time.perf_counter() - started


def timed(fn, *args) -> tuple[float, float, object]:
    """Wall and CPU seconds of ``fn(*args)``, and what it returned."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def pyarrow_alone(path: Path, threads: bool) -> int:
    options = pa_json.ReadOptions(use_threads=threads)
    return pa_json.read_json(path, read_options=options).num_rows


def chunk_tables(path: Path) -> tuple[list[pa.Table], float]:
    """The file in chunks of 20,000 lines, each parsed by ``pyarrow.json`` as the reader
    parses a run (threads on); returns the tables and the seconds spent building frames from
    them (``to_pandas``), timed apart."""
    data = path.read_bytes()
    breaks = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A)
    tables = []
    for lo in range(0, len(breaks), CHUNK_ROWS):
        start = 0 if lo == 0 else int(breaks[lo - 1]) + 1
        stop = int(breaks[min(lo + CHUNK_ROWS, len(breaks)) - 1])
        size = -(-(stop - start + 1) // 2)
        options = pa_json.ReadOptions(use_threads=True, block_size=max(size, 1 << 16))
        tables.append(pa_json.read_json(pa.BufferReader(memoryview(data)[start:stop]),
                                        read_options=options))
    started = time.perf_counter()
    for table in tables:
        table.to_pandas()
    return tables, time.perf_counter() - started


def reader_alone(path: Path) -> list[EventBatch]:
    return [p for step in InputReader([EventInput(str(path))], {}) for p in step.pieces]


def engine_alone(rules: str, batches: list[EventBatch]) -> int:
    engine = Engine()
    engine.register(rules)
    matches = 0
    for batch in batches:
        engine.feed_batch(batch.frame, source=batch.source, lines=batch.lines,
                          positions=batch.positions, raw=batch.raw)
        matches += len(engine.drain())
    engine.close()
    return matches + len(engine.drain())


def run_cli(run, rules_path: Path, events: Path, out: Path) -> int:
    argv = ["run", str(rules_path), "--events", str(events), "--engine", "embedded",
            "--out", str(out), "--no-alerts"]
    if run is None:
        code = vigil(argv)
    else:  # the old module's own entry: parse with its parser, run with its run()
        parser = argparse.ArgumentParser(prog="vigil")
        run.configure_parser(parser.add_subparsers())
        code = run.run(parser.parse_args(argv))
    assert code == 0, code
    return sum(1 for _ in open(out))


def old_run_module(rev: str):
    """``cep/cli/run.py`` as it was at ``rev``, imported under another name."""
    source = subprocess.run(["git", "show", f"{rev}:cep/cli/run.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "vigil_run_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("vigil_run_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the timed runs")
    parser.add_argument("--before", metavar="REV",
                        help="also time vigil run as cep/cli/run.py was at REV")
    parser.add_argument("--dir", default=str(ROOT / "out" / "bench_ingest"))
    args = parser.parse_args(argv)

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    events = work / f"w1_{args.events}_{args.keys}.jsonl"
    rules_text = STREAM + WORKLOADS["W1"]
    rules = work / "w1.vigil"
    rules.write_text(rules_text)
    if not events.exists():
        took = write_events(events, args.events, args.keys)
        print(f"wrote {events} ({events.stat().st_size / 1e6:,.0f} MB) in {took:.1f}s",
              file=sys.stderr)
    before = old_run_module(args.before) if args.before else None
    n = args.events

    rows: dict[str, list[tuple[float, float]]] = {}

    def record(name: str, wall: float, cpu: float) -> None:
        rows.setdefault(name, []).append((wall, cpu))
        print(f"  {name}: {n / wall:,.0f}/s wall, {n / cpu:,.0f}/s CPU", file=sys.stderr)

    matches = None
    out = work / "matches.jsonl"
    for round_ in range(args.repeat):
        print(f"round {round_ + 1} (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
        wall, cpu, rows_read = timed(pyarrow_alone, events, False)
        assert rows_read == n
        record("pyarrow.json alone, one thread", wall, cpu)
        wall, cpu, _ = timed(pyarrow_alone, events, True)
        record("pyarrow.json alone, all threads", wall, cpu)
        wall, cpu, (_, frames_s) = timed(chunk_tables, events)
        record("pyarrow.json per 20k-line chunk, tables and frames", wall, cpu)
        record("  of which the frames (to_pandas)", frames_s, frames_s)
        wall, cpu, batches = timed(reader_alone, events)
        record("cep.inputs reader alone (parse + frames)", wall, cpu)
        wall, cpu, found = timed(engine_alone, rules_text, batches)
        record("engine alone on those frames", wall, cpu)
        del batches
        wall, cpu, written = timed(run_cli, None, rules, events, out)
        record("vigil run --engine embedded, end to end", wall, cpu)
        assert written == found, (written, found)
        matches = written
        if before is not None:
            wall, cpu, written = timed(run_cli, before, rules, events, out)
            record(f"vigil run as at {args.before}, end to end", wall, cpu)
            assert written == matches, (written, matches)

    best = {name: min(runs) for name, runs in rows.items()}
    limit = best["pyarrow.json alone, one thread"][0]
    print()
    print(f"W1, {n:,} events over {args.keys:,} keys from a {events.stat().st_size / 1e6:,.0f} "
          f"MB JSON-lines file, {matches} matches; best of {args.repeat} "
          f"(2 cores, load {os.getloadavg()[0]:.1f} at the end)")
    print()
    print("| path | events/s (wall) | events/s (CPU) | seconds | vs pyarrow alone |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in best.items():
        print(f"| {name} | {n / wall:,.0f} | {n / cpu:,.0f} | {wall:.2f} | "
              f"{limit / wall:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
