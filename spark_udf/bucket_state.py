"""The state of one hash bucket: every partition key's opaque state bytes and due time, stored
as one versioned binary value.

A bucket holds many keys so Spark calls Python once per bucket, not once per key. The keys are
packed into one value (one state-store read and one write per bucket and micro-batch) because a
per-key ``MapState`` costs two JVM round trips per key, measured at ~0.5 ms per key on this stack
(see ``docs/spark.md``).

A bucket with many keys (a table's rows, say) changes only a few of them per micro-batch, so the
value is laid out for reading and writing whole: the keys' lengths and due times as arrays, the
keys as one text, the states one after another. Reading it builds no object per key (a key's
slot is made when asked for), and writing it back copies the untouched keys' states as runs of
bytes; what changed is kept beside them until then.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np

from sketches.codec import StateCodec
from spark_udf.errors import BucketStateError

__all__ = ["NO_TIME", "BucketState", "KeySlot"]

NO_TIME = -(2**63)
"""Stored in place of a missing time (no timer due, no timer registered)."""

# Version 2: JSON rows are bucketed by a hash of their key computed in Python
# (spark_udf.routing), so a version-1 checkpoint's keys would sit in other buckets.
# Version 3: the header records the number of buckets the keys were hashed into.
# Version 4: the entries laid out as arrays (state lengths, due times), the keys' text, then
# the states, so that a bucket is read and written without a step per key.
# Version 5: the same body, zstd-compressed above 1 KiB. A bucket is written whole at every
# micro-batch that touches it, and its keys' states repeat one another (the same rule lists,
# member names and event fields): on the W5 benchmark's 1,000 rules, ~3.6 MB a bucket became
# ~55 kB, for ~1 ms of compression, and the state store moves that instead.
_FORMAT_VERSION = 5
_CODEC = StateCodec(b"VGBK", _FORMAT_VERSION, fields="qIIQ", compress_over=1024,
                    compressor="zstd", name="bucket state", error=BucketStateError)
"""Magic, format version, a flags byte (how the body is compressed), registered timer, bucket
count, key count and the keys' text length in bytes; then the body: the state lengths (u32
each), the due times (i64 each), the keys' UTF-8 text (one line per key: a key is JSON text or
a name of the operator's, neither holds a line break) and the states."""
_CODEC_V4 = StateCodec(b"VGBK", 4, fields="qIIQ", name="bucket state", error=BucketStateError)
"""Format 4 (no flags byte, never compressed): still read, so a checkpoint written by it
continues; every bucket is written back in format 5."""
_NO_STATE = 0xFFFFFFFF
_LENGTHS = np.dtype("<u4")
_DUES = np.dtype("<i8")


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


class _Stored:
    """The keys of a bucket as read: their text, state lengths, due times and states, looked
    up by position; nothing per key is built until asked for."""

    __slots__ = ("names", "index", "lengths", "dues", "starts", "states")

    def __init__(self, names: list[str], lengths: np.ndarray, dues: np.ndarray,
                 states: memoryview) -> None:
        self.names = names
        self.index = dict(zip(names, range(len(names)), strict=True))
        self.lengths = lengths
        self.dues = dues
        sizes = np.where(lengths == _NO_STATE, 0, lengths).astype(np.int64)
        self.starts = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.starts[1:])
        self.states = states

    def slot(self, position: int) -> KeySlot:
        due = int(self.dues[position])
        if self.lengths[position] == _NO_STATE:
            state = None
        else:
            state = bytes(self.states[self.starts[position]:self.starts[position + 1]])
        return KeySlot(state, None if due == NO_TIME else due)


