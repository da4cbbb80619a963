"""``vigil run``: run the rules, queries and metrics of rule files over JSON-lines events, on
Spark (the default for a file or directory) or in the embedded engine (stdin, ``--engine
embedded``).

Matches go to ``--out`` (one JSON object a line; a directory of micro-batch files on Spark),
events that cannot be used to ``--dead-letter``, and a summary to stderr. Exit codes: 0 ok,
1 errors in the rule files, 2 a usage problem (missing file, bad option).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from cep.alerts import AlertError
from cep.alerts.routing import AlertSink
from cep.cli.arguments import (
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    expand_rule_paths,
    positive_int,
)
from cep.engine import Engine
from cep.engine.checkpoint import CheckpointStore
from cep.errors import CheckpointError
from cep.events.event import StreamSchema
from cep.inputs import REDIS_SCHEMES, EventInput, InputReader, Piece, RedisInputError
from cep.registry import Registry, RegistryFollower
from query_lang.errors import VigilError
from query_lang.loader import check_program

__all__ = ["EventInput", "configure_parser", "parse_event_specs", "run"]

PROGRESS_INTERVAL_S = 0.25

EXIT_STOPPED = 130
"""A followed run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report Ctrl-C)."""

CHECKPOINT_INTERVAL_S = 5.0
"""How often an embedded run with ``--checkpoint`` saves its state (and when it stops)."""

DEFAULT_STATE_OUTBOX = os.path.join(".vigil", "outbox.sqlite")
"""The alert outbox of a run that writes no directory (``--out -`` or a file)."""


def configure_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` sub-command to ``vigil``'s argument parser."""
    parser = subparsers.add_parser(
        "run",
        help="run rules over JSON-lines events",
        description="Run the rules of rule files over events (JSON lines) and print matches.",
    )
    parser.add_argument(
        "files", nargs="*", help="rule files, directories or glob patterns (or --registry)"
    )
    parser.add_argument(
        "--registry", metavar="PATH",
        help="run the program of a registry (`vigil registry push`) instead of rule files; "
        "with --follow, each new registry version takes effect between two batches of events "
        "(embedded) or from the next micro-batch (Spark), the unchanged rules, queries and "
        "metrics keeping their state, and every match carries the registry_version it ran "
        "under",
    )
    parser.add_argument(
        "--events",
        action="append",
        required=True,
        metavar="PATH|-|redis://HOST:PORT/KEY|STREAM=...",
        help="events: a JSON-lines file, a directory of them, - for stdin, or a Redis stream "
        "(redis://HOST:PORT[/DB]/KEY); STREAM=... binds every event of the input to STREAM "
        "(repeatable)",
    )
    parser.add_argument(
        "--follow", action="store_true",
        help="never end: read a directory's new files as they appear (in name order), a "
        "file's appended lines (the embedded engine also survives rotation, as tail -F; "
        "Spark does not), a Redis stream's new entries; Ctrl-C or SIGTERM stops after the "
        "current batch, and a rerun with the same --checkpoint continues",
    )
    parser.add_argument(
        "--engine", choices=["embedded", "spark"], default=None,
        help="spark (the default for one file or directory: a Structured Streaming query; "
        "--out is then a directory of one file per micro-batch) or embedded (in-process; the "
        "default for stdin and several inputs)",
    )
    parser.add_argument(
        "--master", default="local[*]", help="Spark master for --engine spark (default local[*])"
    )
    parser.add_argument(
        "--pack", metavar="OUT.tar.gz",
        help="--engine spark: the environment packed by `vigil pack`, shipped to the executors "
        "(spark.archives) and run as their Python, so workers need no Vigil installed",
    )
    parser.add_argument(
        "--checkpoint", metavar="DIR",
        help="where the run keeps its state and input position: Spark's checkpoint (default "
        "OUT/_checkpoint), or the embedded engine's (saved every 5 s and when it stops; --out "
        "and --dead-letter are then appended to); rerun with it to continue",
    )
    parser.add_argument(
        "--checkpoint-interval", type=float, default=CHECKPOINT_INTERVAL_S, metavar="SECONDS",
        help="--engine embedded with --checkpoint: save the state at most this often "
        "(default 5; 0 after every batch)",
    )
    parser.add_argument(
        "--buckets", type=positive_int, default=None, metavar="N",
        help="--engine spark: hash buckets of the partition keys (default: from the cluster's "
        "cores when the checkpoint is made, at least 16; recorded in it and fixed for its life)",
    )
    parser.add_argument(
        "--max-records-per-batch", type=positive_int, default=None, metavar="N",
        help="--engine spark: at most N input lines (or stream entries) per micro-batch "
        "(default 100,000); smaller batches bound a batch's memory and latency",
    )
    parser.add_argument(
        "--outbox", metavar="PATH",
        help="the durable alert outbox (SQLite): matches whose rule has `notify` go there "
        "before they are written, and are sent to their webhooks (default: OUT/_outbox.sqlite "
        "for a directory --out, else .vigil/outbox.sqlite)",
    )
    parser.add_argument(
        "--no-alerts", action="store_true",
        help="do not deliver the program's `notify` alerts (a warning says what is skipped)",
    )
    parser.add_argument(
        "--webhook-url", action="append", default=[], metavar="NAME=URL",
        help="send the alerts of webhook NAME to URL instead of its declared url (a staging "
        "or local receiver; its secrets stay as declared; repeatable)",
    )
    parser.add_argument(
        "--delivery-deadline", type=float, default=30.0, metavar="SECONDS",
        help="after the input ends, how long to keep delivering alerts (default 30); what is "
        "still pending stays in the outbox for `vigil alerts drain`",
    )
    parser.add_argument("--out", default="-", metavar="PATH|-", help="matches (default stdout)")
    parser.add_argument(
        "--dead-letter", metavar="PATH", help="write unusable events here as JSON lines"
    )
    parser.add_argument(
        "--max-partials", type=positive_int, metavar="N",
        help="cap on partial matches per rule and key",
    )
    parser.add_argument(
        "--progress", action="store_true", help="show progress even when stderr is not a TTY"
    )
    parser.set_defaults(handler=run)
    return parser


