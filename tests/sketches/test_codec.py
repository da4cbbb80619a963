"""The state frame codec: round trips, one clear error per failure mode, the byte layouts of
Vigil's six state formats, and sketch bytes pinned to those written before the codec existed."""

from __future__ import annotations

import hashlib
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sketches import (
    BloomFilter,
    CorruptSketchError,
    CountMinSketch,
    CountMinTopK,
    HyperLogLog,
    SketchError,
    StateCodec,
    TDigest,
    from_bytes,
)


class DemoStateError(ValueError):
    """A caller's own error class, as each state format has one."""


# The parameters that reproduce each state format's frame (see the writers named in the ids).
LAYOUTS = {
    "sketch": StateCodec(b"VGSK", 1, fields="BBB", length=True, checksum="crc32"),
    "rule state": StateCodec(
        b"VGRS",
        1,
        fields="8s",
        byte_order=">",
        checksum="crc32",
        checksum_at="header",
        compress_over=512,
    ),
    "key state": StateCodec(b"VGKS", 1, fields="qI"),
    "bucket state": StateCodec(b"VGBK", 4, fields="qIIQ"),
    "metric operator state": StateCodec(b"VGMO", 1, fields="32s", checksum="sha256-8"),
    "throttle state": StateCodec(b"VTHR", 1, byte_order=">"),
}
FIELDS = {
    "sketch": (3, 1, 0),
    "rule state": (b"\x01" * 8,),
    "key state": (-(2**63), 4),
    "bucket state": (1_700_000_000_000, 16, 2, 11),
    "metric operator state": (hashlib.sha256(b"metric").digest(),),
    "throttle state": (),
}


def _frame_as_written_before(name: str, body: bytes) -> bytes:
    """Each format's frame as its own writer built it before the codec, copied from them."""
    fields = FIELDS[name]
    if name == "sketch":
        framed = struct.pack("<4sBBBBI", b"VGSK", 1, *fields, len(body)) + body
        return framed + struct.pack("<I", zlib.crc32(framed))
    if name == "rule state":  # cep runtime: _encode
        flags = 0
        if len(body) > 512:
            body, flags = zlib.compress(body, 1), 1
        return struct.pack(">4sBB8sI", b"VGRS", 1, flags, *fields, zlib.crc32(body)) + body
    if name == "key state":  # cep processor: RuleProcessor.encode
        return struct.pack("<4sBqI", b"VGKS", 1, *fields) + body
    if name == "bucket state":  # spark_udf.bucket_state: BucketState.to_bytes
        return struct.pack("<4sBqIIQ", b"VGBK", 4, *fields) + body
    if name == "metric operator state":  # cep metrics: _Writer.finish
        framed = b"VGMO" + bytes([1]) + fields[0] + body
        return framed + hashlib.sha256(framed).digest()[:8]
    assert name == "throttle state"  # cep.alerts.throttle: Throttle.to_bytes
    return struct.pack(">4sB", b"VTHR", 1) + body


BODIES = [b"", b"x", b'{"a":1}', bytes(range(256)) * 3, b"vigil " * 200]


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("body", BODIES, ids=lambda body: f"{len(body)}B")
def test_each_state_format_keeps_its_bytes(name, body):
    codec = LAYOUTS[name]
    data = codec.encode(body, *FIELDS[name])
    assert data == _frame_as_written_before(name, body)
    fields, decoded = codec.decode(data)
    assert fields == FIELDS[name] and bytes(decoded) == body


