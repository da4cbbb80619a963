"""Tables through the service: a changelog stream, its table and a metric and a rule reading it
registered while events flow; each reads the table as of its event's time."""

from __future__ import annotations

from service_support import T0, lines

CHANGES = """
stream card_changes (card string, home string, op string, ts timestamp) time ts
stream txn (card string, country string, amount float, ts timestamp) time ts
table cards from card_changes key card op op
"""


def _change(card: str, home: str, second: int) -> dict:
    return {"stream": "card_changes", "card": card, "home": home, "op": "u", "ts": T0 + second}


def _txn(card: str, country: str, second: int) -> dict:
    return {"stream": "txn", "card": card, "country": country, "amount": 10.0,
            "ts": T0 + second}


def test_a_metric_and_a_rule_registered_live_read_the_table_as_of_each_event(api) -> None:
    assert api.put("cards", CHANGES).status_code == 201
    assert api.put("abroad", "rule abroad from txn by card pattern a\n"
                   "  define a as country != lookup(cards, card).home emit card, country\n"
                   ).status_code == 201
    assert api.put("spend_abroad", "metric spend_abroad from txn window tumbling 1m\n"
                   "  where country != lookup(cards, card).home\n"
                   "  select count() as n, sum(amount) as total\n").status_code == 201
    answer = api.post(lines(
        _change("c1", "FR", 0), _txn("c1", "DE", 10),   # abroad as of 10 s
        _txn("c1", "FR", 20), _change("c1", "DE", 30),  # at home as of 20 s
        _txn("c1", "DE", 40),                           # home again: DE as of 40 s
        _txn("c9", "DE", 50),                           # no row: null, neither counts
        _txn("c1", "FR", 130), _change("c2", "FR", 130),  # abroad again; past the window
    ), wait="true")
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == 8
    found = api.matches()
    rules = [m["values"] for m in found if m["kind"] == "rule"]
    assert rules == [{"card": "c1", "country": "DE"}, {"card": "c1", "country": "FR"}]
    metrics = [(m["window"]["start"], m["values"]) for m in found if m["kind"] == "metric"]
    assert metrics == [("2026-01-01T00:00:00.000Z", {"n": 1, "total": 10.0})]
