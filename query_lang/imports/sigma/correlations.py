"""Sigma correlation rules as Vigil declarations, with the specification's semantics.

* ``event_count``: a metric over the stream of the referenced rules, filtered by their
  conditions, grouped by ``group-by``, in a **sliding** window of ``timespan`` (one window per
  event time ``t``: ``(t - timespan, t]``, so any run of events that fits in the timespan is
  seen, never cut by fixed window boundaries), with ``having`` the condition.
* ``temporal_ordered``: a sequence rule: one pattern step per referenced rule, in order,
  ``within`` the timespan, partitioned by ``group-by`` (field aliases become per-step keys).
* ``temporal``: the same, with the steps in any order (an alternation of the orders, for up to
  four rules).

* ``value_count`` with ``gte n`` (or ``gt n - 1``): a sequence rule of n events with n
  different values of the field, ``within`` the timespan (see :func:`_value_count`).

``value_count`` with ``lt``/``lte``/``eq``/``neq`` and the other aggregations would need an exact
distinct count or sum per sliding window, chained correlations the output of a metric as input
to another rule: Vigil has neither exactly, so they are refused with an error naming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations
from typing import Any

from sigma.correlations import (
    SigmaCorrelationConditionOperator,
    SigmaCorrelationRule,
    SigmaCorrelationType,
    SigmaExtendedCorrelationCondition,
)
from sigma.exceptions import SigmaFeatureNotSupportedByBackendError

from query_lang.imports.sigma.logsources import LogSourceMap, StreamSpec, vigil_name
from query_lang.imports.sigma.output import (
    Block,
    Detection,
    alert_clauses,
    rule_header,
    rule_origin,
)
from query_lang.imports.sigma.values import string_literal
from query_lang.lexical import duration_text

__all__ = ["MAX_TEMPORAL_RULES", "MAX_VALUE_COUNT", "correlation_blocks"]

MAX_VALUE_COUNT = 20
"""Largest distinct count a ``value_count`` correlation may ask for: its sequence has one step
per value, and step k compares with the k - 1 before it."""

MAX_TEMPORAL_RULES = 4
"""Most rules an unordered ``temporal`` correlation may name: its pattern spells every order
(``4! = 24`` alternatives)."""

_OPERATORS = {
    SigmaCorrelationConditionOperator.LT: "<",
    SigmaCorrelationConditionOperator.LTE: "<=",
    SigmaCorrelationConditionOperator.GT: ">",
    SigmaCorrelationConditionOperator.GTE: ">=",
    SigmaCorrelationConditionOperator.EQ: "==",
    SigmaCorrelationConditionOperator.NEQ: "!=",
}


def _refuse(rule: SigmaCorrelationRule, what: str) -> SigmaFeatureNotSupportedByBackendError:
    return SigmaFeatureNotSupportedByBackendError(what, source=rule.source)


def correlation_blocks(
    rule: SigmaCorrelationRule, name: str, mapping: LogSourceMap
) -> list[Block]:
    """The Vigil declaration ``name`` of a correlation rule (its referenced rules already
    converted by the backend)."""
    if isinstance(rule.condition, SigmaExtendedCorrelationCondition):
        raise _refuse(rule, f"{rule.type.name.lower()} correlation with an extended condition "
                            f"({rule.condition.expression!r})")
    steps = _referenced(rule)
    if rule.type is SigmaCorrelationType.EVENT_COUNT:
        return [_event_count(rule, name, steps, mapping)]
    if rule.type in (SigmaCorrelationType.TEMPORAL_ORDERED, SigmaCorrelationType.TEMPORAL):
        return [_temporal(rule, name, steps, mapping)]
    if rule.type is SigmaCorrelationType.VALUE_COUNT:
        return [_value_count(rule, name, steps)]
    raise _refuse(rule, f"{rule.type.name.lower()} correlation")


def _referenced(rule: SigmaCorrelationRule) -> list[tuple[str, Any, Detection]]:
    """``(reference, rule, detection)`` per referenced rule, in the correlation's order."""
    steps = []
    for reference in rule.rules or ():
        target = reference.rule
        if isinstance(target, SigmaCorrelationRule):
            raise _refuse(rule, f"correlation over the correlation {reference.reference!r} "
                                "(chaining): a Vigil metric's rows are not events of a stream")
        blocks = target.get_conversion_result()
        detections = [b.detection for b in blocks if getattr(b, "detection", None)]
        if not detections:
            raise _refuse(rule, f"the referenced rule {reference.reference!r} was not imported")
        streams = {d.stream.name for d in detections}
        condition = (
            detections[0].condition if len(detections) == 1
            else " or ".join(f"({d.condition})" for d in detections)
        )
        fields = {k: v for d in detections for k, v in d.fields.items()}
        steps.append((reference.reference, target,
                      Detection(detections[0].stream, condition, fields)))
        if len(streams) > 1:  # pragma: no cover - one rule has one log source
            raise _refuse(rule, f"rule {reference.reference!r} reads several streams")
    return steps


