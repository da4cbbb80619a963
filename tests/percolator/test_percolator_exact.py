"""Exact requirements: a query whose requirement also suffices is decided by the index, so the
matcher skips the evaluator for it. These tests hold the extraction to that claim directly,
atom by atom against the evaluator, and check that the indexed presearchers still return the
baseline's matches while running the evaluator only for the undecided candidates."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from percolator_support import FILTERING, SCHEMA, VARIANTS, baseline, documents, queries

from percolator import AnalyzedDocument, Schema, compile_query, extract
from percolator.extract import atom_holds
from query_lang import parse_search

SCHEMAS = [
    SCHEMA,
    Schema.of({"title": "text", "body": "text", "source": "string", "views": "int"},
              default_fields=["title", "body"]),
    Schema(),
    Schema.of({"title": "text"}, dynamic="text"),
]


def requirement_holds(requirement, doc: AnalyzedDocument) -> bool:
    return all(any(atom_holds(doc, atom) for atom in clause) for clause in requirement.clauses)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries, documents, st.sampled_from(SCHEMAS))
def test_requirements_are_necessary_and_exact_ones_sufficient(query, document, schema):
    compiled = compile_query(query, schema)
    requirement = extract(compiled)
    doc = AnalyzedDocument(document, schema)
    matched = compiled.matches(doc)
    if requirement.never:
        assert not matched
        return
    holds = requirement_holds(requirement, doc)
    if matched:
        assert holds, "a matching document must satisfy the requirement"
    if requirement.exact:
        assert holds == matched, "an exact requirement must decide the query"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries, min_size=1, max_size=8), st.lists(documents, min_size=1, max_size=4))
def test_decided_candidates_are_matches_and_the_rest_are_evaluated(query_list, document_list):
    standing = [(f"q{i}", q) for i, q in enumerate(query_list)]
    expected = baseline(standing).match_batch(document_list, highlights=True)
    assert expected.stats.decided == 0
    for name in FILTERING:
        percolator = VARIANTS[name](standing)
        result = percolator.match_batch(document_list, highlights=True)
        assert result.matches == expected.matches
        decided = {q.name for q in percolator.index if q.decided}
        for found, document in zip(result.matches, document_list, strict=True):
            doc = AnalyzedDocument(document, SCHEMA)
            proposed = {q.name for q in percolator.index.candidates(doc)}
            # A decided query is proposed exactly when it matches.
            assert proposed & decided == {m.name for m in found} & decided
        assert result.stats.decided <= result.stats.matched


def test_the_matcher_counts_decided_candidates_apart():
    standing = [
        ("terms", parse_search("title:acme AND body:merger")),
        ("prefix", parse_search("title:acme AND body:layoff*")),
        ("phrase", parse_search('title:"acme corp"')),
        ("negated", parse_search("title:acme AND NOT body:rumour")),
    ]
    percolator = VARIANTS["indexed-bulk"](standing)
    assert {q.name for q in percolator.index if q.decided} == {"terms", "prefix"}
    doc = {"id": "d", "title": "Acme corp", "body": "the merger brings layoffs"}
    result = percolator.match_batch([doc], highlights=True)
    assert [m.name for m in result.matches[0]] == ["negated", "phrase", "prefix", "terms"]
    assert result.stats.verified == 4 and result.stats.decided == 2
    assert baseline(standing).match_batch([doc], highlights=True).matches == result.matches


@pytest.mark.parametrize("variant_name", FILTERING)
def test_ranges_decided_by_intervals_stay_exact_for_integers_beyond_floats(variant_name):
    # 2**53 + 1 is no float: an interval of floats alone would put it at 2**53. Enough
    # intervals that a sealed segment stabs them through numpy, and a few that it scans.
    edge = 2**53
    standing = [("edge", parse_search(f"views:[* TO {edge}]")),
                ("above", parse_search(f"views:[{edge} TO *]"))]
    standing += [(f"r{i}", parse_search(f"views:[{i} TO {edge}]")) for i in range(40)]
    documents = [{"id": str(v), "views": v} for v in (edge + 1, edge, edge - 1, 3, -edge - 1)]
    expected = baseline(standing).match_batch(documents, highlights=True)
    result = VARIANTS[variant_name](standing).match_batch(documents, highlights=True)
    assert result.matches == expected.matches
    assert [m.name for m in result.matches[0]] == ["above"]
    assert {"edge", "above", "r0"} <= {m.name for m in result.matches[1]}
