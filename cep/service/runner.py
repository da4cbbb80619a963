"""The engine of ``vigil serve``: one thread owns the :class:`~cep.engine.Engine`, feeds it the
posted batches, applies each new registry version between batches, and makes every batch's
matches durable before its ``POST`` is answered.

Each turn of the thread takes the batches waiting (up to :data:`GROUP`), applies the newest
registry version if it changed (:mod:`cep.registry.follower`), feeds the batches, queues their
alerts in the outbox, and writes their matches, dead letters and events to the match log in one
transaction (:class:`~cep.service.matchlog.MatchLog`); only then are the requests answered.

Restarts lose nothing acknowledged. Every so often (:attr:`EngineRunner.checkpoint_interval_s`,
or after :attr:`EngineRunner.checkpoint_bytes` of events) the engine's state is saved with the
number of the last batch it holds (:class:`cep.engine.CheckpointStore`) and the match log
forgets the events of the batches up to it. A restart restores that checkpoint under the
registry version it ran, feeds the batches logged after it again (each under the version it
ran under) and discards what they report, which the log has already: the engine is where it
was when the process died, and no match is reported twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cep.engine import CheckpointStore, Engine
from cep.inputs import EventBatch, Piece
from cep.registry import AppliedVersion, Registry, RegistryFollower
from cep.service.alerting import ServiceAlerts
from cep.service.intake import parse_events
from cep.service.matchlog import BatchRecord, MatchLog
from cep.service.recent import query_documents
from query_lang import Program, ast

__all__ = ["CONSUMER", "EngineRunner", "IngestResult", "RunnerStopped"]

log = logging.getLogger("vigil.serve")

CONSUMER = "serve"
"""The name the service records the registry version it applies under (``mark_applied``)."""

GROUP = 64
"""Most batches one turn of the engine's thread feeds and commits together."""


class RunnerStopped(RuntimeError):
    """The engine's thread is not running (stopped, or a write to the state failed)."""


@dataclass(frozen=True)
class IngestResult:
    """What one posted batch gave: ``received = accepted + late + dead``; ``unkeyed`` counts
    accepted events some keyed rule skipped for a missing key (a dead letter each too)."""

    batch: int
    registry_version: int
    received: int
    accepted: int
    late: int
    dead: int
    unkeyed: int
    reasons: dict[str, int]
    matches: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Batch:
    body: bytes
    stream: str | None
    pieces: list[Piece]
    future: Future = field(default_factory=Future)


@dataclass
class _Nudge:
    future: Future = field(default_factory=Future)


_STOP = object()


