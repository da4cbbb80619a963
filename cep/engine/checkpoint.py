"""Restarts of the embedded engine: its whole state as versioned bytes (:func:`snapshot`, which
:meth:`Engine.snapshot <cep.engine.Engine.snapshot>` calls), restored into a new engine running
the same program or an edited one (:func:`restore`), and a directory that keeps the latest
checkpoint readable whenever the process dies (:class:`CheckpointStore`).

Format, version 1
-----------------
A :class:`sketches.codec.StateCodec` frame: the magic ``VGCK``, the format version (u8), a
flags byte (bit 0: the body is zlib data), the manifest's length and the body's length (u32,
little-endian), the body, and a trailer of the first 8 bytes of the SHA-256 of every byte
before it. Bytes of another format version are refused, naming both versions.

The body is the *manifest*, UTF-8 JSON, followed by a blob area the manifest points into with
``[offset, length]`` pairs. The blobs are the existing state codecs: each (rule, key) state is
:meth:`cep.nfa.state.RuleState.to_bytes` (a ``VGRS`` frame), each metric's operator
:meth:`cep.metrics.MetricOperator.to_bytes`. The manifest holds:

``engine``
    The options the writing engine was built with (``fast_strict``, ``max_partials``,
    ``lateness_ms``).
``forms``
    Per rule, query and metric name: its ``kind``, ``identity`` (:func:`form_identity`),
    ``version``, compiled ``fingerprint``, and for a rule its mask ``slot`` (``next_slot``
    beside), for a metric its operator's ``state`` blob. ``retired`` keeps the forms a restart
    dropped, so that a name coming back later continues its version numbering.
``groups``
    Per key definition of the rules (its signature), per key: the key, the key's watermark and
    largest times, ``[rule, dropped partials, offset, length]`` per rule holding state, and
    when some rule's ``unique`` reported values on the key, ``{rule: [[values, time], ...]}``.
``timers``
    The live timers in firing order: ``[due, index into groups, key]``.
``buffer``
    Events waiting for the watermark, in ``(ts, seq)`` order: ``[id, stream, ts, seq, fields,
    masks]``. Rows held as columns (:mod:`cep.engine.column_route`) are written here as events
    too, with masks ``null`` (each rule tests the row itself); a restored engine releases them
    from its reorder buffer, which reports what the column route does.
``watermark``, ``counters``, ``match_counts``, ``retired_drops``, ``suppressed``
    Event time per stream, the counters behind :class:`cep.engine.EngineStats` (and the
    event sequence number), matches per rule, partial matches dropped by retired states and
    matches held back by ``unique``.
``outputs``
    Matches and dead letters reported but not yet drained: a restored engine reports them again.
``tables``
    Per table: its ``identity`` (printed declaration) and ``state`` blob
    (:meth:`cep.tables.VersionedTable.to_bytes`). A table whose declaration changed starts
    empty; a checkpoint without the entry (written before tables) restores none.

Program edits
-------------
A rule, query or metric is identified by :func:`form_identity`: a hash of its canonical printed
declaration, the printed declarations of the streams it reads, the names and contents of the
lists it uses, and the engine options its compiler takes. On :func:`restore`, a name whose
identity is unchanged keeps its state and version (provided its compiled fingerprint is also
unchanged: another build of Vigil may compile the same text differently); a changed one starts
fresh with its version + 1 (so its matches get new ids); a new one starts fresh; a name the
program no longer has is dropped with its state. Rules keep their mask slots: a rule that
starts fresh does not see the events buffered before the restart, as a rule registered
mid-stream does not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cep.engine.program import compile_program_metric
from cep.errors import CheckpointError, EngineError
from cep.events.event import Event
from cep.metrics.operator import MetricOperator
from cep.nfa.processor import KeyState
from cep.nfa.state import RuleState, unshared
from query_lang import ast
from query_lang.printer import print_declaration
from query_lang.tree import walk
from sketches.codec import StateCodec

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointStore",
    "RestoreReport",
    "check_snapshot",
    "form_identity",
    "form_version",
    "restore",
    "snapshot",
]

FORMAT_VERSION = 1
"""The format version :func:`snapshot` writes and :func:`restore` reads."""

_CODEC = StateCodec(
    b"VGCK",
    FORMAT_VERSION,
    fields="I",
    length=True,
    checksum="sha256-8",
    compress_over=1 << 16,
    name="engine checkpoint",
    error=CheckpointError,
)
"""Magic, format version, flags, the manifest's length, the body's length; body; SHA-256/8."""

_FILE_CODEC = StateCodec(
    b"VGCF",
    1,
    fields="I",
    length=True,
    checksum="sha256-8",
    name="checkpoint file",
    error=CheckpointError,
)
"""A stored checkpoint: magic, version, the cursor's length, the body's length; the cursor
(JSON) then the engine's snapshot; SHA-256/8."""

