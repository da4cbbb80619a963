"""The rule index (``cep.engine.rule_index``) is a strategy: every index runs this one suite and
must report exactly what the baseline without an index reports, while looking at fewer rules.

Rules of the shapes W5 generates (``bench/bench_rules.py``: thresholds, sequences, trailing
absences, joins of two streams, strict ``prev``; plus a relaxed ``prev``) over random events and
batch splits: N rules registered together give exactly the union of each rule run alone, under
every index, also when rules are added and removed between batches; and the number of rules
looked at per event is asserted, as the percolator's presearcher suite asserts queries run.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from w5_rules import KINDS, STREAMS, rule_text

from cep.engine.engine import Engine
from cep.engine.rule_index import RULE_INDEXES

INDEXES = sorted(RULE_INDEXES)
BASELINE = "none"

@st.composite
def workload(draw):
    """Rules (text, batch registered at, batch removed at or None), events and batch cuts."""
    n_rules = draw(st.integers(1, 5))
    n_events = draw(st.integers(1, 40))
    rows, ts = [], 0
    for i in range(n_events):
        ts += draw(st.integers(0, 4))
        late = draw(st.integers(0, 8)) if draw(st.integers(0, 5)) == 0 else 0
        key = draw(st.sampled_from(["k1", "k2", "k3"]))
        if draw(st.integers(0, 6)) == 0:
            rows.append({"stream": "flags", "key": key, "level": draw(st.integers(0, 3)),
                         "ts": max(0, ts - late)})
            continue
        rows.append({
            "stream": "ev", "id": i, "key": key, "kind": draw(st.sampled_from(KINDS)),
            "amount": float(draw(st.sampled_from([0.5, 1.5, 2.0, 4.0, 6.0]))),
            "merchant": draw(st.sampled_from(["m1", "m2"])),
            "price": float(draw(st.integers(0, 4))), "ts": max(0, ts - late),
        })
    cuts = sorted(set(draw(st.lists(st.integers(1, n_events), max_size=4))))
    batches = len(cuts) + 1
    rules = []
    for i in range(n_rules):
        text = draw(rule_text(f"r{i}"))
        start = draw(st.integers(0, batches - 1)) if draw(st.booleans()) else 0
        stop = draw(st.integers(start + 1, batches)) if draw(st.integers(0, 3)) == 0 else None
        rules.append((text, start, stop))
    return rules, rows, cuts


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for name in ("amount", "price"):
        if name in frame.columns:
            frame[name] = frame[name].astype(float)
    return frame


def run(index: str, rules, rows, cuts) -> tuple[list[dict], Engine]:
    """Feed ``rows`` cut at ``cuts``, registering and removing ``rules`` before the batch their
    numbers name; the matches in the order reported, and the engine."""
    engine = Engine(rule_index=index)
    engine.register(STREAMS)
    bounds = [0, *cuts, len(rows)]
    out: list[dict] = []
    for number, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for i, (text, start, stop) in enumerate(rules):
            if stop == number:
                engine.unregister(f"r{i}")
            if start == number:
                engine.register(text)
        if hi > lo:
            engine.feed_batch(_frame(rows[lo:hi]))
        out.extend(engine.drain())
    engine.close()
    out.extend(engine.drain())
    return out, engine


def _contents(matches: list[dict]) -> list[str]:
    return sorted(json.dumps(m, sort_keys=True) for m in matches)


@pytest.mark.parametrize("index", INDEXES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workload())
def test_rules_together_are_the_union_of_each_rule_alone(index, case):
    rules, rows, cuts = case
    together, engine = run(index, rules, rows, cuts)
    alone = [m for i, rule in enumerate(rules) for m in _alone(index, rule, i, rows, cuts)]
    assert _contents(together) == _contents(alone)
    baseline, base_engine = run(BASELINE, rules, rows, cuts)
    assert together == baseline  # the same matches, in the same order
    assert engine.stats == base_engine.stats
    assert engine.rules_touched <= base_engine.rules_touched


def _alone(index: str, rule, number: int, rows, cuts) -> list[dict]:
    """Rule ``r{number}`` run alone (registered and removed at the same batches)."""
    text, start, stop = rule
    placeholder = (None, -1, None)
    rules = [placeholder] * number + [(text, start, stop)]
    engine = Engine(rule_index=index)
    engine.register(STREAMS)
    bounds = [0, *cuts, len(rows)]
    out: list[dict] = []
    for batch, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for i, (t, s, e) in enumerate(rules):
            if t is None:
                continue
            if e == batch:
                engine.unregister(f"r{i}")
            if s == batch:
                engine.register(t)
        if hi > lo:
            engine.feed_batch(_frame(rows[lo:hi]))
        out.extend(engine.drain())
    engine.close()
    out.extend(engine.drain())
    return out


THRESHOLDS = "".join(
    f"rule t{i} from ev by key pattern a b define a as amount > {100 + i}, b as amount > 1000\n"
    for i in range(40)
)


def _events(amounts: list[float]) -> pd.DataFrame:
    return _frame([
        {"stream": "ev", "id": i, "key": f"k{i % 2}", "kind": "login", "amount": a,
         "merchant": "m1", "price": 1.0, "ts": i}
        for i, a in enumerate(amounts)
    ])


@pytest.mark.parametrize("index", INDEXES)
def test_rules_looked_at_per_event(index):
    """40 rules: 30 events no rule can start, one that starts the 11 rules whose threshold is
    below 111, then one that starts all 40 and completes the 11 partial matches."""
    engine = Engine(rule_index=index)
    engine.register(STREAMS + THRESHOLDS)
    engine.feed_batch(_events([5.0] * 30 + [110.5]))
    engine.feed_batch(_frame([{"stream": "ev", "id": 99, "key": "k0", "kind": "login",
                               "amount": 2000.0, "merchant": "m1", "price": 1.0, "ts": 40}]))
    engine.close()
    assert len(engine.drain()) == 11
    if index == BASELINE:
        # The events no rule can take are not dispatched; the two others are offered to every
        # rule reading their stream.
        assert engine.rules_touched == 40 + 40
    else:
        # The rules each event can start, or whose partial matches it may advance.
        assert engine.rules_touched == 11 + 40


@pytest.mark.parametrize("index", INDEXES)
def test_events_that_can_only_advance_a_rule_reach_only_its_partial_matches(index):
    """10 rules ``a b`` whose ``b`` (a payment) fits most events: 30 payments on keys where no
    rule has begun, then an order that begins all 10 on key k9 and a payment there that ends
    them. The payments before are looked at by no rule under the index (they can only advance
    a match, and nothing is pending on their keys), and one batch or many gives the same."""
    rules = "".join(
        f"rule s{i} from ev by key pattern a b\n"
        f'  define a as kind == "order" and amount > {100 + i}, b as kind == "payment"\n'
        for i in range(10)
    )
    rows = [{"stream": "ev", "id": i, "key": f"k{i % 3}", "kind": "payment", "amount": 5.0,
             "merchant": "m1", "price": 1.0, "ts": i} for i in range(30)]
    rows += [{"stream": "ev", "id": 30, "key": "k9", "kind": "order", "amount": 500.0,
              "merchant": "m1", "price": 1.0, "ts": 30},
             {"stream": "ev", "id": 31, "key": "k9", "kind": "payment", "amount": 5.0,
              "merchant": "m1", "price": 1.0, "ts": 31}]
    touched = []
    for cuts in ([], [30, 31]):
        engine = Engine(rule_index=index)
        engine.register(STREAMS + rules)
        for lo, hi in zip([0, *cuts], [*cuts, len(rows)], strict=True):
            engine.feed_batch(_frame(rows[lo:hi]))
        engine.close()
        assert sorted(m["name"] for m in engine.drain()) == [f"s{i}" for i in range(10)]
        touched.append(engine.rules_touched)
    if index == BASELINE:
        assert touched == [32 * 10] * 2  # every event offered to every rule
    else:
        assert touched == [10 + 10] * 2  # the order begins 10 matches, the payment ends them


@pytest.mark.parametrize("index", INDEXES)
def test_a_rule_whose_match_ended_still_counts_the_events_it_can_only_advance(index):
    """After a match, ``skip past last`` lets the next one begin after the match's last event
    as the rule counts events: the payment (which can only advance the rule) between the
    match and the next order must be counted though the rule holds nothing then."""
    rules = ("rule s from ev by key pattern a b within 30s\n"
             '  define a as kind != "payment", b as true\n')
    kinds = ["order", "order", "payment", "order", "payment"]
    engine = Engine(rule_index=index)
    engine.register(STREAMS + rules)
    engine.feed_batch(_frame([
        {"stream": "ev", "id": i, "key": "k1", "kind": kind, "amount": 5.0, "merchant": "m1",
         "price": 1.0, "ts": i} for i, kind in enumerate(kinds)
    ]))
    engine.close()
    assert sorted(m["events"]["a"] + m["events"]["b"] for m in engine.drain()) == [
        [0, 1], [3, 4]]


@pytest.mark.parametrize("index", INDEXES)
def test_events_waiting_for_the_watermark_reach_only_rules_of_their_stream_after_a_register(
        index):
    """Payments that can only advance a rule wait in the reorder buffer while another rule of
    its group is registered (the group is rebuilt): once released they still complete its
    match, and no group whose rules do not read their stream gets them (it has no key for
    them: they would be reported as events without a key)."""
    rules = ("rule s from ev by key pattern a b within 1s\n"
             '  define a as kind == "order", b as kind == "payment"\n'
             "rule f from flags by key pattern x define x as level > 2\n")
    rows = [{"stream": "ev", "id": i, "key": "k1", "kind": kind, "amount": 5.0,
             "merchant": "m1", "price": 1.0, "ts": ts}
            for i, (kind, ts) in enumerate([("order", 0), ("payment", 10), ("payment", 11)])]
    engine = Engine(rule_index=index)
    engine.register(STREAMS + rules)
    engine.feed_batch(_frame(rows))  # the watermark stays at 6: both payments wait
    engine.register('rule g from ev by key pattern y define y as kind == "login"\n')
    engine.close()
    assert engine.drain_dead_letters() == []
    assert [m["events"] for m in engine.drain()] == [{"a": [0], "b": [1]}]


@pytest.mark.parametrize("index", INDEXES)
def test_strict_prev_rules_run_only_from_where_they_may_start(index):
    """Strict ``prev`` rules must see every event of their keys; the index hands the events
    before a possible start to the state without running the rule on them. (With a relaxed
    rule beside them, so that the stream is not held as columns: see ``column_route``.)"""
    rules = THRESHOLDS.splitlines(keepends=True)[0] + "".join(
        f"rule p{i} from ev by key pattern a b contiguity strict\n"
        f"  define a as amount > {100 + i}, b as price > prev(price)\n"
        for i in range(10)
    )
    engine = Engine(rule_index=index)
    engine.register(STREAMS + rules)
    frame = _events([5.0] * 20 + [104.5, 5.0])
    frame.loc[21, "price"] = 2.0
    frame.loc[:, "key"] = "k0"
    engine.feed_batch(frame)
    engine.close()
    names = sorted(m["name"] for m in engine.drain())
    assert names == [f"p{i}" for i in range(5)]  # 104.5 > 100 + i, then price 1.0 -> 2.0
    if index == BASELINE:
        assert engine.rules_touched == 22 * 11  # every rule offered every event
    else:
        # Only the 5 rules the 21st event may start run, on it and the next event; and t0,
        # which it starts.
        assert engine.rules_touched == 5 * 2 + 1


def test_state_left_is_the_same_under_every_index():
    """What each key's rules remember (their state bytes) does not depend on the index."""
    rules = STREAMS + "".join(THRESHOLDS.splitlines(keepends=True)[:4]) + (
        "rule p from ev by key pattern a b contiguity strict\n"
        "  define a as amount > 100, b as price > prev(price)\n")
    states = {}
    for index in INDEXES:
        engine = Engine(rule_index=index)
        engine.register(rules)
        engine.feed_batch(_events([5.0, 150.0, 5.0, 120.0, 3.0, 104.0]))
        states[index] = {
            key: {name: st.to_bytes() for name, st in state.rules.items()}
            for group in engine._groups.values() for key, state in group.states.items()
        }
    assert all(s == states[BASELINE] for s in states.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.sampled_from([
    "rule {} from ev by key pattern a b define a as amount > 3, b as amount > 5\n",
    "rule {} from ev by key pattern a b define a as amount > 3, b as amount > 6\n",
    "rule {} from ev by key pattern a b contiguity strict\n"
    "  define a as amount > 3, b as price > prev(price)\n",
    "rule {} from ev by key pattern a b define a as amount > 3, b as price > prev(price)\n",
    "rule {} from flags, ev by key pattern f e define f as flags where level >= 1,\n"
    "  e as ev where amount > 3\n",
]), min_size=1, max_size=8), amounts=st.lists(st.sampled_from([0.5, 4.0, 5.5, 7.0]),
                                               min_size=1, max_size=12))
