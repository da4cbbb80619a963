"""``time ts sent S received R``: device clock correction declared on a stream — parsing,
canonical printing, and ``vigil check``'s errors for misuse."""

from __future__ import annotations

import pytest

from query_lang import ast, check_declarations, parse, print_module

APP = (
    "stream app (user string, ts timestamp, sent_at timestamp, received_at timestamp)\n"
    "  time ts sent sent_at received received_at lateness 5s\n"
)


def _errors(text: str) -> list[tuple[int, int, str]]:
    return [(e.line, e.column, e.message) for e in check_declarations(parse(text).declarations)]


def test_parses_sources_in_order_and_prints_canonically() -> None:
    decl, = parse(
        "stream app (ts int, s int, r int) time ts unit ms received r sent s ahead 1h"
    ).declarations
    assert isinstance(decl, ast.StreamDecl)
    assert [(t.kind, t.field) for t in decl.time_sources] == [("received", "r"), ("sent", "s")]
    assert (decl.time_unit, decl.time_source("sent"), decl.time_source("received")) == (
        "ms", "s", "r"
    )
    assert decl.device_time_field == "ts_device"
    printed = print_module(parse(print_module(parse(decl_text := print_module(parse(
        "stream app (ts int, s int, r int) time ts unit ms received r sent s ahead 1h"
    ))))))
    assert printed == decl_text
    assert ") time ts unit ms sent s received r ahead 1h" in printed


def test_keywords_stay_usable_after_the_sources() -> None:
    decl, = parse(APP).declarations
    assert decl.lateness.ms == 5000 and decl.time_source("received") == "received_at"
    # a field may be called like a kind
    decl, = parse("stream s (ts timestamp, sent timestamp, received timestamp) "
                  "time ts sent sent received received").declarations
    assert (decl.time_source("sent"), decl.time_source("received")) == ("sent", "received")


def test_clean_program_reads_the_device_time() -> None:
    assert _errors(
        APP + "rule r from app by user pattern a define a as ts_device < ts\n"
        "  emit user, a.ts_device as device\n"
    ) == []


def test_the_device_time_is_not_a_field_without_correction() -> None:
    errors = _errors(
        "stream app (user string, ts timestamp) time ts\n"
        "rule r from app by user pattern a define a as ts_device < ts\n"
    )
    assert errors and "ts_device" in errors[0][2]


@pytest.mark.parametrize(
    ("options", "fields", "at", "message"),
    [
        ("sendt s received r", "", "sendt s",
         "unknown time field kind 'sendt' in stream 'a'; expected one of: sent, received"),
        ("sent s sent r", "", "sent r", "stream 'a' names its 'sent' field twice"),
        ("sent s received s", "", "received s",
         "field 's' of stream 'a' is named twice as a time field"),
        ("sent ts received r", "", "sent ts",
         "field 'ts' of stream 'a' is named twice as a time field"),
        ("sent s received q", "", "received q", "received field 'q' is not a field of stream 'a'"),
        ("sent s received u", ", u string", "received u",
         "received field 'u' must be a timestamp, not string"),
        ("sent s", "", "sent s",
         "stream 'a' corrects its device clock with both 'sent' and 'received'; "
         "add `received FIELD`"),
        ("sent s received r", ", ts_device int", "ts_device int",
         "stream 'a' declares field 'ts_device', where a clock-corrected stream keeps the "
         "device's own time: rename it"),
    ],
)
def test_check_errors(options: str, fields: str, at: str, message: str) -> None:
    text = f"stream a (ts timestamp, s timestamp, r timestamp{fields}) time ts {options}"
    # A kind misspelt or named twice also leaves the other kind missing: that error aside.
    found = [e for e in _errors(text) if "add `" not in e[2] or "add `" in message]
    assert found == [(1, text.rindex(at) + 1, message)]
