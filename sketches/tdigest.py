"""Merging t-digest (Dunning and Ertl, 2019) for quantiles and the CDF of numeric streams,
accurate in the tails; values are buffered and folded into the centroids with numpy sorts."""

from __future__ import annotations

import math
import struct
from typing import Any, Self

import numpy as np

from sketches.base import Sketch, read_exact
from sketches.errors import CorruptSketchError, InvalidParameterError, UnsupportedValueError

__all__ = ["TDigest"]

_PARAMS = struct.Struct("<dQdd")
MIN_COMPRESSION = 10.0
MAX_COMPRESSION = 100_000.0


class TDigest(Sketch):
    """Approximate quantiles of a stream of numbers, most precise near the extremes.

    The digest keeps weighted centroids (mean, count) sorted by mean. New values wait in a
    buffer; when it fills (or on a query, merge or serialisation) buffer and centroids are
    sorted together and cut into groups by Dunning's normalised k2 scale function
    ``k(q) = compression / Z(n) * log(q / (1 - q))``, ``Z(n) = 4 log(n / compression) + 24``
    (with ``n`` at least ``compression``):
    an item goes to group ``floor(2 k(q_mid))``, where ``q_mid`` is the quantile of its
    middle. Centroids thus shrink geometrically towards q = 0 and q = 1 (the extremes stay
    single values) and number about ``compression``. Quantiles interpolate linearly between
    centroid middles, and between the extreme centroids and the exact minimum and maximum.

    NaNs are skipped; infinite values are rejected.

    Parameters
    ----------
    compression
        Accuracy/size trade-off, ``delta`` in the papers (10 to 100000).

    Examples
    --------
    >>> import numpy as np
    >>> values = np.random.default_rng(7).lognormal(size=100_000)
    >>> digest = TDigest(compression=100).update(values)
    >>> digest.count, bool(digest.min == values.min())
    (100000, True)
    >>> exact = np.quantile(values, [0.5, 0.99])
    >>> bool(np.all(np.abs(digest.quantile([0.5, 0.99]) / exact - 1) < 0.02))
    True
    >>> round(digest.cdf(1.0), 2)
    0.5
    """

    kind = 3
    hash_id = 0

    def __init__(self, compression: float = 100) -> None:
        if (
            not isinstance(compression, (int, float, np.integer, np.floating))
            or not MIN_COMPRESSION <= compression <= MAX_COMPRESSION
        ):
            raise InvalidParameterError(
                f"compression must be a number in [{MIN_COMPRESSION:g}, {MAX_COMPRESSION:g}], "
                f"got {compression!r}"
            )
        self._compression = float(compression)
        self._means = np.empty(0, dtype=np.float64)
        self._weights = np.empty(0, dtype=np.float64)
        self._pending_arrays: list[np.ndarray] = []
        self._pending_scalars: list[float] = []
        self._pending = 0
        self._buffer_limit = max(2048, int(20 * self._compression))
        self._min = math.inf
        self._max = -math.inf

    @property
    def compression(self) -> float:
        """The compression parameter, delta."""
        return self._compression

    @property
    def count(self) -> int:
        """The number of values added."""
        return int(self._weights.sum()) + self._pending

    @property
    def min(self) -> float:
        """The smallest value added (NaN if empty)."""
        return self._min if self.count else math.nan

    @property
    def max(self) -> float:
        """The largest value added (NaN if empty)."""
        return self._max if self.count else math.nan

    @property
    def is_empty(self) -> bool:
        return self.count == 0

    def centroids(self) -> tuple[np.ndarray, np.ndarray]:
        """Return copies of the centroid means and weights, sorted by mean."""
        self._compress()
        return self._means.copy(), self._weights.copy()

    def update(self, values: Any) -> Self:
        """Add one number or a collection of numbers; returns ``self``."""
        if isinstance(values, (int, float, np.integer, np.floating)) and not isinstance(
            values, (bool, np.bool_)
        ):
            value = float(values)
            if math.isnan(value):
                return self
            self._check_finite(value)
            self._pending_scalars.append(value)
            self._pending += 1
            self._min = min(self._min, value)
            self._max = max(self._max, value)
        else:
            array = _as_float_array(values)
            if array.size and np.isnan(array).any():
                array = array[~np.isnan(array)]
            if array.size == 0:
                return self
            low, high = float(array.min()), float(array.max())
            self._check_finite(low)
            self._check_finite(high)
            self._pending_arrays.append(array)
            self._pending += len(array)
            self._min = min(self._min, low)
            self._max = max(self._max, high)
        if self._pending >= self._buffer_limit:
            self._compress()
        return self

    @staticmethod
    def _check_finite(value: float) -> None:
        if math.isinf(value):
            raise UnsupportedValueError("a t-digest cannot summarise infinite values")

    def _compress(self) -> None:
        """Fold the buffer into the centroids."""
        if not self._pending:
            return
        values = self._pending_arrays
        if self._pending_scalars:
            values = [*values, np.array(self._pending_scalars, dtype=np.float64)]
        values = np.sort(np.concatenate(values))
        if len(self._means):
            means = np.concatenate([self._means, values])
            weights = np.concatenate([self._weights, np.ones(len(values))])
            # Two sorted runs: a stable sort merges them in linear time, centroids first on ties.
            order = np.argsort(means, kind="stable")
            means, weights = means[order], weights[order]
        else:
            means, weights = values, np.ones(len(values))
        self._means, self._weights = self._cluster(means, weights)
        self._pending_arrays, self._pending_scalars, self._pending = [], [], 0

    def _cluster(self, means: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Group sorted (mean, weight) items by the k2 scale; return the new centroids."""
        cumulative = np.cumsum(weights)
        total = cumulative[-1]
        below = cumulative - weights / 2
        above = total - below
        normaliser = 4 * math.log(max(total / self._compression, 1.0)) + 24
        # log(q / (1 - q)) from the masses on either side, exact even for q within 1/n of 1.
        scale = 2 * self._compression / normaliser * (np.log(below) - np.log(above))
        groups = np.floor(scale)
        starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        ends = np.r_[starts[1:], len(means)] - 1
        new_weights = np.add.reduceat(weights, starts)
        new_means = np.add.reduceat(weights * means, starts) / new_weights
        # Rounding can push a group's mean past its members; keep the means sorted.
        new_means = np.clip(new_means, means[starts], means[ends])
        return new_means, new_weights

    def _knots(self) -> tuple[np.ndarray, np.ndarray]:
        """Piecewise-linear map from rank to value through the centroid middles.

        Value ``i`` of ``n`` sorted singletons sits at rank ``i + 0.5``, so that with rank
        ``0.5 + q (n - 1)`` an all-singleton digest answers exactly as ``numpy.quantile``.
        """
        self._compress()
        ranks = np.cumsum(self._weights) - self._weights / 2
        total = float(self._weights.sum())
        return np.r_[0.5, ranks, total - 0.5], np.r_[self._min, self._means, self._max]

    def quantile(self, q: float | Any) -> float | np.ndarray:
        """Estimate the ``q``-quantile(s); ``q`` is a number or an array of numbers in [0, 1].

        Returns a float for a scalar ``q``, else an array of the same shape; NaN if empty.
        Follows ``numpy.quantile``'s default (linear) definition, which it reproduces exactly
        while every centroid is a single value.

        Examples
        --------
        >>> digest = TDigest().update(np.arange(1, 1001))
        >>> digest.quantile(0.5), digest.quantile([0.0, 0.25, 1.0]).tolist()
        (500.5, [1.0, 250.75, 1000.0])
        """
        qs = np.asarray(q, dtype=np.float64)
        if np.isnan(qs).any() or (qs < 0).any() or (qs > 1).any():
            raise InvalidParameterError(f"quantiles must lie in [0, 1], got {q!r}")
        if self.is_empty:
            result = np.full(qs.shape, np.nan)
        else:
            ranks, values = self._knots()
            result = _interpolate(0.5 + qs * (ranks[-1] - 0.5), ranks, values)
        return float(result) if result.ndim == 0 else result

    def cdf(self, x: float | Any) -> float | np.ndarray:
        """Estimate the fraction of values ``<= x``; ``x`` is a number or an array.

        The inverse of :meth:`quantile` between the minimum and the maximum: 0 below the
        minimum, 1 from the maximum on. Returns a float for a scalar ``x``, else an array of
        the same shape; NaN if empty.

        Examples
        --------
        >>> digest = TDigest().update(np.arange(1, 1001))
        >>> digest.cdf(0), digest.cdf(500.5), digest.cdf(1000)
        (0.0, 0.5, 1.0)
        """
        xs = np.asarray(x, dtype=np.float64)
        if self.is_empty:
            result = np.full(xs.shape, np.nan)
        else:
            ranks, values = self._knots()
            span = max(ranks[-1] - 0.5, 1.0)
            result = (_interpolate(xs, values, ranks) - 0.5) / span
            result = np.where(xs < self._min, 0.0, np.where(xs >= self._max, 1.0, result))
        return float(result) if result.ndim == 0 else result

    def merge(self, other: TDigest) -> Self:
        """Fold ``other`` into this digest; returns ``self``.

        The result depends only on the two digests' centroids, so ``a.merge(b)`` and
        ``b.merge(a)`` are equal.

        Raises
        ------
        IncompatibleSketchError
            If ``other`` is not a TDigest with the same compression.
        """
        self._check_mergeable(other)
        other = other.copy()
        other._compress()
        self._compress()
        if len(other._means):
            means = np.concatenate([self._means, other._means])
            weights = np.concatenate([self._weights, other._weights])
            order = np.lexsort((weights, means))
            self._means, self._weights = self._cluster(means[order], weights[order])
            self._min = min(self._min, other._min)
            self._max = max(self._max, other._max)
        return self

    def _parameters(self) -> tuple[Any, ...]:
        return (self._compression,)

    def _body(self) -> bytes:
        self._compress()
        header = _PARAMS.pack(self._compression, len(self._means), self._min, self._max)
        return header + self._means.tobytes() + self._weights.astype(np.uint64).tobytes()

    @classmethod
    def _from_body(cls, body: memoryview) -> TDigest:
        compression, size, low, high = read_exact(body, _PARAMS, 0, "TDigest parameters")
        if not MIN_COMPRESSION <= compression <= MAX_COMPRESSION:
            raise CorruptSketchError(f"TDigest bytes hold an invalid compression {compression}")
        if len(body) != _PARAMS.size + 16 * size:
            raise CorruptSketchError(
                f"TDigest bytes hold {len(body) - _PARAMS.size} bytes of centroids, expected "
                f"{16 * size}"
            )
        means = np.frombuffer(body, dtype=np.float64, count=size, offset=_PARAMS.size).copy()
        weights = np.frombuffer(
            body, dtype=np.uint64, count=size, offset=_PARAMS.size + 8 * size
        ).astype(np.float64)
        if size and not (
            np.isfinite(means).all()
            and (np.diff(means) >= 0).all()
            and (weights >= 1).all()
            and low <= means[0]
            and means[-1] <= high
        ):
            raise CorruptSketchError("TDigest bytes hold unsorted or out-of-range centroids")
        if not size and (low, high) != (math.inf, -math.inf):
            raise CorruptSketchError("TDigest bytes hold a range but no centroids")
        digest = cls(compression)
        digest._means, digest._weights = means, weights
        digest._min, digest._max = low, high
        return digest

    def copy(self) -> TDigest:
        clone = type(self)(self._compression)
        clone._means, clone._weights = self._means.copy(), self._weights.copy()
        clone._pending_arrays = list(self._pending_arrays)
        clone._pending_scalars = list(self._pending_scalars)
        clone._pending = self._pending
        clone._min, clone._max = self._min, self._max
        return clone

    def __repr__(self) -> str:
        return f"TDigest(compression={self._compression:g})"


def _as_float_array(values: Any) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise UnsupportedValueError("a t-digest summarises numbers only")
    try:
        # Always a copy, so later changes to the caller's array cannot reach the buffer.
        return np.array(values, dtype=np.float64).ravel()
    except (TypeError, ValueError) as error:
        raise UnsupportedValueError(f"a t-digest summarises numbers only: {error}") from None


def _interpolate(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Linear interpolation like ``np.interp`` but defined for repeated ``xp`` (steps)."""
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    x0, x1 = xp[j], xp[j + 1]
    width = x1 - x0
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(width > 0, (np.clip(x, x0, x1) - x0) / width, 1.0)
    return fp[j] + t * (fp[j + 1] - fp[j])
