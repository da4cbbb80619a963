"""Partition keys: the rule's ``by`` (per stream) and per-variable ``by`` (EQL join keys)."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cep.events.event import Event
from cep.nfa.compiler import compile_rule
from cep.nfa.runtime import advance_watermark, new_state, process_event
from query_lang import ast
from query_lang.parser import parse

PROCS = """
stream proc (host string, pid int, ppid int, name string, ts timestamp) time ts
rule shell_spawns_ps from proc by host
  pattern parent child
  define parent as name == "bash" by pid,
         child  as name == "ps" by ppid
"""

ORDERS = """
stream orders (id string, ts timestamp) time ts
stream payments (order_id string, ts timestamp) time ts
rule paid from orders, payments by orders.id = payments.order_id
  pattern o p define o as orders, p as payments
"""


def compiled(text):
    module = parse(text)
    streams = {d.name: d for d in module.of_type(ast.StreamDecl)}
    return compile_rule(module.of_type(ast.RuleDecl)[0], streams=streams)


def test_per_variable_keys_follow_a_process_to_its_child():
    rule = compiled(PROCS)
    assert rule.key_names == ("host", "pid")
    rows = [
        {"host": "h", "pid": 10, "ppid": 1, "name": "bash", "ts": 1},
        {"host": "h", "pid": 11, "ppid": 99, "name": "ps", "ts": 2},  # another parent's child
        {"host": "h", "pid": 12, "ppid": 10, "name": "ps", "ts": 3},
    ]
    by_key: dict[tuple, list] = {}
    for i, row in enumerate(rows):
        for key in rule.keys_of("proc", row):
            by_key.setdefault(key, []).append(Event(i, "proc", row["ts"], i, row))
    assert set(by_key) == {("h", 10), ("h", 1), ("h", 11), ("h", 99), ("h", 12)}
    found = []
    for key, evs in by_key.items():
        state = new_state(rule, key)
        for e in evs:
            found += process_event(rule, state, e)
        found += advance_watermark(rule, state, math.inf)
    assert [(m.key, m.events) for m in found] == [
        ({"host": "h", "pid": 10}, {"parent": [0], "child": [2]}),
    ]


def test_keys_named_differently_per_stream():
    rule = compiled(ORDERS)
    assert rule.key_fields == {"orders": ("id",), "payments": ("order_id",)}
    assert rule.keys_of("payments", {"order_id": "A"}) == [("A",)]
    state = new_state(rule)
    out = process_event(rule, state, Event("o", "orders", 1, 0, {"id": "A", "ts": 1}))
    out += process_event(rule, state, Event("p", "payments", 2, 1, {"order_id": "A", "ts": 2}))
    assert [(m.key, m.events) for m in out] == [({"id": "A"}, {"o": ["o"], "p": ["p"]})]



EXPRESSION_KEYS = """
stream proc (host string, pid int, ppid int, name string, user string, ts timestamp) time ts
rule doubled from proc by host
  pattern parent child
  define parent as name == "bash" by pid * 2,
         child  as name == "ps" by (ppid * 2)
rule plain from proc by host
  pattern parent child
  define parent as name == "bash" by pid,
         child  as name == "ps" by ppid
rule same_user from proc
  pattern a b
  define a as name == "login" by lower(user),
         b as name == "sudo" by lower(user)
"""


def test_step_keys_that_are_expressions():
    """A step's key may be an expression of its event's fields: ``by pid * 2`` joins as
    ``by pid`` does, its value named by its text; ``lower(user)`` joins users ignoring case.
    """
    from cep.engine import Engine

    rows = [
        {"host": "h", "pid": 10, "ppid": 1, "name": "bash", "user": "Ann", "ts": 1},
        {"host": "h", "pid": 11, "ppid": 99, "name": "ps", "user": "x", "ts": 2},
        {"host": "h", "pid": 12, "ppid": 10, "name": "ps", "user": "x", "ts": 3},
        {"host": "h", "pid": 13, "ppid": 1, "name": "login", "user": "Ann", "ts": 4},
        {"host": "g", "pid": 14, "ppid": 1, "name": "sudo", "user": "bob", "ts": 5},
        {"host": "g", "pid": 15, "ppid": 1, "name": "sudo", "user": "ANN", "ts": 6},
    ]
    engine = Engine()
    engine.register(EXPRESSION_KEYS)
    for i, row in enumerate(rows):
        engine.feed({"stream": "proc", "_seq": i, **row})
    engine.close()
    found = sorted((m["name"], m["key"], m["events"]) for m in engine.drain())
    assert found == [
        ("doubled", {"host": "h", "pid * 2": 20}, {"parent": [0], "child": [2]}),
        ("plain", {"host": "h", "pid": 10}, {"parent": [0], "child": [2]}),
        ("same_user", {"lower(user)": "ann"}, {"a": [3], "b": [5]}),
    ]
    rule = compiled(EXPRESSION_KEYS)
    assert rule.key_fields == {"proc": ("host",)}
    assert rule.keys_of("proc", rows[2]) == [("h", 24), ("h", 20)]


def test_an_event_whose_step_keys_are_all_null_is_a_missing_key_naming_them():
    from cep.engine import Engine

    engine = Engine()
    engine.register(EXPRESSION_KEYS.split("rule plain")[0])
    engine.feed({"stream": "proc", "_seq": 0, "host": "h", "name": "bash", "user": "u", "ts": 1})
    engine.close()
    (letter,) = engine.drain_dead_letters()
    assert letter["reason"] == "missing_key"
    assert letter["detail"] == ("every step's key of this event is missing or null "
                                "(pid * 2; ppid * 2) (rules: doubled)")


KEYED = """
stream proc (host string, pid int, ppid int, name string, user string, ts timestamp) time ts
  lateness 3s
rule tree from proc by host
  pattern parent child+ other
  contiguity {contiguity}
  define parent as name == "a" by {parent},
         child  as name == "b" by {child},
         other  as name == "c" by {child}
  within 10s
"""


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from("ab c"), st.integers(0, 6), st.integers(0, 6),
                            st.integers(0, 2)), max_size=25),
    contiguity=st.sampled_from(["relaxed", "any", "any for child"]),
    keys=st.sampled_from([("pid * 2", "ppid * 2"), ("concat(pid)", "concat(ppid)"),
                          ("(pid, pid + 1)", "(ppid, ppid + 1)")]),
)
def test_expression_keys_join_as_the_fields_they_are_computed_from(rows, contiguity, keys):
    """Keys computed one-to-one from a field bind the same events as the field itself."""
    from cep.engine import Engine

    def matches(parent: str, child: str) -> list:
        engine = Engine()
        engine.register(KEYED.format(contiguity=contiguity, parent=parent, child=child))
        for i, (name, pid, ppid, lag) in enumerate(rows):
            engine.feed({"stream": "proc", "_seq": i, "host": "h", "pid": pid, "ppid": ppid,
                         "name": name, "user": "u", "ts": 10 * i - lag})
        engine.close()
        return sorted(json.dumps(m["events"], sort_keys=True) for m in engine.drain())

    assert matches(*keys) == matches("pid", "ppid")
