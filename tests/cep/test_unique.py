"""A rule's ``unique``: only the first match per key and distinct values is reported (again
once ``for D`` has passed), held to a reference filter over the same rule without ``unique``:
fed row by row, in random batches, and resumed from a checkpoint at a random point."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from arrivals import arriving
from batch_splits import feed_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.engine import Engine
from query_lang.loader import check_program

LATENESS_S = 5
SPANS = {"forever": None, "short": 20_000, "long": 90_000}


def _pair(name: str, body: str, values: str, span: int | None) -> str:
    """Two copies of a rule: ``NAME_all`` emitting ``values``, and ``NAME`` with ``unique``
    over the same expressions."""
    exprs = ", ".join(v.split(" as ")[0] for v in values.split(", "))
    unique = f"unique {exprs}" + ("" if span is None else f" for {span // 1000}s")
    return (f"rule {name}_all from proc by host {body}\n  emit {values}\n"
            f"rule {name} from proc by host {body}\n  emit {values}\n  {unique}\n")


PROGRAM = (
    f"stream proc (pid string, host string, name string, parent string, ts timestamp)\n"
    f"  time ts lateness {LATENESS_S}s id pid\n"
    + "".join(
        _pair(f"pair_{label}", "pattern a b within 30s define a as name != \"x\", b as true",
              "lower(a.name) as n, b.parent as p", span)
        + _pair(f"quiet_{label}",
                "pattern a !c within 15s define a as name != \"x\", c as name == \"x\"",
                "a.parent as p", span)
        + _pair(f"one_{label}", "pattern a define a as true", "lower(a.name) as n", span)
        + _pair(f"strict_{label}", "pattern a b contiguity strict "
                "define a as name != \"x\", b as name == \"b.exe\"", "a.parent as p", span)
        for label, span in SPANS.items()
    )
)


@st.composite
def events(draw):
    return arriving(draw, lambda i, ts: {
        "pid": f"e{i}", "host": draw(st.sampled_from(("h1", "h2"))),
        "name": draw(st.sampled_from(("a.exe", "A.EXE", "b.exe", "x"))),
        "parent": draw(st.sampled_from(("p1", "p2", None))), "ts": ts,
    }, LATENESS_S, 60, 300)


def _identity(match: dict) -> tuple:
    return (json.dumps(match["key"], sort_keys=True), json.dumps(match["events"], sort_keys=True),
            json.dumps(match["values"], sort_keys=True))


def reference(matches: list[dict]) -> dict[str, set]:
    """Each unique rule's reported matches: its ``_all`` twin's, in report order, kept when no
    kept match of the key with the same values ended less than the span before."""
    kept: dict[str, set] = {}
    last: dict[tuple, int] = {}
    for m in matches:
        if not m["name"].endswith("_all"):
            continue
        rule = m["name"][: -len("_all")]
        span = SPANS[rule.split("_")[1]]
        seen = (rule, json.dumps(m["key"], sort_keys=True),
                json.dumps(m["values"], sort_keys=True))
        end = _ms(m["end"])
        if seen in last and (span is None or end < last[seen] + span):
            continue
        last[seen] = end
        kept.setdefault(rule, set()).add(_identity(m))
    return kept


def _ms(iso: str) -> int:
    return int(pd.Timestamp(iso).value // 1_000_000)


def outcome(matches: list[dict]) -> dict[str, set]:
    got: dict[str, set] = {}
    for m in matches:
        if not m["name"].endswith("_all"):
            got.setdefault(m["name"], set()).add(_identity(m))
    return got


def test_the_program_is_valid():
    assert check_program(text=PROGRAM)[1] == []


def engine() -> Engine:
    e = Engine()
    e.register(PROGRAM)
    return e



@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=events(), cuts=st.lists(st.integers(0, 80), max_size=4), stop=st.integers(0, 80))
def test_unique_reports_the_first_match_per_key_and_values_however_fed(rows, cuts, stop):
    one = engine()
    for row in rows:
        one.feed(row)
    one.close()
    everything = one.drain()
    expected = reference(everything)
    assert outcome(everything) == expected
    held = sum(1 for m in everything if m["name"].endswith("_all")) - sum(
        1 for m in everything if not m["name"].endswith("_all"))
    assert sum(one.stats.suppressed.values()) == held

    batched = engine()
    feed_batches(batched, rows, cuts)
    batched.close()
    assert outcome(batched.drain()) == expected

    stop %= len(rows) + 1
    first = engine()
    feed_batches(first, rows[:stop], cuts)
    before = first.drain()
    resumed = engine()
    resumed.restore(first.snapshot())
    for row in rows[stop:]:
        resumed.feed(row)
    resumed.close()
    assert outcome(before + resumed.drain()) == expected
    assert resumed.stats.suppressed == one.stats.suppressed


def test_unique_values_are_per_key_and_forgotten_after_for():
    e = Engine()
    e.register(
        "stream proc (host string, name string, ts int) time ts unit ms lateness 0s\n"
        "rule first from proc by host pattern a define a as true unique lower(a.name) for 10s\n"
    )
    for host, name, ts in [("h1", "A", 0), ("h1", "a", 1_000), ("h2", "a", 2_000),
                           ("h1", "a", 9_999), ("h1", "a", 10_000), ("h1", "b", 10_500)]:
        e.feed({"host": host, "name": name, "ts": ts})
    e.close()
    got = [(m["key"]["host"], m["start"][-13:-1]) for m in e.drain()]
    assert got == [("h1", "00:00:00.000"), ("h2", "00:00:02.000"), ("h1", "00:00:10.000"),
                   ("h1", "00:00:10.500")]
    assert e.stats.suppressed == {"first": 2}


def test_a_changed_unique_starts_afresh_and_an_unchanged_rule_keeps_its_values():
    head = "stream proc (host string, name string, ts int) time ts unit ms lateness 0s\n"
    rule = "rule first from proc by host pattern a define a as true unique a.name{}\n"
    e = Engine()
    e.register(head + rule.format(""))
    e.feed({"host": "h", "name": "a", "ts": 0})
    snapshot = e.snapshot()
    for suffix, expected in [("", 0), (" for 1h", 1)]:
        resumed = Engine()
        resumed.register(head + rule.format(suffix))
        resumed.restore(snapshot)
        resumed.drain()
        resumed.feed({"host": "h", "name": "a", "ts": 1})
        resumed.close()
        assert len(resumed.drain()) == expected, suffix


@pytest.mark.parametrize(
    ("clause", "message"),
    [
        ("unique a.nope", "nope"),
        ("unique b.name", "'b'"),
        ("unique a.name for 0s", "unique ... for must be longer than zero"),
    ],
)
def test_misuse_is_an_error_naming_what_and_where(clause, message):
    text = ("stream proc (host string, name string, ts timestamp)\n"
            f"rule r from proc by host pattern a define a as true\n  {clause}\n")
    _, errors = check_program(text=text)
    assert any(message in e.message for e in errors), [str(e) for e in errors]
    assert all(e.line == 3 for e in errors), [str(e) for e in errors]
