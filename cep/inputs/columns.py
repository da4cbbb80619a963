"""A chunk of JSON lines parsed column by column: ``pyarrow.json`` turns a run of lines into
columns in C, and only the lines it refuses or cannot represent faithfully go through the
one-line parser (:func:`cep.events.event.parse_json_line`), so that the batches handed to
:meth:`cep.engine.Engine.feed_batch` and the dead letters between them are those that parsing
every line on its own would give.

A run of lines is read column-wise when every line of it is a JSON object with values
``pyarrow`` represents as the one-line parser does: numbers that fit a 64-bit integer or are
finite doubles, strings, booleans, nulls, and lists of strings, integers or booleans. Anything
else — a line that is not UTF-8, too large or possibly too deep (see :mod:`cep.events.limits`),
``NaN`` or ``Infinity``, a field whose type changes between lines, objects or other nested
values, an integer beyond 64 bits, a duplicate key — sends the line, or its run, to the
one-line parser, which reports it as it always has.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
from pyarrow import json as pa_json

from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    DeadLetter,
    EventReason,
    dead_letter,
    parse_json_line,
)
from cep.events.limits import INVALID_UTF8_MARK, too_large_detail
from cep.inputs.chunks import Chunk
from cep.inputs.lines import LineBlock, LongLine

__all__ = ["EventBatch", "LineParser", "Piece", "long_line_letter", "parse_line"]

_ROW = re.compile(r"in row (\d+)")
_INT64_LIMIT = 2.0**63
_MAX_RETRIES = 8
"""Column-wise attempts per chunk after a refusal; past them the chunk's runs are parsed line
by line (a file of mostly bad lines must not cost one ``pyarrow`` parse per line)."""

_MAX_SKIP = 64

_THREADS = max(1, min(4, os.cpu_count() or 1))
_PARALLEL_BYTES = 1 << 20
"""Runs of more bytes than this are parsed by ``pyarrow``'s threads, a block each."""

_PLAIN = (pa.types.is_int64, pa.types.is_string, pa.types.is_boolean, pa.types.is_null)
_TIMES = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_time)


@dataclass(frozen=True)
class EventBatch:
    """Events for one :meth:`~cep.engine.Engine.feed_batch` call: the frame and, per row, its
    source, line number, position in its input and text (for dead letters)."""

    frame: pd.DataFrame
    source: str | Sequence[str]
    lines: np.ndarray
    positions: np.ndarray
    raw: Sequence[str]

    def __len__(self) -> int:
        return len(self.frame)


Piece = EventBatch | DeadLetter
"""What a chunk becomes, in order: batches of events, and the dead letters of the lines that
are none (between them, where the lines were)."""


class _Lines:
    """The event lines of a chunk as columns: each one's block, index there, line number and
    position; and what the lines parsed alone gave (the lines that cannot go column-wise)."""

    def __init__(self, chunk: Chunk) -> None:
        blocks: list[LineBlock] = []
        block_of, index, fast = [], [], []
        for segment in chunk.segments:
            block = segment.block
            found = segment.lo + np.flatnonzero(block.records[segment.lo:segment.hi])
            block_of.append(np.full(len(found), len(blocks), dtype=np.int64))
            index.append(found)
            fast.append(block.eligible[found])
            blocks.append(block)
        self.blocks = blocks
        self.block_of = np.concatenate(block_of) if block_of else np.zeros(0, np.int64)
        self.index = np.concatenate(index) if index else np.zeros(0, np.int64)
        self.fast = np.concatenate(fast) if fast else np.zeros(0, bool)
        firsts = np.array([b.first_line for b in blocks], dtype=np.int64)
        self.line = firsts[self.block_of] + self.index if blocks else np.zeros(0, np.int64)
        self.position = chunk.first_position + np.arange(len(self.index), dtype=np.int64)
        #: record -> (event, letter) of a line parsed alone
        self.alone: dict[int, tuple[dict[str, Any] | None, DeadLetter | None]] = {}

    def __len__(self) -> int:
        return len(self.index)

    def block(self, record: int) -> LineBlock:
        return self.blocks[int(self.block_of[record])]

    def text(self, record: int) -> str:
        return self.block(record).text(int(self.index[record]))

    def source(self, record: int) -> str:
        return self.block(record).source