def parse_event_specs(specs: Sequence[str], streams: Sequence[str]) -> list[EventInput]:
    """Interpret ``--events`` values; ``STREAM=PATH`` when STREAM is a declared stream.

    Raises
    ------
    UsageError
        When a file does not exist or a binding names an undeclared stream.
    """
    inputs = []
    stdin_used = False
    for spec in specs:
        stream = None
        path = spec
        if "=" in spec and not os.path.exists(spec) and not spec.startswith(REDIS_SCHEMES):
            name, _, rest = spec.partition("=")
            if not name.isidentifier():
                raise UsageError(f"no such file or directory: {spec}")
            if name not in streams:
                declared = ", ".join(sorted(streams)) or "none"
                raise UsageError(
                    f"--events {spec}: stream '{name}' is not declared (declared: {declared})"
                )
            stream, path = name, rest
        if path == "-":
            if stdin_used:
                raise UsageError("stdin (-) can be given as --events only once")
            stdin_used = True
        elif path.startswith(REDIS_SCHEMES):
            if path.rstrip("/").count("/") < 3:
                raise UsageError(f"--events {spec}: name the stream key (redis://HOST:PORT/KEY)")
        elif not os.path.exists(path):
            raise UsageError(f"no such file or directory: {path}")
        inputs.append(EventInput(path, stream))
    return inputs


