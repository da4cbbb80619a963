"""``vigil run --engine embedded --events redis://HOST:PORT[/DB]/KEY`` against a real
``redis-server``: a stream's entries read as the lines of a file would be (same matches, same
ids, dead letters numbered by entry), resumed from a cursor, and followed with ``--follow``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import redis

from cep.cli import main
from cep.inputs import EventInput, InputReader, RedisSource, entry_text

RULES = """
stream txn (card_id string, amount float, ts timestamp) time ts
rule big from txn by card_id pattern b define b as amount > 100
"""

T0 = 1_767_225_600


def _event(i: int, amount: float = 500.0) -> str:
    return json.dumps({"card_id": f"c{i}", "amount": amount, "ts": T0 + i})


ENTRIES = [
    {"event": _event(0)},
    {"event": "{broken"},
    {"event": _event(2, amount=5.0)},
    {"card_id": "c3", "amount": "500", "ts": str(T0 + 3)},  # no event field: its fields
    {"event": b'{"card_id": "caf\xe9", "amount": 500, "ts": 1767225604}'},
    {"event": _event(5)},
]


def _run(tmp_path, events: str, *extra: str) -> tuple[int, list[dict], list[dict]]:
    rules = tmp_path / "rules.vigil"
    rules.write_text(RULES)
    out, dead = tmp_path / "out.jsonl", tmp_path / "dead.jsonl"
    code = main(["run", str(rules), "--events", events, "--engine", "embedded", "--out",
                 str(out), "--dead-letter", str(dead), *extra])
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    letters = [json.loads(line) for line in dead.read_text().splitlines()]
    return code, matches, letters


def test_a_stream_is_read_as_a_file_of_its_entries_is(tmp_path, redis_port) -> None:
    with redis.Redis(port=redis_port) as client:
        for fields in ENTRIES:
            client.xadd("txn", fields)
    code, matches, letters = _run(tmp_path, f"redis://127.0.0.1:{redis_port}/0/txn")
    assert code == 0
    assert [m["key"]["card_id"] for m in matches] == ["c0", "c5"]
    assert [(d["reason"], d["line"]) for d in letters] == [
        ("invalid_json", 2), ("wrong_type", 4), ("invalid_utf8", 5)
    ]
    assert letters[0]["input"] == f"redis://127.0.0.1:{redis_port}/0/txn"
    assert "caf\\xe9" in letters[2]["raw"]

    lines = b"\n".join(entry_text(fields) for fields in ENTRIES) + b"\n"
    (tmp_path / "same.jsonl").write_bytes(lines)
    _, from_file, file_letters = _run(tmp_path, str(tmp_path / "same.jsonl"))
    assert [m["match_id"] for m in matches] == [m["match_id"] for m in from_file]
    assert [(d["reason"], d["line"], d["raw"]) for d in letters] == [
        (d["reason"], d["line"], d["raw"]) for d in file_letters
    ]


def test_a_stream_read_resumes_after_the_last_entry_id(redis_port) -> None:
    url = f"redis://127.0.0.1:{redis_port}/txn"
    with redis.Redis(port=redis_port) as client:
        for i in range(3):
            client.xadd("txn", {"event": _event(i)})
        [step] = InputReader([EventInput(url)], {}, background=False)
        cursor = json.loads(json.dumps(step.cursor))
        assert cursor["kind"] == "redis" and cursor["position"] == 3
        last_id = client.xrevrange("txn", count=1)[0][0].decode()
        assert cursor["id"] == last_id
        for i in range(3, 5):
            client.xadd("txn", {"event": _event(i)})
    [rest] = InputReader([EventInput(url)], {}, cursor=cursor, background=False)
    [batch] = rest.pieces
    assert batch.positions.tolist() == [3, 4] and batch.lines.tolist() == [4, 5]
    assert batch.frame["card_id"].tolist() == ["c3", "c4"]


def test_an_empty_or_missing_stream_is_read_to_its_end_at_once(redis_port) -> None:
    source = RedisSource(f"redis://127.0.0.1:{redis_port}/none")
    assert list(InputReader([EventInput(source.url)], {}, background=False)) == []


def test_a_followed_stream_gets_new_entries_until_sigterm(tmp_path, redis_port) -> None:
    rules = tmp_path / "rules.vigil"
    rules.write_text(RULES)
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cep.cli", "run", str(rules), "--events",
         f"redis://127.0.0.1:{redis_port}/0/txn", "--engine", "embedded", "--follow",
         "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        with redis.Redis(port=redis_port) as client:
            for i in range(3):
                client.xadd("txn", {"event": _event(i)})
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    assert proc.poll() is None, proc.stderr.read()
                    if out.exists() and len(out.read_text().splitlines()) == i + 1:
                        break
                    time.sleep(0.05)
                else:
                    raise AssertionError(f"entry {i} was not matched: {out.read_text()!r}")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped; nothing was checkpointed" in err
    assert "3 event(s)" in err