@given(
    body=st.binary(max_size=2000),
    name=st.sampled_from(sorted(LAYOUTS)),
    as_type=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_round_trip(body, name, as_type):
    codec = LAYOUTS[name]
    data = codec.encode(as_type(body), *FIELDS[name])
    assert codec.encode(body, *FIELDS[name]) == data
    frame = codec.decode(as_type(data))
    assert frame.fields == FIELDS[name] and bytes(frame.body) == body


def test_compression_is_recorded_in_the_flags_byte():
    codec = LAYOUTS["rule state"]
    small, large = b"a" * 512, b"a" * 513
    assert codec.encode(small, b"f" * 8)[5] == 0
    data = codec.encode(large, b"f" * 8)
    assert data[5] == 1 and len(data) < len(large)
    assert bytes(codec.decode(data).body) == large


CODEC = StateCodec(
    b"DEMO",
    2,
    fields="q",
    length=True,
    checksum="crc32",
    compress_over=16,
    name="demo state",
    error=DemoStateError,
)
GOOD = CODEC.encode(b"the body of a demo state", 7)


def _with_byte(data: bytes, index: int, value: int) -> bytes:
    return data[:index] + bytes([value]) + data[index + 1 :]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("DEMO", "demo state must be bytes, got str"),
        (b"", r"demo state is truncated: 0 bytes is too short for its 22-byte frame \(magic "),
        (GOOD[:21], "is truncated: 21 bytes"),
        (b"XXXX" + GOOD[4:], "not a Vigil demo state: bad magic b'XXXX', it does not start with"),
        (
            _with_byte(GOOD, 4, 9),
            r"demo state format version 9 is not supported: this build reads format version 2 "
            r"\(magic b'DEMO'\); it was written by another version of Vigil",
        ),
        (GOOD[:-1], r"truncated or padded: its header says \d+ bytes, got \d+ \(magic b'DEMO', "),
        (GOOD + b"\0", "truncated or padded"),
        (_with_byte(GOOD, 20, GOOD[20] ^ 1), "truncated or corrupted: crc32 checksum mismatch"),
        (_with_byte(GOOD, 6, GOOD[6] ^ 1), "truncated or corrupted: crc32 checksum mismatch"),
    ],
)
def test_each_failure_gives_its_clear_error(data, message):
    with pytest.raises(DemoStateError, match=message):
        CODEC.decode(data)


def test_a_body_that_does_not_decompress():
    codec = StateCodec(b"DEMO", 2, compress_over=0, checksum="crc32", checksum_at="header")
    stored = b"not zlib data"
    data = struct.pack("<4sBBI", b"DEMO", 2, 1, zlib.crc32(stored)) + stored
    with pytest.raises(ValueError, match="is corrupted: its zlib body does not decompress"):
        codec.decode(data)


def test_zstd_bodies_are_flagged_and_either_compression_is_read():
    zstd = StateCodec(b"DEMO", 2, fields="q", compress_over=64, compressor="zstd",
                      checksum="crc32")
    zlib_codec = StateCodec(b"DEMO", 2, fields="q", compress_over=64, checksum="crc32")
    body = b"the same key state, again and again; " * 100
    data = zstd.encode(body, 3)
    assert data[5] == 2 and len(data) < len(zlib_codec.encode(body, 3)) < len(body)
    # The decompressed length is recorded before the zstd data (a u64).
    assert struct.unpack_from("<Q", data, 14)[0] == len(body)
    for reader in (zstd, zlib_codec):  # a reader takes either, whatever it writes
        assert reader.decode(data) == ((3,), body)
        assert reader.decode(zlib_codec.encode(body, 3)) == ((3,), body)
    assert zstd.encode(b"short", 3)[5] == 0
    # Its recorded length wrong, or its data cut: a clear error.
    plain = StateCodec(b"DEMO", 2, fields="q", compress_over=64, compressor="zstd")
    good = plain.encode(body, 3)
    for bad in (good[:14] + struct.pack("<Q", len(body) + 1) + good[22:],
                good[:14] + struct.pack("<Q", len(body)) + good[22:-5], good[:18]):
        with pytest.raises(ValueError, match="is corrupted: its zstd body does not decompress"):
            plain.decode(bad)


@pytest.mark.parametrize("name", ["rule state", "metric operator state"])
def test_checksums_cover_what_their_format_says(name):
    codec = LAYOUTS[name]
    data = codec.encode(b"payload", *FIELDS[name])
    body_start = len(data) - len(b"payload") - (8 if codec.checksum_at == "trailer" else 0)
    # A header field changed: only a trailer checksum (over header and body) notices.
    changed_header = _with_byte(data, 6, data[6] ^ 1)
    if codec.checksum_at == "trailer":
        with pytest.raises(ValueError, match="sha256-8 checksum mismatch"):
            codec.decode(changed_header)
    else:
        assert codec.decode(changed_header).fields != FIELDS[name]
    with pytest.raises(ValueError, match="checksum mismatch"):
        codec.decode(_with_byte(data, body_start, data[body_start] ^ 1))


def test_context_starts_the_message():
    with pytest.raises(DemoStateError, match=r"^rule 'r': demo state is truncated"):
        CODEC.decode(b"DEMO", context="rule 'r'")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"magic": b""}, "magic"),
        ({"magic": "VGSK"}, "magic"),
        ({"version": 256}, "version"),
        ({"byte_order": "!"}, "byte_order"),
        ({"checksum": "md5"}, "checksum"),
        ({"checksum_at": "middle"}, "checksum_at"),
        ({"compress_over": -1}, "compress_over"),
        ({"compressor": "lzma"}, "compressor"),
    ],
)
def test_invalid_parameters_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        StateCodec(**{"magic": b"DEMO", "version": 1, **arguments})


