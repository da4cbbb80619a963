"""The registry changes both engines' live-change tests make: version 1 of a program, then
(between two files of events) `small` replaced, `gone` removed and `fresh` added, while `big`
and `twice` run on; `twice` has a partial match spanning the two files. ``expected`` gives what
an embedded engine given those changes at that place matches."""

from __future__ import annotations

import json
from pathlib import Path

from cep.engine import Engine
from cep.registry import Registry

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z

STREAM = "stream txn (card_id string, amount float, ts timestamp) time ts\n"
V1 = STREAM + """
rule big from txn by card_id pattern b define b as amount > 100
rule twice from txn by card_id pattern a b define a as amount > 100, b as amount > 100
rule small from txn by card_id pattern s define s as amount < 10
rule gone from txn by card_id pattern g define g as amount > 300
"""
# Version 2 replaces `small` (another threshold), removes `gone`, adds `fresh`; `twice`'s
# partial matches from the first file complete in the second.
SMALL_2 = "rule small from txn by card_id pattern s define s as amount < 6\n"
FRESH = "rule fresh from txn by card_id pattern a b define a as amount < 10, b as amount > 100\n"

AMOUNTS_1 = [500, 5, 500, 7, 3, 200, 8]
AMOUNTS_2 = [400, 4, 150, 9, 600, 2]


def lines(amounts: list[float], start: int) -> list[str]:
    return [
        json.dumps({"card_id": f"c{(start + i) % 3}", "amount": a, "ts": T0 + start + i}) + "\n"
        for i, a in enumerate(amounts)
    ]


def key(match: dict) -> tuple:
    return (match["name"], match["match_id"], json.dumps(match["events"], sort_keys=True))


def expected() -> tuple[set[tuple], set[tuple]]:
    """(matches with the changes applied between the files, matches of a run without them)."""
    first, second = lines(AMOUNTS_1, 0), lines(AMOUNTS_2, len(AMOUNTS_1))

    def run(change: bool) -> set[tuple]:
        engine = Engine()
        engine.register(V1)
        for position, line in enumerate(first):
            engine.feed(json.loads(line), position=position)
        if change:
            engine.unregister("small")
            engine.unregister("gone")
            engine.register(SMALL_2 + FRESH)
        for position, line in enumerate(second, start=len(first)):
            engine.feed(json.loads(line), position=position)
        engine.close()
        return {key(m) for m in engine.drain()}

    return run(True), run(False)


def first_file_matches() -> set[tuple]:
    engine = Engine()
    engine.register(V1)
    for position, line in enumerate(lines(AMOUNTS_1, 0)):
        engine.feed(json.loads(line), position=position)
    return {key(m) for m in engine.drain()}


def push_changes(registry_path: Path, work: Path) -> None:
    """Make the change in the registry: `gone` removed (version 2), then `small` replaced and
    `fresh` added (version 3)."""
    changes = work / "v2.vigil"
    changes.write_text(STREAM + SMALL_2 + FRESH)
    with Registry(registry_path) as registry:
        registry.remove(["gone"])
        registry.push([str(changes)])
        assert registry.version == 3
