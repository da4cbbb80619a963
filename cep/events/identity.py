"""Identities of what the engines emit: canonical JSON, and the one scheme every ``match_id`` of a
rule match, a metric result, a Spark output row or a dead letter is computed with.

A ``match_id`` is the first 32 hex digits (128 bits) of SHA-256 over the canonical JSON of the
match's identity — for a rule, ``[rule, version, key, bound event ids]``; for a metric result,
``["metric", name, version, key, window start, window end, revision]``; for a row without an
id of its own (a dead letter), the whole row. Equal input gives equal ids, so a replay
deduplicates downstream (the outbox keeps one alert per id and endpoint).

Rule ids escape non-ASCII characters in the JSON (``ascii_only``), as they always have: ids
already delivered stay valid across versions.

The percolator names its query matches with its own scheme (``percolator.matcher.match_id``:
xxh3-128 of ``"query\\0" + name + "\\0" + document id``): it runs once per (document, query)
pair on the search path, where SHA-256 over JSON measured 8.5 µs against 0.66 µs, and the
``query\\0`` prefix keeps its ids apart from these.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_id", "canonical_json", "content_id"]


def canonical_json(value: Any, *, ascii_only: bool = False) -> str:
    """JSON with sorted keys and no insignificant whitespace: equal values give equal text
    (values JSON cannot carry are written as their ``str``).

    Examples
    --------
    >>> canonical_json({"b": 1, "a": [1.5, None, "é"]})
    '{"a":[1.5,null,"é"],"b":1}'
    >>> canonical_json(["é"], ascii_only=True)
    '["\\\\u00e9"]'
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, default=str
    )


def content_id(value: Any, *, ascii_only: bool = False) -> str:
    """The ``match_id`` of ``value``: 32 hex digits of SHA-256 over its canonical JSON.

    Examples
    --------
    >>> content_id(["metric", "m", 1, {"k": "x"}, 0, 60000, 0])
    '5f4a6c9c624c1809eb1aa26ccf9239ab'
    """
    return canonical_id(canonical_json(value, ascii_only=ascii_only))


def canonical_id(text: str) -> str:
    """The ``match_id`` of a value whose canonical JSON is ``text`` (for callers that already
    hold it: :func:`content_id` of the value is the same).

    Examples
    --------
    >>> canonical_id(canonical_json({"k": "x"})) == content_id({"k": "x"})
    True
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