class EngineRunner:
    """Runs the engine for a service.

    Parameters
    ----------
    registry:
        The registry whose newest version the engine follows.
    match_log, alerts:
        Where matches and dead letters go, and the alert outbox.
    checkpoints:
        Where the engine's state is saved.
    make_engine:
        Builds an empty engine (its options).
    checkpoint_interval_s, checkpoint_bytes:
        Save the engine's state when this long has passed, or this many bytes of events
        were posted, since the last save (and the batches after it are fed again on restart).
    poll_s:
        How often an idle engine looks for registry versions written by another process
        (``vigil registry push``) and for a checkpoint due.
    """

    def __init__(
        self,
        registry: Registry,
        match_log: MatchLog,
        alerts: ServiceAlerts,
        checkpoints: CheckpointStore,
        *,
        make_engine: Callable[[], Engine] = Engine,
        checkpoint_interval_s: float = 30.0,
        checkpoint_bytes: int = 64 << 20,
        poll_s: float = 1.0,
    ) -> None:
        self.registry = registry
        self.match_log = match_log
        self.alerts = alerts
        self.checkpoints = checkpoints
        self.make_engine = make_engine
        self.checkpoint_interval_s = checkpoint_interval_s
        self.checkpoint_bytes = checkpoint_bytes
        self.poll_s = poll_s
        self.engine: Engine = make_engine()
        self.follower: RegistryFollower | None = None  # made by _recover, in the thread
        self.failure: BaseException | None = None
        self.stats: dict[str, Any] = {}
        self.checkpointed_batch = 0
        self.replayed = 0
        self._batch = 0
        self._pending_bytes = 0
        self._last_checkpoint = time.monotonic()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="vigil-engine", daemon=True)

    # ------------------------------------------------------------------ the API's side

    def start(self) -> None:
        """Recover the engine's state (checkpoint, then the batches after it), apply the
        newest registry version, and start the engine's thread."""
        self._recover()
        try:
            self._sync()
        except Exception:  # logged; the engine runs the version it restored
            log.exception("vigil serve: applying the registry failed")
        self._snapshot_stats()
        self._thread.start()

    def submit(self, body: bytes, stream: str | None = None,
               pieces: list[Piece] | None = None) -> Future:
        """Queue a posted batch; the future's result is its :class:`IngestResult`, set once
        its matches are durable. ``pieces`` is ``body`` parsed (:func:`parse_events`), when
        the caller already did."""
        self._check_running()
        job = _Batch(body, stream, parse_events(body, stream) if pieces is None else pieces)
        self._queue.put(job)
        return job.future

    def nudge(self) -> Future:
        """Ask the engine to apply the newest registry version now; the future's result is
        the version it runs."""
        self._check_running()
        job = _Nudge()
        self._queue.put(job)
        return job.future

    def stop(self) -> None:
        """Finish the batches queued, save a checkpoint and stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    def _check_running(self) -> None:
        if not self.running:
            raise RunnerStopped(
                "the engine is not running" + (f": {self.failure}" if self.failure else "")
            )

    # ------------------------------------------------------------------ the engine's thread

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=self.poll_s)
            except queue.Empty:
                self._idle()
                continue
            jobs = [first]
            while len(jobs) < GROUP and jobs[-1] is not _STOP:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = jobs[-1] is _STOP
            if stopping:
                jobs.pop()
            self._turn(jobs)
            if stopping or self.failure is not None:
                break
        if self.failure is None:
            self._checkpoint()
        self._fail_queued()

    def _idle(self) -> None:
        try:
            self._sync()
            if self._due():
                self._checkpoint()
        except Exception:  # logged; the next turn tries again
            log.exception("vigil serve: the engine's idle work failed")

    def _turn(self, jobs: list[Any]) -> None:
        try:
            self._sync()
        except Exception:  # logged; the engine keeps the version it runs
            log.exception("vigil serve: applying the registry failed")
        records, answers = [], []
        for job in jobs:
            if isinstance(job, _Nudge):
                answers.append((job.future, self.applied))
                continue
            try:
                record, result = self._ingest(job)
            except Exception as exc:  # that request fails, the others go on
                log.exception("vigil serve: a batch failed")
                job.future.set_exception(exc)
                continue
            records.append(record)
            answers.append((job.future, result))
        try:
            for record in records:
                self.alerts.submit(record.matches)
            self.match_log.commit(records)
        except BaseException as exc:
            # The engine holds batches the log does not: stop here; a restart recovers the
            # state of the last batch written.
            self.failure = exc
            log.exception("vigil serve: writing the match log failed; the engine stops")
            for future, _ in answers:
                future.set_exception(RunnerStopped(f"the match log cannot be written: {exc}"))
            return
        for future, value in answers:
            future.set_result(value)
        self._snapshot_stats()
        if self._due():
            self._checkpoint()

    def _ingest(self, job: _Batch) -> tuple[BatchRecord, IngestResult]:
        engine = self.engine
        before = engine.stats
        _feed(engine, job.pieces)
        after = engine.stats
        self._batch += 1
        self._pending_bytes += len(job.body)
        matches = engine.drain()
        # A query's match names its event: the log keeps that event with it (the console).
        documents = query_documents(matches, job.pieces, job.stream, before.events,
                                    {n: d.id_field for n, d in engine.streams.items()})
        record = BatchRecord(self._batch, self.applied, job.body, job.stream,
                             matches, engine.drain_dead_letters(), documents)
        late = after.late - before.late
        bad = after.bad - before.bad
        reasons = Counter(d.get("reason", "") for d in record.dead_letters)
        result = IngestResult(
            batch=self._batch,
            registry_version=self.applied,
            received=after.events - before.events,
            accepted=after.accepted - before.accepted,
            late=late,
            dead=bad,
            unkeyed=after.unkeyed - before.unkeyed,
            reasons=dict(sorted(reasons.items())),
            matches=len(record.matches),
        )
        return record, result

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not _STOP:
                job.future.set_exception(RunnerStopped("the service is stopping"))

    # ------------------------------------------------------------------ registry versions

    @property
    def applied(self) -> int:
        """The registry version the engine runs."""
        return self.follower.applied if self.follower is not None else 0

    @property
    def applied_at(self) -> float | None:
        return self.follower.applied_at if self.follower is not None else None

    @property
    def apply_error(self) -> str | None:
        """Why the newest registry version is not in effect, if it failed to apply."""
        return self.follower.apply_error if self.follower is not None else None

    def _sync(self) -> None:
        """Apply the registry's newest version if the engine runs another."""
        version = self.registry.version
        if version in (self.applied, self.follower.failed_version):
            return
        applied = self._apply(version)
        log.info("vigil serve: registry version %d in effect in %.1f ms (%s)", version,
                 applied.seconds * 1000, applied.describe())

    def _apply(self, version: int) -> AppliedVersion:
        try:
            applied = self.follower.apply(version)
        finally:  # on a failure, the engine of the version it ran before
            self.engine = self.follower.engine
        if not applied.change.empty:
            self.alerts.update(_program_of(self.engine))
        return applied

    # ------------------------------------------------------------------ checkpoints

    def _due(self) -> bool:
        if self._batch == self.checkpointed_batch:
            return False
        return (time.monotonic() - self._last_checkpoint >= self.checkpoint_interval_s
                or self._pending_bytes >= self.checkpoint_bytes)

    def _checkpoint(self) -> None:
        """Save the engine's state as of the last batch, then forget the batches it holds."""
        if self._batch == self.checkpointed_batch and self.checkpoints.path.exists():
            return
        started = time.perf_counter()
        cursor = {"batch": self._batch, "registry_version": self.applied}
        self.checkpoints.save(self.engine.snapshot(), cursor=cursor)
        self.match_log.forget_batches(self._batch)
        self.checkpointed_batch = self._batch
        self._pending_bytes = 0
        self._last_checkpoint = time.monotonic()
        log.info("vigil serve: checkpoint at batch %d in %.1f ms", self._batch,
                 (time.perf_counter() - started) * 1000)

    def _recover(self) -> None:
        saved = self.checkpoints.load()
        batch, version = 0, 0
        if saved is not None:
            batch = int(saved.cursor["batch"])
            version = int(saved.cursor["registry_version"])
        self.follower = RegistryFollower(self.registry, self.make_engine, consumer=CONSUMER,
                                         version=version)
        self.engine = self.follower.engine
        if saved is not None:
            self.engine.restore(saved.state)
        self.checkpointed_batch = batch
        for record in self.match_log.batches(after=batch):
            if record.registry_version != self.applied:
                self._apply(record.registry_version)
            _feed(self.engine, parse_events(record.body, record.stream))
            self.engine.drain()  # reported, and logged, before the restart
            self.engine.drain_dead_letters()
            batch = record.batch
            self._pending_bytes += len(record.body)
            self.replayed += 1
        self._batch = batch
        self.alerts.update(_program_of(self.engine))
        if self.replayed:
            log.info("vigil serve: fed %d batch(es) again after checkpoint batch %d",
                     self.replayed, self.checkpointed_batch)

    def _snapshot_stats(self) -> None:
        stats = self.engine.stats
        self.stats = {
            "events": stats.events, "accepted": stats.accepted, "late": stats.late,
            "dead": stats.bad, "unkeyed": stats.unkeyed, "keys": stats.keys,
            "buffered": stats.buffered, "watermark": stats.watermark, "batches": self._batch,
        }


def _feed(engine: Engine, pieces: list[Piece]) -> None:
    for piece in pieces:
        if isinstance(piece, EventBatch):
            # Positions: the engine's arrival order (a restart continues it), so that two
            # posts of the same event are two events.
            engine.feed_batch(piece.frame, source=piece.source, lines=piece.lines,
                              raw=piece.raw)
        else:
            engine.reject(piece)


def _program_of(engine: Engine) -> Program:
    return Program([ast.Module(tuple(engine.declarations))])