class _Slots(Mapping[str, KeySlot]):
    """``BucketState.keys``: the stored keys, with the ones set since they were read (a
    ``None`` there: the key is gone) in front of them."""

    __slots__ = ("_stored", "_changed")

    def __init__(self, stored: _Stored | None, changed: dict[str, KeySlot | None]) -> None:
        self._stored = stored
        self._changed = changed

    def __getitem__(self, key: str) -> KeySlot:
        if key in self._changed:
            slot = self._changed[key]
            if slot is None:
                raise KeyError(key)
            return slot
        if self._stored is not None:
            position = self._stored.index.get(key)
            if position is not None:
                return self._stored.slot(position)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        if key in self._changed:
            return self._changed[key] is not None  # type: ignore[index]
        return self._stored is not None and key in self._stored.index

    def __iter__(self) -> Iterator[str]:
        changed = self._changed
        if self._stored is not None:
            for name in self._stored.names:
                if name not in changed:
                    yield name
        for name, slot in changed.items():
            if slot is not None:
                yield name

    def __len__(self) -> int:
        stored = 0 if self._stored is None else len(self._stored.names)
        present = sum(1 for slot in self._changed.values() if slot is not None)
        return stored - len(self.overridden()) + present

    def overridden(self) -> list[int]:
        """Positions of the stored keys set since they were read (changed or gone)."""
        stored = self._stored
        if stored is None:
            return []
        return [stored.index[name] for name in self._changed if name in stored.index]

    def set(self, key: str, slot: KeySlot | None) -> None:
        if slot is None and not (self._stored is not None and key in self._stored.index):
            self._changed.pop(key, None)
        else:
            self._changed[key] = slot


