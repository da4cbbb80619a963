"""Fields of type ``json`` (objects, lists of objects, any JSON value): members read by dotted
names (``payload.user``, ``a.payload.user``, ``e.x.y``), conditions over the elements of a json
list (``any(e in payload.items: e.sku == "x")``), ``length`` of an object; the same values row
by row and column-wise, the checks' errors, and the embedded engine end to end (a rule, a
query searching the members by dotted names, a metric)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.engine.engine import Engine
from query_lang import check_program, parse_expr
from query_lang.ast import print_expr
from query_lang.compiler import Scope, compile_columns, compile_expr, referenced_fields

STREAM = ("stream e (id string, user string, n int, tags list<string>, payload json, "
          "ts timestamp) time ts\n")
SCOPE = Scope(streams={"e"})
EVENT = {
    "user": "ann",
    "payload": {
        "user": "ann", "depth": {"x": {"y": "deep"}}, "empty": {},
        "items": [{"sku": "a-1", "qty": 2, "tags": ["x", "y"]},
                  {"sku": "b-2", "qty": 5, "parts": [{"z": "ann"}, {"z": 3}]}],
    },
}


def values(text: str, events: list[dict[str, Any]]) -> list[Any]:
    """``text`` over ``events`` row by row, asserted equal to the column-wise values."""
    expr = parse_expr(text)
    rows = [compile_expr(expr, SCOPE)(event) for event in events]
    frame = pd.DataFrame({"payload": pd.Series([e.get("payload") for e in events], dtype=object),
                          "user": pd.Series([e.get("user") for e in events], dtype=object)})
    columns = compile_columns(expr, SCOPE)(frame).tolist()
    assert columns == rows, (text, rows, columns)
    return rows


@pytest.mark.parametrize(("text", "expected"), [
    ("payload.user", "ann"),
    ("payload.depth.x.y", "deep"),
    ("payload.depth.x.missing", None),
    ("payload.user.first", None),  # a string has no members
    ("payload.items.sku", None),  # nor has a list
    ("length(payload)", 4),
    ("length(payload.empty)", 0),
    ("length(payload.items)", 2),
    ('any(i in payload.items: i.sku == "b-2")', True),
    ('any(i in payload.items: i.sku == "c-3")', False),
    ("count(i in payload.items: i.qty > 1)", 2),
    ("any(i in payload.items: any(p in i.parts: p.z == user))", True),
    ("count(i in payload.items: any(p in i.parts: p.z == 3))", 1),
    ('any(i in payload.items: any(t in i.tags: t == "y"))', True),
    ("any(i in payload.user: true)", False),  # not a list: no elements
    ("payload.user == user", True),
])
def test_members_and_elements(text: str, expected: Any) -> None:
    assert values(text, [EVENT, EVENT]) == [expected, expected]


def test_missing_or_null_json_is_null_and_has_no_elements() -> None:
    events = [{"user": "u"}, {"user": "u", "payload": None}, {"user": "u", "payload": 7}]
    assert values("payload.user", events) == [None, None, None]
    assert values("any(i in payload.items: true)", events) == [False, False, False]
    assert values("count(i in payload.items: true)", events) == [0, 0, 0]
    assert values("length(payload)", events) == [None, None, None]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b", "ann"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["a", "b", "items", "user"]), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=6))
def test_row_and_column_evaluation_agree_on_any_json(payloads: list[Any]) -> None:
    events = [{"user": "ann", "payload": p} for p in payloads]
    for text in ("payload.a", "payload.a.b", "length(payload.items)",
                 'any(i in payload.items: i.user == user or i == "a")',
                 "count(i in payload: any(j in i.items: j.a == 1))",
                 "payload.user == user"):
        values(text, events)


def test_names_read_and_canonical_text() -> None:
    expr = parse_expr("any(i in payload.items: i.sku == user and any(p in i.parts: p.z.w))")
    assert referenced_fields(expr, SCOPE) == {"payload", "user"}
    for text in ("a.payload.user.name", "any(i in payload.items: i.sku == e.user)"):
        assert print_expr(parse_expr(text)) == text
        assert parse_expr(print_expr(parse_expr(text))) == parse_expr(text)


def check_errors(program: str) -> list[str]:
    _, errors = check_program(text=STREAM + program, text_path="f.vigil")
    return [e.message for e in errors]


@pytest.mark.parametrize(("program", "message"), [
    ("rule r from e pattern a define a as user.name == \"x\"",
     "'user' is a string; only a json value has members ('user.name')"),
    ("rule r from e pattern a define a as a.user.name == \"x\"",
     "'a.user' is a string; only a json value has members ('a.user.name')"),
    ("rule r from e pattern a define a as nothing.name == \"x\"",
     "'nothing' is neither a pattern variable, a stream of this rule nor a json field"),
    ("rule r from e pattern a define a as user in payload.items",
     "'payload.items' is not a declared list; the elements of a json list are read with "
     "any(x in payload.items: ...)"),
    ("rule r from e by payload pattern a define a as true",
     "partition key 'payload' is a json value in stream 'e'; a key holds single values"),
    ("rule r from e pattern a define a as any(e in payload.items: true)",
     "any(): the element name 'e' is already a stream here; choose another"),
    ("metric m from e by payload window tumbling 1m select count() as n",
     "cannot group by 'payload'"),
])
def test_misuse_is_a_check_error(program: str, message: str) -> None:
    errors = check_errors(program + "\n")
    assert any(message in e for e in errors), errors


PROGRAM = STREAM + """
rule same_user_basket from e by user
  pattern a b within 1m
  define a as payload.kind == "view",
         b as payload.kind == "buy" and b.payload.basket.user == a.payload.basket.user
              and any(i in payload.basket.items: i.sku == a.payload.sku and i.qty >= 2)
  emit a.payload.sku as sku, count(i in b.payload.basket.items: true) as lines

