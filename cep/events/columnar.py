"""Rows of scan-only streams held as columns until the watermark releases them.

When every rule reading a stream runs as a scan (:func:`cep.nfa.strict.qualifies`), the engine
keeps that stream's accepted rows in a :class:`ColumnBuffer` instead of building an
:class:`~cep.events.event.Event` per row and a reorder-buffer entry for it. The watermark releases
them as a :class:`Block`: the rows in ``(ts, seq)`` order, read column by column for the
rules' conditions and keys. An :class:`~cep.events.event.Event` is built only for the rows a match,
a run left alive or a key's ``prev`` history needs, equal to the one
:meth:`cep.events.event.StreamSchema.events_from_frame` builds for the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from cep.events.event import (
    SEQ_FIELD,
    STREAM_FIELD,
    Event,
    StreamSchema,
    _column_values,
    _fallback_id,
)

__all__ = ["Block", "Chunk", "ColumnBuffer", "Rows"]


class Chunk:
    """Rows of one stream that arrived together (normalised by
    :meth:`cep.events.event.StreamSchema.normalise_frame`), not all released yet.

    Parameters
    ----------
    schema:
        The stream's schema.
    frame:
        The normalised rows.
    ts, seqs, positions:
        Per row: event time (int ms), arrival sequence number and input position.
    width:
        The number of rule slots when the rows arrived: rules registered later (slot ``>=
        width``) do not see them.
    """

    __slots__ = (
        "stream", "schema", "frame", "names", "ts", "seqs", "positions", "width", "live",
        "_columns", "_ids", "_all",
    )

    def __init__(
        self,
        schema: StreamSchema,
        frame: pd.DataFrame,
        ts: np.ndarray,
        seqs: np.ndarray,
        positions: np.ndarray,
        width: int,
    ) -> None:
        self.stream = schema.name
        self.schema = schema
        self.frame = frame
        self.names = [str(c) for c in frame.columns if c != STREAM_FIELD and c != SEQ_FIELD]
        self.ts = np.asarray(ts, dtype=np.int64)
        self.seqs = np.asarray(seqs, dtype=np.int64)
        self.positions = np.asarray(positions, dtype=np.int64)
        self.width = width
        self.live = np.arange(len(self.ts))
        self._columns: dict[str, list[Any]] = {}
        self._ids: list[Any] | None = None
        self._all: list[list[Any]] | None = None

    def column(self, name: str) -> list[Any]:
        """A field's value in every row (``None`` where absent), as the row's event holds it."""
        values = self._columns.get(name)
        if values is None:
            if name not in self.names:
                values = [None] * len(self.ts)
            elif name == self.schema.time_field:
                values = self.frame[name].to_numpy(dtype=np.int64).tolist()
            else:
                values = _column_values(self.frame[name])
            self._columns[name] = values
        return values

    def ids(self) -> list[Any]:
        """Every row's event id."""
        if self._ids is None:
            id_field = self.schema.id_field
            if id_field in self.names:
                self._ids = [
                    v if (type(v) is str or type(v) is int) else _fallback_id(v, pos)
                    for v, pos in zip(
                        self.column(id_field), self.positions.tolist(), strict=True
                    )
                ]
            else:
                self._ids = self.positions.tolist()
        return self._ids

    def fields(self, row: int) -> dict[str, Any]:
        """The field values of one row's event."""
        columns = self._all
        if columns is None:
            columns = self._all = [self.column(name) for name in self.names]
        return dict(zip(self.names, [c[row] for c in columns], strict=True))

    def event(self, row: int) -> Event:
        """The event of one row."""
        return Event(
            self.ids()[row], self.stream, int(self.ts[row]), int(self.seqs[row]),
            self.fields(row),
        )


