"""BloomFilter: sizing, no false negatives, vectorised and scalar lookups, estimates."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sketches import BloomFilter, CorruptSketchError, InvalidParameterError


@pytest.mark.parametrize(
    ("capacity", "error_rate"), [(0, 0.01), (-5, 0.01), (1.5, 0.01), (10, 0.0), (10, 1.0)]
)
def test_invalid_parameters_raise(capacity, error_rate):
    with pytest.raises(InvalidParameterError):
        BloomFilter(capacity, error_rate)


def test_too_large_a_filter_raises():
    with pytest.raises(InvalidParameterError, match="bits"):
        BloomFilter(10**10, 0.01)


@pytest.mark.parametrize(("capacity", "error_rate"), [(1, 0.5), (1000, 0.01), (10**6, 1e-4)])
def test_optimal_size(capacity, error_rate):
    bloom = BloomFilter(capacity, error_rate)
    m = -capacity * math.log(error_rate) / math.log(2) ** 2
    k = max(1, round(math.ceil(m) / capacity * math.log(2)))
    assert bloom.num_hashes == k
    # the optimal size, grown just enough that the rounded k does not overshoot the target
    assert math.ceil(m) <= bloom.num_bits <= 1.05 * m + 1
    rate = (1 - math.exp(-k * capacity / bloom.num_bits)) ** k
    assert rate <= 0.97 * error_rate * (1 + 1e-9)


@pytest.mark.parametrize("batch", [7, 500, 20_000])
def test_no_false_negatives(batch):
    # Small batches take the ufunc.at path, large ones the scratch-and-pack path.
    bloom = BloomFilter(capacity=20_000, error_rate=0.01)
    values = np.arange(20_000) * 7919
    for start in range(0, len(values), batch):
        bloom.add(values[start : start + batch])
    assert bloom.contains(values).all()
    assert bloom.contains(pd.Series(values)).all()


def test_both_update_paths_set_the_same_bits():
    values = [f"v{i}" for i in range(3000)]
    one_batch = BloomFilter(capacity=3000).update(values)
    small_batches = BloomFilter(capacity=3000)
    for start in range(0, 3000, 7):
        small_batches.update(values[start : start + 7])
    assert one_batch == small_batches


def test_contains_and_in():
    bloom = BloomFilter(capacity=100).update(["a", 1, None, b"z"])
    found = bloom.contains(["a", "b", 1.0, None, b"z", "z"])
    assert found.dtype == np.bool_ and found.shape == (6,)
    assert found.tolist() == [True, False, True, True, True, False]
    assert "a" in bloom and True in bloom and "b" not in bloom
    assert bloom.contains([]).shape == (0,)


def test_estimate_and_current_false_positive_rate():
    bloom = BloomFilter(capacity=50_000, error_rate=0.01)
    assert bloom.estimate() == 0.0 and bloom.false_positive_rate() == 0.0
    bloom.update(np.arange(50_000))
    assert abs(bloom.estimate() / 50_000 - 1) < 0.02
    assert 0.007 < bloom.false_positive_rate() < 0.013


def test_saturated_filter_estimates_infinity():
    bloom = BloomFilter(capacity=1, error_rate=0.5)
    bloom.update(np.arange(1000))
    assert bloom.estimate() == math.inf
    assert bloom.contains(np.arange(10**6, 10**6 + 10)).all()


def test_stray_bits_past_the_end_are_rejected():
    bloom = BloomFilter(capacity=1, error_rate=0.5)  # 2 bits: 6 spare bits in its byte
    bloom._bits[-1] = 0xFF
    with pytest.raises(CorruptSketchError, match="beyond"):
        BloomFilter.from_bytes(bloom.to_bytes())


@pytest.mark.parametrize("error_rate", [0.01, 0.001])
def test_measured_false_positive_rate_at_capacity_is_within_the_target(error_rate):
    bloom = BloomFilter(100_000, error_rate)
    bloom.update(np.arange(100_000, dtype=np.int64))
    probes = np.arange(10**7, 10**7 + 10**6, dtype=np.int64)   # never added
    rate = bloom.contains(probes).mean()
    assert 0.5 * error_rate < rate <= error_rate
