"""``vigil run --registry PATH --follow --engine spark``: registry versions pushed while the
streaming query follows a directory or a Redis stream run from the next micro-batch, without
restarting the query — the same changes at the same place as the embedded engine's test
(tests/cep/test_run_registry.py), with the same matches: an added rule matches from there on, a
replaced one starts fresh, a removed one stops, and the untouched rules' matches (a partial
match spanning the change among them) equal a run without changes. Each match carries the
registry version of its micro-batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from registry_changes import (
    AMOUNTS_1,
    AMOUNTS_2,
    V1,
    expected,
    first_file_matches,
    key,
    lines,
    push_changes,
)

from cep.registry import Registry
from spark_udf.live import PROGRAM_LOG, ProgramLog

pytestmark = pytest.mark.slow

DEADLINE_S = 300.0


def _matches(out: Path) -> list[dict]:
    found = []
    for name in sorted(os.listdir(out)) if out.is_dir() else ():
        if name.startswith("part-") and name.endswith(".jsonl"):
            found.extend(json.loads(line) for line in (out / name).read_text().splitlines()
                         if line.strip())
    return found


def _wait(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended while waiting for {what}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.25)
    raise AssertionError(f"no {what} after {DEADLINE_S}s")


class _Directory:
    """Events as files of a directory the run follows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir()
        self.files = 0

    @property
    def events(self) -> str:
        return str(self.path)

    def add(self, text: str) -> None:
        self.files += 1
        (self.path / f"{self.files}.jsonl").write_text(text)


class _Stream:
    """Events as entries of a Redis stream the run follows."""

    def __init__(self, port: int) -> None:
        self.events = f"redis://127.0.0.1:{port}/0/txn"
        self.client = redis.Redis(port=port)

    def add(self, text: str) -> None:
        for line in text.splitlines():
            self.client.xadd("txn", {"event": line})


@pytest.fixture(params=["directory", "redis"])
def events_input(request, tmp_path: Path):
    if request.param == "directory":
        return _Directory(tmp_path / "events")
    return _Stream(request.getfixturevalue("redis_port"))


def test_registry_versions_run_from_the_next_micro_batch_on_spark(
    tmp_path: Path, events_input
) -> None:
    with_change, without_change = expected()
    rules = tmp_path / "v1.vigil"
    rules.write_text(V1)
    registry_path = tmp_path / "registry.sqlite"
    with Registry(registry_path) as registry:
        registry.push([str(rules)])
    out = tmp_path / "out"
    events_input.add("".join(lines(AMOUNTS_1, 0)))
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cep.cli", "run", "--registry", str(registry_path),
             "--events", events_input.events, "--engine", "spark", "--master", "local[2]",
             "--follow", "--out", str(out), "--buckets", "4", "--no-alerts"],
            stdout=subprocess.DEVNULL, stderr=err_file, text=True, cwd=tmp_path,
        )
        try:
            first = first_file_matches()
            _wait(lambda: {key(m) for m in _matches(out)} >= first, proc,
                  "matches of the first file")
            push_changes(registry_path, tmp_path)
            # In effect before the second file arrives: a micro-batch without new lines
            # carries the new program (its offsets pin it).
            _wait(lambda: "registry version 3 in effect from micro-batch" in
                  err_path.read_text(), proc, "registry version 3 in effect")
            events_input.add("".join(lines(AMOUNTS_2, len(AMOUNTS_1))))
            _wait(lambda: len(_matches(out)) >= len(with_change), proc, "every match")
            time.sleep(3)  # a few more micro-batches: nothing else may come
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=DEADLINE_S)
    err = err_path.read_text()
    assert proc.returncode == 130, err
    got = _matches(out)
    assert len({m["match_id"] for m in got}) == len(got), "a match was written twice"
    assert {key(m) for m in got} == with_change, err
    untouched = {"big", "twice"}
    assert {k for k in with_change if k[0] in untouched} == {
        k for k in without_change if k[0] in untouched}
    assert any(m["name"] == "twice" and m["events"]["a"][0] < len(AMOUNTS_1)
               <= m["events"]["b"][0] for m in got)
    for m in got:
        last = max(p for positions in m["events"].values() for p in positions)
        assert m["registry_version"] == (1 if last < len(AMOUNTS_1) else 3), m
    # Version 1 ran at least one micro-batch, version 3 the ones after it; both are in the
    # checkpoint's program log for a replay.
    log = ProgramLog(str(out / "_checkpoint"))
    assert (out / "_checkpoint" / PROGRAM_LOG).is_dir()
    versions = [log.entry(n).registry_version for n in range(log.current() + 1)]
    assert versions[0] == 1 and versions[-1] == 3, versions
    assert "registry version 3 taken; it runs from the next micro-batch" in err, err
