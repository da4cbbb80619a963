"""Count-Min sketch for approximate per-value counts, and a top-k heavy-hitters tracker built
on it; both mergeable, with vectorised updates."""

from __future__ import annotations

import math
import struct
from typing import Any, Self

import numpy as np

from sketches.base import Sketch, is_integer, read_exact
from sketches.errors import CorruptSketchError, InvalidParameterError, UnsupportedValueError
from sketches.hashing import HASH_ID, as_value_array, hash_value, hash_values, is_scalar

__all__ = ["CountMinSketch", "CountMinTopK"]

_LOW32 = np.uint64(0xFFFF_FFFF)
_SHIFT32 = np.uint64(32)
_CMS_PARAMS = struct.Struct("<IIQ")
_TOPK_PARAMS = struct.Struct("<IQ")
MAX_DEPTH = 64
MAX_CELLS = 1 << 28


class CountMinSketch(Sketch):
    """Approximate counts of values in a stream, never below the true count.

    A ``depth x width`` table of counters; each value adds its weight to one counter per row
    and its estimate is the smallest of its counters. With ``width = ceil(e / epsilon)`` and
    ``depth = ceil(ln(1 / delta))`` an estimate exceeds the true count by more than
    ``epsilon * total`` with probability at most ``delta`` (Cormode and Muthukrishnan). Row
    ``r`` uses the column ``((h1 + r * h2) mod 2**32) * width >> 32`` from the low and high
    halves of the value's 64-bit hash.

    Parameters
    ----------
    width
        Counters per row.
    depth
        Number of rows, 1 to 64.

    Examples
    --------
    >>> cms = CountMinSketch(width=2000, depth=5)
    >>> cms.update(["GET", "GET", "POST", "GET"]).update("PUT", weight=10)
    CountMinSketch(width=2000, depth=5)
    >>> cms.estimate(["GET", "POST", "PUT", "DELETE"]).tolist()
    [3, 1, 10, 0]
    >>> cms.estimate("GET"), cms.total
    (3, 14)
    """

    kind = 4
    hash_id = HASH_ID

    def __init__(self, width: int = 2048, depth: int = 5) -> None:
        for name, value, high in (("width", width, 1 << 32), ("depth", depth, MAX_DEPTH)):
            if not is_integer(value) or not 1 <= value <= high:
                raise InvalidParameterError(
                    f"{name} must be an integer in [1, {high}], got {value!r}"
                )
        if width * depth > MAX_CELLS:
            raise InvalidParameterError(
                f"width x depth = {width * depth} counters exceeds the maximum {MAX_CELLS}"
            )
        self._width = int(width)
        self._depth = int(depth)
        self._counts = np.zeros((self._depth, self._width), dtype=np.int64)
        self._total = 0

    @classmethod
    def from_error(cls, epsilon: float, delta: float) -> CountMinSketch:
        """Size a sketch whose estimates exceed the truth by at most ``epsilon * total`` with
        probability ``1 - delta``.

        Examples
        --------
        >>> CountMinSketch.from_error(epsilon=0.001, delta=0.01)
        CountMinSketch(width=2719, depth=5)
        """
        if not 0 < epsilon < 1 or not 0 < delta < 1:
            raise InvalidParameterError(
                f"epsilon and delta must be in (0, 1), got {epsilon!r}, {delta!r}"
            )
        return cls(width=math.ceil(math.e / epsilon), depth=math.ceil(math.log(1 / delta)))

    @property
    def width(self) -> int:
        """Counters per row."""
        return self._width

    @property
    def depth(self) -> int:
        """Number of rows."""
        return self._depth

    @property
    def total(self) -> int:
        """The sum of all weights added."""
        return self._total

    @property
    def is_empty(self) -> bool:
        return self._total == 0

    def _columns(self, hashes: np.ndarray) -> list[np.ndarray]:
        probe = hashes & _LOW32
        step = hashes >> _SHIFT32
        width = np.uint64(self._width)
        columns = []
        for row in range(self._depth):
            if row:
                probe += step
                probe &= _LOW32
            columns.append(((probe * width) >> _SHIFT32).view(np.int64))
        return columns

    def update(self, values: Any, weight: int | Any = 1) -> Self:
        """Add one value or a collection of values; returns ``self``.

        Parameters
        ----------
        values
            A scalar or a collection of values.
        weight
            A non-negative integer added per value, or one such integer per value.
        """
        self._update_hashes(hash_values(values), weight)
        return self

    def _update_hashes(self, hashes: np.ndarray, weight: int | Any) -> None:
        weights = _as_weights(weight, len(hashes))
        if len(hashes) == 0:
            return
        for row, columns in zip(self._counts, self._columns(hashes), strict=True):
            if weights is None:
                row += np.bincount(columns, minlength=self._width)
            else:
                np.add.at(row, columns, weights)
        self._total += len(hashes) if weights is None else int(weights.sum())

    def estimate(self, values: Any) -> int | np.ndarray:
        """Estimated count of each value: an int for a scalar, else an int64 array.

        Never below the true count; above it by at most ``e / width * total`` with
        probability ``1 - exp(-depth)``.
        """
        result = self._estimate_hashes(hash_values(values))
        return int(result[0]) if is_scalar(values) else result

    def _estimate_hashes(self, hashes: np.ndarray) -> np.ndarray:
        estimate = np.full(len(hashes), np.iinfo(np.int64).max, dtype=np.int64)
        for row, columns in zip(self._counts, self._columns(hashes), strict=True):
            np.minimum(estimate, row[columns], out=estimate)
        return estimate

    def merge(self, other: CountMinSketch) -> Self:
        """Fold ``other`` into this sketch (counter-wise sum); returns ``self``.

        Raises
        ------
        IncompatibleSketchError
            If ``other`` has another width, depth or hash function.
        """
        self._check_mergeable(other)
        self._counts += other._counts
        self._total += other._total
        return self

    def _parameters(self) -> tuple[Any, ...]:
        return (self._width, self._depth)

    def _body(self) -> bytes:
        return _CMS_PARAMS.pack(self._width, self._depth, self._total) + self._counts.tobytes()

    @classmethod
    def _from_body(cls, body: memoryview) -> CountMinSketch:
        sketch, end = cls._read(body, 0)
        if end != len(body):
            raise CorruptSketchError("CountMinSketch bytes have trailing data")
        return sketch

    @classmethod
    def _read(cls, body: memoryview, offset: int) -> tuple[CountMinSketch, int]:
        width, depth, total = read_exact(body, _CMS_PARAMS, offset, "CountMinSketch parameters")
        try:
            sketch = cls(width, depth)
        except InvalidParameterError as error:
            raise CorruptSketchError(f"CountMinSketch bytes hold bad parameters: {error}") from None
        start = offset + _CMS_PARAMS.size
        end = start + 8 * width * depth
        if end > len(body):
            raise CorruptSketchError("CountMinSketch bytes truncated in the counters")
        counts = np.frombuffer(body[start:end], dtype=np.int64).reshape(depth, width)
        # Every row counts every weight once, so each row sums to the total.
        if (counts < 0).any() or (counts.sum(axis=1) != total).any():
            raise CorruptSketchError("CountMinSketch counters do not add up to the total")
        sketch._counts[:] = counts
        sketch._total = total
        return sketch, end

    def copy(self) -> CountMinSketch:
        clone = type(self)(self._width, self._depth)
        clone._counts[:] = self._counts
        clone._total = self._total
        return clone

    def __repr__(self) -> str:
        return f"CountMinSketch(width={self._width}, depth={self._depth})"


