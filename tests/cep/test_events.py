"""Tests of event validation: every field type, timestamps, ids, each dead-letter reason, and
the column-wise path agreeing with the row-wise one."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.events.event import (
    BadEventError,
    EventReason,
    StreamSchema,
    dead_letter,
    parse_json_line,
    parse_timestamp,
    stream_of,
)
from query_lang import ast, parse

TXN = ast.StreamDecl(
    "txn",
    (
        ast.FieldDecl("card_id", "string"),
        ast.FieldDecl("amount", "float"),
        ast.FieldDecl("n", "int"),
        ast.FieldDecl("ok", "bool"),
        ast.FieldDecl("note", "text"),
        ast.FieldDecl("tags", "list<string>"),
        ast.FieldDecl("seen", "timestamp"),
        ast.FieldDecl("ts", "timestamp"),
    ),
    time_field="ts",
    lateness=ast.Duration(30_000),
)
SCHEMA = StreamSchema.from_decl(TXN)


def _norm(raw, schema=SCHEMA, seq=0, position=0):
    return schema.normalise(raw, seq=seq, position=position)


def test_every_type_is_normalised() -> None:
    ev = _norm(
        {
            "id": "t-1",
            "card_id": "c1",
            "amount": 3,  # an int is accepted for a float
            "n": 4.0,  # an integral float is accepted for an int
            "ok": True,
            "note": "hello",
            "tags": ["a", "b"],
            "seen": "2026-01-01T00:00:00+01:00",
            "ts": 1_767_225_600.5,
            "extra": {"kept": True},  # undeclared fields stay readable (open schema)
            "stream": "txn",
        },
        seq=9,
    )
    assert ev.id == "t-1" and ev.stream == "txn" and ev.seq == 9
    assert ev.ts == 1_767_225_600_500
    assert ev.fields["amount"] == 3.0 and isinstance(ev.fields["amount"], float)
    assert ev.fields["n"] == 4 and isinstance(ev.fields["n"], int)
    assert ev.fields["seen"] == 1_767_222_000_000
    assert ev.fields["ts"] == ev.ts
    assert ev.fields["extra"] == {"kept": True}
    assert "stream" not in ev.fields


def test_null_fields_are_allowed_and_id_falls_back_to_position() -> None:
    ev = _norm({"card_id": None, "ts": 5}, position=17)
    assert ev.id == 17 and ev.fields["card_id"] is None and ev.ts == 5000


def test_declared_id_field_and_millisecond_unit() -> None:
    [decl] = parse("stream s (eid string, at timestamp) time at unit ms id eid\n").declarations
    schema = StreamSchema.from_decl(decl)
    ev = _norm({"eid": "e7", "at": 1_700_000_000_123}, schema)
    assert ev.id == "e7" and ev.ts == 1_700_000_000_123
    assert schema.lateness_ms == 0


def test_lateness_override() -> None:
    assert SCHEMA.lateness_ms == 30_000
    assert StreamSchema.from_decl(TXN, lateness_ms=0).lateness_ms == 0


@pytest.mark.parametrize(
    ("raw", "reason", "detail"),
    [
        ({"amount": "abc", "ts": 1}, "wrong_type", "'amount' expected float, got string \"abc\""),
        ({"amount": True, "ts": 1}, "wrong_type", "field 'amount' expected float, got bool true"),
        ({"n": 1.5, "ts": 1}, "wrong_type", "field 'n' expected int, got float 1.5"),
        ({"ok": 1, "ts": 1}, "wrong_type", "field 'ok' expected bool, got int 1"),
        ({"card_id": 12, "ts": 1}, "wrong_type", "field 'card_id' expected string, got int 12"),
        ({"tags": ["a", 1], "ts": 1}, "wrong_type", 'expected list<string>, got list ["a", 1]'),
        ({"amount": 1.0}, "missing_time", "time field 'ts' is missing or null"),
        ({"ts": None}, "missing_time", "time field 'ts' is missing or null"),
        ({"ts": "last tuesday"}, "bad_timestamp", "field 'ts' expected an ISO-8601 timestamp"),
        ({"ts": [1]}, "bad_timestamp", "got list [1]"),
        ({"ts": 1, "seen": "2026-13-45"}, "bad_timestamp", "field 'seen'"),
    ],
)
def test_bad_events_name_the_field_and_value(raw, reason, detail) -> None:
    with pytest.raises(BadEventError) as info:
        _norm(raw)
    assert info.value.reason == reason
    assert detail in info.value.detail


def test_parse_json_line_reasons() -> None:
    assert parse_json_line('{"a": 1}') == {"a": 1}
    with pytest.raises(BadEventError) as info:
        parse_json_line("{oops")
    assert info.value.reason == EventReason.INVALID_JSON
    with pytest.raises(BadEventError) as info:
        parse_json_line('"just a string"')
    assert info.value.reason == EventReason.NOT_AN_OBJECT
    assert info.value.detail == "expected a JSON object, got a string"


def test_stream_of_binding_field_and_single_stream_default() -> None:
    other = StreamSchema.from_decl(ast.StreamDecl("other", (), time_field="ts"))
    both = {"txn": SCHEMA, "other": other}
    assert stream_of({"stream": "other"}, None, both) is other
    assert stream_of({"stream": "other"}, "txn", both) is SCHEMA  # a binding wins
    assert stream_of({}, None, {"txn": SCHEMA}) is SCHEMA  # the only stream
    with pytest.raises(BadEventError) as info:
        stream_of({}, None, both)
    assert info.value.reason == EventReason.NO_STREAM
    with pytest.raises(BadEventError) as info:
        stream_of({"stream": "nope"}, None, both)
    assert info.value.reason == EventReason.UNKNOWN_STREAM
    assert "'nope'" in info.value.detail or '"nope"' in info.value.detail


def test_stream_without_time_field_is_reported() -> None:
    schema = StreamSchema.from_decl(ast.StreamDecl("s", (ast.FieldDecl("x", "int"),)))
    assert schema.time_field is None
    with pytest.raises(BadEventError, match="declares no time field"):
        _norm({"x": 1}, schema)


def test_the_only_timestamp_field_is_the_time_field_by_default() -> None:
    schema = StreamSchema.from_decl(ast.StreamDecl("s", (ast.FieldDecl("at", "timestamp"),)))
    assert schema.time_field == "at"


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        ("1970-01-01T00:00:01Z", 1000, 1000),
        ("1970-01-01T00:00:01.250", 1000, 1250),  # no offset: UTC
        ("1970-01-01T01:00:00+01:00", 1000, 0),
        (2, 1000, 2000),
        (2.5, 1000, 2500),
        (2500, 1, 2500),
    ],
)
def test_parse_timestamp(value, unit, expected) -> None:
    assert parse_timestamp(value, unit) == expected


def test_dead_letter_shape() -> None:
    letter = dead_letter("late", "why", input="f.jsonl", line=3, raw="{}", stream="txn")
    assert letter == {
        "reason": "late",
        "detail": "why",
        "input": "f.jsonl",
        "line": 3,
        "raw": "{}",
        "stream": "txn",
    }
    from_event = dead_letter("late", "why", event={"a": np.int64(3), "b": float("nan")})
    assert json.loads(from_event["raw"]) == {"a": 3, "b": None}
    assert from_event["input"] == "-"


# ---------------------------------------------------------------------- column-wise == row-wise

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(-10, 10, allow_nan=False),
    st.sampled_from(["", "abc", "2026-01-01T00:00:00Z", "1970-01-01T00:00:01.5+00:00", "x1"]),
    st.lists(st.sampled_from(["a", "b"]), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "card_id": _VALUES,
                "amount": _VALUES,
                "n": _VALUES,
                "ok": _VALUES,
                "tags": _VALUES,
                "ts": st.one_of(
                    _VALUES,
                    st.integers(0, 2_000_000_000),
                    st.sampled_from(["2026-03-01T10:00:00Z", "2026-03-01 10:00:00"]),
                ),
            },
        ),
        min_size=1,
        max_size=12,
    )
)
def test_frame_validation_agrees_with_row_validation(rows) -> None:
    frame = pd.DataFrame(rows)
    normalised, ts, bad = SCHEMA.normalise_frame(frame)
    expected_ok, expected_bad = {}, {}
    for i, raw in enumerate(rows):
        try:
            expected_ok[i] = _norm(raw, seq=i, position=i)
        except BadEventError as exc:
            expected_bad[i] = exc.reason
    assert {pos: reason for pos, reason, _ in bad} == expected_bad
    assert list(normalised.index) == sorted(expected_ok)
    assert ts.tolist() == [expected_ok[i].ts for i in sorted(expected_ok)]
    positions = np.array(sorted(expected_ok), dtype=np.int64)
    events = SCHEMA.events_from_frame(normalised, positions, positions)
    for event in events:
        want = expected_ok[event.seq]
        assert event.ts == want.ts and event.id == want.id
        for name, value in want.fields.items():
            got = event.fields.get(name)
            if isinstance(value, float) and isinstance(got, float):
                assert got == pytest.approx(value)
            else:
                assert got == value, (name, got, value)
