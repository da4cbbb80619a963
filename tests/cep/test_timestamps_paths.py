"""One reading of event times on every path: the embedded engine (row by row and column-wise),
the Spark worker's validation, the percolator and the Spark output records all agree, and all
agree with :mod:`query_lang.timestamps`."""

from __future__ import annotations

import pandas as pd
import pytest

from cep.events import EventReason, StreamSchema, parse_timestamp, time_column_ms, validate_raw
from percolator.analysis import timestamp_seconds as percolator_seconds
from query_lang import parse
from query_lang.ast import StreamDecl
from query_lang.timestamps import format_iso_ms, parse_iso_ms
from spark_udf.records import match_time_ms

CASES = [
    ("2023-11-14T22:13:20.123Z", 1_700_000_000_123),
    ("2023-11-14T22:13:20.123+00:00", 1_700_000_000_123),
    ("2023-11-14T23:13:20.123+01:00", 1_700_000_000_123),
    ("2023-11-14T22:13:20.123", 1_700_000_000_123),  # no zone: UTC on every path
    ("2023-11-14 22:13:20.123", 1_700_000_000_123),
    ("2023-11-14T22:13:20.1239Z", 1_700_000_000_123),  # sub-millisecond digits dropped
    ("2023-11-14", 1_699_920_000_000),
    (" 2023-11-14T22:13:20Z ", 1_700_000_000_000),
    ("1969-12-31T23:59:59.999Z", -1),
]

SCHEMA = StreamSchema.from_decl(
    parse("stream s (ts timestamp, x int) time ts").of_type(StreamDecl)[0]
)


@pytest.mark.parametrize(("text", "ms"), CASES)
def test_every_path_reads_a_time_alike(text: str, ms: int) -> None:
    assert parse_iso_ms(text) == ms
    assert parse_timestamp(text) == ms
    assert time_column_ms(pd.Series([text]), "ts", 1000).tolist() == [float(ms)]
    assert percolator_seconds(text) == ms / 1000.0
    assert match_time_ms(text) == ms
    dead: list[dict] = []
    event = validate_raw({"stream": "s", "ts": text, "x": 1, "_seq": 0}, {"s": SCHEMA}, dead, "t")
    assert dead == [] and event is not None and event.ts == ms
    frame, ts, bad = SCHEMA.normalise_frame(pd.DataFrame({"ts": [text], "x": [1]}))
    assert bad == [] and ts.tolist() == [ms]


@pytest.mark.parametrize(("text", "ms"), CASES)
def test_written_times_read_back(text: str, ms: int) -> None:
    assert parse_iso_ms(format_iso_ms(ms)) == ms


@pytest.mark.parametrize("text", ["soon", "2023-13-01T00:00:00Z", "", "12:00"])
def test_every_path_rejects_what_is_not_a_time(text: str) -> None:
    assert parse_iso_ms(text) is None
    assert percolator_seconds(text) is None
    assert match_time_ms(text) is None
    dead: list[dict] = []
    validate_raw({"stream": "s", "ts": text, "x": 1, "_seq": 0}, {"s": SCHEMA}, dead, "t")
    assert [d["reason"] for d in dead] == [EventReason.BAD_TIMESTAMP]
    _, _, bad = SCHEMA.normalise_frame(pd.DataFrame({"ts": [text], "x": [1]}))
    assert [reason for _, reason, _ in bad] == [EventReason.BAD_TIMESTAMP]


def test_times_iso_cannot_show_are_refused_when_written() -> None:
    assert format_iso_ms(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"
    with pytest.raises(ValueError, match="outside the years"):
        format_iso_ms(253_402_300_800_000)
