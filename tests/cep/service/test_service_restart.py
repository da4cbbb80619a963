"""`vigil serve` killed with SIGKILL while events and registry changes flow, then restarted on
the same state: no acknowledged change lost, no match lost or duplicated, and a partial match
begun before the kill completes after it."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from contextlib import closing

import httpx
from redis_servers import free_port
from serve_processes import ServeProcess
from service_support import STREAM, lines, rule, txn

from cep.cli import main
from cep.service import TokenStore

SERVE = ["--registry", "registry.sqlite", "--state", "state", "--checkpoint-interval", "0.3"]
PROBE = ("rule probe from txn by card pattern s b within 1h "
         "define s as amount < 1, b as amount > 500\n")


def test_sigkill_and_restart_lose_and_repeat_nothing(tmp_path):
    tokens = TokenStore(str(tmp_path / "state"))
    token = tokens.create("ana", "write")
    tokens.close()
    auth = {"Authorization": f"Bearer {token}"}
    port = free_port()
    server = ServeProcess(tmp_path, SERVE, port)
    client = httpx.Client(base_url=server.url, headers=auth, timeout=30)
    assert client.put("/queries/probe", content=STREAM + PROBE).status_code == 201
    assert client.put("/queries/big", content=rule("big", "amount > 900")).status_code == 201
    assert client.post("/events", content=lines(txn("keep", 0.5, 0))).json()["accepted"] == 1

    acknowledged: dict[int, int] = {}  # batch -> matches it reported
    changes: dict[str, int] = {}  # rule -> threshold of its last acknowledged change
    stop = threading.Event()

    def post() -> None:
        with httpx.Client(base_url=server.url, headers=auth, timeout=30) as own:
            second = 10.0
            while not stop.is_set():  # 2 s of event time a batch: the probe's hour lasts
                body = lines(*[txn(f"c{i % 7}", (i * 37) % 1000, second + i / 100)
                               for i in range(200)])
                second += 2
                try:
                    answer = own.post("/events", content=body)
                except httpx.TransportError:
                    return
                if answer.status_code == 200:
                    acknowledged[answer.json()["batch"]] = answer.json()["matches"]

    def change() -> None:
        with httpx.Client(base_url=server.url, headers=auth, timeout=30) as own:
            i = 0
            while not stop.is_set():
                name, threshold = f"r{i % 5}", 100 + i
                try:
                    answer = own.put(f"/queries/{name}", content=rule(name, f"amount > "
                                                                          f"{threshold}"))
                except httpx.TransportError:
                    return
                if answer.status_code in (200, 201):
                    changes[name] = threshold
                i += 1

    workers = [threading.Thread(target=post), threading.Thread(target=change)]
    for worker in workers:
        worker.start()
    give_up = time.monotonic() + 30
    while (len(acknowledged) < 12 or len(changes) < 5) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    stop.set()
    for worker in workers:
        worker.join()
    assert len(acknowledged) >= 12 and len(changes) == 5

    server = ServeProcess(tmp_path, SERVE, port)
    try:
        # Every acknowledged change is there, and in effect.
        for name, threshold in changes.items():
            text = client.get(f"/queries/{name}").json()["text"]
            assert f"amount > {threshold}" in text or _later(client, name, threshold)
        status = client.get("/status").json()
        assert status["applied_version"] == status["registry_version"]
        # Every acknowledged batch's matches are in the log, each once.
        logged, after = [], 0
        while True:
            page = client.get("/matches", params={"after": after, "limit": 1000}).json()
            if not page["matches"]:
                break
            logged += page["matches"]
            after = page["next"]
        ids = [m["match_id"] for m in logged]
        assert len(ids) == len(set(ids))
        per_batch: dict[int, int] = {}
        for match in logged:
            per_batch[match["batch"]] = per_batch.get(match["batch"], 0) + 1
        for batch, count in acknowledged.items():
            assert per_batch.get(batch, 0) == count, batch
        # The engine's state survived: the probe begun before the kill completes now.
        done = client.post("/events", content=lines(txn("keep", 950, 3000)))
        names = [m["name"] for m in client.get("/matches", params={"after": after})
                 .json()["matches"]]
        assert done.json()["matches"] == len(names) and "probe" in names
    finally:
        client.close()
        # uvicorn ends by the signal it handled (a shell shows 143), after a clean shutdown
        assert server.stop(signal.SIGTERM) == -signal.SIGTERM
    log = (tmp_path / "serve.log").read_text()
    assert token not in log and "Traceback" not in log
    # the clean shutdown saved a checkpoint of everything: no batch is left to feed again
    with closing(sqlite3.connect(tmp_path / "state" / "serve.sqlite")) as db:
        assert db.execute("SELECT count(*) FROM batches").fetchone()[0] == 0


def _later(client: httpx.Client, name: str, threshold: int) -> bool:
    """Whether a change to ``name`` after the acknowledged one landed (its answer was lost in
    the kill): the history holds the acknowledged one, and a newer version."""
    history = client.get(f"/queries/{name}/history").json()["history"]
    texts = [h["text"] or "" for h in history]
    return any(f"amount > {threshold}" in t for t in texts[:-1])


def test_the_token_commands(tmp_path, capsys):
    state = ["--state", str(tmp_path / "state")]
    assert main(["serve", "token", "create", "bo", "--scope", "read", *state]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert token.startswith("vgl_") and "shown this once" in err
    assert main(["serve", "token", "create", "bo", *state]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["serve", "token", "list", *state]) == 0
    listed = capsys.readouterr().out
    assert "bo " in listed and "read" in listed and token not in listed
    assert main(["serve", "token", "revoke", "bo", *state]) == 0
    assert main(["serve", "token", "list", *state]) == 0
    assert "revoked" in capsys.readouterr().out
    assert token.encode() not in (tmp_path / "state" / "tokens.sqlite").read_bytes()
    assert main(["serve", "--state", str(tmp_path / "state"), "token", "revoke", "bo"]) == 1
