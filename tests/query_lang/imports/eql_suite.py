"""The ``eql`` package's own conformance suite (``etc/test_queries.toml`` over
``etc/test_data.json``) run through ``vigil import eql`` and the embedded engine.

Each case runs in the case mode it declares (``case_insensitive = true``: the package's engine;
otherwise case-sensitive, which the suite says gives the same events for unmarked cases). A
case the importer accepts must return exactly the expected event ids, sequence by sequence in
order. A case refused only for ``| head`` / ``| tail`` is also run with those pipes ignored by
the importer and applied here to Vigil's matches in their order: that checks the sequence
semantics (and ``maxspan``) of the cases that use them.

Run ``python tests/query_lang/imports/eql_suite.py`` for the table of docs/import.md.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import eql

from cep.engine import Engine
from query_lang.imports.eql import EqlOptions, EqlSource, import_eql, parse_eql

ETC = os.path.join(os.path.dirname(eql.__file__), "etc")
_FILETIME_EPOCH = 116444736000000000  # 1970-01-01 in 100 ns ticks since 1601
_NOW_MS = 2 * 10**12  # a wall clock after every event of the suite


@dataclass
class Outcome:
    index: int
    query: str
    kind: str  # "event" or "sequence" (joins count as sequences of the suite's kind "join")
    accepted: bool
    passed: bool = False
    reason: str = ""
    detail: str = ""
    pipes_applied: bool = False


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, kind: str | None = None, **flags: bool) -> int:
        return sum(
            1 for o in self.outcomes
            if (kind is None or o.kind == kind)
            and all(getattr(o, k) == v for k, v in flags.items())
        )

    def reasons(self) -> collections.Counter[str]:
        return collections.Counter(o.reason for o in self.outcomes if not o.accepted)


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "list<string>"
    if isinstance(value, dict | list):
        return "json"
    return None


def load_suite() -> tuple[list[dict], list[dict], dict[str, dict[str, str]]]:
    """The cases, the events as Vigil events, and the schema their values imply."""
    with open(os.path.join(ETC, "test_queries.toml"), "rb") as handle:
        cases = tomllib.load(handle)["queries"]
    with open(os.path.join(ETC, "test_data.json"), encoding="utf-8") as handle:
        data = json.load(handle)
    schema: dict[str, dict[str, str]] = collections.defaultdict(dict)
    events = []
    for raw in data:
        for name, value in raw.items():
            if name != "timestamp" and _kind(value):
                schema[raw["event_type"]][name] = _kind(value)
        ms = (raw["timestamp"] - _FILETIME_EPOCH) // 10_000
        when = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
        events.append({**raw, "stream": raw["event_type"],
                       "timestamp": when.replace("+00:00", "Z")})
    return cases, events, dict(schema)


def _sequences(text: str, events: list[dict]) -> list[list[int]]:
    engine = Engine(now_ms=_NOW_MS)
    engine.register(text)
    for event in events:
        engine.feed(event)
    engine.close()
    found = []
    for match in engine.drain():
        bound = match["events"]
        ordered = sorted(bound, key=lambda v: int(v[1:]) if v[1:].isdigit() else 0)
        found.append([i for v in ordered for i in bound[v]])
    return found


def _apply_pipes(query: str, results: list[list[int]], dialect: str) -> list[list[int]]:
    for pipe in parse_eql(query, dialect=dialect).query.pipes:
        if type(pipe).name not in ("head", "tail"):
            continue  # a filter before them is part of the rule
        n = pipe.arguments[0].value if pipe.arguments else 10
        results = results[:n] if type(pipe).name == "head" else results[-n:]
    return results


def run_suite() -> Report:
    cases, events, schema = load_suite()
    report = Report()
    for index, case in enumerate(cases):
        query = case["query"]
        first_word = query.split()[0]
        kind = "event" if first_word not in ("sequence", "join") else first_word
        options = EqlOptions(
            dialect="classic", case_sensitive=not case.get("case_insensitive", False),
            schema=schema, id_field="serial_event_id", lateness="1m",
            any_streams=tuple(sorted(schema)),
        )
        source = EqlSource(f"test_queries.toml#{index}", query)
        result = import_eql([source], options)
        outcome = Outcome(index, query, kind, accepted=not result.errors)
        expected = case["expected_event_ids"]
        if result.errors:
            outcome.reason = result.errors[0].construct
            outcome.detail = result.errors[0].message
            if outcome.reason in ("pipe head", "pipe tail"):
                retry = import_eql([source], EqlOptions(**{
                    **options.__dict__, "ignore_pipes": frozenset({"head", "tail"})}))
                if not retry.errors:
                    found = _apply_pipes(query, _sequences(retry.text, events), "classic")
                    outcome.pipes_applied = True
                    outcome.passed = [i for s in found for i in s] == expected
                    if not outcome.passed:
                        outcome.detail = f"head/tail applied: got {found}, expected {expected}"
        else:
            found = _sequences(result.text, events)
            outcome.passed = [i for s in found for i in s] == expected
            if not outcome.passed:
                outcome.detail = f"got {found}, expected {expected}\n{result.text}"
        report.outcomes.append(outcome)
    return report


def main() -> int:
    report = run_suite()
    total = len(report.outcomes)
    print(f"{total} cases")
    for kind in ("event", "sequence", "join"):
        print(f"  {kind}: {report.count(kind)} cases, {report.count(kind, accepted=True)} "
              f"accepted, {report.count(kind, accepted=True, passed=True)} passing; "
              f"{report.count(kind, pipes_applied=True)} more run with head/tail applied by "
              f"the harness, {report.count(kind, pipes_applied=True, passed=True)} passing")
    print("refused, by construct:")
    for reason, n in report.reasons().most_common():
        print(f"  {n:3d}  {reason}")
    failures = [o for o in report.outcomes if (o.accepted or o.pipes_applied) and not o.passed]
    for o in failures:
        print(f"FAILED #{o.index}: {o.query.strip()}\n{o.detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
