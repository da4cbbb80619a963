"""Idle strict ``prev`` rules alike share one state per key (``RuleState.shared``).

Many strict rules reading ``prev`` keep, on every key, a state that only counts events and
holds the last few; rules with the same streams and depth that saw the same events hold one
object, moved once per key and batch. These tests hold that sharing invisible: the same
matches in the same order and the same per-rule state bytes as the baseline without a rule
index (which never shares), through rules of two depths registered in different batches,
removed, checkpointed and restored. (The Spark operator's side, alike states stored once and
decoded as one object: ``tests/spark_udf/test_process_keys.py``.)
"""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from w5_rules import STREAMS, scans_counted

from cep.engine import Engine
from cep.nfa.state import unshared

# A relaxed rule beside the strict ones keeps the stream off the column route, so that the
# strict rules run through the rule index's scan (see cep.engine.column_route).
RELAXED = ("rule relaxed from ev by key pattern a b\n"
           "  define a as amount > 5, b as price > prev(price) + 1\n")


def prev_rule(name: str, above: int, rise: int, depth: int, within: int | None = None) -> str:
    back = "prev(price)" if depth == 1 else f"prev(price, {depth})"
    return (f"rule {name} from ev by key pattern a b contiguity strict\n"
            f"  define a as amount > {above}, b as price > {back} + {rise}\n"
            + ("" if within is None else f"  within {within}ms\n"))


@st.composite
def workload(draw):
    """Strict prev rules (text, batch registered at, batch removed at or None), events on
    three keys, and batch cuts."""
    n_events = draw(st.integers(5, 60))
    rows, ts = [], 0
    for i in range(n_events):
        ts += draw(st.integers(0, 3))
        rows.append({
            "stream": "ev", "id": i, "key": draw(st.sampled_from(["k1", "k2", "k3"])),
            "kind": "login", "amount": float(draw(st.sampled_from([1.0, 1.0, 1.0, 4.0, 9.0]))),
            "merchant": "m", "price": float(draw(st.integers(0, 4))), "ts": ts,
        })
    cuts = sorted(set(draw(st.lists(st.integers(1, n_events), max_size=4))))
    batches = len(cuts) + 1
    rules = []
    for i in range(draw(st.integers(2, 10))):
        text = prev_rule(f"p{i}", draw(st.sampled_from([2, 5, 8])), draw(st.integers(0, 2)),
                         draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([None, None, 2])))
        start = draw(st.integers(0, batches - 1)) if draw(st.integers(0, 3)) == 0 else 0
        stop = draw(st.integers(start + 1, batches)) if draw(st.integers(0, 5)) == 0 else None
        rules.append((text, start, stop))
    return rules, rows, cuts


def states_of(engine: Engine) -> dict:
    """Per key, each rule's state bytes (a shared state's, as each rule stores it)."""
    return {
        key: {name: unshared(engine._rules[name], st).to_bytes()
              for name, st in state.rules.items()}
        for group in engine._groups.values() for key, state in group.states.items()
    }


def shared_objects(engine: Engine) -> int:
    """How many (rule, key) states are held by an object another rule of the key holds."""
    total = 0
    for group in engine._groups.values():
        for state in group.states.values():
            held = [st for name, st in state.rules.items() if name != "relaxed"]
            total += len(held) - len({id(st) for st in held})
    return total


def run(index: str, rules, rows, cuts, checkpoint_at=None):
    """Feed ``rows`` cut at ``cuts``; the matches in order, the state bytes after each batch,
    and the most states shared at once. With ``checkpoint_at``, the engine is checkpointed
    after that batch and a new engine restored from it runs the rest."""
    engine = Engine(rule_index=index)
    engine.register(STREAMS + RELAXED)
    bounds = [0, *cuts, len(rows)]
    out, states, shared = [], [], 0
    for number, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for i, (text, start, stop) in enumerate(rules):
            if stop == number:
                engine.unregister(f"p{i}")
            if start == number:
                engine.register(text)
        if hi > lo:
            engine.feed_batch(pd.DataFrame(rows[lo:hi]))
        out.extend(engine.drain())
        states.append(states_of(engine))
        shared = max(shared, shared_objects(engine))
        if number == checkpoint_at:
            data = engine.snapshot()
            engine = Engine(rule_index=index)
            engine.register(STREAMS + RELAXED + "".join(
                text for text, start, stop in rules
                if start <= number and (stop is None or stop > number)))
            engine.restore(data)
    engine.close()
    out.extend(engine.drain())
    return out, states, shared


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workload())
def test_shared_states_change_nothing_a_user_or_a_checkpoint_sees(case):
    rules, rows, cuts = case
    base, base_states, never = run("none", rules, rows, cuts)
    got, got_states, _ = run("starts", rules, rows, cuts)
    assert never == 0  # the baseline shares nothing
    assert got == base
    assert got_states == base_states


