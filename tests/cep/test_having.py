"""A rule's ``having``: a filter over its matches, evaluated as ``emit`` is, that changes
nothing else — held to the same rule without ``having`` filtered afterwards, fed row by row, in
random batches and resumed from a checkpoint at a random point; before ``unique``."""

from __future__ import annotations

import json

from arrivals import arriving
from batch_splits import feed_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.engine import Engine
from query_lang.loader import check_program

LATENESS_S = 5
STREAM = ("stream q (id string, sym string, price int, ts timestamp)\n"
          f"  time ts lateness {LATENESS_S}s id id\n")
# Each rule twice: NAME_all without `having` (its emits carry what `having` reads), and NAME.
RULES = {
    # the filter reads two variables: a filtered match still consumed a and b
    "rise": ("pattern a b within 30s define a as price > 0, b as price > 0",
             "a.price as before, b.price as after", "b.price > a.price"),
    # an aggregate over a quantified variable, and the last event's field
    "run": ("pattern a b+ c within 60s define a as price < 5, b as price >= 5, c as price < 5",
            "count(b) as n, c.price as last", "count(b) >= 2 and price <= 2"),
    # a strict sequence (the scan path)
    "step": ("pattern a b contiguity strict define a as price > 3, b as price > 3",
             "b.price - a.price as d", "b.price - a.price == 1"),
}


def _program() -> str:
    out = [STREAM]
    for name, (body, emit, having) in RULES.items():
        out.append(f"rule {name}_all from q by sym {body}\n  emit {emit}\n")
        out.append(f"rule {name} from q by sym {body}\n  emit {emit}\n  having {having}\n")
    return "".join(out)


def _keeps(name: str, values: dict) -> bool:
    if name == "rise":
        return values["after"] > values["before"]
    if name == "run":
        return values["n"] >= 2 and values["last"] <= 2
    return values["d"] == 1


@st.composite
def quotes(draw):
    return arriving(draw, lambda i, ts: {"id": f"e{i}", "sym": draw(st.sampled_from(("x", "y"))),
                                         "price": draw(st.integers(1, 9)), "ts": ts},
                    LATENESS_S, 60, 200)


def _split(matches: list[dict]) -> tuple[dict, dict]:
    """Per rule, its matches (as text), and the `_all` twins' filtered by hand."""
    got: dict[str, list] = {name: [] for name in RULES}
    expected: dict[str, list] = {name: [] for name in RULES}
    for m in matches:
        text = json.dumps({**m, "name": m["name"].removesuffix("_all"), "match_id": None},
                          sort_keys=True)
        if m["name"].endswith("_all"):
            name = m["name"].removesuffix("_all")
            if _keeps(name, m["values"]):
                expected[name].append(text)
        else:
            got[m["name"]].append(text)
    return got, expected


def _run(rows: list[dict], cuts: list[int] | None, stop: int | None = None) -> list[dict]:
    engine = Engine()
    engine.register(_program())
    if cuts is not None:
        feed_batches(engine, rows, cuts)
        engine.close()
        return engine.drain()
    for row in rows[:stop]:
        engine.feed(row)
    first = engine.drain()
    resumed = Engine()
    resumed.register(_program())
    resumed.restore(engine.snapshot())
    for row in rows[stop:]:
        resumed.feed(row)
    resumed.close()
    return first + resumed.drain()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=quotes(), cuts=st.lists(st.integers(0, 60), max_size=4), stop=st.integers(0, 60))
def test_having_filters_the_matches_of_the_same_rule_and_changes_nothing_else(rows, cuts, stop):
    for matches in (_run(rows, []), _run(rows, cuts), _run(rows, None, stop % (len(rows) + 1))):
        got, expected = _split(matches)
        for name in RULES:
            assert sorted(got[name]) == sorted(expected[name]), name
    # match ids name the same events as the twin's (only the rule's name differs)
    assert all(m["match_id"] for m in _run(rows, []))


def test_having_applies_before_unique():
    engine = Engine()
    engine.register(STREAM + """
rule rise from q by sym
  pattern a b
  define a as true, b as true
  emit b.price as after
  unique b.price
  having b.price > a.price
""")
    prices = [5, 3, 4, 3, 2, 3, 1, 3]  # pairs (5,3) (4,3) (2,3) (1,3): the first two filtered
    for i, price in enumerate(prices):
        engine.feed({"id": f"e{i}", "sym": "x", "price": price, "ts": i})
    engine.close()
    # (2,3) is the first reported with after=3, (1,3) the second: held back by unique
    assert [m["events"] for m in engine.drain()] == [{"a": ["e4"], "b": ["e5"]}]
    assert engine.stats.suppressed == {"rise": 1}


def test_having_must_be_a_condition():
    _, errors = check_program(
        text=STREAM + "rule r from q by sym pattern a b define a as true, b as true "
                      "having b.price - a.price\n", text_path="f.vigil")
    assert [e.message for e in errors] == [
        "the having of rule 'r' must be true or false, not an int"]
