"""``vigil run --registry PATH --follow --engine embedded``: registry versions pushed while the
run reads a directory take effect between two files — an added rule matches from there on, a
replaced one starts fresh, a removed one stops — and every other rule keeps its partial matches:
the output equals an engine given the same changes at the same input positions, and the
untouched rules' matches equal a run without changes. Each match carries the registry version
in force when it was produced, and `vigil registry status` shows the version applied."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
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

from cep.cli import main
from cep.registry import Registry

DEADLINE_S = 60.0


def _wait_for(out: Path, count: int, proc: subprocess.Popen) -> list[dict]:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if out.exists():
            got = [json.loads(line) for line in out.read_text().splitlines()]
            if len(got) >= count:
                return got
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} matches in {out}: {out.read_text()!r}")


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    rules = tmp_path / "v1.vigil"
    rules.write_text(V1)
    path = tmp_path / "registry.sqlite"
    with Registry(path) as registry:
        registry.push([str(rules)])
    return path


def test_registry_versions_take_effect_between_files_and_spare_the_others(
    tmp_path: Path, registry_path: Path
) -> None:
    with_change, without_change = expected()
    events = tmp_path / "events"
    events.mkdir()
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cep.cli", "run", "--registry", str(registry_path),
         "--events", str(events), "--engine", "embedded", "--follow", "--out", str(out),
         "--no-alerts"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        (events / "1.jsonl").write_text("".join(lines(AMOUNTS_1, 0)))
        # The first file is fed under version 1 before any change is pushed.
        _wait_for(out, len(first_file_matches()), proc)
        push_changes(registry_path, tmp_path)
        (events / "2.jsonl").write_text("".join(lines(AMOUNTS_2, len(AMOUNTS_1))))
        got = _wait_for(out, len(with_change), proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, err
    assert "registry version 3 in effect" in err, err
    assert {key(m) for m in got} == with_change
    untouched = {"big", "twice"}
    assert {k for k in with_change if k[0] in untouched} == {
        k for k in without_change if k[0] in untouched
    }
    # The `twice` match that spans the two files proves its partial match survived the change.
    assert any(m["name"] == "twice" and m["events"]["a"][0] < len(AMOUNTS_1)
               <= m["events"]["b"][0] for m in got)
    # Each match carries the registry version in force when it was produced.
    for m in got:
        last = max(p for positions in m["events"].values() for p in positions)
        assert m["registry_version"] == (1 if last < len(AMOUNTS_1) else 3), m
    assert not any(m["name"] == "gone" and m["events"]["g"][0] >= len(AMOUNTS_1) for m in got)
    with Registry(registry_path) as registry:
        applied = registry.store.applied()
    assert [version for version, _ in applied.values()] == [3]


def test_a_run_over_a_missing_or_empty_registry_or_with_files_is_refused(
    tmp_path: Path, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("".join(lines(AMOUNTS_1, 0)))
    (tmp_path / "r.vigil").write_text(V1)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["run", *args, "--events", str(events), "--engine", "embedded",
                     "--no-alerts"])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, _, err = run("--registry", str(tmp_path / "nope.sqlite"))
    assert code == 2 and "no registry at" in err
    Registry(tmp_path / "empty.sqlite").close()
    code, _, err = run("--registry", str(tmp_path / "empty.sqlite"))
    assert code == 2 and "holds nothing yet" in err
    code, _, err = run(str(tmp_path / "r.vigil"), "--registry", str(registry_path))
    assert code == 2 and "not both" in err
    code, out, err = run("--registry", str(registry_path))
    assert code == 0, err
    assert out and all(json.loads(line)["registry_version"] == 1 for line in out.splitlines())
