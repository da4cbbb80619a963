"""Column-wise values for the metric operator: :class:`ValueColumn` (an aggregate argument over
many rows, nulls as a mask), how a batch or one event becomes columns, and the numeric, hashed
and segmented views the aggregates read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cep.metrics.errors import MetricInputError
from query_lang.compiler import normalise_value, value_kind
from sketches import hash_values

__all__ = [
    "ValueColumn",
    "concat_columns",
    "from_masked",
    "group_codes",
    "hash_column",
    "hashable",
    "numbers",
    "scalar_array",
    "scalar_column",
    "scalar_hashable",
    "scalar_value",
    "segment_counts",
    "segment_slices",
    "time_column",
]


@dataclass(frozen=True)
class ValueColumn:
    """Values of one aggregate argument over the rows being absorbed, nulls as a mask."""

    values: np.ndarray
    valid: np.ndarray

    def take(self, index: np.ndarray) -> ValueColumn:
        return ValueColumn(self.values[index], self.valid[index])

    def __len__(self) -> int:
        return len(self.valid)


def concat_columns(a: ValueColumn, b: ValueColumn) -> ValueColumn:
    return ValueColumn(np.concatenate([a.values, b.values]), np.concatenate([a.valid, b.valid]))


def from_masked(result: Any) -> ValueColumn:
    """The column of a masked result of ``query_lang.compiler.compile_masked``."""
    return ValueColumn(np.asarray(result.values), np.asarray(result.valid, dtype=bool))


def scalar_value(value: Any) -> Any:
    """One evaluated value as a one-row column holds it (see :func:`scalar_column`): normalised,
    ``None`` for null, a number as an ``int`` when int64 holds it and a ``float`` otherwise."""
    value = normalise_value(value)
    kind = value_kind(value)
    if kind == "num" and not (type(value) is int and -(2**63) <= value < 2**63):
        return float(value)
    return value


def scalar_column(value: Any) -> ValueColumn:
    """One evaluated value as a one-row column typed as a batch column would be."""
    value = scalar_value(value)
    kind = value_kind(value)
    if kind == "null":
        return ValueColumn(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=bool))
    if kind == "num":
        dtype = np.int64 if type(value) is int else np.float64
        return ValueColumn(np.array([value], dtype=dtype), np.ones(1, dtype=bool))
    if kind == "bool":
        return ValueColumn(np.array([value], dtype=bool), np.ones(1, dtype=bool))
    column = np.empty(1, dtype=object)
    column[0] = value
    return ValueColumn(column, np.ones(1, dtype=bool))


def scalar_array(value: Any) -> np.ndarray:
    """A :func:`scalar_value` as the one-element array of a column's values (its dtype)."""
    t = type(value)
    if t is int:
        return np.array([value], dtype=np.int64)
    if t is float:
        return np.array([value], dtype=np.float64)
    if t is bool:
        return np.array([value], dtype=bool)
    column = np.empty(1, dtype=object)
    column[0] = value
    return column


def scalar_hashable(value: Any) -> bool:
    """Whether :func:`hashable` holds for the one-row column of a :func:`scalar_value`."""
    t = type(value)
    if t is float:
        return value == value  # not NaN
    if t is int or t is bool or t is str:
        return True
    return value is not None and value_kind(normalise_value(value)) in ("num", "str", "bool")


def numbers(column: ValueColumn) -> tuple[np.ndarray, np.ndarray]:
    """The numeric values of a column (int64 or float64) and which rows hold one.

    Booleans, strings and other kinds count as null here, as a mistyped value never fails a
    metric.
    """
    values, valid = column.values, column.valid
    kind = values.dtype.kind
    if kind in "iu":
        return values.astype(np.int64, copy=False), valid
    if kind == "f":
        return values, valid & ~np.isnan(values)
    if kind != "O":
        return np.zeros(len(values), dtype=np.int64), np.zeros(len(values), dtype=bool)
    inferred = pd.api.types.infer_dtype(values[valid], skipna=False)
    if inferred in ("string", "boolean", "empty", "bytes"):
        return np.zeros(len(values), dtype=np.int64), np.zeros(len(values), dtype=bool)
    if inferred in ("integer", "floating", "mixed-integer-float"):
        dtype = np.int64 if inferred == "integer" else np.float64
        out = np.zeros(len(values), dtype=dtype)
        try:
            out[valid] = values[valid].astype(dtype)
            return out, valid
        except OverflowError:  # ints beyond int64: the general path below keeps them exact
            pass
    numeric = valid & np.fromiter(
        (value_kind(v) == "num" for v in values), dtype=bool, count=len(values)
    )
    picked = values[numeric]
    if all(type(v) is int for v in picked) and all(-(2**63) <= v < 2**63 for v in picked):
        out = np.zeros(len(values), dtype=np.int64)
    else:
        out = np.zeros(len(values), dtype=np.float64)
    out[numeric] = picked
    return out, numeric


