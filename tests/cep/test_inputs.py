"""The embedded engine's inputs (``cep.inputs``): the column-wise parse against parsing each
line alone, bounded reading of long lines, and cursors that resume a read where it stopped.

The reference here is how ``vigil run --engine embedded`` fed the engine before the inputs
became column-wise: each line decoded and parsed alone (``line_text``, ``parse_json_line``),
chunks of N events, runs of parsed events as one ``DataFrame.from_records`` batch, the dead
letters between them. Fed the same file, both must give the same matches, dead letters (in
order, with their lines), positions and stats.
"""

from __future__ import annotations

import io
import json
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from event_lines import EXAMPLES, PROGRAM, event_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.engine import Engine
from cep.events.event import STREAM_FIELD, BadEventError, dead_letter, parse_json_line
from cep.events.limits import MAX_EVENT_BYTES, line_text
from cep.inputs import EventBatch, EventInput, InputReader, LineParser, LineReader, chunked
from cep.inputs.lines import SHOWN_BYTES

FUZZ = settings(
    max_examples=EXAMPLES, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)


# ---------------------------------------------------------------------- the reference


def _reference_feed(engine: Engine, data: bytes, source: str, chunk_rows: int,
                    stream: str | None = None) -> None:
    """The feeding of ``vigil run`` before ``cep.inputs``: line by line."""
    records = []
    position = 0
    for number, line in enumerate(io.BytesIO(data), start=1):
        text = line_text(line)
        if not text:
            continue
        try:
            event = parse_json_line(text)
            if stream is not None:
                event[STREAM_FIELD] = stream
            letter = None
        except BadEventError as exc:
            event = None
            letter = dead_letter(exc.reason, exc.detail, input=source, line=number, raw=text)
        records.append((number, position, text, event, letter))
        position += 1
    for lo in range(0, len(records), chunk_rows):
        run: list = []
        for record in [*records[lo:lo + chunk_rows], None]:
            if record is not None and record[3] is not None:
                run.append(record)
                continue
            if run:
                engine.feed_batch(
                    pd.DataFrame.from_records([r[3] for r in run]), source=[source] * len(run),
                    lines=[r[0] for r in run], positions=[r[1] for r in run],
                    raw=[r[2] for r in run],
                )
            run = []
            if record is not None:
                engine.reject(record[4])


def _new_feed(engine: Engine, path: str, chunk_rows: int, stream: str | None = None,
              columnar: bool = True) -> int:
    """Feed through ``cep.inputs``; returns how many batches the column-wise parse gave."""
    reader = InputReader([EventInput(path, stream)], {}, chunk_rows=chunk_rows,
                         columnar=columnar, background=False)
    batches = 0
    for step in reader:
        for piece in step.pieces:
            if isinstance(piece, EventBatch):
                batches += 1
                engine.feed_batch(piece.frame, source=piece.source, lines=piece.lines,
                                  positions=piece.positions, raw=piece.raw)
            else:
                engine.reject(piece)
    return batches