class _RawTexts(Sequence[str]):
    """The texts of a batch's lines, decoded only when a dead letter asks for one."""

    def __init__(self, lines: _Lines, records: np.ndarray) -> None:
        self._lines = lines
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return [self._lines.text(int(r)) for r in self._records[row]]
        return self._lines.text(int(self._records[int(row)]))


class LineParser:
    """Parses the chunks of one input into :data:`Piece` lists, column-wise where it can.

    Parameters
    ----------
    stream:
        The stream every event of the input is bound to (``--events STREAM=PATH``), set as
        each event's ``stream`` field, or ``None``.
    columnar:
        ``False`` parses every line on its own (the reference the column-wise parse equals).

    Examples
    --------
    >>> import io
    >>> from cep.inputs.chunks import chunked
    >>> from cep.inputs.lines import LineReader
    >>> data = io.BytesIO(b'{"a": 1}\\n\\n{"a": 2}\\n{broken\\n{"a": 3}\\n')
    >>> [chunk] = chunked([LineReader(data.read, "events.jsonl").block()])
    >>> for piece in LineParser().pieces(chunk):
    ...     if isinstance(piece, EventBatch):
    ...         print(piece.frame["a"].tolist(), piece.lines.tolist(), piece.positions.tolist())
    ...     else:
    ...         print(piece["reason"], piece["line"])
    [1, 2] [1, 3] [0, 1]
    invalid_json 4
    [3] [5] [3]
    """

    def __init__(self, stream: str | None = None, *, columnar: bool = True) -> None:
        self.stream = stream
        self.columnar = columnar
        self._strings: dict[str, pa.DataType] = {}  # fields pyarrow would read as times
        # Chunks whose runs pyarrow could not represent (objects in every line, say) in a row,
        # and how many chunks to parse line by line before trying column-wise again.
        self._misses = 0
        self._skip = 0
        self._chunk_outcomes: list[bool] = []

    def pieces(self, chunk: Chunk) -> list[Piece]:
        """The batches and dead letters of ``chunk``, in line order."""
        lines = _Lines(chunk)
        if not len(lines):
            return []
        for record in np.flatnonzero(~lines.fast).tolist():
            lines.alone[record] = self._alone(lines, record)
        letters = [r for r, (_, letter) in sorted(lines.alone.items()) if letter is not None]
        out: list[Piece] = []
        columnar = self.columnar and not self._skip
        self._skip = max(self._skip - 1, 0)
        self._chunk_outcomes = []
        retries = [0 if columnar else _MAX_RETRIES]
        start = 0
        for stop in [*letters, len(lines)]:
            self._run(lines, start, stop, out, retries)
            if stop < len(lines):
                out.append(lines.alone[stop][1])
            start = stop + 1
        if self._chunk_outcomes:
            if any(self._chunk_outcomes):
                self._misses = 0
            else:  # back off: 1, 2, 4 ... 64 chunks line by line before the next attempt
                self._misses += 1
                self._skip = min(2 ** (self._misses - 1), _MAX_SKIP)
        return out

    # ------------------------------------------------------------------ one line alone

    def _alone(
        self, lines: _Lines, record: int
    ) -> tuple[dict[str, Any] | None, DeadLetter | None]:
        block, index = lines.block(record), int(lines.index[record])
        long = block.long_lines.get(index)
        if long is not None:
            return None, long_line_letter(block, index, long, int(lines.line[record]))
        return parse_line(block.text(index), block.source, int(lines.line[record]), self.stream)

    # ------------------------------------------------------------------ runs

    def _run(
        self, lines: _Lines, start: int, stop: int, out: list[Piece], retries: list[int]
    ) -> None:
        """Append the pieces of records ``start`` to ``stop``, which no dead letter found so
        far interrupts."""
        if start >= stop:
            return
        fast = bool(lines.fast[start:stop].all())
        if fast and retries[0] < _MAX_RETRIES:
            outcome = self._columns(lines, start, stop)
            self._chunk_outcomes.append(isinstance(outcome, EventBatch))
            if isinstance(outcome, EventBatch):
                out.append(outcome)
                return
            retries[0] += 1
            if outcome is not None:  # the row pyarrow refused: the line parsed alone
                record = start + outcome
                parsed = parse_line(
                    lines.text(record), lines.source(record), int(lines.line[record]),
                    self.stream,
                )
                lines.alone[record] = parsed
                if parsed[1] is not None:
                    self._run(lines, start, record, out, retries)
                    out.append(parsed[1])
                    self._run(lines, record + 1, stop, out, retries)
                    return
        self._by_line(lines, start, stop, out)

    def _by_line(self, lines: _Lines, start: int, stop: int, out: list[Piece]) -> None:
        """Each line of records ``start`` to ``stop`` parsed alone: runs of events as batches,
        the other lines' dead letters in their places."""
        kept: list[int] = []
        events: list[dict[str, Any]] = []
        for record in range(start, stop):
            parsed = lines.alone.get(record)
            if parsed is None:
                parsed = parse_line(
                    lines.text(record), lines.source(record), int(lines.line[record]),
                    self.stream,
                )
            event, letter = parsed
            if letter is not None:
                if kept:
                    out.append(_batch(pd.DataFrame.from_records(events), lines, kept))
                kept, events = [], []
                out.append(letter)
            else:
                kept.append(record)
                events.append(event)
        if kept:
            out.append(_batch(pd.DataFrame.from_records(events), lines, kept))

    # ------------------------------------------------------------------ column-wise

    def _columns(self, lines: _Lines, start: int, stop: int) -> EventBatch | int | None:
        """Records ``start`` to ``stop`` parsed column-wise; else the row ``pyarrow`` refused
        (to be parsed alone), or ``None`` when they are to be parsed line by line."""
        data = _joined(lines, start, stop)
        n = stop - start
        try:
            table = _read(data, self._strings)
        except pa.ArrowInvalid:
            try:  # again in one block, for the number of the row refused
                table = _read(data, self._strings, threads=False)
            except pa.ArrowInvalid as exc:
                found = _ROW.search(str(exc))
                row = int(found.group(1)) if found else -1
                return row if 0 <= row < n else None
            except (pa.ArrowException, UnicodeError):
                return None
        except (pa.ArrowException, UnicodeError):
            return None
        if table.num_rows != n:
            return None  # a line held more than one object
        times = [f.name for f in table.schema if any(t(f.type) for t in _TIMES)]
        if times:
            # pyarrow reads text that looks like a time as a time: read it as text instead.
            self._strings.update((name, pa.string()) for name in times)
            return self._columns(lines, start, stop)
        if self._strings:
            table = _in_line_order(table, data, lines.text(start))
            if table is None:
                return None
        lists: dict[str, pd.Series] = {}
        for name, column in zip(table.column_names, table.columns, strict=True):
            kind = column.type
            if any(test(kind) for test in _PLAIN):
                continue
            if pa.types.is_float64(kind):
                if not _faithful_doubles(column):
                    return None
                continue
            if pa.types.is_list(kind) and any(t(kind.value_type) for t in _PLAIN):
                lists[name] = pd.Series(_python_lists(column), dtype=object)
                continue
            return None  # objects, lists of doubles or of lists: parsed line by line
        frame = table.to_pandas()
        for name, values in lists.items():
            frame[name] = values
        if self.stream is not None:
            frame[STREAM_FIELD] = self.stream
        return _batch(frame, lines, np.arange(start, stop))


