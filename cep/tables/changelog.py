"""Changelog rows read as changes of a table, and the tables of a program fed by their streams.

A row of a table's changelog stream is an upsert of its key's row (every field of the stream
but the op field), or a delete: its op field holds a ``delete`` value, or every field other
than the key, the op and the event time is null (a tombstone, as Kafka's compacted topics and
Debezium write them). A row without a full key, or whose op is in neither vocabulary, changes
nothing and is reported (:class:`ChangeError`, a dead letter of the engine).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cep.errors import CheckpointError
from cep.events.event import Event, EventReason, StreamSchema
from cep.events.watermark import iso_ms
from cep.tables.versions import VersionedTable
from query_lang import ast
from query_lang.checks import event_time_field
from query_lang.printer import print_declaration

__all__ = ["Change", "ChangeError", "TableFeed", "Tables"]


@dataclass(frozen=True, slots=True)
class Change:
    """A change of one key: its new row, or None when the key is deleted."""

    key: tuple
    row: tuple | None


class ChangeError(Exception):
    """A changelog row that changes nothing: ``reason`` (an :class:`EventReason`) and
    ``detail`` for its dead letter."""

    def __init__(self, reason: str, detail: str, table: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.table = table


class TableFeed:
    """One ``table`` declaration: how its changelog rows change its :class:`VersionedTable`.

    Examples
    --------
    >>> from query_lang import parse
    >>> stream, table = parse('''
    ... stream card_changes (card_id string, country string, op string, ts timestamp) time ts
    ... table cards from card_changes key card_id op op
    ... ''').declarations
    >>> feed = TableFeed(table, stream)
    >>> feed.change({"card_id": "c1", "country": "FR", "op": "u", "ts": 5})
    Change(key=('c1',), row=('c1', 'FR', 5))
    >>> feed.change({"card_id": "c1", "country": "FR", "op": "D", "ts": 6}).row is None
    True
    >>> try:
    ...     feed.change({"card_id": "c1", "op": "truncate", "ts": 7})
    ... except ChangeError as error:
    ...     print(error.reason, error.detail[:40])
    unknown_op table cards: op 'truncate' is neither an
    """

    def __init__(self, decl: ast.TableDecl, stream: ast.StreamDecl) -> None:
        self.decl = decl
        fields = [f.name for f in stream.fields if f.name != decl.op_field]
        device = stream.device_time_field
        if device is not None:
            fields.append(device)
        self.table = VersionedTable(decl.name, fields)
        self.key_fields = decl.key
        time_field = event_time_field(stream)
        self._values = tuple(
            f for f in fields if f not in decl.key and f not in (time_field, device)
        )
        self._op = decl.op_field
        self._upsert = frozenset(v.lower() for v in decl.upsert_ops)
        self._delete = frozenset(v.lower() for v in decl.delete_ops)
        # horizon: how far behind the watermark versions stay apart (see Tables.compact)
        self.horizon_ms = decl.retain.ms if decl.retain is not None else 0

    @property
    def name(self) -> str:
        return self.decl.name

    def change(self, fields: Mapping[str, Any]) -> Change:
        """The change a changelog row (normalised fields) makes.

        Raises
        ------
        ChangeError
            When the row lacks part of the key (``missing_key``) or its op is in neither
            vocabulary (``unknown_op``).
        """
        key = tuple(fields.get(k) for k in self.key_fields)
        if None in key:
            raise self._missing(key)
        if self._op is not None:
            op = fields.get(self._op)
            lowered = op.lower() if isinstance(op, str) else None
            if lowered in self._delete:
                return Change(key, None)
            if lowered not in self._upsert:
                raise self._unknown(op)
        if self._values and all(fields.get(f) is None for f in self._values):
            return Change(key, None)  # a tombstone
        return Change(key, tuple(fields.get(f) for f in self.table.fields))


    def apply_columns(
        self,
        schema: StreamSchema,
        frame: pd.DataFrame,
        ts: Sequence[int],
        seqs: Sequence[int],
        released: Sequence[int],
    ) -> list[tuple[int, ChangeError]]:
        """:meth:`change` and apply, for a batch of accepted changelog rows: ``frame`` as
        :meth:`StreamSchema.normalise_frame` left them (``schema`` reads their values); the
        errors by row position."""
        n = len(ts)
        fields = self.table.fields
        columns = dict(zip(fields, schema.column_values(frame, fields), strict=True))

        def nulls(name: str) -> np.ndarray:
            return np.array([v is None for v in columns[name]], dtype=bool)

        late = np.asarray(ts, dtype=np.int64) <= np.asarray(released, dtype=np.int64)
        keyless = np.zeros(n, dtype=bool)
        for name in self.key_fields:
            keyless |= nulls(name)
        gone = np.ones(n, dtype=bool) if self._values else np.zeros(n, dtype=bool)
        for name in self._values:
            gone &= nulls(name)  # a tombstone: every value field null
        unknown = np.zeros(n, dtype=bool)
        ops: list[Any] = []
        if self._op is not None:
            (ops,) = schema.column_values(frame, [self._op])
            lowered = [op.lower() if type(op) is str else None for op in ops]
            deletes = np.array([op in self._delete for op in lowered], dtype=bool)
            unknown = ~deletes & ~np.array([op in self._upsert for op in lowered], dtype=bool)
            gone |= deletes
        keys = list(zip(*(columns[k] for k in self.key_fields), strict=True))
        bad = late | keyless | unknown
        errors: list[tuple[int, ChangeError]] = []
        for i in np.flatnonzero(bad).tolist():
            if late[i]:
                errors.append((i, self._late(ts[i], released[i])))
            elif keyless[i]:
                errors.append((i, self._missing(keys[i])))
            else:
                errors.append((i, self._unknown(ops[i])))
        rows = list(zip(*columns.values(), strict=True))
        self.table.apply_many(keys, ts, seqs, rows, np.flatnonzero(~bad).tolist(),
                              gone.tolist())
        return errors

    def _late(self, ts: int, released: int) -> ChangeError:
        return ChangeError(
            EventReason.LATE,
            f"table {self.name}: change at {iso_ms(ts)} came after the events up to "
            f"{iso_ms(released)} had read the table",
            self.name,
        )

    def _missing(self, key: tuple) -> ChangeError:
        missing = [k for k, v in zip(self.key_fields, key, strict=True) if v is None]
        return ChangeError(
            EventReason.MISSING_KEY,
            f"table {self.name}: key field(s) {', '.join(missing)} missing or null",
            self.name,
        )

    def _unknown(self, op: Any) -> ChangeError:
        return ChangeError(
            EventReason.UNKNOWN_OP,
            f"table {self.name}: op {op!r} is neither an upsert "
            f"({', '.join(self.decl.upsert_ops)}) nor a delete ({', '.join(self.decl.delete_ops)})",
            self.name,
        )


class Tables:
    """The tables of a program, fed by the rows of their changelog streams.

    A change is applied when its row is accepted (on time): a rule sees each event only once
    the watermark passed it, so every on-time change at or before an event's time is applied
    by then, whatever the order the two arrived in. A late change is a dead letter, as any
    late row: applying it would give earlier events' lookups an answer that depends on when it
    came.
    """

    def __init__(self) -> None:
        self._feeds: dict[str, TableFeed] = {}
        self._by_stream: dict[str, list[TableFeed]] = {}
        #: Changelog streams whose rows reach every part of a partitioned store (the Spark
        #: operator's buckets) because some lookup reads the table by another key than the
        #: one the store is partitioned by: each part then holds the whole table.
        self.broadcast: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self._feeds)

    def __contains__(self, name: object) -> bool:
        return name in self._feeds

    def add(self, feed: TableFeed) -> None:
        """Start a table (empty: it sees the changes that come from now on)."""
        self._feeds[feed.name] = feed
        self._by_stream.setdefault(feed.decl.stream, []).append(feed)

    @property
    def readers(self) -> dict[str, VersionedTable]:
        """The tables by name, for the rules' ``lookup`` (a ``TableReader`` each)."""
        return {name: feed.table for name, feed in self._feeds.items()}

    def feeds(self) -> Iterable[TableFeed]:
        return self._feeds.values()

    def feed(self, name: str) -> TableFeed:
        """Table ``name``'s feed (``KeyError`` when there is none)."""
        return self._feeds[name]

    @property
    def streams(self) -> frozenset[str]:
        """The changelog streams feeding the tables."""
        return frozenset(self._by_stream)

    def subset(self, names: Iterable[str]) -> Tables:
        """The tables named (the same objects: rules compiled against them read them)."""
        part = Tables()
        for name in names:
            part.add(self._feeds[name])
        return part

    def reads(self, stream: str) -> bool:
        """Whether rows of ``stream`` change some table."""
        return stream in self._by_stream

    def widen(self, name: str, horizon_ms: int) -> None:
        """Keep versions of table ``name`` apart at least ``horizon_ms`` behind the watermark
        (a rule's ``within``: its ``emit`` reads the table as of the match's last event, which
        can be that far behind when an absence fires). A declared ``retain`` is kept as is."""
        feed = self._feeds.get(name)
        if feed is not None and feed.decl.retain is None:
            feed.horizon_ms = max(feed.horizon_ms, horizon_ms)

    def apply(self, event: Event, released: int) -> list[ChangeError]:
        """Apply an accepted row of a changelog stream to each table it feeds; what it could
        not change, one error per table.

        ``released``: the time up to which events have been handed to the rules. A change
        stamped at or before it is late for the tables although its stream took it (a row
        exactly at the watermark is on time): an event of that very time may have read the
        table already.
        """
        feeds = self._by_stream.get(event.stream, ())
        if event.ts <= released:
            return [feed._late(event.ts, released) for feed in feeds]
        errors = []
        for feed in feeds:
            try:
                change = feed.change(event.fields)
            except ChangeError as exc:
                errors.append(exc)
                continue
            feed.table.apply(change.key, event.ts, event.seq, change.row)
        return errors

    def apply_frame(
        self,
        schema: StreamSchema,
        frame: pd.DataFrame,
        ts: Sequence[int],
        seqs: Sequence[int],
        released: Sequence[int],
    ) -> list[tuple[int, ChangeError]]:
        """:meth:`apply` for a batch of accepted rows of a stream, column-wise
        (:meth:`TableFeed.apply_columns`): the errors by row position, in table order."""
        errors: list[tuple[int, ChangeError]] = []
        for feed in self._by_stream.get(schema.name, ()):
            errors.extend(feed.apply_columns(schema, frame, ts, seqs, released))
        return errors

    def compact(self, watermark: int) -> None:
        """Collapse each table's versions that no lookup can tell apart any more: lookups
        happen at times ≥ the watermark (rules see events the watermark released, in time
        order), or up to a table's horizon behind it (``emit`` of a match fired late)."""
        for feed in self._feeds.values():
            feed.table.compact(watermark - feed.horizon_ms)

    def identity(self, name: str) -> str:
        """What a checkpoint's table must match to be restored: its printed declaration (a
        field added to its changelog stream is fine: rows saved before read it as null)."""
        return print_declaration(self._feeds[name].decl)

    def snapshot(self) -> dict[str, tuple[str, bytes]]:
        """Each table's identity and state bytes, by name."""
        return {
            name: (self.identity(name), feed.table.to_bytes())
            for name, feed in self._feeds.items()
        }

    def loaded(self, states: Mapping[str, tuple[str, bytes]]) -> dict[str, VersionedTable]:
        """The tables of :meth:`snapshot` whose identity is unchanged, loaded apart (for
        :meth:`adopt`); a table changed or new starts empty.

        Raises
        ------
        cep.errors.CheckpointError
            When a table's state cannot be read.
        """
        out = {}
        for name, (identity, data) in states.items():
            feed = self._feeds.get(name)
            if feed is not None and identity == self.identity(name):
                table = VersionedTable(name, feed.table.fields)
                table.load(data)
                out[name] = table
        return out

    def bind(
        self, header: bytes | None, fetch: Callable[[str, tuple], bytes | None]
    ) -> tuple[int | None, list[str]]:
        """Read each table's keys lazily from a store (``fetch(table, key)``: the bytes
        :meth:`changed` gave for them), as the Spark operator keeps them, one value per key
        beside the rules' keys. ``header`` is what :meth:`header` wrote with them.

        Returns the time up to which events have read the tables (None: never), and the
        tables whose declaration changed since the header was written (their stored keys are
        stale: the caller drops them; the tables start empty).

        Raises
        ------
        cep.errors.CheckpointError
            When the header cannot be read.
        """
        released, identities = None, {}
        if header:
            try:
                body = json.loads(header)
                released, identities = int(body["released"]), dict(body["tables"])
            except (ValueError, TypeError, KeyError) as exc:
                raise CheckpointError(f"unreadable table state ({exc})") from exc
        stale = [name for name, identity in identities.items()
                 if name not in self._feeds or identity != self.identity(name)]
        for name, feed in self._feeds.items():
            if name in stale:
                feed.table.bind(lambda key: None)  # starts empty; its keys are written anew
            else:
                feed.table.bind(lambda key, name=name: fetch(name, key))
        return released, stale

    def header(self, released: int) -> bytes:
        """What :meth:`bind` reads back: ``released`` and each table's identity."""
        body = {"released": released,
                "tables": {name: self.identity(name) for name in self._feeds}}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def changed(self) -> Iterable[tuple[str, tuple, bytes | None]]:
        """``(table, key, bytes or None)`` of every key changed since :meth:`bind`."""
        for name, feed in self._feeds.items():
            for key, data in feed.table.changed():
                yield name, key, data

    def adopt(self, tables: Mapping[str, VersionedTable]) -> None:
        """Take the versions of :meth:`loaded` tables."""
        for name, table in tables.items():
            self._feeds[name].table.adopt(table)
