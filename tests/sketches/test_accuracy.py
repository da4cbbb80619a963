"""Statistical accuracy against exact answers: HyperLogLog relative error, Bloom filter
false-positive rate at capacity, t-digest tail quantiles on lognormal data. Seeds are fixed,
so results are reproducible; bounds leave statistical slack but a real regression fails."""

from __future__ import annotations

import numpy as np
import pytest

from sketches import BloomFilter, HyperLogLog, TDigest

P = 12
STANDARD_ERROR = 1.04 / np.sqrt(2**P)  # 1.6% for p = 12


def _distinct_ints(n: int, seed: int) -> np.ndarray:
    # Consecutive integers from a far-apart offset: the hardest input for a weak hash.
    return np.arange(n, dtype=np.int64) + seed * (1 << 40)


@pytest.mark.parametrize(("n", "trials"), [(1_000, 8), (100_000, 8), (1_000_000, 2)])
def test_hll_mean_relative_error_within_theory(n, trials):
    errors = [
        HyperLogLog(P).update(_distinct_ints(n, seed)).estimate() / n - 1 for seed in range(trials)
    ]
    assert np.mean(np.abs(errors)) <= STANDARD_ERROR
    assert np.max(np.abs(errors)) <= 3 * STANDARD_ERROR


def test_hll_string_values_within_theory():
    n = 100_000
    errors = []
    for seed in range(4):
        values = [f"session-{seed}-{i}" for i in range(n)]
        errors.append(HyperLogLog(P).update(values).estimate() / n - 1)
    assert np.mean(np.abs(errors)) <= STANDARD_ERROR


def test_hll_after_merging_16_partitions():
    n = 1_000_000
    errors = []
    for seed in (100, 101):
        values = _distinct_ints(n, seed)
        merged = HyperLogLog(P)
        for part in np.array_split(values, 16):
            merged.merge(HyperLogLog(P).update(part))
        assert merged == HyperLogLog(P).update(values)
        errors.append(merged.estimate() / n - 1)
    assert np.mean(np.abs(errors)) <= STANDARD_ERROR


@pytest.mark.parametrize(("error_rate", "probes"), [(0.01, 200_000), (0.001, 1_000_000)])
def test_bloom_false_positive_rate_at_capacity(error_rate, probes):
    capacity = 100_000
    bloom = BloomFilter(capacity, error_rate).update([f"member-{i}" for i in range(capacity)])
    non_members = np.arange(probes, dtype=np.int64) + (1 << 50)
    measured = bloom.contains(non_members).mean()
    # Binomial standard deviation is under 3.5% of the rate here; 12% slack is > 3.5 sigma.
    assert measured <= 1.12 * error_rate
    # A filter that answers "no" too often would be broken in another way.
    assert measured >= 0.5 * error_rate


# Bounds on |estimate / exact - 1| for compression 100 on 1e6 lognormal values.
TDIGEST_BOUNDS = {0.5: 0.015, 0.99: 0.015, 0.999: 0.02}


def _merged(values: np.ndarray, parts: int) -> TDigest:
    merged = TDigest(100)
    for part in np.array_split(values, parts):
        merged.merge(TDigest(100).update(part))
    return merged


def _chunked(values: np.ndarray, chunks: int) -> TDigest:
    digest = TDigest(100)
    for chunk in np.array_split(values, chunks):
        digest.update(chunk)
    return digest


@pytest.mark.parametrize(
    "build",
    [lambda v: TDigest(100).update(v), lambda v: _chunked(v, 100), lambda v: _merged(v, 16)],
    ids=["one-pass", "100-chunks", "16-partitions-merged"],
)
def test_tdigest_lognormal_quantiles(build):
    qs = np.array(list(TDIGEST_BOUNDS))
    bounds = np.array(list(TDIGEST_BOUNDS.values()))
    for seed in (0, 1):
        values = np.random.default_rng(seed).lognormal(mean=0.0, sigma=1.0, size=1_000_000)
        digest = build(values)
        relative_errors = np.abs(digest.quantile(qs) / np.quantile(values, qs) - 1)
        assert np.all(relative_errors <= bounds), dict(
            zip(qs.tolist(), relative_errors, strict=True)
        )
