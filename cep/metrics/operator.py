"""Windowed ``metric`` analytics: compiles a metric declaration into an event-time window operator
with exact and sketch-backed aggregates, watermark-driven final results, corrections for late
events, and a versioned byte encoding of its whole state.

The operator is pure: the engine hands it batches (or single events) and watermarks and gets
result rows back. See ``docs/metrics.md`` for the semantics.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import math
import struct
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cep.events.event import EngineError, StateError
from cep.events.watermark import iso_ms
from cep.metrics.windows import (
    FIXED,
    SESSION,
    SLIDING_EVENT,
    WindowShape,
    assign_fixed,
    session_runs,
)
from query_lang.ast import Call, Expr, FieldRef, Literal, MetricDecl, Node, Span, StreamDecl
from query_lang.compiler import (
    CompileError,
    Scope,
    SearchHook,
    compile_columnar_predicate,
    compile_expr,
    compile_masked,
    compile_predicate,
    normalise_value,
    value_kind,
)
from query_lang.functions import METRIC_AGGREGATES
from query_lang.printer import print_declaration
from sketches import BloomFilter, HyperLogLog, TDigest, from_bytes, hash_values

__all__ = [
    "HLL_PRECISION",
    "SEEN_CAPACITY",
    "SEEN_ERROR_RATE",
    "SEEN_EXACT_LIMIT",
    "SMALL_DISTINCT",
    "STATE_VERSION",
    "TDIGEST_COMPRESSION",
    "CompiledMetric",
    "MetricCompileError",
    "MetricError",
    "MetricInputError",
    "MetricOperator",
    "MetricStateError",
    "compile_metric",
    "metric_match_id",
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

STATE_VERSION = 1
"""Version of :meth:`MetricOperator.to_bytes`'s format."""

_MAGIC = b"VGMO"
_NO_WATERMARK = -(2**63)


# ---------------------------------------------------------------- errors


class MetricError(EngineError, ValueError):
    """Root of the errors of metric compilation and evaluation."""


class MetricCompileError(MetricError):
    """A metric declaration cannot be compiled; the message names the metric and the place."""


class MetricInputError(MetricError):
    """A batch or event handed to the operator cannot be used (missing time, too old)."""


class MetricStateError(StateError):
    """Operator state bytes are truncated, corrupted, of another version or another metric."""


# ---------------------------------------------------------------- aggregates


@dataclass(frozen=True)
class _Column:
    """Values of one aggregate argument over the rows being absorbed, nulls as a mask."""

    values: np.ndarray
    valid: np.ndarray

    def take(self, index: np.ndarray) -> _Column:
        return _Column(self.values[index], self.valid[index])

    def __len__(self) -> int:
        return len(self.valid)


def _concat_columns(a: _Column, b: _Column) -> _Column:
    return _Column(np.concatenate([a.values, b.values]), np.concatenate([a.valid, b.valid]))


def _numbers(column: _Column) -> tuple[np.ndarray, np.ndarray]:
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


