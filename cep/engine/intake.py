"""The column-wise steps of feeding a DataFrame to the engine: each row's stream, validation,
lateness and rule masks, computed per column for the whole batch."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cep.engine.dispatch import KeyedRules
from cep.events.event import (
    STREAM_FIELD,
    BadEventError,
    StreamSchema,
    plain_value,
    stream_of,
    undeclared_failures,
)
from cep.events.watermark import Watermark

__all__ = [
    "BadRow",
    "RowOrigin",
    "StreamRows",
    "lateness",
    "mask_tuples",
    "rule_masks",
    "split_by_stream",
]

#: A row that failed validation: ``(row, reason, detail, stream or None)``.
BadRow = tuple[int, str, str, str | None]

#: The valid rows of one stream: ``(stream, normalised frame, event times, row numbers)``.
StreamRows = tuple[str, pd.DataFrame, np.ndarray, np.ndarray]


def split_by_stream(
    frame: pd.DataFrame, stream: str | None, schemas: Mapping[str, StreamSchema]
) -> tuple[list[StreamRows], list[BadRow]]:
    """The rows of ``frame`` per stream, validated column by column, and the rows that failed
    (in row order).

    ``stream`` names the stream of every row; otherwise a ``stream`` column does, and rows
    without one belong to the only declared stream.
    """
    n = len(frame)
    bad: list[BadRow] = []
    groups: dict[str, np.ndarray] = {}
    if stream is not None or STREAM_FIELD not in frame.columns:
        try:
            schema = stream_of({}, stream, schemas)
            groups[schema.name] = np.arange(n)
        except BadEventError as exc:
            bad.extend((i, exc.reason, exc.detail, None) for i in range(n))
    else:
        names = frame[STREAM_FIELD]
        # A list or object in the stream field names no stream (and cannot be factorised).
        odd = np.zeros(n, dtype=bool)
        if names.dtype == object and pd.api.types.infer_dtype(names, skipna=True) not in (
            "string", "empty",
        ):
            odd = np.array([not isinstance(v, Hashable) for v in names.tolist()], dtype=bool)
        if odd.any():
            for i in np.flatnonzero(odd).tolist():
                try:
                    stream_of({STREAM_FIELD: names.iloc[i]}, None, schemas)
                except BadEventError as exc:
                    bad.append((i, exc.reason, exc.detail, None))
            names = names.where(~odd, None)
        codes, uniques = pd.factorize(names, use_na_sentinel=True)
        codes[odd] = -2  # in no group, and not among the rows without a stream
        for code, name in enumerate(uniques):
            rows = np.flatnonzero(codes == code)
            try:
                schema = stream_of({STREAM_FIELD: name}, None, schemas)
                groups[schema.name] = rows
            except BadEventError as exc:
                bad.extend((int(i), exc.reason, exc.detail, None) for i in rows)
        rows = np.flatnonzero(codes == -1)
        if len(rows):
            try:
                schema = stream_of({}, None, schemas)
                groups[schema.name] = np.sort(
                    np.concatenate([groups.get(schema.name, np.empty(0, np.int64)), rows])
                )
            except BadEventError as exc:
                bad.extend((int(i), exc.reason, exc.detail, None) for i in rows)

    parts: list[StreamRows] = []
    for name, rows in groups.items():
        schema = schemas[name]
        sub = frame if len(rows) == n else frame.iloc[rows]
        normalised, ts, failed = schema.normalise_frame(sub)
        # Undeclared fields are checked after the declared ones, as StreamSchema.normalise
        # checks them; the rows they fail leave the validated rows (in row order).
        extra = undeclared_failures(sub, schema.fields, [pos for pos, _, _ in failed])
        if extra:
            passed = np.setdiff1d(np.arange(len(rows)), [p for p, _, _ in failed])
            keep = ~np.isin(passed, [p for p, _, _ in extra])
            normalised, ts = normalised[keep], ts[keep]
            failed = sorted([*failed, *extra])
        bad.extend((int(rows[pos]), reason, detail, name) for pos, reason, detail in failed)
        ok_rows = (
            rows
            if not failed
            else rows[np.isin(np.arange(len(rows)), [p for p, _, _ in failed], invert=True)]
        )
        parts.append((name, normalised, ts, ok_rows))
    return parts, sorted(bad, key=lambda b: b[0])


def lateness(
    watermark: Watermark, parts: Sequence[StreamRows]
) -> tuple[np.ndarray, np.ndarray]:
    """Observe the valid rows' times in arrival order across streams.

    Returns, over the rows of ``parts`` concatenated, which are late and the watermark each
    met on arrival.
    """
    stream_names = [p[0] for p in parts]
    all_rows = np.concatenate([p[3] for p in parts])
    all_codes = np.concatenate(
        [np.full(len(p[3]), code, dtype=np.int64) for code, p in enumerate(parts)]
    )
    all_ts = np.concatenate([p[2] for p in parts])
    order = np.argsort(all_rows, kind="stable")
    late_sorted = watermark.observe_many(stream_names, all_codes[order], all_ts[order])
    late = np.empty_like(late_sorted)
    late[order] = late_sorted
    met = np.empty(len(order), dtype=np.int64)
    met[order] = watermark.arrival_watermarks
    return late, met


def rule_masks(
    stream: str,
    frame: pd.DataFrame,
    groups: Iterable[KeyedRules],
    rules: Mapping[str, Any],
    slot_of: Mapping[str, int],
    width: int,
) -> tuple[np.ndarray | None, np.ndarray]:
    """Per row, the columnar mask of every rule slot (0 for rules not reading ``stream``),
    and which rows some rule must see.

    ``rules`` are the compiled rules by name, ``slot_of`` their slots and ``width`` the number
    of slots.
    """
    readers = [(slot, needs) for g in groups for slot, needs in g.readers.get(stream, ())]
    n = len(frame)
    if not readers:
        return None, np.zeros(n, dtype=bool)
    masks = np.zeros((n, width), dtype=np.int64)
    relevant = np.zeros(n, dtype=bool)
    rules_by_slot = {slot_of[name]: rule for name, rule in rules.items()}
    # Rules over several streams tell them apart by a `stream` column.
    multi = any(len(rules_by_slot[slot].streams) > 1 for slot, _ in readers)
    view = frame.assign(**{STREAM_FIELD: stream}) if multi else frame
    for slot, needs in readers:
        rule = rules_by_slot[slot]
        # the rule's mask already clears the bits whose current-event conjuncts fail
        mask = np.asarray(rule.columnar_mask(view), dtype=np.int64)
        masks[:, slot] = mask
        if needs:
            relevant[:] = True
        else:
            relevant |= mask != 0
    return masks, relevant


def mask_tuples(masks: np.ndarray) -> list[tuple]:
    """Each row of a (rows x rules) mask array as a tuple; equal rows share one tuple (a rule
    that must see every event gives most rows the same masks)."""
    if len(masks) < 64:
        return [tuple(row) for row in masks.tolist()]
    distinct, which = np.unique(masks, axis=0, return_inverse=True)
    shared = [tuple(row) for row in distinct.tolist()]
    return [shared[i] for i in which.reshape(-1).tolist()]


class RowOrigin:
    """Where each row of a batch came from, for its dead letter."""

    def __init__(self, frame: pd.DataFrame, source, lines, raw) -> None:
        self.frame = frame
        self.source = source
        self.lines = lines
        self.raw = raw

    def of(self, row: int) -> dict[str, Any]:
        source = self.source if isinstance(self.source, str) else self.source[row]
        line = None if self.lines is None else int(self.lines[row])
        if self.raw is not None:
            return {"input": source, "line": line, "raw": self.raw[row]}
        values = self.frame.iloc[row].to_dict()
        event = {str(k): plain_value(v) for k, v in values.items() if not _is_missing(v)}
        return {"input": source, "line": line, "event": event}


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)
