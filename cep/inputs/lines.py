"""The lines of a byte stream, read in blocks with bounded memory: complete lines with their
numbers and the byte offset after each, and a line longer than an event may be skipped to its
end with only its head kept (for the dead letter that says it is too large)."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from cep.events.limits import MAX_EVENT_BYTES, line_text

__all__ = ["READ_BYTES", "SHOWN_BYTES", "LineBlock", "LineReader", "LongLine"]

READ_BYTES = 1 << 22
"""Bytes asked of the source per read: 4 MiB, some 20,000 lines of a few hundred bytes."""

SHOWN_BYTES = 1 << 10
"""How much of a line too large to be an event its dead letter shows (``raw``)."""

_HELD_BYTES = MAX_EVENT_BYTES + 4096
"""A line still without its newline after this many bytes is over the limit, however much
white space surrounds it: it is skipped to its end instead of held."""

_NEWLINE, _OPEN, _CLOSE, _CR = 0x0A, ord("{"), ord("}"), 0x0D
_SPACE = b" \t\r\n\x0b\x0c"


@dataclass(frozen=True)
class LongLine:
    """A line over :data:`~cep.events.limits.MAX_EVENT_BYTES` that was not held whole.

    Attributes
    ----------
    size:
        Its UTF-8 bytes without the white space around it (as the limit counts them).
    utf8:
        Whether all its bytes are valid UTF-8 (else its dead letter is ``invalid_utf8``, the
        reason :func:`~cep.events.event.parse_json_line` checks first).
    """

    size: int
    utf8: bool


@dataclass(frozen=True, eq=False)
class LineBlock:
    """Consecutive lines of one source.

    Attributes
    ----------
    source:
        The input the lines come from, as dead letters name it (a path, ``-``, a Redis URL).
    data:
        The lines' bytes.
    starts, ends:
        Where each line starts and ends in ``data`` (the end excludes its line break).
    first_line:
        The line number of the first line (from 1).
    marks:
        What a cursor records after each line: a byte offset in the source (int64 array), or
        for a Redis stream each entry's id.
    long_lines:
        Lines over the size limit, by index: ``data`` holds only their head.
    identity:
        What tells this file from the one that replaces it when it is rotated (device and
        inode), if anything.
    """

    source: str
    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    first_line: int
    marks: np.ndarray | Sequence[Any]
    long_lines: dict[int, LongLine] = field(default_factory=dict)
    identity: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    @cached_property
    def eligible(self) -> np.ndarray:
        """Whether each line is a candidate for the column-wise parse: it starts with ``{``
        and ends with ``}`` (before a ``\\r``), is not over the size limit and is valid UTF-8
        (a block that is not all ASCII is checked line by line). Every other line goes
        through :func:`~cep.events.limits.line_text` and the one-line parser."""
        n = len(self.starts)
        if not n:
            return np.zeros(0, dtype=bool)
        codes = np.frombuffer(self.data, dtype=np.uint8)
        if not len(codes):
            return np.zeros(n, dtype=bool)
        top = len(codes) - 1
        lengths = self.ends - self.starts
        first = codes[np.minimum(self.starts, top)]
        last = codes[np.minimum(np.maximum(self.ends - 1, self.starts), top)]
        cr = (last == _CR) & (lengths >= 3)
        before = codes[np.minimum(np.maximum(self.ends - 2, self.starts), top)]
        closing = np.where(cr, before, last)
        ok = (lengths >= 2) & (first == _OPEN) & (closing == _CLOSE)
        ok &= lengths - cr <= MAX_EVENT_BYTES
        for index in self.long_lines:
            ok[index] = False
        if not self.data.isascii():
            for index in _invalid_utf8_lines(self.data, self.starts, self.ends):
                ok[index] = False
        return ok

    @cached_property
    def texts(self) -> dict[int, str]:
        """The text (:func:`~cep.events.limits.line_text`) of every line that is not
        :attr:`eligible` and not a long line; blank lines give ``""``."""
        out = {}
        data, starts, ends = self.data, self.starts, self.ends
        for index in np.flatnonzero(~self.eligible).tolist():
            if index not in self.long_lines:
                out[index] = line_text(data[starts[index]:ends[index]])
        return out

    @cached_property
    def records(self) -> np.ndarray:
        """Whether each line is an event to feed (blank lines are not)."""
        keep = self.eligible.copy()
        for index, text in self.texts.items():
            keep[index] = bool(text)
        for index, long in self.long_lines.items():
            keep[index] = long.size > 0  # else white space only: a blank line
        return keep

    def text(self, index: int) -> str:
        """Line ``index`` as a dead letter shows it (a long line: its head)."""
        if index in self.texts:
            return self.texts[index]
        return line_text(self.data[self.starts[index]:self.ends[index]])

    def mark_after(self, index: int) -> Any:
        """The cursor mark after line ``index`` (see :attr:`marks`)."""
        mark = self.marks[index]
        return int(mark) if isinstance(mark, np.integer) else mark


def _invalid_utf8_lines(data: bytes, starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Indexes of the lines holding bytes that are not UTF-8."""
    bad: list[int] = []
    at = 0
    while at < len(data):
        try:
            data[at:].decode("utf-8")
            break
        except UnicodeDecodeError as exc:
            where = at + exc.start
        index = int(np.searchsorted(ends, where, side="left"))
        if index >= len(starts):
            break
        bad.append(index)
        at = int(ends[index]) + 1
    return bad


