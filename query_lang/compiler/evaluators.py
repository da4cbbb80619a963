"""The compiler's entry points: an expression into a function of one event, a predicate, or a
function of a whole batch; and the fields an expression reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from query_lang.ast import Call, Expr, FieldRef, Node, print_expr
from query_lang.compiler.columns import _ColumnCompiler
from query_lang.compiler.kernels import _OBJ, NULL, _Batch, _Column, _truth_values
from query_lang.compiler.resolve import (
    CompileError,
    MatchContext,
    Scope,
    _context_reads,
    _field_reads,
    _pattern_aggregate,
)
from query_lang.compiler.rows import _RowCompiler

_NO_NAMES = Scope()
"""The default scope: no streams, variables, lists or search support."""


@dataclass(frozen=True)
class MaskedValues:
    """Values of an expression over a batch, with nulls as a mask rather than NaN/None.

    ``values`` holds int64, float64, bool or object (str, or mixed Python values) data; rows
    where ``valid`` is False are null and hold a placeholder (0, 0.0, False, "" or None).
    """

    values: np.ndarray
    valid: np.ndarray


def compile_expr(
    expr: Expr, scope: Scope = _NO_NAMES
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
        ``q.f`` with ``q`` neither a stream nor a variable is the member ``f`` of the json
        field ``q`` (:func:`query_lang.compiler.resolve.member_of_field`).

    Raises
    ------
    CompileError
        For an unknown variable, function, list, operator or a bad regex; for ``search``
        without a search hook; for a metric aggregate such as ``count()``.

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
    expr: Expr, scope: Scope = _NO_NAMES
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


def is_columnar(expr: Expr, scope: Scope = _NO_NAMES) -> bool:
    """Whether ``expr`` reads only the current event, so it can be evaluated a batch at a time.

    Pattern variables (``a.f``, ``first(v).f``), ``prev`` and aggregates need the match
    context and make it False.

    Examples
    --------
    >>> from query_lang import parse_expr
    >>> rule = Scope(variables={"a"})
    >>> is_columnar(parse_expr("amount > 500"), rule)
    True
    >>> is_columnar(parse_expr("amount > a.amount"), rule)
    False
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
    expr: Expr, scope: Scope = _NO_NAMES
) -> Callable[[pd.DataFrame], MaskedValues]:
    """Compile a current-event expression into its values and null mask over a batch.

    Suits writers that keep nulls as a mask (Arrow, nullable pandas dtypes) and would lose
    exactness converting int columns to float NaN.

    Raises
    ------
    CompileError
        As :func:`compile_expr`, and when the expression is not :func:`is_columnar`.

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> doubled = compile_masked(BinOp("*", FieldRef("amount"), Literal(2)))
    >>> doubled(pd.DataFrame({"amount": pd.array([1, None], dtype="Int64")}))
    MaskedValues(values=array([2, 0]), valid=array([ True, False]))
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
    expr: Expr, scope: Scope = _NO_NAMES
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
    expr: Expr, scope: Scope = _NO_NAMES
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


def referenced_fields(expr: Expr, scope: Scope = _NO_NAMES) -> frozenset[str]:
    """Fields of the current event that ``expr`` reads (for projection and validation).

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef
    >>> sorted(referenced_fields(BinOp(">", FieldRef("amount"), FieldRef("limit"))))
    ['amount', 'limit']
    """
    return _field_reads(expr, scope)[0]


def history_fields(expr: Expr, scope: Scope = _NO_NAMES) -> frozenset[str]:
    """Fields ``expr`` reads from earlier events: those bound to variables, and ``prev``.

    The engine must keep these fields in the events it buffers for partial matches.

    Examples
    --------
    >>> from query_lang import parse_expr
    >>> sorted(history_fields(parse_expr("x > a.amount and prev(ts) < ts"), Scope(variables={"a"})))
    ['amount', 'ts']
    """
    return _field_reads(expr, scope)[1]
