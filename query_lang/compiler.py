"""Compiles Vigil expressions into evaluators: a closure over one event (given the CEP engine's
match context), and a vectorised form over a pandas batch for conditions on the current event.

Both forms share one semantics, which the property tests hold them to row by row:

* **Null** is ``None``, a missing field (or column), or a float NaN (pandas' null). Arithmetic,
  unary minus and functions of null are null; ``x / 0`` and ``x % 0`` are null.
* **Two-valued logic.** Every test with a null operand is *false*: the comparisons
  ``== != < <= > >=`` (``!=`` too), ``in``, ``between``, ``matches``, ``contains``,
  ``startswith``, ``endswith`` and ``search``. Tests never yield null, so ``not (x == 1)`` is
  *true* when ``x`` is null, unlike SQL's three-valued logic. ``is null`` is true for null. In
  a boolean context (``and``, ``or``, ``not``, a whole condition) only the boolean ``true`` is
  true; null and values of other kinds are false.
* **Kinds.** A value is a number (int or float, mixed as in Python: ``1 == 1.0``, ``7 / 2`` is
  ``3.5``, ``%`` takes the sign of the divisor), a string, a boolean (not a number), or a list
  (``list<string>`` fields). Values of different kinds never compare equal and never order;
  arithmetic across kinds is null; ``+`` also concatenates two strings. A mistyped value never
  raises: compiled predicates cannot fail on any event.
* ``a contains b`` is a substring test on strings and a membership test on a list.
  ``x matches /re/`` is an RE2 *search* (unanchored, like Python's ``re.search``): write
  ``^...$`` to match the whole string. ``x in LIST`` tests the value as it is (no conversion)
  against the list's container.
* **Time.** Timestamps and durations are integer milliseconds, so ``ts - a.ts`` is a duration
  and ``hours(d)`` is ``d / 3.6e6``. Datetime values (Python, pandas or numpy) are read as
  epoch milliseconds, a naive datetime as UTC.
* **Pattern context.** ``a.f`` and ``last(a).f`` read the last event bound to ``a``,
  ``first(a).f`` the first; they are null when nothing is bound. ``count(v)`` counts the
  events bound to ``v``; ``sum avg min max`` of ``v.f`` fold the non-null values as ``+`` and
  the comparisons would (null when there are none, or when they mix kinds).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import numpy as np
import pandas as pd
import re2

from query_lang.ast import (
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    STRING_OPS,
    Between,
    BinOp,
    BoolOp,
    Call,
    Duration,
    Expr,
    FieldRef,
    InList,
    InValues,
    IsNull,
    Literal,
    Matches,
    Neg,
    Node,
    Not,
    Prev,
    Search,
    SearchNode,
    Span,
    VarField,
)
from query_lang.errors import VigilError
from query_lang.functions import (
    METRIC_AGGREGATES,
    PATTERN_AGGREGATES,
    SCALAR_FUNCTIONS,
    ScalarFunction,
    map_distinct,
)
from query_lang.printer import print_expr

__all__ = [
    "BatchError",
    "CompileError",
    "MaskedValues",
    "MatchContext",
    "Scope",
    "SearchHook",
    "compile_columnar_predicate",
    "compile_columns",
    "compile_expr",
    "compile_masked",
    "compile_predicate",
    "history_fields",
    "is_columnar",
    "normalise_value",
    "referenced_fields",
    "value_kind",
]


# ---------------------------------------------------------------- errors


class CompileError(VigilError, ValueError):
    """An expression cannot be compiled: unknown name, wrong arguments, bad regex ...

    ``span`` says where in the source the offending node is; ``str()`` starts with
    ``file:line:column`` when it is known.
    """


class BatchError(VigilError, ValueError):
    """A batch handed to a columnar evaluator cannot be read (such as a duplicated column)."""


# ---------------------------------------------------------------- scope and match context


class MatchContext(Protocol):
    """What a condition may read beyond the current event; supplied by the CEP engine."""

    def bound(self, var: str) -> Sequence[Mapping[str, Any]]:
        """Events bound to ``var`` so far, oldest first.

        While variable ``v``'s own condition is evaluated, ``bound(v)`` already includes the
        candidate event.
        """
        ...

    def prev(self, n: int) -> Mapping[str, Any] | None:
        """The n-th previous event of the partition (1 = the one before), or None."""
        ...


SearchHook = Callable[[str, SearchNode], Callable[[Any], bool]]


@dataclass(frozen=True)
class Scope:
    """The names an expression is compiled against.

    Parameters
    ----------
    streams
        Stream names: ``txn.amount`` with ``txn`` a stream is the current event's field.
    variables
        Pattern variables of the rule: ``a.amount`` is a field of the last event bound to
        ``a``. A variable shadows a stream of the same name.
    lists
        Declared lists by name, each a container supporting ``in`` (a set, a Bloom filter).
    search
        Given a field name and a parsed search query, returns a predicate over that field's
        (non-null) value; supplied by the percolator.
    """

    streams: frozenset[str] = frozenset()
    variables: frozenset[str] = frozenset()
    lists: Mapping[str, Container[Any]] = field(default_factory=dict)
    search: SearchHook | None = None

    def __post_init__(self) -> None:
        # Accept any iterable of names (a list, a set) without letting a mutable one leak in.
        object.__setattr__(self, "streams", frozenset(self.streams))
        object.__setattr__(self, "variables", frozenset(self.variables))


# ---------------------------------------------------------------- values and their kinds

# Kinds are compared with ==, never `is`: evaluators shipped to Spark executors by cloudpickle
# carry copies of these strings.
NULL = "null"
NUM = "num"
STR = "str"
BOOL = "bool"
LIST = "list"
OTHER = "other"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def normalise_value(value: Any) -> Any:
    """The value as the expression language sees it.

    NaN, ``pd.NA`` and ``NaT`` become ``None``; numpy scalars become Python scalars; datetimes
    and timedeltas become integer milliseconds (a naive datetime is taken as UTC).

    Examples
    --------
    >>> normalise_value(float("nan")) is None, normalise_value(np.int64(3))
    (True, 3)
    >>> normalise_value(datetime(1970, 1, 1, 0, 0, 1))
    1000
    """
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is float:
        return None if value != value else value
    return _normalise_unusual(value)


def _normalise_unusual(value: Any) -> Any:
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, np.datetime64 | np.timedelta64):  # timedelta64 is an np.integer
        if np.isnat(value):
            return None
        unit = "datetime64[ms]" if isinstance(value, np.datetime64) else "timedelta64[ms]"
        return int(value.astype(unit).astype(np.int64))
    if isinstance(value, float | np.floating):
        value = float(value)
        return None if math.isnan(value) else value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, pd.Timestamp):
        return value.value // 1_000_000  # ns since the epoch in UTC, whatever its zone
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return (value - _EPOCH) // _ONE_MS
    if isinstance(value, timedelta):
        return value // _ONE_MS
    if isinstance(value, np.generic):
        return normalise_value(value.item())
    if isinstance(value, np.ndarray):  # list<string> cells from Arrow and Spark arrive so
        return normalise_value(value.tolist())
    return value


def value_kind(value: Any) -> str:
    """Kind of a normalised value: ``null num str bool list other``.

    Examples
    --------
    >>> value_kind(1), value_kind(2.5), value_kind(True), value_kind(None), value_kind(["a"])
    ('num', 'num', 'bool', 'null', 'list')
    """
    t = type(value)
    if value is None:
        return NULL
    if t is bool:
        return BOOL
    if t is int or t is float:
        return NUM
    if t is str:
        return STR
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int | float):
        return NUM
    if isinstance(value, str):
        return STR
    if isinstance(value, list | tuple):
        return LIST
    return OTHER


_ORDERED_KINDS = frozenset({NUM, STR, BOOL})


def _equal(a: Any, b: Any) -> bool | None:
    """True/False when ``a`` and ``b`` are comparable, None when either is null or kinds differ."""
    kind = value_kind(a)
    if kind == NULL or kind != value_kind(b):
        return None
    if kind in _ORDERED_KINDS:
        return a == b
    if kind == LIST:
        if len(a) != len(b):
            return False
        pairs = zip(a, b, strict=True)
        return all(_equal(normalise_value(x), normalise_value(y)) is True for x, y in pairs)
    try:
        return bool(a == b)
    except Exception:  # an arbitrary object's __eq__ may raise or return an array
        return None


def _is_equal(a: Any, b: Any) -> bool:
    return _equal(a, b) is True


def _is_unequal(a: Any, b: Any) -> bool:
    return _equal(a, b) is False


def _ordering(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def ordered(a: Any, b: Any) -> bool:
        kind = value_kind(a)
        return kind in _ORDERED_KINDS and kind == value_kind(b) and compare(a, b)

    return ordered


_COMPARE: Mapping[str, Callable[[Any, Any], bool]] = {
    "==": _is_equal,
    "!=": _is_unequal,
    "<": _ordering(operator.lt),
    "<=": _ordering(operator.le),
    ">": _ordering(operator.gt),
    ">=": _ordering(operator.ge),
}


def _arithmetic(op: str) -> Callable[[Any, Any], Any]:
    python_op = {
        "+": operator.add, "-": operator.sub, "*": operator.mul,
        "/": operator.truediv, "%": operator.mod,
    }[op]
    divides = op in ("/", "%")

    def apply(a: Any, b: Any) -> Any:
        ka = value_kind(a)
        kb = value_kind(b)
        if ka == NUM and kb == NUM:
            if divides and b == 0:
                return None
            try:
                result = python_op(a, b)
            except ArithmeticError:  # int too large for a float, float overflow
                return None
            return None if result != result else result
        if op == "+" and ka == STR and kb == STR:
            return a + b
        return None

    return apply


_ARITHMETIC: Mapping[str, Callable[[Any, Any], Any]] = {
    op: _arithmetic(op) for op in ARITHMETIC_OPS
}


def _negate(a: Any) -> Any:
    return -a if value_kind(a) == NUM else None


def _contains(a: Any, b: Any) -> bool:
    kind = value_kind(a)
    if kind == STR:
        return value_kind(b) == STR and b in a
    if kind == LIST and b is not None:
        return any(_equal(normalise_value(item), b) is True for item in a)
    return False


def _startswith(a: Any, b: Any) -> bool:
    return value_kind(a) == STR and value_kind(b) == STR and a.startswith(b)


def _endswith(a: Any, b: Any) -> bool:
    return value_kind(a) == STR and value_kind(b) == STR and a.endswith(b)


_STRING_TESTS: Mapping[str, Callable[[Any, Any], bool]] = {
    "contains": _contains, "startswith": _startswith, "endswith": _endswith,
}


def _between(x: Any, low: Any, high: Any) -> bool:
    return _COMPARE[">="](x, low) and _COMPARE["<="](x, high)


def _member(container: Container[Any], value: Any) -> bool:
    if value is None:
        return False
    try:
        return bool(value in container)
    except Exception:  # a Bloom filter or custom container may reject a value's type
        return False


def _search_test(predicate: Callable[[Any], bool], value: Any) -> bool:
    if value is None:
        return False
    try:
        return bool(predicate(value))
    except Exception:  # the percolator's predicate must not be able to fail a rule
        return False


def _regex_test(regex: Any, value: Any) -> bool:
    return value_kind(value) == STR and regex.search(value) is not None


def _call_scalar(function: ScalarFunction, *args: Any) -> Any:
    for arg, kind in zip(args, function.params, strict=True):
        if value_kind(arg) != kind:
            return None
    try:
        result = function.scalar(*args)
    except (ArithmeticError, ValueError, TypeError):  # e.g. an int too large for a float
        return None
    return normalise_value(result)


def _truth(value: Any) -> bool:
    return value is True


# ---------------------------------------------------------------- name resolution


def _is_variable_ref(ref: FieldRef, scope: Scope) -> bool:
    if ref.qualifier is None:
        return False
    if ref.qualifier in scope.variables:
        return True
    if ref.qualifier in scope.streams:
        return False
    raise CompileError(
        f"unknown name {ref.qualifier!r} in {ref.qualifier}.{ref.name}: "
        f"it is neither a stream ({_names(scope.streams)}) "
        f"nor a pattern variable ({_names(scope.variables)})",
        ref.span,
    )


def _names(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) if names else "none here"


def _require_variable(var: str, node: Node, scope: Scope, usage: str) -> None:
    if var not in scope.variables:
        raise CompileError(
            f"{usage}: {var!r} is not a pattern variable ({_names(scope.variables)})",
            node.span,
        )


@dataclass(frozen=True)
class _Aggregate:
    """A running aggregate over the events bound to a pattern variable."""

    func: str
    var: str
    field: str | None


def _pattern_aggregate(call: Call, scope: Scope) -> _Aggregate:
    """Resolve ``count(v)``, ``count(v.f)``, ``sum(v.f)`` ...; anything else is an error."""
    metric_only = CompileError(
        f"aggregate {call.func}() is only valid in metric select; in a rule condition, "
        f"aggregate the events bound to a pattern variable, such as count(v) or sum(v.amount)",
        call.span,
    )
    if call.func not in PATTERN_AGGREGATES or len(call.args) != 1:
        raise metric_only
    arg = call.args[0]
    if not isinstance(arg, FieldRef):
        raise metric_only
    if arg.qualifier is None:
        if arg.name not in scope.variables:
            raise metric_only
        if call.func != "count":
            raise CompileError(
                f"{call.func}({arg.name}) needs a field of {arg.name}, "
                f"such as {call.func}({arg.name}.amount)",
                call.span,
            )
        return _Aggregate("count", arg.name, None)
    if arg.qualifier not in scope.variables:
        _is_variable_ref(arg, scope)  # raises for unknown names
        raise metric_only
    return _Aggregate(call.func, arg.qualifier, arg.name)


def _scalar_function(call: Call) -> ScalarFunction | None:
    """The builtin a call names, None for an aggregate; unknown names and arities raise."""
    function = SCALAR_FUNCTIONS.get(call.func)
    if function is None:
        if call.func in METRIC_AGGREGATES:
            return None
        known = ", ".join(sorted(set(SCALAR_FUNCTIONS) | PATTERN_AGGREGATES))
        raise CompileError(f"unknown function {call.func}(); known functions: {known}", call.span)
    if len(call.args) != function.arity:
        plural = "argument" if function.arity == 1 else "arguments"
        raise CompileError(
            f"{function.summary} takes {function.arity} {plural}, got {len(call.args)}",
            call.span,
        )
    return function


def _children(node: Node) -> Iterator[Expr]:
    if isinstance(node, BinOp):
        yield node.left
        yield node.right
    elif isinstance(node, BoolOp):
        yield from node.operands
    elif isinstance(node, Not | Neg | IsNull | Matches | InList):
        yield node.operand
    elif isinstance(node, InValues):
        yield node.operand
        yield from node.values
    elif isinstance(node, Between):
        yield node.operand
        yield node.low
        yield node.high
    elif isinstance(node, Call):
        yield from node.args


def _walk(node: Node) -> Iterator[Node]:
    yield node
    for child in _children(node):
        yield from _walk(child)


def _context_reads(expr: Expr, scope: Scope) -> list[Node]:
    """Nodes of ``expr`` that read more than the current event (variables, prev, aggregates)."""
    found: list[Node] = []

    def visit(node: Node) -> None:
        if isinstance(node, VarField | Prev):
            found.append(node)
        elif isinstance(node, FieldRef):
            if _is_variable_ref(node, scope):
                found.append(node)
        elif isinstance(node, Call) and _scalar_function(node) is None:
            found.append(node)
            return
        for child in _children(node):
            visit(child)

    visit(expr)
    return found


# ---------------------------------------------------------------- row-wise compilation

RowEvaluator = Callable[[Mapping[str, Any], "MatchContext | None"], Any]


class _RowCompiler:
    """Builds one closure per node; the closures of a tree call each other, no ``eval``."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def compile(self, node: Expr) -> RowEvaluator:
        method = _ROW_METHODS.get(type(node))
        if method is None:
            raise CompileError(f"{type(node).__name__} is not an expression", _span_of(node))
        return getattr(self, method)(node)

    def _literal(self, node: Literal) -> RowEvaluator:
        value = normalise_value(node.value)
        return lambda event, ctx: value

    def _duration(self, node: Duration) -> RowEvaluator:
        ms = int(node.ms)
        return lambda event, ctx: ms

    def _fieldref(self, node: FieldRef) -> RowEvaluator:
        name = node.name
        if _is_variable_ref(node, self.scope):
            return _bound_field(node.qualifier, name, -1)

        def current_field(event: Mapping[str, Any], ctx: MatchContext | None) -> Any:
            return normalise_value(event.get(name))

        return current_field

    def _varfield(self, node: VarField) -> RowEvaluator:
        if node.which not in ("first", "last"):
            raise CompileError(f"expected first(...) or last(...), not {node.which}()", node.span)
        _require_variable(node.var, node, self.scope, f"{node.which}({node.var}).{node.name}")
        return _bound_field(node.var, node.name, 0 if node.which == "first" else -1)

    def _prev(self, node: Prev) -> RowEvaluator:
        name, n = node.name, node.n
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise CompileError(
                f"prev({name}, {n}): the count of events back must be 1 or more", node.span
            )

        def previous_field(event: Mapping[str, Any], ctx: MatchContext | None) -> Any:
            if ctx is None:
                return None
            earlier = ctx.prev(n)
            return None if earlier is None else normalise_value(earlier.get(name))

        return previous_field

    def _call(self, node: Call) -> RowEvaluator:
        function = _scalar_function(node)
        if function is None:
            return _aggregate_evaluator(_pattern_aggregate(node, self.scope))
        args = tuple(self.compile(arg) for arg in node.args)
        if len(args) == 1:
            (arg,) = args
            return lambda event, ctx: _call_scalar(function, arg(event, ctx))
        return lambda event, ctx: _call_scalar(function, *(a(event, ctx) for a in args))

    def _search(self, node: Search) -> RowEvaluator:
        predicate = _search_predicate(node, self.scope)
        name = node.field
        return lambda event, ctx: _search_test(predicate, normalise_value(event.get(name)))

    def _binop(self, node: BinOp) -> RowEvaluator:
        left, right = self.compile(node.left), self.compile(node.right)
        apply = _binary_function(node)
        return lambda event, ctx: apply(left(event, ctx), right(event, ctx))

    def _boolop(self, node: BoolOp) -> RowEvaluator:
        operands = tuple(self.compile(operand) for operand in node.operands)
        if node.op == "and":
            def conjunction(event: Mapping[str, Any], ctx: MatchContext | None) -> bool:
                for operand in operands:
                    if operand(event, ctx) is not True:
                        return False
                return True

            return conjunction
        if node.op == "or":
            def disjunction(event: Mapping[str, Any], ctx: MatchContext | None) -> bool:
                for operand in operands:
                    if operand(event, ctx) is True:
                        return True
                return False

            return disjunction
        raise CompileError(f"unknown boolean operator {node.op!r}", node.span)

    def _not(self, node: Not) -> RowEvaluator:
        operand = self.compile(node.operand)
        return lambda event, ctx: operand(event, ctx) is not True

    def _neg(self, node: Neg) -> RowEvaluator:
        operand = self.compile(node.operand)
        return lambda event, ctx: _negate(operand(event, ctx))

    def _invalues(self, node: InValues) -> RowEvaluator:
        operand = self.compile(node.operand)
        # Constants go into one hash set per kind (Python hashes 1 and 1.0 alike, as == wants;
        # keeping kinds apart stops True from matching 1); other values are compared one by one.
        constants: dict[str, set[Any]] = {NUM: set(), STR: set(), BOOL: set()}
        computed = []
        for value in node.values:
            if isinstance(value, Literal | Duration):
                constant = self.compile(value)({}, None)
                if value_kind(constant) in constants:
                    constants[value_kind(constant)].add(constant)
            else:
                computed.append(self.compile(value))
        members = {kind: frozenset(found) for kind, found in constants.items() if found}
        others = tuple(computed)

        def in_values(event: Mapping[str, Any], ctx: MatchContext | None) -> bool:
            x = operand(event, ctx)
            if x is None:
                return False
            same_kind = members.get(value_kind(x))
            if same_kind is not None and x in same_kind:
                return True
            for value in others:
                if _equal(x, value(event, ctx)) is True:
                    return True
            return False

        return in_values

    def _inlist(self, node: InList) -> RowEvaluator:
        container = _list_container(node, self.scope)
        operand = self.compile(node.operand)
        return lambda event, ctx: _member(container, operand(event, ctx))

    def _between(self, node: Between) -> RowEvaluator:
        operand, low, high = (self.compile(n) for n in (node.operand, node.low, node.high))
        return lambda event, ctx: _between(operand(event, ctx), low(event, ctx), high(event, ctx))

    def _isnull(self, node: IsNull) -> RowEvaluator:
        operand = self.compile(node.operand)
        if node.negated:
            return lambda event, ctx: operand(event, ctx) is not None
        return lambda event, ctx: operand(event, ctx) is None

    def _matches(self, node: Matches) -> RowEvaluator:
        regex = _compile_regex(node)
        operand = self.compile(node.operand)
        return lambda event, ctx: _regex_test(regex, operand(event, ctx))


