"""Compiles a current-event expression into a closure from a batch (a DataFrame) to a column:
the vectorised form of the row evaluators, one closure per node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from query_lang.ast import (
    Between,
    BinOp,
    BoolOp,
    Call,
    Expr,
    FieldRef,
    InList,
    InValues,
    IsNull,
    Lookup,
    Matches,
    Member,
    Neg,
    Node,
    Not,
    Quantified,
    Search,
    walk,
)
from query_lang.compiler.kernels import (
    _FALSE_COLUMN,
    _NULL_COLUMN,
    _OBJ,
    NULL,
    STR,
    _arithmetic_columns,
    _Batch,
    _bool_column,
    _call_columns,
    _Column,
    _compare_columns,
    _distinct_test,
    _in_values_columns,
    _negate_column,
    _object_values,
    _objects_column,
    _quantified_columns,
    _scalar_column,
    _string_test_columns,
    _truth_values,
)
from query_lang.compiler.resolve import (
    CompileError,
    Scope,
    _binary_function,
    _compile_regex,
    _list_container,
    _scalar_function,
    _search_predicate,
    _span_of,
    _table_reader,
    member_of_field,
)
from query_lang.compiler.rows import _ROW_METHODS, _RowCompiler
from query_lang.compiler.values import (
    _ARITHMETIC,
    _COMPARE,
    _member,
    _regex_test,
    _search_test,
    member_value,
    normalise_value,
)


class _ColumnCompiler:
    """Builds one closure per node from a batch to a ``_Column``."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.rows = _RowCompiler(scope)

    def compile(self, node: Expr) -> Callable[[_Batch], _Column]:
        if isinstance(node, Node) and not any(
            isinstance(n, FieldRef | Search | Lookup) for n in walk(node)
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

    def _lookup(self, node: Lookup) -> Callable[[_Batch], _Column]:
        """A table's row (or one of its fields) per row, as of the row's time
        (``Scope.time_column``): the row evaluator's lookup, row by row over the columns."""
        time = self.scope.time_column
        if time is None:
            raise CompileError("lookup() reads each event's time; a batch without a time "
                               "column cannot be evaluated column-wise", _span_of(node))
        table = _table_reader(node, self.scope)
        keys = tuple(self.compile(k) for k in node.keys)
        position = None if node.field is None else table.position(node.field)
        values_as_of = table.values_as_of

        def lookup(batch: _Batch) -> _Column:
            n = batch.size
            times = np.broadcast_to(_object_values(batch.column(time)), (n,)).tolist()
            columns = [np.broadcast_to(_object_values(k(batch)), (n,)).tolist() for k in keys]
            found = values_as_of(zip(*columns, strict=True), times, position)
            # (A row exists: the row itself only meets `is [not] null`.)
            values = np.fromiter(map(normalise_value, found), dtype=object, count=n)
            return _objects_column(values, normalised=True)

        return lookup

    def _fieldref(self, node: FieldRef) -> Callable[[_Batch], _Column]:
        member = member_of_field(node, self.scope)
        if member is not None:
            return self._member(member)
        name = node.name
        return lambda batch: batch.column(name)

    def _member(self, node: Member) -> Callable[[_Batch], _Column]:
        base, name = self.compile(node.base), node.name

        def member(batch: _Batch) -> _Column:
            column = base(batch)
            if column.kind != _OBJ:
                return _NULL_COLUMN  # strings, numbers ...: no members
            values = _object_values(column)
            if values.ndim == 0:
                return _scalar_column(member_value(values[()], name))
            found = (member_value(v, name) for v in values.tolist())
            return _objects_column(np.fromiter(found, dtype=object, count=len(values)),
                                   normalised=True)

        return member

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

    def _quantified(self, node: Quantified) -> Callable[[_Batch], _Column]:
        source = self.compile(node.source)
        condition = self.compile(node.condition)
        func, name = node.func, node.var
        return lambda batch: _quantified_columns(
            func, source(batch), batch.size, name, batch, condition
        )

    def _matches(self, node: Matches) -> Callable[[_Batch], _Column]:
        test = functools.partial(_regex_test, _compile_regex(node))
        operand = self.compile(node.operand)

        def matches(batch: _Batch) -> _Column:
            column = operand(batch)
            if column.kind != STR and column.kind != _OBJ:
                return _FALSE_COLUMN
            return _distinct_test(test, column)

        return matches
