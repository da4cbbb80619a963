"""Compiles a ``rule`` declaration into an immutable NFA with TAKE / IGNORE / PROCEED semantics:
the pattern's automaton (:mod:`cep.nfa.automaton`), the ``define`` conditions (row-wise,
column-wise and batch forms), ``emit``, the key layout and the rule's fingerprint. The per-key
mutable state lives in :mod:`cep.nfa.state`; one :class:`CompiledRule` is shared by every key
and thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cep.nfa.automaton import (
    TAIL_GREEDY,
    TAIL_NONE,
    ClosureItem,
    Letter,
    PatternBuilder,
    StateSummary,
    check_negations,
    pattern_occurrences,
    with_places,
)
from cep.nfa.errors import RuleCompileError
from query_lang import ast
from query_lang import compiler as expressions
from query_lang.limits import pattern_variables, rule_limit_errors

__all__ = [
    "DEFAULT_MAX_PARTIALS",
    "BatchCondition",
    "CompiledRule",
    "Condition",
    "RELEASE_TIME_COLUMN",
    "ReleaseCondition",
    "compile_rule",
    "prev_column",
]

RELEASE_TIME_COLUMN = "event time"
"""The column of a frame given to :attr:`ReleaseCondition.evaluate` that holds each row's event
time (ms), as of which its lookups read their tables. No declared field has this name (a field
name has no space)."""

#: Default cap on partial matches per (rule, key); see docs/semantics.md for the measurement.
DEFAULT_MAX_PARTIALS = 2_000

AGGREGATES = frozenset({"count", "sum", "avg", "min", "max"})


def prev_column(name: str, n: int) -> str:
    """The column that holds ``prev(name, n)`` in a frame given to :class:`BatchCondition`."""
    return f"\0prev{n}\0{name}"


@dataclass(frozen=True)
class BatchCondition:
    """An exact column-wise form of a condition that reads the current event and ``prev``.

    Attributes
    ----------
    evaluate:
        ``fn(DataFrame) -> bool ndarray``, equal row by row to the predicate. The frame holds
        the current event's fields and, for each ``(f, n)`` of :attr:`reads` with ``n > 0``,
        the column :func:`prev_column` ``(f, n)``: field ``f`` of the n-th previous event of the
        partition, null before the first event.
    reads:
        ``(field, n)`` pairs the evaluation reads: ``n == 0`` for the current event.
    text:
        The condition's text when it reads nothing but the event's fields and ``prev`` (no
        list, table or search): equal texts over the same streams give equal results, so
        rules alike evaluate them once. None otherwise.
    """

    evaluate: Callable[[pd.DataFrame], np.ndarray]
    reads: tuple[tuple[str, int], ...]
    text: str | None = None


@dataclass(frozen=True)
class ReleaseCondition:
    """A column-wise necessary condition over the current event that reads tables: the
    conjuncts of a condition's top-level ``and`` that read only the current event and its
    tables (``lookup``), evaluated over the events a release hands to the rules — when the
    tables stand as the row-wise predicate will read them — so that an event it rules out
    never reaches its key's automaton.

    Attributes
    ----------
    evaluate:
        ``fn(DataFrame) -> bool ndarray``: false where the condition cannot hold. The frame
        holds the fields of :attr:`reads` and :data:`RELEASE_TIME_COLUMN`.
    reads:
        The current event's fields the evaluation reads.
    text:
        The conjuncts' text: equal texts over the same streams are evaluated once.
    """

    evaluate: Callable[[pd.DataFrame], np.ndarray]
    reads: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Condition:
    """What an event must satisfy to bind to (or, for ``!x``, to violate) a variable.

    Attributes
    ----------
    predicate:
        ``fn(event_fields, ctx) -> bool``; ``None`` means any event (an undefined variable).
    columnar:
        ``fn(DataFrame) -> bool ndarray``, a *necessary* condition over the current event: a
        row where it is false cannot fit. It decides the condition exactly when the predicate
        reads neither earlier variables nor ``prev`` (:attr:`current_only`); otherwise it is
        the columnar conjuncts of a top-level ``and`` (a prefilter), or None.
    stream:
        ``v as STREAM``: the event must belong to this stream.
    reads_variables:
        The predicate reads earlier bindings (``a.f``, ``last(v).f``, aggregates).
    prev_depth:
        Largest ``n`` of a ``prev(f, n)`` the predicate reads (0: none).
    reads_tables:
        The predicate reads a table (``lookup``), as of the event's time: never column-wise
        on arrival (the table may still change before the event's time is final).
    at_release:
        For a predicate that reads tables, its current-event conjuncts (lookups included) in
        column-wise form, evaluated when events are released (None: no such conjunct).
    batch:
        The exact column-wise form over the current event and ``prev`` (None when the
        predicate reads earlier variables or an expression has no column-wise form); used by
        the strict-contiguity scan (:mod:`cep.nfa.strict`).
    """

    predicate: Callable[[Mapping[str, Any], Any], bool] | None = None
    columnar: Callable[[pd.DataFrame], np.ndarray] | None = None
    stream: str | None = None
    reads_variables: bool = False
    prev_depth: int = 0
    batch: BatchCondition | None = None
    columnar_text: str | None = None
    reads_tables: bool = False
    at_release: ReleaseCondition | None = None

    @property
    def reads_prev(self) -> bool:
        return self.prev_depth > 0

    @property
    def current_only(self) -> bool:
        """True when the columnar form (or the absence of a predicate) decides exactly."""
        return not self.reads_variables and not self.reads_prev and not self.reads_tables and (
            self.predicate is None or self.columnar is not None
        )


@dataclass(frozen=True, eq=False)
class CompiledRule:
    """An immutable compiled rule, shared across keys and threads.

    A partial match binds events to *places*: the occurrences of variables in the pattern
    text, numbered in text order (``!x`` included). ``places[k]`` is the variable of place
    ``k``; a pattern that names each variable once has ``places == (0, 1, 2, ...)``. Conditions,
    emitted events and skip targets are per variable: a variable named at several places
    binds the events of all of them.

    Only ``_summaries`` is mutated after construction: it memoises :meth:`summary` and the
    runtime's lookup tables, never changing a result, so sharing is safe.
    """

    name: str
    version: int
    severity: str
    streams: tuple[str, ...]
    #: Per stream, the fields of the rule's own ``by`` (with steps that have their own ``by``,
    #: the part every key of an event shares: events equal on it may be split further).
    key_fields: dict[str, tuple[str, ...]]
    #: The names of a key's parts: the rule's ``by``, then the steps' own ``by``.
    key_names: tuple[str, ...]
    #: Variable with its own ``by`` -> its key parts' names (fields or expressions' text).
    var_keys: dict[str, tuple[str, ...]]
    #: Variable with its own ``by`` -> its key parts' values of an event's fields.
    var_key_values: dict[str, Callable[[Mapping[str, Any]], tuple]]
    within_ms: int | None
    needs_every_event: bool
    contiguity: str
    partials: str
    skip: str
    skip_var: int | None
    max_partials: int
    variables: tuple[str, ...]
    conditions: tuple[Condition, ...]
    bound_vars: frozenset[int]
    places: tuple[int, ...]
    letters: tuple[Letter, ...]
    guards: tuple[int, ...]
    start: tuple[ClosureItem, ...]
    after: tuple[tuple[ClosureItem, ...], ...]
    prev_depth: int
    emit: tuple[tuple[str, Callable[[Mapping[str, Any], Any], Any]], ...] | None
    pattern: ast.Pattern
    fingerprint: bytes
    #: Stream -> its declared field names: what names an event in a ``match_id``
    #: (:func:`cep.events.identity.event_digest`); ``None``: compiled without declarations.
    identity_fields: Mapping[str, tuple[str, ...]] | None = None
    #: ``contiguity any for v``: indexes of the variables a partial match may take an event as
    #: and also stay as it was (relaxed otherwise).
    any_vars: frozenset[int] = frozenset()
    #: ``unique``: the expressions whose values a reported match must not share with an
    #: earlier match of its key (``fn(fields, ctx)`` as ``emit``), and for how long (ms of
    #: event time; ``None``: for ever). ``None``: every match is reported.
    unique: tuple[Callable[[Mapping[str, Any], Any], Any], ...] | None = None
    unique_ms: int | None = None
    #: ``having``: whether a match is reported (``fn(fields, ctx)`` as ``emit``), applied
    #: before ``unique``; ``None``: every match is.
    having: Callable[[Mapping[str, Any], Any], bool] | None = None
    _summaries: dict = field(default_factory=dict, repr=False)
    #: Bits of variables whose columnar mask bit is exact (no row-wise check needed).
    pure_bits: int = field(default=0, init=False)
    #: Some variable is named at more than one place of the pattern.
    reuses_variables: bool = field(default=False, init=False)
    #: ``(bit, release form)`` of each condition that reads a table and has one.
    at_release: tuple[tuple[int, ReleaseCondition], ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        bits = 0
        for i, cond in enumerate(self.conditions):
            if cond.current_only:
                bits |= 1 << i
        object.__setattr__(self, "pure_bits", bits)
        object.__setattr__(self, "at_release", tuple(
            (i, cond.at_release) for i, cond in enumerate(self.conditions)
            if cond.at_release is not None
        ))
        object.__setattr__(self, "reuses_variables", len(set(self.places)) < len(self.places))

    def summary(self, letters: tuple[int, ...]) -> StateSummary:
        """Takes, accepts and guards reachable from a set of letters (-1 stands for START)."""
        found = self._summaries.get(letters)
        if found is not None:
            return found
        takes: dict[int, list[tuple[int, frozenset[int]]]] = {}
        accepts: list[frozenset[int]] = []
        guards: set[int] = set()
        greedy_tail = False
        seen: set[tuple[int, frozenset[int]]] = set()
        for src in letters:
            items = self.start if src < 0 else self.after[src]
            for item in items:
                if (item.letter, item.guards) in seen:
                    continue
                seen.add((item.letter, item.guards))
                guards |= item.guards
                if item.is_accept:
                    accepts.append(item.guards)
                    continue
                letter = self.letters[item.letter]
                takes.setdefault(letter.place, []).append((item.letter, item.guards))
                greedy_tail = greedy_tail or letter.tail == TAIL_GREEDY
        result = StateSummary(
            takes={v: tuple(ts) for v, ts in takes.items()},
            accepts=tuple(accepts),
            guards=frozenset(guards),
            greedy_tail_take=greedy_tail,
            targets={v: tuple(sorted({letter for letter, _ in ts})) for v, ts in takes.items()},
        )
        self._summaries[letters] = result
        return result

    def columnar_mask(self, df: pd.DataFrame) -> np.ndarray:
        """Per-row int64 bitmask: bit i set when variable i may fit the row.

        For conditions that read earlier variables or ``prev`` the bit means "check row-wise":
        it is cleared only where a columnar conjunct of the condition is false. A row whose
        mask is 0 fits no variable (nor any negation) and, unless
        :attr:`needs_every_event`, may be skipped without per-event Python.
        """
        n = len(df)
        mask = np.zeros(n, dtype=np.int64)
        # Without a stream column the stream test is left to the runtime (the bit stays set).
        streams = df["stream"].to_numpy() if "stream" in df.columns else None
        for i, cond in enumerate(self.conditions):
            fits = np.ones(n, dtype=bool)
            if cond.stream is not None and streams is not None:
                fits &= streams == cond.stream
            if cond.predicate is not None and cond.columnar is not None:
                fits &= np.asarray(cond.columnar(df), dtype=bool)
            mask |= fits.astype(np.int64) << np.int64(i)
        return mask

    def keys_of(self, stream: str, fields: Mapping[str, Any]) -> list[tuple]:
        """Every partition key an event belongs to (several with per-variable ``by``)."""
        base = tuple(fields.get(f) for f in self.key_fields.get(stream, ()))
        if not self.var_keys:
            return [base]
        keys: list[tuple] = []
        for var, values in self.var_key_values.items():
            cond = self.conditions[self.variables.index(var)]
            if cond.stream is not None and cond.stream != stream:
                continue
            key = base + values(fields)
            if key not in keys:
                keys.append(key)
        return keys


# ---------------------------------------------------------------- expressions


def expression_reads(expr: ast.Expr | None, variables: frozenset[str]) -> tuple[bool, int]:
    """Whether an expression reads pattern variables, and its deepest ``prev`` (0: none)."""
    if expr is None:
        return False, 0
    reads_vars = False
    depth = 0
    for node in ast.walk(expr):
        if isinstance(node, ast.FieldRef) and node.qualifier in variables:
            reads_vars = True
        elif isinstance(node, ast.VarField):
            reads_vars = True
        elif isinstance(node, ast.Call) and node.func in AGGREGATES:
            reads_vars = True
        elif isinstance(node, ast.Prev):
            depth = max(depth, node.n)
    return reads_vars, depth


def _define_condition(
    d: ast.Define, rule: ast.RuleDecl, variables: frozenset[str], scope: Any
) -> Condition:
    reads_vars, depth = expression_reads(d.condition, variables)
    if d.condition is None:
        return Condition(stream=d.stream)
    compiler = expressions
    try:
        predicate = compiler.compile_predicate(d.condition, scope)
        columnar, necessary = None, None
        if not reads_vars and depth == 0 and compiler.is_columnar(d.condition, scope):
            columnar = compiler.compile_columnar_predicate(d.condition, scope)
            necessary = d.condition
        else:
            columnar, necessary = _prefilter(compiler, d.condition, scope)
        batch = None if reads_vars else _batch_condition(compiler, d.condition, scope, columnar)
        reads_tables = any(isinstance(n, ast.Lookup) for n in ast.walk(d.condition))
        at_release = _release_condition(compiler, d.condition, scope) if reads_tables else None
    except compiler.CompileError as exc:
        raise RuleCompileError(
            f"rule {rule.name}: condition of {d.var}: {getattr(exc, 'message', exc)}",
            getattr(exc, "span", None) or d.span,
        ) from exc
    return Condition(
        predicate=predicate,
        columnar=columnar,
        stream=d.stream,
        reads_variables=reads_vars,
        prev_depth=depth,
        batch=batch,
        columnar_text=None if necessary is None else ast.print_expr(necessary),
        reads_tables=reads_tables,
        at_release=at_release,
    )


def _release_condition(compiler: Any, expr: ast.Expr, scope: Any) -> ReleaseCondition | None:
    """The current-event conjuncts of ``expr`` that read a table, column-wise with each row
    read as of :data:`RELEASE_TIME_COLUMN`; None when no conjunct reads one."""
    release_scope = dataclasses.replace(scope, time_column=RELEASE_TIME_COLUMN)
    evaluate, necessary = _prefilter(compiler, expr, release_scope)
    if necessary is None or not any(isinstance(n, ast.Lookup) for n in ast.walk(necessary)):
        return None
    reads = tuple(sorted(compiler.referenced_fields(necessary, release_scope)))
    return ReleaseCondition(evaluate, reads, ast.print_expr(necessary))


def _without_prev(expr: ast.Expr) -> ast.Expr:
    """``expr`` with every ``prev(f, n)`` replaced by a read of the column ``prev_column(f, n)``."""

    def column(node: ast.Node) -> ast.Node:
        if isinstance(node, ast.Prev):
            return ast.FieldRef(prev_column(node.name, node.n), None, node.span)
        return node

    return ast.transform(expr, column)


def _batch_condition(
    compiler: Any, expr: ast.Expr, scope: Any, columnar: Any
) -> BatchCondition | None:
    """The exact column-wise form of a condition over the current event and ``prev``."""
    rewritten = _without_prev(expr)
    if not compiler.is_columnar(rewritten, scope):
        return None
    prev_names = {}
    for node in ast.walk(expr):
        if isinstance(node, ast.Prev):
            prev_names[prev_column(node.name, node.n)] = (node.name, node.n)
    reads = tuple(
        sorted(prev_names.get(f, (f, 0)) for f in compiler.referenced_fields(rewritten, scope))
    )
    evaluate = (
        columnar
        if columnar is not None and not prev_names
        else compiler.compile_columnar_predicate(rewritten, scope)
    )
    named = any(isinstance(n, ast.InList | ast.Lookup | ast.Search) for n in ast.walk(expr))
    return BatchCondition(evaluate, reads, None if named else ast.print_expr(expr))


def _prefilter(compiler: Any, expr: ast.Expr, scope: Any) -> tuple[Any, ast.Expr | None]:
    """A columnar necessary condition: the current-event-only conjuncts of a top-level ``and``
    (compiled, and as an expression)."""
    conjuncts = expr.operands if isinstance(expr, ast.BoolOp) and expr.op == "and" else (expr,)
    parts = [
        c for c in conjuncts
        if expression_reads(c, scope.variables) == (False, 0) and compiler.is_columnar(c, scope)
    ]
    if not parts:
        return None, None
    necessary = parts[0] if len(parts) == 1 else ast.BoolOp("and", tuple(parts))
    return compiler.compile_columnar_predicate(necessary, scope), necessary


def _emit_name(item: ast.EmitItem) -> str:
    if item.alias:
        return item.alias
    expr = item.expr
    if isinstance(expr, ast.FieldRef):
        return f"{expr.qualifier}.{expr.name}" if expr.qualifier else expr.name
    return item.name


def _key_layout(rule: ast.RuleDecl, streams: tuple[str, ...], scope: Any) -> tuple[
    dict[str, tuple[str, ...]], tuple[str, ...], dict[str, tuple[str, ...]],
    dict[str, Callable[[Mapping[str, Any]], tuple]],
]:
    """Per stream the fields of the rule's own ``by``; the names of a key's parts (the rule's
    ``by``, then the steps' own); per variable with its own ``by`` its parts' names and the
    function giving them from an event's fields."""
    key_fields: dict[str, list[str]] = {s: [] for s in streams}
    names: list[str] = []
    for part in rule.by:
        names.append(part.refs[0][1])
        for s in streams:
            chosen = None
            for ref_stream, ref_field in part.refs:
                if ref_stream == s:
                    chosen = ref_field
                    break
            if chosen is None:
                for ref_stream, ref_field in part.refs:
                    if ref_stream is None:
                        chosen = ref_field
                        break
            key_fields[s].append(chosen if chosen is not None else part.refs[0][1])
    keyed = [d for d in rule.defines if d.keys]
    var_keys = {d.var: d.key_names for d in keyed}
    if len({len(d.keys) for d in keyed}) > 1:
        raise RuleCompileError(
            f"rule {rule.name}: every step's `by` must have the same number of fields",
            keyed[0].span,
        )
    if keyed:
        names.extend(keyed[0].key_names)
    values: dict[str, Callable[[Mapping[str, Any]], tuple]] = {}
    for d in keyed:
        try:
            values[d.var] = _step_key_values(d.keys, scope)
        except expressions.CompileError as exc:
            raise RuleCompileError(
                f"rule {rule.name}: the key of '{d.var}': {getattr(exc, 'message', exc)}",
                getattr(exc, "span", None) or d.span,
            ) from exc
    return {s: tuple(f) for s, f in key_fields.items()}, tuple(names), var_keys, values


def _step_key_values(
    keys: tuple[ast.Expr, ...], scope: Any
) -> Callable[[Mapping[str, Any]], tuple]:
    """A step's key of an event's fields: its fields' values, or its expressions' (a list or an
    object, which no key holds, is null)."""
    if all(isinstance(k, ast.FieldRef) and k.qualifier is None for k in keys):
        names = tuple(k.name for k in keys)  # type: ignore[attr-defined]
        if len(names) == 1:
            name = names[0]
            return lambda fields: (fields.get(name),)
        return lambda fields: tuple(fields.get(n) for n in names)
    fns = tuple(expressions.compile_expr(k, scope) for k in keys)

    def values(fields: Mapping[str, Any]) -> tuple:
        return tuple(_single(fn(fields)) for fn in fns)

    return values


def _single(value: Any) -> Any:
    return None if isinstance(value, list | dict) else value


def compile_rule(
    rule: ast.RuleDecl,
    *,
    lists: Mapping[str, Any] | None = None,
    search: Callable[..., Any] | None = None,
    version: int = 1,
    streams: Mapping[str, ast.StreamDecl] | None = None,
    tables: Mapping[str, Any] | None = None,
    conditions: Mapping[str, Condition] | None = None,
    emit: Sequence[tuple[str, Callable[[Mapping[str, Any], Any], Any]]] | None = None,
    max_partials: int = DEFAULT_MAX_PARTIALS,
) -> CompiledRule:
    """Compile a rule into a shareable :class:`CompiledRule`.

    Parameters
    ----------
    rule:
        The rule's syntax tree.
    lists, search:
        Passed to the expression compiler (``in LIST`` containers, the ``search()`` hook).
    version:
        The rule's version, part of every match and its id.
    streams:
        Declared streams by name (used by the expression compiler's scope).
    tables:
        Declared tables by name (:class:`query_lang.compiler.TableReader`), for ``lookup``.
    conditions:
        Per-variable conditions that replace the compiled ``define`` expressions; used by
        tests and embedders that evaluate conditions themselves.
    emit:
        ``(name, fn(fields, ctx))`` pairs that replace the rule's compiled ``emit``.
    max_partials:
        Cap on partial matches per key; overflow drops the oldest one (counted).

    Raises
    ------
    RuleCompileError
        When the pattern is malformed (a leading ``!x``, a trailing ``!x`` without ``within``,
        unknown ``skip to`` variable, ...) or the rule is over a limit of
        :mod:`query_lang.limits` (pattern variables, steps or transitions, nesting, durations;
        with the message ``vigil check`` reports, the limit's error as its cause).

    Examples
    --------
    >>> from query_lang import parse
    >>> program = parse('''
    ... stream txn (card string, amount float, ts timestamp) time ts
    ... rule probe from txn by card pattern small big within 1h
    ...   define small as amount < 1, big as amount > 500
    ... ''')
    >>> rule = compile_rule(program.declarations[1])
    >>> rule.variables, rule.key_names, rule.within_ms
    (('small', 'big'), ('card',), 3600000)

    :func:`cep.nfa.runtime.process_event` runs it on a key's events.
    """
    if max_partials < 1:
        raise RuleCompileError(f"rule {rule.name}: max_partials must be at least 1", rule.span)
    for over in rule_limit_errors(rule):
        # The error `vigil check` reports (query_lang.limits), as this compiler's kind.
        raise RuleCompileError(over.message, over.span) from over
    check_negations(rule.pattern)
    occ = pattern_occurrences(rule.pattern)
    order = list(pattern_variables(rule.pattern))  # one mask bit each (MAX_PATTERN_VARIABLES)
    for d in rule.defines:
        if d.var not in order:
            raise RuleCompileError(
                f"rule {rule.name}: variable {d.var} is defined but not used in the pattern",
                d.span,
            )
    var_index = {v: i for i, v in enumerate(order)}
    bound = frozenset(var_index[n] for n, is_bound, _ in occ if is_bound)
    if rule.skip.kind in ("to_first", "to_last"):
        if rule.skip.var not in var_index or var_index[rule.skip.var] not in bound:
            raise RuleCompileError(
                f"rule {rule.name}: `after match skip {rule.skip.kind.replace('_', ' ')} "
                f"{rule.skip.var}` names no variable of the pattern",
                rule.skip.span,
            )
    place_names: list[str] = []
    placed = with_places(rule.pattern, place_names)
    places = tuple(var_index[n] for n in place_names)
    builder = PatternBuilder({f"{n}#{k}": (k, var_index[n]) for k, n in enumerate(place_names)})
    entry, exit_ = builder.build(placed, True, TAIL_NONE)
    builder.nodes[exit_].accept = True
    start = builder.closure(entry)
    after = tuple(builder.closure(t) for t in builder.targets)
    within = rule.within.ms if rule.within is not None else None
    if within is None and any(
        item.is_accept and item.guards for items in (start, *after) for item in items
    ):
        raise RuleCompileError(
            f"rule {rule.name}: a trailing negation (`... !x` at the end of the pattern) needs "
            "`within D`: it fires when the window closes without an x",
            rule.pattern.span,
        )
    rule_streams = tuple(rule.streams)
    names = frozenset(order)
    scope = expressions.Scope(
        streams=frozenset(streams) if streams else frozenset(rule_streams),
        variables=names,
        lists=lists or {},
        search=search,
        tables=tables or {},
    )
    conds: list[Condition] = []
    for v in order:
        if conditions is not None and v in conditions:
            conds.append(conditions[v])
            continue
        d = rule.define(v)
        if d is None:
            conds.append(Condition())
            continue
        conds.append(_define_condition(d, rule, names, scope))
    emit_fns = None
    if emit is not None:
        emit_fns = tuple(emit)
    elif rule.emit is not None:
        try:
            emit_fns = tuple(
                (_emit_name(i), expressions.compile_expr(i.expr, scope)) for i in rule.emit
            )
        except expressions.CompileError as exc:
            raise RuleCompileError(
                f"rule {rule.name}: emit: {getattr(exc, 'message', exc)}",
                getattr(exc, "span", None) or rule.span,
            ) from exc
    unique_fns = None
    if rule.unique is not None:
        try:
            unique_fns = tuple(expressions.compile_expr(e, scope) for e in rule.unique.exprs)
        except expressions.CompileError as exc:
            raise RuleCompileError(
                f"rule {rule.name}: unique: {getattr(exc, 'message', exc)}",
                getattr(exc, "span", None) or rule.span,
            ) from exc
    having_fn = None
    if rule.having is not None:
        try:
            having_fn = expressions.compile_predicate(rule.having, scope)
        except expressions.CompileError as exc:
            raise RuleCompileError(
                f"rule {rule.name}: having: {getattr(exc, 'message', exc)}",
                getattr(exc, "span", None) or rule.span,
            ) from exc
    key_fields, key_names, var_keys, var_key_values = _key_layout(rule, rule_streams, scope)
    prev_depth = max((c.prev_depth for c in conds), default=0)
    needs_every = rule.contiguity == "strict" or prev_depth > 0 or bool(builder.guards)
    skip_var = var_index[rule.skip.var] if rule.skip.kind in ("to_first", "to_last") else None
    # A pattern that names a variable at several places records them: its partial matches
    # bind places, so state written before places existed must not be read as its own.
    reuse = [list(places)] if len(set(places)) < len(places) else []
    fingerprint = hashlib.sha256(
        json.dumps(
            [
                rule.name,
                version,
                order,
                *reuse,
                [(lt.var, lt.tail) for lt in builder.letters],
                builder.guards,
                [[(i.letter, sorted(i.guards)) for i in items] for items in (start, *after)],
                rule.contiguity,
                within,
                *([sorted(rule.any_for)] if rule.any_for else []),
            ]
        ).encode()
    ).digest()[:8]
    return CompiledRule(
        name=rule.name,
        version=version,
        severity=rule.severity,
        streams=rule_streams,
        key_fields=key_fields,
        key_names=key_names,
        var_keys=var_keys,
        var_key_values=var_key_values,
        any_vars=frozenset(var_index[v] for v in rule.any_for if v in var_index),
        within_ms=within,
        needs_every_event=needs_every,
        contiguity=rule.contiguity,
        partials=rule.partials,
        skip=rule.skip.kind,
        skip_var=skip_var,
        max_partials=max_partials,
        variables=tuple(order),
        conditions=tuple(conds),
        bound_vars=bound,
        places=places,
        letters=tuple(builder.letters),
        guards=tuple(builder.guards),
        start=start,
        after=after,
        prev_depth=prev_depth,
        emit=emit_fns,
        pattern=rule.pattern,
        fingerprint=fingerprint,
        identity_fields=(
            None if streams is None
            else {s: tuple(f.name for f in streams[s].fields) for s in rule_streams if s in streams}
        ),
        unique=unique_fns,
        having=having_fn,
        unique_ms=None if rule.unique is None or rule.unique.within is None
        else rule.unique.within.ms,
    )

