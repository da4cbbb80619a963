"""Tables from changelogs (``table`` and ``lookup``) in the embedded engine, held to a
brute-force reference of the as-of lookup: random changelogs interleaved with events, out of
order within the lateness, fed row by row, in random batches, and resumed from a checkpoint
taken at a random point."""

from __future__ import annotations

import json

import pytest
from arrivals import arriving
from batch_splits import feed_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.engine import Engine
from cep.tables import VersionedTable
from query_lang.errors import VigilError
from query_lang.loader import check_program

LATENESS_S = 10

PROGRAM = f"""
stream card_changes (card_id string, home string, limit int, op string, ts timestamp)
  time ts lateness {LATENESS_S}s
stream txn (txn_id string, card_id string, country string, ts timestamp)
  time ts lateness {LATENESS_S}s id txn_id
table cards from card_changes key card_id op op
rule abroad from txn by card_id
  pattern a
  define a as country != lookup(cards, card_id).home
  emit txn_id, lookup(cards, card_id).home as home, lookup(cards, card_id).limit as lim
rule unknown from txn by card_id
  pattern a
  define a as lookup(cards, card_id) is null
  emit txn_id
metric abroad_by_country from txn by country window tumbling 30s
  select count() as n, sum(lookup(cards, card_id).limit) as lim
  where country != lookup(cards, card_id).home
"""

KEYS = ("c1", "c2", "c3")
COUNTRIES = ("FR", "DE", None)


@st.composite
def streams(draw):
    """Changes and transactions with their event times (s), arriving within the lateness."""

    def row(i: int, ts: int) -> dict:
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            op = draw(st.sampled_from(("c", "u", "r", "d", "D", "x")))
            home = draw(st.sampled_from(COUNTRIES))
            limit = draw(st.sampled_from((None, 1, 2)))
            change = {"stream": "card_changes", "card_id": key, "home": home, "limit": limit,
                      "op": op, "ts": ts}
            if draw(st.integers(0, 9)) == 0:
                del change["card_id"]  # a bad change: no key
            return change
        return {"stream": "txn", "txn_id": f"t{i}", "card_id": key,
                "country": draw(st.sampled_from(("FR", "DE"))), "ts": ts}

    return arriving(draw, row, LATENESS_S, 40, 120)


def reference(rows):
    """Per transaction: the row of its card as of its time, from every good change."""
    changes = []  # (ts, arrival, key, row or None)
    for arrival, row in enumerate(rows):
        if row["stream"] != "card_changes" or "card_id" not in row:
            continue
        op = row["op"].lower()
        if op == "x":
            continue
        gone = op == "d" or (row["home"] is None and row["limit"] is None)
        changes.append((row["ts"], arrival, row["card_id"],
                        None if gone else (row["home"], row["limit"])))
    abroad, unknown = set(), set()
    windows: dict[tuple, list] = {}  # (country, window start s) -> the limits of its rows
    for row in rows:
        if row["stream"] != "txn":
            continue
        seen = [c for c in changes if c[2] == row["card_id"] and c[0] <= row["ts"]]
        current = max(seen, key=lambda c: (c[0], c[1]))[3] if seen else None
        if current is None:
            unknown.add((row["txn_id"],))
        elif current[0] is not None and row["country"] != current[0]:
            abroad.add((row["txn_id"], current[0], current[1]))
            windows.setdefault((row["country"], row["ts"] // 30 * 30), []).append(current[1])
    metric = set()
    for (country, start), limits in windows.items():
        known = [v for v in limits if v is not None]
        metric.add((country, start, len(limits), sum(known) if known else None))
    return abroad, unknown, metric


def outcome(engine: Engine):
    abroad, unknown, metric = set(), set(), set()
    for m in engine.drain():
        v = m["values"]
        if m["name"] == "abroad":
            abroad.add((v["txn_id"], v["home"], v["lim"]))
        elif m["name"] == "unknown":
            unknown.add((v["txn_id"],))
        else:
            assert m["final"] and not m["correction"], m
            start = int(m["window"]["start"][17:19]) + 60 * int(m["window"]["start"][14:16])
            metric.add((m["key"]["country"], start, v["n"], v["lim"]))
    letters = engine.drain_dead_letters()
    assert {d["reason"] for d in letters} <= {"missing_key", "unknown_op"}, letters
    return (abroad, unknown, metric), len(letters)


def engine() -> Engine:
    e = Engine()
    e.register(PROGRAM)
    return e


def feed_rows(e: Engine, rows) -> None:
    for row in rows:
        e.feed(row)



@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=streams(), cuts=st.lists(st.integers(0, 60), max_size=4), stop=st.integers(0, 60))
def test_lookup_as_of_matches_the_reference_however_fed(rows, cuts, stop):
    expected = reference(rows)
    bad = sum(1 for r in rows if r["stream"] == "card_changes"
              and ("card_id" not in r or r["op"] == "x"))

    one = engine()
    feed_rows(one, rows)
    one.close()
    assert outcome(one) == (expected, bad)

    batched = engine()
    feed_batches(batched, rows, cuts)
    batched.close()
    assert outcome(batched) == (expected, bad)

    # resumed from a checkpoint: the first part's outputs, then the rest's
    stop %= len(rows) + 1
    first = engine()
    feed_batches(first, rows[:stop], cuts)
    (a1, u1, m1), n1 = outcome(first)
    resumed = engine()
    resumed.restore(first.snapshot())
    feed_rows(resumed, rows[stop:])
    resumed.close()
    (a2, u2, m2), n2 = outcome(resumed)
    assert ((a1 | a2, u1 | u2, m1 | m2), n1 + n2) == (expected, bad)


SEQUENCES = PROGRAM + """
rule abroad_twice from txn by card_id
  pattern a b within 40s
  define a as country != lookup(cards, card_id).home,
         b as country == a.country and lookup(cards, card_id).limit is not null
  emit a.txn_id as first, b.txn_id as second, lookup(cards, card_id).limit as lim
"""


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=streams(), cuts=st.lists(st.integers(0, 60), max_size=4))
def test_lookups_decided_at_release_change_no_match(rows, cuts):
    # The rule index decides the table-reading conjuncts column-wise over each release (an
    # event they rule out never reaches its key); without an index every event is offered to
    # every rule and decided row by row. Same matches, sequences with partial matches too.
    found = []
    for index in ("starts", "none"):
        e = Engine(rule_index=index)
        e.register(SEQUENCES)
        feed_batches(e, rows, cuts)
        e.close()
        found.append(sorted(json.dumps(m, sort_keys=True) for m in e.drain()))
    assert found[0] == found[1]