def run(args: argparse.Namespace) -> int:
    """Execute ``vigil run`` with parsed arguments; returns the exit code."""

    follower: RegistryFollower | None = None
    if getattr(args, "registry", None):
        try:
            follower = _follow_registry(args)
        except UsageError as err:
            print(f"vigil run: {err}", file=sys.stderr)
            return EXIT_USAGE
        except VigilError as err:
            return _report_errors(getattr(err, "errors", None) or [err])
        engine, program = follower.engine, follower.program
    else:
        try:
            paths = expand_rule_paths(args.files)
        except UsageError as err:
            print(f"vigil run: {err}", file=sys.stderr)
            return EXIT_USAGE
        program, errors = check_program(paths)
        if errors:
            return _report_errors(errors)
        engine = Engine(max_partials=args.max_partials)
        try:
            engine.register(program.modules)
        except VigilError as err:
            return _report_errors(getattr(err, "errors", None) or [err])
    if not engine.rules and not engine.standing:
        print("vigil run: the rule files declare no rule, query or metric to run",
              file=sys.stderr)
    try:
        inputs = parse_event_specs(args.events, list(engine.streams))
    except UsageError as err:
        print(f"vigil run: {err}", file=sys.stderr)
        return EXIT_USAGE

    engine_name = _engine_choice(args, inputs)
    spark_only = [flag for flag, value in (
        ("--pack", getattr(args, "pack", None)), ("--buckets", getattr(args, "buckets", None)),
        ("--max-records-per-batch", getattr(args, "max_records_per_batch", None)),
    ) if value is not None]
    if engine_name != "spark" and spark_only:
        print(f"vigil run: {', '.join(spark_only)} apply to --engine spark only; the embedded "
              "engine ignores them", file=sys.stderr)
    try:
        _check_webhook_urls(args, program)
    except UsageError as err:
        print(f"vigil run: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        sink = _alert_sink(args, program, engine_name)
    except AlertError as err:
        print(f"vigil run: {err}\n  (alerts are delivered by default when a rule has "
              "`notify`; --no-alerts runs without them)", file=sys.stderr)
        return EXIT_ERRORS
    if engine_name == "spark":
        try:
            return _run_spark(args, program, engine, inputs, sink, follower)
        finally:
            if follower is not None:
                follower.registry.close()
    # A run that continues from a checkpoint appends to what the runs before it wrote.
    append = args.checkpoint is not None
    try:
        out, close_out = _open_output(args.out, append)
        dead, close_dead = (_open_output(args.dead_letter, append) if args.dead_letter
                            else (None, False))
    except OSError as err:
        print(f"vigil run: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return EXIT_USAGE
    show_progress = bool(getattr(args, "progress", False)) or (
        sys.stderr.isatty() and not any(i.is_stdin or i.is_redis for i in inputs)
    )
    follow = bool(getattr(args, "follow", False))
    if follow and len(inputs) != 1:
        print("vigil run: --follow reads one --events input", file=sys.stderr)
        return EXIT_USAGE
    progress = _Progress(inputs, enabled=show_progress and not follow)
    schemas = {name: StreamSchema.from_decl(decl) for name, decl in engine.streams.items()}
    try:
        checkpoints = _Checkpoints.open(args.checkpoint, engine, inputs,
                                        getattr(args, "checkpoint_interval", CHECKPOINT_INTERVAL_S))
    except (CheckpointError, UsageError) as err:
        print(f"vigil run: {err}", file=sys.stderr)
        return EXIT_USAGE
    reader = InputReader(inputs, schemas, follow=follow, cursor=checkpoints.cursor)
    checkpoints.sink = sink
    started = time.perf_counter()
    stopped = False
    try:
        with _stop_on_signals(reader, enabled=follow) as signalled:
            for step in reader:
                if follower is not None and _took_new_version(follower, checkpoints):
                    engine = follower.engine
                    sink = checkpoints.sink = _rerouted(sink, args, follower.program)
                _feed(engine, step.pieces)
                _write(out, _queue_alerts(sink, _versioned(engine.drain(), follower)))
                _write(dead, engine.drain_dead_letters())
                if follow or checkpoints.enabled:  # written before a wait or a checkpoint
                    out.flush()
                    if dead is not None:
                        dead.flush()
                checkpoints.step(step.cursor)
                progress.advance(step.size)
                progress.update()
            stopped = bool(signalled)
        # The checkpoint holds the state before the end-of-input flush, so that a rerun over
        # a grown input continues as one run would (docs/semantics.md, finite runs).
        checkpoints.save()
        if not stopped:
            engine.close()
            _write(out, _queue_alerts(sink, _versioned(engine.drain(), follower)))
            _write(dead, engine.drain_dead_letters())
    except (OSError, RedisInputError) as err:
        print(f"vigil run: {err}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        progress.finish()
        if close_out:
            out.close()
        else:
            out.flush()
        if dead is not None and close_dead:
            dead.close()
    _summary(engine, time.perf_counter() - started, dead_letter_path=args.dead_letter)
    if follower is not None:
        follower.registry.close()
    if sink is not None:
        _deliver(sink, args.delivery_deadline)
    if stopped:
        resume = ("rerun the same command to continue" if checkpoints.enabled else
                  "nothing was checkpointed (run with --checkpoint DIR to be able to continue)")
        print(f"vigil run: stopped; {resume}", file=sys.stderr)
        return EXIT_STOPPED
    return EXIT_OK


class _Checkpoints:
    """``--checkpoint DIR`` of an embedded run: the engine's state and the input's cursor,
    restored at the start and saved at most every ``interval_s`` seconds of input and when the
    run stops (a :class:`cep.engine.checkpoint.CheckpointStore`). A checkpoint is saved only
    once the alerts of the input before it are on disk (``sink``): a run killed before that
    resumes from an earlier one and queues them again."""

    def __init__(
        self, store: CheckpointStore | None, engine: Engine, cursor: Any, interval_s: float
    ) -> None:
        self.store = store
        self.engine = engine
        self.cursor = cursor
        self.interval_s = interval_s
        self._last = cursor
        self._saved_at = time.monotonic()
        self.sink: AlertSink | None = None

    @property
    def enabled(self) -> bool:
        return self.store is not None

    @classmethod
    def open(
        cls, directory: str | None, engine: Engine, inputs: Sequence[EventInput],
        interval_s: float = CHECKPOINT_INTERVAL_S,
    ) -> _Checkpoints:
        """Restore the engine from ``directory``'s checkpoint, if any (printing what the
        program's edits kept and reset).

        Raises
        ------
        UsageError
            When the input cannot be checkpointed (several inputs read together).
        CheckpointError
            When the checkpoint cannot be read, naming the file.
        """
        if directory is None:
            return cls(None, engine, None, interval_s)
        if len(inputs) != 1:
            raise UsageError("--checkpoint with --engine embedded reads one --events input")
        store = CheckpointStore(directory)
        saved = store.load()
        if saved is None:
            return cls(store, engine, None, interval_s)
        report = engine.restore(saved.state)
        print(f"vigil run: continuing from {saved.path}: {report.summary()}", file=sys.stderr)
        return cls(store, engine, saved.cursor, interval_s)

    def step(self, cursor: Any) -> None:
        self._last = cursor
        if self.store is not None and time.monotonic() - self._saved_at >= self.interval_s:
            self.save()

    def save(self) -> None:
        if self.store is not None:
            if self.sink is not None:
                self.sink.flush()
            self.store.save(self.engine.snapshot(), cursor=self._last)
            self._saved_at = time.monotonic()


def _follow_registry(args: argparse.Namespace) -> RegistryFollower:
    """The engine of ``--registry PATH``, at the registry's newest version.

    Raises
    ------
    UsageError
        When rule files are given too, or the registry is missing or empty.
    """
    path = args.registry
    if args.files:
        raise UsageError("give rule files or --registry, not both")
    if not os.path.isfile(path):
        raise UsageError(f"no registry at {path} (`vigil registry push FILES --registry "
                         f"{path}` makes one)")
    registry = Registry(path)
    if registry.version == 0:
        registry.close()
        raise UsageError(f"the registry {path} holds nothing yet (`vigil registry push FILES "
                         f"--registry {path}`)")
    consumer = (f"vigil run {os.path.abspath(args.checkpoint)}" if args.checkpoint else
                f"vigil run pid {os.getpid()} on {socket.gethostname()}")
    follower = RegistryFollower(
        registry, lambda: Engine(max_partials=args.max_partials), consumer=consumer
    )
    print(f"vigil run: registry {path} at version {follower.applied}", file=sys.stderr)
    return follower


def _took_new_version(follower: RegistryFollower, checkpoints: _Checkpoints) -> bool:
    """Between two batches: take the registry's newest version, if any; True when the
    program changed (the engine may be another object: the caller takes
    ``follower.engine``)."""
    try:
        applied = follower.poll()
    except Exception:
        print(f"vigil run: registry {follower.apply_error}: not applied; the run goes on "
              f"with version {follower.applied}", file=sys.stderr)
        checkpoints.engine = follower.engine
        return True
    if applied is None:
        return False
    checkpoints.engine = follower.engine
    print(f"vigil run: registry version {applied.version} in effect after "
          f"{applied.seconds * 1000:.1f} ms ({applied.describe()})", file=sys.stderr)
    return True


def _rerouted(sink: AlertSink | None, args: argparse.Namespace, program: Any) -> AlertSink | None:
    """The alert sink for a changed program: the same outbox, routed by its webhooks and
    ``notify``; opened when the first rule that notifies comes in."""
    if getattr(args, "no_alerts", False):
        return None
    if sink is None:
        return _alert_sink(args, program, "embedded") if _notifying(program) else None
    for message in sink.reroute(_routed(program, args)):
        print(f"vigil run: warning: {message}: its alerts will not be delivered",
              file=sys.stderr)
    return sink


def _versioned(
    matches: list[dict[str, Any]], follower: RegistryFollower | None
) -> list[dict[str, Any]]:
    """Each match with the registry version the engine ran when it was produced."""
    if follower is not None:
        for match in matches:
            match["registry_version"] = follower.applied
    return matches


@contextmanager
def _stop_on_signals(reader: InputReader, *, enabled: bool) -> Iterator[list[int]]:
    """While a followed run reads, SIGINT and SIGTERM stop it after the step being fed (the
    list yielded gets the signal's number); the handlers before are restored after."""
    received: list[int] = []
    if not enabled:
        yield received
        return

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        reader.stop()

    saved = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _feed(engine: Engine, pieces: Sequence[Piece]) -> None:
    """Hand a step to the engine: each batch in one call, dead letters in their places."""
    for piece in pieces:
        if isinstance(piece, dict):
            engine.reject(piece)
        else:
            engine.feed_batch(
                piece.frame, source=piece.source, lines=piece.lines,
                positions=piece.positions, raw=piece.raw,
            )


def _engine_choice(args: argparse.Namespace, inputs: Sequence[EventInput]) -> str:
    """``--engine``, or the default: Spark for one file or directory, the embedded engine for
    stdin and for several inputs (Spark's file source reads one path)."""
    chosen = getattr(args, "engine", None)
    if chosen is not None:
        return chosen
    if len(inputs) == 1 and not inputs[0].is_stdin:
        return "spark"
    if len(inputs) > 1:
        print("vigil run: several --events inputs run in the embedded engine", file=sys.stderr)
    return "embedded"


def _run_spark(
    args: argparse.Namespace, program: Any, engine: Engine, inputs, sink: Any,
    follower: RegistryFollower | None = None,
) -> int:
    """``--engine spark``: rules, queries and metrics run in one Structured Streaming query.

    ``--out DIR`` keeps the micro-batch files (and the checkpoint, by default); ``--out -``
    prints the matches as each micro-batch commits, with the files in a scratch directory.
    A finite run ends with the end-of-input flush, which the checkpoint does not keep: a rerun
    with it continues over whatever the input gained. ``--follow`` keeps the query polling
    the input until SIGINT/SIGTERM, which stop it after the current micro-batch. With
    ``--registry`` and ``--follow`` each new registry version runs from the next micro-batch
    (:mod:`spark_udf.live`).
    """
    if len(inputs) != 1 or inputs[0].is_stdin:
        print("vigil run: --engine spark reads one --events file, directory or redis:// "
              "stream", file=sys.stderr)
        return EXIT_USAGE
    follow = bool(getattr(args, "follow", False))
    to_stdout = args.out in (None, "-")
    scratch = tempfile.mkdtemp(prefix="vigil-run-") if to_stdout else None
    out_dir = scratch if to_stdout else args.out
    os.makedirs(out_dir, exist_ok=True)
    dead_dir = args.dead_letter or (None if to_stdout else os.path.join(out_dir, "_dead_letters"))
    log_path = os.path.join(out_dir, "_spark.log")
    counts: Counter[str] = Counter()
    sinks = [sink]  # a registry version with other webhooks or `notify` reroutes the alerts

    def on_matches(batch_id: int, matches: list[dict[str, Any]]) -> None:
        _alert(sinks[0], matches)
        counts.update(str(m.get("name")) for m in matches)
        if to_stdout:
            _write(sys.stdout, matches)
            sys.stdout.flush()

    from spark_udf.errors import OperatorConfigError, SourceError
    from spark_udf.run import run_spark

    names = [*engine.rules, *engine.standing]
    print(f"vigil run: Spark ({args.master}) runs {len(names)} rule(s), query(ies) and "
          f"metric(s); its log is {log_path}", file=sys.stderr)
    if follow:
        print(f"vigil run: following {inputs[0].path} (new files, appended lines, new stream "
              "entries, polled every second); Ctrl-C or SIGTERM stops after the current "
              "micro-batch", file=sys.stderr)
        if sink is not None:
            sink.start_delivery()  # a run that never ends delivers its alerts as they come
    live: dict[str, Any] = {}
    if follower is not None and follow:
        def updates() -> tuple[int | None, Any] | None:
            try:
                applied = follower.poll()
            except Exception:
                print(f"vigil run: registry {follower.apply_error}: not applied; the run "
                      f"goes on with version {follower.applied}", file=sys.stderr)
                return None
            if applied is None:
                return None
            before, sinks[0] = sinks[0], _rerouted(sinks[0], args, follower.program)
            if sinks[0] is not None and sinks[0] is not before:
                sinks[0].start_delivery()
            return applied.version, follower.program.modules

        live = {"program_updates": updates, "program_version": follower.applied,
                "on_change": _spark_program_change}
    elif follower is not None:
        live = {"program_version": follower.applied}
    failed = True
    try:
        summary = run_spark(
            program.modules, inputs[0].path, out=out_dir, dead_letter=dead_dir,
            master=args.master, checkpoint=args.checkpoint, on_matches=on_matches,
            stream=inputs[0].stream, spark=lambda: _spark_session(
                args.master, log_path, getattr(args, "pack", None)),
            on_progress=_spark_progress, available_now=not follow, on_resume=_spark_resumed,
            **({} if args.buckets is None else {"buckets": args.buckets}),
            **({} if getattr(args, "max_records_per_batch", None) is None
               else {"max_records_per_batch": args.max_records_per_batch}), **live,
        )
        failed = False
    except (CheckpointError, OperatorConfigError, SourceError) as err:
        # What the run was asked to do cannot work (a checkpoint of another program or bucket
        # count, an input changed behind it, an unreachable server): nothing ran.
        failed = False
        print(f"vigil run: {err}", file=sys.stderr)
        if sinks[0] is not None:
            sinks[0].close()
        return EXIT_USAGE
    finally:
        if scratch is not None and not failed:
            shutil.rmtree(scratch, ignore_errors=True)
        elif scratch is not None:
            print(f"vigil run: the Spark files are kept in {scratch}", file=sys.stderr)
    lines = [
        f"vigil run: spark: {summary.input_rows:,} event(s) in {summary.batches} "
        f"micro-batch(es) ({summary.events_per_second:,.0f}/s), {summary.matches} match(es), "
        f"{summary.dead_letters} dead letter(s) ({summary.late} late)"
        + (f", {summary.uncorrected} with their device's clock uncorrected (no sent or "
           "received time)" if summary.uncorrected else ""),
        *(f"  {name}: {counts[name]} match(es)"
          + (f" ({summary.held[name]} more held back by its unique)"
             if summary.held.get(name) else "")
          for name in sorted({*counts, *summary.held})),
    ]
    if summary.dead_letters and dead_dir is None:
        lines.append("  (use --dead-letter DIR to keep the late and bad events)")
    if not summary.input_rows and summary.resumed_after is not None and not follow:
        lines.append(
            f"vigil run: no new events since micro-batch {summary.resumed_after} of the "
            f"checkpoint {summary.checkpoint}"
            + ("" if summary.flushed_after is not None else
               "; its end of input was flushed by the run that read them")
        )
    print("\n".join(lines), file=sys.stderr)
    if sinks[0] is not None:
        _deliver(sinks[0], args.delivery_deadline)
    if summary.stopped_by_signal:
        if scratch is not None and args.checkpoint is None:
            print("vigil run: stopped; with --out - no checkpoint was kept: give --checkpoint "
                  "DIR to be able to continue a run", file=sys.stderr)
        else:
            print(f"vigil run: stopped after the last committed micro-batch; rerun the same "
                  f"command (checkpoint {summary.checkpoint}) to continue from there",
                  file=sys.stderr)
        return 130
    return EXIT_OK


def _spark_program_change(change: dict[str, Any]) -> None:
    """A registry version taken by a live Spark query, then in effect from a micro-batch."""
    version = change.get("registryVersion")
    if change.get("error"):
        print(f"vigil run: registry version {version} not applied: {change['error']}; the "
              "query goes on with the program it runs", file=sys.stderr)
    elif change.get("appended"):
        print(f"vigil run: registry version {version} taken; it runs from the next "
              f"micro-batch ({change['report'].forms()})", file=sys.stderr)
        for note in change.get("notes") or ():
            print(f"vigil run: warning: registry version {version}: {note}", file=sys.stderr)
    elif change.get("inEffect"):
        print(f"vigil run: registry version {version} in effect from micro-batch "
              f"{change['batchId']}, {change['afterMs']:.0f} ms after it was taken",
              file=sys.stderr)


def _spark_resumed(committed: Any, report: Any) -> None:
    """Where a Spark run continues its checkpoint, and what the program's edits keep."""
    print(f"vigil run: continuing after micro-batch {committed.batch_id} of the checkpoint: "
          f"{report.forms()}", file=sys.stderr)


def _spark_progress(progress: dict[str, Any]) -> None:
    """One line per micro-batch: the live view of a Spark run."""
    rows = progress.get("eventRows", progress.get("numInputRows", 0))
    took = (progress.get("durationMs") or {}).get("triggerExecution", 0) / 1000
    batch = progress.get("batchId")
    if progress.get("flush"):
        print(f"  after micro-batch {batch}: end of input, the watermark passes every event: "
              f"{progress.get('matches', 0)} match(es) flushed ({took:.1f}s; the checkpoint "
              "keeps the state before it, to continue over more input)", file=sys.stderr)
    elif progress.get("endOfInput"):
        print(f"  micro-batch {batch}: end of input, the watermark passes every event "
              f"({took:.1f}s)", file=sys.stderr)
    elif rows:
        rate = rows / took if took else 0.0
        print(f"  micro-batch {batch}: {rows:,} event(s) in {took:.1f}s "
              f"({rate:,.0f} events/s)", file=sys.stderr)
    else:
        print(f"  micro-batch {batch}: timers fired, windows closed ({took:.1f}s)",
              file=sys.stderr)
    lost, failed = progress.get("executorsLost") or [], progress.get("failedTasks") or 0
    retried = progress.get("stageRetries") or 0
    if lost or failed or retried:
        gone = f"executor(s) lost: {', '.join(lost)}; " if lost else ""
        print(f"    {gone}{failed} task attempt(s) failed and retried, {retried} stage(s) "
              "retried", file=sys.stderr)


def _spark_session(master: str, log_path: str, pack: str | None = None) -> Any:
    """A Spark session whose JVM writes its console (log4j warnings, the Python workers'
    chatter) to ``log_path`` instead of sharing our standard output and error."""
    from spark_udf import session

    saved = [os.dup(1), os.dup(2)]
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log, 1)
        os.dup2(log, 2)
        return session(master, pack=pack)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def _alert_sink(args: argparse.Namespace, program: Any, engine_name: str) -> AlertSink | None:
    """The outbox the run delivers alerts through: ``--outbox``, or by default one next to the
    output when the program has ``notify`` (``None`` with ``--no-alerts``, after a warning that
    names what will not be delivered).

    Raises
    ------
    AlertError
        When a webhook cannot be set up (a secret not set).
    """
    notifying = _notifying(program)
    program = _routed(program, args)
    if getattr(args, "no_alerts", False):
        if notifying:
            print(
                f"vigil run: --no-alerts: the matches of {_named(notifying)} are written but "
                "not delivered to their webhooks",
                file=sys.stderr,
            )
        return None
    path = getattr(args, "outbox", None)
    if path is None and not notifying:
        return None
    if path is None:
        spark_dir = engine_name == "spark" and args.out not in (None, "-")
        path = os.path.join(args.out, "_outbox.sqlite") if spark_dir else DEFAULT_STATE_OUTBOX
    # A secret not set leaves its webhook out, said here and in the summary; the run goes on
    # (its matches are written; a rerun with the secret set queues their alerts, same ids).
    sink = AlertSink.open(program, path, unset_ok=not getattr(args, "outbox", None))
    print(f"vigil run: alerts ({_named(notifying)}) go through the outbox {path}",
          file=sys.stderr)
    for message in sink.unset.values():
        print(f"vigil run: warning: {message}: its alerts will not be delivered", file=sys.stderr)
    sink.start_delivery()  # alerts leave as their matches are queued, not when input ends
    return sink


def _webhook_urls(args: argparse.Namespace) -> dict[str, str]:
    """``--webhook-url NAME=URL`` as NAME -> URL.

    Raises
    ------
    UsageError
        When a value is not NAME=URL.
    """
    urls: dict[str, str] = {}
    for spec in getattr(args, "webhook_url", None) or ():
        name, equals, url = spec.partition("=")
        if not equals or not name or not url:
            raise UsageError(f"--webhook-url {spec}: expected NAME=URL")
        urls[name] = url
    return urls


def _check_webhook_urls(args: argparse.Namespace, program: Any) -> None:
    """At the run's start, every ``--webhook-url`` names a declared webhook.

    Raises
    ------
    UsageError
        Naming the webhooks that are not declared, and those that are.
    """
    try:
        program.with_webhook_urls(_webhook_urls(args))
    except KeyError as err:
        raise UsageError(f"--webhook-url: {err.args[0]}") from None


def _routed(program: Any, args: argparse.Namespace) -> Any:
    """The program alerts are routed by: its webhooks moved by ``--webhook-url`` (a name a
    later registry version no longer declares is said and left out)."""
    urls = _webhook_urls(args)
    for name in sorted(set(urls) - set(program.webhooks)):
        print(f"vigil run: warning: --webhook-url {name}: the program no longer declares "
              "that webhook", file=sys.stderr)
        del urls[name]
    return program.with_webhook_urls(urls) if urls else program


def _notifying(program: Any) -> list[str]:
    """The names of the rules, queries and metrics that have ``notify``."""
    return sorted(
        name
        for name, decl in {**program.rules, **program.queries, **program.metrics}.items()
        if decl.notify
    )


def _named(names: Sequence[str]) -> str:
    """``a, b`` or ``a, b, c and 9 more``: names in a message that stays one line."""
    if not names:
        return "none notify"
    shown = ", ".join(names[:3])
    return shown if len(names) <= 3 else f"{shown} and {len(names) - 3} more"


def _queue_alerts(sink: AlertSink | None, matches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hand the alerts of matches to the outbox's writer without waiting for the disk (the
    checkpoint waits for it, :class:`_Checkpoints`)."""
    if sink is not None:
        sink.queue_many(matches)
    return matches


def _alert(sink: Any, matches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put matches that notify someone in the outbox (durably) before they are written."""
    if sink is not None:
        sink.submit_many(matches)
    return matches


def _deliver(sink: Any, deadline_s: float) -> None:
    result = sink.drain(deadline_s)
    sink.close()
    path = sink.outbox.path
    note = (f" (kept in the outbox: `vigil alerts drain --outbox {path}`)" if result.pending
            else "")
    throttled = f", {sink.throttled} throttled" if sink.throttled else ""
    print(
        f"alerts: {sink.enqueued} queued{throttled}, {result.delivered} delivered, "
        f"{result.failed} failed, {result.pending} pending{note}",
        file=sys.stderr,
    )
    if sink.unsent:
        print(
            f"alerts: {sink.unsent} alert(s) not delivered: no secret for "
            f"{', '.join(sorted(sink.unset))} (set it and rerun: the same matches keep their "
            "ids, so what was queued before is not sent twice)",
            file=sys.stderr,
        )
    if sink.outbox.conflicts:
        print(
            f"alerts: {sink.outbox.conflicts} match(es) reused a match_id already in the outbox "
            "with other content; queued under MATCH_ID.DIGEST ids (`vigil alerts status` "
            "counts them as conflicts)",
            file=sys.stderr,
        )


# ---------------------------------------------------------------------- writing


def _open_output(path: str | None, append: bool = False) -> tuple[IO[str], bool]:
    if path is None or path == "-":
        return sys.stdout, False
    return open(path, "a" if append else "w", encoding="utf-8"), True


def _write(handle: IO[str] | None, records: list[dict[str, Any]]) -> None:
    if handle is None or not records:
        return
    handle.write(
        "".join(
            json.dumps(r, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"
            for r in records
        )
    )


def _report_errors(errors: Sequence[VigilError]) -> int:
    for err in errors:
        print(err.render(), file=sys.stderr)
    files = len({e.file for e in errors})
    print(f"{len(errors)} error(s) in {files} file(s)", file=sys.stderr)
    return EXIT_ERRORS


def _summary(engine: Engine, seconds: float, *, dead_letter_path: str | None) -> None:
    stats = engine.stats
    rate = stats.events / seconds if seconds > 0 else 0.0
    lines = [
        f"vigil run: {stats.events} event(s) in {seconds:.2f}s ({rate:,.0f}/s), "
        f"{sum(stats.matches.values())} match(es), {stats.late} late, {stats.bad} bad"
        + (f", {stats.unkeyed} without a rule's key" if stats.unkeyed else "")
        + (f", {stats.uncorrected} with their device's clock uncorrected (no sent or received "
           "time)" if stats.uncorrected else "")
        + (f", {stats.unchanged} changelog row(s) that changed no table" if stats.unchanged
           else ""),
    ]
    for name, count in stats.matches.items():
        dropped = stats.dropped_partials.get(name, 0)
        extra = f" ({dropped} partial match(es) dropped by --max-partials)" if dropped else ""
        held = stats.suppressed.get(name, 0)
        extra += f" ({held} more held back by its unique)" if held else ""
        lines.append(f"  {name}: {count} match(es){extra}")
    for name, keys in stats.table_rows.items():
        lines.append(f"  table {name}: {keys} key(s)")
    if (stats.late or stats.bad or stats.unkeyed or stats.unchanged) and dead_letter_path is None:
        lines.append("  (use --dead-letter PATH to keep the late and bad events)")
    print("\n".join(lines), file=sys.stderr)


class _Progress:
    """A one-line progress bar on stderr for file input, refreshed a few times a second."""

    def __init__(self, inputs: Sequence[EventInput], *, enabled: bool) -> None:
        self.enabled = enabled
        self.done = 0
        self.total = 0
        self.last = 0.0
        self.started = time.perf_counter()
        if enabled:
            for inp in inputs:
                for path in inp.files():
                    if path != "-":
                        self.total += os.path.getsize(path)

    def advance(self, size: int) -> None:
        self.done += size

    def update(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        width = 30
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * width)
            text = f"\r[{bar:<{width}}] {frac:6.1%} {self.done / 1e6:,.1f} MB"
        else:
            text = f"\r{self.done / 1e6:,.1f} MB"
        sys.stderr.write(f"{text} {now - self.started:6.1f}s")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            self.update(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()
