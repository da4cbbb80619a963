"""The column-wise route: rows of a stream whose rules all run as a scan
(:func:`cep.nfa.strict.qualifies`) wait as columns and run per key without event objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from cep.engine.dispatch import KeyedRules
from cep.events.columnar import Block, Chunk, ColumnBuffer
from cep.events.event import Event, StreamSchema, _column_values
from cep.events.watermark import ReorderBuffer
from cep.nfa.processor import KeyState

__all__ = ["MOST_RULES", "ColumnRoute", "run_block"]

MOST_RULES = 1
"""The most scan rules a stream held as columns may have. The route runs each rule over every
key of a block, where the event route shares one moved state among a key's idle rules alike
(:meth:`RuleProcessor.run_indexed`). 200,000 events, 10,000 keys, the ``prev`` rules of the
rules benchmark (``bench/bench_rules.py``), CPU, events/s as columns vs as events: 1 rule
116,791 / 122,041 vs 97,834 / 104,229; 2 rules 61,543 vs 67,249; 5 rules 29,386 vs 52,603;
20 rules 7,302 vs 45,869."""


class ColumnRoute:
    """Which streams wait as columns, and their rows until the watermark releases them.

    Rows of other streams wait in the engine's reorder buffer as events; a stream moves
    between the two only in ways that keep each key's events in order.

    Attributes
    ----------
    most_rules:
        The most scan rules a stream held as columns may have (:data:`MOST_RULES`).
    columns:
        The rows held as columns.
    streams:
        Stream -> key signature of the one group of rules that reads it, for the streams held
        as columns.
    """

    def __init__(self, buffer: ReorderBuffer, most_rules: int = MOST_RULES) -> None:
        self.most_rules = most_rules
        self.columns = ColumnBuffer()
        self.streams: dict[str, tuple] = {}
        # Streams that qualify but still have events in the reorder buffer wait here until
        # those are released.
        self._wanted: dict[str, tuple] = {}
        self._buffer = buffer

    def plan(self, groups: Mapping[tuple, KeyedRules]) -> None:
        """Decide which streams' rows wait as columns (after the rules changed).

        A stream qualifies when one group reads it, the group reads no other stream (so keys
        and timers are met in the order the per-event dispatch meets them),
        :meth:`RuleProcessor.scan_streams` says its rules can run it column-wise and they are
        at most :attr:`most_rules`. A stream that stops qualifying has its held rows moved to
        the reorder buffer; one that starts qualifying is held as columns once the reorder
        buffer has none of its events (:meth:`enable`). No groups: no stream qualifies.
        """
        wanted: dict[str, tuple] = {}
        readers: Counter[str] = Counter()
        for group in groups.values():
            readers.update(list(group.readers))
        for signature, group in groups.items():
            if len(group.readers) != 1:
                continue
            processor = group.processor
            for stream in processor.scan_streams():
                if readers[stream] == 1 and len(processor.scan_rules(stream)) <= self.most_rules:
                    wanted[stream] = signature
        for stream, signature in list(self.streams.items()):
            if wanted.get(stream) != signature:
                self.demote(stream)
        self._wanted = {s: sig for s, sig in wanted.items() if self.streams.get(s) != sig}
        self.enable()

    def enable(self) -> None:
        """Hold the wanted streams as columns from now on, those without buffered events."""
        if not self._wanted:
            return
        buffered = {payload[0].stream for _, _, payload in self._buffer.entries()}
        for stream in [s for s in self._wanted if s not in buffered]:
            self.streams[stream] = self._wanted.pop(stream)

    def demote(self, stream: str) -> None:
        """Move a stream's held rows to the reorder buffer as events; its next rows go there
        too until :meth:`enable` holds it as columns again."""
        signature = self.streams.pop(stream)
        self._wanted[stream] = signature
        held = self.columns.take(stream)
        if held:
            # Every rule reading the stream runs as a scan, which reads a mask only to know
            # whether the rule was registered when the event arrived.
            entries = sorted(
                ((ev.ts, ev.seq, (ev, (-1,) * width)) for ev, width in held),
                key=lambda entry: (entry[0], entry[1]),
            )
            self._buffer.push_sorted(entries)

    def hold(
        self,
        schema: StreamSchema,
        key_fields: tuple[str, ...],
        frame: pd.DataFrame,
        ts: np.ndarray,
        seqs: np.ndarray,
        positions: np.ndarray,
        width: int,
    ) -> tuple[list[Event], np.ndarray] | None:
        """Hold accepted rows of a stream held as columns (``width``: rule slots so far); rows
        with a null key field become events (returned with their row numbers) for the reorder
        buffer, which dead-letters them."""
        null = np.zeros(len(frame), dtype=bool)
        for name in key_fields:
            if name not in frame.columns:
                null[:] = True
                break
            null |= np.fromiter(
                (v is None for v in _column_values(frame[name])), dtype=bool, count=len(frame)
            )
        missing = None
        if null.any():
            rows = np.flatnonzero(null)
            missing = (
                schema.events_from_frame(frame.iloc[rows], seqs[rows], positions[rows]),
                rows,
            )
            keep = ~null
            frame, ts, seqs, positions = frame[keep], ts[keep], seqs[keep], positions[keep]
        if len(frame):
            self.columns.push(Chunk(schema, frame, ts, seqs, positions, width))
        return missing

    def release(self, watermark: int) -> list[Block]:
        """The held rows the watermark passed, as blocks."""
        return self.columns.release(watermark) if self.columns else []


def run_block(
    block: Block, group: KeyedRules, outputs: list[dict[str, Any]]
) -> list[tuple[tuple, KeyState]]:
    """Run released columnar rows through ``group``'s rules: what the per-event dispatch does
    with their events. Returns the keys run and their states."""
    processor = group.processor
    fields = processor.key_fields[block.stream]
    index: dict[Any, int] = {}
    if len(fields) == 1:
        codes = [index.setdefault(v, len(index)) for v in block.column(fields[0])]
        keys = [(v,) for v in index]
    else:
        codes = [
            index.setdefault(k, len(index))
            for k in zip(*[block.column(f) for f in fields], strict=True)
        ]
        keys = list(index)
    states = group.states
    key_states = []
    for key in keys:
        state = states.get(key)
        if state is None:
            state = states[key] = KeyState()
        key_states.append(state)
    code_array = np.asarray(codes, dtype=np.int64)
    widths = block.widths()
    for rule_index in processor.scan_rules(block.stream):
        slot = group.slots[rule_index]
        seen = widths > slot
        if seen.all():
            order = np.argsort(code_array, kind="stable")
        else:
            chosen = np.flatnonzero(seen)
            order = chosen[np.argsort(code_array[chosen], kind="stable")]
        if len(order) == 0:
            continue
        part = block.select(order)
        sorted_codes = code_array[order]
        bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
        starts = [0, *bounds.tolist()]
        ends = [*bounds.tolist(), len(order)]
        segments = [
            (keys[c], key_states[c], lo, hi)
            for c, lo, hi in zip(sorted_codes[starts].tolist(), starts, ends, strict=True)
        ]
        processor.run_columns(rule_index, part, segments, outputs)
    return list(zip(keys, key_states, strict=True))
