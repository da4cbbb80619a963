"""``vigil serve`` next to a Spark job: the API without an engine of its own.

The job is a ``vigil run --registry PATH --follow --engine spark --events redis://.../KEY --out
DIR`` over the registry the service changes: it takes each new registry version from its next
micro-batch (:mod:`spark_udf.live`). The service then

- appends each posted body's events to the job's Redis stream, in one ``MULTI``/``EXEC`` (all
  of a body's events or none), and answers once Redis has them; a line that is no event is
  refused there and then, a dead letter in the answer and in the match log;
- imports each micro-batch the job *committed* (Spark's commit log: its files are final, only
  an uncommitted batch runs again) into the match log: its matches (``DIR/part-N.jsonl``) and,
  when the job writes them, its dead letters; a batch is imported once, whatever restarts;
- reports the registry version the job's newest committed micro-batch ran (its checkpoint's
  program log), which is the version in effect;
- shows the job's alert outbox (``DIR/_outbox.sqlite`` by default) without delivering from it:
  the job delivers.

An event's arrival position is its index in the stream (what the job's ``_seq`` counts), read
as the stream's length inside the transaction that appends it: a rule match's ``events`` name
the posted events the console keeps.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cep.inputs import EventBatch, Piece
from cep.registry import Registry
from cep.service.matchlog import BatchRecord, MatchLog

__all__ = ["PostedResult", "SparkJob", "SparkJobLink", "SparkJobError"]

log = logging.getLogger("vigil.serve")

OUTBOX_FILE = "_outbox.sqlite"
"""The outbox a Spark ``vigil run --out DIR`` keeps in its output directory by default."""
CHECKPOINT_DIR = "_checkpoint"
"""Its checkpoint's default place in the output directory."""


class SparkJobError(RuntimeError):
    """The Spark job's stream cannot be reached, or its directories are not a Spark run's."""


@dataclass(frozen=True)
class SparkJob:
    """Where the Spark job reads and writes.

    Attributes
    ----------
    events_url:
        Its input, ``redis://[user:password@]HOST:PORT[/DB]/KEY`` (``rediss://`` with TLS).
    out:
        Its ``--out`` directory (one file of matches per micro-batch).
    checkpoint:
        Its checkpoint (default ``out/_checkpoint``).
    dead_letter:
        Its ``--dead-letter`` directory, or ``None`` (its dead letters are then not shown).
    outbox:
        Its alert outbox (default ``out/_outbox.sqlite``).
    """

    events_url: str
    out: str
    checkpoint: str | None = None
    dead_letter: str | None = None
    outbox: str | None = None

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint or os.path.join(self.out, CHECKPOINT_DIR)

    @property
    def outbox_path(self) -> str:
        return self.outbox or os.path.join(self.out, OUTBOX_FILE)


@dataclass(frozen=True)
class PostedResult:
    """What one posted body gave: ``received = appended + dead``; ``first_position`` is the
    stream index of its first appended event (``None`` when it appended none), ``ids`` the
    first and last entry ids."""

    batch: int
    registry_version: int
    received: int
    appended: int
    dead: int
    reasons: dict[str, int]
    first_position: int | None
    ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


REFUSED_BATCH = -1
"""The match log's batch number of a posted line refused before it reached the job."""


