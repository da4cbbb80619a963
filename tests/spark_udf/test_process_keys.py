"""The Spark operator's buckets run every key at once (``RuleProcessor.process_keys``), each event
offered only to the rules it may touch, found column-wise (``cep.nfa.touches``): the same
matches, dead letters and partial matches held as ``RuleProcessor.process`` called key by key, over
random W5 rule mixes, events, micro-batches, late and bad rows; and far fewer rules looked at.
No Spark session: the processors are those ``processor_specs`` builds for Spark.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from w5_rules import KINDS, STREAMS, rule_text, scans_counted

from cep.engine.engine import Engine
from cep.events.event import StateError
from cep.events.watermark import END_OF_INPUT, NO_WATERMARK
from spark_udf.rules import processor_specs

LATENESS_MS = 5


@st.composite
def workload(draw):
    """A program of one to six W5 rules, raw events (some late, some bad) and batch cuts."""
    names = [f"r{i}" for i in range(draw(st.integers(1, 6)))]
    program = STREAMS + "\n".join(draw(rule_text(name)) for name in names)
    rows, ts = [], 0
    for i in range(draw(st.integers(1, 50))):
        ts += draw(st.integers(0, 4))
        late = draw(st.integers(0, 12)) if draw(st.integers(0, 5)) == 0 else 0
        key = draw(st.sampled_from(["k1", "k2", "k3", "k4"]))
        if draw(st.integers(0, 6)) == 0:
            rows.append({"stream": "flags", "key": key, "level": draw(st.integers(0, 3)),
                         "ts": max(0, ts - late)})
            continue
        row = {
            "stream": "ev", "id": i, "key": key, "kind": draw(st.sampled_from(KINDS)),
            "amount": draw(st.sampled_from([0.5, 1.5, 2.0, 4.0, 6.0])),
            "merchant": draw(st.sampled_from(["m1", "m2", None])),
            "price": float(draw(st.integers(0, 4))), "ts": max(0, ts - late),
        }
        if draw(st.integers(0, 12)) == 0:
            row["amount"] = "lots"  # a wrong type: a dead letter, the key keeps running
        rows.append(row)
    cuts = sorted(set(draw(st.lists(st.integers(1, len(rows)), max_size=4))))
    return program, rows, cuts


def _batches(rows, cuts):
    bounds = [0, *cuts, len(rows)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        yield [dict(row, _seq=lo + i) for i, row in enumerate(rows[lo:hi])]


def _by_key(processor, batch):
    groups: dict[tuple, list[dict]] = {}
    for row in batch:
        for key in processor.keys_of(row):
            groups.setdefault(key, []).append(row)
    return groups


def _held(state) -> tuple:
    """What a key's state holds besides counters: per rule its partial matches, and the
    pending events."""
    return (sorted((name, rule.partial_count) for name, rule in state.rules.items()),
            [event.seq for event in state.pending])


def run(program: str, rows, cuts, together: bool):
    """Feed the batches as a Spark bucket does (one watermark per batch, from the rows before
    it), then end the input; the matches, dead letters, the keys holding state and
    their partial matches after each batch, and the rules looked at."""
    specs, _ = processor_specs(program, lateness_ms=LATENESS_MS)
    matches, dead, states_seen, touched = [], [], [], 0
    for spec in specs:
        processor = spec.processor
        states: dict[tuple, bytes | None] = {}
        watermark = NO_WATERMARK
        batches = [*_batches(rows, cuts), []]
        for number, batch in enumerate(batches):
            if number == len(batches) - 1:
                watermark = END_OF_INPUT
            groups = _by_key(processor, batch)
            if number == len(batches) - 1:
                groups = {key: [] for key in states}
            if together:
                outputs, results = processor.process_keys(
                    [(key, states.get(key), events) for key, events in groups.items()],
                    watermark,
                )
                matches.extend(m["match_id"] for m in outputs)
            else:
                results = []
                for key, events in groups.items():
                    result = processor.process(key, states.get(key), events, watermark)
                    matches.extend(m["match_id"] for m in result.outputs)
                    results.append(result)
            for key, result in zip(groups, results, strict=True):
                states[key] = result.state
                dead.extend((key, d["reason"], d.get("line")) for d in result.dead_letters)
            states_seen.append(sorted(
                (key, _held(processor.decode(state))) for key, state in states.items()
                if state is not None))
            if batch:
                watermark = max(watermark, max(
                    r["ts"] for r in batch if isinstance(r.get("ts"), int)) - LATENESS_MS)
        touched += processor.touched
    return sorted(matches), sorted(dead, key=repr), states_seen, touched


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload())
def test_keys_together_equal_keys_one_by_one(case):
    program, rows, cuts = case
    alone = run(program, rows, cuts, together=False)
    together = run(program, rows, cuts, together=True)
    assert together[0] == alone[0]
    assert together[1] == alone[1]
    assert together[2] == alone[2]
    assert together[3] <= alone[3]


def test_keys_together_look_at_the_rules_an_event_may_touch():
    """Fifty sequence rules over rare kinds and events of other kinds: one by one every event
    is offered to every rule; together, almost none is."""
    rng = random.Random(3)
    program = STREAMS + "\n".join(
        f'rule s{i} from ev by key pattern a b define a as kind == "rare{i}" and amount > 1, '
        f'b as kind == "rare{i + 1}" within 1s\n'
        for i in range(50)
    )
    rows = [{"stream": "ev", "id": i, "key": f"k{rng.randrange(20)}", "kind": "login",
             "amount": 3.0, "merchant": "m", "price": 1.0, "ts": i} for i in range(400)]
    rows[100]["kind"], rows[100]["key"] = "rare7", "k1"
    rows[101]["kind"], rows[101]["key"] = "rare8", "k1"
    alone = run(program, rows, [100, 250], together=False)
    together = run(program, rows, [100, 250], together=True)
    assert together[0] == alone[0] and len(alone[0]) == 1
    assert alone[3] == 50 * len(rows)
    assert together[3] <= 4  # the two rare events, each touching the two rules it names


def _embedded(program: str, rows) -> list[str]:
    """The match ids the embedded engine reports for ``rows`` in one batch."""
    engine = Engine()
    engine.register(program)
    engine.feed_batch(pd.DataFrame(rows))
    engine.close()
    return sorted(m["match_id"] for m in engine.drain())


def test_idle_prev_states_alike_are_stored_once():
    """Twenty strict `prev` rules idle on a key hold the same counters and history: the key's
    state stores them once (not twenty times), decodes to one shared state, and a rise spanning
    micro-batches is still found by each rule, as the embedded engine finds it."""
    program = STREAMS + "\n".join(
        f"rule p{i} from ev by key pattern a b contiguity strict\n"
        f"  define a as amount > {i + 100}, b as price > prev(price) + 1\n"
        for i in range(20)
    )
    one = STREAMS + "rule p0 from ev by key pattern a b contiguity strict\n" \
        "  define a as amount > 100, b as price > prev(price) + 1\n"
    rows = [{"stream": "ev", "id": i, "key": "k", "kind": "login", "amount": 1.0,
             "merchant": "m", "price": float(i % 3), "ts": i} for i in range(30)]
    rows[20]["amount"] = 500.0  # a: starts every rule; b: the next event's rise
    rows[21]["price"] = 9.0
    states = {}
    for text in (program, one):
        specs, _ = processor_specs(text, lateness_ms=LATENESS_MS)
        processor = specs[0].processor
        _, results = processor.process_keys([(("k",), None, [dict(r, _seq=i) for i, r in
                                                             enumerate(rows[:15])])], 12)
        states[text] = (processor, results[0].state)
    processor, state = states[program]
    assert len(state) < 3 * len(states[one][1])
    decoded = processor.decode(state)
    assert sorted(decoded.rules) == sorted(f"p{i}" for i in range(20))
    assert all(st.history == decoded.rules["p0"].history and st.history for st in
               decoded.rules.values())
    # Decoded as one object, which the rules share until one of them leaves it.
    assert len({id(st) for st in decoded.rules.values()}) == 1
    assert decoded.rules["p0"].shared
    assert processor.encode(decoded) == state

    got = run(program, rows, [15], together=True)[0]
    expected = _embedded(program, rows)
    assert got == expected and len(expected) == 20


def _strict_rules(names, rise: int = 1) -> str:
    """Strict rules alike but for their thresholds (so no rule leads another's scan)."""
    return STREAMS + "\n".join(
        f"rule {name} from ev by key pattern a b contiguity strict\n"
        f"  define a as amount > {100 + int(name[1:])}, b as price > prev(price) + {rise}\n"
        for name in names
    )


def _rows(n: int = 30) -> list[dict]:
    rows = [{"stream": "ev", "id": i, "key": "k", "kind": "login", "amount": 1.0,
             "merchant": "m", "price": float(i % 3), "ts": i} for i in range(n)]
    rows[14]["amount"] = 500.0  # a: starts a run in every rule, left alive by the batch
    rows[15]["price"] = 0.0  # b fails for every rule alike: the runs end, nothing found
    rows[20]["amount"] = 500.0
    rows[21]["price"] = 9.0  # a rise: every rule matches
    return [dict(row, _seq=i) for i, row in enumerate(rows)]


def test_strict_states_alike_are_stored_once_and_scanned_once(monkeypatch):
    """Twenty strict rules that differ only in a threshold each hold a live run after an event
    above every threshold. The scan that starts them runs once: the others take its result,
    the bits being equal. The key's state stores that run once (a whole state and nineteen
    references); decoded, the rules share the runs; on the next micro-batch the event that
    ends the runs is scanned once again, and the rise later is found by each rule, as the
    embedded engine finds it."""
    from cep.nfa import state as state_module

    names = [f"p{i}" for i in range(20)]
    program = _strict_rules(names)
    rows = _rows()
    specs, _ = processor_specs(program, lateness_ms=LATENESS_MS)
    processor = specs[0].processor
    one = processor_specs(_strict_rules(["p0"]), lateness_ms=LATENESS_MS)[0][0].processor
    scans = scans_counted(monkeypatch)
    _, results = processor.process_keys([(("k",), None, rows[:15])], 14)
    _, alone = one.process_keys([(("k",), None, rows[:15])], 14)
    assert scans == ["p0", "p0"]  # p0 of the twenty and p0 alone: the nineteen followed
    state = results[0].state
    assert len(state) < 2 * len(alone[0].state)
    decoded = processor.decode(state)
    assert sorted(decoded.rules) == sorted(names)
    runs = {id(st.lazy_runs) for st in decoded.rules.values()}
    assert len(runs) == 1
    assert isinstance(decoded.rules["p7"].lazy_runs, state_module.SharedRuns)
    assert processor.encode(decoded) == state
    assert all(st.partial_count == 1 for st in decoded.rules.values())

    scans.clear()
    outputs, results = processor.process_keys([(("k",), state, rows[15:20])], 19)
    assert outputs == [] and scans == ["p0"]
    assert len({id(st) for st in processor.decode(results[0].state).rules.values()}) == 1

    got = run(program, rows, [15, 20], together=True)[0]
    expected = _embedded(program, rows)
    assert got == expected and len(expected) == 20


def test_twins_survive_the_rule_their_state_was_stored_with():
    """A program edit removes the rule whose state the others' references point to: the
    others keep their live runs, and find the rise as they would have."""
    names = [f"p{i}" for i in range(6)]
    rows = _rows()
    before = processor_specs(_strict_rules(names), lateness_ms=LATENESS_MS)[0][0].processor
    _, results = before.process_keys([(("k",), None, rows[:21])], 20)
    after = processor_specs(_strict_rules(names[1:]), lateness_ms=LATENESS_MS)[0][0].processor
    decoded = after.decode(results[0].state)
    assert sorted(decoded.rules) == names[1:]
    assert all(st.partial_count == 1 for st in decoded.rules.values())
    outputs, results = after.process_keys([(("k",), results[0].state, rows[21:])], 20)
    more, _ = after.process_keys([(("k",), results[0].state, [])], END_OF_INPUT)
    assert sorted(m["name"] for m in outputs + more) == names[1:]


def test_rules_alike_new_to_a_key_are_written_as_one_group(monkeypatch):
    """Twenty ``prev`` rules alike, new to a key, get one idle state from the scan, which
    records them as a group (as a decoded state's): the key's state is written from the group
    at once, to the same bytes as rule by rule; once one of them leaves the shared state, rule
    by rule again, to what the embedded engine finds."""
    names = [f"p{i}" for i in range(20)]
    program = _strict_rules(names)
    processor = processor_specs(program, lateness_ms=LATENESS_MS)[0][0].processor
    written = []
    real = processor.encode
    monkeypatch.setattr(processor, "encode", lambda ks: written.append(ks) or real(ks))
    rows = _rows()
    # Watermarks as a bucket gets them: from the rows of the batches before. The first
    # batch only waits; the second releases rows 0-4, which the twenty rules are new to.
    _, results = processor.process_keys([(("k",), None, rows[:10])], NO_WATERMARK)
    first, results = processor.process_keys([(("k",), results[0].state, rows[10:16])],
                                            9 - LATENESS_MS)
    ks = written[-1]
    ((st, group),) = ks.groups
    assert group.names == tuple(names) and all(ks.rules[n] is st for n in names)
    assert group.raw is not None
    by_group = results[0].state
    ks.groups.clear()
    assert real(ks) == by_group  # rule by rule: the same bytes
    # The 15th event starts a run in every rule: the group is left, the state still right.
    outputs, results = processor.process_keys([(("k",), by_group, rows[16:])],
                                              15 - LATENESS_MS)
    last, _ = processor.process_keys([(("k",), results[0].state, [])], END_OF_INPUT)
    found = sorted(m["match_id"] for m in first + outputs + last)
    assert found == _embedded(program, rows) and len(found) == 20


#: A key state written before format 2 (twins stored once): tests/fixtures/key_state_v1.json
#: holds its bytes (six strict rules holding runs, a relaxed rule's partial match, buffered
#: events) and the matches the code of format 1 (commit 4c91058) then reported.
V1_KEY_STATE = Path(__file__).parents[1] / "fixtures" / "key_state_v1.json"


def test_a_key_state_of_format_1_is_read_and_continues():
    stored = json.loads(V1_KEY_STATE.read_text())
    processor = processor_specs(STREAMS + stored["program"],
                                lateness_ms=LATENESS_MS)[0][0].processor
    data = base64.b64decode(stored["state"])
    assert data[:5] == b"VGKS\x01"
    rows = [{"stream": "ev", "id": i, "key": "k", "kind": "login" if i % 4 else "reset",
             "amount": 1.0, "merchant": "m", "price": float(i % 3), "ts": i}
            for i in range(30)]
    rows[14]["amount"] = rows[20]["amount"] = 500.0
    rows[15]["price"], rows[21]["price"] = 0.0, 9.0
    rows = [dict(row, _seq=i) for i, row in enumerate(rows)]
    decoded = processor.decode(data)
    assert [e.seq for e in decoded.pending] == [15, 16]
    rewritten = processor.encode(decoded)
    assert rewritten[:5] == b"VGKS\x02"
    for state in (data, rewritten):
        first, results = processor.process_keys([(("k",), state, rows[17:])], 16)
        last, _ = processor.process_keys([(("k",), results[0].state, [])], END_OF_INPUT)
        assert sorted(m["match_id"] for m in first + last) == stored["matches"]


def test_malformed_key_states_of_format_2_are_refused():
    """A twin entry with no whole state before it, and an idle row whose members are not
    rule names and versions, are refused with what is wrong (checksums intact)."""
    from cep.nfa import processor as processor_module

    processor = processor_specs(_strict_rules(["p0", "p1"]),
                                lateness_ms=LATENESS_MS)[0][0].processor
    head, blob = processor_module._RULE_HEAD, processor_module._BLOB
    extra = json.dumps({"max_ts": {}, "pending": []}).encode()
    twin_first = head.pack(2, 1, processor_module._TWIN) + b"p1" + b"\0" * 8 \
        + blob.pack(len(extra)) + extra
    row = [["k"], 1, None, 0, 0, 0, 0, 1, 1, [{"price": 1.0}]]
    extra = json.dumps({"max_ts": {}, "pending": [], "idle": [row]}).encode()
    bad_members = blob.pack(len(extra)) + extra + blob.pack(5) + b"[1,2]"
    for body, count, message in ((twin_first, 1, "malformed entry for rule 'p1'"),
                                 (bad_members, 0, "malformed idle row")):
        with pytest.raises(StateError, match=message):
            processor.decode(processor_module._CODEC.encode(body, 0, count))
