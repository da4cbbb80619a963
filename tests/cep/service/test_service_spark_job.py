"""The service next to a Spark job (``cep.service.spark_job``), with the job's output written
here as its sink and commit log write it: posted events in the Redis stream, committed
micro-batches imported once, refusals. The job itself runs in
tests/spark_udf/test_serve_spark.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import redis
from redis_servers import free_port
from service_support import in_process_client, make_service

from cep.cli import main
from cep.service import ServiceError, create_app
from cep.service.spark_job import SparkJob
from spark_udf.sinks import BatchSink


class _Job:
    """What a Spark job leaves in its output directory and checkpoint: its sink's files, and
    its commit log's entry once a micro-batch is done."""

    def __init__(self, out: Path) -> None:
        self.out = out
        (out / "_checkpoint" / "commits").mkdir(parents=True)
        self.sink = BatchSink(str(out), dead_letter=str(out / "dead"))

    def write(self, batch: int, matches: list[dict], dead: list[dict] = ()) -> None:
        rows = [("rule", m["name"], m["match_id"], m) for m in matches] + [
            ("dead_letter", d["reason"], f"d{batch}-{i}", d) for i, d in enumerate(dead)]
        self.sink.write_batch(pd.DataFrame(
            [(kind, name, match_id, json.dumps(payload)) for kind, name, match_id, payload in rows],
            columns=["kind", "name", "match_id", "payload"]), batch)

    def commit(self, batch: int, matches: list[dict], dead: list[dict] = ()) -> None:
        self.write(batch, matches, dead)
        (self.out / "_checkpoint" / "commits" / str(batch)).write_text("v1\n{}\n")


@pytest.fixture
def linked(tmp_path, redis_port):
    """(client, write headers, job, redis client, service factory) of a service next to a job."""
    out = tmp_path / "out"
    out.mkdir()
    job = _Job(out)
    spec = SparkJob(f"redis://127.0.0.1:{redis_port}/0/events", str(out),
                    dead_letter=str(out / "dead"))
    opened = []

    def start():
        service = make_service(tmp_path, spark_job=spec)
        headers = {"Authorization": f"Bearer {service.tokens.create(f'w{len(opened)}', 'write')}"}
        client = in_process_client(create_app(service))
        client.__enter__()
        opened.append(client)
        return client, headers

    yield start, job, redis.Redis(port=redis_port)
    for client in opened:
        client.__exit__(None, None, None)


def _wait_for(condition):
    import time

    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_posted_events_go_to_the_stream_whole_and_bad_lines_are_refused(linked):
    start, _, store = linked
    client, w = start()
    body = b'{"a": 1}\n\n{oops\n{"a": 2}\n'
    answer = client.post("/events", content=body, headers=w, params={"stream": "s"})
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert (got["received"], got["appended"], got["dead"], got["first_position"]) == (3, 2, 1, 0)
    assert got["reasons"] == {"invalid_json": 1}
    entries = store.xrange("events")
    assert [json.loads(fields[b"event"]) for _, fields in entries] == [
        {"a": 1, "stream": "s"}, {"a": 2, "stream": "s"}]
    assert got["ids"] == [entries[0][0].decode(), entries[1][0].decode()]
    letters = client.get("/dead-letters", headers=w).json()["dead_letters"]
    assert [(d["reason"], d["line"]) for d in letters] == [("invalid_json", 3)]
    # The next body's events take the next positions, those a job's _seq gives them.
    again = client.post("/events", content=b'{"a": 3}\n', headers=w).json()
    assert again["first_position"] == 2
    kept = client.get("/events/recent", headers=w, params={"positions": "0,1,2"}).json()
    assert [e["position"] for e in kept["events"]] == [0, 1] and kept["missing"] == [2]