def _segment_counts(valid: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    if len(valid) == 0:
        return np.zeros(len(bounds), dtype=np.int64)
    return np.add.reduceat(valid.astype(np.int64), bounds)


def _segment_slices(bounds: np.ndarray, n: int) -> list[tuple[int, int]]:
    starts = bounds.tolist()
    return list(zip(starts, [*starts[1:], n], strict=True))


class _Aggregate:
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

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        raise NotImplementedError

    def absorb(self, state: Any, partial: Any) -> Any:
        return self.combine(state, partial)

    def combine(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        return state

    def write(self, out: _Writer, state: Any) -> None:
        out.value(state)

    def read(self, src: _Reader) -> Any:
        return src.value()


class _CountRows(_Aggregate):
    func = "count"

    def empty(self) -> Any:
        return 0

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        return np.diff(np.append(bounds, n)).tolist()

    def combine(self, a: Any, b: Any) -> Any:
        return a + b


class _CountValues(_CountRows):
    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        return _segment_counts(column.valid, bounds).tolist()


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


class _Sum(_Aggregate):
    func = "sum"

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = _numbers(column)
        counts = _segment_counts(valid, bounds)
        if values.dtype.kind == "i":
            magnitude = int(np.abs(values[valid]).max()) if valid.any() else 0
            if magnitude * max(len(values), 1) < 2**62:
                sums = np.add.reduceat(np.where(valid, values, 0), bounds).tolist()
            else:  # could overflow int64: add Python ints, which are exact
                sums = [
                    sum(int(v) for v in values[lo:hi][valid[lo:hi]])
                    for lo, hi in _segment_slices(bounds, n)
                ]
        else:
            sums = np.add.reduceat(np.where(valid, values, 0.0), bounds).tolist()
        return [s if c else None for s, c in zip(sums, counts.tolist(), strict=True)]

    def combine(self, a: Any, b: Any) -> Any:
        return _add(a, b)


class _Average(_Aggregate):
    func = "avg"

    def __init__(self, arg: int | None, quantile: float | None = None) -> None:
        super().__init__(arg, quantile)
        self._sum = _Sum(arg)

    def empty(self) -> Any:
        return (None, 0)

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        _, valid = _numbers(column)
        sums = self._sum.partials(column, bounds, n)
        return list(zip(sums, _segment_counts(valid, bounds).tolist(), strict=True))

    def combine(self, a: Any, b: Any) -> Any:
        return (_add(a[0], b[0]), a[1] + b[1])

    def result(self, state: Any) -> Any:
        total, count = state
        return None if not count else total / count

    def write(self, out: _Writer, state: Any) -> None:
        out.value(state[0])
        out.value(state[1])

    def read(self, src: _Reader) -> Any:
        return (src.value(), src.value())


_MIXED = ("mixed", None)
"""An extreme over values of different kinds (a number and a string): its result is null."""


class _Extreme(_Aggregate):
    """``min``/``max``: numbers, strings or booleans, null when a window mixes kinds."""

    def __init__(self, arg: int | None, quantile: float | None = None, *, largest: bool) -> None:
        super().__init__(arg, quantile)
        self.largest = largest
        self.func = "max" if largest else "min"

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = column.values, column.valid
        kind = values.dtype.kind
        counts = _segment_counts(valid, bounds).tolist()
        if kind in "iuf":
            if kind == "f":
                valid = valid & ~np.isnan(values)
                counts = _segment_counts(valid, bounds).tolist()
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
        for lo, hi in _segment_slices(bounds, n):
            state = None
            for value in values[lo:hi][valid[lo:hi]]:
                value = normalise_value(value)
                state = self.combine(state, (value_kind(value), value))
            partials.append(state)
        return partials

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

    def write(self, out: _Writer, state: Any) -> None:
        if state is None:
            out.u8(0)
        elif state is _MIXED:
            out.u8(1)
        else:
            out.u8(2)
            out.value(state[0])
            out.value(state[1])

    def read(self, src: _Reader) -> Any:
        tag = src.u8()
        if tag == 0:
            return None
        if tag == 1:
            return _MIXED
        if tag == 2:
            return (src.value(), src.value())
        raise MetricStateError(f"unknown {self.func}() state tag {tag}")


class _SketchAggregate(_Aggregate):
    """Aggregates whose state is a sketch; partials are the raw values of each segment, so a
    window's sketch sees every value exactly once however the input was batched."""

    def write(self, out: _Writer, state: Any) -> None:
        out.blob(b"" if state is None else state.to_bytes())

    def read(self, src: _Reader) -> Any:
        data = src.blob()
        if not data:
            return None
        try:
            return from_bytes(data)
        except ValueError as error:
            raise MetricStateError(f"{self.func}() state: {error}") from None


class _ApproxDistinct(_SketchAggregate):
    """``approx_distinct``: a window holds its distinct values until there are more than
    :data:`SMALL_DISTINCT`, then a HyperLogLog. A HyperLogLog of ``p = 14`` is 16 KiB, and a
    grouped hopping metric holds one per group and window in flight; most such windows see a
    handful of values. The estimate is that of a HyperLogLog over the same values either way
    (it is built from them when needed), so results do not depend on the representation.
    """

    func = "approx_distinct"

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = column.values, _hashable(column)
        return [values[lo:hi][valid[lo:hi]] for lo, hi in _segment_slices(bounds, n)]

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
            state = HyperLogLog(HLL_PRECISION).update(state)
        return int(round(state.estimate()))

    def write(self, out: _Writer, state: Any) -> None:
        if isinstance(state, HyperLogLog) or state is None:
            out.u8(0)
            super().write(out, state)
        else:
            out.u8(1)
            out.value([normalise_value(v) for v in state])

    def read(self, src: _Reader) -> Any:
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


class _ApproxPercentile(_Aggregate):
    func = "approx_percentile"

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        values, valid = _numbers(column)
        values = values.astype(np.float64)
        valid = valid & np.isfinite(values)
        return [values[lo:hi][valid[lo:hi]] for lo, hi in _segment_slices(bounds, n)]

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

    def write(self, out: _Writer, state: Any) -> None:
        out.blob(b"" if state is None else state.flush().to_bytes())

    def read(self, src: _Reader) -> Any:
        data = src.blob()
        if not data:
            return None
        try:
            return _Digest(TDigest.from_bytes(data))
        except ValueError as error:
            raise MetricStateError(f"{self.func}() state: {error}") from None


class _Seen(_Aggregate):
    """``seen(f)``: a window's state is the set of hashes of its values; the verdict needs the
    group's history and is computed by the operator."""

    func = "seen"

    def partials(self, column: _Column | None, bounds: np.ndarray, n: int) -> list[Any]:
        hashes, valid = _hash_column(column)
        return [np.unique(hashes[lo:hi][valid[lo:hi]]) for lo, hi in _segment_slices(bounds, n)]

    def combine(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return b if a is None else a
        return np.union1d(a, b)

    def absorb(self, state: Any, partial: Any) -> Any:
        if len(partial) == 0:
            return state
        return self.combine(state, partial)

    def write(self, out: _Writer, state: Any) -> None:
        out.array(np.zeros(0, dtype=np.uint64) if state is None else state)

    def read(self, src: _Reader) -> Any:
        hashes = src.array(np.uint64)
        return hashes if len(hashes) else None


_SCALAR_INFERRED = frozenset(
    {"string", "integer", "floating", "mixed-integer-float", "boolean", "empty"}
)


def _hashable(column: _Column) -> np.ndarray:
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


def _hash_column(column: _Column) -> tuple[np.ndarray, np.ndarray]:
    values, valid = column.values, _hashable(column)
    hashes = np.zeros(len(values), dtype=np.uint64)
    if valid.any():
        hashes[valid] = hash_values(values[valid])
    return hashes, valid


class _History:
    """The values a group has shown so far, for ``seen``.

    Recent values are kept with the time each first occurred; once no window that may still
    be evaluated starts before that time, a value is only needed as "seen before", and moves
    to the *older* set: an exact sorted set of hashes while it holds at most
    :data:`SEEN_EXACT_LIMIT` values (no larger than the Bloom filter would be), then the Bloom
    filter. So "occurred before this window's start" is exact up to the Bloom filter's false
    positives, and small groups cost little memory.
    """

    def __init__(self) -> None:
        self.bloom: BloomFilter | None = None
        self.older = np.zeros(0, dtype=np.uint64)
        self.hashes = np.zeros(0, dtype=np.uint64)
        self.first_ts = np.zeros(0, dtype=np.int64)
        self.horizon = _NO_WATERMARK

    def add(self, hashes: np.ndarray, ts: np.ndarray) -> None:
        if len(hashes) == 0:
            return
        old = ts < self.horizon
        if old.any():
            self._retire(hashes[old])
            hashes, ts = hashes[~old], ts[~old]
        h = np.concatenate([self.hashes, hashes])
        t = np.concatenate([self.first_ts, ts])
        order = np.lexsort((t, h))
        h, t = h[order], t[order]
        first = np.r_[True, h[1:] != h[:-1]] if len(h) else np.zeros(0, dtype=bool)
        self.hashes, self.first_ts = h[first], t[first]

    def fold(self, horizon: int) -> None:
        """Retire values first seen before ``horizon`` to the older set."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        old = self.first_ts < horizon
        if old.any():
            self._retire(self.hashes[old])
            self.hashes, self.first_ts = self.hashes[~old], self.first_ts[~old]

    def _retire(self, hashes: np.ndarray) -> None:
        if self.bloom is not None:
            self.bloom.update(hashes)
            return
        self.older = np.union1d(self.older, hashes)
        if len(self.older) > SEEN_EXACT_LIMIT:
            self.bloom = BloomFilter(SEEN_CAPACITY, SEEN_ERROR_RATE).update(self.older)
            self.older = np.zeros(0, dtype=np.uint64)

    def all_seen_before(self, hashes: np.ndarray | None, start: int) -> bool:
        """Whether every hash occurred before ``start`` (true for no hashes)."""
        if hashes is None or len(hashes) == 0:
            return True
        rest = hashes[~(_members(self.hashes, hashes, self.first_ts < start)
                        | _members(self.older, hashes))]
        if len(rest) == 0:
            return True
        return self.bloom is not None and bool(self.bloom.contains(rest).all())

    def write(self, out: _Writer) -> None:
        out.blob(b"" if self.bloom is None else self.bloom.to_bytes())
        out.array(self.older)
        out.array(self.hashes)
        out.array(self.first_ts)
        out.i64(self.horizon)

    @classmethod
    def read(cls, src: _Reader) -> _History:
        history = cls()
        data = src.blob()
        if data:
            try:
                history.bloom = BloomFilter.from_bytes(data)
            except ValueError as error:
                raise MetricStateError(f"seen() history: {error}") from None
        history.older = src.array(np.uint64)
        history.hashes = src.array(np.uint64)
        history.first_ts = src.array(np.int64)
        history.horizon = src.i64()
        if len(history.hashes) != len(history.first_ts):
            raise MetricStateError("seen() history: hashes and times differ in length")
        return history


def _members(
    sorted_set: np.ndarray, hashes: np.ndarray, where: np.ndarray | None = None
) -> np.ndarray:
    """For each hash, whether it is in ``sorted_set`` (at a position ``where`` allows)."""
    if len(sorted_set) == 0:
        return np.zeros(len(hashes), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, hashes), len(sorted_set) - 1)
    found = sorted_set[at] == hashes
    return found if where is None else found & where[at]


_AGGREGATES: Mapping[str, Callable[[int | None, float | None], _Aggregate]] = {
    "sum": _Sum,
    "avg": _Average,
    "min": lambda arg, q: _Extreme(arg, q, largest=False),
    "max": lambda arg, q: _Extreme(arg, q, largest=True),
    "approx_distinct": _ApproxDistinct,
    "approx_percentile": _ApproxPercentile,
    "seen": _Seen,
}


# ---------------------------------------------------------------- compilation


@dataclass(frozen=True)
class CompiledMetric:
    """A metric declaration compiled for the window operator; immutable and shareable.

    Attributes
    ----------
    name, version:
        The metric's name and version (part of every ``match_id``).
    decl:
        The declaration it was compiled from.
    shape:
        The window, reduced to mode, size and step.
    by:
        Group fields.
    lateness_ms:
        How long windows are kept after they fire, for corrections: the largest lateness of
        the metric's streams (or the override given to :func:`compile_metric`).
    select_names:
        Output value names, in ``select`` order.
    fingerprint:
        sha256 of the definition; state bytes only load into an operator of the same metric.
    """

    name: str
    version: int
    decl: MetricDecl = dataclasses.field(repr=False)
    shape: WindowShape
    by: tuple[str, ...]
    lateness_ms: int
    select_names: tuple[str, ...]
    severity: str
    fingerprint: bytes
    where_batch: Callable[[pd.DataFrame], np.ndarray] | None = dataclasses.field(repr=False)
    where_event: Callable[..., bool] | None = dataclasses.field(repr=False)
    args_batch: tuple[Callable[[pd.DataFrame], Any], ...] = dataclasses.field(repr=False)
    args_event: tuple[Callable[..., Any], ...] = dataclasses.field(repr=False)
    aggregates: tuple[_Aggregate, ...] = dataclasses.field(repr=False)
    select: tuple[Callable[..., Any], ...] = dataclasses.field(repr=False)
    having: Callable[..., bool] | None = dataclasses.field(repr=False)

    @property
    def uses_seen(self) -> bool:
        """Whether a ``seen`` aggregate needs per-group history."""
        return any(isinstance(a, _Seen) for a in self.aggregates)


def _slot(i: int) -> str:
    # Not an identifier, so it cannot collide with a field a user can name.
    return f"#aggregate{i}"


def _replace_aggregates(node: Any, found: list[Call]) -> Any:
    """``node`` with every metric aggregate call replaced by a reference to its result slot."""
    if isinstance(node, Call) and node.func in METRIC_AGGREGATES:
        if node not in found:
            found.append(node)
        return FieldRef(_slot(found.index(node)))
    if not isinstance(node, Node) or not dataclasses.is_dataclass(node):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Node):
            new = _replace_aggregates(value, found)
        elif isinstance(value, tuple) and any(isinstance(v, Node) for v in value):
            new = tuple(_replace_aggregates(v, found) for v in value)
        else:
            continue
        if new is not value:
            changes[f.name] = new
    return dataclasses.replace(node, **changes) if changes else node


def compile_metric(
    metric: MetricDecl,
    *,
    streams: Mapping[str, StreamDecl],
    lists: Mapping[str, Container[Any]] | None = None,
    search: SearchHook | None = None,
    lateness_ms: int | None = None,
    version: int = 1,
) -> CompiledMetric:
    """Compile a ``metric`` declaration for :class:`MetricOperator`.

    Parameters
    ----------
    metric:
        The declaration, as the parser builds it (checked by ``query_lang``).
    streams:
        Declared streams by name; the metric's ``from`` streams must be among them.
    lists:
        Declared lists by name, each a container (``x in LIST`` in ``where``).
    search:
        The percolator's per-field search hook, for ``search(...)`` in ``where``.
    lateness_ms:
        Overrides the retention of fired windows (default: the largest ``lateness`` of the
        metric's streams, 0 when none is declared).
    version:
        The metric's version, part of every ``match_id``.

    Raises
    ------
    MetricCompileError
        Naming the metric and the place: an undeclared stream, a ``by`` field that is a list,
        a malformed aggregate, an expression that cannot be compiled.
    """
    where = f"metric '{metric.name}'"

    def fail(message: str, node: Node | Span | None = None) -> MetricCompileError:
        span = node if isinstance(node, Span) else getattr(node, "span", None)
        if span is None or not span.line:
            span = metric.span
        at = f"{span.file}:{span.line}:{span.column}: " if span.line else ""
        return MetricCompileError(f"{at}{where}: {message}")

    try:
        shape = WindowShape.from_ast(metric.window)
    except ValueError as error:
        raise fail(str(error), metric.window) from None
    missing = [s for s in metric.streams if s not in streams]
    if missing:
        raise fail(f"reads undeclared stream '{missing[0]}'")
    for field_name in metric.by:
        for s in metric.streams:
            if streams[s].field_type(field_name) in ("list<string>", "text"):
                raise fail(
                    f"cannot group by '{field_name}', a {streams[s].field_type(field_name)} "
                    "field; group by single values"
                )
    if lateness_ms is None:
        lateness_ms = max(
            (streams[s].lateness.ms for s in metric.streams if streams[s].lateness is not None),
            default=0,
        )
    scope = Scope(streams=frozenset(metric.streams), lists=dict(lists or {}), search=search)
    found: list[Call] = []
    select_exprs = [_replace_aggregates(item.expr, found) for item in metric.select]
    arg_exprs: list[Expr] = []
    aggregates: list[_Aggregate] = []
    for call in found:
        aggregates.append(_build_aggregate(call, arg_exprs, fail))
    try:
        where_batch = where_event = None
        if metric.where is not None:
            where_batch = compile_columnar_predicate(metric.where, scope)
            where_event = compile_predicate(metric.where, scope)
        args_batch = tuple(compile_masked(e, scope) for e in arg_exprs)
        args_event = tuple(compile_expr(e, scope) for e in arg_exprs)
        select = tuple(compile_expr(e, scope) for e in select_exprs)
        having = None if metric.having is None else compile_predicate(metric.having, scope)
    except CompileError as error:
        raise fail(error.message, error.span) from None
    names = tuple(item.name for item in metric.select)
    if len(set(names)) != len(names):
        raise fail("select produces the same name twice; rename one with 'as'")
    definition = json.dumps(
        [print_declaration(metric), shape.mode, shape.size_ms, shape.every_ms, lateness_ms,
         version, HLL_PRECISION, TDIGEST_COMPRESSION, SEEN_CAPACITY, SEEN_ERROR_RATE]
    )
    return CompiledMetric(
        name=metric.name,
        version=version,
        decl=metric,
        shape=shape,
        by=tuple(metric.by),
        lateness_ms=int(lateness_ms),
        select_names=names,
        severity=metric.severity,
        fingerprint=hashlib.sha256(definition.encode("utf-8")).digest(),
        where_batch=where_batch,
        where_event=where_event,
        args_batch=args_batch,
        args_event=args_event,
        aggregates=tuple(aggregates),
        select=select,
        having=having,
    )


def _build_aggregate(
    call: Call, arg_exprs: list[Expr], fail: Callable[[str, Node | None], Exception]
) -> _Aggregate:
    def argument(expr: Expr) -> int:
        if expr not in arg_exprs:
            arg_exprs.append(expr)
        return arg_exprs.index(expr)

    if call.func == "count":
        if not call.args:
            return _CountRows(None)
        if len(call.args) != 1:
            raise fail("count() takes no argument or one field", call)
        return _CountValues(argument(call.args[0]))
    if call.func == "approx_percentile":
        if len(call.args) != 2:
            raise fail("approx_percentile() takes a field and a quantile, as in "
                       "approx_percentile(amount, 0.99)", call)
        q = call.args[1]
        if not (
            isinstance(q, Literal) and isinstance(q.value, int | float)
            and not isinstance(q.value, bool) and 0 <= q.value <= 1
        ):
            raise fail("the quantile of approx_percentile() must be a number from 0 to 1", q)
        return _ApproxPercentile(argument(call.args[0]), float(q.value))
    if len(call.args) != 1:
        raise fail(f"{call.func}() takes one argument", call)
    return _AGGREGATES[call.func](argument(call.args[0]), None)


def metric_match_id(
    name: str, version: int, key: Mapping[str, Any], start_ms: int, end_ms: int, revision: int
) -> str:
    """The deterministic id of one metric result: 32 hex chars of sha256 over its identity.

    A correction has a higher ``revision`` and so a new id; a replay of the same input yields
    the same ids, so downstream deduplication works.

    Examples
    --------
    >>> a = metric_match_id("m", 1, {"k": "x"}, 0, 60_000, 0)
    >>> len(a), a == metric_match_id("m", 1, {"k": "x"}, 0, 60_000, 1)
    (32, False)
    """
    canonical = json.dumps(
        ["metric", name, version, dict(key), start_ms, end_ms, revision],
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


# ---------------------------------------------------------------- operator state


class _Window:
    """One window of one group: its extent, aggregate states and what was reported for it.

    ``revision`` is the revision of the last result computed (-1: none yet); ``last`` the values
    of that result, so a late event that changes nothing produces no correction. A session
    that absorbed a reported session inherits its revision and has ``last = None``.
    """

    __slots__ = ("start", "end", "last_ts", "states", "fired", "revision", "last")

    def __init__(self, start: int, end: int, states: list[Any] | None, last_ts: int = 0) -> None:
        self.start = start
        self.end = end
        self.last_ts = last_ts
        self.states = states
        self.fired = False
        self.revision = -1
        self.last: tuple | None = None


class _RowBuffer:
    """The recent rows of a group, sorted by time, from which per-event sliding windows are
    computed (an event's window ``(t - D, t]`` is a slice)."""

    def __init__(self, ts: np.ndarray, columns: list[_Column]) -> None:
        self.ts = ts
        self.columns = columns

    def add(self, ts: np.ndarray, columns: list[_Column]) -> None:
        all_ts = np.concatenate([self.ts, ts])
        order = np.argsort(all_ts, kind="stable")
        self.ts = all_ts[order]
        self.columns = [
            _concat_columns(old, new).take(order)
            for old, new in zip(self.columns, columns, strict=True)
        ]

    def drop_before(self, ts: int) -> None:
        cut = int(np.searchsorted(self.ts, ts, side="left"))
        if cut:
            self.ts = self.ts[cut:]
            self.columns = [c.take(np.arange(cut, len(c))) for c in self.columns]


class _Group:
    __slots__ = ("key", "windows", "rows", "history")

    def __init__(self, key: tuple, n_seen: int) -> None:
        self.key = key
        self.windows: dict[int, _Window] = {}
        self.rows: _RowBuffer | None = None
        self.history = [_History() for _ in range(n_seen)]


# ---------------------------------------------------------------- the operator


class MetricOperator:
    """Runs one compiled metric over events in event time.

    The engine calls :meth:`process_batch` with on-time events and the current watermark (or
    :meth:`process` for one event), :meth:`advance_watermark` when time moves without events,
    and :meth:`late` for an event older than the watermark. Each returns result rows (dicts,
    see ``docs/metrics.md``) in the order (window end, window start, key).

    Parameters
    ----------
    compiled:
        The metric, from :func:`compile_metric`.
    """

    def __init__(self, compiled: CompiledMetric) -> None:
        self.compiled = compiled
        self.watermark = _NO_WATERMARK
        self._groups: dict[tuple, _Group] = {}
        self._fire_queue: list[tuple[int, int, tuple, int]] = []
        self._purge_queue: list[tuple[int, int, tuple, int]] = []
        self._tiebreak = 0
        self._next_session = 0
        self._seen_slots = [i for i, a in enumerate(compiled.aggregates) if isinstance(a, _Seen)]

    # ------------------------------------------------------------ public API

    @property
    def open_windows(self) -> int:
        """Windows held (open, or fired and retained for corrections), over all groups."""
        return sum(len(g.windows) for g in self._groups.values())

    @property
    def is_empty(self) -> bool:
        """Whether the operator holds nothing: no group has a window or a ``seen`` history."""
        return not self._groups

    @property
    def next_due_ms(self) -> int | None:
        """The smallest watermark at which :meth:`advance_watermark` has work (a window to fire
        or to forget), or ``None``: where a caller that stores the operator sets its timer."""
        heads = [queue[0][0] for queue in (self._fire_queue, self._purge_queue) if queue]
        return min(heads) if heads else None

    def process_batch(self, df: pd.DataFrame, watermark_ms: int | None = None) -> list[dict]:
        """Absorb a batch of events, then move to ``watermark_ms`` and return what closed.

        Parameters
        ----------
        df:
            One row per event of the metric's stream(s): the fields, ``ts`` (epoch ms, or a
            datetime column) and optionally ``_seq`` (input order, to order equal times).
        watermark_ms:
            The engine's watermark after this batch; ``None`` leaves it where it is.

        Raises
        ------
        MetricInputError
            When ``ts`` is missing or null, or an event is older than the operator's
            watermark (those must go through :meth:`late`).
        """
        if len(df):
            ts = _time_column(df, self.compiled.name)
            self._check_on_time(ts)
            if "_seq" in df.columns:
                order = np.lexsort((df["_seq"].to_numpy(), ts))
            else:
                order = np.argsort(ts, kind="stable")
            if not np.array_equal(order, np.arange(len(order))):
                df = df.iloc[order]
                ts = ts[order]
            if self.compiled.where_batch is not None:
                keep = self.compiled.where_batch(df)
                if not keep.all():
                    df, ts = df[keep], ts[keep]
            if len(df):
                keys, codes = _group_codes(df, self.compiled.by)
                columns = [_masked(f(df)) for f in self.compiled.args_batch]
                self._ingest(ts, keys, codes, columns)
        return self.advance_watermark(watermark_ms) if watermark_ms is not None else []

    def process(
        self, event_fields: Mapping[str, Any], ts_ms: int, watermark_ms: int | None = None
    ) -> list[dict]:
        """Absorb one event (fields by name, event time in ms); with ``watermark_ms``, then move
        the watermark and return what closed. Same results as :meth:`process_batch`."""
        ts_ms = int(ts_ms)
        self._check_on_time(np.array([ts_ms], dtype=np.int64))
        self._ingest_event(event_fields, ts_ms)
        return self.advance_watermark(watermark_ms) if watermark_ms is not None else []

    def advance_watermark(self, wm_ms: int) -> list[dict]:
        """Move the watermark to ``wm_ms`` (it never moves back): emit the final result of every
        window whose end is at or before it, and forget windows retained long enough."""
        wm_ms = int(wm_ms)
        if wm_ms < self.watermark:
            return []
        # At the same watermark there can still be work: windows a late event left to forget.
        self.watermark = wm_ms
        rows, _ = self._fire_due()
        self._purge()
        return _ordered(rows)

    def late(
        self, event_fields: Mapping[str, Any], ts_ms: int, watermark_ms: int
    ) -> list[dict] | None:
        """Handle an event older than the watermark.

        Returns ``None`` when a window it belongs to has already been forgotten (the engine
        dead-letters it as ``late``); otherwise counts it and returns the corrections of the
        windows whose results changed (possibly none). An event the metric's ``where``
        rejects is not needed, so it returns ``[]``.
        """
        ts_ms = int(ts_ms)
        where = self.compiled.where_event
        if where is not None and not where(event_fields):
            return []
        if ts_ms >= self.watermark:
            self._ingest_event(event_fields, ts_ms)
            return []
        if not self._retained(ts_ms, max(self.watermark, int(watermark_ms))):
            return None
        key = self._ingest_event(event_fields, ts_ms)
        rows, fired_now = self._fire_due()
        group = self._groups.get(key)
        if group is not None:
            for wid, window in sorted(group.windows.items(), key=lambda kv: kv[1].end):
                if window.fired and window.end > ts_ms and (key, wid) not in fired_now:
                    row = self._evaluate(group, window)
                    if row is not None:
                        rows.append(row)
        return _ordered(rows)

    # ------------------------------------------------------------ ingestion

    def _check_on_time(self, ts: np.ndarray) -> None:
        if len(ts) and self.watermark != _NO_WATERMARK and ts.min() < self.watermark:
            oldest = int(ts.min())
            raise MetricInputError(
                f"metric '{self.compiled.name}': an event at {iso_ms(oldest)} is older than "
                f"the watermark {iso_ms(self.watermark)}; hand late events to late()"
            )

    def _retained(self, ts_ms: int, watermark: int) -> bool:
        shape = self.compiled.shape
        lateness = self.compiled.lateness_ms
        if shape.mode == SESSION:
            # A session closed before wm - lateness may have been forgotten; an event there
            # could have bridged it, so only later events can be counted exactly.
            return ts_ms >= watermark - lateness
        return shape.earliest_end(ts_ms) + lateness > watermark

    def _ingest_event(self, event_fields: Mapping[str, Any], ts_ms: int) -> tuple | None:
        """Absorb one event; returns its group key, or None when ``where`` rejects it."""
        compiled = self.compiled
        if compiled.where_event is not None and not compiled.where_event(event_fields):
            return None
        key = tuple(normalise_value(event_fields.get(f)) for f in compiled.by)
        columns = [_scalar_column(f(event_fields)) for f in compiled.args_event]
        self._ingest(np.array([ts_ms], dtype=np.int64), [key], np.zeros(1, np.int64), columns)
        return key

    def _group(self, key: tuple) -> _Group:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key, len(self._seen_slots))
        return group

    def _schedule(self, queue: list, due: int, key: tuple, wid: int) -> None:
        self._tiebreak += 1
        heapq.heappush(queue, (due, self._tiebreak, key, wid))

    def _ingest(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[_Column]
    ) -> None:
        """Absorb events that passed ``where``, sorted by time: ``keys[codes[i]]`` is event
        ``i``'s group, ``columns`` the values of each aggregate argument."""
        shape = self.compiled.shape
        if self._seen_slots:
            self._record_history(ts, keys, codes, columns)
        if shape.mode == FIXED:
            self._ingest_fixed(ts, keys, codes, columns)
        elif shape.mode == SLIDING_EVENT:
            self._ingest_sliding(ts, keys, codes, columns)
        else:
            self._ingest_sessions(ts, keys, codes, columns)

    def _record_history(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[_Column]
    ) -> None:
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        for h, slot in enumerate(self._seen_slots):
            hashes, valid = _hash_column(columns[self.compiled.aggregates[slot].arg])
            hashes, valid, times = hashes[order], valid[order], ts[order]
            for lo, hi in _segment_slices(bounds, len(order)):
                group = self._group(keys[sorted_codes[lo]])
                keep = valid[lo:hi]
                group.history[h].add(hashes[lo:hi][keep], times[lo:hi][keep])

    def _partials(self, columns: list[_Column], order: np.ndarray, bounds: np.ndarray) -> list:
        """Per aggregate, the partial results of each segment of the rows ``order`` picks."""
        taken: dict[int, _Column] = {}
        result = []
        n = len(order)
        for aggregate in self.compiled.aggregates:
            column = None
            if aggregate.arg is not None:
                column = taken.get(aggregate.arg)
                if column is None:
                    column = taken[aggregate.arg] = columns[aggregate.arg].take(order)
            result.append(aggregate.partials(column, bounds, n))
        return result

    def _fresh_states(self) -> list[Any]:
        return [a.empty() for a in self.compiled.aggregates]

    def _ingest_fixed(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[_Column]
    ) -> None:
        shape = self.compiled.shape
        rows, starts = assign_fixed(ts, shape.size_ms, shape.every_ms)
        pair_codes = codes[rows]
        order = np.lexsort((starts, pair_codes))
        rows, starts, pair_codes = rows[order], starts[order], pair_codes[order]
        change = np.empty(len(starts), dtype=bool)
        change[:1] = True
        change[1:] = (pair_codes[1:] != pair_codes[:-1]) | (starts[1:] != starts[:-1])
        bounds = np.flatnonzero(change)
        partials = self._partials(columns, rows, bounds)
        aggregates = self.compiled.aggregates
        for i, lo in enumerate(bounds.tolist()):
            key = keys[pair_codes[lo]]
            start = int(starts[lo])
            group = self._group(key)
            window = group.windows.get(start)
            if window is None:
                end = start + shape.size_ms
                window = group.windows[start] = _Window(start, end, self._fresh_states())
                self._schedule(self._fire_queue, end, key, start)
            states = window.states
            for j, aggregate in enumerate(aggregates):
                states[j] = aggregate.absorb(states[j], partials[j][i])

    def _ingest_sliding(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[_Column]
    ) -> None:
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        for lo, hi in _segment_slices(bounds, len(order)):
            key = keys[sorted_codes[lo]]
            group = self._group(key)
            picked = order[lo:hi]
            group_ts = ts[picked]
            group_columns = [c.take(picked) for c in columns]
            if group.rows is None:
                group.rows = _RowBuffer(group_ts, group_columns)
            else:
                group.rows.add(group_ts, group_columns)
            size = self.compiled.shape.size_ms
            for t in np.unique(group_ts).tolist():
                # A time already reported is recomputed by the late path, not re-created.
                if t not in group.windows:
                    group.windows[t] = _Window(t - size + 1, t + 1, None)
                    self._schedule(self._fire_queue, t + 1, key, t)

    def _ingest_sessions(
        self, ts: np.ndarray, keys: list[tuple], codes: np.ndarray, columns: list[_Column]
    ) -> None:
        gap = self.compiled.shape.size_ms
        order = np.lexsort((ts, codes))
        sorted_codes, sorted_ts = codes[order], ts[order]
        group_bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        runs = []
        for lo, hi in _segment_slices(group_bounds, len(order)):
            runs.extend((lo + r) for r in session_runs(sorted_ts[lo:hi], gap).tolist())
        bounds = np.array(sorted(set(runs)), dtype=np.int64)
        partials = self._partials(columns, order, bounds)
        aggregates = self.compiled.aggregates
        for i, (lo, hi) in enumerate(_segment_slices(bounds, len(order))):
            key = keys[sorted_codes[lo]]
            group = self._group(key)
            first, last = int(sorted_ts[lo]), int(sorted_ts[hi - 1])
            states = self._fresh_states()
            for j, aggregate in enumerate(aggregates):
                states[j] = aggregate.absorb(states[j], partials[j][i])
            self._merge_session(key, group, first, last, states)

    def _merge_session(
        self, key: tuple, group: _Group, first: int, last: int, states: list[Any]
    ) -> None:
        gap = self.compiled.shape.size_ms
        overlapping = [
            (sid, w) for sid, w in group.windows.items()
            if w.start < last + gap and first < w.end
        ]
        aggregates = self.compiled.aggregates
        if len(overlapping) == 1:
            sid, window = overlapping[0]
            if window.start <= first and last <= window.last_ts:
                # Inside a known session: its extent (and so its identity) stays.
                for j, aggregate in enumerate(aggregates):
                    window.states[j] = aggregate.combine(window.states[j], states[j])
                return
        revision = -1
        for sid, window in overlapping:
            del group.windows[sid]
            first = min(first, window.start)
            last = max(last, window.last_ts)
            revision = max(revision, window.revision)
            states = [
                aggregate.combine(window.states[j], states[j])
                for j, aggregate in enumerate(aggregates)
            ]
        sid = self._next_session
        self._next_session += 1
        merged = _Window(first, last + gap, states, last_ts=last)
        merged.revision = revision
        group.windows[sid] = merged
        self._schedule(self._fire_queue, merged.end, key, sid)

    # ------------------------------------------------------------ firing and purging

    def _fire_due(self) -> tuple[list[dict], set[tuple[tuple, int]]]:
        """Fire every window whose end the watermark reached; the rows and which fired."""
        rows = []
        fired: set[tuple[tuple, int]] = set()
        queue = self._fire_queue
        while queue and queue[0][0] <= self.watermark:
            due, _, key, wid = heapq.heappop(queue)
            group = self._groups.get(key)
            window = None if group is None else group.windows.get(wid)
            if window is None or window.fired or window.end != due:
                continue  # replaced: a session that grew or merged
            window.fired = True
            fired.add((key, wid))
            self._schedule(self._purge_queue, window.end + self.compiled.lateness_ms, key, wid)
            row = self._evaluate(group, window)
            if row is not None:
                rows.append(row)
        return rows, fired

    def _purge(self) -> None:
        queue = self._purge_queue
        touched: dict[tuple, _Group] = {}
        while queue and queue[0][0] <= self.watermark:
            due, _, key, wid = heapq.heappop(queue)
            group = self._groups.get(key)
            window = None if group is None else group.windows.get(wid)
            if window is None or not window.fired or window.end + self.compiled.lateness_ms != due:
                continue
            del group.windows[wid]
            touched[key] = group
        for key, group in touched.items():
            self._tidy(key, group)

    def _horizon(self, group: _Group) -> int:
        """Earliest start of any window of ``group`` that may still be evaluated."""
        shape = self.compiled.shape
        lateness = self.compiled.lateness_ms
        if shape.mode == SESSION:
            starts = [w.start for w in group.windows.values()]
            return min([*starts, self.watermark - lateness])
        return self.watermark - shape.size_ms - lateness

    def _tidy(self, key: tuple, group: _Group) -> None:
        horizon = self._horizon(group)
        for history in group.history:
            history.fold(horizon)
        if group.rows is not None:
            group.rows.drop_before(horizon)
            if len(group.rows.ts) == 0:
                group.rows = None
        if not group.windows and group.rows is None and not group.history:
            del self._groups[key]

    def _window_states(self, group: _Group, window: _Window) -> list[Any]:
        if window.states is not None:
            return window.states
        # A per-event sliding window: fold the rows of (t - D, t] into fresh states.
        rows = group.rows
        lo = int(np.searchsorted(rows.ts, window.start, side="left"))
        hi = int(np.searchsorted(rows.ts, window.end, side="left"))
        index = np.arange(lo, hi)
        partials = self._partials(rows.columns, index, np.zeros(1, dtype=np.int64))
        return [
            aggregate.absorb(aggregate.empty(), partials[j][0])
            for j, aggregate in enumerate(self.compiled.aggregates)
        ]

    def _evaluate(self, group: _Group, window: _Window) -> tuple[tuple, dict] | None:
        """Compute a window's result; when it changed and passes ``having``, returns its row
        with the key rows of one call are ordered by."""
        compiled = self.compiled
        states = self._window_states(group, window)
        row: dict[str, Any] = dict(zip(compiled.by, group.key, strict=True))
        seen_index = 0
        for j, aggregate in enumerate(compiled.aggregates):
            if isinstance(aggregate, _Seen):
                history = group.history[seen_index]
                seen_index += 1
                row[_slot(j)] = history.all_seen_before(states[j], window.start)
            else:
                row[_slot(j)] = aggregate.result(states[j])
        values = tuple(select(row) for select in compiled.select)
        if window.last is not None and values == window.last:
            return None
        window.revision += 1
        window.last = values
        named = dict(zip(compiled.select_names, values, strict=True))
        if compiled.having is not None:
            if not compiled.having({**dict(zip(compiled.by, group.key, strict=True)), **named}):
                return None
        if compiled.shape.mode == SLIDING_EVENT:
            start_ms, end_ms = window.start - 1, window.end - 1  # shown as (t - D, t]
        else:
            start_ms, end_ms = window.start, window.end
        key = dict(zip(compiled.by, group.key, strict=True))
        window_json = {"start": iso_ms(start_ms), "end": iso_ms(end_ms)}
        order = (end_ms, start_ms, json.dumps(key, sort_keys=True, default=str), window.revision)
        return order, {
            "kind": "metric",
            "name": compiled.name,
            "version": compiled.version,
            "match_id": metric_match_id(
                compiled.name, compiled.version, key, start_ms, end_ms, window.revision
            ),
            "key": key,
            "window": window_json,
            "values": {name: _json_value(v) for name, v in named.items()},
            "final": True,
            "correction": window.revision > 0,
            "revision": window.revision,
            "severity": compiled.severity,
            "start": window_json["start"],
            "end": window_json["end"],
        }

    # ------------------------------------------------------------ state bytes

    def to_bytes(self) -> bytes:
        """The operator's whole state: watermark, groups, windows and their sketches.

        The format is versioned and explicit (sketches in their own byte format); it records
        the metric's fingerprint, so it only loads into an operator of the same definition.
        """
        out = _Writer()
        out.raw(_MAGIC)
        out.u8(STATE_VERSION)
        out.raw(self.compiled.fingerprint)
        out.i64(self.watermark)
        out.i64(self._next_session)
        out.u32(len(self._groups))
        aggregates = self.compiled.aggregates
        for group in self._groups.values():
            out.value(group.key)
            for history in group.history:
                history.write(out)
            out.u8(group.rows is not None)
            if group.rows is not None:
                out.array(group.rows.ts)
                out.u32(len(group.rows.columns))
                for column in group.rows.columns:
                    out.column(column)
            out.u32(len(group.windows))
            for wid, window in group.windows.items():
                out.i64(wid)
                out.i64(window.start)
                out.i64(window.end)
                out.i64(window.last_ts)
                out.u8(window.fired)
                out.i64(window.revision)
                out.value(window.last)
                out.u8(window.states is not None)
                if window.states is not None:
                    for aggregate, state in zip(aggregates, window.states, strict=True):
                        aggregate.write(out, state)
        return out.finish()

    @classmethod
    def from_bytes(cls, compiled: CompiledMetric, data: bytes) -> MetricOperator:
        """Rebuild an operator of ``compiled`` from :meth:`to_bytes` output.

        Raises
        ------
        MetricStateError
            When the bytes are truncated or corrupted, of another format version, or were
            written by an operator of another metric definition.
        """
        src = _Reader(data, compiled.name)
        if src.raw(4) != _MAGIC:
            raise MetricStateError(f"metric '{compiled.name}': not metric operator state")
        version = src.u8()
        if version != STATE_VERSION:
            raise MetricStateError(
                f"metric '{compiled.name}': state format version {version} is not supported "
                f"(this version reads {STATE_VERSION})"
            )
        if src.raw(32) != compiled.fingerprint:
            raise MetricStateError(
                f"metric '{compiled.name}': the state was written for another definition of "
                "the metric"
            )
        operator = cls(compiled)
        operator.watermark = src.i64()
        operator._next_session = src.i64()
        n_seen = len(operator._seen_slots)
        for _ in range(src.u32()):
            key = src.value()
            if not isinstance(key, tuple) or len(key) != len(compiled.by):
                raise MetricStateError(f"metric '{compiled.name}': malformed group key")
            group = operator._groups[key] = _Group(key, 0)
            group.history = [_History.read(src) for _ in range(n_seen)]
            if src.u8():
                ts = src.array(np.int64)
                columns = [src.column() for _ in range(src.u32())]
                group.rows = _RowBuffer(ts, columns)
            for _ in range(src.u32()):
                wid, start, end, last_ts = src.i64(), src.i64(), src.i64(), src.i64()
                fired, revision, last = bool(src.u8()), src.i64(), src.value()
                states = None
                if src.u8():
                    states = [a.read(src) for a in compiled.aggregates]
                window = _Window(start, end, states, last_ts)
                window.fired, window.revision, window.last = fired, revision, last
                group.windows[wid] = window
                if fired:
                    due = end + compiled.lateness_ms
                    operator._schedule(operator._purge_queue, due, key, wid)
                else:
                    operator._schedule(operator._fire_queue, end, key, wid)
        src.done()
        return operator


# ---------------------------------------------------------------- helpers


def _ordered(rows: list[tuple[tuple, dict]]) -> list[dict]:
    """Rows in the order (window end, window start, key, revision)."""
    return [row for _, row in sorted(rows, key=lambda pair: pair[0])]


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _time_column(df: pd.DataFrame, name: str) -> np.ndarray:
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


def _group_codes(df: pd.DataFrame, by: Sequence[str]) -> tuple[list[tuple], np.ndarray]:
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


def _masked(result: Any) -> _Column:
    return _Column(np.asarray(result.values), np.asarray(result.valid, dtype=bool))


def _scalar_column(value: Any) -> _Column:
    """One evaluated value as a one-row column typed as a batch column would be."""
    value = normalise_value(value)
    kind = value_kind(value)
    if kind == "null":
        return _Column(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=bool))
    if kind == "num" and type(value) is int and -(2**63) <= value < 2**63:
        return _Column(np.array([value], dtype=np.int64), np.ones(1, dtype=bool))
    if kind == "num":
        return _Column(np.array([float(value)], dtype=np.float64), np.ones(1, dtype=bool))
    if kind == "bool":
        return _Column(np.array([value], dtype=bool), np.ones(1, dtype=bool))
    column = np.empty(1, dtype=object)
    column[0] = value
    return _Column(column, np.ones(1, dtype=bool))


# ---------------------------------------------------------------- byte encoding

_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_DTYPES = {0: np.int64, 1: np.float64, 2: np.bool_, 3: np.uint64}
_DTYPE_CODES = {np.dtype(t): code for code, t in _DTYPES.items()}


class _Writer:
    """Little-endian, length-prefixed encoding of the operator's state, closed by a checksum."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self._parts.append(data)

    def u8(self, value: int) -> None:
        self._parts.append(bytes([int(value)]))

    def u32(self, value: int) -> None:
        self._parts.append(_U32.pack(value))

    def i64(self, value: int) -> None:
        self._parts.append(_I64.pack(value))

    def blob(self, data: bytes) -> None:
        self.u32(len(data))
        self._parts.append(data)

    def array(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values)
        code = _DTYPE_CODES.get(values.dtype)
        if code is None:
            raise MetricStateError(f"cannot encode an array of {values.dtype}")
        self.u8(code)
        self.blob(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())

    def column(self, column: _Column) -> None:
        self.array(column.valid)
        if column.values.dtype in _DTYPE_CODES:
            self.u8(0)
            self.array(column.values)
        else:
            self.u8(1)
            self.u32(len(column.values))
            for value, valid in zip(column.values.tolist(), column.valid.tolist(), strict=True):
                self.value(normalise_value(value) if valid else None)

    def value(self, value: Any) -> None:
        """A Python scalar or tuple, tagged with its kind."""
        if value is None:
            self.u8(0)
        elif value is False or value is True:
            self.u8(2 if value else 1)
        elif isinstance(value, int):
            if -(2**63) <= value < 2**63:
                self.u8(3)
                self.i64(value)
            else:
                self.u8(4)
                self.blob(value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True))
        elif isinstance(value, float):
            self.u8(5)
            self._parts.append(_F64.pack(value))
        elif isinstance(value, str):
            self.u8(6)
            self.blob(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, tuple | list):
            self.u8(7 if isinstance(value, tuple) else 8)
            self.u32(len(value))
            for item in value:
                self.value(item)
        else:
            raise MetricStateError(f"cannot encode a value of type {type(value).__name__}")

    def finish(self) -> bytes:
        body = b"".join(self._parts)
        return body + hashlib.sha256(body).digest()[:8]


class _Reader:
    """Reads what :class:`_Writer` wrote, raising MetricStateError on any inconsistency."""

    def __init__(self, data: bytes, metric: str) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise MetricStateError(f"metric '{metric}': state must be bytes, not "
                                   f"{type(data).__name__}")
        data = bytes(data)
        self._metric = metric
        if len(data) < 8 or hashlib.sha256(data[:-8]).digest()[:8] != data[-8:]:
            raise MetricStateError(f"metric '{metric}': state bytes truncated or corrupted")
        self._data = memoryview(data)[:-8]
        self._at = 0

    def raw(self, n: int) -> bytes:
        if self._at + n > len(self._data):
            raise MetricStateError(f"metric '{self._metric}': state bytes end too early")
        chunk = bytes(self._data[self._at : self._at + n])
        self._at += n
        return chunk

    def u8(self) -> int:
        return self.raw(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self.raw(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self.raw(8))[0]

    def blob(self) -> bytes:
        return self.raw(self.u32())

    def array(self, expected: Any | None = None) -> np.ndarray:
        code = self.u8()
        dtype = _DTYPES.get(code)
        if dtype is None or (expected is not None and np.dtype(dtype) != np.dtype(expected)):
            raise MetricStateError(f"metric '{self._metric}': unexpected array type {code}")
        data = self.blob()
        if len(data) % np.dtype(dtype).itemsize:
            raise MetricStateError(f"metric '{self._metric}': ragged array bytes")
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)

    def column(self) -> _Column:
        valid = self.array(np.bool_)
        if self.u8() == 0:
            values = self.array()
        else:
            values = np.empty(self.u32(), dtype=object)
            for i in range(len(values)):
                values[i] = self.value()
        if len(values) != len(valid):
            raise MetricStateError(f"metric '{self._metric}': column lengths differ")
        return _Column(values, valid)

    def value(self) -> Any:
        tag = self.u8()
        if tag == 0:
            return None
        if tag in (1, 2):
            return tag == 2
        if tag == 3:
            return self.i64()
        if tag == 4:
            return int.from_bytes(self.blob(), "little", signed=True)
        if tag == 5:
            return _F64.unpack(self.raw(8))[0]
        if tag == 6:
            return self.blob().decode("utf-8", "surrogatepass")
        if tag in (7, 8):
            items = [self.value() for _ in range(self.u32())]
            return tuple(items) if tag == 7 else items
        raise MetricStateError(f"metric '{self._metric}': unknown value tag {tag}")

    def done(self) -> None:
        if self._at != len(self._data):
            raise MetricStateError(f"metric '{self._metric}': trailing bytes after the state")
