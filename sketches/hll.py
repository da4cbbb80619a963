"""HyperLogLog++ distinct counting with dense 6-bit registers (stored one per byte), whose
registers and estimates match ``datasketch.HyperLogLogPlusPlus`` built with our hash."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from sketches._hllpp_tables import BIAS, RAW_ESTIMATE, THRESHOLD
from sketches.base import Sketch, is_integer, read_exact
from sketches.errors import CorruptSketchError, IncompatibleSketchError, InvalidParameterError
from sketches.hashing import HASH_ID, hash_value, hash_values

if TYPE_CHECKING:
    import datasketch

__all__ = ["HyperLogLog"]

MIN_PRECISION = 4
MAX_PRECISION = 18
# datasketch accepts precisions 4..16 only.
_DATASKETCH_MAX_PRECISION = 16
_PARAMS = struct.Struct("<B")
_LOW32 = np.uint64(0xFFFF_FFFF)
# From this precision on, the 64 - p rank bits fit a float64 mantissa.
_EXACT_FLOAT_PRECISION = 11
# Hashes per block of a register update.
_BLOCK = 1 << 15


class HyperLogLog(Sketch):
    """Estimate the number of distinct values in a stream (HyperLogLog++).

    Each value's 64-bit hash picks a register with its low ``p`` bits; the register keeps the
    largest rank (leading zeros + 1) seen among the remaining ``64 - p`` bits. The estimate is
    HLL++'s: linear counting below an empirical threshold, then the raw HyperLogLog estimate
    with empirical bias correction up to ``5 * m``, then the raw estimate. The relative
    standard error is about ``1.04 / sqrt(m)`` with ``m = 2**p`` registers.

    Parameters
    ----------
    p
        Precision, 4 to 18: the sketch has ``2**p`` one-byte registers.

    Examples
    --------
    >>> import numpy as np
    >>> hll = HyperLogLog(p=12)
    >>> hll.update(np.arange(100_000))
    HyperLogLog(p=12)
    >>> round(hll.estimate(), -3)
    100000.0
    >>> other = HyperLogLog(p=12).update(["a", "b", "a"])
    >>> round(other.estimate())
    2
    >>> round(hll.merge(other).estimate(), -3)
    100000.0
    """

    kind = 1
    hash_id = HASH_ID

    def __init__(self, p: int = 14) -> None:
        if not is_integer(p) or not MIN_PRECISION <= p <= MAX_PRECISION:
            raise InvalidParameterError(
                f"HyperLogLog precision p must be an integer in [{MIN_PRECISION}, "
                f"{MAX_PRECISION}], got {p!r}"
            )
        self._p = int(p)
        self._registers = np.zeros(1 << self._p, dtype=np.uint8)

    @property
    def p(self) -> int:
        """The precision: the sketch has ``2**p`` registers."""
        return self._p

    @property
    def m(self) -> int:
        """The number of registers."""
        return len(self._registers)

    @property
    def registers(self) -> np.ndarray:
        """A read-only view of the registers (``uint8``, one per register)."""
        view = self._registers.view()
        view.flags.writeable = False
        return view

    @property
    def is_empty(self) -> bool:
        return not self._registers.any()

    def update(self, values: Any) -> Self:
        """Add one value or a collection of values (hashed with `sketches.hashing`).

        Returns ``self``.
        """
        self._update_hashes(hash_values(values))
        return self

    def _update_hashes(self, hashes: np.ndarray) -> None:
        # Blocks of hashes keep the temporaries in the L2 cache: three times faster at 1e6.
        for start in range(0, len(hashes), _BLOCK):
            self._update_block(hashes[start : start + _BLOCK])

    def _update_block(self, hashes: np.ndarray) -> None:
        p = self._p
        index = (hashes & np.uint64(self.m - 1)).view(np.int64)
        rest = hashes >> np.uint64(p)
        max_rank = 64 - p + 1
        if p >= _EXACT_FLOAT_PRECISION:
            # rest < 2**53 converts to float64 exactly, so its bit length is the float's
            # exponent: rank = max_rank - (biased exponent - 1022), and max_rank for rest = 0.
            exponent = rest.astype(np.float64).view(np.uint64)
            exponent >>= np.uint64(52)
            rank = np.uint64(max_rank + 1022) - exponent
            np.minimum(rank, np.uint64(max_rank), out=rank)
        else:
            # Wider words can round up to the next power of two as floats: take 32-bit halves.
            _, high_len = np.frexp((rest >> np.uint64(32)).astype(np.float64))
            _, low_len = np.frexp((rest & _LOW32).astype(np.float64))
            rank = max_rank - np.where(high_len > 0, high_len + 32, low_len)
        np.maximum.at(self._registers, index, rank.astype(np.uint8))

    def estimate(self) -> float:
        """Return the estimated number of distinct values added.

        Computed exactly as ``datasketch.HyperLogLogPlusPlus.count`` does, so the two agree
        on equal registers.
        """
        m = self.m
        zeros = m - int(np.count_nonzero(self._registers))
        if zeros > 0:
            linear = m * np.log(m / float(zeros))
            if linear <= THRESHOLD[self._p - MIN_PRECISION]:
                return float(linear)
        raw = _alpha(self._p) * float(m**2) / np.sum(2.0 ** -self._registers.astype(np.int8))
        if raw <= 5 * m:
            raw_estimates = np.array(RAW_ESTIMATE[self._p - MIN_PRECISION])
            bias = np.array(BIAS[self._p - MIN_PRECISION])
            nearest = np.argsort((raw - raw_estimates) ** 2)[:6]
            return float(raw - np.mean(bias[nearest]))
        return float(raw)

    def merge(self, other: HyperLogLog) -> Self:
        """Fold ``other`` into this sketch (register-wise maximum); returns ``self``.

        Raises
        ------
        IncompatibleSketchError
            If ``other`` is not a HyperLogLog with the same ``p`` and hash function.
        """
        self._check_mergeable(other)
        np.maximum(self._registers, other._registers, out=self._registers)
        return self

    def to_datasketch(self) -> datasketch.HyperLogLogPlusPlus:
        """Return an equivalent ``datasketch.HyperLogLogPlusPlus``.

        It has the same precision and registers and uses `sketches.hashing.hash_value` as its
        ``hashfunc``, so further updates to either sketch keep them equal.

        Examples
        --------
        >>> hll = HyperLogLog(p=10).update(["a", "b", "c"])
        >>> ds = hll.to_datasketch()
        >>> ds.update("d")
        >>> hll.update("d").estimate() == float(ds.count())
        True
        """
        from datasketch import HyperLogLogPlusPlus

        if self._p > _DATASKETCH_MAX_PRECISION:
            raise InvalidParameterError(
                f"datasketch supports precisions up to {_DATASKETCH_MAX_PRECISION}, this "
                f"HyperLogLog has p={self._p}"
            )
        return HyperLogLogPlusPlus(reg=self._registers.astype(np.int8), hashfunc=hash_value)

    @classmethod
    def from_datasketch(
        cls, sketch: datasketch.HyperLogLogPlusPlus, *, check_hashfunc: bool = True
    ) -> HyperLogLog:
        """Build a HyperLogLog from a ``datasketch.HyperLogLogPlusPlus``.

        Parameters
        ----------
        sketch
            The datasketch sketch. Its registers are only meaningful to us if it hashed its
            values with `sketches.hashing.hash_value`.
        check_hashfunc
            Raise unless ``sketch.hashfunc`` is `sketches.hashing.hash_value`. Pass False for
            a sketch whose hash function was lost in its serialisation (datasketch does not
            record it) but is known to be ours.

        Raises
        ------
        IncompatibleSketchError
            If ``sketch`` is not a HyperLogLogPlusPlus or was built with another hash function.
        """
        from datasketch import HyperLogLogPlusPlus

        if not isinstance(sketch, HyperLogLogPlusPlus):
            raise IncompatibleSketchError(
                f"expected a datasketch.HyperLogLogPlusPlus (64-bit hashes), got "
                f"{type(sketch).__name__}"
            )
        if check_hashfunc and sketch.hashfunc is not hash_value:
            raise IncompatibleSketchError(
                "the datasketch sketch was built with another hash function; build it with "
                "hashfunc=sketches.hashing.hash_value (or pass check_hashfunc=False if it was)"
            )
        hll = cls(p=sketch.p)
        registers = np.asarray(sketch.reg)
        if registers.min(initial=0) < 0 or registers.max(initial=0) > 64 - sketch.p + 1:
            raise IncompatibleSketchError("the datasketch sketch has out-of-range registers")
        hll._registers[:] = registers
        return hll

    def _parameters(self) -> tuple[Any, ...]:
        return (self._p,)

    def _body(self) -> bytes:
        return _PARAMS.pack(self._p) + self._registers.tobytes()

    @classmethod
    def _from_body(cls, body: memoryview) -> HyperLogLog:
        (p,) = read_exact(body, _PARAMS, 0, "HyperLogLog parameters")
        if not MIN_PRECISION <= p <= MAX_PRECISION:
            raise CorruptSketchError(f"HyperLogLog bytes hold an invalid precision {p}")
        hll = cls(p)
        if len(body) != _PARAMS.size + hll.m:
            raise CorruptSketchError(
                f"HyperLogLog bytes hold {len(body) - _PARAMS.size} registers, expected {hll.m}"
            )
        registers = np.frombuffer(body, dtype=np.uint8, offset=_PARAMS.size)
        if registers.max() > 64 - p + 1:
            raise CorruptSketchError("HyperLogLog bytes hold a register above the maximum rank")
        hll._registers[:] = registers
        return hll

    def copy(self) -> HyperLogLog:
        clone = type(self)(self._p)
        clone._registers[:] = self._registers
        return clone

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._p == other._p and np.array_equal(self._registers, other._registers)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"HyperLogLog(p={self._p})"


def _alpha(p: int) -> float:
    # Flajolet et al.'s bias constant; the small-m values are their table, as datasketch uses.
    return {4: 0.673, 5: 0.697, 6: 0.709}.get(p, 0.7213 / (1.0 + 1.079 / (1 << p)))
