"""The inputs of a run read as steps — the batches and dead letters of one chunk, and where the
input stands after them — prepared in a background thread while the engine takes the previous
step (``pyarrow`` parses without holding the interpreter)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from cep.events.event import StreamSchema
from cep.inputs.chunks import CHUNK_ROWS, Chunk, chunked
from cep.inputs.columns import LineParser, Piece
from cep.inputs.event_input import EventInput
from cep.inputs.files import DirectorySource, FileSource, StdinSource
from cep.inputs.merge import interleaved, merged_pieces
from cep.inputs.redis_stream import RedisSource
from cep.inputs.source import POLL_INTERVAL_S, Cursor, LineSource, StopSignal

__all__ = ["InputReader", "Step", "open_source"]

_AHEAD = 2
"""Steps prepared ahead of the one the engine takes."""


@dataclass(frozen=True)
class Step:
    """One chunk of input, ready to feed.

    Attributes
    ----------
    pieces:
        Batches of events and dead letters, in line order.
    events:
        Events (non-blank lines) in the chunk.
    size:
        Bytes of its lines (for progress).
    cursor:
        Where the input stands once the step is fed (``None`` for several inputs read
        together).
    """

    pieces: list[Piece]
    events: int
    size: int
    cursor: Cursor | None


def open_source(inp: EventInput, *, follow: bool = False, cursor: Cursor | None = None
                ) -> LineSource:
    """The source of one ``--events`` input, starting from ``cursor`` when given."""
    if inp.is_stdin:
        return StdinSource(follow=follow, cursor=cursor)
    if inp.is_redis:
        return RedisSource(inp.path, follow=follow, cursor=cursor)
    if inp.is_directory:
        return DirectorySource(inp.path, follow=follow, cursor=cursor)
    return FileSource(inp.path, follow=follow, cursor=cursor)


class InputReader:
    """The steps of a run's inputs, in order.

    One input is read in chunks of :data:`~cep.inputs.chunks.CHUNK_ROWS` events parsed
    column-wise (:class:`~cep.inputs.columns.LineParser`); several are interleaved by event
    time, each line parsed alone (:mod:`cep.inputs.merge`).

    Parameters
    ----------
    inputs:
        The ``--events`` inputs.
    schemas:
        The declared streams (to place the lines of several inputs by event time).
    follow:
        Never end: read what is appended, as it comes (one input only).
    cursor:
        Where a previous run of the same input stopped.
    columnar:
        ``False`` parses every line alone (the reference the column-wise parse equals).
    background:
        Prepare the steps in a thread while the caller feeds the previous one.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "events.jsonl")
    >>> with open(path, "w") as out:
    ...     _ = out.write('{"a": 1}\\n{"a": 2}\\n')
    >>> reader = InputReader([EventInput(path)], {})
    >>> [(len(step.pieces), step.events, step.cursor["offset"]) for step in reader]
    [(1, 2, 18)]
    """

    def __init__(
        self,
        inputs: Sequence[EventInput],
        schemas: Mapping[str, StreamSchema],
        *,
        follow: bool = False,
        cursor: Cursor | None = None,
        columnar: bool = True,
        background: bool = True,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        if follow and len(inputs) != 1:
            raise ValueError("--follow reads one input")
        self.inputs = list(inputs)
        self.schemas = dict(schemas)
        self.follow = follow
        self.columnar = columnar
        self.background = background
        self.chunk_rows = chunk_rows
        self.stopping = StopSignal()
        self.sources = [
            open_source(inp, follow=follow, cursor=cursor if len(inputs) == 1 else None)
            for inp in inputs
        ]

    def stop(self) -> None:
        """Stop after the step being read (a followed input stops waiting for more)."""
        self.stopping.set()

    def __iter__(self) -> Iterator[Step]:
        steps = self._steps()
        if not self.background:
            for step in steps:
                yield step
                if self.stopping.is_set():
                    return
            return
        yield from _ahead(steps, self.stopping)

    def _steps(self) -> Iterator[Step]:
        if len(self.sources) == 1:
            source, inp = self.sources[0], self.inputs[0]
            parser = LineParser(inp.stream, columnar=self.columnar)
            chunks = chunked(source.blocks(self.stopping), self.chunk_rows,
                             position=source.position, marks=source.marks())
            for chunk in chunks:
                yield Step(parser.pieces(chunk), chunk.events, _size(chunk),
                           source.cursor(chunk))
            return
        pairs = [(s, inp.stream) for s, inp in zip(self.sources, self.inputs, strict=True)]
        lines = interleaved(pairs, self.schemas, self.stopping)
        for pieces in merged_pieces(lines, self.chunk_rows):
            events = sum(len(p) if not isinstance(p, dict) else 1 for p in pieces)
            size = sum(
                sum(len(t) + 1 for t in p.raw) if not isinstance(p, dict) else 0 for p in pieces
            )
            yield Step(pieces, events, size, None)


def _size(chunk: Chunk) -> int:
    total = 0
    for segment in chunk.segments:
        block = segment.block
        if segment.hi > segment.lo:
            total += int(block.ends[segment.hi - 1] - block.starts[segment.lo]) + 1
    return total


_END = object()


def _ahead(steps: Iterator[Step], stopping: StopSignal) -> Iterator[Step]:
    """``steps``, produced by a background thread up to :data:`_AHEAD` ahead."""
    handoff: queue.Queue = queue.Queue(maxsize=_AHEAD)

    def put(item: object) -> bool:
        while not stopping.is_set():
            try:
                handoff.put(item, timeout=POLL_INTERVAL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for step in steps:
                if not put(step):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Failed(exc))
            return
        put(_END)

    worker = threading.Thread(target=produce, name="vigil-input", daemon=True)
    worker.start()
    try:
        while True:
            try:
                item = handoff.get(timeout=POLL_INTERVAL_S)
            except queue.Empty:
                if stopping.is_set() or not worker.is_alive() and handoff.empty():
                    return
                continue
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
            if stopping.is_set():
                return
    finally:
        stopping.set()


@dataclass(frozen=True)
class _Failed:
    error: BaseException
