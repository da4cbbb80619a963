"""Probabilistic sketches for Vigil: HyperLogLog++ (distinct counts), Bloom filters
(membership), t-digests (quantiles) and Count-Min (frequencies, heavy hitters), all mergeable
and serialisable, with deterministic hashing; and `StateCodec`, the frame of every binary state
format in Vigil."""

from __future__ import annotations

from sketches.base import Sketch, from_bytes
from sketches.bloom import BloomFilter
from sketches.codec import Frame, StateCodec
from sketches.countmin import CountMinSketch, CountMinTopK
from sketches.errors import (
    CorruptSketchError,
    IncompatibleSketchError,
    InvalidParameterError,
    SketchError,
    UnsupportedValueError,
)
from sketches.hashing import HASH_ID, hash_value, hash_values
from sketches.hll import HyperLogLog
from sketches.tdigest import TDigest

__all__ = [
    "HASH_ID",
    "BloomFilter",
    "CorruptSketchError",
    "CountMinSketch",
    "CountMinTopK",
    "Frame",
    "HyperLogLog",
    "IncompatibleSketchError",
    "InvalidParameterError",
    "Sketch",
    "SketchError",
    "StateCodec",
    "TDigest",
    "UnsupportedValueError",
    "from_bytes",
    "hash_value",
    "hash_values",
]
