"""The Redis Streams source's reader against a real ``redis-server``, without Spark: offsets
are entry ids, a finite read stops at the last entry when it started, entries are the event
JSON, and the server is reached through redis-py (URLs with user, password, database, TLS)."""

from __future__ import annotations

import json

import pytest
import redis
from redis_servers import free_port

from cep.events.event import BadEventError, parse_json_line
from cep.events.limits import shown_line
from spark_udf.errors import RedisSourceError
from spark_udf.sources import RedisStreamSource


def _reader(**options: str):
    return RedisStreamSource({"stream": "events", **options}).streamReader(None)


def _rows(reader, start: dict, end: dict) -> list[tuple[int, str]]:
    return [
        (seq, text)
        for part in reader.partitions(start, end)
        for batch in reader.read(part)
        for seq, text in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                             strict=True)
    ]


def test_offsets_are_entry_ids_and_a_finite_read_stops_at_its_last_entry(redis_port):
    with redis.Redis(port=redis_port) as client:
        ids = [client.xadd("events", {"event": json.dumps({"n": i})}).decode()
               for i in range(5)]
        ids.append(client.xadd("events", {"card_id": "c9", "amount": "3", "bad": b"\xff"})
                   .decode())
        reader = _reader(port=str(redis_port), maxRecordsPerBatch="4")
        reader.prepareForTriggerAvailableNow()
        client.xadd("events", {"event": json.dumps({"n": 99})})  # after the read began
    start = reader.initialOffset()
    assert start == {"id": "0-0", "seq": 0}
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert first == {"id": ids[3], "seq": 4}
    second = reader.latestOffset(first, reader.getDefaultReadLimit())
    assert second == {"id": ids[5], "seq": 6}
    assert reader.latestOffset(second, reader.getDefaultReadLimit()) == second
    assert reader.partitions(second, second) == []
    rows = _rows(reader, start, first) + _rows(reader, first, second)
    assert rows[:5] == [(i, json.dumps({"n": i})) for i in range(5)]
    # An entry without the event field is the JSON object of all its fields; one holding bytes
    # that are not UTF-8 is marked, and becomes an invalid_utf8 dead letter showing them.
    with pytest.raises(BadEventError, match="invalid_utf8"):
        parse_json_line(rows[5][1])
    assert json.loads(shown_line(rows[5][1])) == {"amount": "3", "bad": "\\xff", "card_id": "c9"}


def test_a_url_with_user_password_database_and_tls_reaches_the_stream(redis_tls_url):
    with redis.Redis.from_url(redis_tls_url) as client:
        entry = client.xadd("events", {"event": '{"n": 1}'}).decode()
    reader = _reader(url=redis_tls_url)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"id": entry, "seq": 1}
    assert _rows(reader, start, end) == [(0, '{"n": 1}')]
    # Database 3 holds the stream; database 0 of the same server has none.
    other = _reader(url=redis_tls_url.replace("/3?", "/0?"))
    assert other.latestOffset(start, other.getDefaultReadLimit()) == start


def test_refused_credentials_and_unreachable_servers_are_resp_errors(redis_tls_url):
    reader = _reader(url=redis_tls_url.replace(":secret@", ":wrong@"))
    with pytest.raises(RedisSourceError, match="password"):
        reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    reader = _reader(port=str(free_port()))
    with pytest.raises(RedisSourceError, match="Redis at 127.0.0.1"):
        reader.prepareForTriggerAvailableNow()