_IDENTITY_SCHEME = "vigil-form/1"

_ENGINE_COUNTERS = (
    "seq", "events", "accepted", "late", "bad", "unkeyed", "unchanged", "uncorrected",
)
"""Counters of the engine (its ``_seq``, ``_events``, ...) a snapshot keeps."""
_STANDING_COUNTERS = ("documents", "verified", "unsearchable")
"""Counters of the standing queries a snapshot keeps."""
_COUNTERS = _ENGINE_COUNTERS + _STANDING_COUNTERS


# ---------------------------------------------------------------------------- identity


def form_identity(
    decl: ast.Declaration,
    streams: Mapping[str, ast.StreamDecl],
    lists: Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
) -> str:
    """What identifies the compiled form of a rule, query or metric across program edits.

    A SHA-256 (first 16 hex digits) of canonical JSON holding: the kind of declaration, its
    canonical printed text (:func:`query_lang.printer.print_declaration`: layout and comments
    do not count, every clause does), the printed declarations of the streams it reads, each
    list it uses (``x in LIST``) with its contents, and the engine ``options`` its compiler
    takes.

    Examples
    --------
    >>> from query_lang import parse
    >>> stream, rule = parse('''
    ... stream txn (card string, amount float, ts timestamp) time ts
    ... rule big from txn by card pattern b define b as amount > 100
    ... ''').declarations
    >>> same = parse("rule big from txn by card   # reformatted\\n"
    ...              "  pattern b\\n  define b as amount > 100").declarations[0]
    >>> form_identity(rule, {"txn": stream}, {}) == form_identity(same, {"txn": stream}, {})
    True
    >>> other = parse("rule big from txn by card pattern b define b as amount > 200")
    >>> form_identity(rule, {"txn": stream}, {}) == form_identity(
    ...     other.declarations[0], {"txn": stream}, {})
    False
    """
    used = sorted({n.list_name for n in walk(decl) if isinstance(n, ast.InList)})
    parts = [
        _IDENTITY_SCHEME,
        type(decl).__name__,
        print_declaration(decl),
        [print_declaration(streams[s]) for s in sorted(set(decl.streams)) if s in streams],
        [[name, _list_content(lists.get(name))] for name in used],
        dict(sorted((options or {}).items())),
    ]
    text = json.dumps(parts, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def form_version(
    kind: str, identity: str, old: Mapping[str, Any] | None, gone: Mapping[str, Any] | None
) -> tuple[str, int]:
    """What a restart does with a rule, query or metric of this ``kind`` and ``identity``
    (:func:`form_identity`): ``("kept" | "reset" | "added", version)``, from the form its name
    had in the checkpoint (``old``: ``kind``, ``identity``, ``version``) or, when the
    checkpoint's program no longer had it, the form it had when it was dropped (``gone``).
    Both engines decide so; the caller still resets a kept form whose compiled fingerprint
    changed (another build of Vigil).

    Examples
    --------
    >>> form_version("rule", "ab", {"kind": "rule", "identity": "ab", "version": 3}, None)
    ('kept', 3)
    >>> form_version("rule", "cd", {"kind": "rule", "identity": "ab", "version": 3}, None)
    ('reset', 4)
    >>> form_version("rule", "ab", None, {"kind": "rule", "identity": "ab", "version": 3})
    ('added', 3)
    >>> form_version("rule", "ab", None, None)
    ('added', 1)
    """
    if old is not None and old["kind"] == kind and old["identity"] == identity:
        return "kept", old.get("version") or 1
    if old is not None:
        return "reset", (old.get("version") or 0) + 1
    if gone is not None:
        version = (gone.get("version") or 0) + 1
        if gone["kind"] == kind and gone["identity"] == identity:
            version -= 1  # the very form it had: its matches keep their ids
        return "added", version
    return "added", 1


def _list_content(container: Any) -> Any:
    if container is None:
        return None
    to_bytes = getattr(container, "to_bytes", None)
    if callable(to_bytes):  # a Bloom filter (a list too large for a set)
        return hashlib.sha256(to_bytes()).hexdigest()
    return sorted(str(v) for v in container)


def _forms(engine: Any) -> dict[str, tuple[str, str, ast.Declaration]]:
    """Name -> (kind, identity, declaration) of the engine's rules, queries and metrics."""
    out: dict[str, tuple[str, str, ast.Declaration]] = {}
    for decl in engine.declarations:
        if isinstance(decl, ast.RuleDecl):
            kind, options = "rule", {"max_partials": engine.max_partials}
        elif isinstance(decl, ast.MetricDecl):
            kind, options = "metric", {"lateness_ms": engine.lateness_ms}
        elif isinstance(decl, ast.QueryDecl):
            kind, options = "query", {}
        else:
            continue
        out[decl.name] = (kind, form_identity(decl, engine._streams, engine._lists, options), decl)
    return out


# ---------------------------------------------------------------------------- report


@dataclass(frozen=True)
class RestoreReport:
    """What :func:`restore` did with each rule, query and metric.

    Attributes
    ----------
    kept:
        Unchanged: their state and version carried over.
    reset:
        Changed since the checkpoint: they start fresh, with a new version.
    added:
        Not in the checkpoint: they start fresh.
    dropped:
        In the checkpoint only: their state was discarded.
    versions:
        The version each rule and metric now runs with.
    keys:
        Partition keys holding rule state after the restore.
    """

    kept: tuple[str, ...] = ()
    reset: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    versions: Mapping[str, int] = field(default_factory=dict)
    keys: int = 0

    @property
    def changed(self) -> bool:
        """Whether the program differs from the checkpoint's."""
        return bool(self.reset or self.added or self.dropped)

    def summary(self) -> str:
        """One line for people.

        Examples
        --------
        >>> RestoreReport(kept=("a", "b"), reset=("c",), versions={"c": 2}, keys=7).summary()
        'restored 7 key(s): kept 2 (a, b), reset 1 (c v2), added 0, dropped 0'
        """
        return f"restored {self.keys} key(s): {self.forms()}"

    def forms(self) -> str:
        """What became of the rules, queries and metrics, for people.

        Examples
        --------
        >>> RestoreReport(kept=("a",), added=("d",), versions={"d": 1}).forms()
        'kept 1 (a), reset 0, added 1 (d), dropped 0'
        """

        def names(items: tuple[str, ...], versioned: bool = False) -> str:
            if not items:
                return "0"
            shown = [
                f"{n} v{self.versions[n]}" if versioned and n in self.versions else n
                for n in items
            ]
            return f"{len(items)} ({', '.join(shown)})"

        return (
            f"kept {names(self.kept)}, reset {names(self.reset, True)}, "
            f"added {names(self.added)}, dropped {names(self.dropped)}"
        )


# ---------------------------------------------------------------------------- snapshot


def snapshot(engine: Any) -> bytes:
    """The whole state of an open :class:`~cep.engine.Engine` as bytes (see the module's
    docstring for the format); the engine is not changed.

    Raises
    ------
    CheckpointError
        When the engine is closed, or holds state that cannot be stored: an event field value
        that is not a JSON value, rule state of an injected runtime without ``to_bytes``.
    """
    if engine._closed:
        raise CheckpointError(
            "the engine is closed (end of input): it has nothing left to resume from"
        )
    blobs: list[bytes] = []
    offset = 0

    def blob(data: bytes) -> list[int]:
        nonlocal offset
        blobs.append(data)
        offset += len(data)
        return [offset - len(data), len(data)]

    forms: dict[str, dict[str, Any]] = {}
    current = _forms(engine)
    operators = engine._standing.operators
    for name, (kind, identity, _) in current.items():
        entry: dict[str, Any] = {"kind": kind, "identity": identity}
        if kind == "rule":
            rule = engine._rules[name]
            entry.update(version=rule.version, fingerprint=rule.fingerprint.hex(),
                         slot=engine._slot_of[name])
        elif kind == "metric":
            operator = operators[name]
            entry.update(version=operator.compiled.version,
                         fingerprint=operator.compiled.fingerprint.hex(),
                         state=blob(operator.to_bytes()))
        forms[name] = entry

    groups = []
    group_index: dict[tuple, int] = {}
    for signature, group in engine._groups.items():
        group_index[signature] = len(groups)
        keys = []
        for key, state in group.states.items():
            rules = []
            for name, st in state.rules.items():
                to_bytes = getattr(st, "to_bytes", None)
                if to_bytes is None:
                    raise CheckpointError(
                        f"rule '{name}' runs in a runtime whose state has no to_bytes(); "
                        "only the default runtime can be checkpointed"
                    )
                if getattr(st, "shared", False):
                    # One object for several rules' idle states: each stored as its own,
                    # under its own rule's fingerprint.
                    to_bytes = unshared(engine._rules[name], st).to_bytes
                rules.append([name, getattr(st, "dropped_partials", 0), *blob(to_bytes())])
            # KeyState.pending is only used by RuleProcessor.process (Spark): the embedded
            # engine buffers events in its own reorder buffer.
            seen = {name: list(values.items()) for name, values in state.unique.items()
                    if values}
            extra = [seen] if seen else []
            keys.append([list(key), state.watermark, state.max_ts, rules, *extra])
        groups.append({"signature": signature, "keys": keys})
    timers = [
        [due, group_index[signature], list(key)]
        for due, signature, key in engine._timers.live()
        if signature in group_index
    ]

    entries = engine._buffer.entries()
    held = engine._route.columns.held()
    if held:
        entries.extend((ev.ts, ev.seq, (ev, (None,) * width)) for ev, width in held)
        entries.sort(key=lambda entry: (entry[0], entry[1]))
    buffer = [
        [ev.id, ev.stream, int(ev.ts), int(ev.seq), ev.fields, list(masks)]
        for _, _, (ev, masks) in entries
    ]

    tables = {
        name: {"identity": identity, "state": blob(data)}
        for name, (identity, data) in engine._tables.snapshot().items()
    }
    standing = engine._standing
    manifest = {
        "engine": {
            "fast_strict": engine.fast_strict,
            "max_partials": engine.max_partials,
            "lateness_ms": engine.lateness_ms,
        },
        "forms": forms,
        "retired": {n: f for n, f in engine._retired_forms.items() if n not in current},
        "next_slot": engine._next_slot,
        "groups": groups,
        "timers": timers,
        "buffer": buffer,
        "watermark": {
            "current": engine._watermark.current,
            "max_ts": engine._watermark.max_ts,
        },
        "counters": {
            **{name: getattr(engine, f"_{name}") for name in _ENGINE_COUNTERS},
            **{name: getattr(standing, name) for name in _STANDING_COUNTERS},
        },
        "match_counts": dict(engine._match_counts),
        "retired_drops": dict(engine._retired_drops),
        "suppressed": dict(engine._suppressed),
        "outputs": {"matches": engine._matches, "dead_letters": engine._dead},
        "tables": tables,
    }
    try:
        text = json.dumps(manifest, separators=(",", ":"), default=_plain)
    except ValueError as exc:  # a reference cycle in an event a caller built
        raise CheckpointError(f"the engine's state cannot be stored: {exc}") from None
    head = text.encode("utf-8")
    return _CODEC.encode(b"".join([head, *blobs]), len(head))


def _plain(value: Any) -> Any:
    """JSON for values events may carry besides JSON's own (numpy scalars from frames)."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    raise CheckpointError(
        f"cannot store a {type(value).__name__} value in a checkpoint: events must carry JSON "
        "values (strings, numbers, booleans, null, lists, objects)"
    )


def check_snapshot(data: bytes, *, context: str = "") -> None:
    """Check that ``data`` is a whole snapshot of this format version (frame and checksum),
    without restoring it.

    Raises
    ------
    CheckpointError
        Naming ``context`` and what is wrong (another format version, a checksum mismatch...).
    """
    _CODEC.decode(data, context=context)


# ---------------------------------------------------------------------------- restore


def restore(engine: Any, data: bytes) -> RestoreReport:
    """Continue, in ``engine`` (new, its program registered, nothing fed), from a
    :func:`snapshot`. Its program may differ from the snapshot's: see the module's docstring
    for what is kept. Nothing is changed when an error is raised.

    Raises
    ------
    CheckpointError
        When the bytes are not a snapshot of this format version, are corrupt, or ``engine``
        was fed already or built with another ``fast_strict``.
    """
    if engine._closed or engine._seq or engine._matches or engine._dead or any(
        g.states for g in engine._groups.values()
    ):
        raise CheckpointError(
            "restore into a new engine: this one was fed events already (register the program, "
            "then restore, then feed)"
        )
    (head_len,), body = _CODEC.decode(data)
    try:
        manifest = json.loads(bytes(body[:head_len]).decode("utf-8"))
        blobs = body[head_len:]
        return _Restore(engine, manifest, blobs).apply()
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, EngineError):
            raise CheckpointError(f"engine checkpoint cannot be restored: {exc}") from exc
        raise CheckpointError(
            f"engine checkpoint is malformed ({type(exc).__name__}: {exc}); it was not written "
            "by this version of Vigil's snapshot()"
        ) from None


class _Restore:
    """One restore: everything is decoded and checked first (:meth:`apply` builds the new
    state), then handed to the engine at once."""

    def __init__(self, engine: Any, manifest: dict[str, Any], blobs: memoryview) -> None:
        self.engine = engine
        self.manifest = manifest
        self.blobs = blobs

    def blob(self, where: list[int]) -> bytes:
        start, length = where
        data = bytes(self.blobs[start : start + length])
        if len(data) != length:
            raise CheckpointError("engine checkpoint is truncated: a state blob is cut short")
        return data

    def apply(self) -> RestoreReport:
        engine = self.engine
        manifest = self.manifest
        options = manifest["engine"]
        if bool(options["fast_strict"]) != bool(engine.fast_strict):
            raise CheckpointError(
                f"the checkpoint was written by an engine with fast_strict="
                f"{options['fast_strict']}; restore it into one built the same way"
            )
        old_forms: dict[str, dict[str, Any]] = manifest["forms"]
        retired: dict[str, dict[str, Any]] = manifest["retired"]
        current = _forms(engine)
        status, versions, rules, operators = self._plan(current, old_forms, retired)

        # Slots: a kept rule keeps its own (the masks of buffered events are per slot); the
        # others take new ones, above every slot a buffered event has a mask for.
        next_slot = int(manifest["next_slot"])
        slot_of: dict[str, int] = {}
        for name in engine._rules:
            if status[name] == "kept":
                slot_of[name] = int(old_forms[name]["slot"])
            else:
                slot_of[name] = next_slot
                next_slot += 1

        kept = {name for name, s in status.items() if s == "kept"}
        drops: Counter[str] = Counter({k: int(v) for k, v in manifest["retired_drops"].items()})
        states, timers = self._key_states(rules, kept, drops)
        buffer = [
            (int(ts), int(seq), (Event(_ident(i), stream, int(ts), int(seq), fields),
                                 tuple(masks)))
            for i, stream, ts, seq, fields, masks in manifest["buffer"]
        ]
        counters = {name: int(manifest["counters"].get(name, 0)) for name in _COUNTERS}
        tables = engine._tables.loaded({
            str(name): (entry["identity"], self.blob(entry["state"]))
            for name, entry in manifest.get("tables", {}).items()
        })
        watermark = int(manifest["watermark"]["current"])
        max_ts = {
            str(s): int(t) for s, t in manifest["watermark"]["max_ts"].items()
            if s in engine._schemas  # a stream no longer declared would hold it back
        }
        match_counts = Counter({str(k): int(v) for k, v in manifest["match_counts"].items()})
        suppressed = Counter({str(k): int(v) for k, v in manifest.get("suppressed", {}).items()})
        matches = list(manifest["outputs"]["matches"])
        dead = list(manifest["outputs"]["dead_letters"])

        # Nothing can fail past this point: hand the state to the engine.
        for name, rule in rules.items():
            engine._rules[name] = rule
        engine._slot_of = {name: slot_of[name] for name in engine._rules}
        engine._next_slot = next_slot
        engine._retired_drops.clear()
        engine._retired_drops.update(drops)
        engine._suppressed.clear()
        engine._suppressed.update(suppressed)
        for signature in list(engine._groups):
            engine._regroup(signature)
        for signature, keyed in states.items():
            engine._groups[signature].states.update(keyed)
        engine._plan_columns()
        engine._timers.restore(timers)
        for signature, group in engine._groups.items():
            for key, state in list(group.states.items()):
                engine._timers.update(signature, group, key, state)
        engine._tables.adopt(tables)
        engine._pumped = watermark
        engine._buffer.push_sorted(buffer)
        buffered = {payload[0].stream for _, _, payload in buffer}
        for stream in [s for s in engine._route.streams if s in buffered]:
            engine._route.demote(stream)
        engine._watermark.restore(watermark, max_ts)
        for name, operator in operators.items():
            engine._standing.replace_operator(name, operator)
        for name in _ENGINE_COUNTERS:
            setattr(engine, f"_{name}", counters[name])
        for name in _STANDING_COUNTERS:
            setattr(engine._standing, name, counters[name])
        engine._match_counts = match_counts
        engine._matches = matches
        engine._dead = dead
        dropped = tuple(name for name in old_forms if name not in current)
        engine._retired_forms = {
            **{n: f for n, f in retired.items() if n not in current},
            **{
                n: {k: v for k, v in old_forms[n].items() if k in ("kind", "identity", "version")}
                for n in dropped
            },
        }
        return RestoreReport(
            kept=tuple(n for n, s in status.items() if s == "kept"),
            reset=tuple(n for n, s in status.items() if s == "reset"),
            added=tuple(n for n, s in status.items() if s == "added"),
            dropped=dropped,
            versions=versions,
            keys=sum(len(g.states) for g in engine._groups.values()),
        )

    def _plan(
        self,
        current: Mapping[str, tuple[str, str, ast.Declaration]],
        old_forms: Mapping[str, dict[str, Any]],
        retired: Mapping[str, dict[str, Any]],
    ) -> tuple[dict[str, str], dict[str, int], dict[str, Any], dict[str, MetricOperator]]:
        """Per name of the program: kept, reset or added; the version each rule and metric
        runs with; the rules compiled at it; the metrics' operators (restored or fresh)."""
        status: dict[str, str] = {}
        versions: dict[str, int] = {}
        rules: dict[str, Any] = {}
        operators: dict[str, MetricOperator] = {}
        for name, (kind, identity, decl) in current.items():
            old = old_forms.get(name)
            state, version = form_version(kind, identity, old, retired.get(name))
            compile_at = self._rule if kind == "rule" else self._metric
            if kind != "query":
                compiled = compile_at(decl, version)
                if state == "kept" and compiled.fingerprint.hex() != old["fingerprint"]:
                    # The same text compiles to another form (another build of Vigil).
                    state, version = "reset", version + 1
                    compiled = compile_at(decl, version)
                if kind == "rule":
                    rules[name] = compiled
                elif state == "kept":
                    operators[name] = MetricOperator.from_bytes(compiled, self.blob(old["state"]))
                else:
                    operators[name] = MetricOperator(compiled)
                versions[name] = version
            status[name] = state
        return status, versions, rules, operators

    def _metric(self, decl: ast.MetricDecl, version: int) -> Any:
        engine = self.engine
        return compile_program_metric(
            decl, engine._streams, engine._lists, lateness_ms=engine._standing.lateness_ms,
            version=version, tables=engine._tables.readers,
        )

    def _rule(self, decl: ast.RuleDecl, version: int) -> Any:
        engine = self.engine
        rule = engine._rules[decl.name]
        if rule.version == version:
            return rule
        return engine._compile(decl, engine._streams, engine._lists, version=version)

    def _key_states(
        self, rules: Mapping[str, Any], kept: set[str], drops: Counter[str]
    ) -> tuple[dict[tuple, dict[tuple, KeyState]], list[tuple[int, tuple, tuple]]]:
        """Each key's state of the kept rules, by group signature, and the live timers;
        partial matches dropped by the states left behind are added to ``drops``."""
        engine = self.engine
        from_bytes = (
            engine._runtime.state_from_bytes if engine._runtime is not None
            else RuleState.from_bytes
        )
        signatures = {_canonical(sig): sig for sig in engine._groups}
        states: dict[tuple, dict[tuple, KeyState]] = {}
        targets: list[tuple | None] = []
        for group in self.manifest["groups"]:
            signature = signatures.get(_canonical(group["signature"]))
            targets.append(signature)
            keyed: dict[tuple, KeyState] = {}
            for key, watermark, max_ts, held, *more in group["keys"]:
                ks = KeyState(watermark=int(watermark), max_ts={s: int(t) for s, t in
                                                                 max_ts.items()})
                for name, dropped, start, length in held:
                    if signature is not None and name in kept:
                        ks.rules[name] = from_bytes(self.blob([start, length]), rules[name])
                    elif dropped:
                        drops[name] += int(dropped)
                # `unique`'s reported values (a later element: older snapshots have none).
                for name, seen in (more[0] if more else {}).items():
                    if signature is not None and name in kept:
                        ks.unique[name] = OrderedDict((str(v), int(t)) for v, t in seen)
                if ks.rules or ks.unique:
                    keyed[_ident(key)] = ks
            if signature is not None and keyed:
                states[signature] = keyed
        timers = []
        for due, index, key in self.manifest["timers"]:
            signature = targets[index]
            key = _ident(key)
            if signature is not None and key in states.get(signature, {}):
                timers.append((int(due), signature, key))
        return states, timers


def _canonical(signature: Any) -> str:
    return json.dumps(signature, separators=(",", ":"))


def _ident(value: Any) -> Any:
    """A key (or id) read back from JSON: lists as tuples, so it hashes as it did."""
    if isinstance(value, list):
        return tuple(_ident(v) for v in value)
    return value


# ---------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read from a :class:`CheckpointStore`.

    Attributes
    ----------
    state:
        The engine's :func:`snapshot`, for :meth:`Engine.restore <cep.engine.Engine.restore>`.
    cursor:
        What the caller saved with it: where its input stood (JSON value).
    path:
        The file it was read from.
    """

    state: bytes
    cursor: Any
    path: Path


class CheckpointStore:
    """The latest checkpoint of an engine in a directory: its snapshot plus the caller's input
    cursor, replaced atomically.

    :meth:`save` writes the whole checkpoint to a temporary file in the same directory, flushes
    it to disk (``fsync``), renames it over the previous one (``os.replace``, atomic on POSIX
    and Windows) and syncs the directory. A crash at any point leaves either the previous
    checkpoint or the new one, whole; a temporary file a crash left behind is never read, and
    the next :meth:`save` removes it. The file is checksummed, so one damaged in any other way
    is refused rather than half read.

    A file replaced as a whole is the simplest atomic primitive for this: each checkpoint
    replaces the last entirely, one process writes it, and nothing is updated in place. SQLite
    in WAL mode would add a library's locking and page format to get the same guarantee, and
    pay off only for incremental (per-key) writes, which this format does not make. One
    process at a time may save to a directory.

    Parameters
    ----------
    directory:
        Where the checkpoint lives (created if missing).

    Examples
    --------
    >>> import tempfile
    >>> from cep.engine import Engine
    >>> program = '''
    ... stream txn (card string, amount float, ts timestamp) time ts
    ... rule probe from txn by card pattern small big within 1h
    ...   define small as amount < 1, big as amount > 500
    ... '''
    >>> engine = Engine()
    >>> engine.register(program)
    ['probe']
    >>> engine.feed({"card": "c1", "amount": 0.5, "ts": 1767225600})
    >>> store = CheckpointStore(tempfile.mkdtemp())
    >>> path = store.save(engine.snapshot(), cursor={"line": 1})
    >>> saved = store.load()
    >>> restarted = Engine()
    >>> restarted.register(program)
    ['probe']
    >>> restarted.restore(saved.state).summary(), saved.cursor
    ('restored 1 key(s): kept 1 (probe), reset 0, added 0, dropped 0', {'line': 1})
    >>> restarted.feed({"card": "c1", "amount": 900.0, "ts": 1767225660})
    >>> restarted.close()
    >>> [m["events"] for m in restarted.drain()]
    [{'small': [0], 'big': [1]}]
    """

    FILENAME = "engine.checkpoint"
    """The checkpoint's file name in the directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self.directory / self.FILENAME

    def save(self, state: bytes, cursor: Any = None) -> Path:
        """Store an engine's :func:`snapshot` with the input ``cursor`` (any JSON value) as the
        latest checkpoint, atomically; returns its path.

        Raises
        ------
        CheckpointError
            When ``cursor`` is not a JSON value.
        OSError
            When the file cannot be written (the previous checkpoint is left as it was).
        """
        try:
            head = json.dumps(cursor, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"the input cursor must be a JSON value: {exc}") from None
        data = _FILE_CODEC.encode(b"".join([head, state]), len(head))
        for stale in self.directory.glob(f".{self.FILENAME}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()
        fd, temp = tempfile.mkstemp(prefix=f".{self.FILENAME}.", suffix=".tmp",
                                    dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        _sync_directory(self.directory)
        return self.path

    def load(self) -> Checkpoint | None:
        """The latest checkpoint, or ``None`` when none was saved yet.

        Raises
        ------
        CheckpointError
            Naming the file, when it cannot be read, is truncated or corrupted, or holds a
            format version this build does not read.
        """
        path = self.path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from None
        context = f"checkpoint {path}"
        (head_len,), body = _FILE_CODEC.decode(data, context=context)
        try:
            cursor = json.loads(bytes(body[:head_len]).decode("utf-8"))
        except ValueError as exc:
            raise CheckpointError(f"{context}: its input cursor is not JSON: {exc}") from None
        state = bytes(body[head_len:])
        check_snapshot(state, context=context)
        return Checkpoint(state, cursor, path)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; elsewhere the rename is all there is)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