class SparkJobLink:
    """The service's side of a Spark job (see the module's text); it stands where the
    embedded engine's runner stands (``submit``, ``nudge``, ``applied``, ``stats``...).

    Parameters
    ----------
    poll_s:
        How often the job's commit log is read for new micro-batches.
    """

    def __init__(self, job: SparkJob, registry: Registry, match_log: MatchLog, *,
                 poll_s: float = 0.25) -> None:
        from spark_udf.sources.redis_stream import redis_client, split_stream_url

        self.job = job
        self.registry = registry
        self.match_log = match_log
        self.poll_s = poll_s
        try:
            server, self.key = split_stream_url(job.events_url)
        except ValueError as exc:
            raise SparkJobError(str(exc)) from None
        self._client = redis_client(server)
        try:
            self._client.ping()
        except Exception as exc:  # redis-py's errors: refused, timed out, auth, TLS
            self._client.close()
            raise SparkJobError(f"the Spark job's stream {self.key!r} cannot be reached: "
                                f"{exc}") from None
        self.apply_error: str | None = None
        self.applied = 0
        self.checkpointed_batch: int | None = None
        self._posted = 0
        self._counts: Counter[str] = Counter()
        self._entries: dict[int, int | None] = {}  # program log entry -> registry version
        self._waiting: list[tuple[int, Future]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._appender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vigil-append")
        self._thread = threading.Thread(target=self._follow, name="vigil-spark-job",
                                        daemon=True)

    # ------------------------------------------------------------------ the API's side

    def start(self) -> None:
        """Import what the job committed so far, then follow it."""
        self._import()
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of this process, and where the job is."""
        with self._lock:
            return {
                "spark_job": {"out": self.job.out, "stream": self.key},
                "posted_batches": self._posted,
                "appended": self._counts["appended"],
                "refused": self._counts["refused"],
                "imported_batches": self._counts["batches"],
                "imported_matches": self._counts["matches"],
                "imported_dead_letters": self._counts["dead_letters"],
                "spark_batch": self.checkpointed_batch,
            }

    def submit(self, body: bytes, stream: str | None = None,
               pieces: list[Piece] | None = None) -> Future:
        """Append a posted body's events to the job's stream; the future's result is its
        :class:`PostedResult`, set once Redis holds them."""
        from cep.service.intake import parse_events

        self._check_running()
        if pieces is None:
            pieces = parse_events(body, stream)
        return self._appender.submit(self._append, pieces, stream)

    def nudge(self) -> Future:
        """The future's result is the registry version in effect once the job's committed
        micro-batches run the registry's newest version (the job takes it by itself)."""
        self._check_running()
        future: Future = Future()
        wanted = self.registry.version
        with self._lock:
            if self.applied >= wanted:
                future.set_result(self.applied)
            else:
                self._waiting.append((wanted, future))
        return future

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._appender.shutdown(wait=True)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, future in waiting:
            future.set_result(self.applied)
        self._client.close()

    def _check_running(self) -> None:
        from cep.service.runner import RunnerStopped

        if not self.running:
            raise RunnerStopped("the link to the Spark job is not running")

    # ------------------------------------------------------------------ appending

    def _append(self, pieces: list[Piece], stream: str | None) -> PostedResult:
        texts: list[str] = []
        refused: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, EventBatch):
                texts.extend(_bound(text, stream) for text in piece.raw)
            else:
                refused.append(piece)
        ids: list[str] = []
        first = None
        if texts:
            try:
                with self._client.pipeline(transaction=True) as pipe:
                    pipe.xlen(self.key)
                    for text in texts:
                        pipe.xadd(self.key, {"event": text})
                    replies = pipe.execute()
            except Exception as exc:  # redis-py's errors: nothing of the body was appended
                raise SparkJobError(f"the Spark job's stream {self.key!r} did not take the "
                                    f"events: {exc}") from None
            first = int(replies[0])
            ids = [_text(replies[1]), _text(replies[-1])]
        if refused:
            self.match_log.add_dead_letters(refused, REFUSED_BATCH)
        with self._lock:
            self._posted += 1
            batch = self._posted
            self._counts["appended"] += len(texts)
            self._counts["refused"] += len(refused)
        return PostedResult(
            batch=batch, registry_version=self.applied, received=len(texts) + len(refused),
            appended=len(texts), dead=len(refused),
            reasons=dict(Counter(str(d.get("reason")) for d in refused)),
            first_position=first, ids=ids,
        )

    # ------------------------------------------------------------------ importing

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._import()
            except Exception as exc:  # tried again at the next poll; /status says why
                error = f"importing the Spark job's micro-batches: {exc}"
                if error != self.apply_error:
                    log.exception("vigil serve: %s", error)
                self.apply_error = error
            else:
                self.apply_error = None

    def _import(self) -> None:
        """Log every micro-batch the job committed since the last one logged."""
        from spark_udf.checkpoint import last_committed

        committed = last_committed(self.job.checkpoint_dir)
        if committed is None or committed.batch_id == self.checkpointed_batch:
            return
        done = self.match_log.last_batch(default=-1)
        records = [self._record(batch) for batch in range(done + 1, committed.batch_id + 1)]
        self.match_log.commit(records)
        version = records[-1].registry_version if records else self._version(committed.batch_id)
        with self._lock:
            self.checkpointed_batch = committed.batch_id
            self._counts["batches"] += len(records)
            self._counts["matches"] += sum(len(r.matches) for r in records)
            self._counts["dead_letters"] += sum(len(r.dead_letters) for r in records)
            self.applied = version
            due = [f for wanted, f in self._waiting if wanted <= self.applied]
            self._waiting = [(w, f) for w, f in self._waiting if w > self.applied]
        for future in due:
            future.set_result(self.applied)

    def _record(self, batch: int) -> BatchRecord:
        from spark_udf.sinks import read_batch

        matches = read_batch(self.job.out, batch)
        dead = read_batch(self.job.dead_letter, batch) if self.job.dead_letter else []
        return BatchRecord(batch, self._version(batch, matches), b"", None, matches, dead)

    def _version(self, batch: int, matches: list[dict[str, Any]] | None = None) -> int:
        """The registry version micro-batch ``batch`` ran: its program log entry's, else its
        matches' (a job that does not follow a registry: 0)."""
        from spark_udf.errors import CheckpointError
        from spark_udf.live import ProgramLog

        program_log = ProgramLog(self.job.checkpoint_dir)
        try:
            number = program_log.batch_entry(batch)
        except CheckpointError:
            number = None
        if number is not None:
            if number not in self._entries:
                self._entries[number] = program_log.entry(number).registry_version
            found = self._entries[number]
            if found is not None:
                return int(found)
        for match in matches or ():
            if isinstance(match.get("registry_version"), int):
                return int(match["registry_version"])
        return self.applied


def _bound(text: str, stream: str | None) -> str:
    """A posted event's line, with ``stream`` set in it when the request binds one."""
    if stream is None:
        return text
    return json.dumps({**json.loads(text), "stream": stream}, separators=(",", ":"))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
