"""The exact evaluator: every search construct, highlights, explain and the rule helper."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from percolator_support import SCHEMA, documents, queries

from percolator import (
    AnalyzedDocument,
    InvalidQueryError,
    PercolatorError,
    Schema,
    compile_query,
    evaluate,
    explain,
    field_predicate,
)
from percolator.evaluate import _merge_spans
from percolator.extract import extract
from percolator.interning import SharedValues
from percolator.match_tree import AllMatch, AnyMatch, NotMatch
from percolator.term_patterns import regex_literals, wildcard_segments
from query_lang import parse_search
from query_lang.ast import SearchAnd, SearchCompare, SearchRange, SearchTerm

DOC = {
    "title": "ACME Corp announces Merger",
    "body": "Layoffs at acme corp. Café news, cafe\u0301 nai\u0308ve",
    "source": "Reuters UK",
    "tags": ["News", "m&a"],
    "views": 1500,
    "score": 2.5,
    "ts": "2024-05-01T10:00:00Z",
    "code": "AB-123",
}


def run(text: str, doc: dict | None = None, schema: Schema = SCHEMA):
    return evaluate(parse_search(text), DOC if doc is None else doc, schema)


@pytest.mark.parametrize(
    ("query", "matched"),
    [
        # terms: analysed on text fields, exact on keyword fields
        ("title:acme", True),
        ("title:ACME", True),
        ("title:acm", False),
        ("body:cafe", True),
        ("body:CAFÉ", True),
        ("body:naive", True),
        ("source:reuters", False),
        ('source:"Reuters UK"', True),
        ("tags:News", True),
        ("tags:news", False),
        ("views:1500", True),
        ("views:1500.0", True),
        ("score:2.5", True),
        # default fields: every text/string field
        ("merger", True),
        ("Reuters", False),
        ('"Reuters UK"', True),
        ("nowhere", False),
        # phrases: consecutive positions
        ('title:"acme corp"', True),
        ('title:"corp acme"', False),
        ('body:"acme corp cafe"', True),
        ('body:"corp news"', False),
        ("title:acme-corp", True),  # a term of several words is a phrase
        ('title:"!!!"', False),
        # prefixes, wildcards, regexes
        ("title:merg*", True),
        ("title:MERG*", True),
        ("source:Reu*", True),
        ("source:reu*", False),
        ("title:m?rger", True),
        ("title:m?rg", False),
        ("title:*nounce*", True),
        ("body:caf?", True),
        ("code:AB-*", True),
        ("title:/ac.e/", True),
        ("title:/ac/", False),
        ("title:/[a-z]+ger/", True),
        ("code:/[A-Z]{2}-\\d+/", True),
        # ranges and comparisons on numbers and timestamps
        ("views:[1000 TO 2000]", True),
        ("views:[1500 TO 2000]", True),
        ("views:{1500 TO 2000]", False),
        ("views:[* TO 1500}", False),
        ("views:[* TO *]", True),
        ("score:{2 TO 3}", True),
        ("views >= 1500", True),
        ("views > 1500", False),
        ("views < 2000", True),
        ("score <= 2", False),
        ("ts:[2024-01-01 TO *]", True),
        ('ts:[* TO "2024-05-01T10:00:00Z"}', False),
        ('ts:["2024-05-01T12:00:00+02:00" TO "2024-05-01T12:00:00+02:00"]', True),
        ("ts >= 2024-05-01", True),
        ("ts:[1714557600 TO *]", True),
        ("source:[R TO S]", True),
        ("missing:[1 TO 2]", False),
        # existence and boolean structure
        ("_exists_:tags", True),
        ("_exists_:missing", False),
        ("NOT _exists_:missing", True),
        ("title:acme AND NOT title:merger", False),
        ("title:acme -source:tabloid", True),
        ("title:zeta OR body:layoffs", True),
        ("+title:acme +title:zeta", False),
        ("title:(acme AND (zeta OR merger))", True),
    ],
)
def test_constructs(query, matched):
    assert run(query).matched is matched


def test_timestamp_ranges_read_epoch_numbers_and_iso_strings():
    query = "ts:[2020-01-01 TO 2020-12-31]"
    assert run(query, {"ts": 1590000000}).matched
    assert run(query, {"ts": "2020-06-01T00:00:00Z"}).matched
    assert not run(query, {"ts": "2021-06-01"}).matched
    ms = Schema.of({"ts": "timestamp"}, time_unit="ms")
    assert run(query, {"ts": 1590000000000}, ms).matched


def test_numeric_strings_are_numbers_for_ranges():
    assert run("views >= 1000", {"views": "1500"}).matched
    assert not run("views >= 1000", {"views": "many"}).matched


def test_highlights_are_offsets_of_matched_terms_from_positive_clauses():
    result = run('title:"acme corp" AND body:layoff* AND NOT title:zeta AND views >= 1000 '
                 "AND body:(café OR nothing)")
    assert result.matched
    assert result.highlights == {"body": [[0, 7], [22, 26], [33, 38]], "title": [[0, 9]]}
    body = DOC["body"]
    assert [body[s:e] for s, e in result.highlights["body"]] == ["Layoffs", "Café", "cafe\u0301"]


def test_highlights_of_a_disjunction_come_from_its_matching_clauses_only():
    # "corp" matches on its own but its conjunction does not: it is not highlighted.
    result = run("title:(acme OR (corp AND zeta)) AND NOT title:(merger AND zeta)")
    assert result.matched
    assert result.highlights == {"title": [[0, 4]]}
    both = run("title:(zeta OR (acme AND corp))")
    assert both.highlights == {"title": [[0, 4], [5, 9]]}


def test_highlights_for_keywords_and_lists_and_default_fields():
    result = run('tags:"m&a" OR "Reuters UK" OR acme')
    assert result.highlights == {
        "body": [[11, 15]], "source": [[0, 10]], "tags": [[5, 8]], "title": [[0, 4]]
    }


def test_no_highlights_when_no_match():
    assert run("title:zeta").highlights == {}


def test_explain_walks_every_clause():
    text = explain(
        parse_search("title:acme AND (body:zeta OR views >= 1000) AND NOT source:tabloid"),
        DOC, SCHEMA,
    )
    assert text.splitlines() == [
        "MATCH: (title:acme AND (body:zeta OR views >= 1000) AND NOT source:tabloid)",
        "  [match]    AND — 3 of 3 clauses match, all are required",
        "    [match]    title:acme — found in title at [0, 4]",
        "    [match]    OR — 1 of 2 clauses match, one is required",
        "      [no match] body:zeta — no term of body equals 'zeta'",
        "      [match]    views >= 1000 — views = 1500 is within the range",
        "    [match]    NOT — the clause does not match",
        "      [no match] source:tabloid — no term of source equals 'tabloid'",
    ]
    missing = explain(parse_search("views > 5 AND _exists_:nope"), {"title": "x"}, SCHEMA)
    assert missing.splitlines()[0].startswith("NO MATCH")
    assert "field views is absent" in missing
    assert "field nope is absent" in missing


def test_field_predicate_binds_default_terms_to_the_field():
    test = field_predicate("body", parse_search('merger AND layoff* AND NOT "no deal"'))
    assert test("Merger talks; LAYOFFS expected")
    assert not test("Merger talks, no deal")
    assert not test(None)
    exact = field_predicate("country", parse_search("US OR GB"), Schema.of({"country": "string"}))
    assert exact("US") and not exact("us")
    number = field_predicate("amount", parse_search("amount:[10 TO 20]"))
    assert number(15) and not number(25)


def test_invalid_queries_raise_clear_errors():
    with pytest.raises(InvalidQueryError, match=r"invalid regex /a\(/: missing \)"):
        compile_query(parse_search("title:/a(/"), SCHEMA)
    with pytest.raises(InvalidQueryError, match="mixes a text bound"):
        compile_query(SearchRange("views", 1, "abc"), SCHEMA)
    with pytest.raises(InvalidQueryError, match="unknown comparison '=~'"):
        compile_query(SearchCompare("views", "=~", 3), SCHEMA)
    with pytest.raises(PercolatorError, match="an AND without clauses"):
        compile_query(SearchAnd(()), SCHEMA)
    with pytest.raises(ValueError, match="not a search query node"):
        compile_query("title:acme", SCHEMA)  # type: ignore[arg-type]


def test_equality_comparisons_built_directly():
    assert evaluate(SearchCompare("views", "==", 1500), DOC, SCHEMA).matched
    assert evaluate(SearchCompare("source", "!=", "tabloid"), DOC, SCHEMA).matched
    assert evaluate(SearchCompare("flag", "==", True), {"flag": True}).matched


def test_evaluate_accepts_prebuilt_compiled_queries_and_default_schema():
    compiled = compile_query(SearchTerm("title", "acme"))
    # Without a schema, title is an undeclared keyword field: exact values only.
    assert not evaluate(compiled, {"title": "acme corp"}).matched
    assert evaluate(compiled, {"title": "acme"}).matched


def test_wildcard_escapes_and_segments():
    assert wildcard_segments("a\\*b*c?") == [
        ("literal", "a*b"), ("any", "*"), ("literal", "c"), ("one", "?")
    ]
    assert run("code:AB-1*").matched
    assert evaluate(parse_search("k:a\\?b"), {"k": "a?b"}).matched
    assert not evaluate(parse_search("k:a\\?b"), {"k": "axb"}).matched


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        ("acme", ("\x1eacme\x1e",)),
        ("acme.*corp", ("\x1eacme", "corp\x1e")),
        ("colou?r", ("\x1ecolo", "r\x1e")),
        ("xa+", ("\x1exa",)),
        ("ab{2}c", ("\x1ea", "c\x1e")),
        ("(ab)+cd", ("cd\x1e",)),
        ("[a-z]+ger", ("ger\x1e",)),
        ("a\\.b", ("\x1ea.b\x1e",)),
        ("\\d+px", ("px\x1e",)),
        ("a|b", ()),
        ("(?i)acme", ()),
        ("\\x41cme", ()),
        ("\\pLcme", ()),
        ("[[:alpha:]]x", ("x\x1e",)),
    ],
)
def test_regex_literals_are_conservative(pattern, literals):
    assert regex_literals(pattern) == literals


def _reference_spans(node, doc, out) -> None:
    """Highlights by their definition: the spans of the leaves of every matching positive
    clause, asking each clause of a disjunction whether it matches."""
    if isinstance(node, NotMatch):
        return
    if isinstance(node, AllMatch | AnyMatch):
        for clause in node.clauses:
            if isinstance(node, AllMatch) or clause.matches(doc):
                _reference_spans(clause, doc, out)
        return
    node.collect_spans(doc, out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries, documents, st.sampled_from([SCHEMA, Schema(), Schema.of({}, dynamic="text")]))
def test_highlights_follow_their_definition(query, document, schema):
    compiled = compile_query(query, schema)
    doc = AnalyzedDocument(document, schema)
    if not compiled.matches(doc):
        return
    spans: dict[str, set[tuple[int, int]]] = {}
    _reference_spans(compiled.root, doc, spans)
    expected = {name: _merge_spans(found) for name, found in sorted(spans.items()) if found}
    assert compiled.highlights(doc) == expected


def test_standing_queries_share_their_repeated_values():
    first = compile_query(parse_search("title:acme AND body:acme"), SCHEMA)
    second = compile_query(parse_search("body:acme AND title:zeta"), SCHEMA)
    leaves = [*first.root.clauses, *second.root.clauses]
    assert leaves[0].words == ("acme",) and leaves[1].words is leaves[0].words
    assert leaves[2].words is leaves[0].words and leaves[2].keywords is leaves[0].keywords
    body = frozenset({("term", "body", "acme")})
    [a] = [c for c in extract(first).clauses if c == body]
    [b] = [c for c in extract(second).clauses if c == body]
    assert a is b
    share = SharedValues(limit=2)
    x, y = share(("x",)), share(("y",))
    assert share(tuple("x")) is x and share(tuple("y")) is y
    z = share(("z",))  # full: emptied, then holds the new value alone
    assert share(("z",)) is z and share(tuple("x")) is not x


def test_a_conjunction_failing_inside_a_disjunction_leaves_no_highlights():
    # acme matches before zeta fails: its span must not reach the disjunction's highlights.
    compiled = compile_query(parse_search("(title:acme AND title:zeta) OR title:merger"), SCHEMA)
    doc = AnalyzedDocument({"title": "acme merger"}, SCHEMA)
    assert compiled.highlights(doc) == {"title": [[5, 11]]}
