"""Tests of ``cep.Engine`` and ``cep.nfa.RuleProcessor``: routing, event time, dead letters,
batch-split independence, registration while running, and state bytes.

Most tests drive a small but real runtime double (``a`` then ``b`` within a window, and the
absence ``a !b``) so that the shell is tested on its own; ``TestRealRuntime`` runs the real NFA.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.engine import Engine, load_list, program
from cep.events.event import Event, StateError, UnknownRuleError
from cep.events.watermark import END_OF_INPUT
from cep.nfa.match import Match
from cep.nfa.processor import KeyState, RuleProcessor
from query_lang import ast
from query_lang.errors import VigilError

# ---------------------------------------------------------------------- the runtime double


@dataclass
class FakeRule:
    """``a b within W`` (or ``a !b within W`` when ``absence``) on field ``type``."""

    name: str
    streams: tuple[str, ...] = ("ev",)
    key_fields: dict = field(default_factory=lambda: {"ev": ("k",)})
    within_ms: int = 10_000
    absence: bool = False
    needs_every_event: bool = False
    version: int = 1
    severity: str = "medium"

    def columnar_mask(self, frame: pd.DataFrame) -> np.ndarray:
        kind = frame["type"].to_numpy(dtype=object)
        return (kind == "a").astype(np.int64) | ((kind == "b").astype(np.int64) << 1)


@dataclass
class FakeState:
    pending: list = field(default_factory=list)  # [(ts, id)]
    key: dict | None = None
    dropped_partials: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.pending

    @property
    def next_timer_ms(self) -> int | None:
        return None if not self.pending else self.pending[0][0]

    def to_bytes(self) -> bytes:
        return json.dumps({"p": self.pending, "k": self.key}).encode()


class FakeRuntime:
    """Implements the runtime API for :class:`FakeRule`; counts calls."""

    def __init__(self) -> None:
        self.events_seen = 0

    def new_state(self, rule: FakeRule, key: tuple | None = None) -> FakeState:
        return FakeState()

    def state_from_bytes(self, data: bytes, rule: FakeRule) -> FakeState:
        raw = json.loads(data)
        return FakeState(pending=[tuple(p) for p in raw["p"]], key=raw["k"])

    def process_event(self, rule: FakeRule, state: FakeState, event: Event, mask=None) -> list:
        self.events_seen += 1
        kind = event.fields.get("type")
        if mask is not None:
            assert mask == (1 if kind == "a" else 2 if kind == "b" else 0), (mask, kind)
        state.key = {"k": event.fields["k"]}
        out = self.advance_watermark(rule, state, event.ts)
        if kind == "a":
            state.pending.append((event.ts + rule.within_ms, event.id, event.ts))
        elif kind == "b" and state.pending:
            if not rule.absence:
                _, first_id, first_ts = state.pending[0]
                out.append(
                    _match(rule, state, {"a": [first_id], "b": [event.id]}, first_ts, event.ts)
                )
            state.pending.clear()
        return out

    def advance_watermark(self, rule: FakeRule, state: FakeState, watermark_ms: int) -> list:
        out = []
        while state.pending and state.pending[0][0] < watermark_ms:
            deadline, first_id, first_ts = state.pending.pop(0)
            if rule.absence:
                out.append(_match(rule, state, {"a": [first_id]}, first_ts, deadline))
        return out


def _match(rule, state, events, start, end) -> Match:
    return Match(rule.name, 1, dict(state.key), events, dict(state.key), start, end)


def _fake_engine(
    *rules: FakeRule, lateness_s: int = 5, runtime: FakeRuntime | None = None, **kw
) -> Engine:
    by_name = {r.name: r for r in rules}
    engine = Engine(
        compile_rule=lambda decl, **_: by_name[decl.name],
        runtime=runtime or FakeRuntime(),
        **kw,
    )
    engine.register(_module(list(by_name), lateness_s))
    return engine


def _module(rule_names: list[str], lateness_s: int = 5) -> ast.Module:
    stream = ast.StreamDecl(
        "ev",
        (
            ast.FieldDecl("k", "string"),
            ast.FieldDecl("type", "string"),
            ast.FieldDecl("ts", "timestamp"),
            ast.FieldDecl("v", "float"),
        ),
        time_field="ts",
        lateness=ast.Duration(lateness_s * 1000),
    )
    rules = tuple(
        ast.RuleDecl(
            name,
            ("ev",),
            ast.PatSeq((ast.PatVar("a"), ast.PatVar("b"))),
            by=(ast.KeyPart(((None, "k"),)),),
            within=ast.Duration(10_000),
        )
        for name in rule_names
    )
    return ast.Module((stream, *rules))


def _ev(k: str, kind: str, t: float, **extra) -> dict[str, Any]:
    return {"k": k, "type": kind, "ts": t, **extra}


def _ids(matches) -> list:
    return sorted((m["name"], m["match_id"]) for m in matches)


# ---------------------------------------------------------------------- basics


def test_sequence_matches_per_key_and_absence_fires_on_watermark() -> None:
    engine = _fake_engine(FakeRule("seq"), FakeRule("gone", absence=True))
    for event in [
        _ev("x", "a", 100),
        _ev("y", "a", 101),
        _ev("x", "b", 103),
        _ev("z", "c", 104),
        _ev("y", "c", 130),  # y's `a` at 101 expires at 111: watermark 125 fires the absence
    ]:
        engine.feed(event)
    found = engine.matches()
    seq = [m for m in found if m["name"] == "seq"]
    gone = [m for m in found if m["name"] == "gone"]
    assert [(m["key"], m["events"]) for m in seq] == [({"k": "x"}, {"a": [0], "b": [2]})]
    assert [(m["key"], m["events"], m["end"]) for m in gone] == [
        ({"k": "y"}, {"a": [1]}, "1970-01-01T00:01:51.000Z")
    ]
    assert engine.stats.matches == {"seq": 1, "gone": 1}
    engine.close()
    assert engine.stats.keys == 0 and engine.stats.buffered == 0


def test_events_are_released_in_event_time_order_within_lateness() -> None:
    engine = _fake_engine(FakeRule("seq"), lateness_s=5)
    engine.feed(_ev("x", "b", 103))
    engine.feed(_ev("x", "a", 100))  # 3 s out of order, lateness 5 s: still matched
    assert engine.stats.buffered == 2
    engine.close()
    [match] = engine.drain()
    assert match["events"] == {"a": [1], "b": [0]}
    assert engine.dead_letters() == []


def test_event_beyond_lateness_is_dead_lettered_late() -> None:
    engine = _fake_engine(FakeRule("seq"), lateness_s=5)
    engine.feed(_ev("x", "b", 110))
    engine.feed(_ev("x", "a", 104), stream="ev")  # watermark 105: late
    engine.feed(_ev("x", "a", 105))  # exactly at the watermark: not late
    engine.close()
    # the on-time a (input position 2) precedes the b in event time; the late one matched nothing
    assert [m["events"] for m in engine.matches()] == [{"a": [2], "b": [0]}]
    [letter] = engine.dead_letters()
    assert letter["reason"] == "late"
    assert "behind the watermark 1970-01-01T00:01:45.000Z" in letter["detail"]
    assert letter["event"]["ts"] == 104
    assert engine.stats.late == 1 and engine.stats.accepted == 2


def test_equal_times_keep_input_order() -> None:
    engine = _fake_engine(FakeRule("seq"))
    engine.feed(_ev("x", "a", 100))
    engine.feed(_ev("x", "b", 100))
    engine.feed(_ev("x", "a", 100))
    engine.feed(_ev("x", "b", 100))
    engine.close()
    assert [m["events"] for m in engine.matches()] == [
        {"a": [0], "b": [1]},
        {"a": [2], "b": [3]},
    ]


def test_bad_events_become_dead_letters_and_the_run_continues() -> None:
    engine = _fake_engine(FakeRule("seq"))
    engine.feed_record('{"k": "x", "type": "a", "ts": 1', source="in.jsonl", line=1)
    engine.feed_record("[1, 2]", source="in.jsonl", line=2)
    engine.feed_record('{"k": "x", "type": "a", "ts": 1, "v": "abc"}', source="in.jsonl", line=3)
    engine.feed_record('{"k": "x", "type": "a"}', source="in.jsonl", line=4)
    engine.feed_record('{"k": "x", "type": "a", "ts": "yesterday"}', source="in.jsonl", line=5)
    engine.feed_record('{"type": "a", "ts": 2}', source="in.jsonl", line=6)
    engine.feed_record('{"stream": "nope", "ts": 2}', source="in.jsonl", line=7)
    engine.feed_record('{"k": "x", "type": "a", "ts": 3}', source="in.jsonl", line=8)
    engine.feed_record('{"k": "x", "type": "b", "ts": 4}', source="in.jsonl", line=9)
    engine.close()
    letters = engine.dead_letters()
    assert [(d["reason"], d["line"]) for d in letters] == [
        ("invalid_json", 1),
        ("not_an_object", 2),
        ("wrong_type", 3),
        ("missing_time", 4),
        ("bad_timestamp", 5),
        ("unknown_stream", 7),
        ("missing_key", None),
    ]
    assert letters[2]["detail"] == "field 'v' expected float, got string \"abc\""
    assert letters[2]["raw"] == '{"k": "x", "type": "a", "ts": 1, "v": "abc"}'
    assert letters[2]["input"] == "in.jsonl"
    assert "'k'" in letters[6]["detail"] and "seq" in letters[6]["detail"]
    assert [m["events"] for m in engine.matches()] == [{"a": [7], "b": [8]}]
    # the keyless line is accepted (a query or metric could use it) and the rule skips it
    assert (engine.stats.bad, engine.stats.unkeyed, engine.stats.accepted) == (6, 1, 3)


def test_feed_after_close_is_an_error() -> None:
    engine = _fake_engine(FakeRule("seq"))
    engine.close()
    with pytest.raises(Exception, match="closed"):
        engine.feed(_ev("x", "a", 1))


# ---------------------------------------------------------------------- batching


def _random_stream(rng: random.Random, n: int, *, beyond_lateness: bool = True) -> list[dict]:
    t = 1_000.0
    out = []
    for _ in range(n):
        t += rng.choice([0, 0.5, 1, 2, 7])
        # some out of order (lateness is 5 s), some beyond lateness
        jitter = rng.choice([0, 0, 0, -1, -3, -8 if beyond_lateness else -5])
        out.append(_ev(rng.choice("xyz"), rng.choice("aabc"), t + jitter, v=rng.random()))
    return out


def _run_split(events, cuts, *, batch: bool, with_absence: bool = True):
    rules = [FakeRule("seq")] + ([FakeRule("gone", absence=True)] if with_absence else [])
    engine = _fake_engine(*rules)
    bounds = [0, *sorted(cuts), len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi <= lo:
            continue
        if batch:
            engine.feed_batch(pd.DataFrame(events[lo:hi]))
        else:
            for event in events[lo:hi]:
                engine.feed(event)
    engine.close()
    letters = [(d["reason"], d["event"]["ts"]) for d in engine.dead_letters()]
    return _ids(engine.matches()), sorted(letters), engine.stats


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(0, 60), max_size=6))
def test_batch_split_does_not_change_results(seed: int, cuts: list[int]) -> None:
    events = _random_stream(random.Random(seed), 60)
    one_by_one = _run_split(events, [], batch=False)
    batched = _run_split(events, cuts, batch=True)
    whole = _run_split(events, [], batch=True)
    assert batched[:2] == one_by_one[:2] == whole[:2]
    assert batched[2].late == one_by_one[2].late
    assert batched[2].matches == one_by_one[2].matches


def test_feed_batch_skips_rows_no_rule_can_use() -> None:
    runtime = FakeRuntime()
    engine = _fake_engine(FakeRule("seq"), runtime=runtime)
    frame = pd.DataFrame(
        [_ev("x", "c", t) for t in range(1000)] + [_ev("x", "a", 1000), _ev("x", "b", 1001)]
    )
    engine.feed_batch(frame)
    engine.close()
    assert runtime.events_seen == 2
    assert len(engine.matches()) == 1
    assert engine.stats.events == 1002


def test_feed_batch_rule_needing_every_event_sees_every_row() -> None:
    runtime = FakeRuntime()
    engine = _fake_engine(FakeRule("seq", needs_every_event=True), runtime=runtime)
    engine.feed_batch(pd.DataFrame([_ev("x", "c", t) for t in range(50)]))
    engine.close()
    assert runtime.events_seen == 50


def test_feed_batch_dead_letters_bad_rows_with_line_numbers() -> None:
    engine = _fake_engine(FakeRule("seq"))
    frame = pd.DataFrame(
        [
            _ev("x", "a", 1),
            {"k": "x", "type": "b", "ts": "not a time"},
            {"k": "x", "type": "b", "ts": 2, "v": "abc"},
            {"k": "x", "type": "b"},
            _ev("x", "b", 3),
        ]
    )
    engine.feed_batch(frame, source="batch.jsonl", lines=[10, 11, 12, 13, 14])
    engine.close()
    letters = engine.dead_letters()
    assert [(d["reason"], d["line"], d["input"]) for d in letters] == [
        ("bad_timestamp", 11, "batch.jsonl"),
        ("wrong_type", 12, "batch.jsonl"),
        ("missing_time", 13, "batch.jsonl"),
    ]
    assert [m["events"] for m in engine.matches()] == [{"a": [0], "b": [4]}]


def test_feed_batch_iso_timestamps_and_mixed_streams() -> None:
    engine = _fake_engine(FakeRule("seq"))
    frame = pd.DataFrame(
        [
            {"stream": "ev", "k": "x", "type": "a", "ts": "2026-01-01T00:00:00Z"},
            {"stream": "other", "k": "x", "type": "b", "ts": "2026-01-01T00:00:01Z"},
            {"stream": "ev", "k": "x", "type": "b", "ts": "2026-01-01T00:00:02+00:00"},
        ]
    )
    engine.feed_batch(frame)
    engine.close()
    [match] = engine.matches()
    assert match["start"] == "2026-01-01T00:00:00.000Z"
    assert match["end"] == "2026-01-01T00:00:02.000Z"
    assert [d["reason"] for d in engine.dead_letters()] == ["unknown_stream"]


# ---------------------------------------------------------------------- registration


def test_register_and_unregister_while_running() -> None:
    rules = {"one": FakeRule("one"), "two": FakeRule("two")}
    engine = Engine(compile_rule=lambda decl, **_: rules[decl.name], runtime=FakeRuntime())
    engine.register(_module(["one"], lateness_s=0))
    engine.feed(_ev("x", "a", 100))
    engine.register(ast.Module((_rule_decl("two"),)))  # uses the stream registered before
    engine.feed(_ev("x", "a", 101))
    engine.feed(_ev("x", "b", 102))
    engine.unregister("one")
    engine.feed(_ev("x", "a", 103))
    engine.feed(_ev("x", "b", 104))
    engine.close()
    got = [(m["name"], m["events"]) for m in engine.matches()]
    # `two` never saw the event fed before it was registered; `one` lost nothing it had matched
    assert got == [
        ("one", {"a": [0], "b": [2]}),
        ("two", {"a": [1], "b": [2]}),
        ("two", {"a": [3], "b": [4]}),
    ]
    assert engine.rules == ["two"]
    with pytest.raises(UnknownRuleError, match="one"):
        engine.unregister("one")


def test_unregister_keeps_other_rules_state() -> None:
    rules = {"one": FakeRule("one"), "two": FakeRule("two")}
    engine = Engine(compile_rule=lambda decl, **_: rules[decl.name], runtime=FakeRuntime())
    engine.register(_module(["one", "two"]))
    engine.feed(_ev("x", "a", 100))
    engine.feed(_ev("x", "c", 110))  # watermark 105: the a is released into both rules' state
    engine.unregister("one")
    engine.feed(_ev("x", "b", 108))
    engine.close()
    assert [(m["name"], m["events"]) for m in engine.matches()] == [("two", {"a": [0], "b": [2]})]


def test_register_twice_is_a_vigil_error() -> None:
    engine = _fake_engine(FakeRule("seq"))
    with pytest.raises(VigilError, match="duplicate|already"):
        engine.register(ast.Module((_rule_decl("seq"),)))


def test_register_rule_on_undeclared_stream_is_a_vigil_error() -> None:
    engine = Engine(compile_rule=lambda decl, **_: FakeRule(decl.name), runtime=FakeRuntime())
    bad = ast.RuleDecl("r", ("nowhere",), ast.PatVar("a"))
    with pytest.raises(VigilError, match="nowhere"):
        engine.register(ast.Module((bad,)))
    assert engine.rules == []


def _rule_decl(name: str) -> ast.RuleDecl:
    return ast.RuleDecl(
        name,
        ("ev",),
        ast.PatSeq((ast.PatVar("a"), ast.PatVar("b"))),
        by=(ast.KeyPart(((None, "k"),)),),
        within=ast.Duration(10_000),
    )


def test_lists_load_from_files_relative_to_the_rule_file(tmp_path) -> None:
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "bad.txt").write_text("c1\n\nc2\n")
    decl = ast.ListDecl("bad", path="lists/bad.txt", span=ast.Span(str(tmp_path / "r.vigil"), 1))
    assert load_list(decl) == frozenset({"c1", "c2"})
    assert load_list(ast.ListDecl("inline", values=("a", "b"))) == frozenset({"a", "b"})
    with pytest.raises(VigilError, match="cannot read list 'gone'"):
        load_list(ast.ListDecl("gone", path="missing.txt", span=ast.Span(str(tmp_path / "r"), 1)))


def test_large_lists_use_a_bloom_filter(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(program, "BLOOM_THRESHOLD", 10)
    (tmp_path / "big.txt").write_text("\n".join(f"v{i}" for i in range(100)))
    declared_in = ast.Span(str(tmp_path / "r.vigil"), 1)  # list files are read below it
    container = load_list(ast.ListDecl("big", path=str(tmp_path / "big.txt"), span=declared_in))
    assert not isinstance(container, frozenset)
    assert all(f"v{i}" in container for i in range(100))
    assert sum(f"w{i}" in container for i in range(1000)) < 5


# ---------------------------------------------------------------------- the keyed processor


def _processor(*rules: FakeRule) -> RuleProcessor:
    return RuleProcessor(list(rules), {"ev": _module([]).declarations[0]}, runtime=FakeRuntime())


def _raw(events):
    return [{**e, "stream": "ev", "_seq": i} for i, e in enumerate(events)]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(0, 40), max_size=5),
    shuffle=st.booleans(),
)
def test_processor_state_bytes_and_splits_do_not_change_results(seed, cuts, shuffle) -> None:
    rng = random.Random(seed)
    # Out of order only within lateness: then nothing is late however the input is split.
    events = _raw([e for e in _random_stream(rng, 40, beyond_lateness=False) if e["k"] == "x"])
    processor = _processor(FakeRule("seq"), FakeRule("gone", absence=True))
    whole = processor.process(("x",), None, events, None)
    whole_end = processor.close(("x",), whole.state)
    expected = sorted(m["match_id"] for m in whole.outputs + whole_end.outputs)

    state, got = None, []
    bounds = [0, *sorted(c for c in cuts if c <= len(events)), len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        chunk = events[lo:hi]
        if shuffle:
            chunk = rng.sample(chunk, len(chunk))  # within a call, order does not matter
        result = processor.process(("x",), state, chunk, None)
        got += result.outputs
        state = result.state
        if state is not None:
            assert processor.decode(state) is not None
    got += processor.close(("x",), state).outputs
    assert sorted(m["match_id"] for m in got) == expected


def test_processor_buffers_until_watermark_and_reports_timers() -> None:
    processor = _processor(FakeRule("gone", absence=True))
    result = processor.process(("x",), None, _raw([_ev("x", "a", 100)]), watermark_ms=100_000)
    assert result.outputs == [] and result.state is not None
    assert result.next_timer_ms == [110_000]
    fired = processor.on_timer(("x",), result.state, 110_000, 110_001)
    assert [m["events"] for m in fired.outputs] == [{"a": [0]}]
    assert fired.state is None


def test_processor_pending_events_wait_for_the_watermark() -> None:
    processor = _processor(FakeRule("seq"))
    first = processor.process(("x",), None, _raw([_ev("x", "a", 100), _ev("x", "b", 101)]), 0)
    assert first.outputs == []
    assert first.next_timer_ms == [100_000]  # wake up when the watermark reaches the a
    ks = processor.decode(first.state)
    assert [e.ts for e in ks.pending] == [100_000, 101_000]
    second = processor.process(("x",), first.state, [], 200_000)
    assert [m["events"] for m in second.outputs] == [{"a": [0], "b": [1]}]


def test_processor_late_events_and_bad_events_are_dead_letters() -> None:
    processor = _processor(FakeRule("seq"))
    first = processor.process(("x",), None, _raw([_ev("x", "c", 100)]), 100_000)
    raw = [
        {**_ev("x", "a", 50), "stream": "ev", "_seq": 7},
        {"k": "x", "type": "a", "ts": "soon", "stream": "ev", "_seq": 8},
    ]
    second = processor.process(("x",), first.state, raw, 100_000)
    assert [(d["reason"], d["line"]) for d in second.dead_letters] == [
        ("late", 7),
        ("bad_timestamp", 8),
    ]


def test_processor_key_of() -> None:
    processor = _processor(FakeRule("seq"))
    assert processor.key_of({"stream": "ev", "k": "x"}) == ("x",)
    assert processor.key_of({"stream": "ev"}) is None
    assert processor.key_of({"stream": "other", "k": "x"}) is None


def test_corrupted_state_bytes_raise_state_error() -> None:
    processor = _processor(FakeRule("seq"))
    good = processor.encode(KeyState(watermark=5))
    assert processor.decode(good).watermark == 5
    for bad in (b"", b"nonsense-bytes-here!", good[:-3], b"VGKS\x09" + good[5:]):
        with pytest.raises(StateError):
            processor.decode(bad)


def test_processor_rejects_rules_with_different_keys() -> None:
    other = FakeRule("other", key_fields={"ev": ("type",)})
    with pytest.raises(Exception, match="partitioned differently"):
        _processor(FakeRule("seq"), other)


def test_end_of_input_constant_is_int64() -> None:
    assert END_OF_INPUT == np.iinfo(np.int64).max


# ---------------------------------------------------------------------- the real NFA, end to end

FRAUD = """
stream txn (card_id string, amount float, merchant string, ts timestamp) time ts lateness 30s

