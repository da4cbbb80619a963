"""Parsing of individual constructs: patterns, expressions, search syntax, durations."""

from __future__ import annotations

import pytest

from query_lang import ast, parse, parse_expr, parse_search, print_expr, print_search
from query_lang.errors import ErrorList, VigilSyntaxError


def rule_pattern(text: str) -> ast.Pattern:
    (rule,) = parse(f"rule r from s pattern {text}").declarations
    return rule.pattern


V = ast.PatVar


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a", V("a")),
        ("a b", ast.PatSeq((V("a"), V("b")))),
        ("a | b c", ast.PatAlt((V("a"), ast.PatSeq((V("b"), V("c")))))),
        ("(a | b) c", ast.PatSeq((ast.PatAlt((V("a"), V("b"))), V("c")))),
        ("a (b c)", ast.PatSeq((V("a"), V("b"), V("c")))),
        ("a?", ast.PatQuant(V("a"), 0, 1)),
        ("a*", ast.PatQuant(V("a"), 0, None)),
        ("a+", ast.PatQuant(V("a"), 1, None)),
        ("a{3}", ast.PatQuant(V("a"), 3, 3)),
        ("a{3,}", ast.PatQuant(V("a"), 3, None)),
        ("a{2,5}", ast.PatQuant(V("a"), 2, 5)),
        ("a{,4}", ast.PatQuant(V("a"), 0, 4)),
        ("a+?", ast.PatQuant(V("a"), 1, None, greedy=False)),
        ("a??", ast.PatQuant(V("a"), 0, 1, greedy=False)),
        ("a{2,5}?", ast.PatQuant(V("a"), 2, 5, greedy=False)),
        ("(a b)+", ast.PatQuant(ast.PatSeq((V("a"), V("b"))), 1, None)),
        ("a !x b", ast.PatSeq((V("a"), ast.PatAbsent("x"), V("b")))),
    ],
)
def test_patterns(text, expected):
    assert rule_pattern(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1 + 2 * 3",
         ast.BinOp("+", ast.Literal(1), ast.BinOp("*", ast.Literal(2), ast.Literal(3)))),
        ("a - b - c", ast.BinOp("-", ast.BinOp("-", ast.FieldRef("a"), ast.FieldRef("b")),
                                ast.FieldRef("c"))),
        ("not a or b and c", ast.BoolOp("or", (ast.Not(ast.FieldRef("a")), ast.BoolOp(
            "and", (ast.FieldRef("b"), ast.FieldRef("c")))))),
        ("x between 1 and 2 and y", ast.BoolOp("and", (
            ast.Between(ast.FieldRef("x"), ast.Literal(1), ast.Literal(2)), ast.FieldRef("y")))),
        ("10m", ast.Duration(600_000)),
        ("500ms", ast.Duration(500)),
        ("1d", ast.Duration(86_400_000)),
        ("1e6", ast.Literal(1e6)),
        ("-3", ast.Literal(-3)),
        ("-x", ast.Neg(ast.FieldRef("x"))),
        ("prev(price, 2)", ast.Prev("price", 2)),
        ("last(v).price", ast.VarField("last", "v", "price")),
        ("a.b", ast.FieldRef("b", "a")),
        ("x in (1, 2)", ast.InValues(ast.FieldRef("x"), (ast.Literal(1), ast.Literal(2)))),
        ("x in L", ast.InList(ast.FieldRef("x"), "L")),
        ("x is not null", ast.IsNull(ast.FieldRef("x"), True)),
        ("x matches /a\\/b/", ast.Matches(ast.FieldRef("x"), "a/b")),
        ('s contains "q"', ast.BinOp("contains", ast.FieldRef("s"), ast.Literal("q"))),
        ('"a\\"b\\n"', ast.Literal('a"b\n')),
        ("TRUE", ast.Literal(True)),
    ],
)
def test_expressions(text, expected):
    parsed = parse_expr(text)
    assert parsed == expected
    assert parse_expr(print_expr(parsed)) == parsed