class Block:
    """Released rows of one stream, in a given order (``(ts, seq)`` when released).

    Parameters
    ----------
    stream:
        The stream of every row.
    chunks:
        The chunks the rows come from.
    which, rows:
        Per row: index into ``chunks`` and row within that chunk.
    """

    __slots__ = (
        "stream", "chunks", "which", "rows", "_columns", "_times", "_ids", "_seqs", "_records",
    )

    def __init__(
        self, stream: str, chunks: Sequence[Chunk], which: np.ndarray, rows: np.ndarray
    ) -> None:
        self.stream = stream
        self.chunks = list(chunks)
        self.which = which
        self.rows = rows
        self._columns: dict[str, list[Any]] = {}
        self._times: list[int] | None = None
        self._ids: list[Any] = []
        self._seqs: list[int] = []
        self._records: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list[Any]:
        """A field's values over the block's rows, in order."""
        values = self._columns.get(name)
        if values is None:
            values = self._columns[name] = self._gather([c.column(name) for c in self.chunks])
        return values

    def times(self) -> list[int]:
        """Every row's event time (int ms), in order."""
        if self._times is None:
            self._times = self._gather_array([c.ts for c in self.chunks]).tolist()
        return self._times

    def seqs(self) -> np.ndarray:
        """Every row's arrival sequence number, in order."""
        return self._gather_array([c.seqs for c in self.chunks])

    def widths(self) -> np.ndarray:
        """Every row's chunk width (rule slots when it arrived), in order."""
        return np.array([c.width for c in self.chunks], dtype=np.int64)[self.which]

    def select(self, index: np.ndarray) -> Block:
        """The rows at ``index`` (positions in this block), in that order."""
        return Block(self.stream, self.chunks, self.which[index], self.rows[index])

    def event(self, i: int) -> Event:
        """The event of row ``i``.

        The first call builds every row's field dict at once (a scan needs most rows' events
        for its matches); the events of one row share their field dict.
        """
        if not self._records:
            self._build()
        return Event(self._ids[i], self.stream, self._times[i], self._seqs[i], self._records[i])

    def view(self, lo: int, hi: int) -> Rows:
        """Rows ``lo:hi`` as a sequence of events built on access."""
        return Rows(self, lo, hi)

    def _build(self) -> None:
        chunks = self.chunks
        self.times()
        self._seqs = self.seqs().tolist()
        self._ids = self._gather([c.ids() for c in chunks])
        names = chunks[0].names
        if all(c.names == names for c in chunks):
            columns = [self.column(name) for name in names]
            self._records = [
                dict(zip(names, row, strict=False)) for row in zip(*columns, strict=False)
            ]
        else:
            self._records = [
                chunks[c].fields(r)
                for c, r in zip(self.which.tolist(), self.rows.tolist(), strict=True)
            ]

    def _gather(self, columns: list[list[Any]]) -> list[Any]:
        rows = self.rows.tolist()
        if len(columns) == 1:
            column = columns[0]
            return [column[r] for r in rows]
        return [columns[c][r] for c, r in zip(self.which.tolist(), rows, strict=True)]

    def _gather_array(self, arrays: list[np.ndarray]) -> np.ndarray:
        if len(arrays) == 1:
            return arrays[0][self.rows]
        offsets = np.cumsum([0] + [len(a) for a in arrays[:-1]])
        return np.concatenate(arrays)[offsets[self.which] + self.rows]


class Rows(Sequence[Event]):
    """Rows ``lo:hi`` of a :class:`Block` as a read-only sequence of events."""

    __slots__ = ("block", "lo", "n")

    def __init__(self, block: Block, lo: int, hi: int) -> None:
        self.block = block
        self.lo = lo
        self.n = hi - lo

    def __len__(self) -> int:
        return self.n

    def event_columns(self) -> tuple[list[Any], str, list[int], list[dict[str, Any]], int]:
        """``(ids, stream, times, field dicts, lo)``: row ``i``'s event is made of the values
        at ``lo + i`` (what :func:`cep.nfa.strict.process_events` reads instead of events)."""
        block = self.block
        if not block._records:
            block._build()
        return block._ids, block.stream, block.times(), block._records, self.lo

    def __getitem__(self, i: Any) -> Any:
        if type(i) is int and 0 <= i < self.n:
            return self.block.event(self.lo + i)
        if isinstance(i, slice):
            return [self.block.event(self.lo + j) for j in range(*i.indices(self.n))]
        if -self.n <= i < 0:
            return self.block.event(self.lo + self.n + i)
        raise IndexError(i)


class ColumnBuffer:
    """Chunks per stream, released by the watermark as :class:`Block` values."""

    def __init__(self) -> None:
        self._chunks: dict[str, list[Chunk]] = {}

    def __len__(self) -> int:
        return sum(len(c.live) for chunks in self._chunks.values() for c in chunks)

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def push(self, chunk: Chunk) -> None:
        """Hold a chunk's rows until the watermark passes them."""
        if len(chunk.live):
            self._chunks.setdefault(chunk.stream, []).append(chunk)

    def take(self, stream: str) -> list[tuple[Event, int]]:
        """Remove every row of ``stream`` still held, as events paired with their chunk width
        in the order they arrived."""
        out = []
        for chunk in self._chunks.pop(stream, []):
            out.extend((chunk.event(int(r)), chunk.width) for r in chunk.live)
        return out

    def held(self) -> list[tuple[Event, int]]:
        """Every row still held, as events paired with their chunk width, stream by stream in
        the order they arrived (what :meth:`take` would remove; nothing is removed)."""
        return [
            (chunk.event(int(r)), chunk.width)
            for chunks in self._chunks.values()
            for chunk in chunks
            for r in chunk.live
        ]

    def release(self, watermark_ms: int) -> list[Block]:
        """Remove the rows with ``ts <= watermark_ms``: per stream, a block in ``(ts, seq)``
        order."""
        blocks = []
        for stream in list(self._chunks):
            chunks = self._chunks[stream]
            used: list[Chunk] = []
            parts: list[np.ndarray] = []
            kept: list[Chunk] = []
            for chunk in chunks:
                live = chunk.live
                times = chunk.ts[live]
                if times.max() <= watermark_ms:
                    out, chunk.live = live, live[:0]
                else:
                    due = times <= watermark_ms
                    out, chunk.live = live[due], live[~due]
                if len(out):
                    used.append(chunk)
                    parts.append(out)
                if len(chunk.live):
                    kept.append(chunk)
            if kept:
                self._chunks[stream] = kept
            else:
                del self._chunks[stream]
            if not used:
                continue
            which = np.repeat(np.arange(len(used)), [len(p) for p in parts])
            rows = np.concatenate(parts)
            block = Block(stream, used, which, rows)
            ts = block._gather_array([c.ts for c in used])
            seqs = block.seqs()
            order = np.lexsort((seqs, ts))
            if not np.array_equal(order, np.arange(len(order))):
                block = block.select(order)
            blocks.append(block)
        return blocks