class LineReader:
    """Complete lines from ``read`` (a function returning up to N bytes, ``b""`` when nothing
    is there now), in blocks.

    A line counts once its line break arrives; :meth:`block` with ``at_end`` also gives the
    last line without one. A line still without a break after some MiB is over the event
    size limit: the reader keeps its head (:data:`SHOWN_BYTES`), reads on to its end
    counting its bytes, and gives it as a :class:`LongLine` of its own.

    Parameters
    ----------
    read:
        Returns up to N bytes; ``b""`` at the end (of a file, for now).
    source:
        The name dead letters give the input.
    offset, line:
        Where the first byte ``read`` returns is in the source, and the number of its line.
    identity:
        Passed on to each :class:`LineBlock` (a file's device and inode).
    """

    def __init__(
        self,
        read: Callable[[int], bytes],
        source: str,
        *,
        offset: int = 0,
        line: int = 1,
        identity: tuple[int, int] | None = None,
    ) -> None:
        self._read = read
        self.source = source
        self.offset = offset
        self.line = line
        self.identity = identity
        self._rest = b""
        self._long: _LongLineScan | None = None

    @property
    def pending(self) -> int:
        """Bytes read past the last complete line (a line still being written)."""
        return len(self._rest) + (self._long.total if self._long is not None else 0)

    def block(self, *, at_end: bool = False) -> LineBlock | None:
        """The lines one read completes, or ``None`` when it completes none (nothing more now,
        or the read fell inside a line); at the end (``at_end``) a last line without a break
        counts too."""
        chunk = self._read(READ_BYTES)
        if self._long is not None:
            return self._continue_long(chunk, at_end)
        data = self._rest + chunk if self._rest else chunk
        if not data:
            return None
        codes = np.frombuffer(data, dtype=np.uint8)
        breaks = np.flatnonzero(codes == _NEWLINE)
        if not chunk and at_end and (not len(breaks) or breaks[-1] != len(data) - 1):
            breaks = np.append(breaks, len(data))  # the last line, without a break
        if not len(breaks):
            self._rest = data
            if len(data) > _HELD_BYTES:
                self._rest = b""
                self._long = _LongLineScan(self.offset)
                self._long.add(data)
                return self._continue_long(b"", at_end) if not chunk and at_end else None
            return None
        last = int(breaks[-1])
        self._rest = data[last + 1:]
        starts = np.empty(len(breaks), dtype=np.int64)
        starts[0] = 0
        starts[1:] = breaks[:-1] + 1
        ends = breaks.astype(np.int64)
        marks = self.offset + np.minimum(ends + 1, len(data))
        block = LineBlock(self.source, data, starts, ends, self.line, marks,
                          identity=self.identity)
        self.offset = int(marks[-1])
        self.line += len(breaks)
        if len(self._rest) > _HELD_BYTES:
            rest, self._rest = self._rest, b""
            self._long = _LongLineScan(self.offset)
            self._long.add(rest)
        return block

    def _continue_long(self, chunk: bytes, at_end: bool) -> LineBlock | None:
        scan = self._long
        assert scan is not None
        cut = chunk.find(b"\n")
        if cut < 0:
            scan.add(chunk)
            if chunk or not at_end:
                return None
            cut = len(chunk)
        else:
            scan.add(chunk[:cut])
            self._rest = chunk[cut + 1:]
        self._long = None
        long = scan.finish()
        head = scan.head
        next_offset = scan.start + scan.total + (1 if cut < len(chunk) else 0)
        block = LineBlock(
            self.source, head, np.zeros(1, dtype=np.int64),
            np.array([len(head)], dtype=np.int64), self.line,
            np.array([next_offset], dtype=np.int64), {0: long}, identity=self.identity,
        )
        self.offset = next_offset
        self.line += 1
        return block

    def finish(self) -> LineBlock | None:
        """The last line at the end of the input (one without a line break), if any."""
        return self.block(at_end=True) if self.pending else None


class _LongLineScan:
    """Counts a long line's bytes as they go by, keeping its head, whether it is UTF-8 and how
    much white space surrounds it."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.total = 0
        self.head = b""
        self.leading = 0
        self.trailing = 0
        self.seen_text = False
        self.utf8 = True
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def add(self, piece: bytes) -> None:
        if not piece:
            return
        self.total += len(piece)
        if len(self.head) < SHOWN_BYTES:
            self.head += piece[:SHOWN_BYTES - len(self.head)]
        # Copies of the piece only when its ends are white space (rare).
        stripped = piece.rstrip(_SPACE) if piece[-1:].isspace() else piece
        if not self.seen_text:
            lead = len(piece) - len(piece.lstrip(_SPACE)) if piece[:1].isspace() else 0
            self.leading += lead
            if lead < len(piece):
                self.seen_text = True
                self.trailing = len(piece) - len(stripped)
        elif stripped:
            self.trailing = len(piece) - len(stripped)
        else:
            self.trailing += len(piece)
        if self.utf8 and not (piece.isascii() and not self._decoder.getstate()[0]):
            try:
                self._decoder.decode(piece)
            except UnicodeDecodeError:
                self.utf8 = False

    def finish(self) -> LongLine:
        if self.utf8:
            try:
                self._decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                self.utf8 = False
        size = self.total - self.leading - (self.trailing if self.seen_text else 0)
        return LongLine(size=max(size, 0), utf8=self.utf8)
