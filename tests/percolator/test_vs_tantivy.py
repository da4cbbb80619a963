"""Vigil's percolator against a real search engine: tantivy run as a batch reverse search (the
benchmark's peer, ``bench/peers/tantivy_batch.py``) must find the same matches on random
documents and queries of the constructs both share: terms, phrases and prefixes on text
fields, keyword equality, numeric ranges and comparisons, AND, OR and AND NOT. Where the two
mean different things (decomposed accents, phrases across list values) is written in the
peer's docstring; the documents here keep to what both read alike."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from percolator import Percolator, Schema
from query_lang.ast import (
    SearchAnd,
    SearchCompare,
    SearchNode,
    SearchNot,
    SearchOr,
    SearchPhrase,
    SearchPrefix,
    SearchRange,
    SearchTerm,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "peers"))
from tantivy_batch import TantivyBatchPercolator  # noqa: E402

FIELDS = {"title": "text", "body": "text", "source": "string", "views": "int"}
DEFAULT_FIELDS = ("title", "body")
SCHEMA = Schema.of(FIELDS, default_fields=DEFAULT_FIELDS)

WORDS = ["acme", "corp", "merger", "mergers", "layoff", "news", "café", "strasse", "zeta", "a1"]
# Spellings that analyse to the same term on both sides (composed accents, case, ß).
SPELLINGS = {
    "acme": ["acme", "ACME", "Acme"],
    "café": ["café", "CAFÉ", "cafe"],
    "strasse": ["strasse", "Straße", "STRASSE"],
    "merger": ["merger", "Merger"],
}
SOURCES = ["reuters", "Reuters", "tabloid", "wire"]


def _spelled(word: str) -> st.SearchStrategy[str]:
    return st.sampled_from(SPELLINGS.get(word, [word]))


sentence = st.lists(st.sampled_from(WORDS).flatmap(_spelled), max_size=7).flatmap(
    lambda words: st.sampled_from([" ", ", ", "-", "! "]).map(lambda sep: sep.join(words))
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "title": sentence,
        "body": sentence,
        "source": st.sampled_from(SOURCES),
        "views": st.integers(0, 2000),
    },
)


@st.composite
def leaves(draw: Any) -> SearchNode:
    kind = draw(st.sampled_from(["term", "term", "phrase", "prefix", "keyword", "range",
                                 "compare"]))
    field = draw(st.sampled_from([None, "title", "body"]))
    word = draw(st.sampled_from(WORDS).flatmap(_spelled))
    if kind == "term":
        return SearchTerm(field, word)
    if kind == "phrase":
        return SearchPhrase(field, f"{word} {draw(st.sampled_from(WORDS).flatmap(_spelled))}")
    if kind == "prefix":
        return SearchPrefix(field, word[: draw(st.integers(1, len(word)))])
    if kind == "keyword":
        return SearchTerm("source", draw(st.sampled_from(SOURCES)))
    if kind == "range":
        low = draw(st.none() | st.integers(0, 2000))
        high = draw(st.integers(0, 2000)) if low is None else draw(st.none() | st.integers(0, 2000))
        return SearchRange("views", low, high, draw(st.booleans()), draw(st.booleans()))
    return SearchCompare("views", draw(st.sampled_from([">", ">=", "<", "<="])),
                         draw(st.integers(0, 2000)))


queries = st.recursive(
    leaves(),
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=3).map(lambda cs: SearchAnd(tuple(cs))),
        st.lists(children, min_size=2, max_size=3).map(lambda cs: SearchOr(tuple(cs))),
        # AND NOT, and a negation alone (every document without the clause).
        st.tuples(children, children).map(lambda p: SearchAnd((p[0], SearchNot(p[1])))),
        children.map(SearchNot),
    ),
    max_leaves=5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries, min_size=1, max_size=6), st.lists(documents, min_size=1, max_size=8))
def test_vigil_finds_what_tantivy_finds(standing, docs):
    named = [(f"q{i}", query) for i, query in enumerate(standing)]
    vigil = Percolator(SCHEMA)
    vigil.add_many((name, query, ()) for name, query in named)
    expected = TantivyBatchPercolator(FIELDS, DEFAULT_FIELDS, named).match_batch(docs)
    found = [[m.name for m in matches] for matches in vigil.match_batch(docs).matches]
    assert found == expected
    # The benchmark's peer at a million queries holds them a few at a time: same answer.
    held = TantivyBatchPercolator(FIELDS, DEFAULT_FIELDS, named, held=2)
    assert held.match_batch(docs) == expected and not held.queries