class CountMinTopK(Sketch):
    """The ``k`` most frequent values of a stream (heavy hitters), with estimated counts.

    A Count-Min sketch counts every value; beside it the tracker keeps the ``k`` values with
    the highest estimates seen so far. After each batch (or merge), the kept values and the
    batch's distinct values are ranked by their current estimates and the best ``k`` kept,
    ties broken by hash so the result does not depend on arrival order. Values are identified
    by their hash, so ``1`` and ``1.0`` are one value (the first seen is reported).

    Parameters
    ----------
    k
        Number of heavy hitters to keep.
    width, depth
        Size of the underlying :class:`CountMinSketch`.

    Examples
    --------
    >>> top = CountMinTopK(k=2, width=1000, depth=4)
    >>> top.update(["a", "b", "a", "c", "a", "b"])
    CountMinTopK(k=2, width=1000, depth=4)
    >>> top.top()
    [('a', 3), ('b', 2)]
    """

    kind = 5
    hash_id = HASH_ID

    def __init__(self, k: int = 10, width: int = 2048, depth: int = 5) -> None:
        if not is_integer(k) or not 1 <= k <= 1 << 20:
            raise InvalidParameterError(f"k must be an integer in [1, {1 << 20}], got {k!r}")
        self._k = int(k)
        self._sketch = CountMinSketch(width, depth)
        # hash -> the value reported for it
        self._candidates: dict[int, Any] = {}

    @property
    def k(self) -> int:
        """The number of heavy hitters kept."""
        return self._k

    @property
    def sketch(self) -> CountMinSketch:
        """A copy of the underlying Count-Min sketch."""
        return self._sketch.copy()

    @property
    def is_empty(self) -> bool:
        return self._sketch.is_empty

    def update(self, values: Any, weight: int | Any = 1) -> Self:
        """Add one value or a collection of values (with optional weights); returns ``self``."""
        array = as_value_array(values)
        hashes = hash_values(array)
        self._sketch._update_hashes(hashes, weight)
        if len(hashes) == 0:
            return self
        unique, first = np.unique(hashes, return_index=True)
        # The best k of (kept values + this batch) lie among the kept values and the batch's
        # own best k, so only those k reach Python objects.
        best = _best(unique, self._sketch._estimate_hashes(unique), self._k)
        pool = dict(self._candidates)
        for h, i in zip(unique[best].tolist(), first[best].tolist(), strict=True):
            pool.setdefault(h, _plain(array[i]))
        self._select(pool)
        return self

    def _select(self, pool: dict[int, Any]) -> None:
        """Keep the ``k`` values of ``pool`` with the highest estimates (ties: lower hash)."""
        hashes = np.fromiter(pool, dtype=np.uint64, count=len(pool))
        best = _best(hashes, self._sketch._estimate_hashes(hashes), self._k)
        self._candidates = {h: pool[h] for h in hashes[best].tolist()}

    def top(self, n: int | None = None) -> list[tuple[Any, int]]:
        """The heavy hitters as ``(value, estimated count)``, most frequent first."""
        if not self._candidates:
            return []
        hashes = np.fromiter(self._candidates, dtype=np.uint64, count=len(self._candidates))
        estimates = self._sketch._estimate_hashes(hashes)
        order = _best(hashes, estimates, len(hashes) if n is None else n)
        return [(self._candidates[int(hashes[i])], int(estimates[i])) for i in order.tolist()]

    def estimate(self, values: Any) -> int | np.ndarray:
        """Estimated count of each value, as :meth:`CountMinSketch.estimate`."""
        return self._sketch.estimate(values)

    def merge(self, other: CountMinTopK) -> Self:
        """Fold ``other`` into this tracker; returns ``self``.

        The sketches are summed and the union of both sets of heavy hitters re-ranked, so
        ``a.merge(b)`` equals ``b.merge(a)`` (up to which of two equal values is reported).

        Raises
        ------
        IncompatibleSketchError
            If ``other`` has another ``k``, width, depth or hash function.
        """
        self._check_mergeable(other)
        self._sketch.merge(other._sketch)
        self._select({**other._candidates, **self._candidates})
        return self

    def _parameters(self) -> tuple[Any, ...]:
        return (self._k, *self._sketch._parameters())

    def _body(self) -> bytes:
        parts = [_TOPK_PARAMS.pack(self._k, len(self._candidates)), self._sketch._body()]
        for h in sorted(self._candidates):
            parts.append(struct.pack("<Q", h) + _encode_value(self._candidates[h]))
        return b"".join(parts)

    @classmethod
    def _from_body(cls, body: memoryview) -> CountMinTopK:
        k, count = read_exact(body, _TOPK_PARAMS, 0, "CountMinTopK parameters")
        sketch, offset = CountMinSketch._read(body, _TOPK_PARAMS.size)
        if not 1 <= k <= 1 << 20 or count > k:
            raise CorruptSketchError(f"CountMinTopK bytes hold {count} values for k={k}")
        tracker = cls(k, sketch.width, sketch.depth)
        tracker._sketch = sketch
        for _ in range(count):
            (h,) = read_exact(body, _HASH, offset, "a heavy hitter's hash")
            value, offset = _decode_value(body, offset + _HASH.size)
            if hash_value(value) != h:
                raise CorruptSketchError("CountMinTopK bytes hold a value that does not match")
            tracker._candidates[h] = value
        if offset != len(body):
            raise CorruptSketchError("CountMinTopK bytes have trailing data")
        return tracker

    def copy(self) -> CountMinTopK:
        clone = type(self)(self._k, self._sketch.width, self._sketch.depth)
        clone._sketch = self._sketch.copy()
        clone._candidates = dict(self._candidates)
        return clone

    def __repr__(self) -> str:
        return f"CountMinTopK(k={self._k}, width={self._sketch.width}, depth={self._sketch.depth})"