def test_a_change_at_a_time_already_read_is_late_for_the_table_and_said_so():
    e = engine()
    e.feed({"stream": "card_changes", "card_id": "c1", "home": "FR", "op": "c", "ts": 0})
    e.feed({"stream": "txn", "txn_id": "t1", "card_id": "c1", "country": "DE", "ts": 5})
    e.feed({"stream": "card_changes", "card_id": "c9", "home": "FR", "op": "c", "ts": 20})
    e.feed({"stream": "txn", "txn_id": "t9", "card_id": "c9", "country": "FR", "ts": 20})
    # the watermark is now 10 s: t1 (at 5 s) has read the table; a change at 5 s comes late
    e.feed({"stream": "card_changes", "card_id": "c1", "home": "DE", "op": "u", "ts": 10})
    e.close()
    matches = [(m["name"], m["values"]) for m in e.drain()]
    assert ("abroad", {"txn_id": "t1", "home": "FR", "lim": None}) in matches
    (letter,) = e.drain_dead_letters()
    assert letter["reason"] == "late" and letter["detail"].startswith("table cards: change at")
    assert e.stats.unchanged == 1


def test_emit_reads_the_table_as_of_the_last_event_even_when_an_absence_fires_late():
    e = Engine()
    e.register("""
    stream ch (k string, v string, ts timestamp) time ts
    stream ev (k string, kind string, ts timestamp) time ts
    table t from ch key k
    rule quiet from ev by k pattern a !b within 60s
      define a as kind == "open", b as kind == "close"
      emit lookup(t, k).v as v
    """)
    e.feed({"stream": "ch", "k": "x", "v": "old", "ts": 0})
    e.feed({"stream": "ev", "k": "x", "kind": "open", "ts": 1})
    e.feed({"stream": "ch", "k": "x", "v": "new", "ts": 30})
    e.feed({"stream": "ch", "k": "y", "v": "z", "ts": 50})
    e.feed({"stream": "ev", "k": "y", "kind": "noise", "ts": 50})
    e.advance_watermark(10_000_000)  # far past the window: the absence fires now
    (match,) = e.drain()
    assert match["values"] == {"v": "old"}


def test_versions_compact_behind_the_watermark_and_survive_bytes():
    table = VersionedTable("t", ("k", "v"))
    for ts, v in ((1, "a"), (2, "b"), (3, None), (4, "d")):
        table.apply(("k",), ts, ts, None if v is None else ("k", v))
    table.apply(("gone",), 1, 9, ("gone", "x"))
    table.apply(("gone",), 2, 10, None)
    before = {t: table.as_of(("k",), t) for t in range(0, 6)}
    copy = VersionedTable("t", ("k", "v"))
    copy.load(table.to_bytes())
    assert {t: copy.as_of(("k",), t) for t in range(0, 6)} == before
    table.compact(2)
    assert table.size() == (1, 3)  # "gone" dropped; k: b (the newest up to 2), its delete, d
    assert {t: table.as_of(("k",), t) for t in range(2, 6)} == {t: before[t] for t in range(2, 6)}
    table.compact(3)
    assert table.size() == (1, 1)  # the delete at 3 stands for "no row" up to 4
    assert {t: table.as_of(("k",), t) for t in range(3, 6)} == {t: before[t] for t in range(3, 6)}
    moved = VersionedTable("t", ("k", "new", "v"))  # a field added to the stream: null before
    moved.load(table.to_bytes())
    assert moved.as_of(("k",), 9) == ("k", None, "d")


