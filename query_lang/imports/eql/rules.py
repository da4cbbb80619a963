"""One EQL query as one Vigil rule: an event query is a one-step rule, a sequence a pattern of
steps with EQL's sequence semantics (see ``docs/import.md``, "EQL").

EQL's engine keeps, per join key, one pending sequence at each step and replaces it with a
newer one; an event advances the pending sequence of its step (so it is never skipped) and a
completed sequence is reported at once, overlapping ones included. In Vigil words: relaxed
contiguity, ``partials latest``, ``after match no skip``, ``within`` for ``maxspan``. ``until``
drops the pending sequences of its key: a negated step between every two steps, and, for a
step that the same event could complete, ``not until`` in its condition (EQL closes first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eql import ast as eql_ast
from eql.walkers import RecursiveWalker

from query_lang.imports.eql.errors import EqlImportError
from query_lang.imports.eql.expressions import (
    Condition,
    ExpressionWriter,
    FieldTypes,
    field_name,
    infer_types,
    join_terms,
    pipe_name,
)
from query_lang.imports.eql.reading import ParsedQuery
from query_lang.lexical import duration_text, quote

__all__ = ["ImportedRule", "RuleHeader", "Step", "query_steps", "write_rule"]


@dataclass(frozen=True)
class RuleHeader:
    """What a rule carries besides its pattern: name, title, severity, tags."""

    name: str
    title: str | None = None
    severity: str | None = None
    tags: tuple[str, ...] = ()


@dataclass
class Step:
    """One event query of an EQL query: a sequence step, an ``until`` or a missing event."""

    query: Any  # eql EventQuery
    streams: list[str]
    keys: list[Any]  # eql join values: fields, or expressions of the step's event
    role: str = "step"  # "step", "until", "missing"
    node: Any = None
    #: ``fork=true``: the pending sequence this step extends stays pending as well
    fork: bool = False


@dataclass
class ImportedRule:
    """A translated query: its Vigil text and the fields each stream must declare."""

    name: str
    text: str
    fields: dict[str, set[str]] = field(default_factory=dict)


def query_steps(
    parsed: ParsedQuery, streams_of: Callable[[str], list[str]], ignore_pipes: frozenset[str]
) -> tuple[list[Step], list[Any], int | None, list[str], list[Any]]:
    """The steps of ``parsed`` (an event query is one step), the conditions its ``filter``
    pipes add, its ``maxspan`` in ms, notes on ignored pipes and the expressions of its
    ``unique`` pipe; refuses what has no equivalent."""
    query = parsed.query
    first = query.first
    filters: list[Any] = []
    unique: list[Any] = []
    notes: list[str] = []
    ignored = False
    for pipe in query.pipes:
        name = pipe_name(pipe)
        if name in ignore_pipes:
            notes.append(f"pipe `| {pipe.render()}` ignored (--ignore-pipe {name})")
            ignored = True
            continue
        if name == "filter" and not ignored:
            # After an event query, more of its condition; after a sequence, a filter over
            # its matches (a rule's `having`: EQL has dropped the sequence from its pending
            # ones whether or not the filter keeps it).
            filters.append(pipe.expression if hasattr(pipe, "expression") else pipe.arguments[0])
            continue
        if (name == "unique" and isinstance(first, eql_ast.EventQuery) and not ignored
                and not unique):
            # A rule without `by` has one key: its `unique` is EQL's, over the whole output.
            unique = list(pipe.arguments)
            continue
        why = {
            "filter": "it follows an ignored pipe, whose cut it would filter",
            "head": "a standing rule reports every match as it happens, not the first N",
            "tail": "a standing rule reports every match as it happens, not the last N",
            "sort": "matches are reported in event time as they happen",
            "unique": "it follows an ignored pipe, whose cut it would filter" if ignored else
                      "a second `unique` after the first" if unique else
                      "a sequence's unique spans its keys, a Vigil rule's `unique` is per key",
            "unique_count": "it adds to each result how many events share its values, known "
                            "only at the end of the input",
        }.get(name, "it summarises all the results of a search")
        raise parsed.error(pipe, f"pipe `| {name}` has no Vigil equivalent: {why}",
                           construct=f"pipe {name}")
    if isinstance(first, eql_ast.EventQuery):
        step = Step(first, streams_of_query(parsed, first, streams_of), [], node=first)
        return [step], filters, None, notes, unique
    if isinstance(first, eql_ast.Sequence):
        steps = []
        for sub in first.queries:
            role = "missing" if sub.data.get("is_negated") else "step"
            fork = bool(sub.data.get("fork"))
            if fork and role == "missing":
                raise parsed.error(sub, "`fork` on a missing event has no Vigil equivalent",
                                   construct="fork of a missing event")
            steps.append(_step(parsed, sub, role, streams_of))
            # The first step starts sequences; only a later one extends (and keeps) one.
            steps[-1].fork = fork and len(steps) > 1
        if first.close is not None:
            steps.append(_step(parsed, first.close, "until", streams_of))
        maxspan = None
        if first.max_span is not None:
            ms = first.max_span.as_milliseconds()
            if ms != int(ms) or ms <= 0:
                raise parsed.error(first.max_span, f"maxspan of {ms} ms: Vigil windows are "
                                   "whole milliseconds", construct="maxspan")
            maxspan = int(ms)
        return steps, filters, maxspan, notes, []
    kind = type(first).__name__.lower()
    why = {
        "join": "a join matches its events in any order; Vigil patterns are ordered",
        "sample": "a sample collects events regardless of their order or time",
    }.get(kind, "no equivalent")
    raise parsed.error(first, f"`{kind}` has no Vigil equivalent: {why}", construct=kind)


def streams_of_query(parsed: ParsedQuery, query: Any, streams_of: Callable[[str], list[str]]):
    try:
        return streams_of(query.event_type)
    except ValueError as err:
        raise parsed.error(query, str(err), construct="event category") from None


def _step(parsed: ParsedQuery, sub: Any, role: str, streams_of) -> Step:
    return Step(sub.query, streams_of_query(parsed, sub.query, streams_of),
                list(sub.join_values), role, sub)


_NULL_KEY = None  # a join key that is null for every event (EQL joins nulls as equal)


def _key_text(parsed: ParsedQuery, writer: ExpressionWriter, node: Any, folds: bool
              ) -> str | None:
    """A join key as a Vigil step key: a field, or an expression of the event's fields (a
    string folded to lower case when the dialect compares keys ignoring case, as the
    package's engine does); :data:`_NULL_KEY` for EQL's ``length()`` of a number, null for
    every event."""
    args = getattr(node, "arguments", ())
    if isinstance(node, eql_ast.FunctionCall) and node.name == "length" and len(args) == 1 \
            and not isinstance(args[0], eql_ast.String) \
            and writer.value(args[0]).type in ("int", "float", "number", "bool"):
        return _NULL_KEY
    value = writer.value(node)
    if value.type is None:
        return _NULL_KEY  # null for every event (arithmetic on a string field, a null literal)
    if isinstance(node, eql_ast.Field) and value.type != "json":
        text = field_name(parsed, node)
    else:
        text = value.text
    return f"lower({text})" if folds and value.type == "string" else text


def write_rule(
    parsed: ParsedQuery,
    header: RuleHeader,
    steps: list[Step],
    filters: list[Any],
    maxspan: int | None,
    notes: list[str],
    types: FieldTypes,
    case_insensitive: Callable[[Any], bool],
    folds_keys: bool,
    unique: list[Any] = (),
) -> ImportedRule:
    """The Vigil text of one translated query (types must already be inferred)."""
    streams: list[str] = []
    for step in steps:
        for s in step.streams:
            if s not in streams:
                streams.append(s)
    fields: dict[str, set[str]] = {s: set() for s in streams}

    def writer_for(step: Step) -> ExpressionWriter:
        return ExpressionWriter(parsed, case_insensitive, lambda name: types.of(step.streams[0],
                                                                                name))

    def condition_of(step: Step, extra: list[Any] = ()) -> Condition:
        writer = writer_for(step)
        conditions = [writer.condition(step.query.query)]
        conditions += [writer.condition(f) for f in extra]
        for s in step.streams:
            fields[s] |= writer.fields_read
        if len(conditions) == 1:
            return conditions[0]
        return Condition(join_terms(" and ", [c.true for c in conditions]),
                         join_terms(" or ", [c.false for c in conditions]))

    lines = [f"rule {header.name}" + (f" {quote(header.title)}" if header.title else "")]
    lines.append(f"  from {', '.join(streams)}")
    if len(steps) == 1 and steps[0].role == "step":
        step = steps[0]
        cond = condition_of(step, filters)
        lines.append("  pattern e")
        lines.append(f"  define e as {cond.true}")
        if unique:
            lines.append("  unique " + ", ".join(_unique_terms(writer_for(step), step, unique,
                                                               fields)))
    else:
        lines += _sequence_lines(parsed, steps, maxspan, types, condition_of, fields,
                                 folds_keys)
        if filters:
            having = _sequence_filter(parsed, steps, filters, types, fields, case_insensitive)
            lines.append(f"  having {having}")
    if header.severity:
        lines.append(f"  severity {header.severity}")
    if header.tags:
        lines.append("  tags " + ", ".join(quote(t) for t in header.tags))
    text = "".join(f"# {n}\n" for n in notes) + "\n".join(lines) + "\n"
    return ImportedRule(header.name, text, fields)


def _unique_terms(writer: ExpressionWriter, step: Step, nodes: list[Any],
                  fields: dict[str, set[str]]) -> list[str]:
    """The Vigil expressions of a ``unique`` pipe's: a value as such, a condition as the pair
    (holds, fails), which tells EQL's true, false and null apart."""
    terms = []
    for node in nodes:
        try:
            terms.append(writer.value(node).text)
        except EqlImportError:
            cond = writer.condition(node)
            terms += [f"({cond.true})", f"({cond.false})"]
    for s in step.streams:
        fields[s] |= writer.fields_read
    return terms