_ROW_METHODS: Mapping[type, str] = {
    Literal: "_literal", Duration: "_duration", FieldRef: "_fieldref", VarField: "_varfield",
    Prev: "_prev", Call: "_call", Search: "_search", BinOp: "_binop", BoolOp: "_boolop",
    Not: "_not", Neg: "_neg", InValues: "_invalues", InList: "_inlist", Between: "_between",
    IsNull: "_isnull", Matches: "_matches",
}


def _span_of(node: Any) -> Span | None:
    span = getattr(node, "span", None)
    return span if isinstance(span, Span) else None


def _bound_field(var: str | None, name: str, index: int) -> RowEvaluator:
    def bound_field(event: Mapping[str, Any], ctx: MatchContext | None) -> Any:
        if ctx is None:
            return None
        events = ctx.bound(var)
        return normalise_value(events[index].get(name)) if events else None

    return bound_field


def _aggregate_evaluator(aggregate: _Aggregate) -> RowEvaluator:
    var, name = aggregate.var, aggregate.field

    def values(ctx: MatchContext | None) -> list[Any]:
        if ctx is None:
            return []
        read = (normalise_value(e.get(name)) for e in ctx.bound(var))
        return [v for v in read if v is not None]

    if aggregate.func == "count":
        if name is None:
            return lambda event, ctx: 0 if ctx is None else len(ctx.bound(var))
        return lambda event, ctx: len(values(ctx))
    fold = {"sum": _sum, "avg": _average, "min": _minimum, "max": _maximum}[aggregate.func]
    return lambda event, ctx: fold(values(ctx))


