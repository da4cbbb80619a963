"""Values as the expression language sees them (normalised, of a kind) and the row semantics
of every operator, function call and aggregate fold: the one definition that the row evaluators
use and that the column kernels fall back to for mixed values.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Container, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from query_lang.ast import ARITHMETIC_OPS
from query_lang.functions import ScalarFunction

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


def member_value(value: Any, name: str) -> Any:
    """The member ``name`` of a json value: the object's value at that key, null when ``value``
    is not an object or has no such key.

    >>> member_value({"a": {"b": 2}}, "a"), member_value(["a"], "a"), member_value(None, "a")
    ({'b': 2}, None, None)
    """
    if isinstance(value, Mapping):
        return normalise_value(value.get(name))
    return None


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
    for arg, kinds in zip(args, function.parameter_kinds(len(args)), strict=True):
        if value_kind(arg) not in kinds:
            return None
    try:
        result = function.scalar(*args)
    except (ArithmeticError, ValueError, TypeError):  # e.g. an int too large for a float
        return None
    return normalise_value(result)


def _truth(value: Any) -> bool:
    return value is True


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
