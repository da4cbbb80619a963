"""Columns of values with a null mask, read from a pandas batch, and the vectorised kernels of
every operator over them; mixed or unusual values fall back to the row semantics element by
element, so a column always holds what the row evaluators would give row by row.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from query_lang.compiler.values import (
    _ARITHMETIC,
    _COMPARE,
    _STRING_TESTS,
    BOOL,
    LIST,
    NULL,
    NUM,
    STR,
    _call_scalar,
    _negate,
    _truth,
    normalise_value,
    value_kind,
)
from query_lang.errors import VigilError
from query_lang.functions import ScalarFunction, map_distinct


class BatchError(VigilError, ValueError):
    """A batch handed to a columnar evaluator cannot be read (such as a duplicated column)."""


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

    @property
    def size(self) -> int:
        """The number of rows."""
        return len(self.frame)

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


class _ElementBatch:
    """The rows of a batch repeated once per element of a list column, with the element
    readable under a name: what the condition of ``any(x in tags: ...)`` is evaluated over.

    ``rows[i]`` is the batch row the i-th element came from.
    """

    __slots__ = ("base", "rows", "name", "elements")

    def __init__(self, base: Any, rows: np.ndarray, name: str, elements: _Column) -> None:
        self.base = base
        self.rows = rows
        self.name = name
        self.elements = elements

    @property
    def size(self) -> int:
        """The number of rows (elements)."""
        return len(self.rows)

    def column(self, name: str) -> _Column:
        if name == self.name:
            return self.elements
        column = self.base.column(name)
        values = column.values if column.values.ndim == 0 else column.values[self.rows]
        valid = column.valid if column.valid.ndim == 0 else column.valid[self.rows]
        return _Column(column.kind, values, valid)


def _list_elements(lists: _Column, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The elements of each row's list (a row whose value is not a list has none), flattened
    and normalised, and the row each came from."""
    cells = np.broadcast_to(_object_values(lists), (size,))
    counts = np.zeros(size, dtype=np.int64)
    elements: list[Any] = []
    for i, cell in enumerate(cells.tolist()):
        if value_kind(cell) == LIST:
            counts[i] = len(cell)
            elements.extend(normalise_value(e) for e in cell)
    # fromiter, not an assignment: json elements may be lists, which numpy would broadcast
    flat = np.fromiter(elements, dtype=object, count=len(elements))
    return np.repeat(np.arange(size), counts), flat


def _quantified_columns(
    func: str, lists: _Column, size: int, name: str, base: Any,
    condition: Callable[[Any], _Column],
) -> _Column:
    """``any`` or ``count`` of ``condition`` over the elements of each row's list."""
    rows, elements = _list_elements(lists, size)
    batch = _ElementBatch(base, rows, name, _objects_column(elements, normalised=True))
    hits = rows[np.broadcast_to(_truth_values(condition(batch)), rows.shape)]
    if func == "count":
        return _Column(NUM, np.bincount(hits, minlength=size).astype(np.int64), _ALL)
    found = np.zeros(size, dtype=bool)
    found[hits] = True
    return _bool_column(found)


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
    kinds = function.parameter_kinds(len(args))
    if function.vector is None or any(a.kind == _OBJ for a in args):
        return _elementwise(functools.partial(_call_scalar, function), args, tests=False)
    if any(a.kind not in kind for a, kind in zip(args, kinds, strict=True)):
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
