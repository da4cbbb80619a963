"""Standing queries as the engine and the Spark workers run them, against the bare percolator.

The same generated queries and package documents as ``bench_percolator.py``, declared as a
stream (every corpus field, so the default fields are all its text and string fields, as a
user's stream would have them) and registered as ``query`` blocks. Times, per event, in CPU
seconds of this one process:

- *worker*: what a Spark worker runs for one frame of JSON rows (:func:`spark_udf.queries.
  frame_outputs` 512 rows at a time, on the index :func:`spark_udf.queries._index` builds and
  freezes): parsing, validation, matching and the output records;
- *percolator*: ``Percolator.match_batch`` of the engine's own index on the already validated
  events, the part of the worker's time the index decides.

The ratio is the cost of everything around the index. Also prints the engine index's segments.

Run: ``python bench/bench_query_worker.py --sizes 10000 100000 --workload needle``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_percolator import QueryGenerator, load_corpus, split_corpus  # noqa: E402

from cep.events.event import StreamSchema  # noqa: E402
from query_lang import ast, parse  # noqa: E402
from spark_udf import queries  # noqa: E402

STREAM = (
    "stream pkg (id string, title text, body text, section string, priority string, "
    "maintainer string, size int, ts timestamp) time ts\n"
)


def measure(size: int, workload: str, training: list, testing: list, events: int) -> None:
    generator = QueryGenerator(training)
    generator.rng.seed(size)
    [stream] = parse(STREAM).declarations
    streams = {"pkg": stream}
    decls = [ast.QueryDecl(name, ("pkg",), query)
             for name, query, _ in generator.queries(size, workload)]
    start = time.process_time()
    standing, _ = queries._index(f"bench-{workload}-{size}", decls, streams)
    built = time.process_time() - start
    schemas = {"pkg": StreamSchema.from_decl(stream)}
    rows = [json.dumps({**doc, "stream": "pkg", "ts": 1_767_225_600 + i})
            for i, doc in enumerate(testing[:events])]
    frame = pd.DataFrame({"_seq": range(len(rows)), "_event": rows})
    checked = [schemas["pkg"].normalise(json.loads(r), seq=i, position=i)
               for i, r in enumerate(rows)]
    percolator = standing.index("pkg")
    fields = [event.fields for event in checked]
    chunk = queries.ROWS_PER_CHUNK
    for _ in range(2):
        gc.collect()
        start = time.process_time()
        matches = 0
        for first in range(0, len(frame), chunk):
            out = queries.records_frame(queries.frame_outputs(
                frame.iloc[first:first + chunk], standing, schemas))
            matches += len(out)
        worker = (time.process_time() - start) / len(rows)
        gc.collect()
        start = time.process_time()
        for first in range(0, len(fields), chunk):
            percolator.match_batch(fields[first:first + chunk])
        bare = (time.process_time() - start) / len(rows)
        print(f"{workload:12} {size:>9,} queries: worker {worker * 1e6:8.1f} us/event, "
              f"percolator {bare * 1e6:8.1f} us/event, ratio {worker / bare:5.2f}x; "
              f"{matches / len(rows):.1f} matches/event; index {built:.1f} s, "
              f"{percolator.stats().segments} segment(s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--workload", choices=["cooccurring", "needle"], default="needle")
    parser.add_argument("--events", type=int, default=3000)
    args = parser.parse_args(argv)
    corpus, source = load_corpus()
    training, testing = split_corpus(corpus)
    print(f"corpus: {len(corpus)} packages from {source}", flush=True)
    for size in args.sizes:
        measure(size, args.workload, training, testing, args.events)


if __name__ == "__main__":
    main()
