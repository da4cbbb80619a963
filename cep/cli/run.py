"""``vigil run``: run the rules, queries and metrics of rule files over JSON-lines events, on
Spark (the default for a file or directory) or in the embedded engine (stdin, ``--engine
embedded``).

Matches go to ``--out`` (one JSON object a line; a directory of micro-batch files on Spark),
events that cannot be used to ``--dead-letter``, and a summary to stderr. Exit codes: 0 ok,
1 errors in the rule files, 2 a usage problem (missing file, bad option).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import pandas as pd

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
from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    StreamSchema,
    dead_letter,
    parse_json_line,
    stream_of,
)
from cep.events.limits import line_text
from query_lang.errors import VigilError
from query_lang.loader import check_program

__all__ = ["EventInput", "configure_parser", "parse_event_specs", "run"]

CHUNK_ROWS = 20_000
"""Events handed to the engine per batch: large enough to vectorise, small enough to stream."""

PROGRESS_INTERVAL_S = 0.25

REDIS_SCHEMES = ("redis://", "rediss://")

DEFAULT_STATE_OUTBOX = os.path.join(".vigil", "outbox.sqlite")
"""The alert outbox of a run that writes no directory (``--out -`` or a file)."""


@dataclass(frozen=True)
class EventInput:
    """One ``--events`` argument: a file, a directory of files, or stdin, maybe bound to a
    stream."""

    path: str
    stream: str | None = None

    @property
    def is_stdin(self) -> bool:
        return self.path == "-"

    @property
    def is_redis(self) -> bool:
        """A Redis stream: ``redis://HOST:PORT[/DB]/KEY`` (``rediss://`` with TLS)."""
        return self.path.startswith(REDIS_SCHEMES)

    def files(self) -> list[str]:
        """The files to read, in order (a directory's regular files by name, skipping names
        that start with ``.`` or ``_``, which Spark's file source also treats as hidden)."""
        if self.is_stdin:
            return ["-"]
        if os.path.isdir(self.path):
            names = sorted(
                n
                for n in os.listdir(self.path)
                if not n.startswith((".", "_")) and os.path.isfile(os.path.join(self.path, n))
            )
            return [os.path.join(self.path, n) for n in names]
        return [self.path]


