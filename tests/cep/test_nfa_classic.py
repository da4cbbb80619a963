"""The classic CEP cases end to end: parsed rule text, the real expression compiler, the runtime.

V-shaped ticker (the MATCH_RECOGNIZE example of the Flink documentation), card testing, an
unpaid order (trailing absence) and impossible travel.
"""

from __future__ import annotations

import math

import pytest

from cep.events.event import Event
from cep.nfa.compiler import compile_rule
from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event
from query_lang import ast
from query_lang.parser import parse

MINUTE = 60_000
T0 = 1_301_652_000_000  # 2011-04-01T10:00:00Z


def compile_program(text: str, **kw):
    module = parse(text)
    streams = {s.name: s for s in module.of_type(ast.StreamDecl)}
    return [compile_rule(r, streams=streams, **kw) for r in module.of_type(ast.RuleDecl)]


def feed(rule, stream: str, rows: list[dict], *, time_field: str = "ts", end: bool = True):
    """Feed rows of one key through the runtime, round-tripping the state between events."""
    state = new_state(rule)
    out = []
    for i, row in enumerate(rows):
        event = Event(id=row.get("id", i), stream=row.get("stream", stream),
                      ts=row[time_field], seq=i, fields=row)
        out += process_event(rule, state, event)
        state = RuleState.from_bytes(state.to_bytes(), rule)
    if end:
        out += advance_watermark(rule, state, math.inf)
    return out, state


TICKS = """
stream ticks (symbol string, price float, ts timestamp) time ts
"""

FLINK_PRICES = [12, 17, 19, 21, 25, 18, 15, 14, 24, 25, 19]


def tick_rows(prices):
    return [{"symbol": "ACME", "price": float(p), "ts": T0 + 1000 * i, "id": i}
            for i, p in enumerate(prices)]


def test_v_shape_flink_documentation_example():
    # Flink's MATCH_RECOGNIZE docs: PATTERN (START_ROW PRICE_DOWN+ PRICE_UP) reports the dip
    # that starts at 10:00:04, bottoms at 10:00:07 and ends at 10:00:08.
    (rule,) = compile_program(TICKS + """
rule dip from ticks by symbol
  pattern start down+ up
  contiguity strict
  define down as price < prev(price), up as price > prev(price)
  emit symbol, start.ts as start_ts, last(down).ts as bottom_ts, up.ts as end_ts
""")
    matches, _ = feed(rule, "ticks", tick_rows(FLINK_PRICES))
    assert [m.events for m in matches] == [{"start": [4], "down": [5, 6, 7], "up": [8]}]
    assert matches[0].values == {
        "symbol": "ACME", "start_ts": T0 + 4000, "bottom_ts": T0 + 7000, "end_ts": T0 + 8000,
    }
    assert matches[0].to_json()["start"] == "2011-04-01T10:00:04.000Z"
    assert matches[0].to_json()["end"] == "2011-04-01T10:00:08.000Z"


def test_v_shape_greedy_rise_is_reported_when_the_rise_ends():
    (rule,) = compile_program(TICKS + """
rule v_shape from ticks by symbol
  pattern start down+ up+
  contiguity strict
  define down as price < prev(price), up as price > prev(price)
  after match skip past last
  emit symbol, start.ts as start, last(down).price as bottom, last(up).price as top
""")
    rule_state = new_state(rule)
    rows = tick_rows(FLINK_PRICES)
    emitted_at = []
    for i, row in enumerate(rows):
        event = Event(id=i, stream="ticks", ts=row["ts"], seq=i, fields=row)
        for m in process_event(rule, rule_state, event):
            emitted_at.append((i, m))
    # up+ is greedy: the match is only known when 19 (index 10) fails to extend the rise.
    assert [(i, m.events) for i, m in emitted_at] == [
        (10, {"start": [4], "down": [5, 6, 7], "up": [8, 9]})
    ]
    assert emitted_at[0][1].values == {"symbol": "ACME", "start": T0 + 4000, "bottom": 14.0,
                                       "top": 25.0}
    assert advance_watermark(rule, rule_state, math.inf) == []


CARDS = """
stream txn (card_id string, amount float, merchant string, ts timestamp) time ts
rule card_testing "Tiny probe charges, then a large purchase on the same card"
  from txn
  by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
  emit card_id, count(probe) as probes, sum(probe.amount) as probed, big.amount as amount
  severity high
"""


def txn(i, amount, merchant, minute):
    return {"id": f"t{i}", "card_id": "c1", "amount": amount, "merchant": merchant,
            "ts": T0 + minute * MINUTE}


def test_card_testing_reports_all_probes_once():
    (rule,) = compile_program(CARDS)
    rows = [
        txn(0, 25.0, "grocer", 0),
        txn(1, 0.5, "shady", 1),
        txn(2, 0.7, "shady", 2),
        txn(3, 3.0, "cafe", 3),      # neither probe nor big: skipped under relaxed contiguity
        txn(4, 0.9, "shady", 4),
        txn(5, 0.2, "shady", 5),
        txn(6, 900.0, "electronics", 6),
    ]
    matches, state = feed(rule, "txn", rows)
    assert len(matches) == 1
    m = matches[0]
    assert m.events == {"probe": ["t1", "t2", "t4", "t5"], "big": ["t6"]}
    assert m.values == {"card_id": "c1", "probes": 4, "probed": pytest.approx(2.3),
                        "amount": 900.0}
    assert m.severity == "high"
    assert m.to_json()["kind"] == "rule" and m.to_json()["name"] == "card_testing"
    assert state.is_empty


