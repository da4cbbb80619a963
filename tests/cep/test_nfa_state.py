"""Per-key state: compact versioned bytes, shared event storage, clear errors on bad input."""

from __future__ import annotations

import base64
import json
import math
import zlib
from pathlib import Path

import pytest
from reference_matcher import compile_text, is_type, make_events

from cep.events.event import Event
from cep.nfa.errors import OutOfOrderEventError, StateFormatError
from cep.nfa.runtime import advance_watermark, process_event
from cep.nfa.state import _CODEC, RuleState, new_state

TYPES = {v: is_type(v) for v in "abc"}


def busy_state():
    rule = compile_text(
        "rule r from s pattern a b+ c contiguity any within 1h after match no skip", TYPES
    )
    state = new_state(rule)
    for e in make_events([("a", 1, 1), ("a", 2, 2), ("b", 3, 3), ("b", 4, 4), ("a", 5, 5)]):
        process_event(rule, state, e)
    return rule, state


def body(data: bytes) -> dict:
    payload = data[18:]
    if data[5] & 1:
        payload = zlib.decompress(payload)
    return json.loads(payload)


def test_round_trip_is_exact_and_deterministic():
    rule, state = busy_state()
    data = state.to_bytes()
    assert data[:4] == b"VGRS" and data[4] == 2
    again = RuleState.from_bytes(data, rule)
    assert again.to_bytes() == data
    assert again.partial_count == state.partial_count


def test_events_shared_by_partial_matches_are_stored_once():
    rule, state = busy_state()
    stored = body(state.to_bytes())
    assert state.partial_count > 5
    ids = [row[1] for row in stored["e"]]
    assert sorted(ids) == sorted(set(ids)) == [0, 1, 2, 3, 4]


def test_round_tripped_state_continues_identically():
    rule, state = busy_state()
    copy = RuleState.from_bytes(state.to_bytes(), rule)
    tail = make_events([("x", 0, 6), ("c", 0, 7)])
    for e in tail:
        e.id = f"late-{e.id}"
    original = [m.to_json() for e in tail for m in process_event(rule, state, e)]
    restored = [m.to_json() for e in tail for m in process_event(rule, copy, e)]
    assert original == restored and len(original) > 3


def test_empty_state_is_tiny():
    rule = compile_text("rule r from s pattern a b", TYPES)
    assert len(new_state(rule).to_bytes()) < 200


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda d: d[:10], "truncated"),
        (lambda d: b"XXXX" + d[4:], "does not start with"),
        (lambda d: d[:4] + b"\x09" + d[5:], "format version 9"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]), "checksum"),
    ],
)
def test_corrupted_bytes_raise_a_clear_error(mangle, message):
    rule, state = busy_state()
    with pytest.raises(StateFormatError, match=message):
        RuleState.from_bytes(mangle(state.to_bytes()), rule)


def test_state_of_another_rule_is_rejected():
    _, state = busy_state()
    other = compile_text("rule r from s pattern a c", TYPES)
    with pytest.raises(StateFormatError, match="different compilation"):
        RuleState.from_bytes(state.to_bytes(), other)


def test_non_bytes_are_rejected():
    rule, _ = busy_state()
    with pytest.raises(StateFormatError, match="must be bytes"):
        RuleState.from_bytes("VGRS", rule)


def test_out_of_order_and_late_events_are_refused():
    rule = compile_text("rule r from s pattern a b", TYPES)
    state = new_state(rule)
    process_event(rule, state, Event(0, "s", 10, 0, {"type": "a"}))
    with pytest.raises(OutOfOrderEventError, match="event-time order"):
        process_event(rule, state, Event(1, "s", 9, 1, {"type": "b"}))
    advance_watermark(rule, state, 20)
    with pytest.raises(OutOfOrderEventError, match="behind the key's watermark"):
        process_event(rule, state, Event(2, "s", 15, 2, {"type": "b"}))


def test_numpy_field_values_are_stored_as_python_values():
    import numpy as np

    rule = compile_text("rule r from s pattern a b", TYPES)
    state = new_state(rule)
    fields = {"type": "a", "v": np.int64(3), "w": np.float64(1.5), "l": np.array([1, 2])}
    process_event(rule, state, Event(0, "s", 1, 0, fields))
    again = RuleState.from_bytes(state.to_bytes(), rule)
    (m,) = process_event(rule, again, Event(1, "s", 2, 1, {"type": "b"}))
    assert m.events == {"a": [0], "b": [1]}


def test_unstorable_field_values_raise_a_clear_error():
    rule = compile_text("rule r from s pattern a b", TYPES)
    state = new_state(rule)
    process_event(rule, state, Event(0, "s", 1, 0, {"type": "a", "v": object()}))
    with pytest.raises(StateFormatError, match="JSON values"):
        state.to_bytes()