def _outcome(engine: Engine) -> tuple[list, list, object]:
    engine.close()
    letters = engine.drain_dead_letters()
    for letter in letters:
        # A line over the limit is not held whole: its dead letter shows its head.
        if letter["reason"] in ("too_large", "invalid_utf8") and (
            len(letter["raw"]) > SHOWN_BYTES or letter["raw"].endswith(" ...")
        ):
            letter["raw"] = letter["raw"][:SHOWN_BYTES // 2]
    return engine.drain(), letters, engine.stats


def _both(tmp_path, data: bytes, chunk_rows: int, stream: str | None = None,
          program: str = PROGRAM):
    path = tmp_path / "events.jsonl"
    path.write_bytes(data)
    old, new = Engine(now_ms=1_767_225_600_000 + 10**9), Engine(now_ms=1_767_225_600_000 + 10**9)
    for engine in (old, new):
        engine.register(program)
    _reference_feed(old, data, str(path), chunk_rows, stream)
    _new_feed(new, str(path), chunk_rows, stream)
    return _outcome(old), _outcome(new)


@FUZZ
@given(lines=event_file(), chunk_rows=st.sampled_from([1, 3, 7, 20_000]),
       bound=st.booleans())
def test_the_column_wise_read_feeds_what_reading_each_line_alone_feeds(
    tmp_path_factory, lines, chunk_rows, bound
) -> None:
    tmp_path = tmp_path_factory.mktemp("diff")
    data = b"\n".join(lines) + b"\n"
    (matches, letters, stats), (new_matches, new_letters, new_stats) = _both(
        tmp_path, data, chunk_rows, "txn" if bound else None
    )
    assert new_matches == matches
    assert new_letters == letters
    assert new_stats == stats


# ---------------------------------------------------------------------- one case at a time

GOOD = {"id": "e1", "card_id": "c1", "amount": 2.5, "n": 1, "ok": True, "tags": ["x"],
        "title": "alpha", "ts": 1_767_225_600_000}

#: Lines pyarrow reads, refuses or reads otherwise than ``json``: each must come out of the
#: reader as it comes out of the one-line parser.
EDGE_LINES = {
    "plain": json.dumps(GOOD),
    "crlf": json.dumps(GOOD) + "\r",
    "spaces-inside": json.dumps(GOOD, indent=None, separators=(" , ", " : ")),
    "nan": json.dumps(GOOD)[:-1] + ', "x": NaN}',
    "infinity": json.dumps(GOOD)[:-1] + ', "x": -Infinity}',
    "overflow": json.dumps(GOOD)[:-1] + ', "x": 1e400}',
    "int-64": json.dumps({**GOOD, "x": 2**63 - 1}),
    "int-beyond-64": json.dumps({**GOOD, "x": 2**63}),
    "int-beyond-64-negative": json.dumps({**GOOD, "x": -(2**63) - 1}),
    "int-309-digits": json.dumps(GOOD)[:-1] + ', "x": 1' + "0" * 309 + "}",
    "float-and-int": json.dumps({**GOOD, "x": 1.0}),
    "exponent": json.dumps(GOOD)[:-1] + ', "x": 1E2}',
    "duplicate-key": json.dumps(GOOD)[:-1] + ', "n": 2}',
    "object": json.dumps({**GOOD, "x": {"a": 1}}),
    "empty-object": json.dumps({**GOOD, "x": {}}),
    "list-of-doubles": json.dumps({**GOOD, "x": [1, 2.5]}),
    "list-of-lists": json.dumps({**GOOD, "x": [["a"]]}),
    "empty-list": json.dumps({**GOOD, "tags": []}),
    "null-list": json.dumps({**GOOD, "tags": None}),
    "list-of-nulls": json.dumps({**GOOD, "x": [None, None]}),
    "list-with-null": json.dumps({**GOOD, "tags": ["x", None]}),
    "time-text": json.dumps({**GOOD, "when": "2026-01-01T00:00:00Z", "day": "2026-01-02"}),
    "time-text-ts": json.dumps({**GOOD, "ts": "2026-01-01T00:00:01Z"}),
    "surrogate-pair": json.dumps({**GOOD, "title": "\U0001f600"}, ensure_ascii=True),
    "lone-surrogate": json.dumps(GOOD)[:-1] + ', "x": "\\ud800"}',
    "nul-escape": json.dumps({**GOOD, "title": "a\u0000b"}),
    "control-char": json.dumps(GOOD)[:-1] + ', "x": "a\x01b"}',
    "two-objects": json.dumps(GOOD) + " " + json.dumps(GOOD),
    "trailing-garbage": json.dumps(GOOD) + " x",
    "array": "[1, 2]",
    "bom": "\ufeff" + json.dumps(GOOD),
    "nbsp-around": "\u00a0" + json.dumps(GOOD) + "\u2028",
    "unicode": json.dumps({**GOOD, "title": "café ☕"}, ensure_ascii=False),
    "missing-fields": json.dumps({"id": "e2", "ts": 1_767_225_600_000}),
    "null-fields": json.dumps({**GOOD, "amount": None, "ok": None, "title": None}),
    "bool-for-int": json.dumps({**GOOD, "n": True}),
    "text-for-float": json.dumps({**GOOD, "amount": "2.5"}),
    "stream-field": json.dumps({**GOOD, "stream": "txn"}),
    "empty-key": json.dumps({**GOOD, "": 1}),
    "deep": json.dumps(GOOD)[:-1] + ', "x": ' + "[" * 70 + "]" * 70 + "}",
    "brackets-in-text": json.dumps({**GOOD, "title": "[" * 70 + "{" * 70}),
    "invalid-utf8": (json.dumps(GOOD)[:-1] + ', "x": "caf\udce9"}'),
}


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


@pytest.mark.parametrize("case", sorted(EDGE_LINES))
@pytest.mark.parametrize("chunk_rows", [2, 20_000])
def test_each_kind_of_line_is_fed_as_the_one_line_parser_reads_it(tmp_path, case, chunk_rows):
    good = [json.dumps({**GOOD, "id": f"g{i}", "amount": [2.5, 600.0][i % 2],
                        "ts": GOOD["ts"] + i * 1000}) for i in range(5)]
    lines = [*good[:2], EDGE_LINES[case], *good[2:], EDGE_LINES[case], ""]
    data = b"\n".join(_bytes(line) for line in lines) + b"\n"
    (matches, letters, stats), (new_matches, new_letters, new_stats) = _both(
        tmp_path, data, chunk_rows
    )
    assert (new_matches, new_letters, new_stats) == (matches, letters, stats)


@pytest.mark.parametrize("case", sorted(EDGE_LINES))
def test_a_column_wise_frame_equals_the_frame_of_the_lines_parsed_alone(case):
    """Where the column-wise parse is taken, its frame holds what ``from_records`` of the
    one-line parser's events holds (a null may be None where ``from_records`` has NaN)."""
    lines = [_bytes(EDGE_LINES[case]), _bytes(json.dumps(GOOD))]
    data = b"\n".join(lines) + b"\n"
    [chunk] = chunked([LineReader(io.BytesIO(data).read, "x").block(at_end=True)])
    pieces = LineParser().pieces(chunk)
    expected = LineParser(columnar=False).pieces(chunk)
    assert [type(p) for p in pieces] == [type(p) for p in expected]
    for got, want in zip(pieces, expected, strict=True):
        if isinstance(got, dict):
            assert got == want
            continue
        assert list(got.frame.columns) == list(want.frame.columns)
        assert got.frame.dtypes.tolist() == want.frame.dtypes.tolist()
        assert _plain_rows(got.frame) == _plain_rows(want.frame)
        assert got.lines.tolist() == want.lines.tolist()
        assert got.positions.tolist() == want.positions.tolist()
        assert list(got.raw) == list(want.raw)


def _plain_rows(frame: pd.DataFrame) -> list[dict]:
    def plain(value):
        if isinstance(value, float) and value != value:
            return None
        if isinstance(value, np.generic):
            return value.item()
        return value

    return [{k: plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def test_a_clean_file_is_read_column_wise(tmp_path, monkeypatch) -> None:
    lines = [json.dumps({**GOOD, "id": f"g{i}", "ts": GOOD["ts"] + i}) for i in range(50)]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n\n")

    def refuse(*args, **kwargs):
        raise AssertionError("a clean run was parsed line by line")

    monkeypatch.setattr(LineParser, "_by_line", refuse)
    engine = Engine()
    engine.register(PROGRAM)
    assert _new_feed(engine, str(path), chunk_rows=20) == 3


# ---------------------------------------------------------------------- long lines


def test_a_line_over_the_limit_is_never_held_whole(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("cep.inputs.lines.READ_BYTES", 1 << 16)  # memory then stays ~ 4 MiB
    big = b'{"id": "big", "title": "' + b"x" * (24 * MAX_EVENT_BYTES) + b'"}'
    lines = [_bytes(json.dumps(GOOD)), big, b"  " + big + b"  ", _bytes(json.dumps(GOOD))]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines))  # the last line without a line break
    tracemalloc.start()
    try:
        steps = list(InputReader([EventInput(str(path))], {}, background=False))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_EVENT_BYTES < len(big) // 3  # the 24 MiB line never was held whole
    pieces = [p for step in steps for p in step.pieces]
    letters = [p for p in pieces if isinstance(p, dict)]
    assert [(d["reason"], d["line"]) for d in letters] == [("too_large", 2), ("too_large", 3)]
    assert letters[0]["detail"] == (
        f"the line takes {len(big):,} bytes; an event may take at most {MAX_EVENT_BYTES:,}"
    )
    assert letters[1]["detail"] == letters[0]["detail"]  # the white space around is not counted
    assert letters[0]["raw"].startswith('{"id": "big", "title": "xxx')
    assert letters[0]["raw"].endswith(" ...") and len(letters[0]["raw"]) <= SHOWN_BYTES + 4
    batches = [p for p in pieces if isinstance(p, EventBatch)]
    assert [b.lines.tolist() for b in batches] == [[1], [4]]
    assert [b.positions.tolist() for b in batches] == [[0], [3]]
    assert steps[-1].cursor["offset"] == path.stat().st_size


def test_a_long_line_that_is_not_utf8_is_an_invalid_utf8_dead_letter(tmp_path) -> None:
    big = b'{"title": "' + b"x" * (2 * MAX_EVENT_BYTES) + b'\xe9"}'
    path = tmp_path / "events.jsonl"
    path.write_bytes(big + b"\n")
    [step] = InputReader([EventInput(str(path))], {}, background=False)
    [letter] = step.pieces
    assert letter["reason"] == "invalid_utf8" and letter["line"] == 1


# ---------------------------------------------------------------------- cursors


def _records(reader: InputReader) -> tuple[list, object]:
    """``(source, line, position, text)`` of every line of a read, and its last cursor."""
    out, cursor = [], None
    for step in reader:
        cursor = step.cursor
        for piece in step.pieces:
            if isinstance(piece, dict):
                out.append((piece["input"], piece["line"], None, piece["raw"]))
            else:
                sources = ([piece.source] * len(piece) if isinstance(piece.source, str)
                           else list(piece.source))
                out.extend(zip(sources, piece.lines.tolist(), piece.positions.tolist(),
                               list(piece.raw), strict=True))
    return out, cursor


def _lines_of(first: int, count: int) -> str:
    return "".join(
        json.dumps({**GOOD, "id": f"e{i}", "ts": GOOD["ts"] + i}) + "\n"
        for i in range(first, first + count)
    )


def test_a_directory_read_in_two_parts_gives_what_one_read_gives(tmp_path) -> None:
    directory = tmp_path / "events"
    directory.mkdir()
    (directory / "1.jsonl").write_text(_lines_of(0, 7) + "\n{broken\n")
    first, cursor = _records(InputReader([EventInput(str(directory))], {}, chunk_rows=3,
                                         background=False))
    assert cursor["kind"] == "directory" and cursor["position"] == 8
    (directory / "2.jsonl").write_text(_lines_of(7, 5) + "not json\n" + _lines_of(12, 2))
    json.dumps(cursor)  # a cursor is JSON
    second, _ = _records(InputReader([EventInput(str(directory))], {}, chunk_rows=3,
                                     cursor=json.loads(json.dumps(cursor)), background=False))
    whole, _ = _records(InputReader([EventInput(str(directory))], {}, chunk_rows=3,
                                    background=False))
    assert first + second == whole
    assert [r[2] for r in whole if r[2] is not None] == [*range(7), *range(8, 13), 14, 15]


def test_a_file_read_resumes_from_any_step(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(_lines_of(0, 4) + "\n  \n" + _lines_of(4, 6))
    whole, _ = _records(InputReader([EventInput(str(path))], {}, chunk_rows=3,
                                    background=False))
    steps = list(InputReader([EventInput(str(path))], {}, chunk_rows=3, background=False))
    for stop in range(len(steps)):
        head, cursor = [], steps[stop].cursor
        for step in steps[:stop + 1]:
            for piece in step.pieces:
                head.extend(zip(piece.lines.tolist(), piece.positions.tolist(), strict=True))
        rest, _ = _records(InputReader([EventInput(str(path))], {}, chunk_rows=3,
                                       cursor=cursor, background=False))
        assert head + [(r[1], r[2]) for r in rest] == [(r[1], r[2]) for r in whole]


def test_a_replaced_file_is_read_from_its_start_on_resume(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(_lines_of(0, 3))
    _, cursor = _records(InputReader([EventInput(str(path))], {}, background=False))
    path.unlink()
    path.write_text(_lines_of(10, 2))  # another file (inode) at the same path
    again, _ = _records(InputReader([EventInput(str(path))], {}, cursor=cursor,
                                    background=False))
    assert [(r[1], r[2]) for r in again] == [(1, 3), (2, 4)]


@pytest.mark.parametrize("case", ["nan", "duplicate-key", "text-for-float", "time-text"])
def test_a_run_parsed_in_blocks_by_several_threads_is_fed_as_each_line_alone(tmp_path, case):
    """Runs of more than a MiB are parsed in blocks, one per thread: a refusal in a later
    block is found again in one block, where its row number counts from the run's start."""
    good = [json.dumps({**GOOD, "id": f"g{i}", "amount": [2.5, 600.0, 40.0][i % 3],
                        "card_id": f"c{i % 50}", "ts": GOOD["ts"] + i * 1000})
            for i in range(9_000)]
    lines = [*good[:7_000], EDGE_LINES[case], *good[7_000:]]
    data = b"\n".join(_bytes(line) for line in lines) + b"\n"
    assert len(data) > 1 << 20
    (matches, letters, stats), (new_matches, new_letters, new_stats) = _both(
        tmp_path, data, 20_000, program=PROGRAM[:PROGRAM.index("query alpha")]
    )
    assert (new_matches, new_letters, new_stats) == (matches, letters, stats)
