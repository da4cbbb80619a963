"""``vigil serve`` in a process of its own, as a user starts it, for the tests that kill or
restart it (the service's restart test, the service next to a Spark job)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from redis_servers import free_port


class ServeProcess:
    """``vigil serve ARGS --port PORT --rate 0 --log-level warning`` from ``tmp_path``, its
    output appended to ``tmp_path/serve.log``; returns once ``/openapi.json`` answers."""

    def __init__(self, tmp_path: Path, args: list[str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "serve.log"
        self.log = open(self.log_path, "a")  # closed in stop
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cep.cli", "serve", *args, "--port", str(self.port),
             "--rate", "0", "--log-level", "warning"],
            stdout=self.log, stderr=self.log, cwd=tmp_path,
        )
        give_up = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(self.url + "/openapi.json", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < give_up, "vigil serve did not start"
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig``; the exit code."""
        self.process.send_signal(sig)
        code = self.process.wait(30)
        self.log.close()
        return code
