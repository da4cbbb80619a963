"""Lines grouped into chunks: the events handed to the engine at a time, with where each input
stands after them (what a cursor records)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cep.inputs.lines import LineBlock

__all__ = ["CHUNK_ROWS", "IDLE", "Chunk", "Segment", "chunked"]

CHUNK_ROWS = 20_000
"""Events per chunk: large enough to vectorise, small enough to stream. Without ``--follow``
every chunk but the last holds exactly this many, as ``vigil run`` always fed them, so that the
order of matches and dead letters (which within a batch may depend on its bounds) is the
same."""


class _Idle:
    """What a followed input yields when it has nothing more for now."""

    def __repr__(self) -> str:
        return "IDLE"


IDLE = _Idle()


@dataclass(frozen=True)
class Segment:
    """Lines ``lo`` to ``hi`` (exclusive) of a block."""

    block: LineBlock
    lo: int
    hi: int


@dataclass(frozen=True)
class Chunk:
    """Lines holding up to :data:`CHUNK_ROWS` events (blank lines too, which are none).

    Attributes
    ----------
    segments:
        The lines, in order.
    first_position:
        The position of the chunk's first event in its input (counting events from 0).
    position:
        The position of the event after the chunk.
    marks:
        Per source, where reading stands after the chunk: ``{"mark": offset or entry id,
        "line": next line number, "identity": ...}``, for every source read so far.
    """

    segments: tuple[Segment, ...]
    first_position: int
    position: int
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return self.position - self.first_position


def chunked(
    items: Iterable[LineBlock | _Idle],
    size: int = CHUNK_ROWS,
    *,
    position: int = 0,
    marks: dict[str, dict[str, Any]] | None = None,
) -> Iterator[Chunk]:
    """Chunks of ``size`` events from blocks of lines; an :data:`IDLE` item (a followed input
    with nothing more for now) ends the chunk early, so what has arrived is not held back.

    ``position`` numbers the first event; ``marks`` is where the sources stood before.
    """
    state = dict(marks or {})
    segments: list[Segment] = []
    count = 0
    first = position
    for item in items:
        if item is IDLE:
            if count:
                yield Chunk(tuple(segments), first, position, dict(state))
                segments, count, first = [], 0, position
            continue
        assert isinstance(item, LineBlock)
        block = item
        cumulative = np.cumsum(block.records, dtype=np.int64)
        lo = 0
        while lo < len(block):
            before = int(cumulative[lo - 1]) if lo else 0
            wanted = size - count
            # The line holding the chunk's last event, or the block's end.
            reach = int(np.searchsorted(cumulative, before + wanted, side="left"))
            hi = min(reach + 1, len(block))
            taken = int(cumulative[hi - 1]) - before
            segments.append(Segment(block, lo, hi))
            state[block.source] = {
                "mark": block.mark_after(hi - 1),
                "line": block.first_line + hi,
                "identity": block.identity,
            }
            count += taken
            position += taken
            lo = hi
            if count >= size:
                yield Chunk(tuple(segments), first, position, dict(state))
                segments, count, first = [], 0, position
    if count or segments:
        yield Chunk(tuple(segments), first, position, dict(state))