def _sum(values: list[Any]) -> Any:
    if not values or any(value_kind(v) != NUM for v in values):
        return None
    return functools.reduce(_ARITHMETIC["+"], values)


def _average(values: list[Any]) -> Any:
    return _ARITHMETIC["/"](_sum(values), len(values))


def _extreme(pick: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    def extreme(values: list[Any]) -> Any:
        if not values:
            return None
        kind = value_kind(values[0])
        if kind not in _ORDERED_KINDS or any(value_kind(v) != kind for v in values):
            return None
        return pick(values)

    return extreme


_minimum = _extreme(min)
_maximum = _extreme(max)


def _binary_function(node: BinOp) -> Callable[[Any, Any], Any]:
    if node.op in _COMPARE:
        return _COMPARE[node.op]
    if node.op in _ARITHMETIC:
        return _ARITHMETIC[node.op]
    if node.op in _STRING_TESTS:
        return _STRING_TESTS[node.op]
    known = " ".join(COMPARISON_OPS + ARITHMETIC_OPS + STRING_OPS)
    raise CompileError(f"unknown operator {node.op!r}; expected one of {known}", node.span)


def _list_container(node: InList, scope: Scope) -> Container[Any]:
    container = scope.lists.get(node.list_name)
    if container is None:
        raise CompileError(
            f"unknown list {node.list_name!r}; declared lists: {_names(frozenset(scope.lists))}",
            node.span,
        )
    return container


def _search_predicate(node: Search, scope: Scope) -> Callable[[Any], bool]:
    if scope.search is None:
        raise CompileError(
            f"search({node.field}, {node.text!r}) needs the percolator's search support, "
            "which this compilation was not given",
            node.span,
        )
    return scope.search(node.field, node.query)


def _compile_regex(node: Matches) -> Any:
    options = re2.Options()
    options.log_errors = False  # the error goes into the CompileError, not to stderr via absl
    try:
        return re2.compile(node.pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise CompileError(
            f"invalid regular expression /{node.pattern}/: {reason} (RE2 syntax)", node.span
        ) from None
    except TypeError as error:
        raise CompileError(f"invalid regular expression {node.pattern!r}: {error}",
                           node.span) from None


# ---------------------------------------------------------------- columns

_OBJ = "obj"
"""Column kind for mixed or unusual values, evaluated element by element with row semantics."""

_EXACT_INT_FLOAT = 2**53
_OVERFLOW_GUARD = 2.0**62
_INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class _Column:
    """A column of one kind: ``num`` (int64 or float64), ``str`` (object array of str),
    ``bool``, ``null`` (every row null) or ``obj`` (normalised Python values, None = null).

    ``values`` and ``valid`` broadcast against each other and against the batch: a constant
    is a 0-d array. Values at invalid rows are placeholders of the right type.
    """

    kind: str
    values: np.ndarray
    valid: np.ndarray


_NULL_COLUMN = _Column(NULL, np.zeros(()), np.zeros((), dtype=bool))
_ALL = np.ones((), dtype=bool)


def _bool_column(values: np.ndarray) -> _Column:
    return _Column(BOOL, np.asarray(values, dtype=bool), _ALL)


_FALSE_COLUMN = _bool_column(np.zeros((), dtype=bool))


def _scalar_column(value: Any) -> _Column:
    kind = value_kind(value)
    if kind == NULL:
        return _NULL_COLUMN
    if kind == BOOL:
        return _bool_column(np.asarray(value, dtype=bool))
    if kind == NUM:
        if isinstance(value, float):
            return _Column(NUM, np.asarray(value, dtype=np.float64), _ALL)
        if -(2**63) <= value < 2**63:
            return _Column(NUM, np.asarray(value, dtype=np.int64), _ALL)
    holder = np.empty((), dtype=object)
    holder[()] = value
    return _Column(STR if kind == STR else _OBJ, holder, _ALL)


def _objects_column(values: np.ndarray, normalised: bool = False) -> _Column:
    """Column of an object array, narrowed to a fast kind when its values allow."""
    if values.ndim == 0:
        return _scalar_column(normalise_value(values[()]))
    if normalised:
        valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    else:
        valid = ~pd.isna(values)
    inferred = pd.api.types.infer_dtype(values, skipna=True)
    if inferred == "empty":
        return _NULL_COLUMN
    if inferred == "string":
        return _Column(STR, np.where(valid, values, ""), valid)
    if inferred == "boolean":
        return _Column(BOOL, np.where(valid, values, False).astype(bool), valid)
    if inferred == "floating":
        return _Column(NUM, np.where(valid, values, 0.0).astype(np.float64), valid)
    if inferred == "integer":
        try:
            return _Column(NUM, np.where(valid, values, 0).astype(np.int64), valid)
        except OverflowError:  # Python ints beyond int64 stay exact as objects
            pass
    if normalised:
        return _Column(_OBJ, values, valid)
    normal = np.fromiter((normalise_value(v) for v in values), dtype=object, count=len(values))
    return _objects_column(normal, normalised=True)


def _series_column(series: pd.Series) -> _Column:
    """Read one DataFrame column into a kind the kernels understand."""
    dtype = series.dtype
    if isinstance(dtype, np.dtype):
        values = series.to_numpy()
        if dtype.kind == "b":
            return _Column(BOOL, values, _ALL)
        if dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8):
            return _Column(NUM, values.astype(np.int64, copy=False), _ALL)
        if dtype.kind == "f":
            values = values.astype(np.float64, copy=False)
            return _Column(NUM, values, ~np.isnan(values))
        if dtype.kind in "mM":
            nat = np.isnat(values)
            unit = "datetime64[ms]" if dtype.kind == "M" else "timedelta64[ms]"
            ms = values.astype(unit).astype(np.int64)
            return _Column(NUM, np.where(nat, 0, ms), ~nat)
        return _objects_column(values.astype(object, copy=False))
    if isinstance(dtype, pd.DatetimeTZDtype):
        return _series_column(series.dt.tz_convert("UTC").dt.tz_localize(None))
    valid = ~series.isna().to_numpy(dtype=bool)
    if isinstance(dtype, pd.BooleanDtype):
        return _Column(BOOL, series.to_numpy(dtype=bool, na_value=False), valid)
    if pd.api.types.is_integer_dtype(dtype) and not (
        pd.api.types.is_unsigned_integer_dtype(dtype) and dtype.itemsize >= 8
    ):
        return _Column(NUM, series.to_numpy(dtype=np.int64, na_value=0), valid)
    if pd.api.types.is_float_dtype(dtype):
        values = series.to_numpy(dtype=np.float64, na_value=0.0)
        return _Column(NUM, values, valid & ~np.isnan(values))
    if isinstance(dtype, pd.StringDtype):
        return _Column(STR, series.to_numpy(dtype=object, na_value=""), valid)
    return _objects_column(series.to_numpy(dtype=object, na_value=None))


class _Batch:
    """A DataFrame being evaluated, with each column read once however often it is used."""

    __slots__ = ("frame", "_columns")

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self._columns: dict[str, _Column] = {}

    def column(self, name: str) -> _Column:
        column = self._columns.get(name)
        if column is None:
            if name not in self.frame.columns:
                column = _NULL_COLUMN
            else:
                series = self.frame[name]
                if isinstance(series, pd.DataFrame):
                    raise BatchError(
                        f"the batch has {series.shape[1]} columns named {name!r}; "
                        "field names must be unique"
                    )
                column = _series_column(series)
            self._columns[name] = column
        return column


def _object_values(column: _Column) -> np.ndarray:
    """The column as normalised Python values with None at null rows."""
    if column.kind == NULL:
        out = np.empty((), dtype=object)
        out[()] = None
        return out
    return np.where(column.valid, column.values.astype(object), None)


def _elementwise(apply: Callable[..., Any], columns: Sequence[_Column], tests: bool) -> _Column:
    """Row semantics applied to every row: the exact path for mixed or unusual values."""
    arrays = [_object_values(c) for c in columns]
    if all(a.ndim == 0 for a in arrays):
        result = apply(*(a[()] for a in arrays))
        return _bool_column(np.asarray(result)) if tests else _scalar_column(result)
    with np.errstate(all="ignore"):  # Python float arithmetic leaves the FPU flags set
        out = np.frompyfunc(apply, len(arrays), 1)(*arrays)
    if tests:
        return _bool_column(out.astype(bool))
    return _objects_column(out, normalised=True)


def _truth_values(column: _Column) -> np.ndarray:
    if column.kind == BOOL:
        return column.values & column.valid
    if column.kind == _OBJ:
        return np.asarray(np.frompyfunc(_truth, 1, 1)(column.values), dtype=bool)
    return np.zeros((), dtype=bool)


def _outside(values: np.ndarray, bound: float, valid: np.ndarray) -> bool:
    return bool(np.any(((values > bound) | (values < -bound)) & valid))


_NUMPY_ARITHMETIC = {"+": np.add, "-": np.subtract, "*": np.multiply}


def _numeric_arithmetic(op: str, a: _Column, b: _Column) -> _Column:
    av, bv = a.values, b.values
    valid = a.valid & b.valid
    integers = av.dtype.kind == "i" and bv.dtype.kind == "i"
    with np.errstate(all="ignore"):
        if op in _NUMPY_ARITHMETIC:
            ufunc = _NUMPY_ARITHMETIC[op]
            if integers:
                estimate = ufunc(av.astype(np.float64), bv.astype(np.float64))
                if _outside(estimate, _OVERFLOW_GUARD, valid):
                    # int64 would wrap; Python ints give the exact result rows get.
                    return _elementwise(_ARITHMETIC[op], (a, b), tests=False)
                return _Column(NUM, ufunc(av, bv), valid)
            result = ufunc(av, bv)
            return _Column(NUM, result, valid & ~np.isnan(result))
        if integers and op == "/" and (
            _outside(av, _EXACT_INT_FLOAT, valid) or _outside(bv, _EXACT_INT_FLOAT, valid)
        ):
            # Python divides big ints exactly, numpy rounds each to float first.
            return _elementwise(_ARITHMETIC[op], (a, b), tests=False)
        zero = bv == 0
        divisor = np.where(zero, 1, bv)
        result = np.true_divide(av, divisor) if op == "/" else np.mod(av, divisor)
        valid = valid & ~zero
        if result.dtype.kind == "f":
            valid = valid & ~np.isnan(result)
        return _Column(NUM, result, valid)


def _arithmetic_columns(op: str, a: _Column, b: _Column) -> _Column:
    if a.kind == NULL or b.kind == NULL:
        return _NULL_COLUMN
    if a.kind == _OBJ or b.kind == _OBJ:
        return _elementwise(_ARITHMETIC[op], (a, b), tests=False)
    if a.kind == NUM and b.kind == NUM:
        return _numeric_arithmetic(op, a, b)
    if op == "+" and a.kind == STR and b.kind == STR:
        return _Column(STR, np.add(a.values, b.values), a.valid & b.valid)
    return _NULL_COLUMN  # kinds are uniform per column: every row is mistyped


_NUMPY_COMPARE = {
    "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
    ">": np.greater, ">=": np.greater_equal,
}


def _compare_columns(op: str, a: _Column, b: _Column) -> _Column:
    if a.kind == NULL or b.kind == NULL:
        return _FALSE_COLUMN
    if a.kind == _OBJ or b.kind == _OBJ:
        return _elementwise(_COMPARE[op], (a, b), tests=True)
    if a.kind != b.kind:
        return _FALSE_COLUMN
    valid = a.valid & b.valid
    if a.kind == NUM and a.values.dtype.kind != b.values.dtype.kind:
        ints = a.values if a.values.dtype.kind == "i" else b.values
        if _outside(ints, _EXACT_INT_FLOAT, valid):
            # numpy compares int64 with float64 after rounding the int; Python compares exactly.
            return _elementwise(_COMPARE[op], (a, b), tests=True)
    with np.errstate(all="ignore"):
        result = _NUMPY_COMPARE[op](a.values, b.values)
    return _bool_column(np.asarray(result, dtype=bool) & valid)


def _string_test_columns(op: str, a: _Column, b: _Column) -> _Column:
    if a.kind == _OBJ or b.kind == _OBJ:
        return _elementwise(_STRING_TESTS[op], (a, b), tests=True)
    if a.kind != STR or b.kind != STR:
        return _FALSE_COLUMN
    valid = a.valid & b.valid
    test = _STRING_TESTS[op]
    if b.values.ndim == 0:
        needle = b.values[()]
        result = map_distinct(lambda s: test(s, needle), a.values, dtype=bool)
    elif a.values.ndim == 0:
        haystack = a.values[()]
        result = map_distinct(lambda s: test(haystack, s), b.values, dtype=bool)
    else:
        result = np.fromiter(
            (test(x, y) for x, y in zip(a.values, b.values, strict=True)),
            dtype=bool, count=len(a.values),
        )
    return _bool_column(result & valid)


def _distinct_test(test: Callable[[Any], bool], column: _Column) -> _Column:
    """A test of one value, applied per distinct value of the column; null rows are false."""
    if column.kind == NULL:
        return _FALSE_COLUMN
    if column.kind == _OBJ:
        return _elementwise(test, (column,), tests=True)
    return _bool_column(map_distinct(test, column.values, dtype=bool) & column.valid)


def _negate_column(a: _Column) -> _Column:
    if a.kind == _OBJ:
        return _elementwise(_negate, (a,), tests=False)
    if a.kind != NUM:
        return _NULL_COLUMN
    if a.values.dtype.kind == "i" and np.any((a.values == _INT64_MIN) & a.valid):
        return _elementwise(_negate, (a,), tests=False)
    return _Column(NUM, np.negative(a.values), a.valid)


def _call_columns(function: ScalarFunction, args: Sequence[_Column]) -> _Column:
    if any(a.kind == NULL for a in args):
        return _NULL_COLUMN
    if any(a.kind == _OBJ for a in args):
        return _elementwise(functools.partial(_call_scalar, function), args, tests=False)
    if any(a.kind != kind for a, kind in zip(args, function.params, strict=True)):
        return _NULL_COLUMN
    valid = functools.reduce(operator.and_, (a.valid for a in args))
    with np.errstate(all="ignore"):
        result = np.asarray(function.vector(*(a.values for a in args)))
    if result.dtype == object:
        return _objects_column(np.where(valid, result, None), normalised=True)
    if result.dtype.kind == "f":
        return _Column(NUM, result, valid & ~np.isnan(result))
    if result.dtype.kind in "iu":
        return _Column(NUM, result.astype(np.int64, copy=False), valid)
    raise AssertionError(f"{function.name} returned a {result.dtype} column")


def _in_values_columns(x: _Column, values: Sequence[_Column]) -> _Column:
    constants = all(v.values.ndim == 0 and v.kind != _OBJ for v in values)
    if x.values.ndim == 1 and constants and x.kind in (STR, NUM):
        candidates = [_object_values(v)[()] for v in values]
        same_kind = [c for c in candidates if value_kind(c) == x.kind]
        exact = x.kind == STR or (
            x.values.dtype.kind == "i" and all(type(c) is int for c in same_kind)
        )
        if exact:
            # A hash lookup per row instead of one comparison per listed value.
            found = pd.Series(x.values, copy=False).isin(same_kind).to_numpy(dtype=bool)
            return _bool_column(found & x.valid)
    result = _FALSE_COLUMN
    for value in values:
        found = _compare_columns("==", x, value)
        result = _bool_column(result.values | found.values)
    return result


class _ColumnCompiler:
    """Builds one closure per node from a batch to a ``_Column``."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.rows = _RowCompiler(scope)

    def compile(self, node: Expr) -> Callable[[_Batch], _Column]:
        if isinstance(node, Node) and not any(
            isinstance(n, FieldRef | Search) for n in _walk(node)
        ):
            # No field read: evaluate once with the row semantics, then broadcast.
            constant = _scalar_column(self.rows.compile(node)({}, None))
            return lambda batch: constant
        method = _ROW_METHODS.get(type(node))
        if method is None or not hasattr(self, method):
            raise CompileError(
                f"{type(node).__name__} cannot be evaluated column-wise", _span_of(node)
            )
        return getattr(self, method)(node)

    def _fieldref(self, node: FieldRef) -> Callable[[_Batch], _Column]:
        name = node.name
        return lambda batch: batch.column(name)

    def _call(self, node: Call) -> Callable[[_Batch], _Column]:
        function = _scalar_function(node)
        if function is None:
            raise CompileError(f"{node.func}() cannot be evaluated column-wise", node.span)
        args = tuple(self.compile(arg) for arg in node.args)
        return lambda batch: _call_columns(function, [a(batch) for a in args])

    def _search(self, node: Search) -> Callable[[_Batch], _Column]:
        predicate = _search_predicate(node, self.scope)
        name = node.field
        test = functools.partial(_search_test, predicate)
        return lambda batch: _distinct_test(test, batch.column(name))

    def _binop(self, node: BinOp) -> Callable[[_Batch], _Column]:
        _binary_function(node)  # rejects unknown operators
        left, right = self.compile(node.left), self.compile(node.right)
        op = node.op
        if op in _COMPARE:
            return lambda batch: _compare_columns(op, left(batch), right(batch))
        if op in _ARITHMETIC:
            return lambda batch: _arithmetic_columns(op, left(batch), right(batch))
        return lambda batch: _string_test_columns(op, left(batch), right(batch))

    def _boolop(self, node: BoolOp) -> Callable[[_Batch], _Column]:
        if node.op not in ("and", "or"):
            raise CompileError(f"unknown boolean operator {node.op!r}", node.span)
        operands = tuple(self.compile(operand) for operand in node.operands)
        combine = np.logical_and if node.op == "and" else np.logical_or

        def boolean(batch: _Batch) -> _Column:
            result = _truth_values(operands[0](batch))
            for operand in operands[1:]:
                result = combine(result, _truth_values(operand(batch)))
            return _bool_column(result)

        return boolean

    def _not(self, node: Not) -> Callable[[_Batch], _Column]:
        operand = self.compile(node.operand)
        return lambda batch: _bool_column(~_truth_values(operand(batch)))

    def _neg(self, node: Neg) -> Callable[[_Batch], _Column]:
        operand = self.compile(node.operand)
        return lambda batch: _negate_column(operand(batch))

    def _invalues(self, node: InValues) -> Callable[[_Batch], _Column]:
        operand = self.compile(node.operand)
        values = tuple(self.compile(v) for v in node.values)
        return lambda batch: _in_values_columns(operand(batch), [v(batch) for v in values])

    def _inlist(self, node: InList) -> Callable[[_Batch], _Column]:
        test = functools.partial(_member, _list_container(node, self.scope))
        operand = self.compile(node.operand)
        return lambda batch: _distinct_test(test, operand(batch))

    def _between(self, node: Between) -> Callable[[_Batch], _Column]:
        operand, low, high = (self.compile(n) for n in (node.operand, node.low, node.high))

        def between(batch: _Batch) -> _Column:
            x = operand(batch)
            above = _compare_columns(">=", x, low(batch))
            below = _compare_columns("<=", x, high(batch))
            return _bool_column(above.values & below.values)

        return between

    def _isnull(self, node: IsNull) -> Callable[[_Batch], _Column]:
        operand = self.compile(node.operand)
        negated = node.negated

        def is_null(batch: _Batch) -> _Column:
            column = operand(batch)
            valid = np.zeros((), dtype=bool) if column.kind == NULL else column.valid
            return _bool_column(valid if negated else ~valid)

        return is_null

    def _matches(self, node: Matches) -> Callable[[_Batch], _Column]:
        test = functools.partial(_regex_test, _compile_regex(node))
        operand = self.compile(node.operand)

        def matches(batch: _Batch) -> _Column:
            column = operand(batch)
            if column.kind != STR and column.kind != _OBJ:
                return _FALSE_COLUMN
            return _distinct_test(test, column)

        return matches


# ---------------------------------------------------------------- public API


@dataclass(frozen=True)
class MaskedValues:
    """Values of an expression over a batch, with nulls as a mask rather than NaN/None.

    ``values`` holds int64, float64, bool or object (str, or mixed Python values) data; rows
    where ``valid`` is False are null and hold a placeholder (0, 0.0, False, "" or None).
    """

    values: np.ndarray
    valid: np.ndarray


def compile_expr(
    expr: Expr, scope: Scope = Scope()
) -> Callable[[Mapping[str, Any], MatchContext | None], Any]:
    """Compile an expression into a function of one event and the match context.

    Parameters
    ----------
    expr
        The expression, as the parser builds it.
    scope
        The streams, pattern variables, lists and search support names resolve against.

    Returns
    -------
    callable
        ``evaluate(event, ctx=None)``: the expression's value (None for null) for ``event``,
        a mapping of field name to value (timestamps and durations in ms). Pattern variables,
        ``prev`` and aggregates read ``ctx``; without one they are null (``count`` is 0).

    Raises
    ------
    CompileError
        For an unknown qualifier, variable, function, list, operator or a bad regex; for
        ``search`` without a search hook; for a metric aggregate such as ``count()``.

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> total = compile_expr(BinOp("*", FieldRef("amount"), Literal(2)))
    >>> total({"amount": 21}), total({"amount": None}), total({})
    (42, None, None)
    """
    root = _RowCompiler(scope).compile(expr)

    def evaluate(event: Mapping[str, Any], ctx: MatchContext | None = None) -> Any:
        return root(event, ctx)

    return evaluate


def compile_predicate(
    expr: Expr, scope: Scope = Scope()
) -> Callable[[Mapping[str, Any], MatchContext | None], bool]:
    """Compile a condition into a test of one event that never raises.

    The result is True only when the expression is the boolean true; null, a mistyped value
    and false all give False.

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> is_big = compile_predicate(BinOp(">", FieldRef("amount"), Literal(500)))
    >>> is_big({"amount": 900.0}), is_big({"amount": None}), is_big({"amount": "lots"})
    (True, False, False)
    """
    root = _RowCompiler(scope).compile(expr)

    def predicate(event: Mapping[str, Any], ctx: MatchContext | None = None) -> bool:
        return root(event, ctx) is True

    return predicate


def is_columnar(expr: Expr, scope: Scope = Scope()) -> bool:
    """Whether ``expr`` reads only the current event, so it can be evaluated a batch at a time.

    Pattern variables (``a.f``, ``first(v).f``), ``prev`` and aggregates need the match
    context and make it False.
    """
    return not _context_reads(expr, scope)


def _check_columnar(expr: Expr, scope: Scope) -> None:
    reads = _context_reads(expr, scope)
    if reads:
        first = reads[0]
        if isinstance(first, Call):
            _pattern_aggregate(first, scope)  # a metric aggregate gets its own message
        raise CompileError(
            f"{_describe(first)} reads beyond the current event, so the expression cannot be "
            "evaluated column-wise; evaluate it per event with compile_expr",
            first.span,
        )


def _describe(node: Node) -> str:
    if isinstance(node, FieldRef):
        return f"{print_expr(node)} (a pattern variable's field)"
    if isinstance(node, Call):
        return f"the aggregate {print_expr(node)}"
    return print_expr(node)


def _compile_batch(expr: Expr, scope: Scope) -> Callable[[pd.DataFrame], tuple[_Column, int]]:
    _check_columnar(expr, scope)
    root = _ColumnCompiler(scope).compile(expr)

    def evaluate(frame: pd.DataFrame) -> tuple[_Column, int]:
        return root(_Batch(frame)), len(frame)

    return evaluate


def compile_masked(
    expr: Expr, scope: Scope = Scope()
) -> Callable[[pd.DataFrame], MaskedValues]:
    """Compile a current-event expression into its values and null mask over a batch.

    Suits writers that keep nulls as a mask (Arrow, nullable pandas dtypes) and would lose
    exactness converting int columns to float NaN.

    Raises
    ------
    CompileError
        As :func:`compile_expr`, and when the expression is not :func:`is_columnar`.
    """
    evaluate = _compile_batch(expr, scope)

    def masked(frame: pd.DataFrame) -> MaskedValues:
        column, n = evaluate(frame)
        if column.kind == NULL:
            return MaskedValues(np.full(n, None, dtype=object), np.zeros(n, dtype=bool))
        values = np.broadcast_to(column.values, (n,)).copy()
        valid = np.broadcast_to(column.valid, (n,)).copy()
        if column.kind == _OBJ:
            values[~valid] = None
        return MaskedValues(values, valid)

    return masked


def compile_columns(
    expr: Expr, scope: Scope = Scope()
) -> Callable[[pd.DataFrame], np.ndarray]:
    """Compile a current-event expression into a function from a batch to a column of values.

    A batch is a DataFrame with one column per field and one row per event; an absent column
    is a field null in every row. Nulls come back as NaN in a float64 result and as None in
    an object result; int and bool results that contain nulls are therefore object arrays
    (see :func:`compile_masked` to keep the dtype).

    Raises
    ------
    CompileError
        As :func:`compile_expr`, and when the expression is not :func:`is_columnar`.

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> doubled = compile_columns(BinOp("*", FieldRef("amount"), Literal(2)))
    >>> doubled(pd.DataFrame({"amount": [1.5, None]}))
    array([ 3., nan])
    """
    masked = compile_masked(expr, scope)

    def columns(frame: pd.DataFrame) -> np.ndarray:
        result = masked(frame)
        if result.valid.all():
            return result.values
        if result.values.dtype.kind == "f":
            return np.where(result.valid, result.values, np.nan)
        return np.where(result.valid, result.values.astype(object), None)

    return columns


def compile_columnar_predicate(
    expr: Expr, scope: Scope = Scope()
) -> Callable[[pd.DataFrame], np.ndarray]:
    """Compile a current-event condition into a vectorised test of a whole batch.

    Returns a function from a DataFrame to a numpy bool array with one entry per row, equal
    to what :func:`compile_predicate` gives for each row's event.

    Raises
    ------
    CompileError
        As :func:`compile_expr`, and when the expression is not :func:`is_columnar`.

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> cheap = compile_columnar_predicate(BinOp("<", FieldRef("amount"), Literal(1.0)))
    >>> cheap(pd.DataFrame({"amount": [0.5, 7.0, None]}))
    array([ True, False, False])
    """
    evaluate = _compile_batch(expr, scope)

    def predicate(frame: pd.DataFrame) -> np.ndarray:
        column, n = evaluate(frame)
        return np.broadcast_to(_truth_values(column), (n,)).copy()

    return predicate


def referenced_fields(expr: Expr, scope: Scope = Scope()) -> frozenset[str]:
    """Fields of the current event that ``expr`` reads (for projection and validation).

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef
    >>> sorted(referenced_fields(BinOp(">", FieldRef("amount"), FieldRef("limit"))))
    ['amount', 'limit']
    """
    return _field_reads(expr, scope)[0]


def history_fields(expr: Expr, scope: Scope = Scope()) -> frozenset[str]:
    """Fields ``expr`` reads from earlier events: those bound to variables, and ``prev``.

    The engine must keep these fields in the events it buffers for partial matches.
    """
    return _field_reads(expr, scope)[1]


def _field_reads(expr: Expr, scope: Scope) -> tuple[frozenset[str], frozenset[str]]:
    """Fields read from the current event, and fields read from earlier events."""
    current: set[str] = set()
    history: set[str] = set()

    def visit(node: Node) -> None:
        if isinstance(node, FieldRef):
            (history if _is_variable_ref(node, scope) else current).add(node.name)
        elif isinstance(node, VarField | Prev):
            history.add(node.name)
        elif isinstance(node, Search):
            current.add(node.field)
        elif isinstance(node, Call) and _names_a_variable(node, scope):
            return  # count(v): ``v`` is a pattern variable, not a field
        for child in _children(node):
            visit(child)

    visit(expr)
    return frozenset(current), frozenset(history)


def _names_a_variable(call: Call, scope: Scope) -> bool:
    return (
        call.func in PATTERN_AGGREGATES
        and len(call.args) == 1
        and isinstance(call.args[0], FieldRef)
        and call.args[0].qualifier is None
        and call.args[0].name in scope.variables
    )
