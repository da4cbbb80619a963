"""A followed file or directory wakes on inotify: a line appended is read at once (not after a
poll or the rescan), an idle input does not wake, another file of the directory does not wake
it, and the stop signal ends its wait; without inotify the polling still reads everything."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

import cep.inputs.watch as watching
from cep.inputs import IDLE, DirectorySource, FileSource, StopSignal

linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or watching.inotify_simple is None,
    reason="inotify is Linux's",
)

LONG_S = 60.0
"""The rescan and poll intervals made so long that only inotify can explain a prompt read."""


@pytest.fixture
def slow_rescan(monkeypatch):
    monkeypatch.setattr(watching, "RESCAN_S", LONG_S)


class _Follower:
    """A source's blocks read in a thread; the lines so far and how often it said IDLE."""

    def __init__(self, source) -> None:
        self.stop = StopSignal()
        self.lines: list[str] = []
        self.idles = 0
        self._blocks = source.blocks(self.stop)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for item in self._blocks:
            if item is IDLE:
                self.idles += 1
            else:
                self.lines.extend(item.text(i) for i in range(len(item)))

    def until(self, count: int, timeout: float = 20.0) -> float:
        """Seconds until ``count`` lines were read."""
        started = time.monotonic()
        while len(self.lines) < count:
            if time.monotonic() - started > timeout:
                pytest.fail(f"{len(self.lines)} line(s) after {timeout}s: {self.lines}")
            time.sleep(0.002)
        return time.monotonic() - started

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the stop signal did not end the wait"


def _append(path: Path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


@linux
def test_an_appended_line_is_read_at_once_not_at_the_rescan(tmp_path, slow_rescan) -> None:
    path = tmp_path / "app.jsonl"
    path.write_text("a\n")
    follower = _Follower(FileSource(str(path), follow=True))
    try:
        follower.until(1)
        time.sleep(0.2)  # idle: the source waits on inotify
        _append(path, "b\n")
        assert follower.until(2) < LONG_S / 4
        # rotation: a new file under the name wakes it too
        os.rename(path, tmp_path / "app.jsonl.1")
        path.write_text("c\n")
        assert follower.until(3) < LONG_S / 4
        assert follower.lines == ["a", "b", "c"]
    finally:
        follower.close()


@linux
def test_an_idle_file_does_not_wake_and_other_files_do_not_either(tmp_path, slow_rescan) -> None:
    path = tmp_path / "app.jsonl"
    path.write_text("a\n")
    follower = _Follower(FileSource(str(path), follow=True))
    try:
        follower.until(1)
        time.sleep(0.1)
        idles = follower.idles
        for _ in range(20):  # another file of the directory, written often
            _append(tmp_path / "other.log", "x\n")
            time.sleep(0.01)
        time.sleep(0.3)
        # a poll would have said IDLE every 20 ms; the watch waits without a word
        assert follower.idles == idles
    finally:
        follower.close()


@linux
def test_the_stop_signal_ends_the_wait_at_once(tmp_path, slow_rescan) -> None:
    path = tmp_path / "app.jsonl"
    path.write_text("")
    stop = StopSignal()
    waiting = watching.open_watch(str(tmp_path), frozenset({"app.jsonl"}), stop)
    assert isinstance(waiting, watching.InotifyWatch)
    ended = []
    thread = threading.Thread(target=lambda: ended.append(waiting.wait()), daemon=True)
    thread.start()
    time.sleep(0.1)
    assert not ended
    stop.set()
    thread.join(timeout=LONG_S / 4)
    assert ended == [True]
    waiting.close()


@linux
def test_a_followed_directory_wakes_on_a_new_file(tmp_path, slow_rescan) -> None:
    (tmp_path / "a.jsonl").write_text("a\n")
    follower = _Follower(DirectorySource(str(tmp_path), follow=True))
    try:
        follower.until(1)
        time.sleep(0.2)
        (tmp_path / "b.jsonl").write_text("b\n")
        assert follower.until(2) < LONG_S / 4
        _append(tmp_path / "a.jsonl", "a2\n")
        assert follower.until(3) < LONG_S / 4
        assert follower.lines == ["a", "b", "a2"]
    finally:
        follower.close()


@linux
def test_lines_written_while_it_rests_are_read_together(tmp_path) -> None:
    """A read follows the previous one's work by the rest interval: lines that keep coming
    are read in few steps, not one per write."""
    path = tmp_path / "app.jsonl"
    path.write_text("")
    stop = StopSignal()
    blocks = []
    rests = []

    def run() -> None:
        for item in FileSource(str(path), follow=True).blocks(stop):
            if item is IDLE:
                rests.append(time.monotonic())
            else:
                blocks.append(len(item))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        time.sleep(0.1)
        started = time.monotonic()
        for i in range(100):  # a write every ms or so
            _append(path, f"{i}\n")
            time.sleep(0.001)
        deadline = started + 20
        while sum(blocks) < 100 and time.monotonic() < deadline:
            time.sleep(0.001)
        took = time.monotonic() - started
        assert sum(blocks) == 100
        # Each rest lasts the interval (the first after the pause excepted), however long the
        # writes took; a read that finds more lines reads again before resting, so a loaded
        # reader may take two blocks for one rest, but never one block per write.
        during = [at for at in rests if at >= started]
        assert len(during) <= 2 + took / watching.READ_INTERVAL_S
        assert len(blocks) <= 50
    finally:
        stop.set()
        thread.join(timeout=10)


def test_without_inotify_a_followed_file_is_polled(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(watching, "inotify_simple", None)
    assert isinstance(watching.open_watch(str(tmp_path), None, StopSignal()), watching.PollingWatch)
    path = tmp_path / "app.jsonl"
    path.write_text("a\n")
    follower = _Follower(FileSource(str(path), follow=True))
    try:
        follower.until(1)
        _append(path, "b\n")
        follower.until(2)
        os.rename(path, tmp_path / "app.jsonl.1")
        path.write_text("c\n")
        follower.until(3)
        assert follower.lines == ["a", "b", "c"]
    finally:
        follower.close()


def test_a_directory_inotify_cannot_watch_is_polled(tmp_path) -> None:
    waiting = watching.open_watch(str(tmp_path / "missing"), None, StopSignal())
    assert isinstance(waiting, watching.PollingWatch)
    waiting.close()
