"""The one output shape of the Spark operator: every rule match, query hit, metric row and dead
letter becomes a row ``(kind, name, match_id, key, payload, start, end)``.

``payload`` holds the whole JSON object the embedded engine would have printed, so a consumer that
needs more than the common columns parses it; the columns exist so Spark can filter, join and
deduplicate without parsing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from cep.events.identity import canonical_id, canonical_json, json_text
from query_lang import timestamps

__all__ = [
    "COUNT_KINDS",
    "DEAD_LETTER",
    "HELD",
    "OUTPUT_COLUMNS",
    "UNCORRECTED",
    "dead_letter_record",
    "held_record",
    "key_text",
    "match_record",
    "match_time_ms",
    "records_frame",
    "uncorrected_record",
]

DEAD_LETTER = "dead_letter"
"""The ``kind`` of output rows that carry a dead letter (``name`` is its reason)."""

HELD = "held"
"""The ``kind`` of output rows that count a rule's matches held back by its ``unique``
(``name`` is the rule; the payload ``{"rule": ..., "held": N}``): what a call of the operator
held back, for the run's summary. ``run_spark``'s sink adds them up and writes none;
``spark_udf.detect`` leaves them out of its frame."""

UNCORRECTED = "uncorrected"
"""The ``kind`` of output rows that count events of a clock-corrected stream which kept their
device time, lacking a sent or received time (``name`` is the stream; the payload
``{"stream": ..., "uncorrected": N}``; :mod:`cep.events.clock`): counted once per input row
where rows are routed, or by the query pass for a stream no keyed processor reads. Like
:data:`HELD` rows, ``run_spark``'s sink adds them up and writes none, and ``spark_udf.detect``
leaves them out of its frame."""

COUNT_KINDS = (HELD, UNCORRECTED)
"""The ``kind`` of output rows that carry counts for the run's summary, never a result."""

OUTPUT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),
    ("name", "string"),
    ("match_id", "string"),
    ("key", "string"),
    ("payload", "string"),
    ("start", "timestamp"),
    ("end", "timestamp"),
)
"""Column names and Spark SQL types of every output row, in order."""


def key_text(key: Sequence[Any] | Mapping[str, Any] | None) -> str | None:
    """The partition key as canonical JSON (an array for a key tuple, an object for a named key).

    Examples
    --------
    >>> key_text(("c1", 7))
    '["c1",7]'
    >>> key_text({"card_id": "c1"})
    '{"card_id":"c1"}'
    """
    if key is None:
        return None
    if type(key) is not tuple and isinstance(key, Mapping):
        return canonical_json(dict(key))
    return json_text(key if type(key) is tuple else list(key))


