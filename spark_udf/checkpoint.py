"""What a run keeps beside Spark's own files in its checkpoint directory, and what it reads of
Spark's: the layout of the state (bucket count, keyed processors, input) and the input files
read so far, checked before a rerun continues, and the last committed micro-batch."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_udf.edits import processor_identity
from spark_udf.errors import CheckpointError, SinkError
from spark_udf.routing import resolve_processor

__all__ = [
    "RECORD_FILE",
    "Committed",
    "RunRecord",
    "StateLayout",
    "batch_offsets",
    "bucket_error",
    "check_resumable",
    "files_read",
    "last_committed",
    "read_record",
    "same_processors",
    "write_record",
]

RECORD_FILE = "vigil.json"
"""The file :func:`write_record` keeps in the checkpoint directory (Spark ignores it)."""
_RECORD_FORMAT = 1
_NEW_CHECKPOINT = (
    "start a new checkpoint directory (--checkpoint NEW_DIR, or a new --out whose _checkpoint "
    "is new), or rerun with what this one was written with"
)


@dataclass(frozen=True)
class StateLayout:
    """What must stay the same for a checkpoint's state to be read by a later run.

    Attributes
    ----------
    buckets:
        Hash buckets per processor: a key's bucket depends on it.
    processors:
        Per keyed processor, in operator order: its rule or metric names, key fields per
        stream, each name's fingerprint of its definition (the one its state bytes carry), its
        ``identity`` and the ``slot`` of the groups it owns (``slot * buckets`` to
        ``(slot + 1) * buckets - 1``; see :mod:`spark_udf.edits`).
    input_kind:
        ``jsonl`` or ``redis``: the shape of the source offsets Spark stored.
    sources:
        How many reads of the input the query plan makes (Spark refuses another count);
        ``None`` until the plan is built, and then not compared.
    partitions:
        Spark's shuffle partitions, the state store's partitions, chosen when the checkpoint
        was created (Spark itself keeps them for a checkpoint); recorded, not compared.
    forms, retired, next_slot:
        What :class:`spark_udf.edits.ProgramEdit` decided: the program's forms with their
        versions, the forms earlier programs had, the first slot never used.
    legacy:
        Read from a record written before forms and slots were kept (processors then sat at
        their index, every form at version 1).
    """

    buckets: int
    processors: tuple[dict[str, Any], ...]
    input_kind: str
    sources: int | None = None
    partitions: int | None = None
    forms: Mapping[str, Any] = field(default_factory=dict)
    retired: Mapping[str, Any] = field(default_factory=dict)
    next_slot: int | None = None
    legacy: bool = False

    @classmethod
    def of(
        cls, specs: Sequence[Any], buckets: int, input_kind: str, *,
        partitions: int | None = None, edit: Any = None,
    ) -> StateLayout:
        """The layout of a run of ``specs`` (:class:`spark_udf.rules.ProcessorSpec`) placed
        as ``edit`` (:class:`spark_udf.edits.ProgramEdit`) says (default: at their index),
        its ``sources`` not known yet."""
        slots = edit.slots if edit is not None else tuple(range(len(specs)))
        processors = tuple(
            {**_processor_layout(spec), "identity": processor_identity(spec), "slot": slot}
            for spec, slot in zip(specs, slots, strict=True)
        )
        if edit is None:
            return cls(buckets, processors, input_kind, partitions=partitions,
                       next_slot=len(specs))
        return cls(buckets, processors, input_kind, partitions=partitions,
                   forms=edit.forms, retired=edit.retired, next_slot=edit.next_slot)

    @property
    def slots(self) -> tuple[int, ...]:
        """The slot of each processor's groups."""
        return tuple(p.get("slot", i) for i, p in enumerate(self.processors))

    def to_json(self) -> dict[str, Any]:
        return {"buckets": self.buckets, "processors": list(self.processors),
                "input": self.input_kind, "sources": self.sources,
                "shuffle_partitions": self.partitions, "forms": dict(self.forms),
                "retired": dict(self.retired), "next_slot": self.next_slot}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> StateLayout:
        for processor in value["processors"]:
            names, key, definitions = (processor[k] for k in ("names", "key", "definitions"))
            if not (isinstance(names, list) and isinstance(key, dict)
                    and isinstance(definitions, dict)
                    and isinstance(processor.get("slot", 0), int)):
                raise TypeError(f"a processor's layout is malformed: {processor!r}")
        sources, partitions = value.get("sources"), value.get("shuffle_partitions")
        legacy = "forms" not in value
        forms = value.get("forms") or {}
        if legacy:  # fingerprints at version 1 were all a record kept of its forms
            forms = {name: {"kind": None, "identity": None, "version": 1, "fingerprint": f}
                     for p in value["processors"] for name, f in p["definitions"].items()}
        next_slot = value.get("next_slot")
        return cls(int(value["buckets"]), tuple(value["processors"]), str(value["input"]),
                   None if sources is None else int(sources),
                   None if partitions is None else int(partitions),
                   forms=dict(forms), retired=dict(value.get("retired") or {}),
                   next_slot=None if next_slot is None else int(next_slot), legacy=legacy)

    def changes_from(self, old: StateLayout) -> list[str]:
        """How this layout differs from ``old`` (the checkpoint's) in what a rerun cannot
        continue, in words (edits of the program's rules and metrics can be continued)."""
        changes = []
        if old.buckets != self.buckets:
            changes.append(
                f"its state is hashed into {old.buckets} buckets per processor, this run uses "
                f"{self.buckets} (rerun with --buckets {old.buckets})"
            )
        if old.input_kind != self.input_kind:
            changes.append(f"it read a {old.input_kind} input, this run reads {self.input_kind}")
        if None not in (old.sources, self.sources) and old.sources != self.sources and not changes:
            changes.append(
                f"Spark's plan read the input {old.sources} time(s), this program's reads it "
                f"{self.sources} time(s) (search queries, or streams only queries read, came or "
                "went)"
            )
        return changes


