"""The aggregate functions of ``metric`` blocks (``count``, ``sum``, ``avg``, ``min``, ``max``,
``approx_distinct``, ``approx_percentile``, ``seen``): partial results over sorted segments of a
batch, the per-window state they fold into, and its encoding."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from cep.metrics.columns import (
    ValueColumn,
    hash_column,
    hashable,
    numbers,
    scalar_array,
    scalar_hashable,
    segment_counts,
    segment_slices,
)
from cep.metrics.errors import MetricStateError
from cep.metrics.state import StateReader, StateWriter
from query_lang.compiler import normalise_value, value_kind
from sketches import HyperLogLog, TDigest, from_bytes, hash_value

__all__ = [
    "AGGREGATES",
    "HLL_PRECISION",
    "SEEN_CAPACITY",
    "SEEN_ERROR_RATE",
    "SEEN_EXACT_LIMIT",
    "SMALL_DISTINCT",
    "TDIGEST_COMPRESSION",
    "Aggregate",
    "ApproxDistinct",
    "ApproxPercentile",
    "Average",
    "CountRows",
    "CountValues",
    "Extreme",
    "Seen",
    "SketchAggregate",
    "Sum",
]

HLL_PRECISION = 14
"""``approx_distinct``: HyperLogLog++ with 2**14 registers (relative error about 0.8%)."""

SMALL_DISTINCT = 256
"""``approx_distinct``: a window keeps up to this many distinct values before a HyperLogLog."""

TDIGEST_COMPRESSION = 100
"""``approx_percentile``: t-digest compression."""

SEEN_CAPACITY = 100_000
SEEN_ERROR_RATE = 0.001
"""``seen``: each group's Bloom filter is sized for 100k distinct values at 0.1% false positives."""

SEEN_EXACT_LIMIT = 16_384
"""``seen``: a group's older values are an exact set of hashes up to this many (128 KiB, less than
the Bloom filter's 176 KiB), then the Bloom filter."""