query u1_buys from e match payload.kind:buy AND payload.basket.user:u1

metric big_baskets from e
  where any(i in payload.basket.items: i.qty >= 2)
  window tumbling 1m
  select count() as n
"""


def _event(i: int, kind: str, sku: str, qty: int, who: str = "u1") -> dict[str, Any]:
    basket = {"user": who, "items": [{"sku": sku, "qty": qty}, {"sku": "other", "qty": 1}]}
    return {"id": f"e{i}", "user": "ann", "n": i, "tags": [], "ts": 1_767_225_600 + i,
            "payload": {"kind": kind, "sku": sku, "basket": basket}}


def test_a_program_over_json_events_end_to_end() -> None:
    events = [_event(1, "view", "s1", 0), _event(2, "buy", "s1", 2),  # a match
              _event(3, "view", "s2", 0), _event(4, "buy", "s2", 1),  # quantity too low
              _event(5, "view", "s3", 0), _event(6, "buy", "s3", 3, who="u2")]  # other user
    engine = Engine()
    engine.register(PROGRAM)
    for event in events:
        engine.feed(json.loads(json.dumps(event)))
    engine.close()
    found = engine.drain()
    rules = [m for m in found if m["name"] == "same_user_basket"]
    assert [(m["events"]["a"], m["events"]["b"], m["values"]) for m in rules] == [
        (["e1"], ["e2"], {"sku": "s1", "lines": 2})]
    # a query searches the members by their dotted names
    assert [m["document_id"] for m in found if m["name"] == "u1_buys"] == ["e2", "e4"]
    metric = [m for m in found if m["name"] == "big_baskets"]
    assert sum(m["values"]["n"] for m in metric) == 2  # e2 and e6


def test_a_frame_from_arrow_gives_the_same_matches() -> None:
    # Arrow's struct and list cells reach pandas as dicts holding numpy arrays: read as the
    # objects and lists of the same events given as JSON.
    import pyarrow as pa

    events = [_event(1, "view", "s1", 0), _event(2, "buy", "s1", 2), _event(3, "buy", "s2", 5)]
    found = []
    for feed in ("dicts", "arrow"):
        engine = Engine()
        engine.register(PROGRAM)
        if feed == "dicts":
            for event in events:
                engine.feed(event)
        else:
            engine.feed_batch(pa.Table.from_pylist(events).to_pandas())
        engine.close()
        found.append(sorted((m["name"], m["match_id"]) for m in engine.drain()))
    assert found[0] == found[1]
    assert {name for name, _ in found[0]} == {"same_user_basket", "u1_buys", "big_baskets"}
