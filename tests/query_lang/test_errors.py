"""How errors read: location, message in user words, the source line and a caret."""

from __future__ import annotations

import pytest

from query_lang import (
    ErrorList,
    VigilError,
    VigilNameError,
    VigilSyntaxError,
    VigilTypeError,
    VigilValueError,
    check_program,
    load_program,
    parse,
)
from query_lang.parser import parse_recovering


def test_render_shows_location_line_and_caret():
    text = "rule r from txn\n  pattern a\n  within soon\n"
    with pytest.raises(ErrorList) as info:
        parse(text, "rules/x.vigil")
    (err,) = info.value.errors
    assert err.render() == (
        "rules/x.vigil:3:10: error: unexpected 'soon'; expected a duration such as 10m\n"
        "    within soon\n"
        "           ^"
    )


def test_error_family_also_inherits_builtins():
    assert issubclass(VigilSyntaxError, SyntaxError)
    assert issubclass(VigilNameError, NameError)
    assert issubclass(VigilTypeError, TypeError)
    assert issubclass(VigilValueError, ValueError)
    for cls in (VigilSyntaxError, VigilNameError, VigilTypeError, VigilValueError, ErrorList):
        assert issubclass(cls, VigilError)


def test_every_block_is_reported_after_a_syntax_error():
    text = (
        "stream s (a int, ts timestamp) time ts\n"
        "rule one from s pattern\n"
        "rule two from s pattern x define x as b > 1\n"
        "rule three from s pattern y within -1m\n"
    )
    _, errors = check_program(text=text, text_path="f.vigil")
    assert [(e.line, type(e).__name__) for e in errors] == [
        (2, "VigilSyntaxError"),
        (3, "VigilNameError"),
        (4, "VigilSyntaxError"),
    ]


def test_lines_count_on_across_blocks_comments_and_blank_lines():
    # Each block's lines are counted on from the previous block's start; comment-only and
    # blank stretches between blocks still count. A block that ends too early is reported
    # after its last token, not after the comment lines that follow it.
    text = (
        "stream s (a int, ts timestamp) time ts\n\n"
        "# a comment block\n# of two lines\n\n"
        + "".join(f"query q{i} from s match a:{i}\n\n" for i in range(3))
        + "rule bad from s pattern\n"
        + "\n# trailing\nquery last from s match a:1 AND (\n"
    )
    module, errors = parse_recovering(text, "f.vigil")
    assert [d.span.line for d in module.declarations] == [1, 6, 8, 10]
    assert [(e.line, e.span.column) for e in errors] == [(12, 24), (15, 34)]


def test_load_program_raises_with_all_errors():
    with pytest.raises(ErrorList) as info:
        load_program(text="rule a from nope pattern x\nrule b from nope2 pattern y\n")
    assert len(info.value.errors) == 2
    assert "undeclared stream 'nope'" in str(info.value)


def test_include_cycle_is_an_error(tmp_path):
    (tmp_path / "a.vigil").write_text('include "b.vigil"\n')
    (tmp_path / "b.vigil").write_text('include "a.vigil"\nstream s (x int)\n')
    _, errors = check_program([str(tmp_path / "a.vigil")])
    assert len(errors) == 1
    assert "include cycle" in errors[0].message
    assert errors[0].file.endswith("b.vigil") and errors[0].line == 1


def test_diamond_includes_load_each_file_once(tmp_path):
    (tmp_path / "base.vigil").write_text("stream s (x int, ts timestamp) time ts\n")
    (tmp_path / "l.vigil").write_text('include "base.vigil"\n')
    (tmp_path / "r.vigil").write_text('include "base.vigil"\n')
    (tmp_path / "top.vigil").write_text(
        'include "l.vigil"\ninclude "r.vigil"\nrule q from s pattern a define a as x > 1\n'
    )
    program, errors = check_program([str(tmp_path / "top.vigil")])
    assert errors == []
    assert list(program.streams) == ["s"]
    assert list(program.rules) == ["q"]


def test_an_invalid_regex_is_reported_at_the_regex_not_the_condition():
    text = (
        "stream txn (merchant string, ts timestamp) time ts\n"
        "rule r from txn pattern a\n"
        "  define a as merchant matches /(/\n"
    )
    _, errors = check_program(text=text, text_path="f.vigil")
    (err,) = errors
    assert isinstance(err, VigilValueError)
    assert (err.line, err.column) == (3, 32)
    assert err.message == "invalid regular expression /(/: missing ): ("
    assert err.render().splitlines()[1:] == [
        "    define a as merchant matches /(/",
        "                                 ^",
    ]


def test_an_invalid_regex_on_a_later_line_of_a_condition_points_at_that_line():
    text = (
        "stream txn (merchant string, country string, ts timestamp) time ts\n"
        "rule r from txn pattern a\n"
        '  define a as country == "FR"\n'
        "    and merchant matches /a(?P=x)/\n"
    )
    _, errors = check_program(text=text, text_path="f.vigil")
    assert [(e.line, e.column) for e in errors] == [(4, 26)]