def test_committed_micro_batches_are_imported_once(linked):
    start, job, _ = linked
    job.commit(0, [{"name": "big", "match_id": "m1", "registry_version": 1}],
               [{"reason": "late", "detail": "behind"}])
    client, w = start()
    got = client.get("/matches", headers=w).json()["matches"]
    assert [(m["match_id"], m["batch"], m["registry_version"]) for m in got] == [("m1", 0, 1)]
    # Batches without output, then one with: imported as the job commits them.
    job.commit(1, [])
    job.write(3, [{"name": "big", "match_id": "m3"}])
    job.commit(2, [{"name": "big", "match_id": "m2", "registry_version": 2}])
    _wait_for(lambda: len(client.get("/matches", headers=w).json()["matches"]) == 2)
    status = client.get("/status", headers=w).json()
    assert status["applied_version"] == 2 and status["engine"]["spark_batch"] == 2, status
    # m3's batch is not committed: a replay may still rewrite its file.
    assert [m["match_id"] for m in client.get("/matches", headers=w).json()["matches"]] == [
        "m1", "m2"]
    letters = client.get("/dead-letters", headers=w).json()["dead_letters"]
    assert [(d["reason"], d["batch"]) for d in letters] == [("late", 0)]


def test_a_restart_imports_nothing_twice(linked):
    start, job, _ = linked
    job.commit(0, [{"name": "big", "match_id": "m1"}])
    client, w = start()
    assert len(client.get("/matches", headers=w).json()["matches"]) == 1
    client.__exit__(None, None, None)  # the service stops
    job.commit(1, [{"name": "big", "match_id": "m2"}])
    client, w = start()
    assert [m["match_id"] for m in client.get("/matches", headers=w).json()["matches"]] == [
        "m1", "m2"]


def test_a_stream_that_goes_away_answers_503_and_the_body_is_not_half_taken(linked):
    start, _, store = linked
    client, w = start()
    store.shutdown(nosave=True)
    answer = client.post("/events", content=b'{"a": 1}\n', headers=w)
    assert answer.status_code == 503, answer.text
    assert "did not take the events" in answer.json()["detail"]


def test_refusals(tmp_path, redis_port, capsys):
    out = tmp_path / "out"
    nowhere = SparkJob(f"redis://127.0.0.1:{free_port()}/0/events", str(out))
    with pytest.raises(ServiceError, match="cannot be reached"):
        make_service(tmp_path, spark_job=nowhere)
    job = SparkJob(f"redis://127.0.0.1:{redis_port}/0/events", str(out))
    make_service(tmp_path, spark_job=job).stop()
    # The state now serves that job: not the embedded engine, nor another job.
    with pytest.raises(ServiceError, match="served next to the Spark job"):
        make_service(tmp_path)
    other = SparkJob(job.events_url, str(tmp_path / "other"))
    with pytest.raises(ServiceError, match="not .*other"):
        make_service(tmp_path, spark_job=other)
    # A state the embedded engine used is not served next to a job.
    embedded = tmp_path / "embedded"
    os.makedirs(embedded)
    service = make_service(embedded)
    service.start()
    service.runner.submit(b'{"a": 1}\n').result(timeout=30)
    service.stop()
    with pytest.raises(ServiceError, match="embedded engine's batches and checkpoint"):
        make_service(embedded, spark_job=job)
    assert main(["serve", "--spark-out", str(out), "--state", str(tmp_path / "x")]) == 2
    assert "--spark-out and --events-to go together" in capsys.readouterr().err


def test_a_batch_that_cannot_be_read_is_said_and_tried_again(linked):
    start, job, _ = linked
    client, w = start()
    (job.out / "part-000000000000.jsonl").write_text('{"name": "big", "match_id": "m1"\n')
    (job.out / "_checkpoint" / "commits" / "0").write_text("v1\n{}\n")
    _wait_for(lambda: client.get("/status", headers=w).json()["apply_error"])
    error = client.get("/status", headers=w).json()["apply_error"]
    assert "importing the Spark job's micro-batches" in error, error
    assert client.post("/events", content=b'{"a": 1}\n', headers=w).status_code == 200
    job.write(0, [{"name": "big", "match_id": "m1"}])  # the file as the sink writes it
    _wait_for(lambda: client.get("/matches", headers=w).json()["matches"])
    assert client.get("/status", headers=w).json()["apply_error"] is None