def _sequence_lines(parsed, steps, maxspan, types, condition_of, fields, folds_keys):
    ordered = [s for s in steps if s.role != "until"]
    until = next((s for s in steps if s.role == "until"), None)
    if ordered[0].role == "missing":
        raise parsed.error(ordered[0].node, "a sequence that starts with a missing event "
                           "`![...]` has no Vigil equivalent (a pattern cannot start with an "
                           "absence)", construct="leading missing event")
    if ordered[-1].role == "missing" and maxspan is None:
        raise parsed.error(ordered[-1].node, "a missing event `![...]` at the end of a sequence "
                           "needs `with maxspan=`", construct="trailing missing event")
    # Each step's join keys in Vigil; positions null for every event in every step join
    # nothing apart and are left out.
    texts: dict[int, list[str | None]] = {}
    for step in steps:
        writer = ExpressionWriter(parsed, lambda _node: False,
                                  lambda name, step=step: types.of(step.streams[0], name))
        texts[id(step)] = [_key_text(parsed, writer, k, folds_keys) for k in step.keys]
        for s in step.streams:
            fields[s] |= writer.fields_read
    width = len(ordered[0].keys)
    kept = []
    for i in range(width):
        column = [texts[id(s)][i] for s in steps]
        if all(t is _NULL_KEY for t in column):
            continue
        if any(t is _NULL_KEY for t in column):
            step = next(s for s in steps if texts[id(s)][i] is _NULL_KEY)
            raise parsed.error(step.keys[i], f"join key `{step.keys[i].render()}` is null for "
                               "every event, and another step's key in its place is not",
                               construct="null join key")
        kept.append(i)
    for step in steps:
        texts[id(step)] = [texts[id(step)][i] for i in kept]
    # Key positions every step joins on with the same field become the rule's `by`.
    shared = [i for i in range(len(kept))
              if len({texts[id(s)][i] for s in steps}) == 1
              and isinstance(ordered[0].keys[kept[i]], eql_ast.Field)
              and texts[id(ordered[0])][i] == field_name(parsed, ordered[0].keys[kept[i]])]
    rule_by = [texts[id(ordered[0])][i] for i in shared]

    def own_keys(step: Step) -> str:
        own = [k for i, k in enumerate(texts[id(step)]) if i not in shared]
        if not own:
            return ""
        return f" by {own[0]}" if len(own) == 1 else f" by ({', '.join(own)})"

    names: list[str] = []
    defines: list[str] = []
    number = 0
    until_cond = condition_of(until) if until is not None else None
    for position, step in enumerate(ordered):
        number += 1
        name = f"m{number}" if step.role == "missing" else f"s{number}"
        names.append(name)
        cond = condition_of(step)
        true = cond.true
        if until is not None and position > 0 and step.role == "step" and \
                set(until.streams) & set(step.streams):
            # EQL closes a key's pending sequences before the event can complete them.
            guard = until_cond.true
            same_key = [f"{a} == {b}" for a, b in zip(texts[id(until)], texts[id(step)],
                                                      strict=True) if a != b]
            blocked = join_terms(" and ", [guard, *same_key])
            true = join_terms(" and ", [true, f"not ({blocked})" if blocked != "false" else "true"])
        stream = step.streams[0] if len(step.streams) == 1 and len(fields) > 1 else None
        body = f"{stream} where {true}" if stream else true
        defines.append(f"{name} as {body}{own_keys(step)}")
    if until is not None:
        stream = until.streams[0] if len(until.streams) == 1 and len(fields) > 1 else None
        body = f"{stream} where {until_cond.true}" if stream else until_cond.true
        defines.append(f"u as {body}{own_keys(until)}")
    pattern: list[str] = []
    for i, (name, step) in enumerate(zip(names, ordered, strict=True)):
        if i > 0 and until is not None:
            pattern.append("!u")
        pattern.append(f"!{name}" if step.role == "missing" else name)
    lines = []
    if rule_by:
        lines.append(f"  by {', '.join(rule_by)}")
    lines.append(f"  pattern {' '.join(pattern)}")
    forks = [name for name, step in zip(names, ordered, strict=True) if step.fork]
    if forks:
        lines.append(f"  contiguity any for {', '.join(forks)}")
    lines.append("  partials latest")
    lines.append("  define " + ",\n         ".join(defines))
    if maxspan is not None:
        lines.append(f"  within {duration_text(maxspan)}")
    lines.append("  after match no skip")
    return lines


