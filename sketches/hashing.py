"""Deterministic 64-bit hashing of stream values, identical across processes and machines, for
every sketch in the package; whole arrays are hashed at once with numpy.

Canonical encoding (hash function id 1, ``xxh3_64/vigil-v1``). Every value is hashed as
``xxh3_64(canonical_bytes, seed)`` where the bytes and the seed depend on the value's type:

========================================  ====================================  ===============
value                                     canonical bytes                       seed
========================================  ====================================  ===============
``None``                                  empty                                 ``SEED_NONE``
``bool``, ``int`` in int64 range,         the integer as int64, 8 bytes         ``SEED_INT``
integral ``float`` in int64 range         little-endian
other ``float`` (fractional, inf, NaN)    IEEE-754 float64 bits, little-endian  ``SEED_FLOAT``
                                          (every NaN as ``0x7ff8000000000000``)
``int`` outside int64 range               as ``float`` if exactly representable,
                                          else two's complement little-endian   ``SEED_BIGINT``
                                          in the fewest bytes
``str``                                   UTF-8 (lone surrogates passed)        ``SEED_STR``
``bytes``, ``bytearray``, ``memoryview``  the bytes                             ``SEED_BYTES``
========================================  ====================================  ===============

So values that compare equal in Python hash equal (``1 == 1.0 == True``; ``-0.0 == 0``), while
``"a"`` and ``b"a"`` differ. Numpy scalars hash like the Python values they hold. For inputs of
up to 128 bytes xxh3 is a short closed formula, which this module evaluates with numpy on whole
arrays: int64/float64 arrays directly, strings and bytes after packing them Arrow-style
(offsets + one data buffer), with the kernels of `sketches._xxh3`: hand-written because they
measured about ten times faster than calling the ``xxhash`` package per value on int64 arrays
and three times on packed strings (the numbers are in that module's docstring). Longer strings
and bytes (for Python objects, those over 64 bytes, where the closed form stops paying) go
through the ``xxhash`` C implementation one value at a time.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import xxhash

from sketches._xxh3 import MAX_CLOSED_FORM_LENGTH, xxh3_64_packed, xxh3_64_spans, xxh3_64_words
from sketches.errors import UnsupportedValueError

__all__ = [
    "HASH_ID",
    "HASH_NAME",
    "SEED_BIGINT",
    "SEED_BYTES",
    "SEED_FLOAT",
    "SEED_INT",
    "SEED_NONE",
    "SEED_STR",
    "as_value_array",
    "hash_value",
    "hash_values",
    "is_scalar",
]

HASH_ID = 1
HASH_NAME = "xxh3_64/vigil-v1"

# One seed per type so that, e.g., the int 7 and the float whose bits read as 7 do not collide.
SEED_INT = 0x5649_4749_4C00_0001
SEED_FLOAT = 0x5649_4749_4C00_0002
SEED_STR = 0x5649_4749_4C00_0003
SEED_BYTES = 0x5649_4749_4C00_0004
SEED_NONE = 0x5649_4749_4C00_0005
SEED_BIGINT = 0x5649_4749_4C00_0006

_INT64_MIN = -(1 << 63)
_INT64_END = 1 << 63
_CANONICAL_NAN_BITS = 0x7FF8_0000_0000_0000
_SCALAR_TYPES = (str, bytes, bytearray, memoryview, int, float, bool, np.generic, type(None))

# Values per batch on the string path: a batch's numpy temporaries stay in the L2 cache.
_STRING_BATCH = 16384
# Longer strings of a Python str batch go to the xxhash C function one at a time: past two
# pairs of 16-byte blocks, that beats the numpy closed form (see bench/results/sketches.md).
_PACKED_MAX_LENGTH = 64
# np.strings (numpy >= 2) has a vectorised str_len; np.char's loops over Python objects.
_str_len = getattr(np, "strings", np.char).str_len

_xxh3 = xxhash.xxh3_64_intdigest
_pack_int64 = struct.Struct("<q").pack
_pack_float64 = struct.Struct("<d").pack
_HASH_NONE = _xxh3(b"", seed=SEED_NONE)


def is_scalar(values: Any) -> bool:
    """Return whether ``values`` is one value rather than a collection of values.

    Examples
    --------
    >>> is_scalar("abc"), is_scalar(3), is_scalar([3]), is_scalar(np.arange(2))
    (True, True, False, False)
    """
    if isinstance(values, np.ndarray):
        return values.ndim == 0
    return isinstance(values, _SCALAR_TYPES)


# Up to this many values in a list, tuple or 1-D array, hash_values hashes them one by one.
SMALL_INPUT = 64


def hash_value(value: Any) -> int:
    """Hash one value to an unsigned 64-bit integer with the canonical encoding.

    Also usable as ``hashfunc`` of a ``datasketch`` sketch, so that both libraries agree.

    Parameters
    ----------
    value
        ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``-like or a numpy scalar.

    Returns
    -------
    int
        The hash, in ``[0, 2**64)``.

    Raises
    ------
    UnsupportedValueError
        If the value's type has no canonical encoding.

    Examples
    --------
    >>> hash_value("vigil")
    10184781135903137770
    >>> hash_value(1) == hash_value(1.0) == hash_value(True)
    True
    >>> hash_value("a") == hash_value(b"a")
    False
    """
    if isinstance(value, str):
        return _xxh3(value.encode("utf-8", "surrogatepass"), seed=SEED_STR)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _xxh3(bytes(value), seed=SEED_BYTES)
    if value is None:
        return _HASH_NONE
    if isinstance(value, (bool, np.bool_)):
        return _xxh3(_pack_int64(int(value)), seed=SEED_INT)
    if isinstance(value, (int, np.integer)):
        return _hash_int(int(value))
    if isinstance(value, (float, np.floating)):
        return _hash_float(float(value))
    raise UnsupportedValueError(
        f"cannot hash a value of type {type(value).__name__!r}: supported types are None, bool, "
        "int, float, str and bytes (and numpy scalars of those)"
    )


def _hash_int(value: int) -> int:
    if _INT64_MIN <= value < _INT64_END:
        return _xxh3(_pack_int64(value), seed=SEED_INT)
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.nan
    if as_float == value:
        return _xxh3(_pack_float64(as_float), seed=SEED_FLOAT)
    width = (value.bit_length() + 8) // 8
    return _xxh3(value.to_bytes(width, "little", signed=True), seed=SEED_BIGINT)


def _hash_float(value: float) -> int:
    if math.isnan(value):
        return _xxh3(_CANONICAL_NAN_BITS.to_bytes(8, "little"), seed=SEED_FLOAT)
    if value.is_integer() and _INT64_MIN <= value < _INT64_END:
        return _xxh3(_pack_int64(int(value)), seed=SEED_INT)
    return _xxh3(_pack_float64(value), seed=SEED_FLOAT)


def hash_values(values: Any) -> np.ndarray:
    """Hash a scalar or a collection of values to a ``uint64`` array, one hash per value.

    int64, float64, bool and other numeric numpy arrays are hashed without a Python loop, and
    so are strings and bytes (lists, object arrays, numpy ``U``/``S`` arrays, pandas string
    columns with Python or Arrow storage) after one conversion to Arrow's packed layout, up to
    64 bytes for Python objects and 128 bytes otherwise; longer ones call the xxhash C function
    per value; columns of mixed types fall back to :func:`hash_value` per value. The result
    always equals ``[hash_value(v) for v in values]`` (with missing values of pandas extension
    columns as ``None``).

    Parameters
    ----------
    values
        A scalar, a numpy array, a pandas Series or Index, or any iterable of values.

    Returns
    -------
    numpy.ndarray
        A one-dimensional ``uint64`` array.

    Examples
    --------
    >>> h = hash_values(np.array([1, 2, 3]))
    >>> h.dtype, h.shape
    (dtype('uint64'), (3,))
    >>> bool(h[0] == hash_value(1))
    True
    >>> hash_values(["x", None, 2.5]).tolist() == [hash_value(v) for v in ["x", None, 2.5]]
    True
    """
    if is_scalar(values):
        item = values.item() if isinstance(values, np.ndarray) else values
        return np.array([hash_value(item)], dtype=np.uint64)
    if (
        isinstance(values, (list, tuple))
        or (isinstance(values, np.ndarray) and values.ndim == 1)
    ) and len(values) <= SMALL_INPUT:
        # A few values: hash_value each (~1 µs) beats the array paths' fixed cost (50-600 µs).
        return np.fromiter(map(hash_value, values), dtype=np.uint64, count=len(values))
    strings = _arrow_strings(values)
    if strings is not None:
        return _hash_arrow(strings, SEED_STR)
    array = as_value_array(values)
    kind = array.dtype.kind
    if kind in "bi" or (kind == "u" and array.dtype.itemsize < 8):
        return _hash_int64(array.astype(np.int64, copy=False))
    if kind == "u":
        return _hash_uint64(array)
    if kind == "f":
        return _hash_float64(array.astype(np.float64, copy=False))
    if kind == "U":
        return _hash_unicode(array)
    if kind == "S":
        return _hash_fixed_width(_code_units(array, np.uint8), SEED_BYTES)
    if kind == "O":
        return _hash_objects(array)
    raise UnsupportedValueError(f"cannot hash an array of dtype {array.dtype}")


def as_value_array(values: Any) -> np.ndarray:
    """The values as the one-dimensional numpy array that :func:`hash_values` hashes.

    A scalar becomes a one-element object array; lists and other iterables become object
    arrays (never coerced to a common type); pandas extension columns become object arrays
    with missing values as ``None``.

    Examples
    --------
    >>> as_value_array([1, "a"]).tolist(), as_value_array("a").dtype
    ([1, 'a'], dtype('O'))
    """
    if is_scalar(values):
        array = np.empty(1, dtype=object)
        array[0] = values.item() if isinstance(values, np.ndarray) else values
        return array
    if isinstance(values, (pd.Series, pd.Index)):
        if isinstance(values.dtype, np.dtype):
            values = values.to_numpy()
        else:
            # Extension dtypes (nullable ints, pandas strings, arrow): missing values become None.
            values = values.to_numpy(dtype=object, na_value=None)
    if isinstance(values, np.ndarray):
        return np.ascontiguousarray(values.ravel())
    if not isinstance(values, (list, tuple)):
        if not isinstance(values, Iterable):
            raise UnsupportedValueError(f"cannot hash a value of type {type(values).__name__!r}")
        values = list(values)
    # dtype=object: letting numpy infer would turn [1, "a"] into the strings ["1", "a"].
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _hash_objects(array: np.ndarray) -> np.ndarray:
    first = array[0] if len(array) else None
    if not isinstance(first, str) and first is not None:
        return _hash_mixed(array)
    # Optimistically a column of strings (and None), the common case, batch by batch.
    hashes = np.empty(len(array), dtype=np.uint64)
    for start in range(0, len(array), _STRING_BATCH):
        batch = array[start : start + _STRING_BATCH]
        hashes[start : start + len(batch)] = _hash_string_batch(batch)
    return hashes


def _hash_string_batch(batch: np.ndarray) -> np.ndarray:
    if _mostly_long(batch):
        return _hash_mixed(batch)
    try:
        # Arrow infers the string type only when every value is a str or None (the only null
        # without from_pandas); any other mix is left to the general path, and so is every
        # conversion error (lone surrogates, which only that path encodes, among them).
        packed = pa.array(batch, from_pandas=False)
    except Exception:
        return _hash_mixed(batch)
    if not isinstance(packed, pa.Array) or packed.type != pa.string():
        return _hash_mixed(batch)
    return _hash_packed(
        packed,
        SEED_STR,
        max_length=_PACKED_MAX_LENGTH,
        hash_long=lambda index: _hash_mixed(batch[index]),
    )


def _mostly_long(batch: np.ndarray) -> bool:
    """Whether most of a sample of the batch are strings longer than _PACKED_MAX_LENGTH."""
    sample = batch[:: max(1, len(batch) // 64)]
    long = sum(isinstance(v, str) and len(v) > _PACKED_MAX_LENGTH for v in sample)
    return 2 * long > len(sample)


def _hash_mixed(array: np.ndarray) -> np.ndarray:
    # One map() over C functions per value when all are strings: the first non-string raises
    # TypeError at once; a lone surrogate needs hash_value's error mode.
    try:
        encoded = map(str.encode, array)
        return np.fromiter(map(_xxh3, encoded, repeat(SEED_STR)), np.uint64, len(array))
    except (TypeError, UnicodeEncodeError):
        pass
    inferred = pd.api.types.infer_dtype(array, skipna=False)
    if inferred == "bytes":
        return _hash_arrow(pa.array(array, type=pa.binary()), SEED_BYTES)
    if inferred in ("integer", "boolean"):
        try:
            return _hash_int64(array.astype(np.int64))
        except OverflowError:
            pass
    if inferred == "floating":
        return _hash_float64(array.astype(np.float64))
    if inferred == "empty":
        return np.empty(0, dtype=np.uint64)
    return np.fromiter(map(hash_value, array), dtype=np.uint64, count=len(array))


def _arrow_strings(values: Any) -> pa.Array | pa.ChunkedArray | None:
    """The Arrow strings behind a pandas column with Arrow storage, or None for other input."""
    if not isinstance(values, (pd.Series, pd.Index)):
        return None
    array = values.array
    if not isinstance(array, pd.arrays.ArrowExtensionArray):
        return None
    data = array.__arrow_array__()
    if pa.types.is_string_view(data.type):
        return data.cast(pa.large_string())
    if pa.types.is_string(data.type) or pa.types.is_large_string(data.type):
        return data
    return None


def _hash_arrow(data: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """Hash an Arrow string or binary array, batch by batch; nulls hash as None."""
    chunks = data.chunks if isinstance(data, pa.ChunkedArray) else [data]
    hashes = np.empty(len(data), dtype=np.uint64)
    start = 0
    for chunk in chunks:
        for offset in range(0, len(chunk), _STRING_BATCH):
            batch = chunk.slice(offset, _STRING_BATCH)
            hashes[start : start + len(batch)] = _hash_packed(batch, seed)
            start += len(batch)
    return hashes


def _hash_packed(
    array: pa.Array,
    seed: int,
    *,
    max_length: int = MAX_CLOSED_FORM_LENGTH,
    hash_long: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Hash one Arrow string or binary array (32- or 64-bit offsets); nulls hash as None.
    ``max_length`` and ``hash_long`` are as in `sketches._xxh3.xxh3_64_packed`."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offset_type = np.dtype(np.int64 if large else np.int32)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(
        offsets_buffer,
        dtype=offset_type,
        count=len(array) + 1,
        offset=array.offset * offset_type.itemsize,
    ).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    if first:
        offsets -= first
    if last > first:
        data = np.frombuffer(data_buffer, dtype=np.uint8, count=last - first, offset=first)
    else:
        data = np.empty(0, dtype=np.uint8)
    hashes = xxh3_64_packed(data, offsets, seed, max_length=max_length, hash_long=hash_long)
    if array.null_count:
        hashes[array.is_null().to_numpy(zero_copy_only=False)] = _HASH_NONE
    return hashes


def _hash_unicode(array: np.ndarray) -> np.ndarray:
    """Hash a numpy ``U`` array; ASCII ones are packed by narrowing their UTF-32 code units."""
    codes = _code_units(array, np.uint32)
    hashes = np.empty(len(array), dtype=np.uint64)
    for start in range(0, len(array), _STRING_BATCH):
        batch = codes[start : start + _STRING_BATCH]
        if batch.max(initial=0) < 0x80:
            batch_hashes = _hash_fixed_width(batch.astype(np.uint8), SEED_STR)
        else:
            batch_hashes = _hash_objects(array[start : start + _STRING_BATCH].astype(object))
        hashes[start : start + len(batch)] = batch_hashes
    return hashes


def _code_units(array: np.ndarray, dtype: type[np.generic]) -> np.ndarray:
    """A ``U`` or ``S`` array's items as rows of code units (UTF-32 or bytes)."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    width = array.dtype.itemsize // np.dtype(dtype).itemsize
    if width == 0 or len(array) == 0:
        return np.zeros((len(array), width), dtype=dtype)
    return array.view(dtype).reshape(len(array), width)