def test_alike_rules_hold_one_state_per_key():
    """Thirty rules on three keys: after the first batch each key holds one state object for
    the rules no event started, still one after more batches with a few starts and matches,
    and a checkpoint taken then restores the same matches and states as a run without it."""
    rules = [(prev_rule(f"p{i}", 2 + i, 0, 1), 0, None) for i in range(30)]
    rows = []
    for i in range(90):
        rows.append({"stream": "ev", "id": i, "key": f"k{i % 3}", "kind": "login",
                     "amount": 1.0, "merchant": "m", "price": float(i % 4), "ts": i})
    rows[40]["amount"] = 12.5  # starts p0..p10 on k1 (12.5 > 2 + i for i <= 10)
    rows[43]["price"] = 9.0    # the next k1 event rises: eleven matches
    cuts = [30, 60]
    base, base_states, _ = run("none", rules, rows, cuts)
    got, got_states, shared = run("starts", rules, rows, cuts)
    assert got == base and len([m for m in got if m["name"] != "relaxed"]) == 11
    assert got_states == base_states
    assert shared >= 3 * 29  # thirty rules, one object per key

    engine = Engine()
    engine.register(STREAMS + RELAXED + "".join(text for text, _, _ in rules))
    engine.feed_batch(pd.DataFrame(rows[:60]))
    for group in engine._groups.values():
        for key, state in group.states.items():
            held = {id(st) for name, st in state.rules.items() if name != "relaxed"}
            # k1's eleven started rules ran their own scans, and rejoined when they found
            # nothing more (counters and history equal again); the others never left.
            assert len(held) <= (2 if key == ("k1",) else 1), key

    again, again_states, _ = run("starts", rules, rows, cuts, checkpoint_at=0)
    assert again == base
    assert again_states == base_states


def test_alike_conditions_are_evaluated_once_per_key(monkeypatch):
    """Thirty rules with the same conditions, every one started on every key: their condition
    bits are computed once per key and batch, not once per rule; and a rule registered later
    (whose `prev` history is shorter, so the same conditions give other bits) computes its
    own. Matches and states equal the baseline's."""
    import cep.nfa.strict as strict_module

    rows_evaluated = []
    real = strict_module.condition_bits

    def counting(rule, sequences, *rest):
        rows_evaluated.append(sum(len(events) for _, events in sequences))
        return real(rule, sequences, *rest)

    rule = ("rule p{i} from ev by key pattern a b contiguity strict\n"
            "  define a as price > prev(price), b as amount > 5\n")
    rows = []
    for i in range(60):
        # Row 30, alone in its batch and later than the rest, releases the first 30.
        rows.append({"stream": "ev", "id": i, "key": f"k{i % 3}", "kind": "login",
                     "amount": 9.0 if i % 7 == 0 else 1.0, "merchant": "m",
                     "price": float((i * 5) % 11), "ts": i if i < 30 else 100 + i})
    rules = [(rule.format(i=i), 0, None) for i in range(30)]
    # Registered at the third batch: on k1 and k2 it starts with no history where the others
    # have one (k2's first event then starts the thirty, not it).
    rules.append((rule.format(i=30), 2, None))
    cuts = [30, 31]
    base, base_states, _ = run("none", rules, rows, cuts)
    monkeypatch.setattr(strict_module, "condition_bits", counting)
    got, got_states, _ = run("starts", rules, rows, cuts)
    assert got == base and len([m for m in got if m["name"] != "relaxed"]) > 30
    assert got_states == base_states
    # The 60 events once for the thirty rules, and the late rule's own: far from 30 x 60.
    assert sum(rows_evaluated) <= 2 * 60 + 30, rows_evaluated


