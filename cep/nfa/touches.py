"""Which rules of a :class:`~cep.nfa.processor.RuleProcessor` each row may touch, found
column-wise: each distinct condition evaluated once over a stream's rows, a rule handed a row
only when one of its conditions may hold for it (or when it must see every row). The embedded
engine's rule index (:mod:`cep.engine.rule_index`) and the Spark operator's buckets
(:meth:`RuleProcessor.process_keys`) both ask here, so both run the same rules on an event.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cep.events.event import STREAM_FIELD, Event, StreamSchema

__all__ = [
    "advance_class",
    "condition_fits",
    "event_touches",
    "events_frame",
    "mask_bits",
    "rows_fitting",
    "rule_rows",
]


def condition_fits(rule: Any, cond: Any, stream: str, frame: pd.DataFrame,
                   shared: dict[tuple, np.ndarray]) -> Any:
    """Where a condition may hold over ``frame`` (rows of ``stream``): a bool array, or
    ``True``/``False`` for every row. Equal condition texts over the same streams are
    evaluated once per frame (``shared`` remembers them)."""
    key = _condition_key(rule, cond, stream)
    if key is True or key is False:
        return key
    fits = shared.get(key)
    if fits is None:
        fits = shared[key] = np.asarray(cond.columnar(frame), dtype=bool)
    return fits


def _condition_key(rule: Any, cond: Any, stream: str) -> Any:
    """How :func:`condition_fits` tells a condition of ``rule`` apart over rows of
    ``stream``: ``False`` (it reads another stream), ``True`` (no columnar form: it may hold
    for every row), or a key equal for conditions evaluated alike (the same text over the
    same streams; a condition without a text is its own)."""
    if cond.stream is not None and cond.stream != stream:
        return False
    if cond.predicate is None or cond.columnar is None:
        return True
    text = getattr(cond, "columnar_text", None)
    return (rule.streams, text) if text is not None else (id(cond),)


_ADVANCE_CLASSES: dict[tuple, int] = {}


def advance_class(rule: Any, start: int) -> int | None:
    """A number shared by the rules whose masks agree on every row that begins a match of
    none of them: same streams, and the same conditions (as :func:`condition_fits` tells them
    apart) on the same bits outside ``start`` (the rule's start bits). On such a row a rule's
    mask is its bits outside ``start``, so one mask per class stands for all its rules. None
    when the rule's conditions cannot be told apart so (no columnar text, or a condition read
    at release: :mod:`cep.engine.rule_index`'s refinement changes masks per rule)."""
    conditions = getattr(rule, "conditions", None)
    if conditions is None or start == -1 or getattr(rule, "at_release", ()):
        return None
    parts = []
    for bit, cond in enumerate(conditions):
        if (start >> bit) & 1:
            continue
        if cond.predicate is None or cond.columnar is None:
            text = None
        else:
            text = getattr(cond, "columnar_text", None)
            if text is None:
                return None
        parts.append((bit, cond.stream, text))
    key = (tuple(rule.streams), tuple(parts))
    return _ADVANCE_CLASSES.setdefault(key, len(_ADVANCE_CLASSES))


def mask_bits(rule: Any, stream: str, frame: pd.DataFrame) -> list[tuple[int, Any]]:
    """``(bit, rows where it is set)`` of a rule's :meth:`columnar_mask` over ``frame``."""
    view = frame.assign(**{STREAM_FIELD: stream}) if len(rule.streams) > 1 else frame
    mask = np.asarray(rule.columnar_mask(view), dtype=np.int64)
    top = int(np.bitwise_or.reduce(mask)) if len(mask) else 0
    return [(bit, (mask >> np.int64(bit)) & 1 == 1) for bit in range(max(top.bit_length(), 1))]


def rows_fitting(fits: list[Any], n: int) -> np.ndarray:
    """The rows where at least one of ``fits`` (from :func:`condition_fits`) holds."""
    if any(f is True for f in fits):
        return np.arange(n)
    arrays = [f for f in fits if f is not False]
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    union = arrays[0]
    for f in arrays[1:]:
        union = union | f
    return np.flatnonzero(union)


def rule_rows(
    processor: Any, stream: str, frame: pd.DataFrame, shared: dict[tuple, np.ndarray]
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per rule of ``processor`` reading ``stream`` that some row of ``frame`` touches:
    ``(rule index, rows, masks)``, the masks (int64, a bit per variable) of those rows.

    A row touches a rule when one of the rule's conditions may hold for it. A rule that must
    see every row (strict contiguity, ``prev``) touches every row, except one run as a scan
    (:attr:`RuleProcessor.scanned`), which sees its key's rows anyway and needs to know only
    where a match may start. Rules whose conditions are the same texts on the same bits, run
    the same way (:func:`_readers`), get their rows and masks computed once per frame: the
    same arrays, which callers do not change.
    """
    n = len(frame)
    done: dict[tuple, tuple[np.ndarray, np.ndarray] | None] = {}
    for index, rule, alike in _readers(processor, stream):
        found = done.get(alike, _UNSEEN) if alike is not None else _UNSEEN
        if found is _UNSEEN:
            found = _rows_and_masks(processor, index, rule, stream, frame, shared, n)
            if alike is not None:
                done[alike] = found
        if found is not None:
            yield index, found[0], found[1]


_UNSEEN: Any = object()
_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _readers(processor: Any, stream: str) -> list[tuple[int, Any, tuple | None]]:
    """The rules of ``processor`` reading ``stream``, in index order, each with what makes
    its rows and masks over a frame of the stream (:func:`rule_rows`): how it is run (scanned
    from its start bits, every row, or where a condition may hold) and, per bit, its
    condition's :func:`_condition_key`; None for a rule that gives only its masks. Kept per
    processor (its rules never change)."""
    try:
        plans = _READERS.setdefault(processor, {})
    except TypeError:  # a processor that cannot be weakly referenced: not kept
        plans = {}
    plan = plans.get(stream)
    if plan is not None:
        return plan
    plan = []
    scanned = processor.scanned
    must_see = processor.must_see
    for index, rule in enumerate(processor.rules):
        if stream not in rule.streams:
            continue
        conditions = getattr(rule, "conditions", None)
        alike: tuple | None = None
        if conditions is not None:
            how = (("scan", processor.start_bits_of(index)) if index in scanned
                   else ("all",) if must_see[index] else ("fit",))
            alike = (how, tuple(_condition_key(rule, cond, stream) for cond in conditions))
        plan.append((index, rule, alike))
    plans[stream] = plan
    return plan


def _rows_and_masks(
    processor: Any, index: int, rule: Any, stream: str, frame: pd.DataFrame,
    shared: dict[tuple, np.ndarray], n: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """One rule's :func:`rule_rows` entry over ``frame``: its rows and their masks, or None
    when no row touches it."""
    conditions = getattr(rule, "conditions", None)
    if conditions is None:
        # A rule that gives only its masks (another compiler's).
        fits = mask_bits(rule, stream, frame)
    else:
        fits = [
            (bit, condition_fits(rule, cond, stream, frame, shared))
            for bit, cond in enumerate(conditions)
        ]
    if index in processor.scanned:
        first = processor.start_bits_of(index)
        chosen = rows_fitting([f for bit, f in fits if (first >> bit) & 1], n)
    elif processor.must_see[index]:
        chosen = np.arange(n)
    else:
        chosen = rows_fitting([f for _, f in fits], n)
    if len(chosen) == 0:
        return None
    mask = np.zeros(len(chosen), dtype=np.int64)
    for bit, f in fits:
        if f is True:
            mask |= np.int64(1) << np.int64(bit)
        elif f is not False:
            mask |= f[chosen].astype(np.int64) << np.int64(bit)
    return chosen, mask


def events_frame(schema: StreamSchema, events: Sequence[Event]) -> pd.DataFrame:
    """Validated events of one stream as the frame
    :meth:`~cep.events.event.StreamSchema.normalise_frame` makes of the same rows: ``float``
    fields as float64 (null as NaN), ``int`` and ``timestamp`` fields as int64 when no value
    is null, every other column of objects (null as None)."""
    names: dict[str, None] = {}
    for event in events:
        names.update(dict.fromkeys(event.fields))
    kinds = schema.fields
    columns: dict[str, Any] = {}
    for name in names:
        values = [event.fields.get(name) for event in events]
        kind = kinds.get(name)
        if kind == "float":
            columns[name] = np.array([np.nan if v is None else v for v in values],
                                     dtype=np.float64)
        elif kind in ("int", "timestamp") and None not in values:
            columns[name] = np.array(values, dtype=np.int64)
        else:
            columns[name] = pd.Series(values, dtype=object)
    return pd.DataFrame(columns, index=pd.RangeIndex(len(events)))


def event_touches(processor: Any, events: Sequence[Event]) -> list[list[tuple[int, int]]]:
    """Per event, the ``(rule index, mask)`` pairs of the rules of ``processor`` it touches
    (:func:`rule_rows`), in index order: what :meth:`RuleProcessor.run_indexed` takes."""
    out: list[list[tuple[int, int]]] = [[] for _ in events]
    by_stream: dict[str, list[int]] = {}
    for position, event in enumerate(events):
        by_stream.setdefault(event.stream, []).append(position)
    shared: dict[tuple, np.ndarray] = {}
    for stream, positions in by_stream.items():
        schema = processor.schemas.get(stream)
        if schema is None:
            continue
        frame = events_frame(schema, [events[p] for p in positions])
        shared.clear()
        for index, rows, masks in rule_rows(processor, stream, frame, shared):
            for row, mask in zip(rows.tolist(), masks.tolist(), strict=True):
                out[positions[row]].append((index, mask))
    return out
