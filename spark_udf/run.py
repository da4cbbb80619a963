"""``run_spark``: run a Vigil program over a JSON-lines input or a Redis Stream as a Spark
Structured Streaming query, writing matches and dead letters idempotently; the engine behind
``vigil run --engine spark``. Ctrl-C stops the query after its current micro-batch, and a rerun
with the same checkpoint continues, also over an input that has grown since."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pyspark import cloudpickle

from cep.engine.checkpoint import RestoreReport
from query_lang import load_program
from query_lang.errors import VigilError
from spark_udf.checkpoint import (
    Committed,
    RunRecord,
    StateLayout,
    bucket_error,
    check_resumable,
    files_read,
    last_committed,
    read_record,
    write_record,
)
from spark_udf.cluster import (
    TaskFailures,
    buckets_for,
    check_shared_checkpoint,
    new_checkpoint_partitions,
)
from spark_udf.edits import ProgramEdit, edit_program
from spark_udf.errors import CheckpointError, OperatorConfigError, SparkOperatorError
from spark_udf.flush import end_of_input_rows
from spark_udf.live import LiveChanges, LiveProgram, ProgramLog
from spark_udf.pipeline import program_outputs
from spark_udf.routing import DEFAULT_BUCKETS
from spark_udf.rules import ProcessorSpec, route_specs
from spark_udf.session import session
from spark_udf.sinks import BatchSink, MatchHook
from spark_udf.sources import (
    EVENT_COLUMN,
    SOURCE_TYPES,
    STREAM_URL_SCHEMES,
    JsonLinesIndex,
    check_server,
    read_jsonl,
    read_redis,
    split_stream_url,
)

__all__ = ["RunSummary", "lines_read", "main", "run_spark"]


@dataclass(frozen=True)
class RunSummary:
    """What a :func:`run_spark` call did.

    Attributes
    ----------
    batches:
        Micro-batches written by this run (a rerun after a crash counts its own only).
    input_rows:
        Input rows read by this run.
    matches, dead_letters, late:
        Rows written by this run (``late`` is included in ``dead_letters``).
    duration_s:
        Wall time of the query.
    stopped_by_signal:
        True when SIGINT/SIGTERM stopped the query before the input was exhausted.
    last_batch_id:
        Id of the last micro-batch written (``None`` if none).
    checkpoint:
        The checkpoint directory (reuse it to continue).
    skipped:
        Declarations of the program that the Spark engine did not run (none for a program
        of rules, queries and metrics).
    resumed_after:
        The checkpoint's last committed micro-batch when the run started (``None``: a new
        checkpoint).
    flushed_after:
        The micro-batch whose state this run's end-of-input flush ran on (its rows are in
        ``part-<id>-end.*`` and counted in ``matches``/``dead_letters``), or ``None``: no
        flush (``--follow``, stopped, nothing committed, no keyed processor, or an earlier run
        flushed that same state).
    flush_s:
        Wall time of the flush.
    edits:
        When the run continued a checkpoint: what it did with each rule, query and metric of
        the program (kept with its state, reset to a new version, added, dropped).
    held:
        Per rule, the matches its ``unique`` held back in this run.
    uncorrected:
        Events of clock-corrected streams read by this run that kept their device time,
        lacking a sent or received time (:mod:`cep.events.clock`), each counted once as the
        embedded engine counts them (:attr:`cep.engine.EngineStats.uncorrected`).
    """

    batches: int
    input_rows: int
    matches: int
    dead_letters: int
    late: int
    duration_s: float
    stopped_by_signal: bool
    last_batch_id: int | None
    checkpoint: str
    skipped: tuple[str, ...] = ()
    resumed_after: int | None = None
    flushed_after: int | None = None
    flush_s: float = 0.0
    edits: RestoreReport | None = None
    held: Mapping[str, int] = field(default_factory=dict)
    uncorrected: int = 0

    @property
    def events_per_second(self) -> float:
        """Input rows per second of wall time."""
        return self.input_rows / self.duration_s if self.duration_s > 0 else 0.0


def _edit(program: Any, lateness_ms: int | None, previous: StateLayout | None) -> ProgramEdit:
    """The program compiled to continue ``previous`` (its rules and metrics versioned, its
    processors placed; :mod:`spark_udf.edits`); processor specs run as given."""
    specs = [program] if isinstance(program, ProcessorSpec) else program
    if isinstance(specs, Sequence) and specs and all(
        isinstance(p, ProcessorSpec) for p in specs
    ):
        return ProgramEdit(tuple(specs), (), tuple(range(len(specs))), len(specs))
    return edit_program(program, lateness_ms=lateness_ms, previous=previous)


class _StopSignal:
    """SIGINT/SIGTERM set a flag the polling loop reads, instead of raising inside py4j; a
    second signal asks to stop at once rather than after the running micro-batch."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()
        self.signals = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signals += 1
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_spark(
    program: Any,
    events_path: str,
    *,
    out: str,
    dead_letter: str | None = None,
    master: str = "local[*]",
    checkpoint: str | None = None,
    available_now: bool = True,
    trigger_interval: str = "1 second",
    max_records_per_batch: int = 100_000,
    buckets: int | None = None,
    shuffle_partitions: int | None = None,
    fmt: str = "jsonl",
    on_matches: MatchHook | None = None,
    stream: str | None = None,
    lateness_ms: int | None = None,
    spark: Any = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    end_of_input: bool = True,
    stop: threading.Event | None = None,
    on_resume: Callable[[Committed, RestoreReport], None] | None = None,
    program_updates: Callable[[], tuple[int | None, Any] | None] | None = None,
    program_version: int | None = None,
    on_change: Callable[[dict[str, Any]], None] | None = None,
) -> RunSummary:
    """Run a program's rules, queries and metrics over a JSON-lines file or directory, or a
    Redis Stream, with Spark.

    Parameters
    ----------
    program:
        Rule file path, DSL text, parsed module(s), or :class:`ProcessorSpec`\\ (s).
    events_path:
        A JSON-lines file or a directory of them (read in name order; ``_seq`` of an event
        is its line number across the input, as in the embedded engine), or a Redis Stream
        ``redis://HOST:PORT[/DB]/KEY`` (``rediss://`` with TLS; ``_seq`` counts entries).
    out, dead_letter:
        Directories for match files and dead-letter files (one file per micro-batch,
        idempotent by batch id).
    checkpoint:
        Spark checkpoint directory (default ``<out>/_checkpoint``); rerunning with the same one
        continues after the last committed micro-batch, over whatever the input gained since
        (new files sorting after the last one read, lines appended to it, new stream entries).
        A rerun that cannot reuse the state (another ``buckets``, other keyed rules or
        metrics, an input changed behind what was read) raises
        :class:`~spark_udf.errors.CheckpointError` before starting.
    available_now:
        Process what is there now, in micro-batches of ``max_records_per_batch``, then stop
        (finite input). ``False`` keeps polling every ``trigger_interval`` until SIGINT/SIGTERM
        (or ``stop``).
    buckets, shuffle_partitions:
        Hash buckets per processor and Spark's shuffle partitions, both fixed for the life of
        a checkpoint. ``None``: a rerun takes the checkpoint's; a new checkpoint gets them
        from the cores Spark schedules on (:func:`spark_udf.cluster.partitions_for` and
        :func:`~spark_udf.cluster.buckets_for`; shuffle partitions set when the session was
        built are kept), and records them in its ``vigil.json``.
    fmt:
        ``jsonl`` (match objects, like the embedded engine) or ``parquet``.
    on_matches:
        ``on_matches(batch_id, matches)`` after each batch's files are written (alert hook).
    stream:
        Stream of events without a ``stream`` field (default: the program's only stream).
    lateness_ms:
        Overrides every stream's lateness.
    spark:
        An existing SparkSession, or a function making one, called once the checkpoint is
        found fit to continue (default: :func:`spark_udf.session` with ``master``).
    on_progress:
        Called with each micro-batch's Spark progress report (a dict), plus ``eventRows``
        (events read, each counted once), ``endOfInput`` (the batch read the end mark), and
        since the previous report ``failedTasks`` (task attempts that failed and were
        retried), ``stageRetries``, ``executorsLost`` (``host:port``) and ``executors`` (the
        number registered; :class:`spark_udf.cluster.TaskFailures`);
        after the end-of-input flush with ``{"batchId", "endOfInput": True, "flush": True,
        "matches", "durationMs"}``.
    end_of_input:
        With ``available_now``, end the run with the end-of-input flush (:mod:`spark_udf.flush`):
        the run then reports what the embedded engine reports for the same input, including
        matches and windows that only the end of input closes. The flush reads the
        checkpoint's state and leaves it as it was, so a rerun over a grown input continues
        from the state before the flush.
    stop:
        Setting this event stops the query after its current micro-batch, as SIGINT/SIGTERM
        do (for a run in another thread).
    on_resume:
        Called before the query starts when the run continues a checkpoint, with its last
        committed micro-batch and what the run does with each rule, query and metric of the
        program (an edited program keeps the state of the unchanged ones; see
        :mod:`spark_udf.edits`).
    program_updates:
        With ``available_now=False`` (a JSON-lines or Redis input): called between micro-batches,
        returns ``(registry version, program)`` when the program changed (else ``None``). The
        new program runs from the next micro-batch Spark plans, without restarting the query
        (:mod:`spark_udf.live`): added rules, queries and metrics start there, changed ones
        start fresh at a new version, removed ones stop, the others keep their state; each
        match carries the ``registry_version`` it ran under (``program_version`` for the
        program the run starts with).
    on_change:
        Hears what :class:`spark_udf.live.LiveChanges` reports: a program appended, then in
        effect from a micro-batch.

    Returns
    -------
    RunSummary

    Examples
    --------
    With ``spark`` a SparkSession:

    >>> import os, shutil, tempfile
    >>> from spark_udf.sinks import read_outputs
    >>> work = tempfile.mkdtemp()
    >>> events = os.path.join(work, "events.jsonl")
    >>> with open(events, "w") as handle:
    ...     _ = handle.write('{"card_id": "c1", "amount": 500, "ts": "2026-01-01T00:00:00Z"}\\n')
    ...     _ = handle.write('{"card_id": "c2", "amount": 5, "ts": "2026-01-01T00:00:01Z"}\\n')
    >>> summary = run_spark('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... ''', events, out=os.path.join(work, "out"), spark=spark)
    >>> summary.input_rows, summary.matches, summary.dead_letters
    (2, 1, 0)
    >>> [(m["name"], m["key"]) for m in read_outputs(os.path.join(work, "out"))]
    [('big', {'card_id': 'c1'})]
    >>> shutil.rmtree(work)
    """
    from_redis = events_path.startswith(STREAM_URL_SCHEMES)
    if from_redis:
        server_url, stream_key = split_stream_url(events_path)
        check_server(server_url)
    elif not os.path.exists(events_path):
        raise OperatorConfigError(f"events path {events_path!r} does not exist")
    checkpoint = checkpoint or os.path.join(out, "_checkpoint")
    if "://" not in checkpoint and not checkpoint.startswith("file:"):
        # The JVM resolves a relative path against its own directory, which need not be ours.
        checkpoint = os.path.abspath(checkpoint)
    input_kind = "redis" if from_redis else "jsonl"
    index = None if from_redis else JsonLinesIndex(events_path)
    committed = last_committed(checkpoint)
    record = read_record(checkpoint)
    previous = record.layout if record is not None and committed is not None else None
    edit = _edit(program, lateness_ms, previous)
    specs, skipped = list(edit.specs), list(edit.skipped)
    if buckets is None and committed is not None:
        # A checkpoint written before vigil.json recorded buckets used the default.
        buckets = record.layout.buckets if record is not None else DEFAULT_BUCKETS
    # What the checkpoint holds must fit this run: checked before a JVM starts.
    layout = StateLayout.of(specs, buckets or DEFAULT_BUCKETS, input_kind, edit=edit)
    check_resumable(checkpoint, layout, committed, record,
                    None if index is None else index.counts())
    if spark is None:
        spark = session(master)
    elif callable(spark):
        spark = spark()
    if committed is None:
        partitions = new_checkpoint_partitions(spark, shuffle_partitions)
        buckets = buckets or buckets_for(partitions)
        layout = StateLayout.of(specs, buckets, input_kind, partitions=partitions, edit=edit)
    else:
        buckets = layout.buckets
        if record is not None:
            layout = replace(layout, partitions=record.layout.partitions)
    check_shared_checkpoint(spark, checkpoint)
    if on_resume is not None and committed is not None and previous is not None and edit.forms:
        on_resume(committed, edit.report)
    plan = route_specs(SOURCE_TYPES, specs, json_col=EVENT_COLUMN, stream=stream,
                       buckets=buckets, slots=layout.slots) if specs else None
    finite = available_now and end_of_input
    # The end of a finite input is flushed beside the checkpoint (spark_udf.flush), which keeps
    # the state before it; a plan the flush cannot read (no route plan) ends its input with the
    # end-of-input mark instead, which finishes the checkpoint.
    in_stream_mark = finite and plan is None and specs and not from_redis

    def read(**route: Any) -> Any:
        if from_redis:
            return read_redis(spark, stream_key, url=server_url,
                              max_records_per_batch=max_records_per_batch,
                              live=route.get("live"))
        return read_jsonl(spark, events_path, max_records_per_batch=max_records_per_batch,
                          end_of_input=bool(in_stream_mark), **route)

    live = changes = None
    if program_updates is not None:
        if available_now or plan is None:
            raise OperatorConfigError(
                "a program that changes while the query runs needs a following run "
                "(available_now=False) and a rule or metric to start with"
            )
        live = LiveProgram(checkpoint, dict(SOURCE_TYPES), EVENT_COLUMN, stream, buckets,
                           lateness_ms)
        changes = LiveChanges(ProgramLog(checkpoint), live, layout, plan.lateness_ms,
                              on_change)
        changes.start(program_version, program, edit)
        route_options: dict[str, Any] = {"live": live}
    else:
        route_options = {}

    events = read(**route_options)
    # Every rule set and metric in one stateful operator; a JSON-lines source routes its own
    # rows (spark_udf.routing): the events never cross into the JVM as rows.
    routed = None if plan is None else (
        events if from_redis else read(route=plan, **route_options), plan)
    built = program_outputs(events, program, specs, skipped, json_col=EVENT_COLUMN,
                            stream=stream, buckets=buckets, routed=routed, live=live)
    if built.outputs is None:
        raise OperatorConfigError("the program declares nothing the Spark engine runs")
    outputs, skipped = built.outputs, list(built.skipped)

    layout = replace(layout, sources=len(built.inputs))
    check_resumable(checkpoint, layout, committed, record)
    if committed is None or record is not None:
        # A new checkpoint takes this layout; a recorded one was just found the same. (One
        # written before checkpoints kept a record gets it after a run that worked.)
        record = RunRecord(layout, record.files if record else (),
                           record.flushed_batch if record else None)
        write_record(checkpoint, record)

    annotate = None
    if changes is None and program_version is not None:
        def annotate(batch_id: int) -> dict[str, Any]:
            return {"registry_version": program_version}
    elif changes is not None:
        changes.layout = layout
        follow_changes = changes

        def annotate(batch_id: int) -> dict[str, Any]:
            version = follow_changes.registry_version(batch_id)
            return {} if version is None else {"registry_version": version}

    sink = BatchSink(out, dead_letter, fmt=fmt, on_matches=on_matches, annotate=annotate)
    writer = outputs.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=trigger_interval)
    )
    started = time.monotonic()
    seen: set[int] = set()
    input_rows = 0
    stopped = False
    with _StopSignal(stop) as signals:
        for attempt in range(1, _STARTS + 1):
            query = writer.start()
            failures = TaskFailures(spark, str(query.runId))
            try:
                while query.isActive:
                    if signals.event.is_set():
                        stopped = True
                        _stop_after_batch(query, signals)
                        break
                    query.awaitTermination(0.25)
                    input_rows += _new_progress(query, seen, on_progress, failures)
                    if changes is not None:
                        _follow_program(changes, program_updates, checkpoint, record)
            except Exception:
                if attempt == _STARTS or not _slow_python_start(query):
                    raise
                continue  # nothing ran: the same query starts again from the checkpoint
            finally:
                if query.isActive:
                    query.stop()
            break
    input_rows += _new_progress(query, seen, on_progress, failures)
    error = query.exception()
    if error is not None and not stopped:
        raise bucket_error(error) or SparkOperatorError(f"the streaming query failed: {error}")
    duration = time.monotonic() - started

    last = last_committed(checkpoint)
    flushed_after, flush_s = None, 0.0
    flushed_batch = record.flushed_batch if record else None
    if finite and not stopped and plan is not None and last is not None:
        if flushed_batch != last.batch_id:
            began = time.monotonic()
            rows = end_of_input_rows(spark, checkpoint, plan)
            flushed = sink.write_end(rows, last.batch_id)
            flush_s = time.monotonic() - began
            flushed_after = flushed_batch = last.batch_id
            if on_progress is not None:
                on_progress({"batchId": last.batch_id, "endOfInput": True, "flush": True,
                             "eventRows": 0, "matches": flushed,
                             "durationMs": {"triggerExecution": int(flush_s * 1000)}})
    if changes is not None:
        layout = changes.layout
    if last is not None:
        read_files = () if index is None else files_read(index.counts(), last.lines or 0)
        write_record(checkpoint, RunRecord(layout, read_files, flushed_batch))
    counters = sink.counters
    return RunSummary(
        batches=counters.batches,
        input_rows=input_rows,
        matches=counters.matches,
        dead_letters=counters.dead_letters,
        late=counters.late,
        duration_s=duration + flush_s,
        stopped_by_signal=stopped,
        last_batch_id=counters.last_batch_id,
        checkpoint=checkpoint,
        skipped=tuple(skipped),
        resumed_after=None if committed is None else committed.batch_id,
        flushed_after=flushed_after,
        flush_s=flush_s,
        edits=edit.report if previous is not None and edit.forms else None,
        held=dict(counters.held),
        uncorrected=counters.uncorrected,
    )


