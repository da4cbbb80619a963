"""TDigest: exactness on small inputs, quantile and CDF conventions, input validation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sketches import InvalidParameterError, TDigest, UnsupportedValueError


@pytest.mark.parametrize("compression", [5, 1e6, "100", None])
def test_invalid_compression_raises(compression):
    with pytest.raises(InvalidParameterError):
        TDigest(compression)


def test_empty_digest():
    digest = TDigest()
    assert digest.is_empty and digest.count == 0
    assert math.isnan(digest.min) and math.isnan(digest.max)
    assert math.isnan(digest.quantile(0.5)) and math.isnan(digest.cdf(1.0))
    assert np.isnan(digest.quantile([0.1, 0.9])).all()


@pytest.mark.parametrize(
    ("n", "compression"), [(1, 100), (2, 100), (5, 100), (30, 100), (300, 1000)]
)
def test_few_values_match_numpy_exactly(n, compression):
    values = np.random.default_rng(n).normal(size=n)
    digest = TDigest(compression).update(values)
    assert (digest.centroids()[1] == 1).all()  # every value is its own centroid
    qs = np.linspace(0, 1, 21)
    np.testing.assert_allclose(digest.quantile(qs), np.quantile(values, qs), rtol=0, atol=1e-12)
    assert digest.min == values.min() and digest.max == values.max()


def test_quantile_and_cdf_are_inverse():
    values = np.random.default_rng(3).gamma(2.0, size=50_000)
    digest = TDigest().update(values)
    qs = np.linspace(0.001, 0.999, 37)
    np.testing.assert_allclose(digest.cdf(digest.quantile(qs)), qs, atol=1e-9)


def test_quantiles_are_monotone_and_bounded():
    values = np.random.default_rng(4).standard_cauchy(size=100_000)
    digest = TDigest(compression=50).update(values)
    estimates = digest.quantile(np.linspace(0, 1, 1001))
    assert np.all(np.diff(estimates) >= 0)
    assert estimates[0] == values.min() and estimates[-1] == values.max()


def test_cdf_outside_the_range():
    digest = TDigest().update([1.0, 2.0, 3.0])
    assert digest.cdf(0.5) == 0.0 and digest.cdf(3.0) == 1.0 and digest.cdf(99) == 1.0
    assert digest.cdf(np.array([[0.0, 2.0]])).shape == (1, 2)


def test_scalar_and_array_query_shapes():
    digest = TDigest().update(np.arange(100))
    assert isinstance(digest.quantile(0.5), float)
    assert digest.quantile(np.array([[0.5]])).shape == (1, 1)


@pytest.mark.parametrize("q", [-0.1, 1.1, float("nan"), [0.5, 2.0]])
def test_invalid_quantile_raises(q):
    with pytest.raises(InvalidParameterError):
        TDigest().update([1.0]).quantile(q)


def test_nan_is_skipped_and_infinity_rejected():
    digest = TDigest().update([1.0, float("nan"), 3.0]).update(float("nan"))
    assert digest.count == 2
    with pytest.raises(UnsupportedValueError):
        TDigest().update([1.0, math.inf])
    with pytest.raises(UnsupportedValueError):
        TDigest().update(-math.inf)


@pytest.mark.parametrize("bad", ["abc", ["1.0", "x"], [object()]])
def test_non_numbers_rejected(bad):
    with pytest.raises(UnsupportedValueError):
        TDigest().update(bad)


def test_accepts_ints_lists_and_series():
    digest = TDigest().update([1, 2]).update(np.array([3, 4], dtype=np.int32))
    digest.update(pd.Series([5.0])).update(6)
    assert digest.count == 6 and digest.quantile(1.0) == 6.0


def test_caller_array_changes_do_not_reach_the_buffer():
    values = np.array([1.0, 2.0, 3.0])
    digest = TDigest().update(values)
    values[:] = 100.0
    assert digest.max == 3.0 and digest.quantile(1.0) == 3.0


def test_centroid_count_is_bounded_by_compression():
    digest = TDigest(compression=100)
    rng = np.random.default_rng(5)
    for _ in range(50):
        digest.update(rng.exponential(size=20_000))
    means, weights = digest.centroids()
    assert len(means) <= 2 * 100
    assert weights.sum() == digest.count == 1_000_000
    assert weights[0] == 1 and weights[-1] == 1  # the extremes stay single values