def _best(hashes: np.ndarray, estimates: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest estimates, highest first; equal estimates by lower hash."""
    if len(hashes) > 4 * k:
        # Keep every value tied with the k-th, so the hash tie-break below sees all of them.
        threshold = np.partition(estimates, len(estimates) - k)[len(estimates) - k]
        keep = np.flatnonzero(estimates >= threshold)
        return keep[np.lexsort((hashes[keep], -estimates[keep]))[:k]]
    return np.lexsort((hashes, -estimates))[:k]


def _as_weights(weight: int | Any, size: int) -> np.ndarray | None:
    """None for unit weights, else an int64 array of ``size`` non-negative weights."""
    if isinstance(weight, (int, np.integer)) and not isinstance(weight, (bool, np.bool_)):
        if weight < 0:
            raise InvalidParameterError(f"weights must be non-negative, got {weight}")
        return None if weight == 1 else np.full(size, weight, dtype=np.int64)
    weights = np.asarray(weight)
    if weights.dtype.kind not in "iu" or weights.shape != (size,):
        raise InvalidParameterError(
            f"weight must be an integer or {size} integers, got {weights.dtype} of shape "
            f"{weights.shape}"
        )
    if (weights < 0).any():
        raise InvalidParameterError("weights must be non-negative")
    return weights.astype(np.int64)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds, so it can be serialised."""
    return value.item() if isinstance(value, np.generic) else value


# Tagged encoding of a reported value: tag byte, then the value.
_HASH = struct.Struct("<Q")
_LENGTH = struct.Struct("<I")
_FLOAT = struct.Struct("<d")
_TAG_NONE, _TAG_FALSE, _TAG_TRUE, _TAG_INT, _TAG_FLOAT, _TAG_STR, _TAG_BYTES = range(7)


def _encode_value(value: Any) -> bytes:
    if value is None:
        return bytes([_TAG_NONE])
    if isinstance(value, bool):
        return bytes([_TAG_TRUE if value else _TAG_FALSE])
    if isinstance(value, int):
        payload = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return bytes([_TAG_INT]) + _LENGTH.pack(len(payload)) + payload
    if isinstance(value, float):
        return bytes([_TAG_FLOAT]) + _FLOAT.pack(value)
    if isinstance(value, str):
        payload = value.encode("utf-8", "surrogatepass")
        return bytes([_TAG_STR]) + _LENGTH.pack(len(payload)) + payload
    if isinstance(value, (bytes, bytearray, memoryview)):
        payload = bytes(value)
        return bytes([_TAG_BYTES]) + _LENGTH.pack(len(payload)) + payload
    raise UnsupportedValueError(f"cannot serialise a value of type {type(value).__name__!r}")


def _decode_value(body: memoryview, offset: int) -> tuple[Any, int]:
    if offset >= len(body):
        raise CorruptSketchError("CountMinTopK bytes truncated in a value")
    tag = body[offset]
    offset += 1
    if tag == _TAG_NONE:
        return None, offset
    if tag in (_TAG_FALSE, _TAG_TRUE):
        return tag == _TAG_TRUE, offset
    if tag == _TAG_FLOAT:
        (value,) = read_exact(body, _FLOAT, offset, "a float value")
        return value, offset + _FLOAT.size
    if tag not in (_TAG_INT, _TAG_STR, _TAG_BYTES):
        raise CorruptSketchError(f"CountMinTopK bytes hold an unknown value tag {tag}")
    (length,) = read_exact(body, _LENGTH, offset, "a value's length")
    start, end = offset + _LENGTH.size, offset + _LENGTH.size + length
    if end > len(body):
        raise CorruptSketchError("CountMinTopK bytes truncated in a value")
    payload = bytes(body[start:end])
    if tag == _TAG_INT:
        return int.from_bytes(payload, "little", signed=True), end
    if tag == _TAG_STR:
        try:
            return payload.decode("utf-8", "surrogatepass"), end
        except UnicodeDecodeError:
            raise CorruptSketchError("CountMinTopK bytes hold invalid UTF-8") from None
    return payload, end
