"""``vigil serve --spark-out DIR --events-to redis://...`` next to ``vigil run --registry PATH
--follow --engine spark``: the API without an engine of its own, as a user runs the two.

Events posted to the service reach the job through its Redis stream; the job's committed
micro-batches reach the service's match log; registry changes made through the API run on the
job from its next micro-batch (``?wait=true`` answers once they do). The matches are those of
the embedded engine given the same changes at the same place (tests/registry_changes.py), each
with its registry version; a line that is no event is refused at the API; the job's alerts are
shown from its outbox; a restarted service imports nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from redis_servers import free_port
from registry_changes import AMOUNTS_1, AMOUNTS_2, FRESH, SMALL_2, STREAM, V1, expected, key, lines
from serve_processes import ServeProcess

from cep.alerts import WebhookReceiver, new_secret
from cep.registry import Registry
from cep.service import TokenStore

pytestmark = pytest.mark.slow

DEADLINE_S = 300.0


def _wait(condition, processes, what: str, logs: Path):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        for proc in processes:
            if proc.poll() is not None:
                raise AssertionError(f"a process ended while waiting for {what}: "
                                     f"{_tail(logs)}")
        time.sleep(0.25)
    raise AssertionError(f"no {what} after {DEADLINE_S}s: {_tail(logs)}")


def _tail(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))


def test_the_api_next_to_a_spark_job(tmp_path: Path, redis_port: int) -> None:
    with_change, _ = expected()
    secret = new_secret()
    receiver = WebhookReceiver(secret)
    receiver.start()
    registry_path, state, out = tmp_path / "registry.sqlite", tmp_path / "state", tmp_path / "out"
    dead = tmp_path / "dead"
    hook = (f'webhook ops url "{receiver.url}" secret env OPS_SECRET\n'
            "rule alarm from txn by card_id pattern a define a as amount > 550 notify ops\n")
    (tmp_path / "v1.vigil").write_text(V1 + hook)
    with Registry(registry_path) as registry:
        registry.push([str(tmp_path / "v1.vigil")])
    tokens = TokenStore(str(state))
    auth = {"Authorization": f"Bearer {tokens.create('ana', 'write')}"}
    tokens.close()
    stream = f"redis://127.0.0.1:{redis_port}/0/txn"
    serve_args = ["--registry", str(registry_path), "--state", str(state),
                  "--spark-out", str(out), "--events-to", stream, "--spark-dead-letter", str(dead)]
    serve = ServeProcess(tmp_path, serve_args)
    job_log = open(tmp_path / "job.log", "w")
    job = subprocess.Popen(
        [sys.executable, "-m", "cep.cli", "run", "--registry", str(registry_path),
         "--events", stream, "--engine", "spark", "--master", "local[2]", "--follow",
         "--out", str(out), "--dead-letter", str(dead), "--buckets", "4"],
        stdout=subprocess.DEVNULL, stderr=job_log, cwd=tmp_path,
        env={**os.environ, "OPS_SECRET": secret},
    )
    processes = [job, serve.process]
    try:
        client = httpx.Client(base_url=serve.url, headers=auth, timeout=60)

        def matches() -> list[dict]:
            return client.get("/matches", params={"limit": 1000}).json()["matches"]

        # A line that is no event is refused at the API; the others reach the job's stream.
        body = "".join(lines(AMOUNTS_1, 0)) + "{not json\n"
        answer = client.post("/events", content=body).json()  # txn: the only stream
        assert (answer["received"], answer["appended"], answer["dead"]) == (8, 7, 1), answer
        assert answer["reasons"] == {"invalid_json": 1} and answer["first_position"] == 0
        refused = client.get("/dead-letters").json()["dead_letters"]
        assert [d["reason"] for d in refused] == ["invalid_json"], refused

        first = {k for k in with_change if max(_positions(k)) < len(AMOUNTS_1)}
        _wait(lambda: {key(m) for m in matches() if m["name"] != "alarm"} >= first,
              processes, "the job's matches of the first events", tmp_path)

        # Registry changes through the API run on the job from its next micro-batch.
        assert client.delete("/queries/gone").status_code == 200
        assert client.put("/queries/small", content=STREAM + SMALL_2).status_code == 200
        answer = client.put("/queries/fresh", params={"wait": "true"},
                            content=STREAM + FRESH).json()
        assert (answer["registry_version"], answer["applied_version"]) == (4, 4), answer

        # The job's own dead letters (an event without its time) come to the log too.
        untimed = '{"card_id": "c1", "amount": 5}\n'
        second = client.post("/events", params={"stream": "txn"},
                             content="".join(lines(AMOUNTS_2, len(AMOUNTS_1))) + untimed).json()
        assert second["first_position"] == len(AMOUNTS_1), second
        _wait(lambda: len([m for m in matches() if m["name"] != "alarm"]) >= len(with_change),
              processes, "every match", tmp_path)
        time.sleep(3)  # a few more micro-batches: nothing else may come

        got = [m for m in matches() if m["name"] != "alarm"]
        assert len({m["match_id"] for m in got}) == len(got), "a match was logged twice"
        assert {key(m) for m in got} == with_change
        for m in got:
            last = max(p for positions in m["events"].values() for p in positions)
            assert m["registry_version"] == (1 if last < len(AMOUNTS_1) else 4), m

        # A rule match opens to its events: the console kept them at the stream's positions.
        some = next(m for m in got if m["name"] == "twice")
        positions = ",".join(str(p) for ps in some["events"].values() for p in ps)
        kept = client.get("/events/recent", params={"positions": positions}).json()
        posted = [json.loads(line) for line in
                  lines(AMOUNTS_1, 0) + lines(AMOUNTS_2, len(AMOUNTS_1))]
        assert not kept["missing"] and kept["events"], kept
        assert all(e["event"] == posted[e["position"]] for e in kept["events"]), kept

        # The job delivers its alerts; the service shows its outbox.
        alarms = [m for m in matches() if m["name"] == "alarm"]
        assert len(alarms) == sum(a > 550 for a in AMOUNTS_1 + AMOUNTS_2)
        _wait(lambda: len(receiver.webhook_ids) == len(alarms), processes,
              "the job's alerts delivered", tmp_path)
        endpoints = _wait(lambda: [e for e in client.get("/alerts").json()["endpoints"]
                                   if e["delivered"] == len(alarms)],
                          processes, "the outbox's status", tmp_path)
        assert endpoints[0]["endpoint"] == "ops" and endpoints[0]["pending"] == 0
        letters = _wait(lambda: client.get("/dead-letters").json()["dead_letters"][1:],
                        processes, "the job's dead letter", tmp_path)
        assert letters[0]["batch"] >= 0 and '"amount": 5' in letters[0]["raw"], letters
        status = client.get("/status").json()
        assert status["engine"]["imported_matches"] == len(got) + len(alarms), status
        client.close()

        # A restarted service imports nothing twice, and refuses to serve that state alone.
        serve.stop()
        serve = ServeProcess(tmp_path, serve_args)
        processes[1] = serve.process
        with httpx.Client(base_url=serve.url, headers=auth, timeout=60) as again:
            after = again.get("/matches", params={"limit": 1000}).json()["matches"]
            assert sorted(m["match_id"] for m in after) == sorted(
                m["match_id"] for m in got + alarms)
            assert again.get("/status").json()["applied_version"] == 4
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=DEADLINE_S)
        job_log.close()
        serve.stop()
        receiver.stop()
    alone = subprocess.run(
        [sys.executable, "-m", "cep.cli", "serve", "--registry", str(registry_path), "--state",
         str(state), "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert alone.returncode != 0 and "served next to the Spark job" in alone.stderr, alone.stderr


def _positions(k: tuple) -> list[int]:
    return [p for ps in json.loads(k[2]).values() for p in ps]