_STOP_WAIT_S = 300.0
_STARTS = 3
_SLOW_PYTHON = "Python worker failed to connect back"


def _slow_python_start(query: Any) -> bool:
    """Whether ``query`` failed before running a micro-batch because a Python process did not
    connect back to Spark in time: Spark gives one it starts outside its worker daemon (the
    driver's planning of a Python data source, for one) a fixed 10 s, which a loaded machine
    can exceed while it imports pandas and pyarrow. Nothing ran, so starting the query again
    from its checkpoint is safe."""
    error = query.exception()
    return error is not None and _SLOW_PYTHON in str(error) and not query.recentProgress


def _stop_after_batch(query: Any, signals: _StopSignal) -> None:
    """Stop ``query`` once the micro-batch running when asked has committed (a second signal,
    or waiting longer than ``_STOP_WAIT_S``, stops it at once: the batch is then replayed by
    the next run). A batch that starts meanwhile is interrupted, and replayed likewise."""
    deadline = time.monotonic() + _STOP_WAIT_S
    running = _last_batch(query)
    while (
        query.isActive and signals.signals < 2 and time.monotonic() < deadline
        and query.status.get("isTriggerActive") and _last_batch(query) == running
    ):
        query.awaitTermination(0.1)
    query.stop()


def _last_batch(query: Any) -> int | None:
    progress = query.lastProgress
    return None if progress is None else progress.get("batchId")


