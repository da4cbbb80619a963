"""Builtin scalar functions of the Vigil expression language (``lower``, ``distance_km`` ...):
their signatures, and the kernels the expression compiler applies to one value or to a column.

Kernels only ever see non-null arguments of the declared kinds; null and type handling is the
compiler's job, so every function obeys the same rule: a null or mistyped argument gives null.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = [
    "EARTH_RADIUS_KM",
    "METRIC_AGGREGATES",
    "MS_PER_HOUR",
    "MS_PER_MINUTE",
    "PATTERN_AGGREGATES",
    "SCALAR_FUNCTIONS",
    "ScalarFunction",
    "haversine_km",
    "map_distinct",
]

EARTH_RADIUS_KM = 6371.0088
"""Mean earth radius (IUGG), the radius ``distance_km`` uses."""

MS_PER_HOUR = 3_600_000.0
MS_PER_MINUTE = 60_000.0

PATTERN_AGGREGATES = frozenset({"count", "sum", "avg", "min", "max"})
"""Aggregates a rule condition may apply to a pattern variable: ``count(v)``, ``sum(v.f)`` ..."""

METRIC_AGGREGATES = frozenset(
    {"count", "sum", "avg", "min", "max", "approx_distinct", "approx_percentile", "seen"}
)
"""Aggregates of a metric's ``select``; anywhere else they are an error."""

ArgumentKind = Literal["num", "str"]

_INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class ScalarFunction:
    """A builtin function of one event's values.

    Parameters
    ----------
    name
        The name users call it by.
    params
        The kind of each parameter: ``"num"`` (int or float, not bool) or ``"str"``.
    scalar
        Kernel over Python values of those kinds; returns the result (NaN counts as null).
    vector
        Kernel over numpy arrays of those kinds (int64/float64 for ``"num"``, object arrays of
        ``str`` for ``"str"``), broadcasting like a ufunc. An object-dtype result holds exact
        Python values where a fixed-width dtype would overflow.
    summary
        One line for error messages and documentation, such as ``lower(s)``.
    """

    name: str
    params: tuple[ArgumentKind, ...]
    scalar: Callable[..., Any]
    vector: Callable[..., np.ndarray]
    summary: str

    @property
    def arity(self) -> int:
        """Number of arguments the function takes."""
        return len(self.params)


def haversine_km(lat1: Any, lon1: Any, lat2: Any, lon2: Any) -> Any:
    """Great-circle distance in kilometres between two points given in degrees.

    Works on floats and numpy arrays alike. Both go through the same numpy ufuncs so that one
    event and a column of events give bit-identical distances (``math.asin`` and ``np.arcsin``
    can differ in the last bit, which would make ``distance_km(...) > 900`` disagree at the
    boundary).

    Examples
    --------
    >>> round(float(haversine_km(48.8566, 2.3522, 51.5074, -0.1278)), 1)  # Paris - London
    343.6
    >>> float(haversine_km(10.0, 20.0, 10.0, 20.0))
    0.0
    """
    phi1 = np.radians(lat1)
    phi2 = np.radians(lat2)
    half_dphi = np.sin((phi2 - phi1) * 0.5)
    half_dlambda = np.sin((np.radians(lon2) - np.radians(lon1)) * 0.5)
    # x * x rather than x ** 2: numpy scalars and arrays take different code paths for power.
    a = half_dphi * half_dphi + np.cos(phi1) * np.cos(phi2) * (half_dlambda * half_dlambda)
    # Rounding can push `a` a hair outside [0, 1] for antipodal points; sqrt/arcsin would NaN.
    return (2.0 * EARTH_RADIUS_KM) * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def map_distinct(
    function: Callable[[Any], Any], values: np.ndarray, dtype: Any = object
) -> np.ndarray:
    """Apply a Python function once per distinct value of an array and spread the results.

    Used where no vectorised kernel exists (regular expressions, substring tests, list
    membership): event columns such as country or merchant repeat values heavily, so the
    Python-level work is proportional to the number of distinct values, not rows. ``function``
    receives plain Python values (``int``, ``float``, ``str``, ``bool``), never numpy scalars.

    Examples
    --------
    >>> map_distinct(len, np.array(["ab", "c", "ab"], dtype=object), dtype=np.int64)
    array([2, 1, 2])
    """
    if values.ndim == 0:
        out = np.empty((), dtype=dtype)
        out[()] = function(values.tolist())
        return out
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    uniques = np.asarray(uniques).tolist()
    results = np.empty(len(uniques), dtype=dtype)
    for i, unique in enumerate(uniques):
        results[i] = function(unique)
    return results[codes]


def _lower(s: str) -> str:
    return s.lower()


def _upper(s: str) -> str:
    return s.upper()


def _abs_vector(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "i" and np.any(x == _INT64_MIN):
        # |int64 min| does not fit in int64; Python ints keep the exact value.
        return np.abs(x.astype(object))
    return np.abs(x)


def _hours(ms: Any) -> Any:
    return ms / MS_PER_HOUR


def _minutes(ms: Any) -> Any:
    return ms / MS_PER_MINUTE


def _distance_scalar(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    with np.errstate(all="ignore"):  # inf coordinates give NaN, which the compiler makes null
        return float(haversine_km(float(lat1), float(lon1), float(lat2), float(lon2)))


def _distance_vector(*coordinates: np.ndarray) -> np.ndarray:
    lat1, lon1, lat2, lon2 = (np.asarray(c, dtype=np.float64) for c in coordinates)
    return np.asarray(haversine_km(lat1, lon1, lat2, lon2))


def _strings(function: Callable[[str], str]) -> Callable[[np.ndarray], np.ndarray]:
    def vector(values: np.ndarray) -> np.ndarray:
        return map_distinct(function, values)

    return vector


SCALAR_FUNCTIONS: Mapping[str, ScalarFunction] = MappingProxyType({
    f.name: f
    for f in (
        ScalarFunction("lower", ("str",), _lower, _strings(_lower), "lower(s)"),
        ScalarFunction("upper", ("str",), _upper, _strings(_upper), "upper(s)"),
        ScalarFunction("abs", ("num",), abs, _abs_vector, "abs(x)"),
        ScalarFunction("hours", ("num",), _hours, _hours, "hours(duration)"),
        ScalarFunction("minutes", ("num",), _minutes, _minutes, "minutes(duration)"),
        ScalarFunction(
            "distance_km", ("num", "num", "num", "num"), _distance_scalar, _distance_vector,
            "distance_km(lat1, lon1, lat2, lon2)",
        ),
    )
})
"""Builtin functions of one event's values, by name."""
