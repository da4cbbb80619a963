"""Builtin functions of the Vigil expression language (``lower``, ``distance_km`` ...): the one
table of their signatures, which the checks and the compiler both read, and the kernels the
compiler applies to one value or to a column.

Kernels only ever see non-null arguments of the declared kinds; null and type handling is the
compiler's job, so every function obeys the same rule: a null or mistyped argument gives null.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import pandas as pd

from query_lang import types as T

__all__ = [
    "EARTH_RADIUS_KM",
    "METRIC_AGGREGATES",
    "MS_PER_HOUR",
    "MS_PER_MINUTE",
    "PATTERN_AGGREGATES",
    "SAME_AS_ARGUMENT",
    "SCALAR_FUNCTIONS",
    "ScalarFunction",
    "between",
    "cidr_contains",
    "concat",
    "item",
    "haversine_km",
    "index_of",
    "map_distinct",
    "substring",
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

ArgumentKind = Literal["num", "str", "bool", "list", "other"]
"""The kind of value a kernel receives: ``"num"`` (int or float, not bool), ``"str"``,
``"bool"``, ``"list"`` (a Python list) or ``"other"`` (a json object: a Python dict)."""

SAME_AS_ARGUMENT = "same"
"""A result type meaning "the type of the first argument", as for ``abs``."""

_KIND_OF_TYPE: Mapping[str, ArgumentKind] = MappingProxyType({
    # Timestamps and durations are integer milliseconds once compiled, so numbers to a kernel.
    T.INT: "num", T.FLOAT: "num", T.DURATION: "num", T.TIMESTAMP: "num", T.STRING: "str",
    T.BOOL: "bool", T.LIST: "list", T.JSON: "other",
})

_INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class ScalarFunction:
    """A builtin function of one event's values: its signature and its two kernels.

    The signature is written once, in the types of the semantic checks; the kinds the
    compiled kernels accept follow from it, so the checks and the compiler cannot disagree.

    Parameters
    ----------
    name
        The name users call it by.
    accepts
        For each parameter, the types it accepts (names from :mod:`query_lang.types`).
    returns
        The result type, or :data:`SAME_AS_ARGUMENT` for the type of the first argument.
    scalar
        Kernel over Python values of the parameters' kinds; returns the result (NaN counts as
        null). It is called with as many arguments as the call has.
    vector
        Kernel over numpy arrays of those kinds (int64/float64 for ``"num"``, object arrays of
        ``str`` for ``"str"``, bool arrays for ``"bool"``), broadcasting like a ufunc. An
        object-dtype result holds exact Python values where a fixed-width dtype would
        overflow, and None for null. ``None``: columns apply ``scalar`` row by row.
    summary
        One line for error messages and documentation, such as ``lower(s)``.
    required
        How many leading parameters a call must give (``None``: all of them); the kernels
        take the others as optional.
    variadic
        Whether the last parameter may repeat (``concat(x, ...)``).

    Attributes
    ----------
    kinds
        The kinds of value each parameter takes once compiled (``"num"``, ``"str"`` ...).

    Examples
    --------
    >>> hours = SCALAR_FUNCTIONS["hours"]
    >>> sorted(hours.accepts[0]), hours.kinds, hours.result_type(["duration"])
    (['duration'], (frozenset({'num'}),), 'float')
    >>> index_of = SCALAR_FUNCTIONS["index_of"]
    >>> index_of.takes(2), index_of.takes(3), index_of.takes(4), index_of.arity_text
    (True, True, False, '2 to 3')
    """

    name: str
    accepts: tuple[frozenset[str], ...]
    returns: str
    scalar: Callable[..., Any]
    vector: Callable[..., np.ndarray] | None
    summary: str
    required: int | None = None
    variadic: bool = False
    kinds: tuple[frozenset[ArgumentKind], ...] = field(init=False)

    def __post_init__(self) -> None:
        kinds = tuple(frozenset(_KIND_OF_TYPE[t] for t in types) for types in self.accepts)
        object.__setattr__(self, "kinds", kinds)

    @property
    def arity(self) -> int:
        """Number of parameters the function declares (the most a call gives, unless
        variadic)."""
        return len(self.accepts)

    @property
    def minimum(self) -> int:
        """The fewest arguments a call gives."""
        return self.arity if self.required is None else self.required

    @property
    def arity_text(self) -> str:
        """How many arguments a call takes, in words: ``1``, ``2 to 3``, ``1 or more``."""
        if self.variadic:
            return f"{self.minimum} or more"
        if self.minimum == self.arity:
            return str(self.arity)
        return f"{self.minimum} to {self.arity}"

    def takes(self, count: int) -> bool:
        """Whether a call with ``count`` arguments is well formed."""
        return count >= self.minimum and (self.variadic or count <= self.arity)

    def parameter_types(self, count: int) -> tuple[frozenset[str], ...]:
        """The types each argument of a call with ``count`` arguments accepts."""
        if count <= self.arity:
            return self.accepts[:count]
        return self.accepts + (self.accepts[-1],) * (count - self.arity)

    def parameter_kinds(self, count: int) -> tuple[frozenset[ArgumentKind], ...]:
        """The kinds each argument of a call with ``count`` arguments takes once compiled."""
        if count <= self.arity:
            return self.kinds if count == self.arity else self.kinds[:count]
        return self.kinds + (self.kinds[-1],) * (count - self.arity)

    def result_type(self, argument_types: Sequence[str]) -> str:
        """The type of a call whose arguments have ``argument_types``."""
        return argument_types[0] if self.returns == SAME_AS_ARGUMENT else self.returns


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


@lru_cache(maxsize=1024)
def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def cidr_contains(address: str, network: str) -> bool:
    """Whether the IP address ``address`` lies in the network ``network`` (CIDR notation).

    False when ``address`` is not an IPv4 or IPv6 address or ``network`` is not a network.
    IPv4 and IPv6 never mix: ``::ffff:10.0.0.1`` is not in ``10.0.0.0/8``.

    Examples
    --------
    >>> cidr_contains("10.1.2.3", "10.0.0.0/8"), cidr_contains("fe80::1", "fe80::/10")
    (True, True)
    >>> cidr_contains("192.168.0.1", "10.0.0.0/8"), cidr_contains("host", "10.0.0.0/8")
    (False, False)
    """
    net = _network(network)
    if net is None:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == net.version and ip in net


def _cidr_vector(addresses: np.ndarray, networks: np.ndarray) -> np.ndarray:
    if networks.ndim == 0:
        network = networks.tolist()
        return map_distinct(lambda address: cidr_contains(address, network), addresses)
    pairs = np.broadcast_arrays(addresses, networks)
    out = np.empty(pairs[0].shape, dtype=object)
    for i, (address, network) in enumerate(zip(*(p.tolist() for p in pairs), strict=True)):
        out[i] = cidr_contains(address, network)
    return out


def _length_vector(values: np.ndarray) -> np.ndarray:
    return map_distinct(len, values, dtype=np.int64)


def _strings(function: Callable[[str], str]) -> Callable[[np.ndarray], np.ndarray]:
    def vector(values: np.ndarray) -> np.ndarray:
        return map_distinct(function, values)

    return vector


def _per_row(scalar: Callable[..., Any]) -> Callable[..., np.ndarray]:
    """A vector kernel applying ``scalar`` to each row: once per distinct value of the first
    argument when the others are constants (the common case: ``index_of(path, "\\")``)."""

    def vector(first: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        if first.ndim == 0 or all(a.ndim == 0 for a in rest):
            constants = [a.tolist() for a in rest]
            return map_distinct(lambda value: scalar(value, *constants), first)
        columns = np.broadcast_arrays(first, *rest)
        out = np.empty(columns[0].shape, dtype=object)
        for i, values in enumerate(zip(*(c.tolist() for c in columns), strict=True)):
            out[i] = scalar(*values)
        return out

    return vector


def _position(value: Any) -> int | None:
    """A character position: an integer, or a float with an integral value; else None."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def index_of(text: str, part: str, start: Any = 0) -> int | None:
    """Position of the first ``part`` in ``text`` at or after ``start`` (negative: from the
    end), or None when there is none.

    Examples
    --------
    >>> index_of("explorer.exe", "plore"), index_of("explorer.exe", "e", 1)
    (2, 6)
    >>> index_of("explorer.exe", ".pf") is None, index_of("explorer.exe", "e", -3)
    (True, 9)
    """
    begin = _position(start)
    if begin is None:
        return None
    found = text.find(part, begin)
    return None if found < 0 else found


