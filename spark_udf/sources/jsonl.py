"""The ``vigil_jsonl`` source: a JSON-lines file, or a directory of them, read through Spark's
Python Data Source API with line numbers as offsets, so a restarted query re-reads exactly the
uncommitted lines."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cep.events.limits import line_text
from spark_udf.batch import END_MARK_STREAM
from spark_udf.errors import OperatorConfigError, SourceError
from spark_udf.routing import ROUTED_SCHEMA, RoutePlan, route_plan_batches
from spark_udf.sources.rows import (
    ARROW_SCHEMA,
    SOURCE_SCHEMA,
    live_of,
    option_object,
    option_text,
    pinned,
    positive_int,
    source_batch,
)

__all__ = [
    "EndMark",
    "JsonLinesIndex",
    "JsonLinesSource",
    "LineSlice",
    "end_mark_row",
    "read_slice",
    "route_option",
]

_INDEX_EVERY = 4096
_LINES_PER_PARTITION = 200_000
_DEFAULT_MAX_RECORDS = 100_000
_BATCH_LINES = 65_536
_READ_BYTES = 1 << 23
_NEWLINE, _SPACE, _DELETE = 0x0A, 0x20, 0x7F


@dataclass(frozen=True)
class LineSlice(InputPartition):
    """Lines ``[first_line, first_line + count)`` of one file; ``byte_offset`` is where line
    ``first_line - skip`` starts, ``first_seq`` the global position of ``first_line``."""

    path: str
    byte_offset: int
    skip: int
    count: int
    first_seq: int


@dataclass
class _FileLines:
    scanned: int = 0  # bytes up to the end of the last complete line
    lines: int = 0
    checkpoints: list[int] | None = None  # byte offset of line i * _INDEX_EVERY


class JsonLinesIndex:
    """Counts the complete lines of a file or a directory of files (name order) and remembers
    where every few thousandth line starts, so a range of positions maps to file slices.

    A line counts once its newline is written, so a file being appended to is read safely.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._files: dict[str, _FileLines] = {}

    def files(self) -> list[str]:
        """The input files in reading order."""
        if os.path.isfile(self.path):
            return [self.path]
        if not os.path.isdir(self.path):
            raise SourceError(f"events path {self.path!r} is neither a file nor a directory")
        names = sorted(
            n for n in os.listdir(self.path)
            if not n.startswith((".", "_")) and not n.endswith((".tmp", ".crc"))
        )
        return [p for n in names if os.path.isfile(p := os.path.join(self.path, n))]

    def refresh(self) -> int:
        """Scan new bytes; return the total number of complete lines."""
        total = 0
        for path in self.files():
            info = self._files.setdefault(path, _FileLines(checkpoints=[0]))
            size = os.path.getsize(path)
            if size > info.scanned:
                self._scan(path, info)
            total += info.lines
        return total

    def counts(self) -> list[tuple[str, int]]:
        """Each input file's name (without its directory) and complete lines, in reading
        order, after a :meth:`refresh`."""
        self.refresh()
        return [(os.path.basename(path), self._files[path].lines) for path in self.files()
                if path in self._files]

    @staticmethod
    def _scan(path: str, info: _FileLines) -> None:
        assert info.checkpoints is not None
        with open(path, "rb") as handle:
            handle.seek(info.scanned)
            offset = info.scanned
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                offset += len(line)
                info.lines += 1
                if info.lines % _INDEX_EVERY == 0:
                    info.checkpoints.append(offset)
            info.scanned = offset

    def slices(self, start: int, end: int, per_partition: int) -> list[LineSlice]:
        """File slices covering global positions ``[start, end)``."""
        out: list[LineSlice] = []
        base = 0
        for path in self.files():
            info = self._files.get(path)
            if info is None:
                break
            lo, hi = max(start, base), min(end, base + info.lines)
            while lo < hi:
                n = min(hi - lo, per_partition)
                line = lo - base
                block = line // _INDEX_EVERY
                assert info.checkpoints is not None
                out.append(
                    LineSlice(path, info.checkpoints[block], line - block * _INDEX_EVERY, n, lo)
                )
                lo += n
            base += info.lines
            if base >= end:
                break
        return out