def _follow_program(
    changes: LiveChanges,
    program_updates: Callable[[], tuple[int | None, Any] | None],
    checkpoint: str,
    record: RunRecord | None,
) -> None:
    """Between micro-batches of a live query: report the programs now in effect, and append
    a new one if there is one (recording the layout it gives the checkpoint)."""
    last = last_committed(checkpoint)
    if last is not None:
        changes.committed(last.batch_id)
    update = program_updates()
    if update is None:
        return
    version, program = update
    try:
        changes.take(version, program)
    except (VigilError, OperatorConfigError, CheckpointError) as err:
        if changes.on_change is not None:
            changes.on_change({"registryVersion": version, "error": str(err)})
        return
    write_record(checkpoint, RunRecord(changes.layout, record.files if record else (),
                                       record.flushed_batch if record else None))


def _new_progress(
    query: Any,
    seen: set[int],
    on_progress: Callable[[dict[str, Any]], None] | None,
    failures: TaskFailures | None = None,
) -> int:
    rows = 0
    for progress in query.recentProgress:
        batch = progress["batchId"]
        if batch in seen or "addBatch" not in (progress.get("durationMs") or {}):
            # An idle trigger's report (no new input, no timer due) names the next batch id
            # but ran no batch.
            continue
        seen.add(batch)
        # Every branch of the plan reads the input (and a routed source reports blobs, not
        # events): count the lines the micro-batch read, once, without the end-of-input mark.
        events = lines_read(progress)
        end = _reads_end_mark(progress)
        rows += events
        if on_progress is not None:
            health = failures.since_last() if failures is not None else {}
            on_progress({**progress, "eventRows": events, "endOfInput": bool(end), **health})
    return rows


