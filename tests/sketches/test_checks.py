"""Runs every generic check of `sketches.checks` on every sketch, and shows the checks catch
broken sketches."""

from __future__ import annotations

from dataclasses import replace
from typing import Self

import pytest

from sketches import HyperLogLog
from sketches.checks import (
    SPECS,
    check_merge_commutative,
    check_merge_incompatible_raises,
    check_merge_partitions_equals_one_pass,
    check_same_bytes_across_processes,
    yield_checks,
)

CASES = [
    pytest.param(spec, check, id=f"{name}-{check.__name__}")
    for name, spec in SPECS.items()
    for check in yield_checks(spec)
]


@pytest.mark.parametrize(("spec", "check"), CASES)
def test_generic_check(spec, check):
    check(spec)


class ForgetfulHyperLogLog(HyperLogLog):
    """Merges by keeping only its own registers: wrong, and the checks must notice."""

    kind = 201

    def merge(self, other: HyperLogLog) -> Self:
        self._check_mergeable(other)
        return self


class OverwritingHyperLogLog(HyperLogLog):
    """Merges by taking the other's registers: commutes wrongly."""

    kind = 202

    def merge(self, other: HyperLogLog) -> Self:
        self._check_mergeable(other)
        self._registers[:] = other._registers
        return self


def test_checks_catch_a_merge_that_drops_data():
    spec = replace(SPECS["HyperLogLog"], factory=lambda: ForgetfulHyperLogLog(p=10))
    with pytest.raises(AssertionError):
        check_merge_partitions_equals_one_pass(spec)


def test_checks_catch_a_merge_that_is_not_commutative():
    spec = replace(SPECS["HyperLogLog"], factory=lambda: OverwritingHyperLogLog(p=10))
    with pytest.raises(AssertionError):
        check_merge_commutative(spec)


def test_checks_catch_a_merge_that_accepts_other_parameters():
    spec = replace(SPECS["BloomFilter"], incompatible_factory=SPECS["BloomFilter"].factory)
    with pytest.raises(AssertionError):
        check_merge_incompatible_raises(spec)


# Hashes str values with Python's salted hash(), so its bytes differ between processes.
SALTED_HYPERLOGLOG = replace(
    SPECS["HyperLogLog"],
    name="salted",
    ref=f"{__name__}:SALTED_HYPERLOGLOG",
    data=lambda seed, size: [hash(f"value-{seed}-{i}") for i in range(size)],
)


def test_checks_catch_hashing_that_differs_between_processes():
    with pytest.raises(AssertionError, match="differ between processes"):
        check_same_bytes_across_processes(SALTED_HYPERLOGLOG)
