"""The body of a ``POST /events``: JSON lines parsed as ``vigil run`` parses a file, column-wise
where it can (:class:`cep.inputs.LineParser`), each line that is no event a dead letter in its
place."""

from __future__ import annotations

import io

from cep.inputs import EventBatch, LineParser, LineReader, Piece, chunked

__all__ = ["SOURCE", "count_events", "parse_events"]

SOURCE = "POST /events"
"""The ``input`` a dead letter of a posted line names."""


def parse_events(body: bytes, stream: str | None = None) -> list[Piece]:
    """The batches of events and the dead letters of ``body``, in line order.

    Examples
    --------
    >>> pieces = parse_events(b'{"a": 1}\\n{oops\\n{"a": 2}')
    >>> [len(p) if isinstance(p, EventBatch) else p["reason"] for p in pieces]
    [1, 'invalid_json', 1]
    >>> [len(p) for p in parse_events(b'{"a": 1}')]  # one line, without a break
    [1]
    """
    data = io.BytesIO(body)
    reader = LineReader(data.read, SOURCE)
    blocks = []
    while True:
        block = reader.block(at_end=True)
        if block is not None:
            blocks.append(block)
        elif data.tell() >= len(body):
            last = reader.block(at_end=True)  # a read past the end: a last line's own break
            if last is None:
                break
            blocks.append(last)
    parser = LineParser(stream)
    return [piece for chunk in chunked(blocks) for piece in parser.pieces(chunk)]


def count_events(pieces: list[Piece]) -> int:
    """Lines that are events or dead letters (blank lines are neither)."""
    return sum(len(p) if isinstance(p, EventBatch) else 1 for p in pieces)