rule card_testing "Tiny probe charges, then a large purchase on the same card"
  from txn by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
  emit card_id, count(probe) as probes, sum(probe.amount) as probed, big.amount as amount
  severity high
"""

TICKS = """
stream ticks (symbol string, price float, ts timestamp) time ts lateness 2s

rule v_shape
  from ticks by symbol
  pattern start down+ up+
  contiguity strict
  define down as price < prev(price),
         up   as price > prev(price)
  emit symbol, last(down).price as bottom, last(up).price as top
"""

ORDERS = """
stream orders (id string, status string, amount float, ts timestamp) time ts lateness 5s
stream payments (order_id string, amount float, ts timestamp) time ts lateness 5s

rule unpaid_order
  from orders, payments
  by orders.id = payments.order_id
  pattern placed !paid
  define placed as orders where status == "placed",
         paid   as payments
  within 15m
  emit placed.amount as amount
"""


def _txn_stream(seed: int, n: int, keys: int = 6) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t = 1_767_225_600.0
    out = []
    for _ in range(n):
        t += rng.choice([1, 5, 20, 60])
        amount = rng.choice([0.5, 0.7, 0.9, 20.0, 700.0, 900.0])
        out.append(
            {
                "card_id": f"c{rng.randrange(keys)}",
                "amount": amount,
                "merchant": rng.choice(["m1", "m2"]),
                "ts": t - rng.choice([0, 0, 0, 10, 25, 45]),  # 45 s is beyond the 30 s lateness
            }
        )
    return out


def _run_real(text: str, events, cuts=(), *, batch: bool, **kw):
    engine = Engine(**kw)
    engine.register(text)
    bounds = [0, *sorted(cuts), len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi <= lo:
            continue
        if batch:
            engine.feed_batch(pd.DataFrame(events[lo:hi]))
        else:
            for event in events[lo:hi]:
                engine.feed(event)
    engine.close()
    return engine


def test_real_card_testing_matches_and_emits() -> None:
    t = 1_767_225_600
    events = [{"card_id": "c1", "amount": 0.5, "merchant": "m1", "ts": t + i} for i in range(3)]
    events.append({"card_id": "c1", "amount": 900.0, "merchant": "m2", "ts": t + 60})
    engine = _run_real(FRAUD, events, batch=True)
    [match] = engine.matches()
    assert match["events"] == {"probe": [0, 1, 2], "big": [3]}
    assert match["values"] == {"card_id": "c1", "probes": 3, "probed": 1.5, "amount": 900.0}
    assert match["severity"] == "high"
    assert match["start"] == "2026-01-01T00:00:00.000Z"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), cuts=st.lists(st.integers(0, 150), max_size=4))
def test_real_runtime_feed_batch_equals_feed_and_split_does_not_matter(seed, cuts) -> None:
    events = _txn_stream(seed, 150)
    single = _run_real(FRAUD, events, batch=False)
    batched = _run_real(FRAUD, events, cuts, batch=True)
    assert _ids(batched.matches()) == _ids(single.matches())
    assert batched.stats.late == single.stats.late
    assert sorted(d["line"] is None for d in batched.dead_letters()) == sorted(
        d["line"] is None for d in single.dead_letters()
    )


def test_real_strict_rule_sees_every_event_in_batches() -> None:
    prices = [10, 9, 8, 9, 10, 7, 6, 8, 8, 7, 9]
    events = [
        {"symbol": symbol, "price": float(p), "ts": 1000 + i}
        for i, p in enumerate(prices)
        for symbol in "XY"
    ]
    one = _run_real(TICKS, events, batch=False)
    many = _run_real(TICKS, events, [3, 7, 15], batch=True)
    got = sorted(
        (m["key"]["symbol"], m["values"]["bottom"], m["values"]["top"]) for m in many.matches()
    )
    # 10 9 8 9 10 | 7 6 8 | 8 7 9 (the last one flushed at end of input)
    expected = [(s, b, t) for s in "XY" for b, t in ((6.0, 8.0), (7.0, 9.0), (8.0, 10.0))]
    assert got == expected
    assert _ids(one.matches()) == _ids(many.matches())


def test_real_absence_across_two_streams_keyed_by_different_field_names() -> None:
    t = 1_767_225_600
    events = [
        {"stream": "orders", "id": "o1", "status": "placed", "amount": 10.0, "ts": t},
        {"stream": "orders", "id": "o2", "status": "placed", "amount": 20.0, "ts": t + 60},
        {"stream": "payments", "order_id": "o1", "amount": 10.0, "ts": t + 300},
        {"stream": "payments", "order_id": "o3", "amount": 1.0, "ts": t + 3000},
    ]
    for batch in (False, True):
        engine = _run_real(ORDERS, events, batch=batch)
        [match] = engine.matches()
        assert list(match["key"].values()) == ["o2"]
        assert match["values"] == {"amount": 20.0}
        assert match["end"] == "2026-01-01T00:16:00.000Z"


def test_real_absence_fires_when_the_watermark_passes_before_end_of_input() -> None:
    t = 1_767_225_600
    engine = Engine()
    engine.register(ORDERS)
    engine.feed({"stream": "orders", "id": "o1", "status": "placed", "amount": 1.0, "ts": t})
    engine.feed({"stream": "payments", "order_id": "zz", "amount": 1.0, "ts": t + 10})
    assert engine.matches() == []
    engine.advance_watermark((t + 15 * 60) * 1000 + 1)
    assert [m["values"] for m in engine.drain()] == [{"amount": 1.0}]


def test_real_late_event_is_not_matched() -> None:
    t = 1_767_225_600
    events = [{"card_id": "c1", "amount": 0.5, "merchant": "m1", "ts": t + i} for i in range(3)]
    events.append({"card_id": "c1", "amount": 900.0, "merchant": "m2", "ts": t + 100})
    events.insert(2, {"card_id": "c9", "amount": 5.0, "merchant": "m1", "ts": t + 200})
    # the third probe is now 198 s behind the watermark (lateness 30 s): late, so no match
    engine = _run_real(FRAUD, events, batch=True)
    assert engine.matches() == []
    # the third probe (t+2) and the big purchase (t+100) are both behind t+200 - 30 s
    assert [(d["reason"], d["event"]["amount"]) for d in engine.dead_letters()] == [
        ("late", 0.5),
        ("late", 900.0),
    ]


def test_real_unregister_keeps_other_rule_running() -> None:
    t = 1_767_225_600
    engine = Engine()
    engine.register(FRAUD)
    engine.register(FRAUD.replace("card_testing", "card_testing_2").split("\n", 2)[2])
    for i in range(3):
        engine.feed({"card_id": "c1", "amount": 0.5, "merchant": "m1", "ts": t + i})
    engine.unregister("card_testing")
    engine.feed({"card_id": "c1", "amount": 900.0, "merchant": "m2", "ts": t + 60})
    engine.close()
    assert [m["name"] for m in engine.matches()] == ["card_testing_2"]


def test_real_processor_equals_engine() -> None:
    from cep.nfa.compiler import compile_rule
    from query_lang import parse

    module = parse(FRAUD)
    streams = {d.name: d for d in module.of_type(ast.StreamDecl)}
    [rule_decl] = module.of_type(ast.RuleDecl)
    rule = compile_rule(rule_decl, streams=streams)
    processor = RuleProcessor([rule], streams)
    events = [e for e in _txn_stream(3, 200, keys=1) if e["card_id"] == "c0"]
    raw = [{**e, "stream": "txn", "_seq": i} for i, e in enumerate(events)]
    state, outputs, letters = None, [], []
    for lo in range(len(raw)):  # one event a call: lateness is then judged per event
        result = processor.process(("c0",), state, raw[lo : lo + 1], None)
        state, outputs, letters = (
            result.state,
            outputs + result.outputs,
            letters + result.dead_letters,
        )
    outputs += processor.close(("c0",), state).outputs
    engine = _run_real(FRAUD, events, batch=True)
    # One key and one stream: the key's own watermark is the engine's, so the same events
    # are late and the same matches are reported.
    assert sorted(m["match_id"] for m in outputs) == sorted(m["match_id"] for m in engine.matches())
    assert len(letters) == engine.stats.late


# The batch path skips rows by their columnar masks (rows no variable can take; rows that cannot
# begin a match at a key with nothing pending); feeding one event at a time skips nothing.
# Both must report the same matches for every pattern shape.
SHAPES = {
    "relaxed_join": """
