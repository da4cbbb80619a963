"""Flat postings of large sealed segments (:class:`ColumnarPostings`) against direct evaluation
of every posting's atoms, with postings gathered one at a time and in array operations."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from percolator_support import SCHEMA, VARIANTS, WORDS, baseline, documents, outcome
from test_percolator_patterns import pattern_atoms

from percolator import AnalyzedDocument, IndexedPresearcher, Percolator
from percolator import columnar as columnar_module
from percolator.columnar import ColumnarPostings
from percolator.extract import atom_holds, term_filter
from query_lang import parse_search

FIELDS = ["*", "title", "body", "source", "tags", "note"]


@st.composite
def atoms(draw) -> tuple:
    kind = draw(st.sampled_from(["term", "term", "term", "pattern", "number", "time", "exists"]))
    field_name = draw(st.sampled_from(FIELDS))
    if kind == "term":
        word = draw(st.sampled_from(WORDS + ["cafe", "reuters", "Reuters", "x y", "wire"]))
        return ("term", field_name, word)
    if kind == "pattern":
        atom = draw(pattern_atoms())
        # Patterns without a literal long enough are never pattern atoms (see extract).
        return atom if term_filter(*atom[2:]).literals else ("exists", atom[1])
    if kind == "number":
        low = draw(st.none() | st.integers(0, 2000))
        high = draw(st.none() | st.integers(0, 2000))
        return ("number", draw(st.sampled_from(["views", "score"])), low, high)
    if kind == "time":
        return ("time", "ts", draw(st.sampled_from([None, 1_600_000_000.0])),
                draw(st.sampled_from([None, 1_700_000_000.0])))
    return ("exists", draw(st.sampled_from(["title", "views", "tags", "missing"])))


postings_lists = st.lists(
    st.tuples(atoms(), st.none() | atoms(), st.integers(0, 12)), min_size=1, max_size=14
)
checks_maps = st.dictionaries(
    st.integers(0, 12), st.lists(st.lists(atoms(), min_size=1, max_size=3), min_size=1,
                                 max_size=2), max_size=5
)


def expected_candidates(postings, checks, doc) -> list[int]:
    posted = {
        slot for key, partner, slot in postings
        if atom_holds(doc, key) and (partner is None or atom_holds(doc, partner))
    }
    return sorted(
        slot for slot in posted
        if all(any(atom_holds(doc, atom) for atom in clause) for clause in checks.get(slot, ()))
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(postings_lists, checks_maps, st.lists(documents, min_size=1, max_size=4))
def test_candidates_equal_direct_evaluation_of_every_posting(postings, checks, document_list):
    columnar = ColumnarPostings(postings, checks)
    docs = [AnalyzedDocument(document, SCHEMA) for document in document_list]
    expected = [expected_candidates(postings, checks, doc) for doc in docs]
    for doc, wanted in zip(docs, expected, strict=True):
        for few_hits in (0, 10**9):  # gathered in array operations, then one at a time
            columnar.few_hits = few_hits
            assert columnar.candidates(doc) == wanted
    # The whole list at once, and with documents repeated (their atoms must not mix).
    assert columnar.candidates_batch(docs) == expected
    assert columnar.candidates_batch(docs + docs[::-1]) == expected + expected[::-1]


def test_a_pattern_without_a_probe_literal_is_tested_on_every_term():
    # Extraction never makes such an atom (it becomes field presence), but the postings take
    # any atom: "a?" has no literal of three characters to find terms by.
    wildcard = ("pattern", "title", "text", "wildcard", "a?")
    assert term_filter(*wildcard[2:]).probe is None
    columnar = ColumnarPostings([(("term", "title", "zeta"), wildcard, 1)], {})
    for title, expected in [("zeta ab", [1]), ("zeta abc", []), ("ab", []), ("zeta ax", [1])]:
        assert columnar.candidates(AnalyzedDocument({"title": title}, SCHEMA)) == expected


def test_both_gathering_paths_are_taken_by_default_threshold():
    # A document holding more atoms than FEW_HITS goes through the array path.
    words = [f"w{i}" for i in range(columnar_module.FEW_HITS + 5)]
    postings = [(("term", "title", w), ("term", "title", words[0]), i)
                for i, w in enumerate(words)]
    postings.append((("term", "title", "alone"), None, 999))
    columnar = ColumnarPostings(postings, {3: [[("term", "title", "missing")]]})
    many = AnalyzedDocument({"title": " ".join(words)}, SCHEMA)
    few = AnalyzedDocument({"title": " ".join(words[:4]) + " alone"}, SCHEMA)
    assert len(columnar.held(many)) >= columnar.few_hits
    assert columnar.candidates(many) == [i for i in range(len(words)) if i != 3]
    assert columnar.candidates(few) == [0, 1, 2, 999]


def test_segments_below_the_threshold_keep_python_postings():
    standing = [(f"q{i}", parse_search(f"title:{w}")) for i, w in enumerate(WORDS)]
    small = Percolator(SCHEMA, IndexedPresearcher(columnar_threshold=len(WORDS) + 1))
    small.add_many((name, query, ()) for name, query in standing)
    large = VARIANTS["indexed-columnar"](standing)
    assert small.stats().columnar == 0 and small.stats().segments == 1
    assert large.stats().columnar == 1
    docs = [{"id": "1", "title": "acme corp merger"}]
    assert outcome(small, docs) == outcome(large, docs) == outcome(baseline(standing), docs)


@pytest.mark.parametrize("threshold", [0, -5])
def test_threshold_must_be_positive(threshold):
    from percolator import ConfigurationError

    with pytest.raises(ConfigurationError, match="columnar_threshold"):
        IndexedPresearcher(columnar_threshold=threshold)