def _hash_fixed_width(matrix: np.ndarray, seed: int) -> np.ndarray:
    """Hash the rows of a ``uint8`` matrix as numpy reads its ``S`` items: without trailing
    NUL bytes. The rows are hashed in place; the padding between them is never read."""
    count, width = matrix.shape
    if width == 0:
        return np.full(count, _xxh3(b"", seed=seed), dtype=np.uint64)
    hashes = np.empty(count, dtype=np.uint64)
    for start in range(0, count, _STRING_BATCH):
        batch = np.ascontiguousarray(matrix[start : start + _STRING_BATCH])
        lengths = _str_len(batch.view(f"S{width}").reshape(-1)).astype(np.int64)
        starts = np.arange(0, len(batch) * width, width, dtype=np.int64)
        hashes[start : start + len(batch)] = xxh3_64_spans(
            batch.reshape(-1), starts, starts + lengths, seed
        )
    return hashes


def _hash_int64(array: np.ndarray) -> np.ndarray:
    return xxh3_64_words(array.view(np.uint64), SEED_INT)


def _hash_uint64(array: np.ndarray) -> np.ndarray:
    array = array.astype(np.uint64, copy=False)
    small = array < np.uint64(_INT64_END)
    if small.all():
        return xxh3_64_words(array, SEED_INT)
    hashes = np.empty(len(array), dtype=np.uint64)
    hashes[small] = xxh3_64_words(array[small], SEED_INT)
    hashes[~small] = [_hash_int(int(v)) for v in array[~small]]
    return hashes


def _hash_float64(array: np.ndarray) -> np.ndarray:
    integral = (array == np.trunc(array)) & (array >= -(2.0**63)) & (array < 2.0**63)
    if integral.all():
        return xxh3_64_words(array.astype(np.int64).view(np.uint64), SEED_INT)
    bits = np.where(np.isnan(array), np.uint64(_CANONICAL_NAN_BITS), array.view(np.uint64))
    if not integral.any():
        return xxh3_64_words(bits, SEED_FLOAT)
    hashes = xxh3_64_words(bits, SEED_FLOAT)
    hashes[integral] = xxh3_64_words(array[integral].astype(np.int64).view(np.uint64), SEED_INT)
    return hashes
