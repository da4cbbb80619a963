"""CountMinSketch and CountMinTopK: error guarantee, weights, heavy hitters against exact
counts, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sketches import CorruptSketchError, CountMinSketch, CountMinTopK, InvalidParameterError
from sketches.countmin import _decode_value, _encode_value


@pytest.mark.parametrize(
    ("width", "depth"), [(0, 4), (16, 0), (16, 65), (2.5, 4), (1 << 27, 4), (True, 4)]
)
def test_invalid_sizes_raise(width, depth):
    with pytest.raises(InvalidParameterError):
        CountMinSketch(width, depth)


def test_from_error_sizes_and_validates():
    cms = CountMinSketch.from_error(epsilon=0.01, delta=0.001)
    assert (cms.width, cms.depth) == (math.ceil(math.e / 0.01), math.ceil(math.log(1000)))
    with pytest.raises(InvalidParameterError):
        CountMinSketch.from_error(epsilon=0.0, delta=0.1)


def test_estimates_never_under_and_rarely_far_over():
    values = np.random.default_rng(0).zipf(1.2, size=200_000)
    cms = CountMinSketch.from_error(epsilon=0.001, delta=0.01)
    cms.update(values)
    distinct, counts = np.unique(values, return_counts=True)
    estimates = cms.estimate(distinct)
    assert estimates.dtype == np.int64
    assert np.all(estimates >= counts)
    # P(over by more than epsilon * total) <= delta for each value; allow 2 delta.
    too_far = np.mean(estimates - counts > 0.001 * cms.total)
    assert too_far <= 0.02


def test_weights():
    cms = CountMinSketch(1000, 4)
    cms.update(["a", "b"], weight=np.array([3, 4])).update("a", weight=5).update("c", weight=0)
    assert cms.estimate(["a", "b", "c"]).tolist() == [8, 4, 0]
    assert cms.total == 12
    with pytest.raises(InvalidParameterError):
        cms.update(["a"], weight=-1)
    with pytest.raises(InvalidParameterError):
        cms.update(["a", "b"], weight=np.array([1]))
    with pytest.raises(InvalidParameterError):
        cms.update(["a"], weight=np.array([0.5]))


def test_scalar_estimate_is_an_int():
    cms = CountMinSketch(100, 3).update([7, 7, 7.0])
    assert cms.estimate(7) == 3 and isinstance(cms.estimate(7), int)


def test_counters_that_do_not_add_up_are_rejected():
    cms = CountMinSketch(8, 2).update([1, 2, 3])
    cms._counts[0, 0] += 1  # frame and CRC stay valid, the row sum does not
    with pytest.raises(CorruptSketchError, match="add up"):
        CountMinSketch.from_bytes(cms.to_bytes())


def test_top_k_matches_exact_heavy_hitters():
    values = np.random.default_rng(1).zipf(1.3, size=300_000)
    top = CountMinTopK(k=10, width=8192, depth=5)
    for chunk in np.array_split(values, 30):
        top.update(chunk)
    distinct, counts = np.unique(values, return_counts=True)
    exact = distinct[np.argsort(-counts, kind="stable")[:10]].tolist()
    reported = [value for value, _ in top.top()]
    assert reported == exact
    estimates = dict(top.top())
    for value, count in zip(distinct.tolist(), counts.tolist(), strict=True):
        if value in estimates:
            assert count <= estimates[value] <= count + 0.001 * len(values)


def test_top_k_merge_of_partitions_finds_the_same_heavy_hitters():
    values = np.random.default_rng(2).zipf(1.3, size=200_000)
    one_pass = CountMinTopK(k=5, width=4096, depth=5).update(values)
    merged = CountMinTopK(k=5, width=4096, depth=5)
    for part in np.array_split(values, 16):
        merged.merge(CountMinTopK(k=5, width=4096, depth=5).update(part))
    assert merged.top() == one_pass.top()


def test_top_k_reports_plain_python_values():
    top = CountMinTopK(k=3, width=64, depth=2).update(np.array([5, 5, 6], dtype=np.int32))
    assert top.top() == [(5, 2), (6, 1)] and type(top.top()[0][0]) is int
    assert top.top(1) == [(5, 2)] and CountMinTopK().top() == []


@pytest.mark.parametrize("value", [None, True, False, 0, -(2**70), 2.5, "", "é\ud800", b"\x00"])
def test_value_encoding_round_trips(value):
    encoded = _encode_value(value)
    decoded, end = _decode_value(memoryview(encoded), 0)
    assert end == len(encoded)
    assert decoded == value and type(decoded) is type(value)


def test_tampered_heavy_hitter_is_rejected():
    top = CountMinTopK(k=2, width=64, depth=2).update(["spam", "spam", "eggs"])
    top._candidates[next(iter(top._candidates))] = "ham"  # value no longer matches its hash
    with pytest.raises(CorruptSketchError, match="does not match"):
        CountMinTopK.from_bytes(top.to_bytes())
