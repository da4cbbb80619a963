"""The match object every engine emits for a ``rule``: bound events, emitted values, times, id.

:func:`build_match` is the one place a :class:`Match` is made from a match's bound events (the
per-event runtime and the strict scan both call it). The JSON shape is shared by the embedded
engine and the Spark operator, and ``match_id`` is a deterministic hash so that retries and
replays of the same input deduplicate downstream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cep.events.identity import content_id, event_digest
from cep.nfa.compiler import CompiledRule
from cep.nfa.errors import RuleRuntimeError
from query_lang.timestamps import format_iso_ms

__all__ = ["Match", "build_match", "match_id_of"]


def match_id_of(
    rule: str,
    version: int,
    key: dict[str, Any],
    events: dict[str, list[Any]],
    digests: dict[str, list[str]] | None = None,
) -> str:
    """The deterministic id of a match (the scheme: :mod:`cep.events.identity`): its rule,
    version, key, and each bound event's id with its digest (``digests``, aligned with
    ``events``; without them, the ids alone).

    Examples
    --------
    >>> ev, dg = {"a": [1], "b": [2, 3]}, {"a": ["d1"], "b": ["d2", "d3"]}
    >>> a = match_id_of("r", 1, {"k": 1}, ev, dg)
    >>> a == match_id_of("r", 1, {"k": 1}, dict(reversed(ev.items())), dg)
    True
    >>> a == match_id_of("r", 1, {"k": 1}, ev, {**dg, "a": ["d9"]})
    False
    >>> len(a), a == match_id_of("r", 2, {"k": 1}, ev, dg)
    (32, False)
    """
    if digests is None:
        return content_id([rule, version, key, events], ascii_only=True)
    named = {
        var: [[ident, digest] for ident, digest in zip(ids, digests[var], strict=True)]
        for var, ids in events.items()
    }
    return content_id([rule, version, key, named], ascii_only=True)


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
    digests:
        Each bound event's digest (:func:`cep.events.identity.event_digest`), aligned with
        ``events``: with the ids, they name the events in the ``match_id``.
    unique_values:
        The values of the rule's ``unique`` expressions (JSON text), ``None`` without it;
        not part of the match's output.
    reported:
        Whether the rule's ``having`` holds for the match (True without one): a match for which
        it does not is not reported.
    """

    rule: str
    version: int
    key: dict[str, Any]
    events: dict[str, list[Any]]
    values: dict[str, Any]
    start_ms: int
    end_ms: int
    severity: str = "medium"
    digests: dict[str, list[str]] | None = None
    unique_values: str | None = field(default=None, compare=False, repr=False)
    reported: bool = field(default=True, compare=False, repr=False)

    @property
    def match_id(self) -> str:
        """32 hex digits of SHA-256 over rule name, version, key, and the bound events' ids
        and digests (:func:`match_id_of`)."""
        return match_id_of(self.rule, self.version, self.key, self.events, self.digests)

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


def build_match(
    rule: CompiledRule, key: tuple | None, word: Sequence[tuple[int, Any]], end_ms: int | None
) -> Match:
    """The :class:`Match` of ``rule`` that bound the events of ``word`` on a key.

    Parameters
    ----------
    rule:
        The compiled rule.
    key:
        The key's values (``RuleState.key``); when it does not cover every key name, the key
        is read from the first event's fields.
    word:
        The match's ``(place, event)`` pairs in order: a place of the pattern
        (:attr:`CompiledRule.places`) and an event with ``id``, ``stream``, ``ts`` and
        ``fields``.
    end_ms:
        The match's end (an absence deadline); ``None``: the last event's time.
    """
    names, places = rule.variables, rule.places
    declared = rule.identity_fields
    events: dict[str, list[Any]] = {}
    digests: dict[str, list[str]] = {}
    for place, event in word:
        var = names[places[place]]
        events.setdefault(var, []).append(event.id)
        fields = None if declared is None else declared.get(event.stream)
        digests.setdefault(var, []).append(
            event_digest(event.stream, event.ts, event.fields, fields)
        )
    first, last = word[0][1], word[-1][1]
    key_values = _key_values(rule, key, first)
    ctx = _MatchContext(rule, word)
    # What `emit`, `unique` and `having` read: the last event's fields, the key's filled in.
    having = rule.having
    current = (None if rule.emit is None and rule.unique is None and having is None
               else _current(key_values, last))
    values = dict(key_values) if rule.emit is None else _emit_values(rule, current, ctx)
    return Match(
        rule=rule.name,
        version=rule.version,
        key=key_values,
        events=events,
        values=values,
        start_ms=first.ts,
        end_ms=last.ts if end_ms is None else end_ms,
        severity=rule.severity,
        digests=digests,
        unique_values=None if rule.unique is None else _unique_values(rule, current, ctx),
        reported=True if having is None else _having(rule, current, ctx),
    )


class _MatchContext:
    """The ``MatchContext`` an ``emit`` expression sees: a match's bound events by variable,
    and its last event's time (what ``lookup`` reads a table as of)."""

    __slots__ = ("by_var", "last_ts")

    def __init__(self, rule: CompiledRule, word: Sequence[tuple[int, Any]]):
        names, places = rule.variables, rule.places
        by_var: dict[str, list[Mapping[str, Any]]] = {}
        for place, event in word:
            by_var.setdefault(names[places[place]], []).append(event.fields)
        self.by_var = by_var
        self.last_ts = word[-1][1].ts if word else None

    def time(self) -> int | None:
        return self.last_ts

    def bound(self, var: str) -> Sequence[Mapping[str, Any]]:
        return self.by_var.get(var, ())

    def prev(self, n: int = 1) -> None:
        return None


def _key_values(rule: CompiledRule, key: tuple | None, first: Any) -> dict[str, Any]:
    if key is not None and len(key) == len(rule.key_names):
        return dict(zip(rule.key_names, key, strict=True))
    names = rule.key_fields.get(first.stream, ())
    return {n: first.fields.get(f) for n, f in zip(rule.key_names, names, strict=False)}


def _having(rule: CompiledRule, current: dict[str, Any], ctx: _MatchContext) -> bool:
    """Whether a match's ``having`` holds (evaluated as ``emit`` is)."""
    try:
        return rule.having(current, ctx) is True
    except Exception as exc:
        raise RuleRuntimeError(f"rule {rule.name}: having failed on a match: {exc}") from exc


def _unique_values(rule: CompiledRule, current: dict[str, Any], ctx: _MatchContext) -> str:
    """A match's ``unique`` values as JSON text (evaluated as ``emit`` is)."""
    try:
        values = [fn(current, ctx) for fn in rule.unique]
    except Exception as exc:
        raise RuleRuntimeError(f"rule {rule.name}: unique failed on a match: {exc}") from exc
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False, default=str)


def _current(key: dict[str, Any], last: Any) -> dict[str, Any]:
    """The fields an expression over a match sees: the last event's, the key's filled in."""
    current = dict(last.fields)
    for name, value in key.items():
        current.setdefault(name, value)
    return current


def _emit_values(
    rule: CompiledRule, current: dict[str, Any], ctx: _MatchContext
) -> dict[str, Any]:
    """A match's ``emit`` values: each expression over ``current`` (:func:`_current`) and
    ``ctx``, the match's bound events."""
    values = {}
    for name, fn in rule.emit:
        try:
            values[name] = fn(current, ctx)
        except Exception as exc:
            raise RuleRuntimeError(
                f"rule {rule.name}: emit {name} failed on a match: {exc}"
            ) from exc
    return values