def test_card_testing_needs_three_probes_within_ten_minutes():
    (rule,) = compile_program(CARDS)
    too_few = [txn(1, 0.5, "s", 0), txn(2, 0.5, "s", 1), txn(3, 700.0, "e", 2)]
    assert feed(rule, "txn", too_few)[0] == []
    too_slow = [txn(1, 0.5, "s", 0), txn(2, 0.5, "s", 1), txn(3, 0.5, "s", 2),
                txn(4, 700.0, "e", 11)]
    assert feed(rule, "txn", too_slow)[0] == []
    same_merchant = [txn(1, 0.5, "s", 0), txn(2, 0.5, "s", 1), txn(3, 0.5, "s", 2),
                     txn(4, 700.0, "s", 3)]
    assert feed(rule, "txn", same_merchant)[0] == []


ORDERS = """
stream orders (order_id string, status string, amount float, ts timestamp) time ts
stream payments (order_id string, amount float, ts timestamp) time ts
rule unpaid_order "Order not paid within 15 minutes"
  from orders, payments
  by order_id
  pattern placed !paid
  define placed as orders where status == "placed",
         paid   as payments
  within 15m
  emit order_id, placed.amount
"""


def test_unpaid_order_fires_when_the_window_closes():
    (rule,) = compile_program(ORDERS)
    state = new_state(rule)
    placed = Event("o1", "orders", T0, 0, {"order_id": "A", "status": "placed", "amount": 30.0,
                                          "ts": T0})
    assert process_event(rule, state, placed) == []
    assert state.next_timer_ms == T0 + 15 * MINUTE + 1
    assert advance_watermark(rule, state, T0 + 15 * MINUTE) == []  # not passed yet
    (m,) = advance_watermark(rule, state, T0 + 15 * MINUTE + 1)
    assert m.events == {"placed": ["o1"]}
    assert m.values == {"order_id": "A", "placed.amount": 30.0}
    assert (m.start_ms, m.end_ms) == (T0, T0 + 15 * MINUTE)
    assert state.is_empty


def test_paid_order_does_not_fire_even_when_paid_at_the_deadline():
    (rule,) = compile_program(ORDERS)
    rows = [
        {"stream": "orders", "id": "o1", "order_id": "A", "status": "placed", "amount": 5.0,
         "ts": T0},
        {"stream": "payments", "id": "p1", "order_id": "A", "amount": 5.0,
         "ts": T0 + 15 * MINUTE},
    ]
    assert feed(rule, "orders", rows)[0] == []


def test_unpaid_order_fires_on_a_later_event_of_the_key():
    (rule,) = compile_program(ORDERS)
    rows = [
        {"stream": "orders", "id": "o1", "order_id": "A", "status": "placed", "amount": 5.0,
         "ts": T0},
        {"stream": "payments", "id": "p1", "order_id": "A", "amount": 5.0,
         "ts": T0 + 16 * MINUTE},
    ]
    matches, _ = feed(rule, "orders", rows, end=False)
    assert [m.events for m in matches] == [{"placed": ["o1"]}]


LOGINS = """
stream logins (user_id string, lat float, lon float, ts timestamp) time ts
rule impossible_travel
  from logins by user_id
  pattern a b
  define b as distance_km(a.lat, a.lon, lat, lon) / hours(ts - a.ts) > 900
  within 6h
"""

NYC = (40.7128, -74.0060)
LONDON = (51.5074, -0.1278)


def login(i, place, minutes):
    return {"id": i, "user_id": "u1", "lat": place[0], "lon": place[1],
            "ts": T0 + minutes * MINUTE}


def test_impossible_travel():
    (rule,) = compile_program(LOGINS)
    rows = [login(0, NYC, 0), login(1, NYC, 10), login(2, LONDON, 60), login(3, LONDON, 600)]
    matches, _ = feed(rule, "logins", rows)
    assert [m.events for m in matches] == [{"a": [0], "b": [2]}]
    assert matches[0].values == {"user_id": "u1"}  # no emit: the key


def test_possible_travel_is_quiet():
    (rule,) = compile_program(LOGINS)
    rows = [login(0, NYC, 0), login(1, LONDON, 7 * 60)]
    assert feed(rule, "logins", rows)[0] == []


def test_match_id_is_deterministic_and_depends_on_events():
    (rule,) = compile_program(LOGINS)
    rows = [login(0, NYC, 0), login(2, LONDON, 60)]
    first = feed(rule, "logins", rows)[0][0]
    again = feed(rule, "logins", rows)[0][0]
    assert first.match_id == again.match_id and len(first.match_id) == 32
    other = feed(rule, "logins", [login(0, NYC, 0), login(5, LONDON, 60)])[0][0]
    assert other.match_id != first.match_id
