"""The state of one hash bucket: every partition key's opaque state bytes and due time, stored
as one versioned binary value.

A bucket holds many keys so Spark calls Python once per bucket, not once per key. The keys are
packed into one value (one state-store read and one write per bucket and micro-batch) because a
per-key ``MapState`` costs two JVM round trips per key, measured at ~0.5 ms per key on this stack
(see ``docs/spark.md``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from sketches.codec import StateCodec
from spark_udf.errors import BucketStateError

__all__ = ["NO_TIME", "BucketState", "KeySlot"]

NO_TIME = -(2**63)
"""Stored in place of a missing time (no timer due, no timer registered)."""

# Version 2: JSON rows are bucketed by a hash of their key computed in Python
# (spark_udf.routing), so a version-1 checkpoint's keys would sit in other buckets.
# Version 3: the header records the number of buckets the keys were hashed into.
_FORMAT_VERSION = 3
_CODEC = StateCodec(b"VGBK", _FORMAT_VERSION, fields="qII", name="bucket state",
                    error=BucketStateError)
"""Magic, format version, registered timer, bucket count and key count, then the entries."""
_ENTRY = struct.Struct("<IIq")
_NO_STATE = 0xFFFFFFFF


@dataclass
class KeySlot:
    """One key's slot in a bucket.

    Attributes
    ----------
    state:
        The processor's state bytes for the key (``None`` when it keeps nothing but a timer).
    due_ms:
        The earliest event time at which the key must be woken (``on_timer``), or ``None``.
    """

    state: bytes | None = None
    due_ms: int | None = None


@dataclass
class BucketState:
    """Every key of one bucket, plus the single Spark timer the bucket has registered.

    Attributes
    ----------
    keys:
        Canonical JSON text of the key -> its slot.
    registered_ms:
        The event-time timer currently registered with Spark for the bucket (the earliest
        ``due_ms``), or ``None``.
    buckets:
        How many buckets per processor the keys were hashed into (``None``: not recorded). A
        key's bucket depends on it, so a checkpoint only continues with the same count.
    """

    keys: dict[str, KeySlot] = field(default_factory=dict)
    registered_ms: int | None = None
    buckets: int | None = None

    def earliest_due(self) -> int | None:
        """The smallest ``due_ms`` over the bucket's keys."""
        dues = [slot.due_ms for slot in self.keys.values() if slot.due_ms is not None]
        return min(dues) if dues else None

    def set(self, key: str, state: bytes | None, due_ms: int | None) -> None:
        """Store a key's new state and due time; forget the key when both are empty."""
        if state is None and due_ms is None:
            self.keys.pop(key, None)
        else:
            self.keys[key] = KeySlot(state, due_ms)

    def to_bytes(self) -> bytes:
        """Serialise: magic, format version, registered timer, bucket count, then one entry
        per key.

        Examples
        --------
        >>> b = BucketState({'["c1"]': KeySlot(b"s", 10)}, registered_ms=10, buckets=16)
        >>> BucketState.from_bytes(b.to_bytes(), buckets=16) == b
        True
        """
        registered = NO_TIME if self.registered_ms is None else self.registered_ms
        parts = []
        for key, slot in self.keys.items():
            encoded = key.encode("utf-8")
            state = slot.state
            due = NO_TIME if slot.due_ms is None else slot.due_ms
            parts.append(_ENTRY.pack(len(encoded), _NO_STATE if state is None else len(state), due))
            parts.append(encoded)
            if state is not None:
                parts.append(state)
        return _CODEC.encode(b"".join(parts), registered, self.buckets or 0, len(self.keys))

    @classmethod
    def from_bytes(cls, data: bytes | None, buckets: int | None = None) -> BucketState:
        """Inverse of :meth:`to_bytes`; ``None`` or empty bytes give an empty bucket.

        ``buckets`` is the query's number of buckets per processor: the stored bucket must
        have been hashed with the same (the result records it either way).

        Raises
        ------
        BucketStateError
            When the bytes are truncated, have trailing garbage or an unknown magic/version, or
            were written with another number of buckets.
        """
        if not data:
            return cls(buckets=buckets)
        (registered, stored_buckets, count), view = _CODEC.decode(data)
        if buckets is not None and stored_buckets and stored_buckets != buckets:
            raise BucketStateError(
                f"the checkpoint's state was hashed into {stored_buckets} buckets per processor, "
                f"this query uses {buckets}: run it with buckets={stored_buckets} "
                f"(vigil run --buckets {stored_buckets}) or start from a new checkpoint directory"
            )
        offset = 0
        keys: dict[str, KeySlot] = {}
        try:
            for index in range(count):
                key_len, state_len, due = _ENTRY.unpack_from(view, offset)
                offset += _ENTRY.size
                end = offset + key_len
                if end > len(view):
                    raise BucketStateError(f"bucket state truncated in key #{index}")
                key = bytes(view[offset:end]).decode("utf-8")
                offset = end
                state = None
                if state_len != _NO_STATE:
                    end = offset + state_len
                    if end > len(view):
                        raise BucketStateError(f"bucket state truncated in the state of {key}")
                    state = bytes(view[offset:end])
                    offset = end
                keys[key] = KeySlot(state, None if due == NO_TIME else due)
        except struct.error:
            raise BucketStateError(f"bucket state truncated after {len(keys)} keys") from None
        except UnicodeDecodeError as exc:
            raise BucketStateError(f"corrupted key in bucket state: {exc}") from None
        if offset != len(view):
            raise BucketStateError(
                f"bucket state has {len(view) - offset} unexpected trailing bytes"
            )
        return cls(
            keys, None if registered == NO_TIME else registered, stored_buckets or buckets
        )
