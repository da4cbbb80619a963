"""Generic checks that every sketch must pass (serialisation, merging, emptiness, determinism
across processes), each a function of a `SketchSpec`; the test suite runs all of them on every
sketch in `SPECS`."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sketches.base import Sketch, from_bytes
from sketches.bloom import BloomFilter
from sketches.countmin import CountMinSketch, CountMinTopK
from sketches.errors import CorruptSketchError, IncompatibleSketchError, SketchError
from sketches.hll import HyperLogLog
from sketches.tdigest import TDigest

__all__ = [
    "SPECS",
    "SketchSpec",
    "check_bytes_round_trip",
    "check_copy_is_independent",
    "check_corrupt_bytes_raise",
    "check_empty_equals_fresh",
    "check_merge_associative",
    "check_merge_commutative",
    "check_merge_incompatible_raises",
    "check_merge_partitions_equals_one_pass",
    "check_pickle_round_trip",
    "check_same_bytes_across_processes",
    "check_scalar_updates_equal_batch",
    "yield_checks",
]


@dataclass(frozen=True)
class SketchSpec:
    """How to exercise one sketch in the generic checks.

    Attributes
    ----------
    name
        A label for test ids.
    ref
        ``"module:attribute"`` locating this spec, so a subprocess can rebuild it.
    factory
        Builds a fresh, empty sketch.
    incompatible_factory
        Builds a sketch of the same class whose merge into ``factory()`` must fail.
    data
        ``data(seed, size)`` returns ``size`` values to feed the sketch, the same for the same
        arguments in every process.
    equivalent
        Whether two sketches summarise the same data equally well. ``==`` (identical state)
        for sketches whose merge is exact; a tolerance for those that approximate.
    """

    name: str
    ref: str
    factory: Callable[[], Sketch]
    incompatible_factory: Callable[[], Sketch]
    data: Callable[[int, int], Any]
    equivalent: Callable[[Sketch, Sketch], bool] = lambda a, b: a == b


def _mixed_values(seed: int, size: int) -> np.ndarray:
    """Values of every hashable kind: mostly ints and strings, some floats, bytes and None."""
    rng = np.random.default_rng(seed)
    numbers = rng.integers(0, 1 << 40, size=size)
    kinds = rng.integers(0, 10, size=size)
    values = np.empty(size, dtype=object)
    for i, (number, kind) in enumerate(zip(numbers.tolist(), kinds.tolist(), strict=True)):
        if kind < 4:
            values[i] = number
        elif kind < 8:
            values[i] = f"user-{number}"
        elif kind == 8:
            values[i] = number / 7
        else:
            values[i] = None if number % 5 == 0 else number.to_bytes(6, "little")
    return values


def _zipf_values(seed: int, size: int) -> np.ndarray:
    """Skewed values with clear heavy hitters: Zipf(1.5) ranks, as ints or as strings."""
    ranks = np.random.default_rng(seed).zipf(1.5, size=size)
    values = np.empty(size, dtype=object)
    for i, rank in enumerate(ranks.tolist()):
        values[i] = f"page-{rank}" if rank % 2 else rank
    return values


def _lognormal(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(mean=0.0, sigma=1.0, size=size)


def _digests_agree(a: Sketch, b: Sketch) -> bool:
    """Same count and range, and each quantile of one within a group width of the other's."""
    if not (isinstance(a, TDigest) and isinstance(b, TDigest)):
        return False
    if (a.count, a.min, a.max) != (b.count, b.min, b.max) and not (a.is_empty and b.is_empty):
        return False
    if a.is_empty:
        return True
    qs = np.array([0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999])
    n = a.count
    # One k2 group spans Z(n) q (1 - q) / (2 compression) in q; allow two plus two values.
    normaliser = 4 * np.log(max(n / a.compression, 1.0)) + 24
    tolerance = normaliser * qs * (1 - qs) / a.compression + 2 / n
    return bool(np.all(np.abs(b.cdf(a.quantile(qs)) - qs) <= tolerance))


