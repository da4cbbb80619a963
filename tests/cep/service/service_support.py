"""What the service tests share: a service over temporary state, an in-process client, a real
uvicorn server on a free loopback port, the program and its events."""

from __future__ import annotations

import json
import threading
import time
import warnings
from dataclasses import dataclass

from cep.service import Service, ServiceConfig, create_app

T0 = 1767225600  # 2026-01-01T00:00:00Z, seconds

STREAM = "stream txn (card string, amount float, ts timestamp) time ts\n"


def rule(name: str, condition: str, notify: str = "") -> str:
    """A one-event rule over ``txn`` keyed by card."""
    return (f"rule {name} from txn by card pattern b define b as {condition}"
            f"{' notify ' + notify if notify else ''}\n")


def lines(*events: dict) -> bytes:
    return "".join(json.dumps(e) + "\n" for e in events).encode()


def txn(card: str, amount: float, second: float) -> dict:
    return {"stream": "txn", "card": card, "amount": amount, "ts": T0 + second}


@dataclass
class Api:
    """A client with a write token (``w``) and a read token (``r``)."""

    client: object
    service: Service
    write: str
    read: str

    @property
    def w(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.write}"}

    @property
    def r(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.read}"}

    def put(self, name: str, text: str, **params):
        return self.client.put(f"/queries/{name}", content=text, headers=self.w, params=params)

    def post(self, body: bytes, **params):
        return self.client.post("/events", content=body, headers=self.w, params=params)

    def matches(self, **params) -> list[dict]:
        answer = self.client.get("/matches", headers=self.r, params={"limit": 1000, **params})
        assert answer.status_code == 200, answer.text
        return answer.json()["matches"]


def make_service(tmp_path, **options) -> Service:
    options.setdefault("rate", 0)
    config = ServiceConfig(registry=str(tmp_path / "registry.sqlite"),
                           state_dir=str(tmp_path / "state"), poll_s=0.2, **options)
    return Service(config)


def in_process_client(app):
    with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we install
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    return TestClient(app)




class LiveServer:
    """The app under a real uvicorn server on 127.0.0.1 and a free port, in a thread."""

    def __init__(self, service: Service) -> None:
        import uvicorn

        config = uvicorn.Config(create_app(service), host="127.0.0.1", port=0,
                                log_level="warning", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        give_up = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > give_up or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
