"""The match object every engine emits for a ``rule``: bound events, emitted values, times, id.

The JSON shape is shared by the embedded engine and the Spark operator, and ``match_id`` is a
deterministic hash so that retries and replays of the same input deduplicate downstream.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from query_lang.timestamps import format_iso_ms

__all__ = ["Match", "match_id_of"]


def match_id_of(
    rule: str, version: int, key: dict[str, Any], events: dict[str, list[Any]]
) -> str:
    """The deterministic id of a match: sha256 over a canonical JSON, truncated to 32 hex chars.

    Examples
    --------
    >>> a = match_id_of("r", 1, {"k": 1}, {"a": [1], "b": [2, 3]})
    >>> a == match_id_of("r", 1, {"k": 1}, {"b": [2, 3], "a": [1]})
    True
    >>> len(a), a == match_id_of("r", 2, {"k": 1}, {"a": [1], "b": [2, 3]})
    (32, False)
    """
    canonical = json.dumps(
        [rule, version, key, events], sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Match:
    """One reported match of a rule on one partition key.

    Attributes
    ----------
    rule, version:
        The rule's name and version.
    key:
        Partition key, ``{field: value}``.
    events:
        Each bound variable's event ids, in event-time order (an absent ``!x`` binds nothing).
    values:
        The ``emit`` values by name; without ``emit``, the key fields.
    start_ms, end_ms:
        Event time of the first bound event, and of the last one (or the absence deadline).
    severity:
        The rule's severity.
    """

    rule: str
    version: int
    key: dict[str, Any]
    events: dict[str, list[Any]]
    values: dict[str, Any]
    start_ms: int
    end_ms: int
    severity: str = "medium"

    @property
    def match_id(self) -> str:
        """Hex of sha256 (truncated to 32 chars) of rule name, version, key and event ids."""
        return match_id_of(self.rule, self.version, self.key, self.events)

    def to_json(self) -> dict[str, Any]:
        """The match as a JSON-ready dict (the shape every engine emits)."""
        return {
            "kind": "rule",
            "name": self.rule,
            "version": self.version,
            "match_id": self.match_id,
            "key": dict(self.key),
            "events": {var: list(ids) for var, ids in self.events.items()},
            "values": dict(self.values),
            "start": format_iso_ms(self.start_ms),
            "end": format_iso_ms(self.end_ms),
            "severity": self.severity,
        }
