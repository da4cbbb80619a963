"""The webhook payload: a Standard Webhooks ``{type, timestamp, data}`` envelope around a match."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .errors import InvalidMatchError

__all__ = ["MATCH_EVENT_TYPE", "envelope_body", "checked_match_id"]

MATCH_EVENT_TYPE = "vigil.match"
# webhook-id travels in a header and in the signed string: printable ASCII without spaces.
_MSG_ID = re.compile(r"[!-~]{1,256}")
_EVENT_TYPE = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def checked_match_id(match: Mapping[str, Any]) -> str:
    """Return the match's deterministic ``match_id``, which becomes the ``webhook-id``.

    Raises
    ------
    InvalidMatchError
        If the match is not a mapping or its ``match_id`` is missing or not header-safe.
    """
    if not isinstance(match, Mapping):
        raise InvalidMatchError(f"a match must be a JSON object, got {type(match).__name__}")
    match_id = match.get("match_id")
    if not isinstance(match_id, str) or not _MSG_ID.fullmatch(match_id):
        raise InvalidMatchError(
            "a match needs a 'match_id' of 1-256 printable ASCII characters without spaces,"
            f" got {match_id!r:.60}"
        )
    return match_id


def envelope_body(
    match: Mapping[str, Any], *, event_type: str = MATCH_EVENT_TYPE, created_at: float
) -> bytes:
    """Serialise the envelope sent for ``match``; the bytes are stored once and re-sent as is.

    The envelope ``timestamp`` is the match's ``end`` when it has one (so the payload depends
    on the match alone), otherwise ``created_at`` (unix seconds) in ISO 8601.

    Examples
    --------
    >>> envelope_body({"match_id": "m1", "end": "2026-01-01T00:00:00Z"}, created_at=0.0)
    b'{"type":"vigil.match","timestamp":"2026-01-01T00:00:00Z","data":{"match_id":"m1","end":"2026-01-01T00:00:00Z"}}'
    """  # noqa: E501
    checked_match_id(match)
    if not _EVENT_TYPE.fullmatch(event_type):
        raise InvalidMatchError(f"event type {event_type!r:.60} must match {_EVENT_TYPE.pattern}")
    end = match.get("end")
    if isinstance(end, str) and end:
        timestamp = end
    else:
        timestamp = datetime.fromtimestamp(created_at, UTC).isoformat().replace("+00:00", "Z")
    envelope = {"type": event_type, "timestamp": timestamp, "data": dict(match)}
    try:
        text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMatchError(
            f"match {match['match_id']!r} is not JSON-serialisable: {exc}"
        ) from exc
    return text.encode("utf-8")