rule r from ev by k
  pattern a b+ c
  define a as kind == "a", b as kind == "b" and v > a.v, c as kind == "c"
  within 30s
""",
    "negation": """
rule r from ev by k
  pattern a !x b
  define a as kind == "a", x as kind == "x", b as kind == "b"
  within 30s
""",
    "trailing_absence": """
rule r from ev by k
  pattern a !x
  define a as kind == "a" and v > 2, x as kind == "x"
  within 10s
""",
    "any": """
rule r from ev by k
  pattern a b c
  contiguity any
  define a as kind == "a", b as kind == "b", c as kind == "c"
  within 20s
""",
    "alternation_skip_to_next": """
rule r from ev by k
  pattern (a | b) c* d
  define a as kind == "a", b as kind == "b", c as kind == "c", d as kind == "d"
  within 1m
  after match skip to next
""",
    "strict_prev": """
rule r from ev by k
  pattern a b+
  contiguity strict
  define a as kind == "a", b as v > prev(v)
""",
}

SHAPE_STREAM = "stream ev (k string, kind string, v int, ts timestamp) time ts lateness 3s\n"


def _shape_events(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t = 1_000.0
    out = []
    for _ in range(n):
        t += rng.choice([0, 1, 2, 5])
        out.append(
            {
                "k": rng.choice("xy"),
                "kind": rng.choice("aabbccdxnnnn"),  # "n" fits no variable
                "v": rng.randrange(6),
                "ts": t - rng.choice([0, 0, 1, 2, 6]),  # 6 s is beyond the 3 s lateness
            }
        )
    return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(0, 80), max_size=4))
def test_real_batch_skipping_never_changes_matches(shape, seed, cuts) -> None:
    text = SHAPE_STREAM + SHAPES[shape]
    events = _shape_events(seed, 80)
    single = _run_real(text, events, batch=False)
    batched = _run_real(text, events, cuts, batch=True)
    assert _ids(batched.matches()) == _ids(single.matches())
    assert batched.stats.late == single.stats.late


def test_real_per_step_keys_follow_a_process_to_its_child() -> None:
    text = """
