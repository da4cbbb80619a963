"""Compiles an expression into a closure over one event and its match context: one closure per
node, calling each other, no ``eval``.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

from query_lang.ast import (
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
    Lookup,
    Matches,
    Member,
    Neg,
    Not,
    Prev,
    Quantified,
    Search,
    VarField,
)
from query_lang.compiler.resolve import (
    CompileError,
    MatchContext,
    Scope,
    _Aggregate,
    _binary_function,
    _compile_regex,
    _is_variable_ref,
    _list_container,
    _pattern_aggregate,
    _require_variable,
    _scalar_function,
    _search_predicate,
    _span_of,
    _table_reader,
    member_of_field,
)
from query_lang.compiler.values import (
    BOOL,
    LIST,
    NUM,
    STR,
    _average,
    _between,
    _call_scalar,
    _equal,
    _maximum,
    _member,
    _minimum,
    _negate,
    _regex_test,
    _search_test,
    _sum,
    member_value,
    normalise_value,
    value_kind,
)

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
        member = member_of_field(node, self.scope)
        if member is not None:
            return self._member(member)
        name = node.name
        if _is_variable_ref(node, self.scope):
            return _bound_field(node.qualifier, name, -1)

        def current_field(event: Mapping[str, Any], ctx: MatchContext | None) -> Any:
            return normalise_value(event.get(name))

        return current_field

    def _member(self, node: Member) -> RowEvaluator:
        base, name = self.compile(node.base), node.name
        return lambda event, ctx: member_value(base(event, ctx), name)

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

    def _quantified(self, node: Quantified) -> RowEvaluator:
        source = self.compile(node.source)
        condition = self.compile(node.condition)
        name = node.var

        def holds(element: Any, event: Mapping[str, Any], ctx: MatchContext | None) -> bool:
            # The element shadows nothing: the checks refuse a name the event already has.
            return condition(ChainMap({name: element}, event), ctx) is True

        if node.func == "count":
            def count(event: Mapping[str, Any], ctx: MatchContext | None) -> int:
                values = source(event, ctx)
                if value_kind(values) != LIST:
                    return 0
                return sum(1 for element in values if holds(element, event, ctx))

            return count

        def any_element(event: Mapping[str, Any], ctx: MatchContext | None) -> bool:
            values = source(event, ctx)
            if value_kind(values) != LIST:
                return False
            return any(holds(element, event, ctx) for element in values)

        return any_element


    def _lookup(self, node: Lookup) -> RowEvaluator:
        table = _table_reader(node, self.scope)
        keys = tuple(self.compile(k) for k in node.keys)
        position = None if node.field is None else table.position(node.field)
        as_of = table.as_of

        def lookup(event: Mapping[str, Any], ctx: MatchContext | None) -> Any:
            at = None if ctx is None else ctx.time()
            if at is None:
                return None
            key = tuple(k(event, ctx) for k in keys)
            if None in key:
                return None
            row = as_of(key, at)
            if row is None:
                return None
            # A row exists: the row itself only meets `is [not] null` (the checks see to it).
            return True if position is None else normalise_value(row[position])

        return lookup


_ROW_METHODS: Mapping[type, str] = {
    Literal: "_literal", Duration: "_duration", FieldRef: "_fieldref", Member: "_member",
    VarField: "_varfield",
    Prev: "_prev", Call: "_call", Search: "_search", BinOp: "_binop", BoolOp: "_boolop",
    Not: "_not", Neg: "_neg", InValues: "_invalues", InList: "_inlist", Between: "_between",
    IsNull: "_isnull", Matches: "_matches", Quantified: "_quantified", Lookup: "_lookup",
}


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