def parse_line(
    text: str, source: str, line: int, stream: str | None = None
) -> tuple[dict[str, Any] | None, DeadLetter | None]:
    """One line parsed alone: its event (bound to ``stream`` when given), or its dead
    letter."""
    try:
        event = parse_json_line(text)
    except BadEventError as exc:
        return None, dead_letter(exc.reason, exc.detail, input=source, line=line, raw=text)
    if stream is not None:
        event[STREAM_FIELD] = stream
    return event, None


def _read(
    data: bytes | memoryview, strings: dict[str, pa.DataType], *, threads: bool = True
) -> pa.Table:
    """``data`` parsed by ``pyarrow.json``: in blocks parsed by its threads, or, with
    ``threads=False``, as one block, so that a refused row's number counts from the start."""
    size = len(data) + 1
    if threads and size > _PARALLEL_BYTES:
        size = -(-size // _THREADS)
    options = pa_json.ReadOptions(use_threads=threads, block_size=max(size, 1 << 16))
    parse = (
        pa_json.ParseOptions(explicit_schema=pa.schema(list(strings.items())))
        if strings else None
    )
    return pa_json.read_json(pa.BufferReader(pa.py_buffer(data)), read_options=options,
                             parse_options=parse)


def _in_line_order(table: pa.Table, data: bytes | memoryview, first: str) -> pa.Table | None:
    """``table`` (read with some fields as text) with only the columns the lines hold, in the
    order they first appear, as a read without an explicit schema gives them."""
    try:
        names = list(parse_json_line(first))
    except BadEventError:
        return None
    if set(names) != set(table.column_names):
        try:
            names = _read(data, {}).column_names
        except (pa.ArrowException, UnicodeError):
            return None
    return table.select(names)


def _joined(lines: _Lines, start: int, stop: int) -> bytes | memoryview:
    """Records ``start`` to ``stop``, one a line, as one buffer (a view of their block when
    they follow each other there, the usual case)."""
    block_of, index = lines.block_of[start:stop], lines.index[start:stop]
    # Where the next record is not the next line of the same block, a new piece begins.
    cuts = np.flatnonzero((np.diff(block_of) != 0) | (np.diff(index) != 1)) + 1
    bounds = [0, *cuts.tolist(), stop - start]
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        block = lines.blocks[int(block_of[lo])]
        first, last = int(index[lo]), int(index[hi - 1])
        pieces.append(memoryview(block.data)[int(block.starts[first]):int(block.ends[last])])
    if len(pieces) == 1:
        return pieces[0]
    return b"\n".join(pieces)


def _faithful_doubles(column: pa.ChunkedArray) -> bool:
    """Whether a column of doubles holds what the one-line parser reads: no ``NaN`` nor
    ``Infinity`` (pyarrow accepts them) and no integer beyond 64 bits read as a double."""
    if column.null_count == len(column):
        return True
    if column.null_count:
        column = column.fill_null(0.0)
    values = column.to_numpy()
    # One pass: NaN makes the maximum NaN, and NaN < x is false, as inf < x is.
    return bool(np.abs(values).max() < _INT64_LIMIT)


def _python_lists(column: pa.ChunkedArray) -> list[list[Any] | None]:
    """A list column as Python lists (``[]``, ``[None]`` ... for lists of nulls, which
    ``to_pylist`` of this pyarrow cannot convert)."""
    if not pa.types.is_null(column.type.value_type):
        return column.to_pylist()
    lengths = pa.compute.list_value_length(column).to_pylist()
    return [None if n is None else [None] * n for n in lengths]


def _batch(frame: pd.DataFrame, lines: _Lines, records: np.ndarray | list[int]) -> EventBatch:
    records = np.asarray(records, dtype=np.int64)
    used = np.unique(lines.block_of[records])
    sources = {lines.blocks[int(b)].source for b in used}
    if len(sources) == 1:
        source: str | list[str] = sources.pop()
    else:
        names = np.array([b.source for b in lines.blocks], dtype=object)
        source = names[lines.block_of[records]].tolist()
    return EventBatch(
        frame, source, lines.line[records], lines.position[records], _RawTexts(lines, records)
    )


def long_line_letter(block: LineBlock, index: int, long: LongLine, line: int) -> DeadLetter:
    """The dead letter of a line too long to hold: its head only, and the reason the one-line
    parser would give (bytes that are not UTF-8 come first)."""
    head = block.data[int(block.starts[index]):int(block.ends[index])]
    shown = head.decode("utf-8", "ignore" if long.utf8 else "backslashreplace").strip()
    reason, detail = EventReason.TOO_LARGE, too_large_detail(long.size)
    if not long.utf8:
        try:
            parse_json_line(INVALID_UTF8_MARK)
        except BadEventError as exc:
            reason, detail = exc.reason, exc.detail
    return dead_letter(reason, detail, input=block.source, line=line, raw=shown + " ...")
