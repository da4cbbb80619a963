"""A ``vigil serve`` instance: its configuration and the parts it runs over one state directory
— the registry (anywhere), API tokens, the match log, the alert outbox, the engine's
checkpoint — started and stopped together."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cep.engine import CheckpointStore, Engine
from cep.inputs import EventBatch, Piece
from cep.registry import Registry
from cep.service.alerting import ServiceAlerts
from cep.service.matchlog import MatchLog
from cep.service.named import NamedQueries
from cep.service.ratelimit import RateLimiter
from cep.service.recent import RECENT, RECENT_FILE, RecentEvents
from cep.service.runner import EngineRunner
from cep.service.spark_job import PostedResult, SparkJob, SparkJobError, SparkJobLink
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
    spark_job:
        Serve only the API, next to this Spark job (:mod:`cep.service.spark_job`): no engine
        in the process; posted events go to the job's stream, its matches come to the log.
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
    spark_job: SparkJob | None = None


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
        self._opened: list[Any] = []  # closed in reverse if the service cannot be made
        try:
            self._open(config)
        except BaseException:
            for part in reversed(self._opened):
                part.close()
            if self._lock_file is not None:
                self._lock_file.close()
            raise

    def _open(self, config: ServiceConfig) -> None:
        self.registry = Registry(config.registry)
        self._opened.append(self.registry)
        self.tokens = TokenStore(config.state_dir)
        self._opened.append(self.tokens)
        self.match_log = MatchLog(config.state_dir)
        self._opened.append(self.match_log)
        job = config.spark_job
        _check_mode(config.state_dir, job, self.match_log)
        # Next to a Spark job, the job delivers its alerts: the service shows its outbox (and
        # replays into it), made here when the service starts first.
        if job is not None:
            os.makedirs(os.path.dirname(os.path.abspath(job.outbox_path)), exist_ok=True)
        self.alerts = ServiceAlerts(config.state_dir, config.env,
                                    outbox=None if job is None else job.outbox_path)
        self._opened.append(self.alerts)
        self.runner: EngineRunner | SparkJobLink
        if job is None:
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
        else:
            try:
                self.runner = SparkJobLink(job, self.registry, self.match_log,
                                           poll_s=min(config.poll_s, 0.25))
            except SparkJobError as exc:
                raise ServiceError(str(exc)) from None
        self.named = NamedQueries(self.registry)
        self.limiter = RateLimiter(config.rate, config.burst)
        self.recent = RecentEvents(config.recent, os.path.join(config.state_dir, RECENT_FILE))
        self.stopping = False
        self._streams: tuple[int, str | None] | None = None  # (version, its only stream)

    def start(self) -> None:
        self.runner.start()
        if isinstance(self.runner, EngineRunner):
            # Posted lines take the engine's next arrival positions from here on.
            self.recent.start(position=self.runner.stats["events"],
                              batch=self.runner.stats["batches"] + 1)
            log.info("vigil serve: registry %s at version %d; state in %s",
                     self.registry.path, self.runner.applied, self.config.state_dir)
        else:
            log.info("vigil serve: registry %s at version %d; the Spark job's newest "
                     "committed micro-batch ran version %d; state in %s", self.registry.path,
                     self.registry.version, self.runner.applied, self.config.state_dir)

    def keep_recent(self, pieces: list[Piece], stream: str | None, result: Any) -> None:
        """Keep the events of a posted body once it was fed (its ``result``) for the console,
        at the arrival positions they took (an event without a stream under the program's
        only one, where the engine puts it)."""
        sole = self._sole_stream(self.registry.version if isinstance(result, PostedResult)
                                 else result.registry_version)
        if isinstance(result, PostedResult):
            if result.first_position is not None:  # only its events reached the job's stream
                events = [p for p in pieces if isinstance(p, EventBatch)]
                self.recent.add_at(events, stream, result.first_position, sole)
        else:
            self.recent.add(pieces, stream, batch=result.batch, received=result.received,
                            sole=sole)

    def _sole_stream(self, version: int) -> str | None:
        """The only stream the program of registry ``version`` declares, or ``None``."""
        known = self._streams
        if known is None or known[0] != version:
            names = [e.name for e in self.registry.store.current(version, shared=True)
                     if e.space == "stream"]
            known = self._streams = (version, names[0] if len(names) == 1 else None)
        return known[1]

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


_MODE_FILE = "engine.json"
"""Which engine a state directory serves: ``{"engine": "embedded"}``, or ``{"engine":
"spark", "out": DIR}`` next to the Spark job writing DIR."""


def _check_mode(state_dir: str, job: SparkJob | None, match_log: MatchLog) -> None:
    """Refuse a state directory kept for another engine: the match log numbers batches by the
    embedded engine's posts, or by one Spark job's micro-batches."""
    path = os.path.join(state_dir, _MODE_FILE)
    wanted = {"engine": "embedded"} if job is None else {"engine": "spark",
                                                         "out": os.path.abspath(job.out)}
    try:
        with open(path, encoding="utf-8") as handle:
            recorded = json.load(handle)
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise ServiceError(f"{path} is not what vigil serve wrote ({exc}); it says which "
                           "engine the state directory serves") from None
    except FileNotFoundError:
        # A state written before the record: the embedded engine's, if it holds anything.
        checkpoint = os.path.join(state_dir, "checkpoint")
        used = (match_log.last_cursor("matches") > 0
                or match_log.last_cursor("dead_letters") > 0
                or match_log.last_batch(default=-1) >= 0
                or (os.path.isdir(checkpoint) and bool(os.listdir(checkpoint))))
        recorded = {"engine": "embedded"} if used else None
    if recorded is None:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(wanted, handle)
        os.replace(path + ".tmp", path)
        return
    if recorded == wanted:
        return
    if recorded.get("engine") == "spark":
        other = recorded.get("out")
        if job is None:
            raise ServiceError(f"the state directory {state_dir} was served next to the Spark "
                               f"job writing {other}; give --spark-out {other} and its "
                               "--events-to, or another --state")
        raise ServiceError(f"the state directory {state_dir} was served next to the Spark job "
                           f"writing {other}, not {wanted['out']}; use another --state")
    raise ServiceError(f"the state directory {state_dir} holds the embedded engine's batches "
                       "and checkpoint; serve the Spark job with another --state")


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