def substring(text: str, start: Any, end: Any = None) -> str | None:
    """The characters of ``text`` from ``start`` up to, not including, ``end`` (the end of the
    string when absent); negative positions count from the end, as Python's slices.

    Examples
    --------
    >>> substring("explorer.exe", 0, 4), substring("explorer.exe", -4), substring("ab", 5)
    ('expl', '.exe', '')
    """
    begin = _position(start)
    stop = None if end is None else _position(end)
    if begin is None or (end is not None and stop is None):
        return None
    return text[begin:stop]


def between(
    text: str, left: str, right: str, greedy: bool = False, ignore_case: bool = False
) -> str | None:
    """The part of ``text`` after the first ``left`` and before the next ``right`` (the last
    ``right`` when ``greedy``), or None when either is missing. With ``ignore_case`` the
    markers are found in the lower-cased text; the part is cut from ``text`` as written.

    Examples
    --------
    >>> between("System Idle Process", "s", "e"), between("System Idle Process", "s", "e", True)
    ('t', 'tem Idle Proc')
    >>> between("System Idle Process", "s", "e", False, True)
    'yst'
    >>> between("System Idle Process", "s", "e", True, True)
    'ystem Idle Proc'
    >>> between("abc", "x", "c") is None
    True
    """
    haystack = text.lower() if ignore_case else text
    if ignore_case:
        left, right = left.lower(), right.lower()
    begin = haystack.find(left)
    if begin < 0:
        return None
    begin += len(left)
    end = haystack.rfind(right, begin) if greedy else haystack.find(right, begin)
    return None if end < 0 else text[begin:end]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def concat(*values: Any) -> str:
    """The values written as text one after another: numbers as Python writes them, booleans
    as ``true``/``false``.

    Examples
    --------
    >>> concat(5, ":", "wininit.exe", 3), concat("a", 2.5, True)
    ('5:wininit.exe3', 'a2.5true')
    """
    return "".join(_text(v) for v in values)