def read_slice(part: LineSlice) -> Iterator[pa.RecordBatch]:
    """The non-blank lines of a slice as ``(_seq, _event)`` Arrow batches.

    Lines are read in blocks and cut at their newlines with numpy: a block whose lines all
    start and end with a visible ASCII character and hold valid UTF-8 becomes its text column
    without a Python string per line. Any other block (blank lines, surrounding white space,
    ``\\r\\n`` endings, bytes that are not UTF-8) is read line by line, each line decoded and
    stripped, so both ways give the same rows; a line that is not UTF-8 comes out marked
    (:func:`cep.events.limits.line_text`), and the operator dead-letters it as
    ``invalid_utf8``, as the embedded engine reading the file does.
    """
    with open(part.path, "rb") as handle:
        handle.seek(part.byte_offset)
        for _ in range(part.skip):
            handle.readline()
        seq, remaining, rest = part.first_seq, part.count, b""
        while remaining > 0:
            chunk = handle.read(_READ_BYTES)
            data = rest + chunk if rest else chunk
            if not data:
                break
            ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == _NEWLINE)
            if not chunk and (not len(ends) or ends[-1] != len(data) - 1):
                ends = np.append(ends, len(data))  # the file's last line has no newline
            ends = ends[:remaining]
            for lo in range(0, len(ends), _BATCH_LINES):
                block = ends[lo:lo + _BATCH_LINES]
                start = 0 if lo == 0 else int(ends[lo - 1]) + 1
                batch = _lines_batch(data, start, block, seq)
                if batch.num_rows:
                    yield batch
                seq += len(block)
            remaining -= len(ends)
            if not chunk:
                break
            rest = data[int(ends[-1]) + 1:] if len(ends) else data


def _lines_batch(data: bytes, start: int, ends: np.ndarray, first_seq: int) -> pa.RecordBatch:
    """The lines of ``data`` from ``start`` up to each newline position in ``ends``."""
    n = len(ends)
    bytes_ = np.frombuffer(data, dtype=np.uint8)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = start
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    if lengths.all():
        firsts, lasts = bytes_[starts], bytes_[ends - 1]
        if (
            ((firsts > _SPACE) & (firsts < _DELETE)).all()
            and ((lasts > _SPACE) & (lasts < _DELETE)).all()
        ):
            # The lines' bytes without their newlines, and where each line starts in them.
            body = bytes_[start:int(ends[-1])]
            kept = body[body != _NEWLINE]
            offsets = np.empty(n + 1, dtype=np.int64)
            offsets[0] = 0
            offsets[1:] = np.cumsum(lengths)
            texts = pa.LargeStringArray.from_buffers(
                n, pa.py_buffer(offsets), pa.py_buffer(kept)
            )
            try:
                texts.validate(full=True)
            except pa.ArrowInvalid:
                pass  # not UTF-8: decoded line by line below, the bad lines marked
            else:
                seqs = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64))
                return pa.RecordBatch.from_arrays(
                    [seqs, texts.cast(pa.string())], schema=ARROW_SCHEMA
                )
    seqs_list: list[int] = []
    texts_list: list[str] = []
    for i, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        text = line_text(data[lo:hi])
        if text:
            seqs_list.append(first_seq + i)
            texts_list.append(text)
    return source_batch(seqs_list, texts_list)


@dataclass(frozen=True)
class EndMark(InputPartition):
    """The partition holding the end-of-input mark: one row after the last line."""

    seq: int


def end_mark_row() -> str:
    """The JSON text of the end-of-input mark (see :data:`spark_udf.batch.END_MARK_STREAM`)."""
    return json.dumps({"stream": END_MARK_STREAM})


def route_option(plan: RoutePlan) -> str:
    """A route plan as the text of the source's ``route`` option (see :func:`read_jsonl
    <spark_udf.sources.read_jsonl>`)."""
    return option_text(plan)


def _route_of(options: dict[str, str]) -> RoutePlan | None:
    text = options.get("route")
    if not text:
        return None
    plan = option_object(text)
    if not isinstance(plan, RoutePlan):
        raise OperatorConfigError("the vigil_jsonl 'route' option does not hold a route plan")
    return plan