# ---------------------------------------------------------------- sketch bytes

# Written by sketches before it used the codec (commit ce21db5): the codec must not change them.
GOLDEN_HEX = {
    ("HyperLogLog", "empty"): (
        "5647534b01010100110000000400000000000000000000000000000000da313637"
    ),
    ("HyperLogLog", "full"): (
        "5647534b01010100110000000406000003000007010003010700010004cc80f162"
    ),
    ("BloomFilter", "empty"): (
        "5647534b010201002600000014000000000000009a9999999999b93f620000000000000003000000"
        "000000000000000000002e777e0c"
    ),
    ("BloomFilter", "full"): (
        "5647534b010201002600000014000000000000009a9999999999b93f620000000000000003183500"
        "64e39787053082520500236a4079"
    ),
    ("TDigest", "empty"): (
        "5647534b010300002000000000000000000034400000000000000000000000000000f07f00000000"
        "0000f0ff2ace323f"
    ),
    ("TDigest", "full"): (
        "5647534b01030000800000000000000000003440060000000000000000000000000008c000000000"
        "0000594000000000000008c0000000000000e03f000000000000f03f000000000000044000000000"
        "00001d40000000000000594001000000000000000100000000000000010000000000000001000000"
        "000000000100000000000000010000000000000015fc0b15"
    ),
    ("CountMinSketch", "empty"): (
        "5647534b010401009000000008000000020000000000000000000000000000000000000000000000"
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000000000aeea71f4"
    ),
    ("CountMinSketch", "full"): (
        "5647534b010401009000000008000000020000000e00000000000000020000000000000000000000"
        "00000000020000000000000003000000000000000100000000000000020000000000000003000000"
        "00000000010000000000000003000000000000000100000000000000010000000000000003000000"
        "000000000200000000000000010000000000000001000000000000000200000000000000f4b2b7a8"
    ),
    ("CountMinTopK", "empty"): (
        "5647534b010501009c00000003000000000000000000000008000000020000000000000000000000"
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "00000000000000003e4ad54b"
    ),
    ("CountMinTopK", "full"): (
        "5647534b01050100c900000003000000030000000000000008000000020000000e00000000000000"
        "02000000000000000000000000000000020000000000000003000000000000000100000000000000"
        "02000000000000000300000000000000010000000000000003000000000000000100000000000000"
        "01000000000000000300000000000000020000000000000001000000000000000100000000000000"
        "02000000000000003bc8d17cdbdba0020501000000616670dc60306ace0204000000000000f87fe9"
        "bab5d3b8df4c390301000000011953f1cf"
    ),
}


VALUES = ["a", "bb", "vigil", "x" * 20, "y" * 70, "z" * 200, 1, 2.5, -3, None, b"raw", True]
VALUES += [2**70, float("nan")]
FACTORIES = {
    "HyperLogLog": lambda: HyperLogLog(p=4),
    "BloomFilter": lambda: BloomFilter(capacity=20, error_rate=0.1),
    "TDigest": lambda: TDigest(compression=20),
    "CountMinSketch": lambda: CountMinSketch(width=8, depth=2),
    "CountMinTopK": lambda: CountMinTopK(k=3, width=8, depth=2),
}


@pytest.mark.parametrize(("kind", "which"), GOLDEN_HEX)
def test_sketch_bytes_are_unchanged(kind, which):
    sketch = FACTORIES[kind]()
    if which == "full":
        sketch.update([1.0, 2.5, -3.0, 7.25, 100.0, 0.5] if kind == "TDigest" else VALUES)
    expected = bytes.fromhex(GOLDEN_HEX[kind, which])
    assert sketch.to_bytes() == expected
    assert from_bytes(expected) == sketch


def test_sketch_frame_errors_are_corrupt_sketch_errors():
    data = HyperLogLog(p=4).to_bytes()
    for bad, message in [
        (42, "sketch must be bytes, got int"),
        (data[:15], "sketch is truncated"),
        (b"XXXX" + data[4:], "not a Vigil sketch: bad magic"),
        (_with_byte(data, 4, 2), "sketch format version 2 is not supported"),
        (data + b"\0", "sketch is truncated or padded"),
        (_with_byte(data, 20, data[20] ^ 1), "sketch is truncated or corrupted: crc32"),
    ]:
        with pytest.raises(CorruptSketchError, match=message) as caught:
            HyperLogLog.from_bytes(bad)
        assert isinstance(caught.value, SketchError) and isinstance(caught.value, ValueError)