stream proc (host string, pid int, ppid int, name string, ts timestamp) time ts
rule child from proc by host
  pattern parent child
  define parent as name == "cmd" by pid,
         child as name == "powershell" by ppid
  within 1m
"""
    events = [
        {"host": "h", "pid": 10, "ppid": 1, "name": "cmd", "ts": 1},
        {"host": "h", "pid": 11, "ppid": 99, "name": "powershell", "ts": 2},  # other parent
        {"host": "h", "pid": 12, "ppid": 10, "name": "powershell", "ts": 3},
    ]
    for batch in (False, True):
        engine = _run_real(text, events, batch=batch)
        assert [(m["key"], m["events"]) for m in engine.matches()] == [
            ({"host": "h", "pid": 10}, {"parent": [0], "child": [2]})
        ]


def test_late_dead_letter_names_the_watermark_the_event_met() -> None:
    for batch in (False, True):
        engine = _fake_engine(FakeRule("seq"), lateness_s=5)
        rows = [_ev("x", "c", 100), _ev("x", "c", 90), _ev("x", "c", 200)]
        if batch:
            engine.feed_batch(pd.DataFrame(rows))
        else:
            for row in rows:
                engine.feed(row)
        [letter] = engine.dead_letters()
        assert letter["detail"] == (
            "event time 1970-01-01T00:01:30.000Z is behind the watermark 1970-01-01T00:01:35.000Z"
        )


def test_real_search_condition_uses_the_percolator() -> None:
    text = """