def _group_fields(
    rule: SigmaCorrelationRule, steps: Sequence[tuple[str, Any, Detection]]
) -> list[list[str]]:
    """Per step, the Vigil names of its group-by fields (aliases resolved per rule)."""
    per_step: list[list[str]] = [[] for _ in steps]
    for group in rule.group_by or ():
        alias = rule.aliases.aliases.get(group)
        for i, (reference, target, _) in enumerate(steps):
            name = group
            if alias is not None:
                found = [
                    field for ref, field in alias.mapping.items()
                    if ref.reference == reference or getattr(ref, "rule", None) is target
                ]
                if not found:
                    raise _refuse(rule, f"alias {group!r} names no field for rule {reference!r}")
                name = found[0]
            per_step[i].append(vigil_name(name))
    return per_step


def _condition(rule: SigmaCorrelationRule, value: str) -> str:
    condition = rule.condition
    op = _OPERATORS[condition.op]
    count = condition.count
    count_text = repr(int(count)) if float(count).is_integer() else repr(count)
    return f"{value} {op} {count_text}"


def _timespan(rule: SigmaCorrelationRule) -> str:
    return duration_text(int(rule.timespan.seconds) * 1000)


def _reads(
    steps: Sequence[tuple[str, Any, Detection]], keys: Sequence[Sequence[str]]
) -> dict[str, tuple[StreamSpec, frozenset[str]]]:
    reads: dict[str, tuple[StreamSpec, frozenset[str]]] = {}
    for (_, _, detection), step_keys in zip(steps, keys, strict=True):
        spec = detection.stream
        _, known = reads.get(spec.name, (spec, frozenset()))
        reads[spec.name] = (spec, known | frozenset(detection.fields) | frozenset(step_keys))
    return reads


def _header(rule: SigmaCorrelationRule, steps: Sequence[tuple[str, Any, Detection]]) -> list[str]:
    lines = rule_header(rule)
    kind = rule.type.name.lower()
    group = f", group-by {', '.join(rule.group_by)}" if rule.group_by else ""
    lines.append(f"# correlation {kind} of {', '.join(s[0] for s in steps)}, timespan "
                 f"{rule.timespan.spec}{group}")
    return lines


def _event_count(
    rule: SigmaCorrelationRule, name: str, steps: Sequence[tuple[str, Any, Detection]],
    mapping: LogSourceMap,
) -> Block:
    streams = {detection.stream.name for _, _, detection in steps}
    if len(streams) != 1:
        raise _refuse(rule, "event_count over rules of different log sources "
                            f"({', '.join(sorted(streams))}): a metric counts one stream")
    keys = _group_fields(rule, steps)
    if any(k != keys[0] for k in keys):
        raise _refuse(rule, "event_count whose group-by aliases name different fields of one "
                            "stream: a metric groups by the same fields for every event")
    stream = steps[0][2].stream.name
    where = (
        steps[0][2].condition if len(steps) == 1
        else " or ".join(f"({detection.condition})" for _, _, detection in steps)
    )
    lines = _header(rule, steps)
    title = f" {string_literal(rule.title)}" if rule.title else ""
    lines.append(f"metric {name}{title}")
    lines.append(f"  from {stream}")
    lines.append(f"  where {where}")
    if keys[0]:
        lines.append(f"  by {', '.join(keys[0])}")
    lines.append(f"  window sliding {_timespan(rule)}")
    lines.append("  select count() as event_count")
    lines.append(f"  having {_condition(rule, 'event_count')}")
    lines.extend("  " + clause for clause in alert_clauses(rule))
    return Block(name, "\n".join(lines), _reads(steps, keys), None, rule_origin(rule))