class BucketState:
    """Every key of one bucket, plus the single Spark timer the bucket has registered.

    Parameters
    ----------
    keys:
        Canonical JSON text of the key -> its slot (available as :attr:`keys`, a mapping).
    registered_ms:
        The event-time timer currently registered with Spark for the bucket (the earliest
        ``due_ms``), or ``None``.
    buckets:
        How many buckets per processor the keys were hashed into (``None``: not recorded). A
        key's bucket depends on it, so a checkpoint only continues with the same count.
    """

    __slots__ = ("_slots", "registered_ms", "buckets")

    def __init__(
        self,
        keys: Mapping[str, KeySlot] | None = None,
        registered_ms: int | None = None,
        buckets: int | None = None,
        *,
        _stored: _Stored | None = None,
    ) -> None:
        self._slots = _Slots(_stored, dict(keys or {}))
        self.registered_ms = registered_ms
        self.buckets = buckets

    @property
    def keys(self) -> Mapping[str, KeySlot]:
        """Every key's slot (read-only: change a key with :meth:`set`)."""
        return self._slots

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BucketState):
            return NotImplemented
        return (self.registered_ms, self.buckets, dict(self.keys.items())) == (
            other.registered_ms, other.buckets, dict(other.keys.items())
        )

    def __repr__(self) -> str:
        return (f"BucketState({len(self.keys)} keys, registered_ms={self.registered_ms}, "
                f"buckets={self.buckets})")

    def earliest_due(self) -> int | None:
        """The smallest ``due_ms`` over the bucket's keys."""
        slots = self._slots
        stored = slots._stored
        dues = [slot.due_ms for slot in slots._changed.values()
                if slot is not None and slot.due_ms is not None]
        if stored is not None and len(stored.names):
            times = stored.dues
            overridden = slots.overridden()
            if overridden:
                times = times.copy()
                times[overridden] = NO_TIME
            times = times[times != NO_TIME]
            if len(times):
                dues.append(int(times.min()))
        return min(dues) if dues else None

    def due(self, watermark_ms: int) -> list[tuple[str, KeySlot]]:
        """The keys whose ``due_ms`` is at or behind ``watermark_ms``, with their slots, without
        looking at the others one by one."""
        slots = self._slots
        stored = slots._stored
        out: list[tuple[str, KeySlot]] = []
        if stored is not None and len(stored.names):
            times = stored.dues
            for position in np.flatnonzero((times != NO_TIME) & (times <= watermark_ms)).tolist():
                name = stored.names[position]
                if name not in slots._changed:
                    out.append((name, stored.slot(position)))
        out.extend(
            (name, slot) for name, slot in slots._changed.items()
            if slot is not None and slot.due_ms is not None and slot.due_ms <= watermark_ms
        )
        return out

    def set(self, key: str, state: bytes | None, due_ms: int | None) -> None:
        """Store a key's new state and due time; forget the key when both are empty."""
        self._slots.set(key, None if state is None and due_ms is None else KeySlot(state, due_ms))

    def to_bytes(self) -> bytes:
        """Serialise: magic, format version, registered timer, bucket count, key count, the
        keys' text length, then the arrays, the keys' text and the states (see ``_CODEC``).

        Examples
        --------
        >>> b = BucketState({'["c1"]': KeySlot(b"s", 10)}, registered_ms=10, buckets=16)
        >>> BucketState.from_bytes(b.to_bytes(), buckets=16) == b
        True
        """
        slots = self._slots
        stored = slots._stored
        changed = [(name, slot) for name, slot in slots._changed.items() if slot is not None]
        names: list[str] = []
        lengths: list[np.ndarray] = []
        dues: list[np.ndarray] = []
        states: list[Any] = []
        if stored is not None and len(stored.names):
            keep = np.ones(len(stored.names), dtype=bool)
            keep[slots.overridden()] = False
            names.extend(compress(stored.names, keep.tolist()))
            lengths.append(stored.lengths[keep])
            dues.append(stored.dues[keep])
            # The kept states as runs of bytes: one copy per run between changed keys.
            edges = np.flatnonzero(np.diff(np.concatenate(([0], keep.view(np.int8), [0]))))
            for first, end in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                states.append(stored.states[stored.starts[first]:stored.starts[end]])
        names.extend(name for name, _ in changed)
        lengths.append(np.array(
            [_NO_STATE if slot.state is None else len(slot.state) for _, slot in changed],
            dtype=_LENGTHS,
        ))
        dues.append(np.array(
            [NO_TIME if slot.due_ms is None else slot.due_ms for _, slot in changed],
            dtype=_DUES,
        ))
        states.extend(slot.state for _, slot in changed if slot.state is not None)
        text = "\n".join(names).encode("utf-8")
        if names and text.count(b"\n") != len(names) - 1:
            raise BucketStateError("a bucket's key holds a line break; keys are JSON text")
        body = b"".join([
            np.concatenate(lengths).astype(_LENGTHS).tobytes(),
            np.concatenate(dues).astype(_DUES).tobytes(),
            text,
            *states,
        ])
        registered = NO_TIME if self.registered_ms is None else self.registered_ms
        return _CODEC.encode(body, registered, self.buckets or 0, len(names), len(text))

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
        codec = _CODEC_V4 if bytes(data[4:5]) == b"\x04" else _CODEC
        (registered, stored_buckets, count, text_size), view = codec.decode(data)
        if buckets is not None and stored_buckets and stored_buckets != buckets:
            raise BucketStateError(
                f"the checkpoint's state was hashed into {stored_buckets} buckets per processor, "
                f"this query uses {buckets}: run it with buckets={stored_buckets} "
                f"(vigil run --buckets {stored_buckets}) or start from a new checkpoint directory"
            )
        view = memoryview(view)
        arrays = count * (_LENGTHS.itemsize + _DUES.itemsize)
        if arrays + text_size > len(view):
            raise BucketStateError(f"bucket state truncated: {count} keys announced")
        lengths = np.frombuffer(view, dtype=_LENGTHS, count=count)
        dues = np.frombuffer(view, dtype=_DUES, count=count, offset=count * _LENGTHS.itemsize)
        try:
            text = bytes(view[arrays:arrays + text_size]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BucketStateError(f"corrupted key in bucket state: {exc}") from None
        names = text.split("\n") if count else []
        if len(names) != count:
            raise BucketStateError(
                f"corrupted bucket state: {len(names)} keys where {count} are announced"
            )
        states = view[arrays + text_size:]
        size = int(np.where(lengths == _NO_STATE, 0, lengths).sum(dtype=np.int64))
        if size > len(states):
            raise BucketStateError(f"bucket state truncated in the states of its {count} keys")
        if size < len(states):
            raise BucketStateError(
                f"bucket state has {len(states) - size} unexpected trailing bytes"
            )
        stored = _Stored(names, lengths, dues, states)
        if len(stored.index) != count:
            raise BucketStateError("corrupted bucket state: a key is stored twice")
        return cls(None, None if registered == NO_TIME else registered,
                   stored_buckets or buckets, _stored=stored)
