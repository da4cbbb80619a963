"""HyperLogLog: parameters, estimates at small counts, serialised layout, and register-exact
interoperability with datasketch.HyperLogLogPlusPlus."""

from __future__ import annotations

import numpy as np
import pytest
from datasketch import HyperLogLog as DatasketchHLL
from datasketch import HyperLogLogPlusPlus

from sketches import (
    CorruptSketchError,
    HyperLogLog,
    IncompatibleSketchError,
    InvalidParameterError,
    from_bytes,
    hash_value,
)


@pytest.mark.parametrize("p", [3, 19, 14.0, "14", None])
def test_invalid_precision_raises(p):
    with pytest.raises(InvalidParameterError):
        HyperLogLog(p=p)


def test_fresh_sketch_estimates_zero():
    hll = HyperLogLog()
    assert hll.p == 14 and hll.m == 16384
    assert hll.is_empty and hll.estimate() == 0.0


def test_small_counts_are_nearly_exact():
    hll = HyperLogLog(p=14)
    for n in (1, 10, 100, 1000):
        hll.update(range(n))
        assert abs(hll.estimate() - n) <= max(0.5, 0.01 * n)


def test_duplicates_do_not_count():
    once = HyperLogLog(p=12).update(np.arange(5000))
    repeated = HyperLogLog(p=12).update(np.tile(np.arange(5000), 4))
    assert once == repeated


def test_registers_are_read_only_and_hold_ranks():
    hll = HyperLogLog(p=8).update(np.arange(10_000))
    with pytest.raises(ValueError):
        hll.registers[0] = 1
    assert 0 < hll.registers.max() <= 64 - 8 + 1


def test_serialised_layout():
    hll = HyperLogLog(p=4).update("x")
    data = hll.to_bytes()
    assert data[:4] == b"VGSK" and data[4] == 1 and data[5] == HyperLogLog.kind
    assert data[6] == 1  # hash function id
    assert len(data) == 12 + 1 + 16 + 4
    assert from_bytes(data) == hll


def test_out_of_range_register_is_rejected_even_in_a_valid_frame():
    hll = HyperLogLog(p=4)
    hll._registers[1] = 62  # above the maximum rank 64 - 4 + 1; frame and CRC stay valid
    with pytest.raises(CorruptSketchError, match="maximum rank"):
        HyperLogLog.from_bytes(hll.to_bytes())


@pytest.mark.parametrize("n", [0, 1, 50, 2_000, 30_000, 200_000])
@pytest.mark.parametrize("p", [4, 10, 14])
def test_registers_and_estimates_match_datasketch(n, p):
    rng = np.random.default_rng(n + p)
    values = rng.integers(-(2**62), 2**62, size=n)
    ours = HyperLogLog(p=p).update(values)
    theirs = HyperLogLogPlusPlus(p=p, hashfunc=hash_value)
    for value in values.tolist():
        theirs.update(value)
    np.testing.assert_array_equal(ours.registers, theirs.reg)
    assert ours.estimate() == float(theirs.count())


def test_string_values_match_datasketch():
    values = [f"event-{i}" for i in range(5000)] + ["ü", "", "a\U0001f600"]
    ours = HyperLogLog(p=12).update(values)
    theirs = HyperLogLogPlusPlus(p=12, hashfunc=hash_value)
    for value in values:
        theirs.update(value)
    np.testing.assert_array_equal(ours.registers, theirs.reg)
    assert ours.estimate() == float(theirs.count())


def test_to_datasketch_then_both_keep_agreeing():
    ours = HyperLogLog(p=12).update(np.arange(3000))
    theirs = ours.to_datasketch()
    assert isinstance(theirs, HyperLogLogPlusPlus) and theirs.p == 12
    more = [f"k{i}" for i in range(3000)]
    ours.update(more)
    for value in more:
        theirs.update(value)
    np.testing.assert_array_equal(ours.registers, theirs.reg)
    assert ours.estimate() == float(theirs.count())
    assert HyperLogLog.from_datasketch(theirs) == ours


def test_from_datasketch_refuses_other_hash_functions():
    with pytest.raises(IncompatibleSketchError):
        HyperLogLog.from_datasketch(HyperLogLogPlusPlus(p=12))
    with pytest.raises(IncompatibleSketchError):
        HyperLogLog.from_datasketch(DatasketchHLL(p=12, hashfunc=hash_value))
    lost_hash = HyperLogLogPlusPlus(p=12)
    lost_hash.reg[3] = 5
    assert HyperLogLog.from_datasketch(lost_hash, check_hashfunc=False).registers[3] == 5


def test_to_datasketch_refuses_precisions_it_lacks():
    with pytest.raises(InvalidParameterError):
        HyperLogLog(p=17).to_datasketch()
