"""How a followed file or directory waits for more: told by inotify where Linux has it (a line
is read within about a millisecond of being written, and an idle input costs nothing), else
by looking again every :data:`~cep.inputs.source.POLL_INTERVAL_S`."""

from __future__ import annotations

import os
import select
import time
from typing import Protocol

from cep.inputs.source import POLL_INTERVAL_S, StopSignal

try:  # a ctypes wrapper of Linux's inotify_init1, inotify_add_watch and the event records
    import inotify_simple
except ImportError:  # pragma: no cover - not Linux, or installed without it
    inotify_simple = None

__all__ = [
    "READ_INTERVAL_S", "RESCAN_S", "InotifyWatch", "PollingWatch", "Watch", "open_watch",
]

RESCAN_S = 1.0
"""With inotify, how long a wait lasts without an event: a change that inotify does not report
(another host's write to a network file system) is still read within a second."""

READ_INTERVAL_S = 0.01
"""While lines keep coming, how long a followed input rests after a read before the next: each
read becomes a step of the engine, whose fixed cost (a parse, a frame, a feed: some 4 ms of
CPU) would take most of a core at a read for every write (200 a second from a writer that
flushes every 5 ms). The first line after a pause is read at once; and the rest starts when
the work of a read is done, so a loaded machine, slower at that work, makes fewer, larger
steps."""

_CHANGES = (
    "MODIFY", "ATTRIB", "CLOSE_WRITE", "CREATE", "DELETE", "MOVED_FROM", "MOVED_TO",
    "DELETE_SELF", "MOVE_SELF",
)
"""What a watch of the directory reports: a file written, created, renamed in or out, removed
or truncated (``ATTRIB``, ``MODIFY``), and the directory itself moved or removed."""


class Watch(Protocol):
    """Waits until the watched files may have changed."""

    def wait(self) -> bool:
        """Return once something may have changed (or the stop signal is set, when it returns
        ``True``)."""

    def close(self) -> None:
        """Release what the watch holds (file descriptors)."""


class PollingWatch:
    """No notification: every wait lasts ``interval`` seconds (or until the stop signal)."""

    def __init__(self, stop: StopSignal, interval: float = POLL_INTERVAL_S) -> None:
        self.stop = stop
        self.interval = interval

    def wait(self) -> bool:
        return self.stop.wait(self.interval)

    def close(self) -> None:
        pass


class InotifyWatch:
    """inotify on a directory: a wait ends when a file of ``names`` (any file, for ``None``)
    changes, when the stop signal is set, or after :data:`RESCAN_S`; never sooner than
    ``interval`` after it began (a change after a longer pause ends it at once).

    Events are read as the wait ends, before the caller looks at the files, so a change made
    while it reads is reported by the next wait: none is missed (an overflow of the kernel's
    queue, which drops events, ends the wait too). When the directory goes (removed, moved,
    unmounted), the watch polls from then on.

    Raises
    ------
    OSError
        When inotify cannot watch ``directory`` (not Linux's inotify, the user's limit of
        watches or instances reached, the directory gone).
    """

    def __init__(
        self, directory: str, names: frozenset[str] | None, stop: StopSignal,
        interval: float = READ_INTERVAL_S,
    ) -> None:
        if inotify_simple is None:
            raise OSError("inotify is not available")
        flags = inotify_simple.flags
        self.stop = stop
        self.names = names
        self.interval = interval
        self._polling = False
        self._inotify = inotify_simple.INotify(nonblocking=True)
        try:
            mask = 0
            for name in _CHANGES:
                mask |= flags[name]
            self._inotify.add_watch(directory, mask | flags.ONLYDIR)
            self._wake_r, self._wake_w = os.pipe()
        except BaseException:
            self._inotify.close()
            raise
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._forget = stop.on_set(self._wake)
        self._gone = flags.IGNORED

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # already woken, or closed
            pass

    def wait(self) -> bool:
        if self._polling:
            return self.stop.wait(POLL_INTERVAL_S)
        rested = time.monotonic() + self.interval
        if self._changed():
            early = rested - time.monotonic()
            if early > 0 and self.stop.wait(early):
                return True
        return self.stop.is_set()

    def _changed(self) -> bool:
        """Wait for a change of the watched files (True), the stop signal or the rescan."""
        fd = self._inotify.fileno()
        give_up = time.monotonic() + RESCAN_S
        while not self.stop.is_set():
            timeout = give_up - time.monotonic()
            if timeout <= 0:
                return False
            ready, _, _ = select.select([fd, self._wake_r], [], [], timeout)
            if not ready:
                return False
            if self._wake_r in ready:
                _drain(self._wake_r)
            if fd in ready and self._relevant(self._inotify.read(timeout=0)):
                return True
        return False

    def _relevant(self, events: list) -> bool:
        """Whether ``events`` say something about the watched files (the others, of another
        file of the directory, do not end the wait)."""
        for event in events:
            if event.mask & self._gone:
                self._polling = True  # the directory was removed, moved away or unmounted
                return True
            if self.names is None or event.name in self.names or not event.name:
                return True
        return False

    def close(self) -> None:
        self._forget()
        self._inotify.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def open_watch(
    directory: str, names: frozenset[str] | None, stop: StopSignal,
    interval: float = READ_INTERVAL_S,
) -> Watch:
    """The way to wait for a change of ``directory``'s files ``names`` (all of them for
    ``None``): inotify when it can watch it, else polling.

    Examples
    --------
    >>> import tempfile
    >>> stop = StopSignal()
    >>> directory = tempfile.mkdtemp()
    >>> waiting = open_watch(directory, frozenset({"events.jsonl"}), stop)
    >>> with open(os.path.join(directory, "events.jsonl"), "w") as out:
    ...     _ = out.write("{}\\n")
    >>> waiting.wait()  # at once: the file was written (a poll's interval without inotify)
    False
    >>> stop.set()
    >>> waiting.wait()
    True
    >>> waiting.close()
    """
    try:
        return InotifyWatch(directory, names, stop, interval)
    except OSError:
        return PollingWatch(stop)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass
