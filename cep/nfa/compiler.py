"""Compiles a ``rule`` declaration into an immutable NFA with TAKE / IGNORE / PROCEED semantics.

The pattern regex is expanded (bounded quantifiers unrolled), built into a Thompson ε-NFA whose
ε-edges are ordered by backtracking preference and may carry negation guards (``!x``), and then
reduced to *letters* (one per variable occurrence, a TAKE edge) with the ordered ε-closure
(PROCEED edges) after each letter precomputed. The per-key mutable state lives in
:mod:`cep.nfa.runtime`; one :class:`CompiledRule` is shared by every key and thread.
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

from cep.events.event import EngineError
from query_lang import ast
from query_lang import compiler as expressions

__all__ = [
    "DEFAULT_MAX_PARTIALS",
    "BatchCondition",
    "ClosureItem",
    "CompiledRule",
    "Condition",
    "Letter",
    "RuleCompileError",
    "compile_rule",
    "prev_column",
]

#: Default cap on partial matches per (rule, key); see docs/semantics.md for the measurement.
DEFAULT_MAX_PARTIALS = 2_000

#: Upper bound on letters after unrolling ``{n,m}``; keeps a typo like ``{1,100000}`` from
#: exhausting memory at compile time.
MAX_LETTERS = 4096

TAIL_NONE = 0
TAIL_GREEDY = 1
TAIL_RELUCTANT = 2

AGGREGATES = frozenset({"count", "sum", "avg", "min", "max"})


class RuleCompileError(EngineError, ValueError):
    """A rule cannot be compiled into an NFA (bad pattern structure, missing condition ...).

    A language error (it renders with file, line and caret like every ``VigilError``) that the
    engine's ``EngineError`` handlers also catch.
    """


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
    """

    evaluate: Callable[[pd.DataFrame], np.ndarray]
    reads: tuple[tuple[str, int], ...]


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

    @property
    def reads_prev(self) -> bool:
        return self.prev_depth > 0

    @property
    def current_only(self) -> bool:
        """True when the columnar form (or the absence of a predicate) decides exactly."""
        return not self.reads_variables and not self.reads_prev and (
            self.predicate is None or self.columnar is not None
        )


@dataclass(frozen=True)
class Letter:
    """One occurrence of a variable in the expanded pattern: a TAKE edge.

    ``tail`` says whether the occurrence lies inside a trailing quantifier of the pattern
    (greedy or reluctant), which decides when a match that could still grow is reported.
    ``place`` is the variable's place in the pattern text (:attr:`CompiledRule.places`): the
    copies of one place made by unrolling ``{n,m}`` share it, two places of ``a b a`` do not.
    """

    index: int
    var: int
    place: int
    tail: int = TAIL_NONE


@dataclass(frozen=True)
class ClosureItem:
    """An entry of an ordered ε-closure: a TAKE of ``letter`` or reaching ACCEPT (letter -1).

    ``guards`` are the negations the PROCEED path crosses: the path is valid only when no event
    since the last TAKE satisfied one of them.
    """

    letter: int
    guards: frozenset[int] = frozenset()

    @property
    def is_accept(self) -> bool:
        return self.letter < 0


@dataclass
class _Node:
    eps: list[tuple[int, int | None]] = field(default_factory=list)
    take: tuple[int, int] | None = None
    accept: bool = False
    #: Entry (``opens``) and exit (``closes``) of an iteration beyond a quantifier's minimum
    #: whose body may match nothing: a PROCEED path may not cross both (an empty iteration).
    opens: int = -1
    closes: int = -1


@dataclass(frozen=True)
class StateSummary:
    """What the runtime needs to know about a set of letters (a partial match's position)."""

    takes: dict[int, tuple[tuple[int, frozenset[int]], ...]]  # place -> (letter, guards) ...
    accepts: tuple[frozenset[int], ...]
    guards: frozenset[int]
    greedy_tail_take: bool


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
    key_fields: dict[str, tuple[str, ...]]
    key_names: tuple[str, ...]
    var_keys: dict[str, tuple[str, ...]]
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
    _summaries: dict = field(default_factory=dict, repr=False)
    #: Bits of variables whose columnar mask bit is exact (no row-wise check needed).
    pure_bits: int = field(default=0, init=False)
    #: Some variable is named at more than one place of the pattern.
    reuses_variables: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        bits = 0
        for i, cond in enumerate(self.conditions):
            if cond.current_only:
                bits |= 1 << i
        object.__setattr__(self, "pure_bits", bits)
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
        rule_part = len(self.key_names) - len(next(iter(self.var_keys.values())))
        for var, names in self.var_keys.items():
            cond = self.conditions[self.variables.index(var)]
            if cond.stream is not None and cond.stream != stream:
                continue
            key = base[:rule_part] + tuple(fields.get(f) for f in names)
            if key not in keys:
                keys.append(key)
        return keys


# ---------------------------------------------------------------- pattern structure


def _nullable(p: ast.Pattern) -> bool:
    if isinstance(p, ast.PatVar):
        return False
    if isinstance(p, ast.PatAbsent):
        return True
    if isinstance(p, ast.PatSeq):
        return all(_nullable(i) for i in p.items)
    if isinstance(p, ast.PatAlt):
        return any(_nullable(o) for o in p.options)
    return p.min == 0 or _nullable(p.inner)


def _occurrences(p: ast.Pattern) -> list[tuple[str, bool, ast.Span]]:
    """Each variable occurrence in text order: ``(name, bound (not ``!x``), span)``."""
    return [
        (node.name, isinstance(node, ast.PatVar), node.span)
        for node in ast.walk(p)
        if isinstance(node, ast.PatVar | ast.PatAbsent)
    ]


def _check_negations(p: ast.Pattern) -> None:
    """``!x`` must follow an element of its own sequence: it may not start a pattern."""
    if isinstance(p, ast.PatAbsent):
        raise RuleCompileError(
            f"negation !{p.name} must follow another pattern element (it may not start a "
            "pattern or stand alone)",
            p.span,
        )
    if isinstance(p, ast.PatSeq):
        for i, item in enumerate(p.items):
            if isinstance(item, ast.PatAbsent):
                if i == 0 or all(isinstance(x, ast.PatAbsent) for x in p.items[:i]):
                    raise RuleCompileError(
                        f"negation !{item.name} must follow another pattern element "
                        "(it may not start a pattern or a group)",
                        item.span,
                    )
            else:
                _check_negations(item)
    elif isinstance(p, ast.PatAlt):
        for o in p.options:
            _check_negations(o)
    elif isinstance(p, ast.PatQuant):
        _check_negations(p.inner)


def _placed(p: ast.Pattern, names: list[str]) -> ast.Pattern:
    """``p`` with each variable occurrence renamed to its place (``a b a`` -> ``a#0 b#1 a#2``).

    ``names`` collects the original name of each place, in text order (the order in which
    :func:`query_lang.ast.transform` meets the occurrences).
    """

    def place(node: ast.Node) -> ast.Node:
        if isinstance(node, ast.PatVar | ast.PatAbsent):
            names.append(node.name)
            return dataclasses.replace(node, name=f"{node.name}#{len(names) - 1}")
        return node

    return ast.transform(p, place)


class _Builder:
    """Thompson construction with preference-ordered ε-edges and tail tagging.

    It builds a pattern whose names are places (:func:`_placed`): ``places[name]`` gives the
    place's number and its variable.
    """

    def __init__(self, places: Mapping[str, tuple[int, int]]):
        self.nodes: list[_Node] = []
        self.letters: list[Letter] = []
        self.guards: list[int] = []
        self.targets: list[int] = []
        self.places = places
        self.iterations = 0

    def node(self) -> int:
        self.nodes.append(_Node())
        return len(self.nodes) - 1

    def build(
        self, p: ast.Pattern, trailing: bool, tag: int, inside: bool = False
    ) -> tuple[int, int]:
        """Build ``p``; ``inside`` means within a trailing quantifier tagged ``tag``."""
        if isinstance(p, ast.PatVar):
            s, t = self.node(), self.node()
            if len(self.letters) >= MAX_LETTERS:
                raise RuleCompileError(
                    f"pattern too large after expanding quantifiers (more than {MAX_LETTERS} "
                    "steps); use smaller {n,m} bounds",
                    p.span,
                )
            place, var = self.places[p.name]
            self.letters.append(
                Letter(
                    len(self.letters), var, place, tag if (trailing or inside) else TAIL_NONE
                )
            )
            self.nodes[s].take = (len(self.letters) - 1, t)
            self.targets.append(t)
            return s, t
        if isinstance(p, ast.PatAbsent):
            s, t = self.node(), self.node()
            self.guards.append(self.places[p.name][1])
            self.nodes[s].eps.append((t, len(self.guards) - 1))
            return s, t
        if isinstance(p, ast.PatSeq):
            entry = cur = self.node()
            items = p.items
            last_absent = max(
                (i for i, it in enumerate(items) if isinstance(it, ast.PatAbsent)), default=-1
            )
            for i, item in enumerate(items):
                item_trailing = (
                    trailing and i > last_absent and all(_nullable(x) for x in items[i + 1:])
                )
                a, b = self.build(item, item_trailing, tag, inside)
                self.nodes[cur].eps.append((a, None))
                cur = b
            return entry, cur
        if isinstance(p, ast.PatAlt):
            s, t = self.node(), self.node()
            for option in p.options:
                a, b = self.build(option, trailing, tag, inside)
                self.nodes[s].eps.append((a, None))
                self.nodes[b].eps.append((t, None))
            return s, t
        return self._quantifier(p, trailing, tag, inside)

    def _quantifier(
        self, p: ast.PatQuant, trailing: bool, tag: int, inside: bool
    ) -> tuple[int, int]:
        """``inner{min,max}`` as ``min`` copies, then a loop or nested optional copies.

        The whole quantifier (every copy) carries its tail tag, so a match extended by any of
        its iterations counts as the same trailing quantifier growing.
        """
        variable = p.max is None or p.max != p.min
        if trailing and tag == TAIL_NONE and variable:
            tag = TAIL_GREEDY if p.greedy else TAIL_RELUCTANT
            inside = True
        inner_nullable = _nullable(p.inner)
        entry = cur = self.node()
        for i in range(p.min):
            last_mandatory = i == p.min - 1
            copy_trailing = trailing and (last_mandatory or inner_nullable)
            a, b = self.build(p.inner, copy_trailing, tag, inside)
            self.nodes[cur].eps.append((a, None))
            cur = b
        if p.max is None:
            loop, out = self.node(), self.node()
            a, b = self.build(p.inner, trailing, tag, inside)
            self._non_empty(a, b, inner_nullable)
            self._choice(loop, a, out, p.greedy)
            self.nodes[b].eps.append((loop, None))
            self.nodes[cur].eps.append((loop, None))
            return entry, out
        out = self.node()
        for _ in range(p.max - p.min):
            a, b = self.build(p.inner, trailing, tag, inside)
            self._non_empty(a, b, inner_nullable)
            self._choice(cur, a, out, p.greedy)
            cur = b
        self.nodes[cur].eps.append((out, None))
        return entry, out

    def _non_empty(self, entry: int, exit_: int, nullable: bool) -> None:
        """Forbid an empty pass from ``entry`` to ``exit_`` (an optional iteration).

        Beyond its minimum, an iteration of a quantifier must take an event
        (docs/semantics.md, "Empty iterations"); the mandatory copies may match nothing.
        """
        if nullable:
            self.nodes[entry].opens = self.nodes[exit_].closes = self.iterations
            self.iterations += 1

    def _choice(self, at: int, enter: int, leave: int, greedy: bool) -> None:
        first, second = (enter, leave) if greedy else (leave, enter)
        self.nodes[at].eps.extend([(first, None), (second, None)])

    def closure(self, start: int) -> tuple[ClosureItem, ...]:
        """The ordered PROCEED closure of a node: TAKE and ACCEPT items in preference order."""
        out: list[ClosureItem] = []
        emitted: set[tuple[int, frozenset[int]]] = set()
        seen: set[tuple[int, frozenset[int], frozenset[int]]] = set()
        # (node, guards crossed, optional iterations entered on this path without a TAKE)
        stack: list[tuple[int, frozenset[int], frozenset[int]]] = [
            (start, frozenset(), frozenset())
        ]
        while stack:
            n, guards, entered = stack.pop()
            if (n, guards, entered) in seen:
                continue
            seen.add((n, guards, entered))
            node = self.nodes[n]
            if node.closes in entered:
                continue
            if node.opens >= 0:
                entered = entered | {node.opens}
            if node.take is not None:
                key = (node.take[0], guards)
                if key not in emitted:
                    emitted.add(key)
                    out.append(ClosureItem(node.take[0], guards))
            if node.accept:
                key = (-1, guards)
                if key not in emitted:
                    emitted.add(key)
                    out.append(ClosureItem(-1, guards))
            for target, guard in reversed(node.eps):
                stack.append(
                    (target, guards | {guard} if guard is not None else guards, entered)
                )
        return tuple(out)


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
        columnar = None
        if not reads_vars and depth == 0 and compiler.is_columnar(d.condition, scope):
            columnar = compiler.compile_columnar_predicate(d.condition, scope)
        else:
            columnar = _prefilter(compiler, d.condition, scope)
        batch = None if reads_vars else _batch_condition(compiler, d.condition, scope, columnar)
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
    )


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
    return BatchCondition(evaluate, reads)


