"""Where a Spark checkpoint's state lives across program edits (spark_udf.edits): each keyed
processor keeps its slot while its key definition (or metric form) stays, new ones take slots
never used before, each rule and metric gets the version the embedded engine would give it,
and groups of a slot no processor owns any more are recognised as such. No Spark here: the
runs themselves are in test_spark_resume.py."""

from __future__ import annotations

import json

import pytest

from cep.errors import StateError
from cep.nfa.processor import _BLOB, _CODEC
from spark_udf.checkpoint import Committed, RunRecord, StateLayout, check_resumable
from spark_udf.edits import edit_program, processor_identity
from spark_udf.errors import CheckpointError
from spark_udf.routing import JsonRoute, RoutePlan, StreamRoute
from spark_udf.rules import processor_specs

PROGRAM = """
stream txn (card string, merchant string, amount float, ts timestamp) time ts unit ms
rule two_big from txn by card pattern a b define a as amount > 100, b as amount > 100 within 1h
rule quiet from txn by card pattern a !b define a as amount > 500, b as amount > 0 within 10m
metric per_merchant from txn by merchant window tumbling 1m select count() as n
"""


def _layout(edit) -> StateLayout:
    """The layout a run records, read back as the next run reads it."""
    written = StateLayout.of(list(edit.specs), 4, "jsonl", edit=edit)
    return StateLayout.from_json(json.loads(json.dumps(written.to_json())))


def _versions(edit) -> dict[str, int]:
    return {name: form["version"] for name, form in edit.forms.items()}


def test_a_new_checkpoint_places_processors_by_index_at_version_one():
    edit = edit_program(PROGRAM)
    assert edit.slots == (0, 1) and edit.next_slot == 2
    assert _versions(edit) == {"two_big": 1, "quiet": 1, "per_merchant": 1}
    assert edit.report.added == ("two_big", "quiet", "per_merchant")


def test_edits_keep_slots_of_unchanged_key_definitions_and_never_reuse_one():
    one = edit_program(PROGRAM)
    edited = (PROGRAM.replace("within 1h", "within 2h").replace("rule quiet", "rule hush")
              .replace("select count() as n", "select count() as n, sum(amount) as s")
              + "rule pair from txn by merchant pattern a b define a as amount > 9, "
                "b as amount > 9\n")
    two = edit_program(edited, previous=_layout(one))
    identities = [processor_identity(spec) for spec in two.specs]
    assert identities == ['rules [["txn",["card"]]]', 'rules [["txn",["merchant"]]]',
                          "metric per_merchant v2"]
    # The card rules stay at slot 0; the new key definition and the changed metric get new
    # slots: 1 held the first metric's state, which nothing may read again.
    assert two.slots == (0, 2, 3) and two.next_slot == 4
    assert (two.report.kept, two.report.reset, two.report.added, two.report.dropped) == (
        (), ("two_big", "per_merchant"), ("hush", "pair"), ("quiet",))
    assert _versions(two) == {"two_big": 2, "hush": 1, "per_merchant": 2, "pair": 1}
    # The rules are compiled at their versions (the state bytes and match ids carry them).
    rules = {r.name: r.version for spec in two.specs for r in getattr(spec.processor, "rules", ())}
    assert rules == {"two_big": 2, "hush": 1, "pair": 1}

    # Back to the first program: nothing reuses a slot, and a form coming back runs at a new
    # version (its old state may still sit in the store for keys no batch touched since).
    three = edit_program(PROGRAM, previous=_layout(two))
    assert three.slots == (0, 4) and three.next_slot == 5
    assert _versions(three) == {"two_big": 3, "quiet": 2, "per_merchant": 3}
    assert set(three.report.dropped) == {"hush", "pair"}


def test_an_unchanged_program_keeps_everything_in_place():
    one = edit_program(PROGRAM)
    again = edit_program(PROGRAM.replace("within 1h", "within   1h  # same"),
                         previous=_layout(one))
    assert again.slots == one.slots and _versions(again) == _versions(one)
    assert again.report.kept == ("two_big", "quiet", "per_merchant")
    assert not again.report.changed


def test_a_record_written_before_slots_continues_an_unchanged_program():
    specs, _ = processor_specs(PROGRAM)
    legacy = StateLayout.of(specs, 4, "jsonl").to_json()
    for processor in legacy["processors"]:
        del processor["slot"], processor["identity"]
    for name in ("forms", "retired", "next_slot"):
        del legacy[name]
    old = StateLayout.from_json(legacy)
    assert old.legacy
    same = edit_program(PROGRAM, previous=old)
    assert same.slots == (0, 1) and same.report.kept == ("two_big", "quiet", "per_merchant")
    changed = edit_program(PROGRAM.replace("within 1h", "within 2h"), previous=old)
    assert changed.report.reset == ("two_big",) and changed.slots == (0, 1)


def test_processor_specs_continue_only_the_same_specs():
    specs, _ = processor_specs(PROGRAM)
    record = RunRecord(StateLayout.of(specs, 4, "jsonl"))
    committed = Committed(0, ({"line": 3},))
    check_resumable("ck", StateLayout.of(specs, 4, "jsonl"), committed, record)
    with pytest.raises(CheckpointError, match=r"other processors \(\[two_big, quiet\] "
                                              r"\[per_merchant\]; these specs run \[two_big, "
                                              r"quiet\]\)"):
        check_resumable("ck", StateLayout.of(specs[:1], 4, "jsonl"), committed, record)