def item(values: list[Any], index: Any) -> Any:
    """The element of a list at a zero-based ``index`` (negative: from the end), or None past
    either end.

    Examples
    --------
    >>> item(["en-US", "en"], 1), item(["en-US", "en"], -1)
    ('en', 'en')
    >>> item(["en-US", "en"], 2) is None
    True
    """
    position = _position(index)
    if position is None or not -len(values) <= position < len(values):
        return None
    return values[position]


def _case_map(function: Callable[[str], str]) -> Callable[[Any], Any]:
    """``function`` over a string, or over each string of a list."""

    def apply(value: Any) -> Any:
        if isinstance(value, str):
            return function(value)
        return [function(v) if isinstance(v, str) else v for v in value]

    return apply


_STRING = (frozenset({T.STRING}),)
_DURATION = (frozenset({T.DURATION}),)

_INT = frozenset({T.INT})
_BOOL = frozenset({T.BOOL})
_STRING_OR_LIST = (frozenset({T.STRING, T.LIST}),)
_PRIMITIVE = frozenset({T.STRING, T.INT, T.FLOAT, T.BOOL})

SCALAR_FUNCTIONS: Mapping[str, ScalarFunction] = MappingProxyType({
    f.name: f
    for f in (
        ScalarFunction(
            "lower", _STRING_OR_LIST, SAME_AS_ARGUMENT, _case_map(_lower), _strings(_lower),
            "lower(s)",
        ),
        # EQL's length(): characters of a string (code points, as Python and EQL count them),
        # or elements of a list; and, as jq counts, the members of a json object.
        ScalarFunction(
            "length", (frozenset({T.STRING, T.LIST, T.JSON}),), T.INT, len, _length_vector,
            "length(s)",
        ),
        ScalarFunction(
            "upper", _STRING_OR_LIST, SAME_AS_ARGUMENT, _case_map(_upper), _strings(_upper),
            "upper(s)",
        ),
        ScalarFunction(
            "abs", (T.NUMERIC | {T.DURATION},), SAME_AS_ARGUMENT, abs, _abs_vector, "abs(x)"
        ),
        # A number of milliseconds is a duration to the kernel, but the checks ask for a
        # duration so that hours(amount) is reported rather than silently divided by 3.6e6.
        ScalarFunction("hours", _DURATION, T.FLOAT, _hours, _hours, "hours(duration)"),
        ScalarFunction("minutes", _DURATION, T.FLOAT, _minutes, _minutes, "minutes(duration)"),
        ScalarFunction(
            "distance_km", (T.NUMERIC,) * 4, T.FLOAT, _distance_scalar, _distance_vector,
            "distance_km(lat1, lon1, lat2, lon2)",
        ),
        # Sigma's `cidr` modifier and EQL's cidrMatch: a network test no string operation
        # can express exactly for IPv6, whose addresses have several spellings.
        ScalarFunction(
            "cidr_match", _STRING * 2, T.BOOL, cidr_contains, _cidr_vector,
            "cidr_match(ip, network)",
        ),
        # EQL's string functions (indexOf, substring, between, concat) and array index.
        ScalarFunction(
            "index_of", (*_STRING * 2, _INT), T.INT, index_of, _per_row(index_of),
            "index_of(s, part, start)", required=2,
        ),
        ScalarFunction(
            "substring", (*_STRING, _INT, _INT), T.STRING, substring, _per_row(substring),
            "substring(s, start, end)", required=2,
        ),
        ScalarFunction(
            "between", (*_STRING * 3, _BOOL, _BOOL), T.STRING, between, _per_row(between),
            "between(s, left, right, greedy, ignore_case)", required=3,
        ),
        ScalarFunction(
            "concat", (_PRIMITIVE,), T.STRING, concat, None, "concat(x, ...)", variadic=True,
        ),
        ScalarFunction(
            "item", (frozenset({T.LIST}), _INT), T.STRING, item, None,
            "item(list, index)",
        ),
    )
})
"""Builtin functions of one event's values, by name: the one table the checks and the
compiler read."""
