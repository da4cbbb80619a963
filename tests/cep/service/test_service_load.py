"""A bounded load over loopback: 1,000 registry changes while 100,000 events are posted. Every
acknowledged change is in effect afterwards, and every event is accounted for."""

from __future__ import annotations

import json
import threading

import httpx
from service_support import STREAM, T0

from query_lang import print_declaration

NAMES = 5
CHANGES = 1000
EVENTS = 100_000
BATCH = 500


def _rule(k: int, threshold: int) -> str:
    return (f'rule r{k} from txn by card pattern b '
            f'define b as card == "k{k}" and amount > {threshold}\n')


def test_changes_while_events_flow(live_factory):
    server, w, r = live_factory()
    service = server.server.config.app.state.service
    errors: list[BaseException] = []
    last: dict[str, int | None] = {}  # name -> threshold of the last acknowledged change
    counts = {"posted": 0, "accepted": 0, "dead": 0, "late": 0}

    def change() -> None:
        try:
            with httpx.Client(base_url=server.url, headers=w, timeout=60) as client:
                for i in range(CHANGES):
                    k = i % NAMES
                    if i % 7 == 6 and last.get(f"r{k}") is not None:
                        answer = client.delete(f"/queries/r{k}")
                        assert answer.status_code == 200, answer.text
                        last[f"r{k}"] = None
                    else:
                        answer = client.put(f"/queries/r{k}", content=_rule(k, 1000 + i))
                        assert answer.status_code in (200, 201), answer.text
                        last[f"r{k}"] = 1000 + i
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def post() -> None:
        try:
            with httpx.Client(base_url=server.url, headers=w, timeout=60) as client:
                for start in range(0, EVENTS, BATCH):
                    body = []
                    for i in range(start, start + BATCH):
                        if i % 97 == 0:
                            body.append("{not json")
                        else:
                            body.append(json.dumps({"stream": "txn", "card": f"c{i % 50}",
                                                    "amount": i % 2000, "ts": T0 + i}))
                    answer = client.post("/events", content="\n".join(body) + "\n")
                    assert answer.status_code == 200, answer.text
                    got = answer.json()
                    counts["posted"] += BATCH
                    for key in ("accepted", "dead", "late"):
                        counts[key] += got[key]
        except BaseException as exc:
            errors.append(exc)

    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.put("/queries/txn", content=STREAM, headers=w).status_code == 201
        threads = [threading.Thread(target=change), threading.Thread(target=post)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert counts["posted"] == EVENTS
        assert counts["accepted"] + counts["dead"] + counts["late"] == EVENTS
        assert counts["dead"] == len(range(0, EVENTS, 97))

        # Every acknowledged change is in effect: the engine runs the registry's program ...
        version = client.get("/status", headers=r).json()["registry_version"]
        client.put("/queries/txn", content=STREAM, headers=w, params={"wait": "true"})
        assert client.get("/status", headers=r).json()["applied_version"] == version
        live = {name: t for name, t in last.items() if t is not None}
        engine = service.runner.engine
        assert sorted(engine.rules) == sorted(live)
        registered = {d.name: print_declaration(d) for d in engine.declarations
                      if d.name in live}
        stored = {e.name: e.text for e in service.registry.store.current() if e.name in live}
        assert registered == stored
        # ... and behaves so: each live rule takes an event over its newest threshold only.
        after = client.get("/status", headers=r).json()["matches_cursor"]
        probe = [json.dumps({"stream": "txn", "card": f"k{k}", "amount": last[f"r{k}"] + d,
                             "ts": T0 + EVENTS + 10 * k})
                 for k in range(NAMES) if last.get(f"r{k}") is not None for d in (-0.5, 0.5)]
        client.post("/events", content="\n".join(probe) + "\n", headers=w)
        matched = client.get("/matches", headers=r, params={"after": after}).json()["matches"]
        assert sorted(m["name"] for m in matched) == sorted(live)
        assert all(m["registry_version"] == version for m in matched)