class Aggregate:
    """One aggregate function: its partial results over sorted segments, how partials fold into
    a window's state, how two states combine (sessions merging), the result and the encoding.

    A state is ``None`` until the first value arrives, except for the counts (an int).
    """

    func = ""

    def __init__(self, arg: int | None, quantile: float | None = None) -> None:
        self.arg = arg
        self.quantile = quantile

    def empty(self) -> Any:
        return None

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        raise NotImplementedError

    def partial_one(self, value: Any) -> Any:
        """The partial of one event whose argument is ``value`` (a
        :func:`~cep.metrics.columns.scalar_value`; ignored without an argument): equal to
        ``partials(scalar_column(value), [0], 1)[0]``, without building columns."""
        raise NotImplementedError

    def absorb(self, state: Any, partial: Any) -> Any:
        return self.combine(state, partial)

    def combine(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        return state

    def write(self, out: StateWriter, state: Any) -> None:
        out.value(state)

    def read(self, src: StateReader) -> Any:
        return src.value()


class CountRows(Aggregate):
    func = "count"

    def empty(self) -> Any:
        return 0

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        return np.diff(np.append(bounds, n)).tolist()

    def partial_one(self, value: Any) -> Any:
        return 1

    def combine(self, a: Any, b: Any) -> Any:
        return a + b


class CountValues(CountRows):
    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        return segment_counts(column.valid, bounds).tolist()

    def partial_one(self, value: Any) -> Any:
        return 0 if value is None else 1


def _number(value: Any) -> Any:
    """What :func:`~cep.metrics.columns.numbers` takes from a one-row column: the number, or
    ``None`` (null, NaN, or not a number)."""
    t = type(value)
    if t is int or (t is float and value == value):
        return value
    return None


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


class Sum(Aggregate):
    func = "sum"

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = numbers(column)
        counts = segment_counts(valid, bounds)
        if values.dtype.kind == "i":
            magnitude = int(np.abs(values[valid]).max()) if valid.any() else 0
            if magnitude * max(len(values), 1) < 2**62:
                sums = np.add.reduceat(np.where(valid, values, 0), bounds).tolist()
            else:  # could overflow int64: add Python ints, which are exact
                sums = [
                    sum(int(v) for v in values[lo:hi][valid[lo:hi]])
                    for lo, hi in segment_slices(bounds, n)
                ]
        else:
            sums = np.add.reduceat(np.where(valid, values, 0.0), bounds).tolist()
        return [s if c else None for s, c in zip(sums, counts.tolist(), strict=True)]

    def partial_one(self, value: Any) -> Any:
        return _number(value)

    def combine(self, a: Any, b: Any) -> Any:
        return _add(a, b)


class Average(Aggregate):
    func = "avg"

    def __init__(self, arg: int | None, quantile: float | None = None) -> None:
        super().__init__(arg, quantile)
        self._sum = Sum(arg)

    def empty(self) -> Any:
        return (None, 0)

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        _, valid = numbers(column)
        sums = self._sum.partials(column, bounds, n)
        return list(zip(sums, segment_counts(valid, bounds).tolist(), strict=True))

    def partial_one(self, value: Any) -> Any:
        number = _number(value)
        return (number, 0 if number is None else 1)

    def combine(self, a: Any, b: Any) -> Any:
        return (_add(a[0], b[0]), a[1] + b[1])

    def result(self, state: Any) -> Any:
        total, count = state
        return None if not count else total / count

    def write(self, out: StateWriter, state: Any) -> None:
        out.value(state[0])
        out.value(state[1])

    def read(self, src: StateReader) -> Any:
        return (src.value(), src.value())


_NO_VALUES = np.zeros(0, dtype=np.int64)
_NO_NUMBERS = np.zeros(0, dtype=np.float64)
_NO_HASHES = np.zeros(0, dtype=np.uint64)
for _empty in (_NO_VALUES, _NO_NUMBERS, _NO_HASHES):
    _empty.flags.writeable = False  # shared: the partial of every event without a value

_MIXED = ("mixed", None)
"""An extreme over values of different kinds (a number and a string): its result is null."""


class Extreme(Aggregate):
    """``min``/``max``: numbers, strings or booleans, null when a window mixes kinds."""

    def __init__(self, arg: int | None, quantile: float | None = None, *, largest: bool) -> None:
        super().__init__(arg, quantile)
        self.largest = largest
        self.func = "max" if largest else "min"

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = column.values, column.valid
        kind = values.dtype.kind
        counts = segment_counts(valid, bounds).tolist()
        if kind in "iuf":
            if kind == "f":
                valid = valid & ~np.isnan(values)
                counts = segment_counts(valid, bounds).tolist()
                fill = -np.inf if self.largest else np.inf
            else:
                values = values.astype(np.int64, copy=False)
                info = np.iinfo(np.int64)
                fill = info.min if self.largest else info.max
            reduce = np.maximum if self.largest else np.minimum
            extremes = reduce.reduceat(np.where(valid, values, fill), bounds).tolist()
            return [("num", e) if c else None for e, c in zip(extremes, counts, strict=True)]
        if kind == "b":
            reduce = np.logical_or if self.largest else np.logical_and
            fill = not self.largest
            extremes = reduce.reduceat(np.where(valid, values, fill), bounds).tolist()
            return [("bool", e) if c else None for e, c in zip(extremes, counts, strict=True)]
        picked = values[valid]
        if len(picked) and pd.api.types.infer_dtype(picked, skipna=False) == "string":
            # Only strings: one vectorised group-by instead of a fold per value.
            segment = np.repeat(np.arange(len(bounds)), np.diff(np.r_[bounds, n]))[valid]
            grouped = pd.Series(picked, dtype=object).groupby(segment, sort=True)
            extremes = (grouped.max() if self.largest else grouped.min()).to_dict()
            return [("str", extremes[i]) if i in extremes else None for i in range(len(bounds))]
        partials = []
        for lo, hi in segment_slices(bounds, n):
            state = None
            for value in values[lo:hi][valid[lo:hi]]:
                value = normalise_value(value)
                state = self.combine(state, (value_kind(value), value))
            partials.append(state)
        return partials

    def partial_one(self, value: Any) -> Any:
        t = type(value)
        if t is int or t is float:
            return ("num", value) if value == value else None
        if t is bool:
            return ("bool", value)
        if t is str:
            return ("str", value)
        if value is None:
            return None
        value = normalise_value(value)
        return (value_kind(value), value)

    def combine(self, a: Any, b: Any) -> Any:
        if a is None or a is _MIXED:
            return b if a is None else a
        if b is None:
            return a
        if b is _MIXED or a[0] != b[0] or a[0] not in ("num", "str", "bool"):
            return _MIXED
        if self.largest:
            return b if b[1] > a[1] else a
        return b if b[1] < a[1] else a

    def result(self, state: Any) -> Any:
        return None if state is None or state is _MIXED else state[1]

    def write(self, out: StateWriter, state: Any) -> None:
        if state is None:
            out.u8(0)
        elif state is _MIXED:
            out.u8(1)
        else:
            out.u8(2)
            out.value(state[0])
            out.value(state[1])

    def read(self, src: StateReader) -> Any:
        tag = src.u8()
        if tag == 0:
            return None
        if tag == 1:
            return _MIXED
        if tag == 2:
            return (src.value(), src.value())
        raise MetricStateError(f"unknown {self.func}() state tag {tag}")


class SketchAggregate(Aggregate):
    """Aggregates whose state is a sketch; partials are the raw values of each segment, so a
    window's sketch sees every value exactly once however the input was batched."""

    def write(self, out: StateWriter, state: Any) -> None:
        out.blob(b"" if state is None else state.to_bytes())

    def read(self, src: StateReader) -> Any:
        data = src.blob()
        if not data:
            return None
        try:
            return from_bytes(data)
        except ValueError as error:
            raise MetricStateError(f"{self.func}() state: {error}") from None


_FEW_DISTINCT = 8
"""Up to this many values, a window's ``approx_distinct`` sketch is built value by value."""


class ApproxDistinct(SketchAggregate):
    """``approx_distinct``: a window holds its distinct values until there are more than
    :data:`SMALL_DISTINCT`, then a HyperLogLog. A HyperLogLog of ``p = 14`` is 16 KiB, and a
    grouped hopping metric holds one per group and window in flight; most such windows see a
    handful of values. The estimate is that of a HyperLogLog over the same values either way
    (it is built from them when needed), so results do not depend on the representation.
    """

    func = "approx_distinct"

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = column.values, hashable(column)
        return [values[lo:hi][valid[lo:hi]] for lo, hi in segment_slices(bounds, n)]

    def partial_one(self, value: Any) -> Any:
        return scalar_array(value) if scalar_hashable(value) else _NO_VALUES

    def absorb(self, state: Any, partial: Any) -> Any:
        if len(partial) == 0:
            return state
        if isinstance(state, HyperLogLog):
            return state.update(partial)
        held = 0 if state is None else len(state)
        if held + len(partial) <= 4 * SMALL_DISTINCT:
            # Python's dict treats equal values (1, 1.0, True) as one, as the sketches' hash
            # does, and is far cheaper than pd.unique for a few values.
            items = [] if state is None else state.tolist()
            distinct = list(dict.fromkeys([*items, *partial.tolist()]))
        else:
            values = partial.astype(object)
            if state is not None:
                values = np.concatenate([state, values])
            distinct = pd.unique(values).tolist()
        if len(distinct) > SMALL_DISTINCT:
            return HyperLogLog(HLL_PRECISION).update(distinct)
        kept = np.empty(len(distinct), dtype=object)
        kept[:] = distinct
        return kept

    def combine(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return b if a is None else a
        if isinstance(a, HyperLogLog) and isinstance(b, HyperLogLog):
            return a.merge(b)
        if isinstance(b, HyperLogLog):
            a, b = b, a
        return self.absorb(a, b)

    def result(self, state: Any) -> Any:
        if state is None:
            return 0
        if not isinstance(state, HyperLogLog):
            sketch = HyperLogLog(HLL_PRECISION)
            if len(state) <= _FEW_DISTINCT:
                # Registers keep a maximum, so value by value is the same sketch; hashing one
                # scalar skips the fixed cost of hashing an array.
                for value in state.tolist():
                    sketch.update(value)
            else:
                sketch.update(state)
            state = sketch
        return int(round(state.estimate()))

    def write(self, out: StateWriter, state: Any) -> None:
        if isinstance(state, HyperLogLog) or state is None:
            out.u8(0)
            super().write(out, state)
        else:
            out.u8(1)
            out.value([normalise_value(v) for v in state])

    def read(self, src: StateReader) -> Any:
        if src.u8() == 0:
            return super().read(src)
        items = src.value()
        if not isinstance(items, list):
            raise MetricStateError("approx_distinct() state: malformed value list")
        values = np.empty(len(items), dtype=object)
        values[:] = items
        return values


_DIGEST_CHUNK = 2048
"""Values a window buffers before handing them to its t-digest in one update (the digest's own
buffer size), since a digest update has a fixed cost that dominates for a value or two."""


class _Digest:
    """A t-digest with values not yet handed to it."""

    __slots__ = ("digest", "chunks", "pending")

    def __init__(self, digest: TDigest | None = None) -> None:
        self.digest = digest if digest is not None else TDigest(TDIGEST_COMPRESSION)
        self.chunks: list[np.ndarray] = []
        self.pending = 0

    def add(self, values: np.ndarray) -> _Digest:
        self.chunks.append(values)
        self.pending += len(values)
        if self.pending >= _DIGEST_CHUNK:
            self.flush()
        return self

    def flush(self) -> TDigest:
        if self.chunks:
            values = self.chunks[0] if len(self.chunks) == 1 else np.concatenate(self.chunks)
            self.digest.update(values)
            self.chunks, self.pending = [], 0
        return self.digest


class ApproxPercentile(Aggregate):
    func = "approx_percentile"

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = numbers(column)
        values = values.astype(np.float64)
        valid = valid & np.isfinite(values)
        return [values[lo:hi][valid[lo:hi]] for lo, hi in segment_slices(bounds, n)]

    def partial_one(self, value: Any) -> Any:
        number = _number(value)
        if number is None or not math.isfinite(number):
            return _NO_NUMBERS
        return np.array([number], dtype=np.float64)

    def absorb(self, state: Any, partial: Any) -> Any:
        if len(partial) == 0:
            return state
        return (state if state is not None else _Digest()).add(partial)

    def combine(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return b if a is None else a
        a.flush().merge(b.flush())
        return a

    def result(self, state: Any) -> Any:
        return None if state is None else float(state.flush().quantile(self.quantile))

    def write(self, out: StateWriter, state: Any) -> None:
        out.blob(b"" if state is None else state.flush().to_bytes())

    def read(self, src: StateReader) -> Any:
        data = src.blob()
        if not data:
            return None
        try:
            return _Digest(TDigest.from_bytes(data))
        except ValueError as error:
            raise MetricStateError(f"{self.func}() state: {error}") from None


class Seen(Aggregate):
    """``seen(f)``: a window's state is the set of hashes of its values; the verdict needs the
    group's history and is computed by the operator."""

    func = "seen"

    def partials(self, column: ValueColumn | None, bounds: np.ndarray, n: int) -> list[Any]:
        hashes, valid = hash_column(column)
        return [np.unique(hashes[lo:hi][valid[lo:hi]]) for lo, hi in segment_slices(bounds, n)]

    def partial_one(self, value: Any) -> Any:
        if not scalar_hashable(value):
            return _NO_HASHES
        return np.array([hash_value(value)], dtype=np.uint64)

    def combine(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return b if a is None else a
        return np.union1d(a, b)

    def absorb(self, state: Any, partial: Any) -> Any:
        if len(partial) == 0:
            return state
        if len(partial) == 1 and state is not None:
            # One event's hash: a sorted insert, the same set np.union1d would build.
            at = int(np.searchsorted(state, partial[0]))
            if at < len(state) and state[at] == partial[0]:
                return state
            return np.insert(state, at, partial[0])
        return self.combine(state, partial)

    def write(self, out: StateWriter, state: Any) -> None:
        out.array(np.zeros(0, dtype=np.uint64) if state is None else state)

    def read(self, src: StateReader) -> Any:
        hashes = src.array(np.uint64)
        return hashes if len(hashes) else None


AGGREGATES: Mapping[str, Callable[[int | None, float | None], Aggregate]] = {
    "sum": Sum,
    "avg": Average,
    "min": lambda arg, q: Extreme(arg, q, largest=False),
    "max": lambda arg, q: Extreme(arg, q, largest=True),
    "approx_distinct": ApproxDistinct,
    "approx_percentile": ApproxPercentile,
    "seen": Seen,
}
"""The aggregate of each function, built from ``(argument slot, quantile)``; ``count`` is
:class:`CountRows` or :class:`CountValues` depending on its arguments."""