# ---------------------------------------------------------------- format version 1

#: Checkpoints written before format 2 (shared tails): tests/fixtures/rule_state_v1.json holds,
#: per case, the bytes of the state after the events before and what the events after then
#: reported, written by the code of format 1 (commit 6760de1).
V1_FIXTURE = Path(__file__).parents[1] / "fixtures" / "rule_state_v1.json"

V1_CASES = [  # (name, rule text, max_partials, events before the bytes, events after)
    ("any_quantifier",
     "rule r from s pattern a b+ c contiguity any within 1h after match no skip", None,
     [("a", 1, 1), ("a", 2, 2), ("b", 3, 3), ("b", 4, 4), ("a", 5, 5)],
     [("b", 6, 6), ("x", 0, 7), ("c", 0, 8)]),
    ("any_at_cap",
     "rule r from s pattern a b+ c contiguity any", 6,
     [("a", 0, 0), ("b", 0, 1), ("b", 0, 2), ("a", 0, 3), ("b", 0, 4), ("b", 0, 5)],
     [("b", 0, 6), ("a", 0, 7), ("b", 0, 8), ("c", 0, 9)]),
    ("any_at_cap_compressed",
     "rule r from s pattern a b+ c contiguity any", 40,
     [("a", 0, 0)] + [("b", 0, i) for i in range(1, 10)] + [("a", 0, 10), ("b", 0, 11)],
     [("b", 0, 12), ("c", 0, 13)]),
    ("held_greedy_tail",
     "rule r from s pattern a b+ contiguity any within 10ms", None,
     [("a", 0, 0), ("b", 0, 1), ("b", 0, 2)],
     [("b", 0, 3), ("x", 0, 20)]),
    ("trailing_absence",
     "rule r from s pattern a b !c within 5ms", None,
     [("a", 0, 0), ("b", 0, 1), ("a", 0, 2), ("b", 0, 3)],
     [("x", 0, 4), ("c", 0, 6), ("x", 0, 12)]),
    ("reluctant_relaxed",
     "rule r from s pattern a b+? c after match skip to next", None,
     [("a", 0, 0), ("b", 0, 1), ("a", 0, 2), ("b", 0, 3)],
     [("b", 0, 4), ("c", 0, 5)]),
    ("strict_runs",
     "rule r from s pattern a b+ c contiguity strict within 20ms", None,
     [("a", 0, 0), ("b", 0, 1), ("b", 0, 2)],
     [("b", 0, 3), ("c", 0, 4)]),
    ("latest",
     "rule r from s pattern a b c contiguity any partials latest", None,
     [("a", 0, 0), ("a", 0, 1), ("b", 0, 2)],
     [("a", 0, 3), ("c", 0, 4)]),
]


def partials(state: RuleState) -> list[tuple]:
    return [
        ([(b.event.pos, b.place) for b in p.node.chain()], p.letters, p.start_pos, p.born)
        for p in state.partials
    ]


def _v1_cases():
    stored = {c["name"]: c for c in json.loads(V1_FIXTURE.read_text())["cases"]}
    assert sorted(stored) == sorted(c[0] for c in V1_CASES)
    return [(case, stored[case[0]]) for case in V1_CASES]


@pytest.mark.parametrize(("case", "stored"), _v1_cases(), ids=[c[0] for c in V1_CASES])
def test_state_written_by_format_1_is_read_and_continues(case, stored):
    name, text, cap, before, after = case
    rule = compile_text(text, TYPES, **({"max_partials": cap} if cap else {}))
    data = base64.b64decode(stored["state"])
    assert data[:5] == b"VGRS\x01"
    state = RuleState.from_bytes(data, rule)
    events = make_events(before + after)
    # The same partial matches as a state that never went through bytes.
    fresh = new_state(rule)
    for e in events[: len(before)]:
        process_event(rule, fresh, e)
    assert partials(state) == partials(fresh)
    rewritten = state.to_bytes()
    assert rewritten[4] == 2 and RuleState.from_bytes(rewritten, rule).to_bytes() == rewritten
    out = []
    for e in events[len(before):]:
        out += process_event(rule, state, e)
    out += advance_watermark(rule, state, math.inf)
    assert [m.to_json() for m in out] == stored["matches"]
    assert state.dropped_partials == stored["dropped"]


def test_a_malformed_cohort_is_refused():
    rule, state = busy_state()
    stored = body(state.to_bytes())
    stored["p"][0][8] = [len(stored["p"][0][4]) + 1]  # segments past the members
    payload = json.dumps(stored, separators=(",", ":")).encode()
    with pytest.raises(StateFormatError, match="malformed cohort"):
        RuleState.from_bytes(_CODEC.encode(payload, rule.fingerprint), rule)
