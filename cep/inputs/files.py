"""Files as inputs: one file (followed as ``tail -F`` follows it, through rotation and
truncation), a directory of files read in name order (new files as they appear, grown files
too), and stdin; each can say where it stands and start again from there. A followed file or
directory is read again as soon as inotify says it changed (:mod:`cep.inputs.watch`)."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterator
from typing import IO, Any

from cep.inputs.chunks import IDLE, Chunk, _Idle
from cep.inputs.event_input import directory_files
from cep.inputs.lines import LineBlock, LineReader
from cep.inputs.source import POLL_INTERVAL_S, Cursor, StopSignal
from cep.inputs.watch import Watch, open_watch

__all__ = ["DirectorySource", "FileSource", "StdinSource"]


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


class _FileState:
    """Where the reading of one file stands: its identity, the offset and number of its next
    line."""

    def __init__(self, path: str, offset: int = 0, line: int = 1,
                 identity: tuple[int, int] | None = None) -> None:
        self.path = path
        self.offset = offset
        self.line = line
        self.identity = identity

    def reader(self, handle: IO[bytes]) -> LineReader:
        return LineReader(handle.read, self.path, offset=self.offset, line=self.line,
                          identity=self.identity)

    def restart_if_replaced(self, stat: os.stat_result) -> None:
        """A file replaced (another inode) or truncated (shorter than what was read) is read
        again from its start."""
        if (self.identity is not None and _identity(stat) != self.identity) or (
            stat.st_size < self.offset
        ):
            self.offset, self.line = 0, 1
        self.identity = _identity(stat)


def _read_file(state: _FileState, *, at_end: bool) -> Iterator[LineBlock]:
    """The complete lines of ``state``'s file from where it stands (and a last line without a
    break when ``at_end``); ``state`` moves past them."""
    with open(state.path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        state.restart_if_replaced(stat)
        handle.seek(state.offset)
        reader = state.reader(handle)
        while True:
            block = reader.block(at_end=at_end)
            if block is None:
                if reader.pending and at_end:
                    continue  # a long line still being skipped, or the last line's end
                break
            state.offset, state.line = reader.offset, reader.line
            yield block


def _start_of(cursor: Cursor | None, kind: str) -> Cursor:
    if cursor is None:
        return {}
    if cursor.get("kind") != kind:
        raise ValueError(f"a {cursor.get('kind')} cursor cannot start a {kind} input")
    return cursor


class FileSource:
    """One file; followed, its appended lines, through rotation (a rename and a new file) and
    truncation, which are read from their start.

    Parameters
    ----------
    path:
        The file.
    follow:
        Keep reading as lines are appended, until ``stop`` is set.
    cursor:
        Where a previous run stopped (:meth:`cursor`): the reading continues there, unless
        the file was replaced or truncated since, when it starts over.
    """

    def __init__(self, path: str, *, follow: bool = False, cursor: Cursor | None = None) -> None:
        start = _start_of(cursor, "file")
        self.path = path
        self.follow = follow
        self.position = int(start.get("position", 0))
        identity = start.get("identity")
        self._state = _FileState(
            path, int(start.get("offset", 0)), int(start.get("line", 1)),
            tuple(identity) if identity else None,
        )

    def marks(self) -> dict[str, dict[str, Any]]:
        state = self._state
        return {self.path: {"mark": state.offset, "line": state.line, "identity": state.identity}}

    def cursor(self, chunk: Chunk) -> Cursor:
        mark = chunk.marks.get(self.path) or self.marks()[self.path]
        identity = mark.get("identity")
        return {
            "kind": "file", "path": self.path, "offset": mark["mark"], "line": mark["line"],
            "identity": list(identity) if identity else None, "position": chunk.position,
        }

    def blocks(self, stop: StopSignal) -> Iterator[LineBlock | _Idle]:
        if not self.follow:
            yield from _read_file(self._state, at_end=True)
            return
        state = self._state
        handle: IO[bytes] | None = None
        reader: LineReader | None = None
        # Watched before the first read: a line written after that read wakes the wait.
        changes = _watch_file(self.path, stop)
        try:
            while not stop.is_set():
                if handle is None:
                    try:
                        handle = open(self.path, "rb")
                    except FileNotFoundError:  # between a rename and the new file
                        yield IDLE
                        changes.wait()
                        continue
                    state.restart_if_replaced(os.fstat(handle.fileno()))
                    handle.seek(state.offset)
                    reader = state.reader(handle)
                assert reader is not None
                block = reader.block()
                if block is not None:
                    state.offset, state.line = reader.offset, reader.line
                    yield block
                    continue
                replaced = self._replaced(handle, state)
                if replaced:
                    # The old file read to its end, its last line too; then the new one.
                    while (last := reader.block(at_end=True)) is not None or reader.pending:
                        if last is not None:
                            yield last
                    handle.close()
                    handle, reader = None, None
                    state.offset, state.line, state.identity = 0, 1, None
                    continue
                yield IDLE
                changes.wait()
        finally:
            changes.close()
            if handle is not None:
                handle.close()

    def _replaced(self, handle: IO[bytes], state: _FileState) -> bool:
        """Whether the path now names another file, or this one shrank (truncation)."""
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return False  # renamed away, the new file not there yet: wait for it
        if _identity(current) != _identity(os.fstat(handle.fileno())):
            return True
        return current.st_size < state.offset


class DirectorySource:
    """A directory's files in name order; followed, new files as they appear (in name order)
    and lines appended to files already read.

    Its cursor records each file's offset and next line number (files are keyed by name),
    so a file that grows after being read is read on from where it stood.
    """

    def __init__(self, path: str, *, follow: bool = False, cursor: Cursor | None = None) -> None:
        start = _start_of(cursor, "directory")
        self.path = path
        self.follow = follow
        self.position = int(start.get("position", 0))
        self._states: dict[str, _FileState] = {}
        for name, mark in (start.get("files") or {}).items():
            identity = mark.get("identity")
            self._states[name] = _FileState(
                os.path.join(path, name), int(mark["offset"]), int(mark["line"]),
                tuple(identity) if identity else None,
            )

    def marks(self) -> dict[str, dict[str, Any]]:
        return {
            s.path: {"mark": s.offset, "line": s.line, "identity": s.identity}
            for s in self._states.values()
        }

    def cursor(self, chunk: Chunk) -> Cursor:
        files = {}
        for path, mark in chunk.marks.items():
            identity = mark.get("identity")
            files[os.path.basename(path)] = {
                "offset": mark["mark"], "line": mark["line"],
                "identity": list(identity) if identity else None,
            }
        return {"kind": "directory", "path": self.path, "files": files,
                "position": chunk.position}

    def blocks(self, stop: StopSignal) -> Iterator[LineBlock | _Idle]:
        changes = open_watch(self.path, None, stop) if self.follow else None
        try:
            yield from self._blocks(stop, changes)
        finally:
            if changes is not None:
                changes.close()

    def _blocks(self, stop: StopSignal, changes: Watch | None) -> Iterator[LineBlock | _Idle]:
        while True:
            for path in directory_files(self.path):
                name = os.path.basename(path)
                state = self._states.setdefault(name, _FileState(path))
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                if (
                    state.identity == _identity(stat) and stat.st_size == state.offset
                ):
                    continue  # nothing new
                try:
                    # Followed, a file's last line counts once its line break is written.
                    yield from _read_file(state, at_end=not self.follow)
                except FileNotFoundError:
                    continue
            if changes is None or stop.is_set():
                return
            yield IDLE
            if changes.wait():
                return


def _watch_file(path: str, stop: StopSignal) -> Watch:
    """The wait for a change of the file at ``path`` (where a symbolic link leads, when it is
    one): its directory is watched, so that a new file under its name (rotation) is seen."""
    real = os.path.realpath(path)
    return open_watch(os.path.dirname(real) or ".", frozenset({os.path.basename(real)}), stop)


class StdinSource:
    """Standard input, to its end; followed, what has arrived is handed on whenever the pipe
    has nothing more for now."""

    def __init__(self, *, follow: bool = False, cursor: Cursor | None = None) -> None:
        start = _start_of(cursor, "stdin")
        self.follow = follow
        self.position = int(start.get("position", 0))
        self._line = 1

    def marks(self) -> dict[str, dict[str, Any]]:
        return {}

    def cursor(self, chunk: Chunk) -> Cursor:
        mark = chunk.marks.get("-", {"mark": 0, "line": 1})
        return {"kind": "stdin", "offset": mark["mark"], "line": mark["line"],
                "position": chunk.position}

    def blocks(self, stop: StopSignal) -> Iterator[LineBlock | _Idle]:
        pipe = _Pipe(sys.stdin, self.follow, stop)
        reader = LineReader(pipe.read, "-")
        while True:
            block = reader.block()
            if block is not None:
                yield block
            elif pipe.ended:
                last = reader.finish()
                while last is not None:
                    yield last
                    last = reader.finish()
                return
            elif pipe.idle:
                pipe.idle = False
                yield IDLE


class _Pipe:
    """Standard input's bytes as they come: each read returns what is there (waiting until
    something is); followed, it returns ``b""`` with ``idle`` set as soon as nothing more is
    there, so that what was read is handed on at once, and ``ended`` once ``stop`` is set."""

    def __init__(self, stdin: Any, follow: bool, stop: StopSignal) -> None:
        self.follow = follow
        self.stop = stop
        self.idle = False
        self.ended = False
        self._quiet = False  # idle said since the last bytes: wait without saying it again
        binary = getattr(stdin, "buffer", None)
        self._fd = _fileno(binary)
        if self._fd is None and binary is not None:
            self._read = binary.read
        elif self._fd is None:  # a test's StringIO: text, read as the UTF-8 it stands for
            self._read = lambda size: stdin.read(size).encode("utf-8", "surrogatepass")

    def read(self, size: int) -> bytes:
        if self.ended:
            return b""
        if self._fd is None:
            data = self._read(size)
        else:
            if self.follow and not self._ready():
                return b""
            data = b"" if self.ended else os.read(self._fd, size)
        if not data and not self.idle:
            self.ended = True
        return data

    def _ready(self) -> bool:
        """Whether there is something to read now; when not, ``idle`` is set once (what was
        read is handed on), then the wait goes on, looking at ``stop`` every poll interval."""
        while not self.stop.is_set():
            try:
                ready, _, _ = select.select(
                    [self._fd], [], [], POLL_INTERVAL_S if self._quiet else 0
                )
            except (OSError, ValueError):
                return True  # not selectable: read, and wait in the read
            if ready:
                self._quiet = False
                return True
            if not self._quiet:
                self._quiet = self.idle = True
                return False
        self.ended = True
        return False


def _fileno(handle: Any) -> int | None:
    try:
        return handle.fileno() if handle is not None else None
    except (OSError, ValueError, AttributeError):
        return None
