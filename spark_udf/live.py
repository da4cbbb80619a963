"""A program that changes while a Spark query runs: each micro-batch runs the program version
pinned to it, without restarting the streaming query.

The driver appends each new program (a registry version) to the checkpoint's program log
(``<checkpoint>/vigil_programs/``: one file per entry, never rewritten, and ``current`` naming
the newest). The JSON-lines source writes the newest entry's number into the offsets it gives
Spark (``{"line": N, "program": E}``), and Spark writes those offsets to its offset log before
it runs the micro-batch: that pins the entry to the batch, also for a batch replayed after a
failure. Every task of the batch — the source routing rows, the stateful operator, the query
pass — reads its batch id (Spark's ``streaming.sql.batchId`` task property), the batch's
offsets, and runs that entry's program, compiled once per worker. Where each processor's state
lives across entries is :mod:`spark_udf.edits`' placement, as across reruns.

What a new entry cannot change in a running query (Spark fixed it when the query started):
the watermark's delay (the largest lateness), and the input. The driver says so and the entry
runs with the query's delay.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark import TaskContext

from cep.engine import load_declarations
from cep.engine.checkpoint import RestoreReport
from percolator.collector import keep_built
from query_lang import ast
from query_lang.printer import print_declaration
from spark_udf.checkpoint import StateLayout, batch_offsets
from spark_udf.edits import edit_program
from spark_udf.errors import CheckpointError, OperatorConfigError
from spark_udf.routing import RoutePlan, resolve_processor
from spark_udf.rules import processor_specs, route_specs

__all__ = [
    "BATCH_PROPERTY",
    "PROGRAM_LOG",
    "Compiled",
    "Entry",
    "LiveChanges",
    "LiveProgram",
    "ProgramLog",
    "printed_program",
]

PROGRAM_LOG = "vigil_programs"
"""The program log's directory inside the checkpoint."""
BATCH_PROPERTY = "streaming.sql.batchId"
"""The task property Spark sets to the micro-batch id for every job of a micro-batch."""
_CURRENT = "current"


@dataclass(frozen=True)
class Entry:
    """One program of the log.

    Attributes
    ----------
    number:
        Its place in the log (0, 1, ...).
    registry_version:
        The registry version it is (``None``: a program not from a registry).
    text:
        The program's declarations, printed.
    versions:
        The version each rule and metric runs with.
    slots:
        The slot of each keyed processor, in the order the program compiles them.
    """

    number: int
    registry_version: int | None
    text: str
    versions: Mapping[str, int]
    slots: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "registry_version": self.registry_version,
                "text": self.text, "versions": dict(self.versions), "slots": list(self.slots)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Entry:
        return cls(int(value["number"]), value.get("registry_version"), str(value["text"]),
                   {str(k): int(v) for k, v in value["versions"].items()},
                   tuple(int(s) for s in value["slots"]))


class ProgramLog:
    """The checkpoint's program log (see the module's text)."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.path = os.path.join(checkpoint, PROGRAM_LOG)

    def current(self) -> int | None:
        """The newest entry's number, or ``None`` when the log is empty."""
        try:
            with open(os.path.join(self.path, _CURRENT), encoding="utf-8") as handle:
                return int(handle.read().strip())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read the program log {self.path}: {exc}") from exc

    def entry(self, number: int) -> Entry:
        """Entry ``number``.

        Raises
        ------
        CheckpointError
            When it is missing or unreadable.
        """
        path = os.path.join(self.path, f"{number:08d}.json")
        try:
            with open(path, encoding="utf-8") as handle:
                return Entry.from_json(json.load(handle))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read program {path}: {exc}") from exc

    def append(self, registry_version: int | None, text: str, versions: Mapping[str, int],
               slots: tuple[int, ...]) -> Entry:
        """Write a new entry (then make it the newest) and return it."""
        current = self.current()
        entry = Entry(0 if current is None else current + 1, registry_version, text,
                      dict(versions), tuple(slots))
        os.makedirs(self.path, exist_ok=True)
        _write_atomically(os.path.join(self.path, f"{entry.number:08d}.json"),
                          json.dumps(entry.to_json()))
        _write_atomically(os.path.join(self.path, _CURRENT), str(entry.number))
        return entry

    def batch_entry(self, batch_id: int) -> int:
        """The entry pinned to micro-batch ``batch_id`` (the largest ``program`` over the
        sources' offsets Spark logged for it).

        Raises
        ------
        CheckpointError
            When the batch's offsets are missing or pin no entry.
        """
        offsets = batch_offsets(self.checkpoint, batch_id)
        if offsets is None:
            raise CheckpointError(f"cannot read the offsets of micro-batch {batch_id} in "
                                  f"{self.checkpoint}")
        pinned = [o["program"] for o in offsets
                  if isinstance(o, dict) and isinstance(o.get("program"), int)]
        if not pinned:
            raise CheckpointError(f"micro-batch {batch_id}'s offsets pin no program")
        return max(pinned)


