"""Golden fixtures: valid snippets check clean and round-trip; each invalid file reports exactly
the errors written at its end (``# expect LINE:COL: message``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from query_lang import check_program, parse, print_module

FIXTURES = Path(__file__).parent.parent / "fixtures"
STREAMS = str(FIXTURES / "streams.vigil")
SNIPPETS = (FIXTURES / "valid_snippets.vigil").read_text(encoding="utf-8").split("# ---\n")
INVALID = sorted((FIXTURES / "invalid").glob("*.vigil"))
EXPECT = re.compile(r"^# expect (\d+):(\d+): (.*)$", re.MULTILINE)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_valid_snippet_checks_clean(index):
    _, errors = check_program([STREAMS], text=SNIPPETS[index], text_path=f"snippet{index}")
    assert [e.render() for e in errors] == []


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_valid_snippet_round_trips(index):
    module = parse(SNIPPETS[index])
    printed = print_module(module)
    assert parse(printed) == module
    # printing is canonical: a second round gives the same text
    assert print_module(parse(printed)) == printed


def test_there_are_at_least_40_distinct_error_cases():
    messages = set()
    for path in INVALID:
        for _, _, message in EXPECT.findall(path.read_text(encoding="utf-8")):
            messages.add(re.sub(r"'[^']*'", "'_'", message))
    assert len(INVALID) >= 40
    assert len(messages) >= 40


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_reports_expected_errors(path, monkeypatch):
    expected = [(int(line), int(col), msg) for line, col, msg in EXPECT.findall(path.read_text())]
    assert expected, f"{path.name} has no '# expect' line"
    # messages name other files relative to the repository root, as `vigil check` run there does
    monkeypatch.chdir(FIXTURES.parent.parent)
    path = path.relative_to(FIXTURES.parent.parent)
    _, errors = check_program([str(path)])
    got = [(e.line, e.column, e.message) for e in errors]
    assert got == expected
    for err in errors:
        assert err.file == str(path)
        assert "__ANON" not in err.message and "$END" not in err.message
