"""Extraction: the requirement (CNF over atoms) each query shape yields."""

from __future__ import annotations

import pytest
from percolator_support import SCHEMA

from percolator import Schema, Selectivity, compile_query, extract
from percolator.extract import MAX_CLAUSES, term_filter
from query_lang import parse_search


def clauses(text: str, schema: Schema = SCHEMA) -> list[list[tuple]]:
    requirement = extract(compile_query(parse_search(text), schema))
    return sorted(sorted(c) for c in requirement.clauses)


def test_conjunction_keeps_every_clause_and_disjunction_unions():
    assert clauses("title:acme AND (body:merger OR body:layoffs) AND NOT source:x") == [
        [("term", "body", "layoffs"), ("term", "body", "merger")],
        [("term", "title", "acme")],
    ]


def test_phrases_require_their_words_and_keywords_their_value():
    assert clauses('title:"acme corp"') == [[("term", "title", "acme")],
                                             [("term", "title", "corp")]]
    assert clauses('source:"Reuters UK"') == [[("term", "source", "Reuters UK")]]
    assert clauses("views:1500.0") == [[("term", "views", "1500"), ("term", "views", "1500.0")]]


def test_default_field_terms_cover_text_and_keyword_spellings():
    assert clauses("Café") == [[("term", "*", "Café"), ("term", "*", "cafe")]]


def test_patterns_yield_one_atom_tested_term_by_term():
    assert clauses("title:Merg*") == [[("pattern", "title", "text", "prefix", "Merg")]]
    assert clauses("title:*rger") == [[("pattern", "title", "text", "wildcard", "*rger")]]
    assert clauses("title:ac?e*corp") == [
        [("pattern", "title", "text", "wildcard", "ac?e*corp")]
    ]
    assert clauses("title:/acme/") == [[("term", "title", "acme")]]
    assert clauses("title:ACME") == [[("term", "title", "acme")]]
    # Too short to filter on, or no literal at all: the field must still be present.
    assert clauses("title:a*") == [[("exists", "title")]]
    assert clauses("title:/[a-z]+/") == [[("exists", "title")]]


def test_term_filters_test_globs_and_only_the_literals_of_regexes():
    prefix = term_filter("text", "prefix", "Merg")
    assert prefix.literals == ("\x1emerg",)
    assert [bool(prefix.test(t)) for t in ["merger", "emerge"]] == [True, False]
    # The literals "\x1eac" and "corp\x1e" must both fall in one term, in that order.
    wildcard = term_filter("text", "wildcard", "ac?e*corp")
    assert [bool(wildcard.test(t)) for t in ["acmeincorp", "acme", "corpac"]] == [
        True, False, False]
    # A regex keeps its literals of MIN_LITERAL characters or more; the evaluator runs it.
    regex = term_filter("text", "regex", "lay(off)?s?")
    assert regex.literals == ("\x1elay",)
    assert [regex.test(t) for t in ["layoffs", "layx", "player"]] == [True, True, False]
    assert term_filter("keyword", "prefix", "Merg").literals == ("\x1eMerg",)


def exact(text: str, schema: Schema = SCHEMA) -> bool:
    return extract(compile_query(parse_search(text), schema)).exact


@pytest.mark.parametrize("text", [
    "title:acme", "source:Reuters", "views:1500", "title:acme AND body:merger",
    "title:(acme OR corp) AND body:layoff*", "title:m?rger*", "views:[10 TO 20]",
    "views <= 3", "ts >= 2020-01-01", "_exists_:tags", "tags:news", 'title:"acme"',
])
def test_exact_requirements_decide_the_query(text):
    assert exact(text)


@pytest.mark.parametrize("text", [
    'title:"acme corp"', "title:acme AND NOT body:x", "title:/acme/", "title:/ac.e/",
    "views:[10 TO 20}", "views > 3", "views <= 9007199254740993",
    "source:[a TO m]", "title:a*", "title:/[a-z]+/",
    " OR ".join(f"(title:a{i} AND title:b{i} AND title:c{i})" for i in range(6)),
])
def test_inexact_requirements_leave_the_decision_to_the_evaluator(text):
    assert not exact(text)


def test_fields_of_two_possible_kinds_are_never_exact():
    # Default fields of text and keyword kinds share one term set.
    assert not exact("acme")
    assert not exact("acme", Schema.of({"title": "text"}))
    assert exact("acme", Schema.of({"title": "text"}, default_fields=["title"]))
    assert exact("acme", Schema())
    assert not exact("note:acme*", Schema.of({}, dynamic="text"))


def test_ranges_become_intervals_and_string_ranges_presence():
    assert clauses("views:[10 TO *}") == [[("number", "views", 10.0, None)]]
    assert clauses("views < 3") == [[("number", "views", None, 3.0)]]
    assert clauses("ts >= 2020-01-01") == [[("time", "ts", 1577836800.0, None)]]
    assert clauses("source:[a TO m]") == [[("exists", "source")]]
    assert clauses("_exists_:tags") == [[("exists", "tags")]]


@pytest.mark.parametrize("text", ["NOT title:acme", "title:acme OR NOT body:x", "-a -b"])
def test_nothing_required_goes_to_always_run(text):
    requirement = extract(compile_query(parse_search(text), SCHEMA))
    assert requirement.always and not requirement.never


def test_impossible_query_never_matches():
    requirement = extract(compile_query(parse_search('title:"!!!"'), SCHEMA))
    assert requirement.never


def test_large_disjunction_of_conjunctions_is_weakened_not_exploded():
    text = " OR ".join(f"(title:a{i} AND title:b{i} AND title:c{i})" for i in range(6))
    requirement = extract(compile_query(parse_search(text), SCHEMA))
    assert 3**6 > MAX_CLAUSES
    assert len(requirement.clauses) == 1
    assert len(next(iter(requirement.clauses))) == 6


def test_anchor_is_the_most_selective_clause():
    requirement = extract(compile_query(parse_search("title:the AND title:zymurgy"), SCHEMA))
    assert requirement.anchor() == frozenset({("term", "title", "zymurgy")})
    stats = Selectivity({"the": 0.9, "zymurgy": 0.95})
    assert requirement.anchor(stats) == frozenset({("term", "title", "the")})