def _write_atomically(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class Compiled:
    """An entry compiled as a worker runs it.

    Attributes
    ----------
    entry:
        The entry.
    plan:
        Its keyed processors' route plan (``None`` when it has none).
    owners:
        Per processor of the plan, the processor and its event layout.
    queries, streams:
        Its query declarations and stream declarations (the query pass's).
    keyed_streams:
        The streams its keyed processors read (and check: the query pass leaves their bad
        events to them).
    """

    entry: Entry
    plan: RoutePlan | None
    owners: tuple[tuple[Any, Any], ...]
    queries: tuple[ast.QueryDecl, ...]
    streams: Mapping[str, ast.StreamDecl]
    keyed_streams: frozenset[str] = frozenset()


_COMPILED: dict[tuple[str, int], Compiled] = {}
"""Entries compiled in this Python process, by checkpoint and number (a worker serves many
micro-batches of one query); the newest few are kept."""
_BATCHES: dict[tuple[str, int], int] = {}
"""The entry of each micro-batch this process served (the last ones are kept)."""
_KEEP_COMPILED = 3
_KEEP_BATCHES = 1024


def _remember(cache: dict[Any, Any], key: Any, value: Any, keep: int) -> Any:
    """Store ``value`` under ``key``, dropping the oldest entries beyond ``keep``."""
    cache[key] = value
    while len(cache) > keep:
        del cache[next(iter(cache))]
    return value


@dataclass(frozen=True)
class LiveProgram:
    """What the tasks of a live query share (pickled into the plan): where the program log
    is and how the query routes.

    Attributes
    ----------
    checkpoint:
        The query's checkpoint directory (readable by every executor, as Spark's own files).
    columns:
        The routed source's columns (name -> Spark type), as :func:`spark_udf.rules
        .route_specs` takes them.
    json_col, stream, buckets, lateness_ms:
        As :func:`spark_udf.run.run_spark` compiles the program.
    """

    checkpoint: str
    columns: Mapping[str, Any]
    json_col: str
    stream: str | None
    buckets: int
    lateness_ms: int | None

    def log(self) -> ProgramLog:
        return ProgramLog(self.checkpoint)

    def for_task(self) -> Compiled:
        """The program of the micro-batch the calling task belongs to.

        Raises
        ------
        OperatorConfigError
            When called outside a micro-batch's task.
        """
        context = TaskContext.get()
        batch = None if context is None else context.getLocalProperty(BATCH_PROPERTY)
        if batch is None:
            raise OperatorConfigError("a live program is read inside a micro-batch's tasks")
        return self.for_batch(int(batch))

    def for_batch(self, batch_id: int) -> Compiled:
        """The program pinned to micro-batch ``batch_id``, compiled."""
        key = (self.checkpoint, batch_id)
        number = _BATCHES.get(key)
        if number is None:
            number = _remember(_BATCHES, key, self.log().batch_entry(batch_id), _KEEP_BATCHES)
        return self.compiled(number)

    def compiled(self, number: int) -> Compiled:
        """Entry ``number`` compiled (once per process)."""
        key = (self.checkpoint, number)
        found = _COMPILED.get(key)
        if found is None:
            found = _remember(_COMPILED, key, self._compile(self.log().entry(number)),
                              _KEEP_COMPILED)
            keep_built()  # kept for the query's next micro-batches (percolator.collector)
        return found

    def _compile(self, entry: Entry) -> Compiled:
        declarations = load_declarations(entry.text)
        queries = tuple(d for d in declarations if isinstance(d, ast.QueryDecl))
        streams = {d.name: d for d in declarations if isinstance(d, ast.StreamDecl)}
        plan, keyed = None, frozenset()
        if any(isinstance(d, ast.RuleDecl | ast.MetricDecl) for d in declarations):
            specs, _ = processor_specs(entry.text, lateness_ms=self.lateness_ms,
                                       versions=entry.versions)
            plan = route_specs(self.columns, specs, json_col=self.json_col, stream=self.stream,
                               buckets=self.buckets, slots=entry.slots)
            keyed = frozenset(name for spec in specs for name in spec.key_cols)
        owners = () if plan is None else tuple(
            (resolve_processor(source), layout) for _, source, layout in plan.entries
        )
        return Compiled(entry, plan, owners, queries, streams, keyed)


def printed_program(program: Any) -> str:
    """A program (rule file path, DSL text or parsed modules) as the text of its declarations,
    includes resolved: what a log entry keeps."""
    return "\n\n".join(print_declaration(d) for d in load_declarations(program)) + "\n"


@dataclass
class _Pending:
    entry: Entry
    report: RestoreReport
    since: float


class LiveChanges:
    """The driver's side of a live query: each new program is compiled against the layout the
    checkpoint holds (:mod:`spark_udf.edits`), appended to the log and recorded; once a
    committed micro-batch ran it, ``on_change`` hears that it is in effect.

    ``on_change`` gets dicts: ``{"registryVersion", "entry", "appended": True, "report",
    "notes"}`` when a program is appended (``notes``: what it cannot change in the running
    query), and ``{"registryVersion", "entry", "inEffect": True, "batchId", "afterMs"}`` when
    a committed micro-batch first ran it.
    """

    def __init__(
        self,
        log: ProgramLog,
        live: LiveProgram,
        layout: Any,
        lateness_ms: int,
        on_change: Any = None,
    ) -> None:
        self.log = log
        self.live = live
        self.layout = layout
        self.lateness_ms = lateness_ms
        self.on_change = on_change
        self._pending: list[_Pending] = []

    def start(self, registry_version: int | None, program: Any, edit: Any) -> Entry:
        """Append the program the query starts with."""
        return self.log.append(registry_version, printed_program(program),
                               _versions(edit), tuple(self.layout.slots))

    def take(self, registry_version: int | None, program: Any) -> Entry:
        """Compile ``program`` against the checkpoint's layout, append it, and return its
        entry; the layout to record is then :attr:`layout`.

        Raises
        ------
        query_lang.errors.VigilError, OperatorConfigError
            When it does not compile (nothing is appended).
        """
        edit = edit_program(program, lateness_ms=self.live.lateness_ms, previous=self.layout)
        layout = StateLayout.of(list(edit.specs), self.layout.buckets, self.layout.input_kind,
                                partitions=self.layout.partitions, edit=edit)
        self.layout = replace(layout, sources=self.layout.sources)
        entry = self.log.append(registry_version, printed_program(program), _versions(edit),
                                tuple(layout.slots))
        notes = []
        delay = max((spec.lateness_ms for spec in edit.specs), default=self.lateness_ms)
        if delay != self.lateness_ms:
            notes.append(f"the watermark's delay stays {self.lateness_ms} ms (this program's "
                         f"lateness asks for {delay} ms) until the run is restarted")
        self._pending.append(_Pending(entry, edit.report, time.monotonic()))
        if self.on_change is not None:
            self.on_change({"registryVersion": registry_version, "entry": entry.number,
                            "appended": True, "report": edit.report, "notes": notes})
        return entry

    def committed(self, batch_id: int) -> None:
        """Micro-batch ``batch_id`` committed: report the programs it put in effect."""
        if not self._pending:
            return
        number = self.log.batch_entry(batch_id)
        while self._pending and self._pending[0].entry.number <= number:
            done = self._pending.pop(0)
            if self.on_change is not None:
                self.on_change({
                    "registryVersion": done.entry.registry_version, "entry": done.entry.number,
                    "inEffect": True, "batchId": batch_id, "report": done.report,
                    "afterMs": (time.monotonic() - done.since) * 1000,
                })

    def registry_version(self, batch_id: int) -> int | None:
        """The registry version micro-batch ``batch_id`` ran."""
        return self.log.entry(self.log.batch_entry(batch_id)).registry_version


def _versions(edit: Any) -> dict[str, int]:
    return {name: int(form["version"]) for name, form in edit.forms.items()
            if form.get("kind") != "query"}
