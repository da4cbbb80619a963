"""The vectorised string hash: the numpy xxh3 kernels equal the xxhash C function for every
length and seed, and every shape of string input hashes exactly as `hash_value` per value."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches import (
    BloomFilter,
    CountMinSketch,
    HyperLogLog,
    UnsupportedValueError,
    hash_value,
    hashing,
)
from sketches import bloom as bloom_module
from sketches._xxh3 import xxh3_64_packed, xxh3_64_spans
from sketches.hashing import SEED_BYTES, SEED_STR, hash_values

SEEDS = [0, 1, SEED_STR, SEED_BYTES, 2**63, 2**64 - 1, 0x0123_4567_89AB_CDEF]
# Every code point class, lone surrogates (which the canonical encoding passes) included.
TEXT = st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=40)
SHORT_ASCII = st.text(st.characters(max_codepoint=0x7F), max_size=40)
# The property tests run without a deadline: their examples call numpy and Arrow, whose first
# calls and shared cores make single examples slow now and then.


def _packed(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return np.frombuffer(b"".join(values), dtype=np.uint8), offsets


def _expected(values: list[bytes], seed: int) -> list[int]:
    return [xxhash.xxh3_64_intdigest(v, seed=seed) for v in values]


@pytest.mark.parametrize("seed", SEEDS)
def test_kernel_matches_xxhash_for_every_length(seed):
    rng = random.Random(seed % 1000)
    values = [rng.randbytes(length) for length in range(301) for _ in range(3)]
    rng.shuffle(values)
    words, offsets = _packed(values)
    assert xxh3_64_packed(words, offsets, seed).tolist() == _expected(values, seed)


@pytest.mark.parametrize("length", [*range(0, 40), 63, 64, 65, 96, 97, 127, 128, 129, 240, 241])
def test_kernel_on_batches_of_one_length(length):
    # A batch within one length class takes the path without regrouping.
    rng = random.Random(length)
    values = [rng.randbytes(length) for _ in range(33)]
    words, offsets = _packed(values)
    assert xxh3_64_packed(words, offsets, SEED_STR).tolist() == _expected(values, SEED_STR)


def test_kernel_on_large_batches_and_mostly_one_class():
    # Thousands of values per class split the multiplications into several numpy calls; a
    # majority of 17-32-byte values takes the packed form for all, the rest overwritten.
    rng = random.Random(5)
    values = [rng.randbytes(rng.choice([20, 31, 40, 70, 100, 120])) for _ in range(12_000)]
    values += [rng.randbytes(rng.randrange(0, 17)) for _ in range(3000)]
    values += [rng.randbytes(rng.randrange(17, 33)) for _ in range(20_000)]
    rng.shuffle(values)
    words, offsets = _packed(values)
    assert xxh3_64_packed(words, offsets, 99).tolist() == _expected(values, 99)


@pytest.mark.parametrize("max_length", [16, 32, 64, 96, 128])
def test_values_past_max_length_go_to_hash_long(max_length):
    values = [bytes([i % 251]) * i for i in range(200)]
    words, offsets = _packed(values)
    asked = []

    def hash_long(index):
        asked.extend(index.tolist())
        return np.array(_expected([values[i] for i in index], 3), dtype=np.uint64)

    hashes = xxh3_64_packed(words, offsets, 3, max_length=max_length, hash_long=hash_long)
    assert hashes.tolist() == _expected(values, 3)
    assert asked == list(range(max_length + 1, 200))
    with pytest.raises(ValueError, match="max_length"):
        xxh3_64_packed(words, offsets, 3, max_length=20)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=160), max_size=50), st.integers(0, 2**64 - 1))
def test_kernel_matches_xxhash_on_random_bytes(values, seed):
    words, offsets = _packed(values)
    assert xxh3_64_packed(words, offsets, seed).tolist() == _expected(values, seed)


@settings(deadline=None)
@given(st.lists(st.binary(max_size=140), max_size=30), st.integers(0, 2**64 - 1))
def test_spans_with_gaps_never_read_the_gaps(values, seed):
    # Each value sits in a slot of 150 bytes whose rest is filled with 0xFF.
    width = 150
    matrix = np.full((len(values), width), 0xFF, dtype=np.uint8)
    for row, value in enumerate(values):
        matrix[row, : len(value)] = np.frombuffer(value, dtype=np.uint8)
    starts = np.arange(len(values), dtype=np.int64) * width
    ends = starts + np.array([len(v) for v in values], dtype=np.int64)
    hashes = xxh3_64_spans(matrix.reshape(-1), starts, ends, seed)
    assert hashes.tolist() == _expected(values, seed)


def test_kernel_on_no_values():
    words, offsets = _packed([])
    assert xxh3_64_packed(words, offsets, 0).tolist() == []


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXT, max_size=60))
def test_string_lists_and_arrays_match_scalar(values):
    expected = [hash_value(v) for v in values]
    assert hash_values(values).tolist() == expected
    assert hash_values(np.array(values, dtype=object)).tolist() == expected
    assert hash_values(pd.Series(values, dtype=object)).tolist() == expected
    assert hash_values(tuple(values)).tolist() == expected


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), TEXT), max_size=60))
def test_strings_with_none_match_scalar(values):
    expected = [hash_value(v) for v in values]
    assert hash_values(values).tolist() == expected
    assert hash_values(np.array(values, dtype=object)).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60))
def test_pandas_string_dtypes_match_scalar(values):
    # Missing values of extension columns hash as None (see as_value_array).
    expected = [hash_value(v) for v in values]
    for dtype in (
        object,
        "string[python]",
        "string[pyarrow]",
        pd.ArrowDtype(pa.string()),
        pd.ArrowDtype(pa.large_string()),
        pd.ArrowDtype(pa.string_view()),
    ):
        series = pd.Series(values, dtype=dtype)
        assert hash_values(series).tolist() == expected, dtype
        assert hash_values(pd.Index(series)).tolist() == expected, dtype


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), TEXT), max_size=40))
def test_pandas_python_strings_with_surrogates_match_scalar(values):
    series = pd.Series(values, dtype="string[python]")
    assert hash_values(series).tolist() == [hash_value(v) for v in values]


def test_arrow_columns_of_other_types_keep_their_hashes():
    values = [b"ab", None, b""]
    binary = pd.Series(values, dtype=pd.ArrowDtype(pa.binary()))
    assert hash_values(binary).tolist() == [hash_value(v) for v in values]
    numbers = pd.Series([1, None, 3], dtype=pd.ArrowDtype(pa.int64()))
    assert hash_values(numbers).tolist() == [hash_value(1), hash_value(None), hash_value(3)]


def test_sliced_and_chunked_arrow_columns():
    values = [f"value-{i}" * (i % 9) for i in range(3000)]
    series = pd.Series(values, dtype=pd.ArrowDtype(pa.string()))
    chunked = pd.concat([series[:1000], series[1000:]], ignore_index=True)
    assert chunked.array.__arrow_array__().num_chunks == 2
    expected = [hash_value(v) for v in values]
    assert hash_values(chunked).tolist() == expected
    assert hash_values(series[1234:2345]).tolist() == expected[1234:2345]


@settings(max_examples=200, deadline=None)
@given(st.lists(SHORT_ASCII, max_size=60))
def test_numpy_unicode_arrays_match_scalar(values):
    array = np.array(values, dtype=str)
    # Numpy drops trailing NULs when it reads an item back: hash what it holds.
    expected = [hash_value(v) for v in array.tolist()]
    assert hash_values(array).tolist() == expected


@settings(deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=40))
def test_non_ascii_numpy_unicode_arrays_match_scalar(values):
    array = np.array(values, dtype=str)
    assert hash_values(array).tolist() == [hash_value(v) for v in array.tolist()]


@settings(deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=60))
def test_numpy_bytes_arrays_and_bytes_lists_match_scalar(values):
    array = np.array(values, dtype=bytes)
    assert hash_values(array).tolist() == [hash_value(v) for v in array.tolist()]
    assert hash_values(values).tolist() == [hash_value(v) for v in values]


def test_numpy_strings_with_nul_bytes():
    array = np.array(["a\x00b", "\x00", "ab\x00", ""], dtype=str)
    assert array.tolist() == ["a\x00b", "", "ab", ""]
    assert hash_values(array).tolist() == [hash_value(v) for v in array.tolist()]
    raw = np.array([b"a\x00b", b"\x00", b"ab\x00", b""])
    assert hash_values(raw).tolist() == [hash_value(v) for v in raw.tolist()]
    assert hash_values(np.array(["", ""])).tolist() == [hash_value("")] * 2
    assert hash_values(np.array([b"", b""])).tolist() == [hash_value(b"")] * 2
    swapped = np.array(["ab", "é"], dtype=">U2")
    assert hash_values(swapped).tolist() == [hash_value("ab"), hash_value("é")]


def test_batches_of_different_kinds(monkeypatch):
    # Each batch falls back on its own; the others keep the vectorised path.
    monkeypatch.setattr(hashing, "_STRING_BATCH", 16)
    values: list[object] = [f"s{i}" * (i % 40) for i in range(100)]
    values[20] = b"bytes"
    values[40] = 7
    values[60] = "lone \ud800 surrogate"
    values[80] = None
    expected = [hash_value(v) for v in values]
    assert hash_values(values).tolist() == expected
    assert hash_values(np.array(values[:50] + values[81:], dtype=object)).tolist() == (
        expected[:50] + expected[81:]
    )


def test_str_subclasses_hash_as_their_text():
    class Name(str):
        pass

    values = [Name("alpha"), np.str_("beta"), "gamma"]
    assert hash_values(values).tolist() == [hash_value(str(v)) for v in values]


def test_missing_values_other_than_none_keep_their_meaning():
    assert hash_values(["a", float("nan")]).tolist() == [hash_value("a"), hash_value(np.nan)]
    with pytest.raises(UnsupportedValueError):
        hash_values(["a", pd.NA])


def test_long_strings_use_the_c_function():
    mostly_long = ["x" * 129, "y" * 500, "é" * 100, "short"]
    assert hash_values(mostly_long).tolist() == [hash_value(v) for v in mostly_long]
    mostly_short = [f"id-{i}" if i % 7 else f"{i}" * 40 for i in range(5000)]
    assert hash_values(mostly_short).tolist() == [hash_value(v) for v in mostly_short]


def test_sketches_of_strings_equal_per_value_hashing(monkeypatch):
    values = [f"user-{i}" for i in range(20_000)] + ["", "a", "é" * 40, "x" * 300]
    hashes = np.array([hash_value(v) for v in values], dtype=np.uint64)
    hll = HyperLogLog(p=12)
    hll._update_hashes(hashes)
    assert HyperLogLog(p=12).update(values) == hll
    cms = CountMinSketch(512, 4)
    cms._update_hashes(hashes, 1)
    assert CountMinSketch(512, 4).update(values) == cms
    with monkeypatch.context() as patch:
        patch.setattr(bloom_module, "hash_values", lambda _: hashes)
        bloom = BloomFilter(50_000, 0.01).update(values)
    assert BloomFilter(50_000, 0.01).update(values) == bloom
