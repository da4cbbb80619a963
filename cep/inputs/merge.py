"""Several inputs read as one, their lines interleaved by event time (each input is assumed
roughly in time order; the engine's reorder buffer does the rest). Each line is parsed alone,
to know its time before it is placed."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cep.events.event import BadEventError, DeadLetter, StreamSchema, stream_of
from cep.inputs.chunks import CHUNK_ROWS
from cep.inputs.columns import EventBatch, Piece, long_line_letter, parse_line
from cep.inputs.lines import LineBlock
from cep.inputs.source import LineSource, StopSignal

__all__ = ["TimedLine", "interleaved", "merged_pieces"]


@dataclass(slots=True)
class TimedLine:
    """One line of one input, parsed: its event or its dead letter, and the time that places
    it among the other inputs' lines."""

    order: int
    source: str
    line: int
    position: int
    text: str
    event: dict[str, Any] | None
    letter: DeadLetter | None


def _lines(
    source: LineSource, stream: str | None, schemas: Mapping[str, StreamSchema],
    stop: StopSignal,
) -> Iterator[TimedLine]:
    position = source.position
    last_order = -(2**63)
    for block in source.blocks(stop):
        if not isinstance(block, LineBlock):
            continue
        for index in np.flatnonzero(block.records).tolist():
            line = block.first_line + index
            long = block.long_lines.get(index)
            text = block.text(index)
            if long is not None:
                event, letter = None, long_line_letter(block, index, long, line)
            else:
                event, letter = parse_line(text, block.source, line, stream)
            if event is not None:
                last_order = _order_of(event, schemas, last_order)
            yield TimedLine(last_order, block.source, line, position, text, event, letter)
            position += 1


def _order_of(event: dict[str, Any], schemas: Mapping[str, StreamSchema], last: int) -> int:
    """Event time used to interleave several inputs; a line without one keeps its place."""
    try:
        schema = stream_of(event, None, schemas)
        # Bounded (and corrected for a device's clock) as the engine reads it: a time too far
        # ahead must not hold back its input.
        return schema.event_time_of(event)
    except BadEventError:
        return last


def interleaved(
    sources: Sequence[tuple[LineSource, str | None]],
    schemas: Mapping[str, StreamSchema],
    stop: StopSignal,
) -> Iterator[TimedLine]:
    """The lines of every ``(source, bound stream)``, merged by event time."""
    readers = [_lines(source, stream, schemas, stop) for source, stream in sources]
    yield from heapq.merge(*readers, key=lambda r: r.order)


def merged_pieces(lines: Iterator[TimedLine], size: int = CHUNK_ROWS) -> Iterator[list[Piece]]:
    """Chunks of ``size`` lines as pieces: runs of events as batches, dead letters between."""
    chunk: list[TimedLine] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield _pieces(chunk)
            chunk = []
    if chunk:
        yield _pieces(chunk)


def _pieces(chunk: list[TimedLine]) -> list[Piece]:
    out: list[Piece] = []
    run: list[TimedLine] = []

    def flush() -> None:
        if run:
            out.append(EventBatch(
                pd.DataFrame.from_records([r.event for r in run]),
                [r.source for r in run],
                np.array([r.line for r in run], dtype=np.int64),
                np.array([r.position for r in run], dtype=np.int64),
                [r.text for r in run],
            ))
            run.clear()

    for line in chunk:
        if line.letter is not None:
            flush()
            out.append(line.letter)
        else:
            run.append(line)
    flush()
    return out
