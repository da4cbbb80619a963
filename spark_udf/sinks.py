"""Idempotent output of a streaming query: each micro-batch's matches and dead letters go to
files named by batch id, written atomically, so a batch Spark replays after a crash overwrites
its own files instead of adding duplicates; an ``on_matches`` hook delivers alerts."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spark_udf.errors import OperatorConfigError, SinkError
from spark_udf.records import COUNT_KINDS, DEAD_LETTER, HELD, UNCORRECTED

__all__ = ["END_TAG", "FORMATS", "BatchSink", "SinkCounters", "read_batch", "read_outputs"]

FORMATS = ("jsonl", "parquet")
"""Output file formats: ``jsonl`` writes each match object (the embedded engine's output
shape) on a line; ``parquet`` writes the operator's columns."""

MatchHook = Callable[[int, list[dict[str, Any]]], None]


@dataclass
class SinkCounters:
    """Running totals over the micro-batches (and end-of-input flushes) a sink wrote in this
    process."""

    batches: int = 0
    matches: int = 0
    dead_letters: int = 0
    late: int = 0
    last_batch_id: int | None = None
    held: dict[str, int] = field(default_factory=dict)
    """Per rule, matches its ``unique`` held back (the operator's ``held`` rows, summed)."""
    uncorrected: int = 0
    """Events of clock-corrected streams that kept their device time, lacking a sent or
    received time (the ``uncorrected`` rows, summed)."""


END_TAG = "end"
"""Tag of the files holding the end-of-input flush that followed a micro-batch
(``part-<batch id>-end.<fmt>``, see :mod:`spark_udf.flush`): named after the last micro-batch
whose state it flushed, so a rerun that flushes the same state overwrites it, and never a
micro-batch's own name."""


def _part_name(batch_id: int, fmt: str, tag: str = "") -> str:
    return f"part-{batch_id:012d}{'-' + tag if tag else ''}.{fmt}"


def _write_atomic(directory: str, name: str, write: Callable[[str], None]) -> None:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_rows(
    directory: str, batch_id: int, rows: pd.DataFrame, fmt: str, tag: str = ""
) -> None:
    name = _part_name(batch_id, fmt, tag)
    path = os.path.join(directory, name)
    if rows.empty:
        # A replay that produces nothing must not leave an earlier attempt's file behind.
        if os.path.exists(path):
            os.remove(path)
        return
    if fmt == "jsonl":

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as handle:
                for payload in rows["payload"]:
                    handle.write(payload)
                    handle.write("\n")

    else:

        def write(tmp: str) -> None:
            table = pa.Table.from_pandas(rows.reset_index(drop=True), preserve_index=False)
            pq.write_table(table, tmp)

    try:
        _write_atomic(directory, name, write)
    except OSError as exc:
        raise SinkError(f"cannot write batch {batch_id} to {directory}: {exc}") from exc


