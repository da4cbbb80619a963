"""The JSON-lines source's reader, without a JVM: whatever the bytes of a file and however its
lines are sliced into partitions, blocks and read buffers, the rows are each non-blank line,
decoded and stripped as the embedded engine reads it (``cep.events.limits.line_text``: a line
that is not UTF-8 comes escaped behind the mark its dead letter is made from), at its line
number."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.events.limits import line_text
from spark_udf.sources import jsonl
from spark_udf.sources.jsonl import JsonLinesIndex, read_slice
from spark_udf.sources.rows import ARROW_SCHEMA

# Pieces that keep a line on the fast path, and pieces that force the line-by-line one.
PIECES = st.sampled_from([
    b'{"k": 1}', b"[1,2]", b"null", b"caf\xc3\xa9", b"x", b"}", b" ", b"\t", b"\r", b"\xff",
    b"\x1c", b"\xc2\xa0", b"\xe2\x80\xa8", b"",
])
LINES = st.lists(st.lists(PIECES, max_size=4).map(b"".join), min_size=1, max_size=60)


def expected_rows(lines: list[bytes], first: int, last: int) -> list[tuple[int, str]]:
    rows = []
    for number, line in enumerate(lines[first:last], start=first):
        text = line_text(line)
        if text:
            rows.append((number, text))
    return rows


def read_rows(path: str, first: int, last: int, per_partition: int) -> list[tuple[int, str]]:
    index = JsonLinesIndex(path)
    index.refresh()
    rows = []
    for part in index.slices(first, last, per_partition):
        for batch in read_slice(part):
            assert batch.schema == ARROW_SCHEMA
            rows.extend(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                            strict=True))
    return rows


@settings(max_examples=150, deadline=None)
@given(
    lines=LINES,
    bounds=st.tuples(st.integers(0, 60), st.integers(0, 60)),
    per_partition=st.integers(1, 25),
    read_bytes=st.sampled_from([1, 7, 64, 1 << 23]),
    batch_lines=st.sampled_from([1, 3, 65_536]),
)
def test_rows_are_the_stripped_non_blank_lines_at_their_numbers(
    tmp_path_factory, lines, bounds, per_partition, read_bytes, batch_lines
):
    path = tmp_path_factory.mktemp("lines") / "events.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    first, last = sorted(b % (len(lines) + 1) for b in bounds)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonl, "_READ_BYTES", read_bytes)
        patch.setattr(jsonl, "_BATCH_LINES", batch_lines)
        got = read_rows(str(path), first, last, per_partition)
    assert got == expected_rows(lines, first, last)


def test_lines_past_the_index_checkpoints_are_found(tmp_path):
    # More lines than the index's checkpoint spacing, so slices start mid-block.
    lines = [f'{{"n": {i}}}'.encode() for i in range(10_000)]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert read_rows(str(path), 4_100, 9_000, 1_000) == expected_rows(lines, 4_100, 9_000)


def test_a_file_being_appended_to_yields_only_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3')  # the last line is still being written
    index = JsonLinesIndex(str(path))
    assert index.refresh() == 2
    assert read_rows(str(path), 0, 2, 10) == [(0, '{"a": 1}'), (1, '{"a": 2}')]
