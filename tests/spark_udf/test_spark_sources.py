"""The pure-Python streaming sources in Spark: JSON lines (offsets = line numbers) and Redis
Streams (offsets = entry ids), including restarts that continue where the last run stopped."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import redis
from spark_pairs import PairProcessor
from spark_support import BASE_MS

from spark_udf import detect
from spark_udf.sources import EVENT_COLUMN, read_jsonl, read_rate_demo, read_redis, read_socket

pytestmark = pytest.mark.slow


def _drain(frame, checkpoint):
    """Run a streaming frame to the end of what is available; rows and per-batch counts."""
    rows = []

    def collect(batch, batch_id):
        rows.extend((r["_seq"], r["_event"]) for r in batch.collect())

    query = (
        frame.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    return sorted(rows), sizes


def test_jsonl_source_numbers_lines_and_resumes_after_appends(spark, tmp_path):
    src = tmp_path / "events"
    src.mkdir()
    (src / "a.jsonl").write_text('{"n": 0}\n\n{"n": 2}\n')
    (src / "b.jsonl").write_text("".join(f'{{"n": {i}}}\n' for i in range(3, 10)))
    (src / ".hidden.jsonl").write_text('{"n": -1}\n')

    static = read_jsonl(spark, str(src), streaming=False).collect()
    assert sorted((r["_seq"], json.loads(r["_event"])["n"]) for r in static) == [
        (i, i) for i in range(10) if i != 1
    ]

    stream = read_jsonl(spark, str(src), max_records_per_batch=4)
    rows, sizes = _drain(stream, tmp_path / "ck")
    assert [seq for seq, _ in rows] == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sizes == [3, 4, 2]  # 4 lines a batch; the blank line is a position without a row

    # Appended lines (and a half-written last line) after a stop: the rerun reads only what
    # is new and complete, numbering on from where it stopped.
    with open(src / "b.jsonl", "a") as handle:
        handle.write('{"n": 10}\n{"n": 11}\n{"n": 1')
    rows, _ = _drain(read_jsonl(spark, str(src), max_records_per_batch=4), tmp_path / "ck")
    assert rows == [(10, '{"n": 10}'), (11, '{"n": 11}')]


def test_redis_stream_source_reads_in_order_and_resumes(spark, tmp_path, redis_port):
    with redis.Redis(port=redis_port) as client:
        for i in range(7):
            client.xadd("events", {"event": json.dumps({"n": i})})
        client.xadd("events", {"card_id": "c9", "amount": "3"})
    frame = read_redis(spark, "events", port=redis_port, max_records_per_batch=3)
    rows, sizes = _drain(frame, tmp_path / "ck")
    assert [seq for seq, _ in rows] == list(range(8))
    assert [json.loads(text) for _, text in rows[:7]] == [{"n": i} for i in range(7)]
    assert json.loads(rows[7][1]) == {"amount": "3", "card_id": "c9"}
    assert sizes == [3, 3, 2]

    with redis.Redis(port=redis_port) as client:
        client.xadd("events", {"event": json.dumps({"n": 8})})
    rows, _ = _drain(read_redis(spark, "events", port=redis_port), tmp_path / "ck")
    assert rows == [(8, '{"n": 8}')]


def test_redis_stream_source_reads_from_a_url_with_tls_password_and_database(
    spark, tmp_path, redis_tls_url
):
    with redis.Redis.from_url(redis_tls_url) as client:
        for i in range(5):
            client.xadd("events", {"event": json.dumps({"n": i})})
    rows, sizes = _drain(
        read_redis(spark, "events", url=redis_tls_url, max_records_per_batch=2), tmp_path / "ck"
    )
    assert rows == [(i, json.dumps({"n": i})) for i in range(5)]
    assert sizes == [2, 2, 1]


def _wait_for_rows(spark, query, table, predicate, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        rows = spark.sql(f"select * from {table}").collect()
        if predicate(rows):
            return rows
        time.sleep(0.5)
    raise AssertionError(f"{table} never satisfied the check: {rows}")


def test_socket_and_rate_demo_sources_feed_the_operator(spark, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    lines = [
        {"k": "s", "ts": BASE_MS, "kind": "a"},
        {"k": "s", "ts": BASE_MS + 100, "kind": "b"},
        {"k": "z", "ts": BASE_MS + 10_000, "kind": "c"},  # moves the watermark on
    ]
    done = threading.Event()

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.sendall("".join(json.dumps(line) + "\n" for line in lines).encode())
            done.wait(120)

    threading.Thread(target=serve, daemon=True).start()
    frame = read_socket(spark, "127.0.0.1", port)
    out = detect(frame, PairProcessor(3_000), key_cols=["k"], time_col="ts", lateness=0,
                 json_col=EVENT_COLUMN, stream="ev", buckets=2)
    query = out.writeStream.format("memory").queryName("socket_matches").start()
    try:
        rows = _wait_for_rows(spark, query, "socket_matches", lambda rows: len(rows) >= 1)
        assert [(r.kind, r.name, json.loads(r.key)) for r in rows] == [("rule", "pair", {"k": "s"})]
    finally:
        query.stop()
        done.set()
        server.close()

    frame = read_rate_demo(spark, rows_per_second=50, keys=5)
    out = detect(frame, PairProcessor(3_000), key_cols=["k"], time_col="ts", lateness="1s",
                 buckets=2)
    query = (
        out.writeStream.format("memory").queryName("rate_matches")
        .option("checkpointLocation", str(tmp_path / "rate-ck")).start()
    )
    try:
        rows = _wait_for_rows(spark, query, "rate_matches",
                              lambda rows: any(r.name == "pair" for r in rows))
        assert {r.kind for r in rows} == {"rule"}
    finally:
        query.stop()
