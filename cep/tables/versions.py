"""One table's rows by key, each key's versions in event-time order: what ``lookup`` reads as
of an event's time, compacted behind the watermark, and saved as bytes.

A version is ``(ts, seq, row)``: the change's event time, its arrival order (which breaks ties
between changes of equal time: the later one wins) and the row (a tuple of the table's fields,
``None`` for a delete). ``as_of(key, t)`` is the row of the newest version with time ≤ ``t``.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cep.errors import CheckpointError
from cep.events.identity import plain_json

__all__ = ["VersionedTable", "decode_versions", "encode_versions"]

_STATE_FORMAT = 1


class VersionedTable:
    """The versions of one table's rows by key.

    Parameters
    ----------
    name:
        The table's name (for messages).
    fields:
        The fields of a row, in the order rows hold them.

    Examples
    --------
    >>> cards = VersionedTable("cards", ("card_id", "country"))
    >>> cards.apply(("c1",), 1_000, 0, ("c1", "FR"))
    >>> cards.apply(("c1",), 5_000, 1, ("c1", "DE"))
    >>> cards.apply(("c1",), 9_000, 2, None)
    >>> [cards.as_of(("c1",), t) for t in (999, 1_000, 7_000, 9_000)]
    [None, ('c1', 'FR'), ('c1', 'DE'), None]
    >>> cards.compact(7_000)   # nothing will be read before 7 s: one version stands for them
    >>> cards.versions(("c1",))
    [(5000, 1, ('c1', 'DE')), (9000, 2, None)]
    """

    __slots__ = ("name", "fields", "_positions", "_rows", "_busy", "_fetch", "_fetched",
                 "_dirty")

    def __init__(self, name: str, fields: Sequence[str]) -> None:
        self.name = name
        self.fields = tuple(fields)
        self._positions = {f: i for i, f in enumerate(self.fields)}
        # key -> (ts, seq, row) when the key has one version, else a list of them in order
        self._rows: dict[tuple, Any] = {}
        # keys holding more than one version or a delete: what compaction visits
        self._busy: set[tuple] = set()
        # bound to a store of keys (bind): how a key not held is read, keys read, keys changed
        self._fetch: Callable[[tuple], bytes | None] | None = None
        self._fetched: set[tuple] = set()
        self._dirty: set[tuple] = set()

    def __len__(self) -> int:
        """Keys with at least one version (a deleted key counts until compaction drops it)."""
        return len(self._rows)

    def position(self, field: str) -> int:
        """Where ``field`` sits in a row."""
        return self._positions[field]

    def apply(self, key: tuple, ts: int, seq: int, row: tuple | None) -> None:
        """Record a change: ``row`` from ``ts`` on (``None``: the key deleted from ``ts``)."""
        version = (ts, seq, row)
        held = self._held(key)
        if self._fetch is not None:
            self._dirty.add(key)
        if held is None:
            if row is not None:
                self._rows[key] = version
                return
            # A delete of a key without a row still stands: an older change may come after it.
            held = self._rows[key] = []
        if type(held) is tuple:
            versions = [held]
            self._rows[key] = versions
        else:
            versions = held
        bisect.insort(versions, version, key=_order)
        self._busy.add(key)

    def apply_many(
        self,
        keys: Sequence[tuple],
        ts: Sequence[int],
        seqs: Sequence[int],
        rows: Sequence[tuple],
        positions: Iterable[int],
        deletes: Sequence[bool],
    ) -> None:
        """:meth:`apply` at each of ``positions`` (in order): ``rows[i]``, or a delete where
        ``deletes[i]``."""
        held = self._rows
        apply = self.apply
        if self._fetch is not None:  # keys come from the store: each through apply
            for i in positions:
                apply(keys[i], ts[i], seqs[i], None if deletes[i] else rows[i])
            return
        for i in positions:
            key = keys[i]
            if not deletes[i] and key not in held:
                held[key] = (ts[i], seqs[i], rows[i])  # a key's first row: nothing to order
            else:
                apply(key, ts[i], seqs[i], None if deletes[i] else rows[i])

    def as_of(self, key: tuple, ts: int) -> tuple | None:
        """The row of ``key`` as of event time ``ts``: the newest change with time ≤ ``ts``
        (``None`` when there is none, or it is a delete)."""
        held = self._held(key)
        if held is None:
            return None
        if type(held) is tuple:
            return held[2] if held[0] <= ts else None
        for version in reversed(held):
            if version[0] <= ts:
                return version[2]
        return None

    def values_as_of(
        self, keys: Iterable[tuple], times: Iterable[int | None], position: int | None
    ) -> list[Any]:
        """:meth:`as_of` for many lookups at once (a batch's rows): for each key and time, the
        row's field at ``position`` (``True``, the row exists, when ``position`` is None), or
        None when there is no row, the time is None or a part of the key is None.

        >>> cards = VersionedTable("cards", ("card_id", "country"))
        >>> cards.apply(("c1",), 1_000, 0, ("c1", "FR"))
        >>> cards.values_as_of([("c1",), ("c1",), ("c2",), (None,)], [999, 1_000, 5, 5], 1)
        [None, 'FR', None, None]
        """
        rows, held_of = self._rows, self._held
        out: list[Any] = []
        append = out.append
        for key, ts in zip(keys, times, strict=True):
            held = rows.get(key)
            if held is None:
                if ts is None or None in key:
                    append(None)
                    continue
                held = held_of(key)
                if held is None:
                    append(None)
                    continue
            if ts is None:
                append(None)
                continue
            if type(held) is tuple:
                row = held[2] if held[0] <= ts else None
            else:
                row = None
                for version in reversed(held):
                    if version[0] <= ts:
                        row = version[2]
                        break
            if row is None:
                append(None)
            else:
                append(True if position is None else row[position])
        return out

    def versions(self, key: tuple) -> list[tuple]:
        """The versions of ``key``, oldest first."""
        held = self._rows.get(key)
        if held is None:
            return []
        return [held] if type(held) is tuple else list(held)

    def compact(self, limit: int) -> None:
        """Forget what no lookup at a time ≥ ``limit`` can see: of the versions at or before
        ``limit`` only the newest stays (and none when it is a delete)."""
        done = []
        rows = self._rows
        if self._fetch is not None:
            self._dirty.update(self._busy)
        for key in self._busy:
            held = rows[key]
            if type(held) is tuple:  # a lone delete
                if held[0] <= limit:
                    del rows[key]
                    done.append(key)
                continue
            cut = bisect.bisect_right(held, limit, key=_time) - 1
            if cut > 0:
                del held[:cut]
            if held[0][2] is None and held[0][0] <= limit:
                del held[0]
            if not held:
                del rows[key]
                done.append(key)
            elif len(held) == 1 and held[0][2] is not None:
                rows[key] = held[0]
                done.append(key)
        self._busy.difference_update(done)

    def size(self) -> tuple[int, int]:
        """Keys and versions held."""
        versions = sum(1 if type(v) is tuple else len(v) for v in self._rows.values())
        return len(self._rows), versions

    # ---------------------------------------------------------------- a store of keys

    def bind(self, fetch: Callable[[tuple], bytes | None] | None) -> None:
        """Hold nothing, and read each key's versions from ``fetch(key)`` (bytes of
        :func:`encode_versions`, or None) the first time it is needed — a store where most
        keys are not touched (the Spark operator's bucket). ``None``: hold everything, as
        before. :meth:`changed` then says what to write back."""
        self._rows, self._busy = {}, set()
        self._fetch = fetch
        self._fetched, self._dirty = set(), set()

    def changed(self) -> list[tuple[tuple, bytes | None]]:
        """Since :meth:`bind`: each key changed (or compacted) and its versions' new bytes
        (None: the key holds nothing any more)."""
        out = []
        for key in self._dirty:
            held = self._rows.get(key)
            out.append((key, None if held is None else encode_versions(
                [held] if type(held) is tuple else held)))
        return out

    def _held(self, key: tuple) -> Any:
        held = self._rows.get(key)
        if held is None and self._fetch is not None and key not in self._fetched:
            self._fetched.add(key)
            data = self._fetch(key)
            if data:
                for ts, seq, row in decode_versions(data):
                    self._restore(key, ts, seq, row)
                held = self._rows.get(key)
        return held

    # ---------------------------------------------------------------- state

    def to_bytes(self) -> bytes:
        """The versions as bytes (UTF-8 JSON: ``[format, fields, [[key, [[ts, seq, row],
        ...]], ...]]``; rows are lists, a delete is ``null``)."""
        body = [[list(key), _plain(self.versions(key))] for key in self._rows]
        return json.dumps([_STATE_FORMAT, list(self.fields), body],
                          separators=(",", ":"), ensure_ascii=False).encode()

    def load(self, data: bytes | None) -> None:
        """Replace the versions with those of :meth:`to_bytes` (nothing: empty)."""
        self.bind(None)
        if not data:
            return
        try:
            version, fields, body = json.loads(data)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"table {self.name}: unreadable state ({exc})") from exc
        if version != _STATE_FORMAT:
            raise CheckpointError(
                f"table {self.name}: state format {version}, this build reads {_STATE_FORMAT}"
            )
        moved = _mover(self.name, fields, self.fields)
        for key, versions in body:
            for ts, seq, row in versions:
                self._restore(tuple(key), ts, seq, None if row is None else moved(row))

    def adopt(self, other: VersionedTable) -> None:
        """Take ``other``'s versions (loaded apart, so that a failed load changes nothing);
        the rules compiled against this table keep reading it."""
        self.bind(None)
        self._rows, self._busy = other._rows, other._busy
        other._rows, other._busy = {}, set()

    def _restore(self, key: tuple, ts: int, seq: int, row: tuple | None) -> None:
        held = self._rows.get(key)
        version = (ts, seq, row)
        if held is None and row is not None:
            self._rows[key] = version
            return
        versions = [] if held is None else [held] if type(held) is tuple else held
        versions.append(version)
        self._rows[key] = versions
        self._busy.add(key)


def encode_versions(versions: Sequence[tuple]) -> bytes:
    """One key's versions as bytes (UTF-8 JSON ``[[ts, seq, row or null], ...]``).

    Examples
    --------
    >>> decode_versions(encode_versions([(1, 0, ("c1", "FR")), (2, 1, None)]))
    [(1, 0, ('c1', 'FR')), (2, 1, None)]
    """
    plain = _plain(versions)
    text = plain_json(plain)
    if text is None:  # a value json.dumps writes otherwise (or refuses)
        text = json.dumps(plain, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def _plain(versions: Sequence[tuple]) -> list:
    """Versions as JSON values: ``[[ts, seq, row as a list or None], ...]``."""
    return [[v[0], v[1], None if v[2] is None else list(v[2])] for v in versions]


def decode_versions(data: bytes) -> list[tuple]:
    """Inverse of :func:`encode_versions`.

    Raises
    ------
    cep.errors.CheckpointError
        When the bytes are not such versions.
    """
    try:
        return [(int(ts), int(seq), None if row is None else tuple(row))
                for ts, seq, row in json.loads(data)]
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"unreadable table versions ({exc})") from exc


def _order(version: tuple) -> tuple:
    return version[0], version[1]


def _time(version: tuple) -> int:
    return version[0]


def _mover(name: str, old: Iterable[str], new: Sequence[str]):
    """Rows saved with fields ``old`` as rows of fields ``new`` (a field added to the
    changelog stream reads null in the rows saved before)."""
    old = list(old)
    if old == list(new):
        return tuple
    where = {f: i for i, f in enumerate(old)}
    picks = [where.get(f) for f in new]
    return lambda row: tuple(None if i is None else row[i] for i in picks)