def _temporal(
    rule: SigmaCorrelationRule, name: str, steps: Sequence[tuple[str, Any, Detection]],
    mapping: LogSourceMap,
) -> Block:
    condition = rule.condition
    needed = len(steps)
    if not (
        (condition.op is SigmaCorrelationConditionOperator.GTE and condition.count == needed)
        or (condition.op is SigmaCorrelationConditionOperator.GT and condition.count == needed - 1)
        or (condition.op is SigmaCorrelationConditionOperator.EQ and condition.count == needed)
    ):
        raise _refuse(rule, f"{rule.type.name.lower()} correlation whose condition "
                            f"({condition.op.name.lower()} {condition.count}) does not ask for "
                            f"all {needed} rules: a sequence needs every step")
    ordered = rule.type is SigmaCorrelationType.TEMPORAL_ORDERED
    if not ordered and needed > MAX_TEMPORAL_RULES:
        raise _refuse(rule, f"temporal correlation of {needed} rules: at most "
                            f"{MAX_TEMPORAL_RULES} (every order is spelled out)")
    keys = _group_fields(rule, steps)
    variables = [f"r{i + 1}" for i in range(needed)]
    if ordered:
        pattern = " ".join(variables)
    else:
        orders = [" ".join(order) for order in permutations(variables)]
        pattern = orders[0] if len(orders) == 1 else " | ".join(f"({o})" for o in orders)
    streams = list(dict.fromkeys(detection.stream.name for _, _, detection in steps))
    same_keys = all(k == keys[0] for k in keys)
    lines = _header(rule, steps)
    title = f" {string_literal(rule.title)}" if rule.title else ""
    lines.append(f"rule {name}{title}")
    lines.append(f"  from {', '.join(streams)}")
    if keys[0] and same_keys:
        lines.append(f"  by {', '.join(keys[0])}")
    lines.append(f"  pattern {pattern}")
    defines = []
    for variable, (_, _, detection), step_keys in zip(variables, steps, keys, strict=True):
        define = f"{variable} as {detection.stream.name} where {detection.condition}"
        if step_keys and not same_keys:
            define += f" by ({', '.join(step_keys)})" if len(step_keys) > 1 else (
                f" by {step_keys[0]}")
        defines.append(define)
    lines.append("  define " + ",\n         ".join(defines))
    lines.append(f"  within {_timespan(rule)}")
    lines.extend("  " + clause for clause in alert_clauses(rule))
    return Block(name, "\n".join(lines), _reads(steps, keys), None, rule_origin(rule))


def _value_count(
    rule: SigmaCorrelationRule, name: str, steps: Sequence[tuple[str, Any, Detection]]
) -> Block:
    """``value_count`` with ``gte n`` (or ``gt n - 1``) as a sequence of n events with n
    different values of the field: step k takes the next event whose value none of the steps
    before it has. Taking the earliest new value first reaches n values soonest, so a sequence
    fits in the timespan exactly when some run of events of the timespan holds n values."""
    condition = rule.condition
    field = condition.fieldref
    if not isinstance(field, str):
        raise _refuse(rule, "value_count correlation over several fields")
    op = condition.op
    if op is SigmaCorrelationConditionOperator.GTE:
        needed = condition.count
    elif op is SigmaCorrelationConditionOperator.GT:
        needed = condition.count + 1
    else:
        # Fewer than n values, or exactly n, is a statement about every event of a window:
        # only an exact distinct count per window could say it, and Vigil's approx_distinct
        # is a HyperLogLog estimate.
        raise _refuse(rule, f"value_count correlation with condition {op.name.lower()} "
                            "(only gte and gt have an exact Vigil form)")
    if not float(needed).is_integer() or not 1 <= needed <= MAX_VALUE_COUNT:
        raise _refuse(rule, f"value_count correlation asking for {needed} values (1 to "
                            f"{MAX_VALUE_COUNT})")
    needed = int(needed)
    streams = {detection.stream.name for _, _, detection in steps}
    if len(streams) != 1:
        raise _refuse(rule, "value_count over rules of different log sources "
                            f"({', '.join(sorted(streams))})")
    keys = _group_fields(rule, steps)
    if any(k != keys[0] for k in keys):
        raise _refuse(rule, "value_count whose group-by aliases name different fields")
    value = vigil_name(field)
    stream = steps[0][2].stream.name
    where = (
        steps[0][2].condition if len(steps) == 1
        else " or ".join(f"({detection.condition})" for _, _, detection in steps)
    )
    variables = [f"v{i + 1}" for i in range(needed)]
    defines = []
    for i, variable in enumerate(variables):
        new = [f"{value} is not null"] if i == 0 else [
            f"{value} != {earlier}.{value}" for earlier in variables[:i]
        ]
        defines.append(f"{variable} as {stream} where ({where}) and {' and '.join(new)}")
    lines = _header(rule, steps)
    title = f" {string_literal(rule.title)}" if rule.title else ""
    lines.append(f"rule {name}{title}")
    lines.append(f"  from {stream}")
    if keys[0]:
        lines.append(f"  by {', '.join(keys[0])}")
    lines.append(f"  pattern {' '.join(variables)}")
    lines.append("  define " + ",\n         ".join(defines))
    lines.append(f"  within {_timespan(rule)}")
    lines.extend("  " + clause for clause in alert_clauses(rule))
    reads = _reads(steps, [[*k, value] for k in keys])
    return Block(name, "\n".join(lines), reads, None, rule_origin(rule))
