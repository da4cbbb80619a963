"""Bloom filter for set membership with a bounded false-positive rate, sized from the expected
number of distinct values and the target rate, with vectorised add and lookup."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import Any, Self

import numpy as np

from sketches.base import Sketch, is_integer, read_exact
from sketches.errors import CorruptSketchError, InvalidParameterError
from sketches.hashing import HASH_ID, hash_values

__all__ = ["BloomFilter"]

_PARAMS = struct.Struct("<QdQB")
_LOW32 = np.uint64(0xFFFF_FFFF)
_SHIFT32 = np.uint64(32)
# The index arithmetic maps 32-bit hashes onto [0, m), so m must stay below 2**32 bits.
_MAX_BITS = (1 << 32) - 1
_POPCOUNT = np.array([bin(byte).count("1") for byte in range(256)], dtype=np.int64)


_MARGIN = 0.97
"""Sizing aims at this fraction of the target rate, for the double hashing's small excess."""


class BloomFilter(Sketch):
    """A set that may answer "present" for values never added, at a bounded rate.

    Sized for ``capacity`` distinct values at a false-positive rate of ``error_rate``: ``k =
    round(m0 / capacity * ln 2)`` bit positions per value for the optimal ``m0 =
    ceil(-capacity * ln(error_rate) / ln(2)**2)``, and ``m`` the smallest number of bits, at
    least ``m0``, whose rate ``(1 - exp(-k * capacity / m))**k`` is within 97% of the target
    (rounding ``k`` alone would overshoot it slightly). The ``k`` positions come from
    one 64-bit hash by Kirsch–Mitzenmacher double hashing: ``g_i = h1 + i * h2 (mod 2**32)``
    with ``h1``, ``h2`` its low and high halves, each mapped onto ``[0, m)`` by multiply-shift.

    Parameters
    ----------
    capacity
        Number of distinct values the filter is sized for (at least 1).
    error_rate
        Target false-positive rate at ``capacity`` values, in (0, 1).

    Examples
    --------
    >>> bloom = BloomFilter(capacity=1000, error_rate=0.01)
    >>> bloom.num_bits, bloom.num_hashes
    (9655, 7)
    >>> bloom.update(["alice", "bob", 42])
    BloomFilter(capacity=1000, error_rate=0.01)
    >>> "alice" in bloom, "carol" in bloom
    (True, False)
    >>> bloom.contains(["bob", "dave", 42.0]).tolist()
    [True, False, True]
    """

    kind = 2
    hash_id = HASH_ID

    def __init__(self, capacity: int, error_rate: float = 0.01) -> None:
        if not is_integer(capacity) or capacity < 1:
            raise InvalidParameterError(f"capacity must be an integer >= 1, got {capacity!r}")
        if not isinstance(error_rate, (float, int)) or not 0.0 < error_rate < 1.0:
            raise InvalidParameterError(f"error_rate must be in (0, 1), got {error_rate!r}")
        self._capacity = int(capacity)
        self._error_rate = float(error_rate)
        n, rate = self._capacity, self._error_rate
        num_bits = math.ceil(-n * math.log(rate) / math.log(2) ** 2)
        num_hashes = max(1, round(num_bits / n * math.log(2)))
        # With k rounded, (1 - e^(-kn/m))^k can exceed the target a little (1.003% for 1%);
        # grow m until it does not, with a 3% margin for the 32-bit double hashing.
        fits = -num_hashes * n / math.log1p(-((_MARGIN * rate) ** (1 / num_hashes)))
        num_bits = max(num_bits, math.ceil(fits))
        if num_bits > _MAX_BITS:
            raise InvalidParameterError(
                f"a filter for {capacity} values at rate {error_rate} needs {num_bits} bits; the "
                f"maximum is {_MAX_BITS}"
            )
        self._num_bits = num_bits
        self._num_hashes = num_hashes
        self._bits = np.zeros((num_bits + 7) // 8, dtype=np.uint8)

    @property
    def capacity(self) -> int:
        """The number of distinct values the filter was sized for."""
        return self._capacity

    @property
    def error_rate(self) -> float:
        """The target false-positive rate at capacity."""
        return self._error_rate

    @property
    def num_bits(self) -> int:
        """The number of bits, ``m``."""
        return self._num_bits

    @property
    def num_hashes(self) -> int:
        """The number of bit positions set per value, ``k``."""
        return self._num_hashes

    @property
    def is_empty(self) -> bool:
        return not self._bits.any()

    def _positions(self, hashes: np.ndarray) -> Iterator[np.ndarray]:
        """Yield the bit positions of the ``k`` probes in turn, each for every hash.

        The same buffer is reused for every probe: consume it before asking for the next.
        """
        probe, step = _split(hashes)
        position = np.empty_like(probe)
        for i in range(self._num_hashes):
            if i:
                _advance(probe, step)
            yield _position(probe, self._num_bits, out=position)

    def update(self, values: Any) -> Self:
        """Add one value or a collection of values; returns ``self``."""
        hashes = hash_values(values)
        if len(hashes) == 0:
            return self
        if len(hashes) * self._num_hashes > self._num_bits // 16:
            # Large batches: scatter into a byte per bit, then pack once. ufunc.at would be
            # several times slower per position.
            scratch = np.zeros(len(self._bits) * 8, dtype=bool)
            for position in self._positions(hashes):
                scratch[position] = True
            self._bits |= np.packbits(scratch, bitorder="little")
        else:
            for position in self._positions(hashes):
                np.bitwise_or.at(
                    self._bits, position >> 3, np.left_shift(1, position & 7).astype(np.uint8)
                )
        return self

    add = update

    def contains(self, values: Any) -> np.ndarray:
        """Return, for each value, whether it may have been added (a numpy bool array).

        ``False`` is certain; ``True`` is wrong at about the filter's false-positive rate.
        """
        hashes = hash_values(values)
        found = np.zeros(len(hashes), dtype=bool)
        # Probe by probe, keeping only the values whose bits were all set so far: a value not
        # in the filter usually fails within two probes, so looking up mostly absent values
        # costs about two probes, not k.
        probe, step = _split(hashes)
        candidates = np.arange(len(hashes))
        for i in range(self._num_hashes):
            if i:
                _advance(probe, step)
            position = _position(probe, self._num_bits)
            hit = ((self._bits[position >> 3] >> (position & 7).astype(np.uint8)) & 1).view(bool)
            if not hit.all():
                probe, step, candidates = probe[hit], step[hit], candidates[hit]
        found[candidates] = True
        return found

    def __contains__(self, value: Any) -> bool:
        return bool(self.contains([value])[0])

    def estimate(self) -> float:
        """Estimate the number of distinct values added, from the fraction of bits set.

        Uses Swamidass and Baldi's ``-m / k * ln(1 - X / m)`` for ``X`` set bits.

        Examples
        --------
        >>> bloom = BloomFilter(capacity=10_000, error_rate=0.01).update(range(5000))
        >>> round(bloom.estimate(), -2)
        5000.0
        """
        set_bits = int(_POPCOUNT[self._bits].sum())
        if set_bits == self._num_bits:
            return math.inf
        m, k = self._num_bits, self._num_hashes
        return -m / k * math.log1p(-set_bits / m)

    def false_positive_rate(self) -> float:
        """The current false-positive probability, ``(fraction of bits set) ** k``."""
        return (int(_POPCOUNT[self._bits].sum()) / self._num_bits) ** self._num_hashes

    def merge(self, other: BloomFilter) -> Self:
        """Fold ``other`` into this filter (bitwise or); returns ``self``.

        Raises
        ------
        IncompatibleSketchError
            If ``other`` has another capacity, error rate or hash function.
        """
        self._check_mergeable(other)
        self._bits |= other._bits
        return self

    def _parameters(self) -> tuple[Any, ...]:
        return (self._capacity, self._error_rate)

    def _body(self) -> bytes:
        header = _PARAMS.pack(self._capacity, self._error_rate, self._num_bits, self._num_hashes)
        return header + self._bits.tobytes()

    @classmethod
    def _from_body(cls, body: memoryview) -> BloomFilter:
        capacity, error_rate, num_bits, num_hashes = read_exact(body, _PARAMS, 0, "parameters")
        try:
            bloom = cls(capacity, error_rate)
        except InvalidParameterError as error:
            raise CorruptSketchError(
                f"BloomFilter bytes hold invalid parameters: {error}"
            ) from None
        if (num_bits, num_hashes) != (bloom._num_bits, bloom._num_hashes):
            raise CorruptSketchError(
                f"BloomFilter bytes record m={num_bits}, k={num_hashes}, but capacity {capacity} "
                f"and error rate {error_rate} give m={bloom._num_bits}, k={bloom._num_hashes}"
            )
        if len(body) != _PARAMS.size + len(bloom._bits):
            raise CorruptSketchError(
                f"BloomFilter bytes hold {len(body) - _PARAMS.size} bytes of bits, expected "
                f"{len(bloom._bits)}"
            )
        bits = np.frombuffer(body, dtype=np.uint8, offset=_PARAMS.size)
        if num_bits % 8 and bits[-1] >> (num_bits % 8):
            raise CorruptSketchError("BloomFilter bytes set bits beyond the filter's length")
        bloom._bits[:] = bits
        return bloom

    def copy(self) -> BloomFilter:
        clone = type(self)(self._capacity, self._error_rate)
        clone._bits[:] = self._bits
        return clone

    def __repr__(self) -> str:
        return f"BloomFilter(capacity={self._capacity}, error_rate={self._error_rate})"


def _split(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first probe and the step of Kirsch–Mitzenmacher double hashing: the low and high
    32 bits of each hash."""
    return hashes & _LOW32, hashes >> _SHIFT32


def _advance(probe: np.ndarray, step: np.ndarray) -> None:
    """Move every probe to the next one, ``probe + step (mod 2**32)``, in place."""
    probe += step
    probe &= _LOW32


def _position(probe: np.ndarray, num_bits: int, out: np.ndarray | None = None) -> np.ndarray:
    """Map 32-bit probes onto ``[0, num_bits)`` by multiply-shift (no division)."""
    position = np.multiply(probe, np.uint64(num_bits), out=out)
    position >>= _SHIFT32
    return position.view(np.int64)