def same_processors(layout: StateLayout, old: StateLayout) -> str:
    """For a run given processor specs rather than a program (which are not versioned, so
    they continue only a checkpoint of the same specs): how its processors differ from the
    checkpoint's, in words, or ``""``."""
    def described(processors: Sequence[dict[str, Any]]) -> list[list[Any]]:
        return [[p["names"], p["key"], p["definitions"]] for p in processors]

    if described(layout.processors) == described(old.processors):
        return ""

    def names(processors: Sequence[dict[str, Any]]) -> str:
        return " ".join(f"[{', '.join(p['names'])}]" for p in processors) or "none"

    return (f"its keyed state belongs to other processors ({names(old.processors)}; these "
            f"specs run {names(layout.processors)}): give the program itself to carry its "
            "state across edits")


def _processor_layout(spec: Any) -> dict[str, Any]:
    processor = resolve_processor(spec.processor)
    rules = getattr(processor, "rules", None)
    metric = getattr(processor, "metric", None)
    if rules:
        definitions = {rule.name: getattr(rule, "fingerprint", b"").hex() for rule in rules}
    elif metric is not None and hasattr(metric, "fingerprint"):
        definitions = {name: metric.fingerprint.hex() for name in spec.rules}
    else:
        kind = type(processor)
        definitions = {name: f"{kind.__module__}.{kind.__qualname__}" for name in spec.rules}
    return {
        "names": list(spec.rules),
        "key": {stream: list(fields) for stream, fields in sorted(spec.key_cols.items())},
        "definitions": definitions,
    }


@dataclass(frozen=True)
class Committed:
    """The last micro-batch a checkpoint committed.

    Attributes
    ----------
    batch_id:
        Its id.
    offsets:
        Each source's end offset after it (parsed JSON; ``None`` for a source without one).
    """

    batch_id: int
    offsets: tuple[Any, ...]

    @property
    def lines(self) -> int | None:
        """Input lines read (a JSON-lines source's offset), or ``None``."""
        lines = [o["line"] for o in self.offsets if isinstance(o, dict) and "line" in o]
        return max(lines) if lines else None

    @property
    def read_end_mark(self) -> bool:
        """Whether a source read the end-of-input mark into this checkpoint (earlier versions
        ended a finite run so): nothing after it can be read on time."""
        return any(isinstance(o, dict) and o.get("end") for o in self.offsets)


def last_committed(checkpoint: str) -> Committed | None:
    """The last micro-batch committed to ``checkpoint`` (Spark's ``commits`` and ``offsets``
    logs), or ``None`` when there is none."""
    commits = os.path.join(checkpoint, "commits")
    if not os.path.isdir(commits):
        return None
    ids = [int(name) for name in os.listdir(commits) if name.isdigit()]
    if not ids:
        return None
    batch = max(ids)
    return Committed(batch, batch_offsets(checkpoint, batch) or ())


