"""A rerun of an edited program over a checkpoint: which rules and metrics keep their state,
the version each one runs with, and where each keyed processor's state lives.

The state store of a checkpoint is one stateful operator grouped by an integer: processor
``p`` owns the groups ``slot(p) * buckets`` to ``(slot(p) + 1) * buckets - 1``. A processor
keeps its slot across reruns while its identity stays (for rules: their key definition; for a
metric: its name and version), so adding, removing or changing rules of one key definition, or
adding a processor with a new key definition, leaves every other processor's state where it
was. New processors take slots never used before (a slot is not reused: what a dropped
processor left in it could be read as another's). Within a rules processor each rule's state
carries its version (:meth:`cep.nfa.processor.RuleProcessor.decode` drops state of another
version or of a rule it no longer runs), so a changed rule starts fresh beside its unchanged
neighbours. Rules and metrics are identified as the embedded engine's checkpoints identify
them (:func:`cep.engine.checkpoint.form_identity`, :func:`~cep.engine.checkpoint.form_version`),
so both engines keep, reset and number the same forms.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cep.engine import load_declarations
from cep.engine.checkpoint import RestoreReport, form_identity, form_version
from cep.engine.program import add_declarations
from query_lang import ast
from spark_udf.routing import resolve_processor
from spark_udf.rules import ProcessorSpec, processor_specs

__all__ = ["ProgramEdit", "edit_program", "processor_identity"]

_KINDS = {ast.RuleDecl: "rule", ast.MetricDecl: "metric", ast.QueryDecl: "query"}


@dataclass(frozen=True)
class ProgramEdit:
    """A program compiled to continue a checkpoint (or to start one).

    Attributes
    ----------
    specs:
        The keyed processors, each rule and metric compiled at its version.
    skipped:
        Names the keyed processors do not run (queries).
    slots:
        Per spec, the slot of the state groups it owns.
    next_slot:
        The first slot no processor of this checkpoint has had.
    forms:
        Per rule, query and metric name: ``kind``, ``identity``, ``version`` and compiled
        ``fingerprint`` (hex; empty for queries), as the run's record keeps them.
    retired:
        The forms earlier programs of this checkpoint had and this one has not (a name coming
        back continues its version numbering).
    report:
        What the edit kept, reset, added and dropped (``keys`` is not counted: 0).
    """

    specs: tuple[ProcessorSpec, ...]
    skipped: tuple[str, ...]
    slots: tuple[int, ...]
    next_slot: int
    forms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    retired: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    report: RestoreReport = field(default_factory=RestoreReport)


def processor_identity(spec: ProcessorSpec) -> str:
    """What a processor's slot follows across reruns: the key definition of a rules processor
    (rules with per-step keys have their own, by rule name), a metric's name and version.

    Examples
    --------
    >>> specs, _ = processor_specs('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... metric n from txn by card_id window tumbling 1m select count() as n
    ... ''')
    >>> [processor_identity(spec) for spec in specs]
    ['rules [["txn",["card_id"]]]', 'metric n v1']
    """
    processor = resolve_processor(spec.processor)
    metric = getattr(processor, "metric", None)
    if metric is not None:
        return f"metric {spec.rules[0]} v{metric.version}"
    rules = getattr(processor, "rules", ())
    key = [[stream, list(fields)] for stream, fields in sorted(spec.key_cols.items())]
    own = [r.name for r in rules if getattr(r, "var_keys", None)]
    text = json.dumps(key, separators=(",", ":"))
    return f"rules {text}" + (f" own {own[0]}" if own else "")


def edit_program(
    program: Any,
    *,
    lateness_ms: int | None = None,
    previous: Any = None,
) -> ProgramEdit:
    """Compile ``program`` (rule file path, DSL text or parsed modules) to continue a
    checkpoint whose layout is ``previous`` (:class:`spark_udf.checkpoint.StateLayout`, or
    ``None`` for a new checkpoint).

    Raises
    ------
    query_lang.errors.VigilError
        When the program does not parse or check.
    OperatorConfigError
        When it declares nothing the keyed operator or the queries run.
    """
    declarations = load_declarations(program)
    streams, lists = add_declarations(declarations, {}, {}, ())
    options = {"lateness_ms": lateness_ms}
    current = {
        d.name: (_KINDS[type(d)], form_identity(d, streams, lists, options))
        for d in declarations if type(d) in _KINDS
    }
    old_forms: Mapping[str, Any] = previous.forms if previous is not None else {}
    retired: dict[str, Any] = dict(previous.retired) if previous is not None else {}
    legacy = previous is not None and previous.legacy
    status: dict[str, str] = {}
    versions: dict[str, int] = {}
    for name, (kind, identity) in current.items():
        old = old_forms.get(name)
        if legacy and old is not None:
            # A record written before forms were kept: its fingerprints decide below.
            old = {**old, "kind": kind, "identity": identity}
        status[name], versions[name] = form_version(kind, identity, old, retired.get(name))
        gone = retired.get(name)
        if old is None and gone is not None and versions[name] <= (gone.get("version") or 0):
            # Unlike the embedded engine, which discards a dropped form's state at once, the
            # state store still holds it for the keys no batch touched since: a form coming
            # back runs at a new version, so that nothing it left is read again.
            versions[name] = (gone.get("version") or 0) + 1
    while True:
        specs, skipped = processor_specs(program, lateness_ms=lateness_ms, versions=versions)
        fingerprints = _fingerprints(specs)
        moved = [
            name for name, state in status.items()
            if state == "kept" and name in fingerprints
            and old_forms[name].get("fingerprint") not in (None, fingerprints[name])
        ]
        if not moved:
            break
        for name in moved:  # the same text compiles to another form (another build of Vigil)
            status[name], versions[name] = "reset", versions[name] + 1
    forms = {
        name: {"kind": kind, "identity": identity, "version": versions[name],
               "fingerprint": fingerprints.get(name, "")}
        for name, (kind, identity) in current.items()
    }
    dropped = sorted(set(old_forms) - set(current))
    for name in dropped:
        retired[name] = dict(old_forms[name])
    for name in current:
        retired.pop(name, None)
    slots, next_slot = _slots(specs, previous)
    report = RestoreReport(
        kept=tuple(n for n, s in status.items() if s == "kept"),
        reset=tuple(n for n, s in status.items() if s == "reset"),
        added=tuple(n for n, s in status.items() if s == "added"),
        dropped=tuple(dropped),
        versions={n: versions[n] for n, (kind, _) in current.items() if kind != "query"},
    )
    return ProgramEdit(tuple(specs), tuple(skipped), slots, next_slot, forms, retired, report)


def _fingerprints(specs: Sequence[ProcessorSpec]) -> dict[str, str]:
    found = {}
    for spec in specs:
        processor = resolve_processor(spec.processor)
        metric = getattr(processor, "metric", None)
        if metric is not None:
            found[spec.rules[0]] = metric.fingerprint.hex()
        for rule in getattr(processor, "rules", ()):
            found[rule.name] = rule.fingerprint.hex()
    return found


def _slots(specs: Sequence[ProcessorSpec], previous: Any) -> tuple[tuple[int, ...], int]:
    if previous is None:
        return tuple(range(len(specs))), len(specs)
    taken: dict[str, int] = {}
    for index, processor in enumerate(previous.processors):
        identity = processor.get("identity") or _legacy_identity(processor)
        taken.setdefault(identity, processor.get("slot", index))
    next_slot = max([previous.next_slot or 0, *(s + 1 for s in taken.values())], default=0)
    slots = []
    for spec in specs:
        slot = taken.pop(processor_identity(spec), None)
        if slot is None:
            slot = taken.pop(_legacy_identity(_shape_of(spec)), None)
        if slot is None:
            slot, next_slot = next_slot, next_slot + 1
        slots.append(slot)
    return tuple(slots), next_slot


def _shape_of(spec: ProcessorSpec) -> dict[str, Any]:
    return {"names": list(spec.rules),
            "key": {s: list(f) for s, f in sorted(spec.key_cols.items())}}


def _legacy_identity(processor: Mapping[str, Any]) -> str:
    # A record written before processors had identities placed them by index; the same rules
    # by the same key continue in the same place.
    return "legacy " + json.dumps([processor["names"], processor["key"]], sort_keys=True)

