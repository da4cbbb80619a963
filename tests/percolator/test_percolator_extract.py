"""Extraction: the requirement (CNF over atoms) each query shape yields."""

from __future__ import annotations

import pytest
from percolator_support import SCHEMA

from percolator import Schema, Selectivity, compile_query, extract
from percolator.extract import MAX_CLAUSES
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


def test_patterns_yield_framed_literals():
    assert clauses("title:Merg*") == [[("literal", "title", "\x1emerg")]]
    assert clauses("title:*rger") == [[("literal", "title", "rger\x1e")]]
    assert clauses("title:ac?e*corp") == [[("literal", "title", "\x1eac")],
                                          [("literal", "title", "corp\x1e")]]
    assert clauses("title:/acme/") == [[("term", "title", "acme")]]
    # Too short to filter on, or no literal at all: the field must still be present.
    assert clauses("title:a*") == [[("exists", "title")]]
    assert clauses("title:/[a-z]+/") == [[("exists", "title")]]


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
