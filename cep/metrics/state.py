"""The byte encoding of a metric operator's state: little-endian, length-prefixed values, framed
by :data:`CODEC` (magic, format version :data:`STATE_VERSION`, the metric's fingerprint, and a
checksum closing the bytes)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from cep.metrics.columns import ValueColumn
from cep.metrics.errors import MetricStateError
from query_lang.compiler import normalise_value
from sketches.codec import StateCodec

__all__ = ["CODEC", "MAGIC", "STATE_VERSION", "StateReader", "StateWriter"]

STATE_VERSION = 1
"""Version of :meth:`cep.metrics.MetricOperator.to_bytes`'s format."""

MAGIC = b"VGMO"
"""The first bytes of metric operator state."""

CODEC = StateCodec(MAGIC, STATE_VERSION, fields="32s", checksum="sha256-8",
                   name="metric operator state", error=MetricStateError)
"""The frame around a state body; its one header field is the metric's 32-byte fingerprint."""

_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_BYTE = [bytes([i]) for i in range(256)]
_DTYPES = {0: np.int64, 1: np.float64, 2: np.bool_, 3: np.uint64}
_DTYPE_CODES = {np.dtype(t): code for code, t in _DTYPES.items()}


class StateWriter:
    """Little-endian, length-prefixed encoding of the operator's state, closed by a checksum."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self._parts.append(data)

    def u8(self, value: int) -> None:
        self._parts.append(_BYTE[int(value)])

    def u32(self, value: int) -> None:
        self._parts.append(_U32.pack(value))

    def i64(self, value: int) -> None:
        self._parts.append(_I64.pack(value))

    def blob(self, data: bytes) -> None:
        self.u32(len(data))
        self._parts.append(data)

    def array(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values)
        code = _DTYPE_CODES.get(values.dtype)
        if code is None:
            raise MetricStateError(f"cannot encode an array of {values.dtype}")
        self.u8(code)
        self.blob(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())

    def column(self, column: ValueColumn) -> None:
        self.array(column.valid)
        if column.values.dtype in _DTYPE_CODES:
            self.u8(0)
            self.array(column.values)
        else:
            self.u8(1)
            self.u32(len(column.values))
            for value, valid in zip(column.values.tolist(), column.valid.tolist(), strict=True):
                self.value(normalise_value(value) if valid else None)

    def value(self, value: Any) -> None:
        """A Python scalar or tuple, tagged with its kind."""
        if value is None:
            self.u8(0)
        elif value is False or value is True:
            self.u8(2 if value else 1)
        elif isinstance(value, int):
            if -(2**63) <= value < 2**63:
                self.u8(3)
                self.i64(value)
            else:
                self.u8(4)
                self.blob(value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True))
        elif isinstance(value, float):
            self.u8(5)
            self._parts.append(_F64.pack(value))
        elif isinstance(value, str):
            self.u8(6)
            self.blob(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, tuple | list):
            self.u8(7 if isinstance(value, tuple) else 8)
            self.u32(len(value))
            for item in value:
                self.value(item)
        else:
            raise MetricStateError(f"cannot encode a value of type {type(value).__name__}")

    def finish(self) -> bytes:
        """The body written so far (framed by :data:`CODEC`)."""
        return b"".join(self._parts)


class StateReader:
    """Reads what :class:`StateWriter` wrote, raising MetricStateError on any inconsistency."""

    def __init__(self, body: memoryview, metric: str) -> None:
        self._metric = metric
        self._data = body
        self._at = 0

    @property
    def metric(self) -> str:
        """The name of the metric whose state this is, for error messages."""
        return self._metric

    def _take(self, n: int) -> int:
        """Move past ``n`` bytes; where they start."""
        at = self._at
        if at + n > len(self._data):
            raise MetricStateError(f"metric '{self._metric}': state bytes end too early")
        self._at = at + n
        return at

    def raw(self, n: int) -> bytes:
        at = self._take(n)
        return bytes(self._data[at : at + n])

    def u8(self) -> int:
        return self._data[self._take(1)]

    def unpack(self, layout: struct.Struct) -> tuple:
        """Fields written one by one (``u8``, ``u32``, ``i64``) that ``layout`` reads at once."""
        return layout.unpack_from(self._data, self._take(layout.size))

    def u32(self) -> int:
        return _U32.unpack_from(self._data, self._take(4))[0]

    def i64(self) -> int:
        return _I64.unpack_from(self._data, self._take(8))[0]

    def blob(self) -> bytes:
        return self.raw(self.u32())

    def array(self, expected: Any | None = None) -> np.ndarray:
        code = self.u8()
        dtype = _DTYPES.get(code)
        if dtype is None or (expected is not None and np.dtype(dtype) != np.dtype(expected)):
            raise MetricStateError(f"metric '{self._metric}': unexpected array type {code}")
        data = self.blob()
        if len(data) % np.dtype(dtype).itemsize:
            raise MetricStateError(f"metric '{self._metric}': ragged array bytes")
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)

    def column(self) -> ValueColumn:
        valid = self.array(np.bool_)
        if self.u8() == 0:
            values = self.array()
        else:
            values = np.empty(self.u32(), dtype=object)
            for i in range(len(values)):
                values[i] = self.value()
        if len(values) != len(valid):
            raise MetricStateError(f"metric '{self._metric}': column lengths differ")
        return ValueColumn(values, valid)

    def value(self) -> Any:
        tag = self.u8()
        if tag == 0:
            return None
        if tag in (1, 2):
            return tag == 2
        if tag == 3:
            return self.i64()
        if tag == 4:
            return int.from_bytes(self.blob(), "little", signed=True)
        if tag == 5:
            return _F64.unpack_from(self._data, self._take(8))[0]
        if tag == 6:
            return self.blob().decode("utf-8", "surrogatepass")
        if tag in (7, 8):
            items = [self.value() for _ in range(self.u32())]
            return tuple(items) if tag == 7 else items
        raise MetricStateError(f"metric '{self._metric}': unknown value tag {tag}")

    def done(self) -> None:
        if self._at != len(self._data):
            raise MetricStateError(f"metric '{self._metric}': trailing bytes after the state")
