"""`vigil serve` over loopback: how fast ``POST /events`` feeds the embedded engine, and how
long a registry change takes to be in effect with many standing queries registered::

    .venv/bin/python bench/bench_service.py [--events 200000] [--batch 20000] [--queries 10000]

*Ingestion*: batches of JSON lines posted one after another to a service in this process
(uvicorn on 127.0.0.1, one engine thread), each answered once its matches are durable; the
program is two rules and a metric over 5,000 cards. Reported: events/s end to end, and the
server process's CPU seconds per wall second (how many cores it used), and events per CPU
second (the rate of one core of its own, when the machine is shared).

*Change*: ``--queries`` standing queries registered, then a query added, one replaced and one
deleted through the API, after one event was posted (which builds the query index, as in a
service that runs). Reported per change: the time until the API acknowledged it (the
registry's check and its write), and from the acknowledgement until the engine ran it
(``/status``'s ``applied_version``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time

import httpx
import uvicorn

from cep.registry import Registry
from cep.service import Service, ServiceConfig, create_app

PROGRAM = """
stream txn (card string, amount float, merchant string, ts timestamp) time ts
rule big from txn by card pattern b define b as amount > 990
rule probe from txn by card pattern s b within 10m define s as amount < 2, b as amount > 900
metric spend from txn by merchant window tumbling 1m select sum(amount) as total
"""
T0 = 1_767_225_600


class LiveServer:
    """The service under uvicorn on 127.0.0.1 and a free port, in a thread of this process."""

    def __init__(self, service: Service) -> None:
        config = uvicorn.Config(create_app(service), host="127.0.0.1", port=0,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()


def _service(directory: str) -> tuple[LiveServer, dict[str, str]]:
    service = Service(ServiceConfig(registry=os.path.join(directory, "registry.sqlite"),
                                    state_dir=os.path.join(directory, "state"), rate=0,
                                    max_body=64 << 20))
    token = service.tokens.create("bench", "write")
    return LiveServer(service), {"Authorization": f"Bearer {token}"}


def ingestion(events: int, batch: int) -> dict:
    rng = random.Random(7)
    bodies = []
    for start in range(0, events, batch):
        bodies.append("".join(
            json.dumps({"stream": "txn", "card": f"c{rng.randrange(5000)}",
                        "amount": round(rng.random() * 1000, 2),
                        "merchant": f"m{rng.randrange(50)}", "ts": T0 + (start + i) / 100})
            + "\n" for i in range(min(batch, events - start))).encode())
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as directory:
        server, auth = _service(directory)
        try:
            with httpx.Client(base_url=server.url, headers=auth, timeout=600) as client:
                for name, text in (("txn", PROGRAM.split("rule")[0]),):
                    client.put(f"/queries/{name}", content=text).raise_for_status()
                for part in ("rule big", "rule probe", "metric spend"):
                    line = next(x for x in PROGRAM.splitlines() if x.startswith(part))
                    client.put(f"/queries/{part.split()[1]}", content=line,
                               params={"wait": "true"}).raise_for_status()
                client.post("/events", content=bodies[0][:2000].rsplit(b"\n", 1)[0])
                cpu, wall = time.process_time(), time.perf_counter()
                counted = matches = 0
                for body in bodies:
                    answer = client.post("/events", content=body)
                    answer.raise_for_status()
                    counted += answer.json()["received"]
                    matches += answer.json()["matches"]
                wall = time.perf_counter() - wall
                cpu = time.process_time() - cpu
        finally:
            server.stop()
    return {"events": counted, "batch": batch, "seconds": round(wall, 3),
            "events_per_s": round(counted / wall), "cores": round(cpu / wall, 2),
            "events_per_cpu_s": round(counted / cpu),
            "matches": matches}


def change(queries: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as directory:
        source = os.path.join(directory, "queries.vigil")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(PROGRAM.split("rule")[0])
            for i in range(queries):
                handle.write(f"query q{i} from txn match merchant:m{i} AND amount > {i % 997}\n")
        started = time.perf_counter()
        with Registry(os.path.join(directory, "registry.sqlite")) as registry:
            registry.push([source], author="bench")
        pushed = time.perf_counter() - started
        started = time.perf_counter()
        server, auth = _service(directory)
        start = time.perf_counter() - started
        result: dict = {"queries": queries, "initial_push_s": round(pushed, 2),
                        "service_start_s": round(start, 2), "changes": []}
        try:
            with httpx.Client(base_url=server.url, headers=auth, timeout=3600) as client:
                # One event first, as in a service that runs: the percolator indexes a
                # stream's queries when its first document comes, not at registration.
                started = time.perf_counter()
                event = {"stream": "txn", "card": "c0", "amount": 1.0, "merchant": "m0",
                         "ts": T0}
                client.post("/events", content=json.dumps(event) + "\n").raise_for_status()
                result["first_event_s"] = round(time.perf_counter() - started, 2)
                for label, method, name, text in (
                    ("add", "PUT", "fresh", "query fresh from txn match merchant:fresh\n"),
                    ("replace", "PUT", "q5", "query q5 from txn match merchant:other\n"),
                    ("delete", "DELETE", "q7", None),
                ):
                    sent = time.perf_counter()
                    answer = client.request(method, f"/queries/{name}", content=text)
                    answer.raise_for_status()
                    acknowledged = time.perf_counter()
                    version = answer.json()["registry_version"]
                    while client.get("/status").json()["applied_version"] < version:
                        time.sleep(0.002)
                    applied = time.perf_counter()
                    result["changes"].append({
                        "change": label,
                        "acknowledged_ms": round((acknowledged - sent) * 1000, 1),
                        "in_effect_after_ack_ms": round((applied - acknowledged) * 1000, 1),
                    })
        finally:
            server.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--skip", choices=["ingestion", "change"], action="append", default=[])
    args = parser.parse_args()
    if "ingestion" not in args.skip:
        print(json.dumps({"ingestion": ingestion(args.events, args.batch)}), flush=True)
    if "change" not in args.skip:
        print(json.dumps({"change": change(args.queries)}), flush=True)


if __name__ == "__main__":
    main()