def _heavy_hitters_agree(a: Sketch, b: Sketch) -> bool:
    """Identical counters, and the same top half of the reported heavy hitters."""
    if not (isinstance(a, CountMinTopK) and isinstance(b, CountMinTopK)):
        return False
    return a.sketch == b.sketch and a.top(a.k // 2) == b.top(b.k // 2)


HYPERLOGLOG = SketchSpec(
    name="HyperLogLog",
    ref="sketches.checks:HYPERLOGLOG",
    factory=lambda: HyperLogLog(p=10),
    incompatible_factory=lambda: HyperLogLog(p=11),
    data=_mixed_values,
)
BLOOM_FILTER = SketchSpec(
    name="BloomFilter",
    ref="sketches.checks:BLOOM_FILTER",
    factory=lambda: BloomFilter(capacity=2000, error_rate=0.01),
    incompatible_factory=lambda: BloomFilter(capacity=2000, error_rate=0.001),
    data=_mixed_values,
)
TDIGEST = SketchSpec(
    name="TDigest",
    ref="sketches.checks:TDIGEST",
    factory=lambda: TDigest(compression=100),
    incompatible_factory=lambda: TDigest(compression=200),
    data=_lognormal,
    equivalent=_digests_agree,
)
COUNT_MIN_SKETCH = SketchSpec(
    name="CountMinSketch",
    ref="sketches.checks:COUNT_MIN_SKETCH",
    factory=lambda: CountMinSketch(width=512, depth=4),
    incompatible_factory=lambda: CountMinSketch(width=512, depth=5),
    data=_mixed_values,
)
COUNT_MIN_TOP_K = SketchSpec(
    name="CountMinTopK",
    ref="sketches.checks:COUNT_MIN_TOP_K",
    factory=lambda: CountMinTopK(k=10, width=1024, depth=4),
    incompatible_factory=lambda: CountMinTopK(k=20, width=1024, depth=4),
    data=_zipf_values,
    equivalent=_heavy_hitters_agree,
)
SPECS: dict[str, SketchSpec] = {
    spec.name: spec
    for spec in (HYPERLOGLOG, BLOOM_FILTER, TDIGEST, COUNT_MIN_SKETCH, COUNT_MIN_TOP_K)
}

_SIZE = 3000


def _built(spec: SketchSpec, values: Any) -> Sketch:
    return spec.factory().update(values)


def check_bytes_round_trip(spec: SketchSpec) -> None:
    """``from_bytes(to_bytes())`` gives an equal sketch with the same bytes, empty or not."""
    for sketch in (spec.factory(), _built(spec, spec.data(1, _SIZE))):
        data = sketch.to_bytes()
        for restored in (type(sketch).from_bytes(data), from_bytes(data)):
            assert type(restored) is type(sketch)
            assert restored == sketch
            assert restored.to_bytes() == data
            assert restored.is_empty == sketch.is_empty


def check_pickle_round_trip(spec: SketchSpec) -> None:
    """Pickling goes through the byte format and gives an equal sketch."""
    sketch = _built(spec, spec.data(16, _SIZE))
    restored = pickle.loads(pickle.dumps(sketch))
    assert type(restored) is type(sketch) and restored == sketch
    assert restored.to_bytes() == sketch.to_bytes()


def check_copy_is_independent(spec: SketchSpec) -> None:
    """A copy equals its original, and updating the copy leaves the original unchanged."""
    original = _built(spec, spec.data(2, _SIZE))
    before = original.to_bytes()
    clone = original.copy()
    assert clone == original
    clone.update(spec.data(3, _SIZE))
    assert clone != original
    assert original.to_bytes() == before


def check_empty_equals_fresh(spec: SketchSpec) -> None:
    """Empty updates and empty merges leave a sketch equal to a fresh one; data makes it
    non-empty; merging an empty sketch changes nothing."""
    fresh = spec.factory()
    assert fresh.is_empty
    assert fresh == spec.factory()
    assert spec.factory().update([]) == fresh
    assert spec.factory().update(np.array([], dtype=np.int64)) == fresh
    assert spec.factory().merge(spec.factory()) == fresh
    full = _built(spec, spec.data(4, _SIZE))
    assert not full.is_empty
    assert full != fresh
    assert full.copy().merge(spec.factory()) == full
    assert spec.factory().merge(full) == full


def check_scalar_updates_equal_batch(spec: SketchSpec) -> None:
    """Adding values one at a time agrees with adding them as one array or list."""
    values = spec.data(5, 500)
    one_by_one = spec.factory()
    for value in values:
        one_by_one.update(value)
    assert spec.equivalent(one_by_one, spec.factory().update(values))
    assert spec.equivalent(one_by_one, spec.factory().update(list(values)))


def check_merge_commutative(spec: SketchSpec) -> None:
    """``a.merge(b)`` and ``b.merge(a)`` agree, and merge returns the receiver."""
    a, b = _built(spec, spec.data(6, _SIZE)), _built(spec, spec.data(7, _SIZE // 2))
    ab = a.copy()
    assert ab.merge(b) is ab
    ba = b.copy().merge(a)
    assert spec.equivalent(ab, ba)


def check_merge_associative(spec: SketchSpec) -> None:
    """``(a + b) + c`` and ``a + (b + c)`` agree."""
    a, b, c = (_built(spec, spec.data(seed, _SIZE)) for seed in (8, 9, 10))
    left = a.copy().merge(b).merge(c)
    right = a.copy().merge(b.copy().merge(c))
    assert spec.equivalent(left, right)


def check_merge_partitions_equals_one_pass(spec: SketchSpec) -> None:
    """Merging sketches of the partitions of the data agrees with one sketch of all of it."""
    values = spec.data(11, 4 * _SIZE)
    one_pass = _built(spec, values)
    for parts in (2, 7):
        merged = spec.factory()
        for part in np.array_split(values, parts):
            merged.merge(_built(spec, part))
        assert spec.equivalent(merged, one_pass)
        assert spec.equivalent(one_pass, merged)


def check_merge_incompatible_raises(spec: SketchSpec) -> None:
    """Merging other parameters or another kind of sketch raises IncompatibleSketchError."""
    sketch = _built(spec, spec.data(12, _SIZE))
    before = sketch.to_bytes()
    others = [spec.incompatible_factory(), spec.incompatible_factory().update(spec.data(13, 10))]
    others += [
        other.factory() for other in SPECS.values() if type(other.factory()) is not type(sketch)
    ]
    for other in others:
        try:
            sketch.merge(other)
        except IncompatibleSketchError as error:
            assert isinstance(error, SketchError) and isinstance(error, ValueError)
        else:
            raise AssertionError(f"merging {other!r} into {sketch!r} did not raise")
        assert sketch.to_bytes() == before


def check_corrupt_bytes_raise(spec: SketchSpec) -> None:
    """Truncated, padded or altered bytes raise CorruptSketchError, never anything else."""
    sketch = _built(spec, spec.data(14, _SIZE))
    data = sketch.to_bytes()
    flipped_body = bytearray(data)
    flipped_body[len(data) // 2] ^= 0x01
    bad_magic = b"XXXX" + data[4:]
    bad_version = data[:4] + bytes([99]) + data[5:]
    damaged = [b"", data[:10], data[:-1], data[: len(data) // 2], data + b"\0", bytes(flipped_body)]
    damaged += [bad_magic, bad_version]
    for bad in damaged:
        for reader in (type(sketch).from_bytes, from_bytes):
            try:
                reader(bad)
            except CorruptSketchError as error:
                assert isinstance(error, SketchError) and isinstance(error, ValueError)
            else:
                raise AssertionError(f"{reader.__qualname__} accepted damaged bytes")
    for other in SPECS.values():
        other_sketch = other.factory()
        if type(other_sketch) is not type(sketch):
            try:
                type(sketch).from_bytes(other_sketch.to_bytes())
            except CorruptSketchError:
                pass
            else:
                raise AssertionError(f"{type(sketch).__name__} read a {other.name}'s bytes")


_CHILD = """
import importlib, sys
module, attribute = sys.argv[1].split(":")
spec = getattr(importlib.import_module(module), attribute)
sketch = spec.factory().update(spec.data(int(sys.argv[2]), int(sys.argv[3])))
sys.stdout.write(sketch.to_bytes().hex())
"""


def check_same_bytes_across_processes(spec: SketchSpec) -> None:
    """A fresh interpreter with its own ``PYTHONHASHSEED`` serialises the same data to the
    same bytes as this process."""
    expected = _built(spec, spec.data(15, _SIZE)).to_bytes()
    root = str(Path(__file__).resolve().parents[1])
    # Differs from this process's seed unless that was pinned to the same value.
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    # This process's import path, so the child finds specs defined outside the package too.
    env["PYTHONPATH"] = os.pathsep.join([root, *(entry for entry in sys.path if entry)])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, spec.ref, "15", str(_SIZE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, f"the child process failed:\n{child.stderr}"
    assert bytes.fromhex(child.stdout) == expected, "the bytes differ between processes"


_CHECKS = (
    check_bytes_round_trip,
    check_pickle_round_trip,
    check_copy_is_independent,
    check_empty_equals_fresh,
    check_scalar_updates_equal_batch,
    check_merge_commutative,
    check_merge_associative,
    check_merge_partitions_equals_one_pass,
    check_merge_incompatible_raises,
    check_corrupt_bytes_raise,
    check_same_bytes_across_processes,
)


def yield_checks(spec: SketchSpec) -> Iterator[Callable[[SketchSpec], None]]:
    """Yield every generic check; each is called with ``spec`` and raises on failure.

    Examples
    --------
    >>> for check in yield_checks(SPECS["HyperLogLog"]):
    ...     if check is not check_same_bytes_across_processes:
    ...         check(SPECS["HyperLogLog"])
    """
    yield from _CHECKS
