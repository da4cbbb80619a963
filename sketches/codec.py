"""The one frame every binary state format of Vigil is written in: a magic, a format version,
the caller's own header fields, and optionally a body length, a checksum and compression (zlib
or zstd).

Layout, in the codec's byte order (``<`` or ``>``)::

    magic                  len(magic) bytes
    format version         u8
    flags                  u8, only with ``compress_over``: bit 0 set when the body is zlib data,
                           bit 1 when it is a u64 length (decompressed) then zstd data
    fields                 the caller's header fields (a `struct` format such as ``"qI"``)
    body length            u32, only with ``length=True``: the length of the stored body
    checksum               with ``checksum_at="header"``: over the stored body only
    body                   the stored (maybe compressed) body
    checksum               with ``checksum_at="trailer"``: over every byte before it

``checksum`` is ``"crc32"`` (`zlib.crc32`, a u32) or ``"sha256-8"`` (the first 8 bytes of the
SHA-256 digest). These parameters express each state format Vigil has written so far, so
moving a format onto the codec leaves its bytes unchanged.

Errors are raised as the caller's own error class (``error=``): every state format already
has one in its package's hierarchy, and the codec, the lowest layer, must not import them.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, NoReturn

__all__ = ["Frame", "StateCodec"]

_FLAG_ZLIB = 1
_FLAG_ZSTD = 2
_ZLIB_LEVEL = 1
_ZSTD_SIZE = struct.Struct("<Q")


def _sha256_8(data: Any) -> bytes:
    return hashlib.sha256(data).digest()[:8]


# The struct code and the function of each checksum.
_CHECKSUMS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "crc32": ("I", zlib.crc32),
    "sha256-8": ("8s", _sha256_8),
}


class Frame(NamedTuple):
    """What :meth:`StateCodec.decode` read: the caller's header fields and the body."""

    fields: tuple[Any, ...]
    """The header fields, in the order of the codec's ``fields`` format."""
    body: memoryview
    """The body, decompressed if it was stored compressed (a view into the input otherwise)."""


_new_frame = tuple.__new__