def test_groups_of_a_slot_no_processor_owns_have_no_owner():
    route = JsonRoute("_event", {None: StreamRoute(("k",), "ts", 1)}, "s", 4)
    plan = RoutePlan(((route, None, None), (route, None, None)), 4, 0, (0, 3))
    assert [plan.offset(i) for i in range(2)] == [0, 12]
    assert [plan.owner(g) for g in (0, 3, 4, 11, 12, 15, 16)] == [0, 0, None, None, 1, 1,
                                                                   None]
    by_index = RoutePlan(((route, None, None),), 4, 0)
    assert (by_index.owner(3), by_index.owner(4)) == (0, None)
    with pytest.raises(ValueError, match="one distinct slot per processor"):
        RoutePlan(((route, None, None), (route, None, None)), 4, 0, (1, 1))


def test_rules_that_start_fresh_do_not_see_the_events_waiting_for_the_watermark():
    """A key's pending events (above the watermark when the state was written) were buffered
    for the rules of that program: a rule the next program adds or resets does not see them,
    as a rule registered in the embedded engine does not see its reorder buffer; the kept
    rule does. Still so after the state is written and read again while they wait."""
    program = """
stream txn (card string, amount float, ts timestamp) time ts unit ms lateness 10s
rule big from txn by card pattern b define b as amount > 100
rule pair from txn by card pattern a b define a as amount > 100, b as amount > 100
"""
    old = processor_specs(program)[0][0].processor
    events = [{"card": "c", "amount": 500.0, "ts": t, "stream": "txn", "_seq": i}
              for i, t in enumerate((1_000, 2_000, 30_000))]
    state = old.process(("c",), None, events[:2], 0).state  # both wait (watermark 0)
    edited = program.replace("rule pair", "rule pair2") + \
        "rule again from txn by card pattern b define b as amount > 100\n"
    versions = {"big": 1, "pair2": 1, "again": 1}
    new = processor_specs(edited, versions=versions)[0][0].processor
    # Written and read again before anything is released: the marks stay.
    state = new.encode(new.decode(state))
    result = new.process(("c",), state, events[2:], 20_000)  # releases the first two
    names = sorted((m["name"], tuple(m["events"]["b"])) for m in result.outputs)
    assert names == [("big", (0,)), ("big", (1,))]
    # The third event (not pending at the edit) is seen by every rule once released.
    final = new.process(("c",), result.state, [], 40_000)
    assert sorted(m["name"] for m in final.outputs) == ["again", "big"]


def test_a_state_written_with_the_rules_inside_its_body_still_reads():
    """Key states written before the rule list had a blob of its own (the list inside the JSON
    body) read as they did: the edited program's fresh rule still skips the pending events."""
    program = """
stream txn (card string, amount float, ts timestamp) time ts unit ms lateness 10s
rule big from txn by card pattern b define b as amount > 100
"""
    old = processor_specs(program)[0][0].processor
    events = [{"card": "c", "amount": 500.0, "ts": t, "stream": "txn", "_seq": i}
              for i, t in enumerate((1_000, 2_000))]
    state = old.process(("c",), None, events, 0).state  # both wait (watermark 0)
    (watermark, count), view = _CODEC.decode(state)
    assert count == 0  # nothing stored but the body and the rule list
    (body_len,) = _BLOB.unpack_from(view, 0)
    body = json.loads(bytes(view[_BLOB.size:_BLOB.size + body_len]))
    rest = view[_BLOB.size + body_len:]
    (rules_len,) = _BLOB.unpack_from(rest, 0)
    body["rules"] = json.loads(bytes(rest[_BLOB.size:_BLOB.size + rules_len]))
    assert body["rules"] == [["big", 1]]
    text = json.dumps(body, separators=(",", ":")).encode()
    before = _CODEC.encode(_BLOB.pack(len(text)) + text, watermark, 0)
    edited = program + "rule again from txn by card pattern b define b as amount > 100\n"
    new = processor_specs(edited, versions={"big": 1, "again": 1})[0][0].processor
    for written in (state, before):
        result = new.process(("c",), written, [], 20_000)
        assert sorted(m["name"] for m in result.outputs) == ["big", "big"]
    assert new.decode(before) == new.decode(state)


@pytest.mark.parametrize("damage", ["padded", "truncated"])
def test_a_key_state_whose_rule_list_is_damaged_is_refused(damage):
    """Bytes after the rule list, or a rule list cut short: an error naming the key state's
    length, not a state read wrong."""
    program = """
stream txn (card string, amount float, ts timestamp) time ts unit ms lateness 10s
rule big from txn by card pattern b define b as amount > 100
"""
    processor = processor_specs(program)[0][0].processor
    events = [{"card": "c", "amount": 500.0, "ts": 1_000, "stream": "txn", "_seq": 0}]
    state = processor.process(("c",), None, events, 0).state
    (watermark, count), view = _CODEC.decode(state)
    body = bytes(view) + b"x" if damage == "padded" else bytes(view)[:-1]
    with pytest.raises(StateError, match="wrong length"):
        processor.decode(_CODEC.encode(body, watermark, count))
