"""Golden fixtures: valid snippets check clean and round-trip; each invalid file reports exactly
the errors written at its end (``# expect LINE:COL: message``), from the stage its name says
(``NN_syntax_*`` from the parser, the others from the checks), each rendered with its source
line and a caret under the column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from query_lang import check_program, parse, parse_recovering, print_module

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
    assert [c.text for c in parse(printed).comments] == [c.text for c in module.comments]
    # printing is canonical: a second round gives the same text
    assert print_module(parse(printed)) == printed


def test_invalid_fixtures_are_numbered_cases_each_with_its_expected_errors():
    numbers = []
    messages = set()
    for path in INVALID:
        match = re.fullmatch(r"(\d\d)_[a-z0-9_]+\.vigil", path.name)
        assert match, f"{path.name}: name it NN_what_it_tests.vigil"
        numbers.append(int(match.group(1)))
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        expect_lines = [ln for ln in lines if ln.startswith("# expect")]
        found = EXPECT.findall(text)
        assert expect_lines and len(found) == len(expect_lines), f"{path.name}: bad '# expect'"
        for line, col, message in found:
            # each expectation points at a token of the file, or just past a block that ends
            # too early
            source = lines[int(line) - 1] + "\n"
            assert 1 <= int(col) <= len(source), f"{path.name}: {line}:{col} is outside the file"
            if not message.startswith("unexpected end"):
                assert not source[int(col) - 1].isspace(), f"{path.name}: {line}:{col} is blank"
            messages.add(re.sub(r"'[^']*'", "'_'", message))
    assert numbers == list(range(len(INVALID))), "fixture numbers must run 00, 01, ... unbroken"
    assert len(INVALID) >= 40 and len(messages) >= 40


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_syntax_fixtures_fail_in_the_parser_and_the_others_parse(path):
    text = path.read_text(encoding="utf-8")
    expected = [(int(line), int(col), msg) for line, col, msg in EXPECT.findall(text)]
    _, errors = parse_recovering(text, path.name)
    got = [(e.line, e.column, e.message) for e in errors]
    if "_syntax_" in path.name:
        # the parser reports them, and they come first: nothing the checks say is a syntax error
        assert got and got == expected[: len(got)]
    else:
        assert got == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_each_error_shows_its_source_line_with_a_caret_at_the_column(path, monkeypatch):
    monkeypatch.chdir(FIXTURES.parent.parent)
    path = path.relative_to(FIXTURES.parent.parent)
    lines = path.read_text(encoding="utf-8").splitlines()
    _, errors = check_program([str(path)], include_roots=[FIXTURES])
    assert errors
    for err in errors:
        head, source, caret = err.render().splitlines()
        assert head == f"{path}:{err.line}:{err.column}: error: {err.message}"
        assert source == "  " + lines[err.line - 1]
        assert caret == "  " + " " * (err.column - 1) + "^"


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_reports_expected_errors(path, monkeypatch):
    expected = [(int(line), int(col), msg) for line, col, msg in EXPECT.findall(path.read_text())]
    assert expected, f"{path.name} has no '# expect' line"
    # messages name other files relative to the repository root, as `vigil check` run there does
    monkeypatch.chdir(FIXTURES.parent.parent)
    path = path.relative_to(FIXTURES.parent.parent)
    _, errors = check_program([str(path)], include_roots=[FIXTURES])
    got = [(e.line, e.column, e.message) for e in errors]
    assert got == expected
    for err in errors:
        assert err.file == str(path)
        assert "__ANON" not in err.message and "$END" not in err.message