_SCALAR_INFERRED = frozenset(
    {"string", "integer", "floating", "mixed-integer-float", "boolean", "empty"}
)


def hashable(column: ValueColumn) -> np.ndarray:
    """Rows holding a value the sketches can hash: not null, not NaN, not a list."""
    values, valid = column.values, column.valid
    if values.dtype.kind == "f":
        return valid & ~np.isnan(values)
    if values.dtype.kind != "O" or not valid.any():
        return valid
    if pd.api.types.infer_dtype(values[valid], skipna=False) in _SCALAR_INFERRED:
        return valid
    return valid & np.fromiter(
        (value_kind(normalise_value(v)) in ("num", "str", "bool") for v in values),
        dtype=bool, count=len(values),
    )


def hash_column(column: ValueColumn) -> tuple[np.ndarray, np.ndarray]:
    """The sketches' 64-bit hash of each hashable row (0 elsewhere) and which rows those are."""
    values, valid = column.values, hashable(column)
    hashes = np.zeros(len(values), dtype=np.uint64)
    if valid.any():
        hashes[valid] = hash_values(values[valid])
    return hashes, valid


def segment_counts(valid: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Valid rows per segment; segment ``i`` starts at ``bounds[i]`` and ends at the next."""
    if len(valid) == 0:
        return np.zeros(len(bounds), dtype=np.int64)
    return np.add.reduceat(valid.astype(np.int64), bounds)


def segment_slices(bounds: np.ndarray, n: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` of each segment of ``n`` rows starting at ``bounds``."""
    starts = bounds.tolist()
    return list(zip(starts, [*starts[1:], n], strict=True))


def time_column(df: pd.DataFrame, name: str) -> np.ndarray:
    """A batch's event times in epoch ms (``ts``: integers or datetimes) for metric ``name``."""
    if "ts" not in df.columns:
        raise MetricInputError(
            f"metric '{name}': the batch has no 'ts' column (event time in epoch ms)"
        )
    column = df["ts"]
    if pd.api.types.is_datetime64_any_dtype(column):
        if column.isna().any():
            raise MetricInputError(f"metric '{name}': the batch has events without a time")
        if getattr(column.dt, "tz", None) is not None:
            column = column.dt.tz_convert("UTC").dt.tz_localize(None)
        return column.to_numpy().astype("datetime64[ms]").astype(np.int64)
    if column.isna().any():
        raise MetricInputError(f"metric '{name}': the batch has events without a time")
    try:
        return column.to_numpy().astype(np.int64)
    except (TypeError, ValueError):
        raise MetricInputError(
            f"metric '{name}': 'ts' must hold epoch milliseconds, not {column.dtype}"
        ) from None


def group_codes(df: pd.DataFrame, by: Sequence[str]) -> tuple[list[tuple], np.ndarray]:
    """The distinct group keys of a batch, in order of first appearance, and each row's index
    into them. Null values (None, NaN, a missing column) form their own group."""
    n = len(df)
    if not by:
        return [()], np.zeros(n, dtype=np.int64)
    combined = np.zeros(n, dtype=np.int64)
    for field_name in by:
        if field_name in df.columns:
            values = df[field_name].to_numpy(dtype=object, na_value=None)
            codes, _ = pd.factorize(values, use_na_sentinel=False)
        else:
            codes = np.zeros(n, dtype=np.int64)
        # Re-factorise after each field so the combined code stays below n.
        combined, _ = pd.factorize(combined * (int(codes.max(initial=0)) + 1) + codes)
    _, first_rows = np.unique(combined, return_index=True)
    columns = [
        df[f].to_numpy(dtype=object, na_value=None)[first_rows] if f in df.columns
        else [None] * len(first_rows)
        for f in by
    ]
    keys = [tuple(normalise_value(c[i]) for c in columns) for i in range(len(first_rows))]
    return keys, combined.astype(np.int64)
