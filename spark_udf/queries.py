"""Standing ``query`` blocks on Spark: the percolator runs inside each partition's Python
worker over the raw events, with the same analysis, index and match objects as the embedded
engine (:mod:`cep.standing`). Matching a document needs no state, so no shuffle either. The
query index is built once per Python worker (Spark reuses them) and rebuilt only when the
queries change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame

from cep.engine import Engine
from cep.events import BadEventError, stream_of
from query_lang import ast
from query_lang.printer import print_declaration
from spark_udf.batch import SEQ_COLUMN
from spark_udf.operator import OUTPUT_SCHEMA
from spark_udf.records import OUTPUT_COLUMNS
from spark_udf.sources import EVENT_COLUMN

__all__ = ["query_names", "query_outputs"]


def _queries(program: Any) -> tuple[list[ast.QueryDecl], dict[str, ast.StreamDecl]]:
    engine = Engine()
    engine.register(program)
    decls = [d for d in engine.declarations if isinstance(d, ast.QueryDecl)]
    return decls, dict(engine.streams)


_INDEXES: dict[str, tuple[Any, dict[str, Any]]] = {}
"""Query indexes built in this Python worker, by fingerprint of the queries and streams: Spark
reuses its workers, so a worker builds the index once and every later micro-batch and
partition it serves reuses it; changed queries have another fingerprint and get a new one."""


def _index(
    fingerprint: str, decls: Sequence[ast.QueryDecl], streams: dict[str, ast.StreamDecl]
) -> tuple[Any, dict[str, Any]]:
    from cep.events import StreamSchema
    from cep.standing import StandingQueries

    found = _INDEXES.get(fingerprint)
    if found is None:
        standing = StandingQueries()
        standing.add(standing.compile(list(decls), streams, {}), streams)
        schemas = {name: StreamSchema.from_decl(d) for name, d in streams.items()}
        _INDEXES.clear()  # one program per worker at a time: drop the previous index
        found = _INDEXES[fingerprint] = (standing, schemas)
    return found


def query_names(program: Any) -> list[str]:
    """Names of the ``query`` blocks of a program (rule file path, DSL text or modules)."""
    return [d.name for d in _queries(program)[0]]


def query_outputs(
    events: DataFrame, program: Any, *, json_col: str = EVENT_COLUMN, stream: str | None = None
) -> DataFrame | None:
    """Query matches of ``events`` (``_seq`` and a JSON-text column, as the Vigil sources give),
    in the operator's output schema; ``None`` when the program has no query.

    Events that do not parse or validate produce nothing here: the rule operator dead-letters
    them once, with the reason.
    """
    decls, streams = _queries(program)
    if not decls:
        return None
    text = "\n".join(print_declaration(d) for d in [*streams.values(), *decls])
    fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()
    shipped = (tuple(decls), streams, stream, json_col, fingerprint)

    def match_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        query_decls, stream_decls, bound, column, key = shipped
        standing, schemas = _index(key, query_decls, stream_decls)
        for frame in frames:
            seqs = frame[SEQ_COLUMN].tolist() if SEQ_COLUMN in frame else range(len(frame))
            accepted = []
            for seq, text in zip(seqs, frame[column].tolist(), strict=True):
                try:
                    raw = json.loads(text)
                    schema = stream_of(raw, bound, schemas)
                    if not standing.wants_documents(schema.name):
                        continue
                    accepted.append(schema.normalise(raw, seq=int(seq), position=int(seq)))
                except (BadEventError, ValueError, TypeError, AttributeError):
                    continue
            # One batch per run of a stream's events: candidates are selected many at a time.
            rows: list[dict[str, Any]] = []
            for event, match in standing.match_events(accepted):
                when = pd.Timestamp(event.ts, unit="ms")
                rows.append({
                    "kind": "query",
                    "name": match["name"],
                    "match_id": match["match_id"],
                    "key": json.dumps({"document_id": match["document_id"]}),
                    "payload": json.dumps(match, separators=(",", ":"), default=str),
                    "start": when,
                    "end": when,
                })
            yield pd.DataFrame(rows, columns=[name for name, _ in OUTPUT_COLUMNS])

    return events.mapInPandas(match_partition, schema=OUTPUT_SCHEMA)