def _sequence_filter(parsed: ParsedQuery, steps: list[Step], filters: list[Any],
                     types: FieldTypes, fields: dict[str, set[str]],
                     case_insensitive: Callable[[Any], bool]) -> str:
    """The ``having`` of a sequence's ``filter`` pipes: ``events[i]`` is the i-th event the
    sequence binds (its steps but the missing ones and ``until``), read through the variable
    :func:`_sequence_lines` gives that step."""
    ordered = [s for s in steps if s.role != "until"]
    bound = [(f"s{number}", step) for number, step in enumerate(ordered, 1)
             if step.role == "step"]
    events = tuple((name, _types_of(types, step), set()) for name, step in bound)
    writer = ExpressionWriter(parsed, case_insensitive, lambda name: "string", events=events)
    having = join_terms(" and ", [writer.condition(f).true for f in filters])
    for (_, step), (_, _, read) in zip(bound, events, strict=True):
        for s in step.streams:
            fields[s] |= read
    return having


def _types_of(types: FieldTypes, step: Step) -> Callable[[str], str]:
    return lambda name: types.of(step.streams[0], name)


class _FromOneEvent(RecursiveWalker):
    """A sequence's filter as seen from its event ``index``: ``events[index].f`` as the field
    ``f``, the other events' fields as null (what type inference over one step reads)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def _walk_field(self, node: eql_ast.Field) -> Any:
        path = list(node.path)
        if node.base == "events" and path and isinstance(path[0], int):
            if path[0] == self.index and len(path) > 1 and isinstance(path[1], str):
                return eql_ast.Field(path[1], path[2:])
            return eql_ast.Null()
        return node


def infer_step_types(parsed: ParsedQuery, steps: list[Step], filters: list[Any],
                     types: FieldTypes, unique: list[Any] = ()) -> None:
    """Note the field types the conditions of ``steps`` (and ``filters``, and ``unique``'s
    expressions) imply."""
    for step in steps:
        infer_types(parsed, step.query.query, step.streams, types)
        for key in step.keys:
            if not isinstance(key, eql_ast.Field):  # `by pid * 2`: pid is a number
                infer_types(parsed, key, step.streams, types)
    if isinstance(parsed.query.first, eql_ast.Sequence):
        bound = [s for s in steps if s.role == "step"]
        for f in filters:
            for index, step in enumerate(bound):
                infer_types(parsed, _FromOneEvent(index).walk(f), step.streams, types)
        return
    # A bare field in `unique` is a value of any type, not a boolean condition.
    for f in [*filters, *(u for u in unique if not isinstance(u, eql_ast.Field))]:
        infer_types(parsed, f, steps[0].streams, types)