def test_rules_alike_get_their_rows_once_and_the_same_as_alone(texts, amounts):
    """``cep.nfa.touches.rule_rows``: rules whose conditions are the same texts, run the same
    way, share one computation of their rows and masks per frame, which equals what each rule
    gets in a processor of its own."""
    from cep.nfa.touches import rule_rows

    def rows_of(program):
        """Per rule name, its rows and masks over the frame (rules touching no row absent),
        and the indexes in the order given, per processor."""
        engine = Engine()
        engine.register(STREAMS + program)
        out, orders = {}, []
        for group in engine._groups.values():
            rules = group.processor.rules
            got = list(rule_rows(group.processor, "ev", frame, {}))
            orders.append([index for index, _, _ in got])
            out.update({rules[index].name: (rows, masks) for index, rows, masks in got})
        return out, orders

    frame = _events(amounts)
    together, orders = rows_of("".join(t.format(f"r{i}") for i, t in enumerate(texts)))
    assert all(order == sorted(order) for order in orders)
    first_of: dict[str, tuple] = {}
    for i, text in enumerate(texts):
        alone, _ = rows_of(text.format(f"r{i}"))
        assert (f"r{i}" in together) == (f"r{i}" in alone)
        if f"r{i}" not in alone:
            continue
        rows, masks = together[f"r{i}"]
        assert rows.tolist() == alone[f"r{i}"][0].tolist()
        assert masks.tolist() == alone[f"r{i}"][1].tolist()
        if text in first_of:  # alike: the very same arrays
            assert first_of[text][0] is rows and first_of[text][1] is masks
        first_of.setdefault(text, (rows, masks))


def test_an_unknown_index_is_refused():
    with pytest.raises(Exception, match="unknown rule index"):
        Engine(rule_index="bogus")
