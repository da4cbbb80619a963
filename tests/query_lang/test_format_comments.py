"""`vigil format` keeps comments where they were written: the cases of
``tests/fixtures/format_comments.txt``, and every rule file of ``examples/`` and
``tests/fixtures/`` (as written, and with a comment added on and before every line) keeps every
comment, parses back to the same tree and formats to itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cep.cli.main import main
from query_lang import ast, parse, parse_recovering, print_declaration, print_module
from query_lang.tree import walk

ROOT = Path(__file__).parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CASES = re.split(
    r"^=== (.*)\n", (FIXTURES / "format_comments.txt").read_text(encoding="utf-8"), flags=re.M
)[1:]
RULE_FILES = sorted(
    path
    for path in [*ROOT.glob("examples/*.vigil"), *FIXTURES.glob("**/*.vigil")]
    if not parse_recovering(path.read_text(encoding="utf-8"))[1]  # the syntax cases print nothing
)


def comment_texts(text: str) -> list[str]:
    """The comments of ``text`` as a reader finds them: from a ``#`` at the start of a line or
    after a blank, outside quotes, to the end of the line (a ``#`` inside a word, as in a
    search word ``c#sharp`` or a regular expression ``/x#y/``, starts none)."""
    found = []
    for line in text.split("\n"):
        quote, i = None, 0
        while i < len(line):
            char = line[i]
            if quote:
                if char == "\\":
                    i += 1
                elif char == quote:
                    quote = None
            elif char in "\"'":
                quote = char
            elif char == "#" and (i == 0 or line[i - 1].isspace()):
                found.append(line[i:].rstrip())
                break
            i += 1
    return found


def commented_on_every_line(text: str) -> str:
    """``text`` with a comment on a line of its own before each line of code, and one at the
    end of each line of code that has none."""
    lines = []
    for number, line in enumerate(text.split("\n")):
        if line.strip() and not comment_texts(line):
            lines += [f"# before {number}", f"{line}  # after {number}"]
        else:
            lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize(
    "title, block", list(zip(CASES[::2], CASES[1::2], strict=True)), ids=CASES[::2]
)
def test_format_case(title, block):
    source, expected = (part.rstrip("\n") + "\n" for part in block.split("--- formatted\n"))
    module = parse(source)
    assert print_module(module) == expected
    assert parse(expected) == module
    assert print_module(parse(expected)) == expected
    assert comment_texts(expected) == comment_texts(source)


def test_the_rule_files_are_found():
    names = {path.name for path in RULE_FILES}
    assert {"fraud.vigil", "common.vigil", "language_complete.vigil", "streams.vigil"} <= names
    assert "00_undeclared_stream.vigil" in names and "54_syntax_duration.vigil" not in names


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_format_keeps_every_comment_of_a_rule_file_in_order(path):
    text = path.read_text(encoding="utf-8")
    module = parse(text)
    printed = print_module(module)
    assert [c.text for c in module.comments] == comment_texts(text)
    assert comment_texts(printed) == comment_texts(text)
    assert parse(printed) == module
    assert print_module(parse(printed)) == printed


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_format_keeps_a_comment_on_and_before_every_line(path):
    text = commented_on_every_line(path.read_text(encoding="utf-8"))
    module = parse(text)
    printed = print_module(module)
    # clauses print in one order whatever order they were written in, and their comments go
    # with them: the texts are all kept, in order where the clauses already were
    assert sorted(comment_texts(printed)) == sorted(comment_texts(text))
    assert parse(printed) == module
    assert print_module(parse(printed)) == printed


def test_vigil_format_keeps_the_comments_of_the_fraud_example(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / "examples" / "fraud.vigil").read_text(encoding="utf-8")
    assert main(["format", "examples/fraud.vigil"]) == 0
    out = capsys.readouterr().out
    assert len(comment_texts(text)) == 8
    assert comment_texts(out) == comment_texts(text)
    assert "  action string,  # password_reset | device_added | transfer | login" in out


def test_comments_take_no_part_in_the_tree():
    commented = parse(
        "# streams\nstream txn (card string, ts timestamp) time ts  # the time\n"
        "rule r from txn  # one stream\n  pattern a\n# end\n"
    )
    plain = parse("stream txn (card string, ts timestamp) time ts\nrule r from txn pattern a\n")
    assert commented == plain and plain.comments == ()
    assert len(commented.comments) == 4
    assert not any(isinstance(node, ast.Comment) for node in walk(commented))
    assert print_module(plain) == "\n\n".join(map(print_declaration, plain.declarations)) + "\n"


def test_a_hash_inside_a_literal_or_a_search_word_is_no_comment():
    module = parse(
        "rule r from txn pattern a define a as card == \"#1\" and card matches /x#y/\n"
        'query q from news match tag:"#news" OR c#sharp\n'
    )
    assert module.comments == ()


def test_a_comment_keeps_its_position():
    module = parse("rule r\n  from txn\n  pattern a   # one step\n", "rules.vigil")
    (comment,) = module.comments
    assert comment.span == ast.Span("rules.vigil", 3, 15, 3, 25)
    assert (comment.declaration, comment.clause, comment.trailing) == (0, "pattern", True)
