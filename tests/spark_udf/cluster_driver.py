"""A driver ``test_cluster`` runs as a process of its own against the standalone cluster: it
reports which Python its executors run, then runs the examples with ``run_spark`` in small
micro-batches, printing one JSON line per event. After its first micro-batch it waits for the
test's go-ahead (a file), so the test can kill a worker while input is left.

``python cluster_driver.py MASTER PACK EVENTS OUT BATCH_LINES GO_FILE``
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from query_lang import load_program
from spark_udf import session
from spark_udf.run import run_spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def program_files() -> list[Path]:
    """The examples' rule files."""
    return sorted(EXAMPLES.glob("*.vigil"))


def _where(_: object):
    import sys

    import spark_udf

    yield (sys.executable, spark_udf.__file__)


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main(master: str, pack: str, events: str, out: str, batch_lines: str, go_file: str) -> int:
    spark = session(master, pack=pack)
    cores = spark.sparkContext.defaultParallelism
    found = spark.sparkContext.parallelize(range(cores), cores).mapPartitions(_where).collect()
    _say(executors=sorted(set(found)))
    files = [str(p) for p in program_files()]
    waited = False

    def on_progress(progress: dict) -> None:
        nonlocal waited
        _say(batch=progress.get("batchId"), flush=bool(progress.get("flush")),
             **{k: progress.get(k) for k in ("failedTasks", "stageRetries", "executorsLost",
                                             "executors")})
        if not waited:
            waited = True
            deadline = time.monotonic() + 120
            while not os.path.exists(go_file) and time.monotonic() < deadline:
                time.sleep(0.1)

    summary = run_spark(
        load_program(files).modules, events, out=out, dead_letter=os.path.join(out, "_dead"),
        spark=spark, max_records_per_batch=int(batch_lines), on_progress=on_progress,
    )
    _say(summary={"batches": summary.batches, "matches": summary.matches,
                  "input_rows": summary.input_rows, "flushed_after": summary.flushed_after})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