def _prefilter(compiler: Any, expr: ast.Expr, scope: Any) -> Any:
    """A columnar necessary condition: the current-event-only conjuncts of a top-level ``and``."""
    conjuncts = expr.operands if isinstance(expr, ast.BoolOp) and expr.op == "and" else (expr,)
    parts = [
        c for c in conjuncts
        if expression_reads(c, scope.variables) == (False, 0) and compiler.is_columnar(c, scope)
    ]
    if not parts:
        return None
    necessary = parts[0] if len(parts) == 1 else ast.BoolOp("and", tuple(parts))
    return compiler.compile_columnar_predicate(necessary, scope)


def _emit_name(item: ast.EmitItem) -> str:
    if item.alias:
        return item.alias
    expr = item.expr
    if isinstance(expr, ast.FieldRef):
        return f"{expr.qualifier}.{expr.name}" if expr.qualifier else expr.name
    return item.name


def _key_layout(
    rule: ast.RuleDecl, streams: tuple[str, ...]
) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...], dict[str, tuple[str, ...]]]:
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
    var_keys = {d.var: tuple(d.keys) for d in rule.defines if d.keys}
    if var_keys:
        widths = {len(k) for k in var_keys.values()}
        if len(widths) != 1:
            first = next(d for d in rule.defines if d.keys)
            raise RuleCompileError(
                f"rule {rule.name}: every step's `by` must have the same number of fields",
                first.span,
            )
        first_keys = next(iter(var_keys.values()))
        names.extend(first_keys)
        for s in streams:
            for d in rule.defines:
                if d.keys and (d.stream is None or d.stream == s):
                    key_fields[s].extend(d.keys)
                    break
    return {s: tuple(f) for s, f in key_fields.items()}, tuple(names), var_keys


def compile_rule(
    rule: ast.RuleDecl,
    *,
    lists: Mapping[str, Any] | None = None,
    search: Callable[..., Any] | None = None,
    version: int = 1,
    streams: Mapping[str, ast.StreamDecl] | None = None,
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
        unknown ``skip to`` variable, ...).

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
    _check_negations(rule.pattern)
    occ = _occurrences(rule.pattern)
    order: list[str] = []
    for name, _, _ in occ:
        if name not in order:
            order.append(name)
    for d in rule.defines:
        if d.var not in order:
            raise RuleCompileError(
                f"rule {rule.name}: variable {d.var} is defined but not used in the pattern",
                d.span,
            )
    if len(order) > 62:
        raise RuleCompileError(f"rule {rule.name}: more than 62 pattern variables", rule.span)
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
    placed = _placed(rule.pattern, place_names)
    places = tuple(var_index[n] for n in place_names)
    builder = _Builder({f"{n}#{k}": (k, var_index[n]) for k, n in enumerate(place_names)})
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
    key_fields, key_names, var_keys = _key_layout(rule, rule_streams)
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
    )