@pytest.mark.parametrize(
    "text, message",
    [
        ("rule r from txn by card_id pattern a define a as lookup(nope, card_id).home == 'x'",
         "unknown table 'nope' (tables: cards)"),
        ("rule r from txn by card_id pattern a define a as lookup(cards, card_id, ts).home == 'x'",
         "table 'cards' is keyed by 1 field(s) (card_id); this lookup gives 2"),
        ("rule r from txn by card_id pattern a define a as lookup(cards, ts).home == 'x'",
         "key 'card_id' of table 'cards' is a string; this lookup gives a timestamp"),
        ("rule r from txn by card_id pattern a define a as lookup(cards, card_id).nope == 'x'",
         "table 'cards' has no field 'nope' (its fields: card_id, home, limit, ts)"),
        ("rule r from txn by card_id pattern a define a as lookup(cards, card_id) == 'x'",
         "lookup(cards, ...) is a row of the table: read one of its fields"),
        ("metric m from txn by card_id window tumbling 1m select count() as n "
         "having lookup(cards, card_id).home == 'x'",
         "lookup() is not available in a having"),
        ("metric m from txn window tumbling 1m select max(ts) + lookup(cards, card_id).limit "
         "as n", "lookup() is not available in a metric select"),
        ("table cards2 from txn key nope", "key field 'nope' of table 'cards2' is not a field"),
        ("table cards2 from nope key a", "table 'cards2' reads undeclared stream 'nope'"),
        ("table cards2 from card_changes key card_id op limit",
         "op field 'limit' of table 'cards2' must be a string, not an int"),
        ("table cards2 from card_changes key card_id op op upsert 'd'",
         "op value(s) d both upsert and delete in table 'cards2'"),
        ("table cards from card_changes key home", "duplicate table name 'cards'"),
    ],
)
def test_misuse_is_an_error_naming_what_and_where(text, message):
    base = PROGRAM.split("rule abroad")[0]
    _, errors = check_program(text=base + text + "\n")
    assert errors, text
    assert any(message in e.message for e in errors), [str(e) for e in errors]
    assert all(e.line >= 1 and e.column >= 1 for e in errors)


def test_a_table_cannot_be_redefined_in_a_running_engine():
    e = Engine()
    e.register(PROGRAM.split("table cards")[0] + "table cards from card_changes key card_id\n")
    with pytest.raises(VigilError, match="duplicate table name 'cards'"):
        e.register("table cards from card_changes key home\n")


def test_a_table_registered_later_serves_rules_registered_with_or_after_it():
    e = Engine()
    e.register(PROGRAM.split("table cards")[0])
    e.register("table cards from card_changes key card_id op op\n"
               "rule r from txn by card_id pattern a define a as lookup(cards, card_id).home "
               "== country emit txn_id\n")
    e.feed({"stream": "card_changes", "card_id": "c1", "home": "FR", "op": "c", "ts": 0})
    e.feed({"stream": "txn", "txn_id": "t1", "card_id": "c1", "country": "FR", "ts": 1})
    e.close()
    assert [m["values"] for m in e.drain()] == [{"txn_id": "t1"}]
    assert e.stats.table_rows == {"cards": 1}


def test_a_metric_counts_an_event_as_of_its_time_even_a_late_one_correcting_a_window():
    e = Engine()
    e.register("""
    stream ch (k string, v int, ts timestamp) time ts lateness 10s
    stream ev (k string, ts timestamp) time ts lateness 10s
    table t from ch key k
    metric m from ev by k window tumbling 10s select count() as n, sum(lookup(t, k).v) as total
    """)
    e.feed({"stream": "ev", "k": "x", "ts": 3})  # held: the change at 0 has not come yet
    e.feed({"stream": "ch", "k": "x", "v": 1, "ts": 0})
    e.feed({"stream": "ch", "k": "x", "v": 50, "ts": 9})
    e.advance_watermark(10_000)
    (fired,) = e.drain()
    assert fired["values"] == {"n": 1, "total": 1} and not fired["correction"]
    e.advance_watermark(15_000)  # the versions before 15 s would collapse to v = 50 ...
    e.feed({"stream": "ev", "k": "x", "ts": 8})  # ... but a late event still reads v = 1
    (corrected,) = e.drain()
    assert corrected["values"] == {"n": 2, "total": 2} and corrected["correction"]
    # late for the rules, as every event behind the watermark; not for the table
    assert [d["reason"] for d in e.drain_dead_letters()] == ["late"]