@dataclass(frozen=True)
class StateCodec:
    """Frames a state body in a versioned, optionally checksummed and compressed header.

    Parameters
    ----------
    magic
        The bytes every frame starts with, e.g. ``b"VGSK"``.
    version
        The format version written, and the only one read (0 to 255).
    fields
        `struct` format codes (without a byte-order prefix) of the caller's header fields,
        which follow the version (and the flags byte).
    byte_order
        ``"<"`` (little-endian) or ``">"`` (big-endian), for every header number.
    length
        Whether the header records the stored body's length (a u32 after the fields); reading
        then refuses bytes of another length.
    checksum
        ``None``, ``"crc32"`` or ``"sha256-8"``.
    checksum_at
        ``"trailer"``: after the body, over the header and the body; ``"header"``: the last
        header field, over the stored body only.
    compress_over
        When set, a flags byte follows the version and bodies longer than this many bytes are
        stored compressed; the checksum covers the compressed bytes.
    compressor
        ``"zlib"`` (level 1) or ``"zstd"`` (Arrow's codec, for state rewritten whole at every
        micro-batch: on the W5 benchmark's buckets 5-8x faster than zlib and its output 6-9x
        smaller; zlib where this pyarrow has no zstd). Either is read whatever the setting.
    name
        What the bytes hold, for error messages (``"rule state"``).
    error
        The exception class (or any callable of a message) raised for bytes that cannot be
        read: not bytes, truncated, padded, another magic, another version, a checksum
        mismatch or a body that does not decompress.

    Examples
    --------
    >>> codec = StateCodec(b"DEMO", 2, fields="q", checksum="crc32", name="demo state")
    >>> data = codec.encode(b"body", -7)
    >>> data.hex(" ")
    '44 45 4d 4f 02 f9 ff ff ff ff ff ff ff 62 6f 64 79 1f 0f 24 f9'
    >>> fields, body = codec.decode(data)
    >>> fields, bytes(body)
    ((-7,), b'body')
    >>> try:
    ...     codec.decode(data[:4] + b"\\x01" + data[5:])
    ... except ValueError as error:
    ...     print(error)  # doctest: +NORMALIZE_WHITESPACE
    demo state format version 1 is not supported: this build reads format version 2
    (magic b'DEMO'); it was written by another version of Vigil, start from fresh state
    (a new checkpoint)
    """

    magic: bytes
    version: int
    fields: str = ""
    byte_order: Literal["<", ">"] = "<"
    length: bool = False
    checksum: Literal["crc32", "sha256-8"] | None = None
    checksum_at: Literal["header", "trailer"] = "trailer"
    compress_over: int | None = None
    compressor: Literal["zlib", "zstd"] = "zlib"
    name: str = "state"
    error: Callable[[str], Exception] = ValueError
    _header: struct.Struct = field(init=False, repr=False, compare=False)
    _trailer: struct.Struct = field(init=False, repr=False, compare=False)
    _fields: slice = field(init=False, repr=False, compare=False)
    _digest: Callable[[Any], Any] | None = field(init=False, repr=False, compare=False)
    _label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.magic, bytes) or not self.magic:
            raise ValueError(f"magic must be non-empty bytes, got {self.magic!r}")
        if not 0 <= self.version <= 255:
            raise ValueError(f"version must be in [0, 255], got {self.version}")
        if self.byte_order not in ("<", ">"):
            raise ValueError(f"byte_order must be '<' or '>', got {self.byte_order!r}")
        if self.checksum is not None and self.checksum not in _CHECKSUMS:
            raise ValueError(f"checksum must be None, 'crc32' or 'sha256-8', got {self.checksum!r}")
        if self.checksum_at not in ("header", "trailer"):
            raise ValueError(f"checksum_at must be 'header' or 'trailer', got {self.checksum_at!r}")
        if self.compress_over is not None and self.compress_over < 0:
            raise ValueError(f"compress_over must be >= 0, got {self.compress_over}")
        if self.compressor not in ("zlib", "zstd"):
            raise ValueError(f"compressor must be 'zlib' or 'zstd', got {self.compressor!r}")
        code, digest = _CHECKSUMS[self.checksum] if self.checksum else ("", None)
        in_header = code if self.checksum_at == "header" else ""
        in_trailer = code if self.checksum_at == "trailer" else ""
        first = 3 if self.compress_over is not None else 2
        own = struct.Struct(self.byte_order + self.fields)
        count = len(own.unpack(bytes(own.size)))
        header = (
            f"{self.byte_order}{len(self.magic)}sB"
            + ("B" if self.compress_over is not None else "")
            + self.fields
            + ("I" if self.length else "")
            + in_header
        )
        set_ = object.__setattr__
        set_(self, "_header", struct.Struct(header))
        set_(self, "_trailer", struct.Struct(f"{self.byte_order}{in_trailer}"))
        set_(self, "_fields", slice(first, first + count))
        set_(self, "_digest", digest)
        set_(self, "_label", f"magic {self.magic!r}, format version {self.version}")

    def encode(self, body: bytes | bytearray | memoryview, *fields: Any) -> bytes:
        """Frame ``body`` with the header fields ``fields``.

        Examples
        --------
        >>> StateCodec(b"VTHR", 1).encode(b"{}")
        b'VTHR\\x01{}'
        """
        stored = body
        if self.compress_over is None:
            head = (self.magic, self.version, *fields)
        else:
            flags = 0
            if len(body) > self.compress_over:
                stored, flags = _compress(body, self.compressor)
            head = (self.magic, self.version, flags, *fields)
        if self.length:
            head = (*head, len(stored))
        digest = self._digest
        if digest is None:
            return self._header.pack(*head) + stored
        if self.checksum_at == "header":
            return self._header.pack(*head, digest(stored)) + stored
        framed = self._header.pack(*head) + stored
        return framed + self._trailer.pack(digest(framed))

    def decode(self, data: bytes | bytearray | memoryview, *, context: str = "") -> Frame:
        """Check the frame of ``data`` and return its header fields and body.

        ``context`` (e.g. ``"rule 'r'"``) starts every error message. Raises ``error`` naming
        the magic, the format version and what is wrong.

        Examples
        --------
        >>> codec = StateCodec(b"VGKS", 1, fields="qI", name="key state")
        >>> frame = codec.decode(codec.encode(b"...", 5, 2))
        >>> frame.fields, bytes(frame.body)
        ((5, 2), b'...')
        >>> try:
        ...     codec.decode(b"VGKS", context="key ['c1']")
        ... except ValueError as error:
        ...     print(error)  # doctest: +NORMALIZE_WHITESPACE
        key ['c1']: key state is truncated: 4 bytes is too short for its 17-byte frame
        (magic b'VGKS', format version 1)
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            self._fail(context, f"{self.name} must be bytes, got {type(data).__name__}")
        view = memoryview(data).cast("B")
        header, trailer = self._header, self._trailer
        size = len(view)
        if size < header.size + trailer.size:
            self._fail(
                context,
                f"{self.name} is truncated: {size} bytes is too short for its "
                f"{header.size + trailer.size}-byte frame ({self._label})",
            )
        head = header.unpack_from(view)
        if head[0] != self.magic:
            self._fail(
                context,
                f"not a Vigil {self.name}: bad magic {head[0]!r}, it does not start with "
                f"{self.magic!r}",
            )
        if head[1] != self.version:
            self._fail(
                context,
                f"{self.name} format version {head[1]} is not supported: this build reads format "
                f"version {self.version} (magic {self.magic!r}); it was written by another "
                "version of Vigil, start from fresh state (a new checkpoint)",
            )
        end = size - trailer.size
        if self.length and header.size + head[self._fields.stop] != end:
            self._fail(
                context,
                f"{self.name} is truncated or padded: its header says "
                f"{header.size + head[self._fields.stop] + trailer.size} bytes, got {size} "
                f"({self._label})",
            )
        body = view[header.size : end]
        digest = self._digest
        if digest is not None:
            if self.checksum_at == "header":
                valid = digest(body) == head[-1]
            else:
                valid = digest(view[:end]) == trailer.unpack_from(view, end)[0]
            if not valid:
                self._fail(
                    context,
                    f"{self.name} is truncated or corrupted: {self.checksum} checksum mismatch "
                    f"({self._label})",
                )
        if self.compress_over is not None and head[2] & (_FLAG_ZLIB | _FLAG_ZSTD):
            kind = "zlib" if head[2] & _FLAG_ZLIB else "zstd"
            try:
                body = memoryview(_decompress(body, kind))
            except (zlib.error, ValueError, ImportError) as exc:
                self._fail(
                    context,
                    f"{self.name} is corrupted: its {kind} body does not decompress ({exc}; "
                    f"{self._label})",
                )
        # tuple.__new__ skips the NamedTuple's Python-level __new__: a third of a small decode.
        return _new_frame(Frame, (head[self._fields], body))

    def _fail(self, context: str, message: str) -> NoReturn:
        raise self.error(f"{context}: {message}" if context else message)


def _compress(body: bytes | bytearray | memoryview, compressor: str) -> tuple[bytes, int]:
    """The stored body and its flag: zstd (its decompressed length first) when asked for and
    this pyarrow has it, else zlib."""
    if compressor == "zstd":
        import pyarrow as pa  # only here: the codec's other formats do without it

        if pa.Codec.is_available("zstd"):
            packed = pa.compress(body, codec="zstd", asbytes=True)
            return _ZSTD_SIZE.pack(len(body)) + packed, _FLAG_ZSTD
    return zlib.compress(body, _ZLIB_LEVEL), _FLAG_ZLIB


def _decompress(stored: memoryview, kind: str) -> bytes:
    if kind == "zlib":
        return zlib.decompress(stored)
    import pyarrow as pa

    if len(stored) < _ZSTD_SIZE.size:
        raise ValueError("no room for its length")
    (size,) = _ZSTD_SIZE.unpack_from(stored)
    try:
        out = pa.decompress(stored[_ZSTD_SIZE.size:], size, codec="zstd", asbytes=True)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(str(exc)) from None
    if len(out) != size:
        raise ValueError(f"{len(out)} bytes where {size} were recorded")
    return out