def test_search_function_parses_its_query():
    e = parse_expr('search(body, "acme* AND NOT tabloid")')
    assert e == ast.Search(
        "body",
        ast.SearchAnd(
            (ast.SearchPrefix(None, "acme"), ast.SearchNot(ast.SearchTerm(None, "tabloid")))
        ),
        "acme* AND NOT tabloid",
    )


def test_search_function_error_points_into_the_string():
    with pytest.raises(ErrorList) as info:
        parse('rule r from s pattern a\n  define a as search(body, "x AND")\n', "f.vigil")
    (err,) = info.value.errors
    assert isinstance(err, VigilSyntaxError)
    assert err.line == 2 and err.column > len('  define a as search(body, "')


T, P = ast.SearchTerm, ast.SearchPhrase


@pytest.mark.parametrize(
    "text, expected",
    [
        ("acme", T(None, "acme")),
        ("title:acme", T("title", "acme")),
        ('"acme corp"', P(None, "acme corp")),
        ('title:"acme corp"', P("title", "acme corp")),
        ("acm*", ast.SearchPrefix(None, "acm")),
        ("ac?e*", ast.SearchWildcard(None, "ac?e*")),
        ("/ac.e/", ast.SearchRegex(None, "ac.e")),
        ("views:[10 TO 20]", ast.SearchRange("views", 10, 20, True, True)),
        ("views:{10 TO 20}", ast.SearchRange("views", 10, 20, False, False)),
        ("views:[* TO 2.5}", ast.SearchRange("views", None, 2.5, True, False)),
        ("ts:[2024-01-01 TO *]", ast.SearchRange("ts", "2024-01-01", None)),
        ("views >= 1000", ast.SearchCompare("views", ">=", 1000)),
        ("temp < -5", ast.SearchCompare("temp", "<", -5)),
        ("_exists_:source", ast.SearchExists("source")),
        ("a b", ast.SearchAnd((T(None, "a"), T(None, "b")))),
        ("a AND b OR c", ast.SearchOr((ast.SearchAnd((T(None, "a"), T(None, "b"))), T(None, "c")))),
        ("a && b || !c", ast.SearchOr((ast.SearchAnd((T(None, "a"), T(None, "b"))),
                                       ast.SearchNot(T(None, "c"))))),
        ("+a -b", ast.SearchAnd((T(None, "a"), ast.SearchNot(T(None, "b"))))),
        ("NOT (a OR b)", ast.SearchNot(ast.SearchOr((T(None, "a"), T(None, "b"))))),
        ("title:(a OR -b)", ast.SearchOr((T("title", "a"), ast.SearchNot(T("title", "b"))))),
        ("and or", ast.SearchAnd((T(None, "and"), T(None, "or")))),
        ("café", T(None, "café")),
        ("caf\\*", T(None, "caf*")),
        ("caf\\**", ast.SearchPrefix(None, "caf*")),
        ("a\\?b*", ast.SearchPrefix(None, "a?b")),
        ("x\\\\y", T(None, "x\\y")),
    ],
)
def test_search_syntax(text, expected):
    parsed = parse_search(text)
    assert parsed == expected
    assert parse_search(print_search(parsed)) == parsed


def test_keywords_stay_usable_as_field_names():
    module = parse(
        "stream s (id string, from string, time timestamp, rule int) time time id id\n"
        "rule r from s by id pattern a define a as from == \"x\" and rule > 1\n"
    )
    stream, rule = module.declarations
    assert stream.id_field == "id" and stream.time_field == "time"
    assert rule.by == (ast.KeyPart(((None, "id"),)),)


def test_comments_and_case_insensitive_keywords():
    module = parse("# c\nRULE r FROM s # trailing\n  PATTERN a WITHIN 1m\n")
    (rule,) = module.declarations
    assert rule.within == ast.Duration(60_000)


def test_spans_point_at_source():
    (rule,) = parse("rule r from s\n  pattern a\n  define a as x > 1\n", "f.vigil").declarations
    cond = rule.defines[0].condition
    assert (cond.span.file, cond.span.line, cond.span.column) == ("f.vigil", 3, 15)
    assert (rule.span.line, rule.span.column) == (1, 1)