stream news (id string, body text, ts timestamp) time ts
rule merger_news from news
  pattern a b
  define a as search(body, "merger AND layoff*"), b as search(body, "acme")
  within 1h
"""
    events = [
        {"id": "n1", "body": "Merger talks, layoffs expected", "ts": 10},
        {"id": "n2", "body": "Nothing to see", "ts": 20},
        {"id": "n3", "body": "ACME denies everything", "ts": 30},
    ]
    for batch in (False, True):
        engine = _run_real(text, events, batch=batch)
        assert [m["events"] for m in engine.matches()] == [{"a": ["n1"], "b": ["n3"]}]


def test_real_register_a_file_with_include_and_list(tmp_path) -> None:
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "stolen.txt").write_text("c9\nc7\n")
    (tmp_path / "common.vigil").write_text(
        "stream txn (card_id string, amount float, ts timestamp) time ts\n"
        'list stolen from "lists/stolen.txt"\n'
    )
    rules = tmp_path / "rules.vigil"
    rules.write_text(
        'include "common.vigil"\n'
        "rule stolen_card_use from txn by card_id pattern t define t as card_id in stolen\n"
    )
    engine = Engine()
    assert engine.register(str(rules)) == ["stolen_card_use"]
    # a second file including the same declarations registers too
    other = tmp_path / "more.vigil"
    other.write_text(
        'include "common.vigil"\nrule big from txn by card_id pattern b define b as amount > 100\n'
    )
    assert engine.register(other) == ["big"]
    for card, amount, ts in (("c1", 5.0, 1), ("c7", 500.0, 2)):
        engine.feed({"card_id": card, "amount": amount, "ts": ts})
    engine.close()
    assert sorted((m["name"], m["key"]["card_id"]) for m in engine.matches()) == [
        ("big", "c7"),
        ("stolen_card_use", "c7"),
    ]


def test_real_register_reports_errors_with_positions(tmp_path) -> None:
    bad = tmp_path / "bad.vigil"
    bad.write_text(
        "stream s (x int, ts timestamp) time ts\nrule r from s pattern a within 5 parsecs\n"
    )
    with pytest.raises(VigilError) as info:
        Engine().register(bad)
    assert f"{bad}:2:" in str(info.value)
    with pytest.raises(VigilError, match="file not found"):
        Engine().register(tmp_path / "missing.vigil")


def test_a_batch_whose_every_row_is_bad_after_a_good_one_is_dead_lettered() -> None:
    # Once crashed with "shape mismatch": the watermark kept the previous batch's arrival
    # times when a batch had no valid row left to observe.
    engine = Engine()
    engine.register(
        "stream t (card string, price float, ts timestamp) time ts\n"
        "rule big from t by card pattern a b define a as price > 1, b as price > 2\n"
    )
    engine.feed_batch(pd.DataFrame({"stream": ["t", "t"], "card": ["c", "c"],
                                    "price": [2.0, 3.0], "ts": [1_000, 2_000]}))
    engine.feed_batch(pd.DataFrame({"stream": ["t"], "card": ["c"], "price": ["bad"],
                                    "ts": [3_000]}))
    engine.close()
    assert [m["name"] for m in engine.drain()] == ["big"]
    assert [d["reason"] for d in engine.dead_letters()] == ["wrong_type"]


def test_a_list_file_is_read_as_an_included_rule_file_is(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("VIGIL_INCLUDE_PATH", raising=False)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "cards.txt").write_text("c1\n\nc2\n")
    stream = "stream t (card string, ts timestamp) time ts\n"
    path = rules / "ok.vigil"
    path.write_text(stream + 'list cards from "cards.txt"\n'
                    "rule r from t pattern a define a as card in cards\n")
    engine = Engine()
    assert engine.register(str(path)) == ["r"]
    os.mkfifo(rules / "pipe.txt")
    for target, reason in [("/dev/zero", "outside the directories"),
                           ("../outside.txt", "outside the directories"),
                           ("pipe.txt", "not a regular file (a named pipe)")]:
        (tmp_path / "outside.txt").write_text("x\n")
        bad = rules / "bad.vigil"
        bad.write_text(stream + f'list leak from "{target}"\n')
        with pytest.raises(VigilError) as caught:
            Engine().register(str(bad))
        message = str(caught.value)
        assert "cannot read list 'leak'" in message and reason in message
        assert f"{bad}:2:1" in message


def test_rules_of_two_key_definitions_each_see_an_event_fed_alone() -> None:
    # Dispatch aligns an event's masks to each group's slots; the first group's view must not
    # become the next group's (it did: the keyed rule registered second saw nothing).
    program = """
stream s (k string, u string, ts timestamp) time ts
rule o from s pattern e define e as k == "g"
rule r from s by u pattern v1 v2 define v1 as k == "a", v2 as k == "b"
"""
    rows = [{"k": kind, "u": "x", "ts": 1_767_225_600 + i} for i, kind in enumerate("abg")]
    found = []
    for batch in (False, True):
        engine = Engine()
        engine.register(program)
        if batch:
            engine.feed_batch(pd.DataFrame(rows))
        else:
            for row in rows:
                engine.feed(row)
        engine.close()
        found.append(sorted(m["name"] for m in engine.drain()))
    assert found == [["o", "r"], ["o", "r"]]
