"""A ``vigil serve`` instance: its configuration and the parts it runs over one state directory
— the registry (anywhere), API tokens, the match log, the alert outbox, the engine's
checkpoint — started and stopped together."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cep.engine import CheckpointStore, Engine
from cep.registry import Registry
from cep.service.alerting import ServiceAlerts
from cep.service.matchlog import MatchLog
from cep.service.named import NamedQueries
from cep.service.ratelimit import RateLimiter
from cep.service.recent import RECENT, RECENT_FILE, RecentEvents
from cep.service.runner import EngineRunner
from cep.service.tokens import TokenStore

try:  # POSIX; elsewhere two services on one state directory are not prevented
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["Service", "ServiceConfig", "ServiceError"]

log = logging.getLogger("vigil.serve")

MAX_BODY = 8 << 20
"""Largest request body by default (8 MiB): a ``POST /events`` of some 40,000 events."""


class ServiceError(RuntimeError):
    """A service that cannot start (its state directory is in use, a registry is unusable)."""


@dataclass
class ServiceConfig:
    """What ``vigil serve`` is told.

    Attributes
    ----------
    registry:
        The registry file the service follows and changes.
    state_dir:
        Where the tokens, match log, outbox and checkpoint live.
    max_body:
        Largest request body, bytes (413 beyond).
    rate, burst:
        Requests per second per token over time, and at once (429 beyond; ``rate <= 0``: no
        limit).
    checkpoint_interval_s, checkpoint_bytes:
        How often the engine's state is saved (see :class:`~cep.service.runner.EngineRunner`).
    ping_s:
        Seconds between keep-alive comments of an idle Server-Sent Events stream.
    recent:
        Events kept per stream for the console (``POST /try``, ``GET /events/recent``; 0:
        none), in ``recent.sqlite`` of the state directory across restarts.
    env:
        Where webhook secrets are read (default: the environment).
    make_engine:
        Builds an empty engine (tests fix its clock).
    """

    registry: str
    state_dir: str
    max_body: int = MAX_BODY
    rate: float = 100.0
    burst: int = 200
    checkpoint_interval_s: float = 30.0
    checkpoint_bytes: int = 64 << 20
    ping_s: float = 15.0
    poll_s: float = 1.0
    recent: int = RECENT
    env: Mapping[str, str] | None = None
    make_engine: Callable[[], Engine] = field(default=Engine)


class Service:
    """The parts of one service; :meth:`start` recovers and starts the engine, :meth:`stop`
    checkpoints and closes everything.

    Raises
    ------
    ServiceError
        When another service holds the state directory.
    """

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        os.makedirs(config.state_dir, exist_ok=True)
        self._lock_file = _lock(config.state_dir)
        try:
            self.registry = Registry(config.registry)
        except BaseException:
            if self._lock_file is not None:
                self._lock_file.close()
            raise
        self.tokens = TokenStore(config.state_dir)
        self.match_log = MatchLog(config.state_dir)
        self.alerts = ServiceAlerts(config.state_dir, config.env)
        self.runner = EngineRunner(
            self.registry,
            self.match_log,
            self.alerts,
            CheckpointStore(os.path.join(config.state_dir, "checkpoint")),
            make_engine=config.make_engine,
            checkpoint_interval_s=config.checkpoint_interval_s,
            checkpoint_bytes=config.checkpoint_bytes,
            poll_s=config.poll_s,
        )
        self.named = NamedQueries(self.registry)
        self.limiter = RateLimiter(config.rate, config.burst)
        self.recent = RecentEvents(config.recent, os.path.join(config.state_dir, RECENT_FILE))
        self.stopping = False

    def start(self) -> None:
        self.runner.start()
        # Posted lines take the engine's next arrival positions from here on.
        self.recent.start(position=self.runner.stats["events"],
                          batch=self.runner.stats["batches"] + 1)
        log.info("vigil serve: registry %s at version %d; state in %s", self.registry.path,
                 self.runner.applied, self.config.state_dir)

    def stop(self) -> None:
        self.stopping = True
        self.match_log.notifier.notify()  # streams look at `stopping` and end
        try:
            self.runner.stop()
        finally:
            self.recent.close()
            self.alerts.close()
            self.match_log.close()
            self.tokens.close()
            self.registry.close()
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None


def _lock(state_dir: str):
    """Hold ``state_dir/serve.lock`` while the service runs (the OS lets go when the process
    dies, however it dies)."""
    if fcntl is None:  # pragma: no cover
        return None
    handle = open(os.path.join(state_dir, "serve.lock"), "a+")  # held open while the service runs
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise ServiceError(f"another vigil serve uses the state directory {state_dir}") from None
    return handle