@dataclass
class BatchSink:
    """A ``foreachBatch`` function writing one file per micro-batch (idempotent by batch id).

    Parameters
    ----------
    out:
        Directory of match files.
    dead_letter:
        Directory of dead-letter files (``None``: dead letters are counted, not written).
    fmt:
        ``jsonl`` or ``parquet``.
    on_matches:
        Called as ``on_matches(batch_id, matches)`` after the batch's files are written, with
        the match objects (parsed payloads). A replayed batch calls it again with the same
        matches: deliver idempotently by ``match_id``.
    annotate:
        ``annotate(batch_id)`` gives fields added to each of the batch's match objects (the
        registry version a live query ran it with).

    Examples
    --------
    A batch of output rows (what :func:`spark_udf.detect` gives; Spark calls the sink with
    the batch's DataFrame), written twice as a replay would:

    >>> import os, shutil, tempfile
    >>> import pandas as pd
    >>> out = tempfile.mkdtemp()
    >>> rows = pd.DataFrame({
    ...     "kind": ["rule", "dead_letter"], "name": ["big", "bad_json"],
    ...     "match_id": ["m1", "d1"], "key": ['{"card_id":"c1"}', None],
    ...     "payload": ['{"name": "big", "match_id": "m1"}', '{"reason": "bad_json"}'],
    ...     "start": [None, None], "end": [None, None],
    ... })
    >>> sink = BatchSink(out, on_matches=lambda batch_id, matches: print(batch_id, matches))
    >>> sink.write_batch(rows, 7)
    7 [{'name': 'big', 'match_id': 'm1'}]
    >>> sink.write_batch(rows, 7)
    7 [{'name': 'big', 'match_id': 'm1'}]
    >>> os.listdir(out), sink.counters.matches, sink.counters.dead_letters
    (['part-000000000007.jsonl'], 2, 2)
    >>> read_outputs(out)
    [{'name': 'big', 'match_id': 'm1'}]
    >>> shutil.rmtree(out)
    """

    out: str
    dead_letter: str | None = None
    fmt: str = "jsonl"
    on_matches: MatchHook | None = None
    counters: SinkCounters = field(default_factory=SinkCounters)
    annotate: Callable[[int], Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise OperatorConfigError(f"sink format must be one of {FORMATS}, got {self.fmt!r}")

    def __call__(self, batch: Any, batch_id: int) -> None:
        """Write one micro-batch (``batch`` is the batch's static DataFrame)."""
        frame = batch.toPandas()
        self.write_batch(frame, batch_id)

    def write_batch(self, frame: pd.DataFrame, batch_id: int) -> None:
        """Write an already collected batch of output rows."""
        self._write(frame, batch_id, "")
        self.counters.batches += 1
        self.counters.last_batch_id = batch_id

    def write_end(self, frame: pd.DataFrame, batch_id: int) -> int:
        """Write the rows of the end-of-input flush that follows micro-batch ``batch_id``
        (files ``part-<batch id>-end.*``, replaced when the same state is flushed again);
        returns the number of matches. ``on_matches`` gets them with ``batch_id``."""
        return self._write(frame, batch_id, END_TAG)

    def _write(self, frame: pd.DataFrame, batch_id: int, tag: str) -> int:
        frame = frame.sort_values(["kind", "name", "match_id"], kind="stable")
        counted = frame["kind"].isin(COUNT_KINDS)
        if counted.any():
            self._add_counts(frame[counted])
            frame = frame[~counted]
        is_dead = frame["kind"] == DEAD_LETTER
        matches = frame[~is_dead]
        # Every processor reading a stream reports its bad events; a dead letter's id is a
        # hash of its content, so the copies of one are one row.
        dead = frame[is_dead].drop_duplicates("match_id")
        extra = self.annotate(batch_id) if self.annotate is not None else None
        if extra and len(matches):
            matches = matches.assign(payload=[
                json.dumps({**json.loads(p), **extra}, separators=(",", ":"))
                for p in matches["payload"]
            ])
        _write_rows(self.out, batch_id, matches, self.fmt, tag)
        if self.dead_letter is not None:
            _write_rows(self.dead_letter, batch_id, dead, self.fmt, tag)
        counters = self.counters
        counters.matches += len(matches)
        counters.dead_letters += len(dead)
        counters.late += int((dead["name"] == "late").sum())
        if self.on_matches is not None and len(matches):
            self.on_matches(batch_id, [json.loads(p) for p in matches["payload"]])
        return len(matches)

    def _add_counts(self, rows: pd.DataFrame) -> None:
        """Add the operator's count rows (:data:`~spark_udf.records.COUNT_KINDS`) to the
        counters."""
        counters = self.counters
        for kind, payload in zip(rows["kind"], rows["payload"], strict=True):
            row = json.loads(payload)
            if kind == HELD:
                counters.held[row["rule"]] = counters.held.get(row["rule"], 0) + int(row["held"])
            elif kind == UNCORRECTED:
                counters.uncorrected += int(row["uncorrected"])


def _part_files(directory: str, *, flushes: bool = True) -> Iterator[str]:
    if not os.path.isdir(directory):
        return
    names = [
        n for n in os.listdir(directory)
        if n.startswith("part-") and not n.endswith(".tmp")
        and (flushes or not n.partition(".")[0].endswith(f"-{END_TAG}"))
    ]
    # By the name before its extension: a micro-batch's file, then the flush that followed it.
    for name in sorted(names, key=lambda n: n.partition(".")[0]):
        yield os.path.join(directory, name)


def read_batch(directory: str, batch_id: int) -> list[dict[str, Any]]:
    """The objects a :class:`BatchSink` wrote to ``directory`` for micro-batch ``batch_id``
    (none when it wrote no file: a batch without output). Final once Spark committed the
    batch: only an uncommitted batch is run again.

    Examples
    --------
    >>> import shutil, tempfile
    >>> out = tempfile.mkdtemp()
    >>> rows = pd.DataFrame({"kind": ["rule"], "name": ["big"], "match_id": ["m1"],
    ...                      "payload": ['{"name": "big", "match_id": "m1"}']})
    >>> BatchSink(out).write_batch(rows, 3)
    >>> read_batch(out, 3), read_batch(out, 4)
    ([{'name': 'big', 'match_id': 'm1'}], [])
    >>> shutil.rmtree(out)
    """
    rows: list[dict[str, Any]] = []
    for fmt in FORMATS:
        path = os.path.join(directory, _part_name(batch_id, fmt))
        if os.path.exists(path):
            rows.extend(_read_part(path))
    return rows


def _read_part(path: str) -> list[dict[str, Any]]:
    """The objects of one part file: match objects (``jsonl``), the operator's rows
    (``parquet``)."""
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    return []


def read_outputs(directory: str, *, flushes: bool = True) -> list[dict[str, Any]]:
    """Every object a :class:`BatchSink` wrote to ``directory``, in batch order, each
    end-of-input flush after the micro-batch it followed (``flushes=False`` leaves them out).

    ``jsonl`` files give the match objects; ``parquet`` files give the operator's rows.
    """
    rows: list[dict[str, Any]] = []
    for path in _part_files(directory, flushes=flushes):
        rows.extend(_read_part(path))
    return rows
