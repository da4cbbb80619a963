"""The interface every sketch implements, the framed byte format they all serialise to, and
`from_bytes`, which reads any sketch back by the kind recorded in its header.

Byte layout (little-endian)::

    offset  size  field
    0       4     magic b"VGSK"
    4       1     format version (1)
    5       1     sketch kind (see ``Sketch.kind``)
    6       1     hash function id (``sketches.hashing.HASH_ID``; 0 for sketches that do not hash)
    7       1     reserved, 0
    8       4     body length n
    12      n     body: the kind's parameters, then its state
    12+n    4     CRC-32 of bytes [0, 12+n)

that is, a `sketches.codec.StateCodec` frame with three header fields (kind, hash function id,
reserved), a body length and a CRC-32 trailer.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np

from sketches.codec import StateCodec
from sketches.errors import CorruptSketchError, IncompatibleSketchError

__all__ = ["FORMAT_VERSION", "MAGIC", "Sketch", "from_bytes"]

MAGIC = b"VGSK"
FORMAT_VERSION = 1
_CODEC = StateCodec(
    MAGIC,
    FORMAT_VERSION,
    fields="BBB",
    length=True,
    checksum="crc32",
    name="sketch",
    error=CorruptSketchError,
)
_SKETCH_KINDS: dict[int, type[Sketch]] = {}


class Sketch(ABC):
    """A mergeable, serialisable summary of a stream of values.

    Subclasses declare ``kind`` (a header code unique to the class) and ``hash_id`` (the hash
    function their state depends on, 0 if none) and implement the abstract methods.
    ``update`` takes one value or a whole array / Series / list; ``merge`` combines another
    sketch of the same kind and parameters into this one. Equality is equality of the
    serialised state, so two sketches are equal exactly when their bytes are.
    """

    kind: ClassVar[int]
    hash_id: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind is not None:
            if kind in _SKETCH_KINDS:
                raise TypeError(f"sketch kind {kind} is already used by {_SKETCH_KINDS[kind]}")
            _SKETCH_KINDS[kind] = cls

    @abstractmethod
    def update(self, values: Any) -> Self:
        """Add one value or a collection of values; returns ``self``."""

    @abstractmethod
    def merge(self, other: Self) -> Self:
        """Fold ``other`` into this sketch in place; returns ``self``.

        Raises :class:`~sketches.errors.IncompatibleSketchError` if ``other`` has another kind,
        other parameters or another hash function.
        """

    @abstractmethod
    def _parameters(self) -> tuple[Any, ...]:
        """The parameters that must be equal for two sketches to merge."""

    @abstractmethod
    def _body(self) -> bytes:
        """The serialised parameters and state, without the frame."""

    @classmethod
    @abstractmethod
    def _from_body(cls, body: memoryview) -> Self:
        """Rebuild a sketch from ``_body``'s output; raises CorruptSketchError if malformed."""

    @property
    @abstractmethod
    def is_empty(self) -> bool:
        """Whether no value has been added (a fresh sketch is empty)."""

    def to_bytes(self) -> bytes:
        """Serialise to the framed, checksummed byte format described in `sketches.base`."""
        return _CODEC.encode(self._body(), self.kind, self.hash_id, 0)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Self:
        """Read a sketch of this class from ``to_bytes`` output.

        Raises :class:`~sketches.errors.CorruptSketchError` if the bytes are truncated,
        corrupted, of another format version or hold another kind of sketch.
        """
        kind, hash_id, body = _unframe(data)
        if kind != cls.kind:
            other = _SKETCH_KINDS.get(kind)
            name = other.__name__ if other is not None else f"unknown kind {kind}"
            raise CorruptSketchError(f"bytes hold a {name}, not a {cls.__name__}")
        if hash_id != cls.hash_id:
            raise CorruptSketchError(
                f"bytes were written with hash function id {hash_id}; this version of "
                f"{cls.__name__} uses id {cls.hash_id}"
            )
        return cls._from_body(body)

    def copy(self) -> Self:
        """Return an independent sketch with the same state."""
        return type(self)._from_body(memoryview(self._body()))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._body() == other._body()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle (e.g. between Spark executors) through the checked, versioned byte format.
        return (from_bytes, (self.to_bytes(),))

    def _check_mergeable(self, other: object) -> None:
        if type(other) is not type(self):
            raise IncompatibleSketchError(
                f"cannot merge a {type(other).__name__} into a {type(self).__name__}"
            )
        if other.hash_id != self.hash_id:
            raise IncompatibleSketchError(
                f"cannot merge sketches built with hash functions {other.hash_id} and "
                f"{self.hash_id}"
            )
        if other._parameters() != self._parameters():
            raise IncompatibleSketchError(
                f"cannot merge {type(self).__name__} with parameters {other._parameters()} into "
                f"one with parameters {self._parameters()}"
            )


def _unframe(data: bytes | bytearray | memoryview) -> tuple[int, int, memoryview]:
    (kind, hash_id, _reserved), body = _CODEC.decode(data)
    return kind, hash_id, body


def from_bytes(data: bytes | bytearray | memoryview) -> Sketch:
    """Read any sketch from ``to_bytes`` output, dispatching on the kind in its header.

    Raises
    ------
    CorruptSketchError
        If the bytes are truncated, corrupted or hold an unknown kind of sketch.

    Examples
    --------
    >>> from sketches import HyperLogLog
    >>> hll = HyperLogLog(p=10).update(["a", "b", "c"])
    >>> from_bytes(hll.to_bytes()) == hll
    True
    """
    kind, _hash_id, _body = _unframe(data)
    cls = _SKETCH_KINDS.get(kind)
    if cls is None:
        raise CorruptSketchError(f"unknown sketch kind {kind}")
    return cls.from_bytes(data)


def is_integer(value: Any) -> bool:
    """Whether ``value`` is a Python or numpy integer, and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def read_exact(body: memoryview, layout: struct.Struct, offset: int, what: str) -> tuple[Any, ...]:
    """Unpack ``layout`` at ``offset`` of a body, raising CorruptSketchError if it is short."""
    if offset + layout.size > len(body):
        raise CorruptSketchError(f"sketch body truncated while reading {what}")
    return layout.unpack_from(body, offset)
