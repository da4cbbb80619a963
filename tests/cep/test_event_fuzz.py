"""Fuzz the event path: random input files (good events mixed with deep, wide, non-finite,
non-UTF-8, wrongly typed, huge, far-in-time and random lines) through ``vigil run``
(embedded, column-wise) and ``Engine.feed_record`` (one event at a time).

Whatever the lines hold: no exception escapes; output is JSON; every line is counted once, as
accepted, late or dead-lettered (with the same reason on both paths); and the matches are
those of a run over the accepted and late lines alone. ``VIGIL_FUZZ_EXAMPLES`` raises the
number of examples (default small, for CI's time budget)."""

from __future__ import annotations

import json
from collections import Counter

from event_lines import EXAMPLES, PROGRAM, event_file
from hypothesis import HealthCheck, given, settings

from cep.cli import main
from cep.engine import Engine
from cep.events.limits import line_text

FUZZ = settings(
    max_examples=EXAMPLES, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)


def _strict_json(line: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def _cli(tmp_path, lines: list[bytes]) -> tuple[list[dict], list[dict], str]:
    rules = tmp_path / "p.vigil"
    rules.write_text(PROGRAM)
    events, out, dead = tmp_path / "events.jsonl", tmp_path / "out.jsonl", tmp_path / "dead.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    code = main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(out), "--dead-letter", str(dead)])
    assert code == 0
    # One record a line: split at line feeds only (a raw may hold U+0085 or U+2028).
    matches = [_strict_json(line) for line in out.read_text("utf-8").split("\n") if line]
    letters = [_strict_json(line) for line in dead.read_text("utf-8").split("\n") if line]
    return matches, letters


def _engine(lines: list[bytes]) -> tuple[list[dict], list[dict], Engine]:
    """One line at a time, numbered as ``vigil run`` numbers them (from 1, blank ones too)."""
    engine = Engine()
    engine.register(PROGRAM)
    position = 0
    for number, data in enumerate(lines, start=1):
        text = line_text(data)
        if text:
            engine.feed_record(text, line=number, position=position)
            position += 1
    engine.close()
    matches, letters = engine.drain(), engine.dead_letters()
    for record in [*matches, *letters]:
        json.dumps(record, allow_nan=False).encode("utf-8")  # JSON, and UTF-8 can hold it
    return matches, letters, engine


def _reasons(letters: list[dict]) -> Counter:
    # A missing key names no line (it is found once the event is released to its rule): the
    # event's id says which.
    return Counter(
        (d["event"].get("id") if d["reason"] == "missing_key" else d["line"], d["reason"])
        for d in letters
    )


def _ids(matches: list[dict], kinds=("rule", "query", "metric")) -> list[str]:
    return sorted(m["match_id"] for m in matches if m["kind"] in kinds)


@FUZZ
@given(lines=event_file())
def test_every_line_is_a_match_a_dead_letter_or_late(tmp_path_factory, lines) -> None:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    received = sum(1 for data in lines if line_text(data))
    matches, letters = _cli(tmp_path, lines)
    one_by_one, letters_one_by_one, engine = _engine(lines)

    # Both paths dead-letter the same lines for the same reasons, and report the same matches.
    assert _reasons(letters) == _reasons(letters_one_by_one)
    assert _ids(matches) == _ids(one_by_one)

    # Every line counted once: accepted, late or dead-lettered. A missing key is found after
    # acceptance (the rule skips the event, queries and metrics see it) and names no line.
    stats = engine.stats
    missing_key = sum(1 for d in letters_one_by_one if d["reason"] == "missing_key")
    assert stats.events == received and stats.unkeyed == missing_key
    assert stats.accepted + stats.late + stats.bad == received
    numbered = [d["line"] for d in letters_one_by_one if d["reason"] != "missing_key"]
    assert len(numbered) == len(set(numbered)) == stats.late + stats.bad

    # The accepted and late lines alone give the same matches, on each path: a bad line
    # changes nothing.
    refused = {d["line"] for d in letters if d["reason"] not in ("late", "missing_key")}
    kept = [data for number, data in enumerate(lines, start=1) if number not in refused]
    alone, letters_alone = _cli(tmp_path_factory.mktemp("alone"), kept)
    assert _ids(alone) == _ids(matches)
    assert all(d["reason"] in ("late", "missing_key") for d in letters_alone)
    alone, letters_alone, _ = _engine(kept)
    assert _ids(alone) == _ids(one_by_one)
    assert all(d["reason"] in ("late", "missing_key") for d in letters_alone)