def match_time_ms(value: Any) -> int | None:
    """A match time in epoch milliseconds: an ISO-8601 string (:mod:`query_lang.timestamps`), or
    an int/float already in ms; else ``None``.

    Examples
    --------
    >>> match_time_ms("2023-11-14T22:13:20.123Z")
    1700000000123
    >>> match_time_ms(5), match_time_ms(None), match_time_ms("soon")
    (5, None, None)
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        return timestamps.parse_iso_ms(value)
    return None


def _first_time(match: Mapping[str, Any], names: Iterable[str]) -> int | None:
    for name in names:
        if name in match:
            ms = match_time_ms(match[name])
            if ms is not None:
                return ms
    return None


def match_record(match: Mapping[str, Any]) -> dict[str, Any]:
    """The output row of one match object (``Match.to_json()``, a query hit or a metric row).

    ``kind`` defaults to ``rule``; ``name`` falls back to ``rule``/``query``/``metric``;
    ``start``/``end`` are read from ``start``/``end`` (ISO-8601) or ``start_ms``/``end_ms``.
    A match without a ``match_id`` gets one from its content (:mod:`cep.events.identity`), so it
    is still deterministic.

    Examples
    --------
    >>> r = match_record({"kind": "rule", "name": "r", "match_id": "m1", "key": {"k": "a"},
    ...                   "start": "1970-01-01T00:00:01.000Z", "end": "1970-01-01T00:00:02.000Z"})
    >>> r["kind"], r["name"], r["match_id"], r["key"], r["start_ms"], r["end_ms"]
    ('rule', 'r', 'm1', '{"k":"a"}', 1000, 2000)
    """
    payload = canonical_json(dict(match))
    kind = str(match.get("kind") or "rule")
    name = match.get("name")
    if name is None:
        name = match.get(kind, match.get("rule"))
    match_id = match.get("match_id")
    if not match_id:
        match_id = canonical_id(payload)
    key = match.get("key")
    return {
        "kind": kind,
        "name": None if name is None else str(name),
        "match_id": str(match_id),
        "key": key_text(key) if isinstance(key, Mapping | list | tuple) else key,
        "payload": payload,
        "start_ms": _first_time(match, ("start", "start_ms", "window_start")),
        "end_ms": _first_time(match, ("end", "end_ms", "window_end")),
    }


def dead_letter_record(
    letter: Mapping[str, Any], *, key: Sequence[Any] | None = None, time_ms: int | None = None
) -> dict[str, Any]:
    """The output row of one dead letter: ``kind`` ``dead_letter``, ``name`` its reason.

    The ``match_id`` is the letter's content id (:mod:`cep.events.identity`), so a replayed
    micro-batch produces the same id and an idempotent sink overwrites instead of duplicating.

    Examples
    --------
    >>> r = dead_letter_record({"reason": "late", "detail": "behind"}, key=("c1",), time_ms=5)
    >>> r["kind"], r["name"], r["key"], r["start_ms"]
    ('dead_letter', 'late', '["c1"]', 5)
    """
    payload = canonical_json(dict(letter))
    return {
        "kind": DEAD_LETTER,
        "name": str(letter.get("reason", "unknown")),
        "match_id": canonical_id(payload),
        "key": key_text(key),
        "payload": payload,
        "start_ms": time_ms,
        "end_ms": time_ms,
    }


def held_record(rule: str, count: int, where: str) -> dict[str, Any]:
    """The output row counting ``count`` matches of ``rule`` held back by its ``unique`` in one
    call of the operator; ``where`` (the bucket or key) keeps the rows of one micro-batch apart.

    Examples
    --------
    >>> r = held_record("once", 2, "bucket 3")
    >>> r["kind"], r["name"], r["payload"]
    ('held', 'once', '{"held":2,"rule":"once"}')
    """
    payload = canonical_json({"rule": rule, "held": int(count)})
    return {
        "kind": HELD,
        "name": rule,
        "match_id": canonical_id(canonical_json([where, payload])),
        "key": None,
        "payload": payload,
        "start_ms": None,
        "end_ms": None,
    }


def uncorrected_record(stream: str, count: int, where: str) -> dict[str, Any]:
    """The output row counting ``count`` events of ``stream`` that kept their device time (no
    sent or received time) among the rows one call of the operator or of the query pass got;
    ``where`` (the state group, the first input position) keeps the rows of one micro-batch
    apart.

    Examples
    --------
    >>> r = uncorrected_record("app", 3, "group 5")
    >>> r["kind"], r["name"], r["payload"]
    ('uncorrected', 'app', '{"stream":"app","uncorrected":3}')
    """
    payload = canonical_json({"stream": stream, "uncorrected": int(count)})
    return {
        "kind": UNCORRECTED,
        "name": stream,
        "match_id": canonical_id(canonical_json([where, payload])),
        "key": None,
        "payload": payload,
        "start_ms": None,
        "end_ms": None,
    }


def records_frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Output rows as a pandas frame with the column order and dtypes of the Spark schema."""
    frame = pd.DataFrame(
        {
            "kind": pd.Series([r["kind"] for r in records], dtype=object),
            "name": pd.Series([r["name"] for r in records], dtype=object),
            "match_id": pd.Series([r["match_id"] for r in records], dtype=object),
            "key": pd.Series([r["key"] for r in records], dtype=object),
            "payload": pd.Series([r["payload"] for r in records], dtype=object),
            "start": _times([r["start_ms"] for r in records]),
            "end": _times([r["end_ms"] for r in records]),
        }
    )
    return frame


def _times(values: list[int | None]) -> pd.Series:
    stamps = pd.to_datetime(pd.Series(values, dtype="Int64"), unit="ms", utc=True)
    return stamps.astype("datetime64[ns, UTC]")