def configure_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` sub-command to ``vigil``'s argument parser."""
    parser = subparsers.add_parser(
        "run",
        help="run rules over JSON-lines events",
        description="Run the rules of rule files over events (JSON lines) and print matches.",
    )
    parser.add_argument("files", nargs="+", help="rule files, directories or glob patterns")
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
        "file's appended lines (surviving rotation, as tail -F), a Redis stream's new "
        "entries; Ctrl-C or SIGTERM stops after the current batch, and a rerun with the same "
        "--checkpoint continues",
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
        "--checkpoint", metavar="DIR",
        help="Spark checkpoint (default OUT/_checkpoint); rerun with it to continue",
    )
    parser.add_argument(
        "--buckets", type=positive_int, default=None, metavar="N",
        help="--engine spark: hash buckets of the partition keys (default 16; fixed for the "
        "life of a checkpoint)",
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
    try:
        sink = _alert_sink(args, program, engine_name)
    except AlertError as err:
        print(f"vigil run: {err}\n  (alerts are delivered by default when a rule has "
              "`notify`; --no-alerts runs without them)", file=sys.stderr)
        return EXIT_ERRORS
    if engine_name == "spark":
        return _run_spark(args, program, engine, inputs, sink)
    try:
        out, close_out = _open_output(args.out)
        dead, close_dead = _open_output(args.dead_letter) if args.dead_letter else (None, False)
    except OSError as err:
        print(f"vigil run: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return EXIT_USAGE
    show_progress = bool(getattr(args, "progress", False)) or (
        sys.stderr.isatty() and not any(i.is_stdin for i in inputs)
    )
    progress = _Progress(inputs, enabled=show_progress)
    started = time.perf_counter()
    try:
        for chunk in _chunks(_merged_records(inputs, engine, progress), CHUNK_ROWS):
            _feed_chunk(engine, chunk)
            _write(out, _alert(sink, engine.drain()))
            _write(dead, engine.drain_dead_letters())
            progress.update()
        engine.close()
        _write(out, _alert(sink, engine.drain()))
        _write(dead, engine.drain_dead_letters())
    except OSError as err:
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
    if sink is not None:
        _deliver(sink, args.delivery_deadline)
    return EXIT_OK


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


def _run_spark(args: argparse.Namespace, program: Any, engine: Engine, inputs, sink: Any) -> int:
    """``--engine spark``: rules, queries and metrics run in one Structured Streaming query.

    ``--out DIR`` keeps the micro-batch files (and the checkpoint, by default); ``--out -``
    prints the matches as each micro-batch commits, with the files in a scratch directory.
    """
    if len(inputs) != 1 or inputs[0].is_stdin:
        print("vigil run: --engine spark reads one --events file or directory", file=sys.stderr)
        return EXIT_USAGE
    to_stdout = args.out in (None, "-")
    scratch = tempfile.mkdtemp(prefix="vigil-run-") if to_stdout else None
    out_dir = scratch if to_stdout else args.out
    os.makedirs(out_dir, exist_ok=True)
    dead_dir = args.dead_letter or (None if to_stdout else os.path.join(out_dir, "_dead_letters"))
    log_path = os.path.join(out_dir, "_spark.log")
    counts: Counter[str] = Counter()

    def on_matches(batch_id: int, matches: list[dict[str, Any]]) -> None:
        _alert(sink, matches)
        counts.update(str(m.get("name")) for m in matches)
        if to_stdout:
            _write(sys.stdout, matches)
            sys.stdout.flush()

    from spark_udf.run import run_spark

    names = [*engine.rules, *engine.standing]
    print(f"vigil run: Spark ({args.master}) runs {len(names)} rule(s), query(ies) and "
          f"metric(s); its log is {log_path}", file=sys.stderr)
    failed = True
    try:
        summary = run_spark(
            program.modules, inputs[0].path, out=out_dir, dead_letter=dead_dir,
            master=args.master, checkpoint=args.checkpoint, on_matches=on_matches,
            stream=inputs[0].stream, spark=_spark_session(args.master, log_path),
            on_progress=_spark_progress,
            **({} if args.buckets is None else {"buckets": args.buckets}),
        )
        failed = False
    finally:
        if scratch is not None and not failed:
            shutil.rmtree(scratch, ignore_errors=True)
        elif scratch is not None:
            print(f"vigil run: the Spark files are kept in {scratch}", file=sys.stderr)
    lines = [
        f"vigil run: spark: {summary.input_rows:,} event(s) in {summary.batches} "
        f"micro-batch(es) ({summary.events_per_second:,.0f}/s), {summary.matches} match(es), "
        f"{summary.dead_letters} dead letter(s) ({summary.late} late)",
        *(f"  {name}: {count} match(es)" for name, count in sorted(counts.items())),
    ]
    if summary.dead_letters and dead_dir is None:
        lines.append("  (use --dead-letter DIR to keep the late and bad events)")
    print("\n".join(lines), file=sys.stderr)
    if sink is not None:
        _deliver(sink, args.delivery_deadline)
    if summary.stopped_by_signal:
        print("vigil run: stopped; rerun with the same --checkpoint to continue",
              file=sys.stderr)
        return 130
    return EXIT_OK


def _spark_progress(progress: dict[str, Any]) -> None:
    """One line per micro-batch: the live view of a Spark run."""
    rows = progress.get("eventRows", progress.get("numInputRows", 0))
    took = (progress.get("durationMs") or {}).get("triggerExecution", 0) / 1000
    batch = progress.get("batchId")
    if progress.get("endOfInput"):
        print(f"  micro-batch {batch}: end of input, the watermark passes every event "
              f"({took:.1f}s)", file=sys.stderr)
    elif rows:
        rate = rows / took if took else 0.0
        print(f"  micro-batch {batch}: {rows:,} event(s) in {took:.1f}s "
              f"({rate:,.0f} events/s)", file=sys.stderr)
    else:
        print(f"  micro-batch {batch}: timers fired, windows closed ({took:.1f}s)",
              file=sys.stderr)


def _spark_session(master: str, log_path: str) -> Any:
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
        return session(master)
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
    notifying = sorted(
        name
        for name, decl in {**program.rules, **program.queries, **program.metrics}.items()
        if decl.notify
    )
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


def _named(names: Sequence[str]) -> str:
    """``a, b`` or ``a, b, c and 9 more``: names in a message that stays one line."""
    if not names:
        return "none notify"
    shown = ", ".join(names[:3])
    return shown if len(names) <= 3 else f"{shown} and {len(names) - 3} more"


def _alert(sink: Any, matches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put matches that notify someone in the outbox (durably) before they are written."""
    if sink is not None:
        for match in matches:
            sink.submit(match)
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


# ---------------------------------------------------------------------- reading


@dataclass(slots=True)
class _Record:
    """One input line: parsed when it is a JSON object, else kept as a dead letter."""

    order: int
    source: str
    line: int
    position: int
    text: str
    event: dict[str, Any] | None
    letter: dict[str, Any] | None


def _merged_records(
    inputs: Sequence[EventInput], engine: Engine, progress: _Progress
) -> Iterator[_Record]:
    """The lines of every input, interleaved by event time when there are several inputs
    (each input is assumed roughly time-ordered; the engine's reorder buffer does the rest)."""
    schemas = {name: StreamSchema.from_decl(decl) for name, decl in engine.streams.items()}
    interleave = len(inputs) > 1
    readers = [_read(inp, schemas, progress, interleave) for inp in inputs]
    if not interleave:
        yield from readers[0]
        return
    yield from heapq.merge(*readers, key=lambda r: r.order)


def _read(
    inp: EventInput, schemas: dict[str, StreamSchema], progress: _Progress, interleave: bool
) -> Iterator[_Record]:
    position = 0
    last_order = -(2**63)
    for path in inp.files():
        # Bytes, decoded line by line: a line that is not UTF-8 is a dead letter of its own
        # (line_text), as in the Spark source, instead of text with replacement characters.
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # a test's StringIO has no buffer
        handle = stdin if path == "-" else open(path, "rb")
        source = "-" if path == "-" else path
        try:
            for number, data in enumerate(handle, start=1):
                progress.advance(len(data))
                if not number & 0xFFF:
                    progress.update()  # a cheap clock check; redraws a few times a second
                # Stripped as the Spark source strips a line (JSON ignores the white space).
                text = line_text(data) if isinstance(data, bytes) else data.strip()
                if not text:
                    continue
                event = letter = None
                try:
                    event = parse_json_line(text)
                    if inp.stream is not None:
                        event[STREAM_FIELD] = inp.stream
                    if interleave:
                        last_order = _order_of(event, schemas, last_order)
                except BadEventError as exc:
                    letter = dead_letter(
                        exc.reason, exc.detail, input=source, line=number, raw=text
                    )
                yield _Record(last_order, source, number, position, text, event, letter)
                position += 1
        finally:
            if handle is not stdin:
                handle.close()


def _order_of(event: dict[str, Any], schemas: dict[str, StreamSchema], last: int) -> int:
    """Event time used to interleave several inputs; a line without one keeps its place."""
    try:
        schema = stream_of(event, None, schemas)
        value = event.get(schema.time_field) if schema.time_field else None
        # Bounded as the engine bounds it: a time too far ahead must not hold back its input.
        return last if value is None else schema.event_time(value)
    except BadEventError:
        return last


def _chunks(records: Iterator[_Record], size: int) -> Iterator[list[_Record]]:
    chunk: list[_Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _feed_chunk(engine: Engine, chunk: list[_Record]) -> None:
    """Hand a chunk to the engine: runs of parsed events as one batch, broken lines as dead
    letters in their place."""
    run: list[_Record] = []
    for record in chunk:
        if record.event is not None:
            run.append(record)
            continue
        _feed_run(engine, run)
        run = []
        engine.reject(record.letter)
    _feed_run(engine, run)


def _feed_run(engine: Engine, run: list[_Record]) -> None:
    if not run:
        return
    frame = pd.DataFrame.from_records([r.event for r in run])
    engine.feed_batch(
        frame,
        source=[r.source for r in run],
        lines=[r.line for r in run],
        positions=[r.position for r in run],
        raw=[r.text for r in run],
    )


# ---------------------------------------------------------------------- writing


def _open_output(path: str | None) -> tuple[IO[str], bool]:
    if path is None or path == "-":
        return sys.stdout, False
    return open(path, "w", encoding="utf-8"), True


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
        + (f", {stats.unkeyed} without a rule's key" if stats.unkeyed else ""),
    ]
    for name, count in stats.matches.items():
        dropped = stats.dropped_partials.get(name, 0)
        extra = f" ({dropped} partial match(es) dropped by --max-partials)" if dropped else ""
        lines.append(f"  {name}: {count} match(es){extra}")
    if (stats.late or stats.bad or stats.unkeyed) and dead_letter_path is None:
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