def test_a_start_that_ends_at_once_copies_no_shared_state(monkeypatch):
    """Thirty alike rules, an event on k1 starting every one of them and a next event that
    completes none: the rules look at their bits, see their runs end within the batch, and
    keep the one shared state (no copy made, none rejoined)."""
    import cep.nfa.processor as processor_module

    rules = [(prev_rule(f"p{i}", 2 + i % 3, 0, 1), 0, None) for i in range(30)]
    rows = []
    for i in range(60):
        rows.append({"stream": "ev", "id": i, "key": f"k{i % 3}", "kind": "login",
                     "amount": 1.0, "merchant": "m", "price": 2.0, "ts": i})
    rows[40]["amount"] = 12.5  # k1: starts all thirty; the next k1 event does not rise
    base, base_states, _ = run("none", rules, rows, [30])
    engine = Engine()
    engine.register(STREAMS + RELAXED + "".join(text for text, _, _ in rules))
    engine.feed_batch(pd.DataFrame(rows[:30]))
    copies = []
    real = processor_module.with_history
    monkeypatch.setattr(processor_module, "with_history",
                        lambda *a: copies.append(a) or real(*a))
    engine.feed_batch(pd.DataFrame(rows[30:]))
    assert copies == []
    for group in engine._groups.values():
        for key, state in group.states.items():
            held = {id(st) for name, st in state.rules.items() if name != "relaxed"}
            assert len(held) == 1, key
    assert states_of(engine) == base_states[-1]
    assert [m for m in engine.drain() if m["name"] != "relaxed"] == []
    assert [m for m in base if m["name"] != "relaxed"] == []


def test_alike_rules_wait_for_their_leads_scan():
    """Thirty rules alike on a shared state, started on a key by the same event, are decided by
    the first one's scan: where its run ends within the batch (k2), the others are not looked
    at — the batch touches as many (rule, event) pairs as with one such rule; where it goes on
    (k1, to a match), every rule runs on its own and reports its match, as the baseline."""
    alike = [(prev_rule(f"p{i}", 5, 0, 1), 0, None) for i in range(30)]
    rows = []
    for i in range(60):
        rows.append({"stream": "ev", "id": i, "key": f"k{i % 3}", "kind": "login",
                     "amount": 1.0, "merchant": "m", "price": 2.0, "ts": i})
    rows[41]["amount"] = 12.5  # k2: starts all thirty; its next event does not rise

    def touched(rules, rows) -> int:
        engine = Engine()
        engine.register(STREAMS + RELAXED + "".join(text for text, _, _ in rules))
        engine.feed_batch(pd.DataFrame(rows[:30]))
        before = engine.rules_touched
        engine.feed_batch(pd.DataFrame(rows[30:]))
        assert [m for m in engine.drain() if m["name"] != "relaxed"] == []
        return engine.rules_touched - before

    assert touched(alike, rows) == touched(alike[:1], rows)

    rows[40]["amount"] = 12.5  # k1: starts all thirty
    rows[43]["price"] = 9.0    # and its next event rises: thirty matches
    base, base_states, _ = run("none", alike, rows, [30])
    got, got_states, _ = run("starts", alike, rows, [30])
    assert got == base
    assert sorted(m["name"] for m in got if m["name"] != "relaxed") == sorted(
        f"p{i}" for i in range(30))
    assert got_states == base_states


def test_alike_rules_follow_their_lead_across_batches(monkeypatch):
    """Thirty rules alike, started on k1 by the last k1 event of a batch: the lead's scan leaves
    a run alive and reports nothing, and the others take an equal state sharing that run
    instead of scanning; in the next batch the run completes, the lead's scan reports a match
    and the others run on their own, each reporting its match — as the baseline, with the same
    states after each batch."""
    alike = [(prev_rule(f"p{i}", 5, 0, 1), 0, None) for i in range(30)]
    rows = []
    for i in range(60):
        rows.append({"stream": "ev", "id": i, "key": f"k{i % 3}", "kind": "login",
                     "amount": 1.0, "merchant": "m", "price": 2.0, "ts": i * 10_000})
    # Ten seconds apart, with 5 s of lateness: a batch releases all its events but the last.
    rows[28]["amount"] = 12.5  # k1's last event released in the first batch starts all thirty
    rows[31]["price"] = 9.0    # k1's first event of the next batch rises: thirty matches
    base, base_states, _ = run("none", alike, rows, [30])

    scanned = scans_counted(monkeypatch)
    engine = Engine()
    engine.register(STREAMS + RELAXED + "".join(text for text, _, _ in alike))
    engine.feed_batch(pd.DataFrame(rows[:30]))
    assert scanned == ["p0"]  # the lead alone scanned k1; the others share its live run
    runs = {id(st.lazy_runs) for group in engine._groups.values()
            for key, state in group.states.items() if key == ("k1",)
            for name, st in state.rules.items() if name != "relaxed"}
    assert len(runs) == 1 and None not in runs
    assert states_of(engine) == base_states[0]
    engine.feed_batch(pd.DataFrame(rows[30:]))
    assert sorted(m["name"] for m in engine.drain() if m["name"] != "relaxed") == sorted(
        f"p{i}" for i in range(30))
    assert states_of(engine) == base_states[1]
    got, _, _ = run("starts", alike, rows, [30])
    assert got == base
