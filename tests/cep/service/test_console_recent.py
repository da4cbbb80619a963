"""The events the service keeps for the console (``cep.service.recent``): bounded rings per
stream that survive a restart in ``recent.sqlite`` of the state directory, written a moment
after each change and when the service stops."""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing

from service_support import STREAM, in_process_client, lines, make_service, rule, txn

from cep.service import create_app
from cep.service.intake import parse_events
from cep.service.recent import RecentEvents


def _post(ring: RecentEvents, batch: int, *events: dict) -> None:
    body = lines(*events)
    ring.add(parse_events(body), None, batch=batch, received=len(events))


def _rows(path) -> list[tuple[str, int | None]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT stream, position FROM events ORDER BY seq").fetchall()


def test_the_rings_survive_and_the_file_holds_no_more_than_they_do(tmp_path):
    path = tmp_path / "recent.sqlite"
    ring = RecentEvents(size=3, path=path)
    ring.start(position=0, batch=1)
    for batch in range(1, 21):  # 40 events of txn, 20 of a second stream
        _post(ring, batch, txn("c1", batch, batch), txn("c2", batch, batch),
              {"stream": "news", "n": batch})
    ring.close()
    assert sorted(_rows(path)) == [("news", 53), ("news", 56), ("news", 59),
                                   ("txn", 55), ("txn", 57), ("txn", 58)]
    again = RecentEvents(size=3, path=path)
    assert (again.restored, again.streams()) == (6, {"news": 3, "txn": 3})
    assert [(p, e["amount"]) for _, p, e in again.last("txn", 10)] == \
        [(55, 19), (57, 20), (58, 20)]
    assert again.at([59, 1]) == {59: ("news", {"stream": "news", "n": 20})}
    # The order across streams goes on from where it was: the new event is the newest.
    again.start(position=60, batch=21)
    _post(again, 21, txn("c3", 1, 99))
    assert [e["card"] for _, _, e in again.last("txn", 10)] == ["c1", "c2", "c3"]
    [(newest, _, _)] = again.last("txn", 1)
    assert all(seq < newest for seq, _, _ in again.last("news", 10))
    again.close()
    assert len(_rows(path)) == 6
    # A smaller ring than the file was written with: the file is trimmed to it.
    small = RecentEvents(size=1, path=path)
    assert small.streams() == {"news": 1, "txn": 1}
    small.close()
    assert sorted(_rows(path)) == [("news", 59), ("txn", 60)]


def test_new_events_reach_the_file_without_a_stop(tmp_path):
    path = tmp_path / "recent.sqlite"
    ring = RecentEvents(size=10, path=path, flush_s=0.05)
    ring.start(position=0, batch=1)
    _post(ring, 1, txn("c1", 1, 0), txn("c1", 2, 1))
    give_up = time.monotonic() + 10
    while len(_rows(path)) < 2 and time.monotonic() < give_up:
        time.sleep(0.02)
    assert _rows(path) == [("txn", 0), ("txn", 1)]  # as a kill -9 would leave it
    ring.close()


def test_positions_the_engine_no_longer_has_are_forgotten(tmp_path):
    path = tmp_path / "recent.sqlite"
    ring = RecentEvents(size=10, path=path)
    ring.start(position=5, batch=1)
    _post(ring, 1, txn("c1", 1, 0), txn("c2", 2, 1))
    ring.close()
    again = RecentEvents(size=10, path=path)
    again.start(position=6, batch=1)  # the engine starts over below them (state deleted)
    assert again.at([5, 6]) == {5: ("txn", txn("c1", 1, 0))}
    assert len(again.last("txn", 10)) == 2  # still events to try a text on
    again.close()


def test_an_unreadable_file_leaves_the_rings_in_memory(tmp_path):
    path = tmp_path / "recent.sqlite"
    path.write_bytes(b"not a database" * 100)
    ring = RecentEvents(size=10, path=path)
    assert not ring.persistent and ring.streams() == {}
    _post(ring, None, txn("c1", 1, 0))
    assert ring.streams() == {"txn": 1}
    ring.close()


def test_try_over_the_last_events_after_a_restart(tmp_path):
    service = make_service(tmp_path)
    write = {"Authorization": f"Bearer {service.tokens.create('ana', 'write')}"}
    with in_process_client(create_app(service)) as client:
        client.put("/queries/big", content=STREAM + rule("big", "amount > 100"), headers=write)
        client.post("/events", content=lines(*(txn("c1", 100 * i, i) for i in range(5))),
                    headers=write)
    with in_process_client(create_app(make_service(tmp_path))) as client:
        kept = client.get("/events/recent", headers=write).json()
        assert kept == {"streams": {"txn": 5}, "size": 1000, "persistent": True,
                        "restored": 5}
        answer = client.post("/try", headers=write,
                             json={"text": rule("t", "amount > 250"), "last": 100}).json()
        assert (answer["source"], answer["events"]) == ("recent", 5)
        assert len(answer["matches"]) == 2  # 300 and 400


def test_events_without_a_stream_field_are_kept_under_the_programs_only_stream(tmp_path):
    service = make_service(tmp_path)
    write = {"Authorization": f"Bearer {service.tokens.create('ana', 'write')}"}
    bare = [{k: v for k, v in txn("c1", 100 * i, i).items() if k != "stream"} for i in range(3)]
    with in_process_client(create_app(service)) as client:
        client.put("/queries/big", content=STREAM + rule("big", "amount > 150"), headers=write)
        answer = client.post("/events", content=lines(*bare), headers=write).json()
        assert answer["accepted"] == 3  # the engine puts them in txn, the only stream
        kept = client.get("/events/recent", headers=write, params={"stream": "txn"}).json()
        assert [e["event"] for e in kept["events"]] == bare
        match = client.get("/matches", headers=write).json()["matches"][0]
        opened = client.get("/events/recent", headers=write,
                            params={"positions": str(match["events"]["b"][0])}).json()
        assert [e["event"]["amount"] for e in opened["events"]] == [200]