def batch_offsets(checkpoint: str, batch_id: int) -> tuple[Any, ...] | None:
    """Each source's end offset of micro-batch ``batch_id`` as Spark logged it before running
    the batch (parsed JSON; ``None`` for a source without one), or ``None`` when the batch's
    offsets are not there."""
    try:
        with open(os.path.join(checkpoint, "offsets", str(batch_id)), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    offsets: list[Any] = []
    for line in lines[2:]:  # the version, the batch's metadata, then one line per source
        try:
            offsets.append(json.loads(line))
        except ValueError:
            offsets.append(None)
    return tuple(offsets)


@dataclass(frozen=True)
class RunRecord:
    """What :func:`write_record` keeps: the layout, the input files read so far (name and lines
    read, in reading order; JSON-lines inputs), and the micro-batch whose state the last
    end-of-input flush ran on."""

    layout: StateLayout
    files: tuple[tuple[str, int], ...] = ()
    flushed_batch: int | None = None


def read_record(checkpoint: str) -> RunRecord | None:
    """The record in ``checkpoint``, or ``None`` (a new checkpoint, or one written before
    checkpoints kept one)."""
    path = os.path.join(checkpoint, RECORD_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
        if value.get("format") != _RECORD_FORMAT:
            raise CheckpointError(
                f"{path} has format {value.get('format')!r}, this version of Vigil reads "
                f"{_RECORD_FORMAT}: {_NEW_CHECKPOINT}"
            )
        return RunRecord(
            StateLayout.from_json(value["layout"]),
            tuple((str(name), int(lines)) for name, lines in value.get("files", ())),
            value.get("flushed_batch"),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}; {_NEW_CHECKPOINT}") from exc


def write_record(checkpoint: str, record: RunRecord) -> None:
    """Write ``record`` into ``checkpoint`` atomically."""
    value = {
        "format": _RECORD_FORMAT,
        "layout": record.layout.to_json(),
        "files": [list(f) for f in record.files],
        "flushed_batch": record.flushed_batch,
    }
    try:
        os.makedirs(checkpoint, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{RECORD_FILE}.", dir=checkpoint)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=1)
        os.replace(tmp, os.path.join(checkpoint, RECORD_FILE))
    except OSError as exc:
        raise SinkError(f"cannot write {RECORD_FILE} in checkpoint {checkpoint}: {exc}") from exc


def check_resumable(
    checkpoint: str,
    layout: StateLayout,
    committed: Committed | None,
    record: RunRecord | None,
    files: Sequence[tuple[str, int]] | None = None,
) -> None:
    """Raise :class:`CheckpointError` when a run of ``layout`` over an input whose files now
    hold ``files`` (name, complete lines; ``None`` for a Redis input) cannot continue
    ``checkpoint``, naming what changed and what to do. A checkpoint without a committed
    micro-batch holds nothing to continue."""
    if committed is None:
        return
    where = f"checkpoint {checkpoint}"
    if committed.read_end_mark:
        raise CheckpointError(
            f"{where} read the end-of-input mark of an earlier version of Vigil: it is "
            "finished, and events added to its input would all be late; start a new "
            "checkpoint directory"
        )
    changes = layout.changes_from(record.layout) if record is not None else []
    if record is not None and not layout.forms and layout.processors:
        changes += [c for c in [same_processors(layout, record.layout)] if c]
    if changes:
        raise CheckpointError(f"{where} cannot continue this run: {'; '.join(changes)}. "
                              f"{_NEW_CHECKPOINT[0].upper()}{_NEW_CHECKPOINT[1:]}")
    if files is None:
        return
    read = committed.lines or 0
    total = sum(lines for _, lines in files)
    problem = None
    if total < read:
        problem = (f"the input holds {total} complete lines, fewer than the {read} this "
                   "checkpoint has read: it was truncated, replaced or rotated")
    elif record is not None:
        problem = _moved_lines(record.files, files)
    if problem:
        raise CheckpointError(
            f"{where} cannot continue over this input: {problem}. A checkpoint reads its input "
            "as one sequence of lines (the files in name order): add new files that sort after "
            "the last one read, or append to it; else start a new checkpoint directory"
        )


def _moved_lines(recorded: Sequence[tuple[str, int]], files: Sequence[tuple[str, int]]) -> str:
    for index, (name, lines) in enumerate(recorded):
        if index >= len(files) or files[index][0] != name:
            now = files[index][0] if index < len(files) else "nothing"
            return f"{now} now stands where {name}, read by the checkpoint, stood"
        last = index == len(recorded) - 1
        if files[index][1] < lines:
            return f"{name} has {files[index][1]} complete lines, the checkpoint read {lines}"
        if not last and files[index][1] != lines:
            return (f"{name} grew from {lines} to {files[index][1]} lines after later files "
                    "were read, which moves every later line")
    return ""


def files_read(files: Sequence[tuple[str, int]], lines: int) -> tuple[tuple[str, int], ...]:
    """The leading ``files`` (name, complete lines) that hold the first ``lines`` lines, the
    last one with the lines read of it.

    Examples
    --------
    >>> files_read([("a.jsonl", 3), ("b.jsonl", 5), ("c.jsonl", 2)], 6)
    (('a.jsonl', 3), ('b.jsonl', 3))
    """
    out = []
    for name, count in files:
        if lines <= 0:
            break
        out.append((name, min(count, lines)))
        lines -= count
    return tuple(out)


_BUCKETS_MESSAGE = re.compile(r"the checkpoint's state was hashed into \d+ buckets[^\n]*")


def bucket_error(error: Any) -> CheckpointError | None:
    """The :class:`CheckpointError` for a query that failed on a bucket count the checkpoint
    does not share (raised in a Python worker, see :mod:`spark_udf.bucket_state`), or
    ``None`` for any other failure."""
    found = _BUCKETS_MESSAGE.search(str(error))
    return CheckpointError(found.group(0)) if found else None