class _JsonLinesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.index = JsonLinesIndex(options["path"])
        self.route = _route_of(options)
        self.live = live_of(options)
        self.max_records = positive_int(options, "maxRecordsPerBatch", _DEFAULT_MAX_RECORDS)
        self.per_partition = positive_int(options, "linesPerPartition", _LINES_PER_PARTITION)
        self.min_partitions = positive_int(options, "minPartitions", 1)
        flag = options.get("endOfInput", options.get("endofinput", "false"))
        self.end_of_input = str(flag).lower() == "true"
        self.target: int | None = None

    def initialOffset(self) -> dict:
        return {"line": 0}

    def _pinned(self, offset: dict) -> dict:
        return offset if offset.get("end") else pinned(self.live, offset)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.index.refresh()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if start.get("end"):
            return start  # the end-of-input mark was read: nothing follows it
        available = self.index.refresh()
        if self.target is not None:
            available = min(available, self.target)
        first = int(start["line"])
        if (
            self.end_of_input and self.target is not None and first >= self.target
            and available <= first
        ):
            # every line of the finite input is read: one more offset for the mark
            return {"line": first, "end": 1}
        if isinstance(limit, ReadMaxRows):
            available = min(available, first + limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            available = min(available, first + self.max_records)
        return self._pinned({"line": max(first, available)})

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self.index.refresh()
        first, last = int(start["line"]), int(end["line"])
        # At least minPartitions tasks per micro-batch, so every core reads (and, with a
        # route, parses and packs) an even share.
        even = -(-(last - first) // self.min_partitions) if last > first else 1
        parts: list[InputPartition] = list(
            self.index.slices(first, last, max(1, min(self.per_partition, even)))
        )
        if end.get("end") and not start.get("end"):
            parts.append(EndMark(int(end["line"])))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, EndMark):
            mark = source_batch([partition.seq], [end_mark_row()])
            batches: Iterator[pa.RecordBatch] = iter([mark])
        else:
            assert isinstance(partition, LineSlice)
            batches = read_slice(partition)
        route = self.route
        if self.live is not None and route is not None:
            route = self.live.for_task().plan
            if route is None:  # this micro-batch's program has no keyed processor
                return
        if route is None:
            yield from batches
        else:
            # Route in the reading task itself: no row reaches the JVM, only one blob per
            # bucket and processor (see spark_udf.routing).
            yield from route_plan_batches(batches, route)


class _JsonLinesBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.index = JsonLinesIndex(options["path"])
        self.per_partition = positive_int(options, "linesPerPartition", _LINES_PER_PARTITION)

    def partitions(self) -> Sequence[InputPartition]:
        total = self.index.refresh()
        return self.index.slices(0, total, self.per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LineSlice)
        yield from read_slice(partition)


class JsonLinesSource(DataSource):
    """``spark.readStream.format("vigil_jsonl").option("path", ...)``: a JSON-lines file, or a
    directory of them read in name order, as ``(_seq, _event)`` rows.

    Options: ``path`` (required), ``maxRecordsPerBatch`` (lines per micro-batch, default
    100000), ``linesPerPartition`` (at most this many lines per Spark task, default 200000),
    ``minPartitions`` (at least this many tasks per micro-batch, default 1), ``endOfInput``,
    ``route`` (streaming only, set by :func:`read_jsonl`): a route plan, with which the
    source hands over routed rows (:data:`spark_udf.routing.ROUTED_SCHEMA`) ready for
    :func:`spark_udf.operator.detect_plan`, and ``live`` (streaming only): a
    :class:`spark_udf.live.LiveProgram`, whose newest program the source pins into each
    micro-batch's offsets and whose pinned program routes the batch's rows. Works as a batch
    source too (``spark.read``), with the same ``_seq``.
    """

    @classmethod
    def name(cls) -> str:
        return "vigil_jsonl"

    def schema(self) -> str:
        return ROUTED_SCHEMA if self.options.get("route") else SOURCE_SCHEMA

    def _checked(self) -> dict[str, str]:
        options = dict(self.options)
        if not options.get("path"):
            raise OperatorConfigError("the vigil_jsonl source needs a 'path' option")
        return options

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _JsonLinesStreamReader(self._checked())

    def reader(self, schema: Any) -> DataSourceReader:
        options = self._checked()
        if options.get("route"):
            raise OperatorConfigError("the vigil_jsonl 'route' option is for streaming reads")
        return _JsonLinesBatchReader(options)
