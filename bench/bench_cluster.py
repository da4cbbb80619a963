"""The same Spark run on ``local[2]`` and on a two-worker standalone cluster on this machine's
loopback (one core each, executors on the environment ``vigil pack`` shipped): W1 events
(``bench/bench_cep.py``'s generator and rule) through ``python -m spark_udf.run``, events/s of
each and their ratio.

Usage: ``python bench/bench_cluster.py [--events N] [--keys K] [--quick] [--out FILE]``
(``--quick``: 100k events). Each run is a driver process of its own, with a new checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_spark  # noqa: E402

from cep.cli.pack import pack_environment  # noqa: E402
from spark_udf.standalone import StandaloneCluster  # noqa: E402


def run_once(program: Path, events: Path, out: Path, master: str, batch: int,
             pack: Path | None) -> dict:
    """One ``python -m spark_udf.run`` over ``events``; its summary (JSON) plus wall time."""
    command = [sys.executable, "-m", "spark_udf.run", "--program", str(program), "--events",
               str(events), "--out", str(out), "--master", master,
               "--max-records-per-batch", str(batch)]
    if pack is not None:
        command += ["--pack", str(pack)]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    if done.returncode != 0:
        raise RuntimeError(f"{master} run failed:\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {**summary, "wall_s": time.monotonic() - began}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="100k events")
    parser.add_argument("--batch", type=int, default=150_000, help="events per micro-batch")
    parser.add_argument("--pack", help="an existing `vigil pack` archive (else one is built)")
    parser.add_argument("--out", help="append the JSON results to this file")
    args = parser.parse_args(argv)
    events_n = 100_000 if args.quick else args.events
    work = Path(tempfile.mkdtemp(prefix="vigil-bench-cluster-"))
    try:
        program = work / "w1.vigil"
        program.write_text(bench_spark.W1_PROGRAM)
        events = work / "events.jsonl"
        bench_spark.write_w1_events(str(events), events_n, args.keys)
        pack = Path(args.pack) if args.pack else work / "env.tar.gz"
        if not args.pack:
            began = time.monotonic()
            pack_environment(str(pack))
            print(f"packed the environment in {time.monotonic() - began:.0f} s", flush=True)
        local = run_once(program, events, work / "local", "local[2]", args.batch, None)
        print(f"local[2]: {local['events_per_second']:,.0f} events/s "
              f"({local['duration_s']:.1f} s query, {local['wall_s']:.1f} s with start)",
              flush=True)
        with StandaloneCluster(work / "cluster", workers=2, cores=1, memory="2g") as cluster:
            remote = run_once(program, events, work / "cluster-out", cluster.url, args.batch,
                              pack)
        print(f"standalone, 2 workers x 1 core: {remote['events_per_second']:,.0f} events/s "
              f"({remote['duration_s']:.1f} s query, {remote['wall_s']:.1f} s with start)",
              flush=True)
        ratio = remote["events_per_second"] / local["events_per_second"]
        print(f"cluster / local[2]: {ratio:.2f}", flush=True)
        result = {"bench": "cluster", "events": events_n, "keys": args.keys,
                  "batch": args.batch, "local": local, "cluster": remote, "ratio": ratio}
        if args.out:
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