def lines_read(progress: dict[str, Any]) -> int:
    """Input lines (or Redis Stream entries) a micro-batch read: the largest range over its
    sources."""
    lines = 0
    for source in progress.get("sources") or ():
        start, end = (_offset(source.get(k)) for k in ("startOffset", "endOffset"))
        for position in ("line", "seq"):
            if position in end:
                lines = max(lines, int(end[position]) - int(start.get(position, 0)))
    return lines


def _reads_end_mark(progress: dict[str, Any]) -> int:
    """1 when this micro-batch read the source's end-of-input mark, else 0."""
    for source in progress.get("sources") or ():
        start, end = (_offset(source.get(k)) for k in ("startOffset", "endOffset"))
        if end.get("end") and not start.get("end"):
            return 1
    return 0


def _offset(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _load_spec(target: str) -> ProcessorSpec:
    module_name, _, attr = target.partition(":")
    if not attr:
        raise OperatorConfigError(f"--processor takes module:callable, got {target!r}")
    module = importlib.import_module(module_name)
    # The module may live outside the installed packages (a test, a notebook): ship it by value.
    cloudpickle.register_pickle_by_value(module)
    spec = getattr(module, attr)()
    if not isinstance(spec, ProcessorSpec):
        raise OperatorConfigError(f"{target} returned {type(spec).__name__}, not ProcessorSpec")
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spark_udf.run``: run a program (or a processor spec) and print the summary."""
    parser = argparse.ArgumentParser(prog="python -m spark_udf.run", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--program", nargs="+", help="rule files")
    source.add_argument("--processor", help="module:callable returning a ProcessorSpec")
    parser.add_argument("--events", required=True,
                        help="JSON-lines file or directory, or redis://HOST:PORT[/DB]/KEY")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dead-letter")
    parser.add_argument("--checkpoint")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--max-records-per-batch", type=int, default=100_000)
    parser.add_argument("--buckets", type=int, default=None)
    parser.add_argument("--shuffle-partitions", type=int, default=None)
    parser.add_argument("--pack", help="an archive of `vigil pack`, shipped to the executors")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--follow", action="store_true",
                        help="keep polling for new input until Ctrl-C")
    args = parser.parse_args(argv)
    if args.processor:
        program: Any = _load_spec(args.processor)
    elif len(args.program) == 1:
        program = args.program[0]
    else:
        program = load_program(args.program).modules
    summary = run_spark(
        program, args.events, out=args.out, dead_letter=args.dead_letter, master=args.master,
        checkpoint=args.checkpoint, available_now=not args.follow,
        max_records_per_batch=args.max_records_per_batch, buckets=args.buckets,
        shuffle_partitions=args.shuffle_partitions, fmt=args.format,
        spark=lambda: session(args.master, pack=args.pack),
    )
    print(json.dumps({**asdict(summary), "events_per_second": summary.events_per_second}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
