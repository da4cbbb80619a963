"""Pattern atoms (prefixes, wildcards, regexes) as the indexed presearcher decides them: term by
term through its automaton once sealed, by a substring search when the pattern's only literal
decides it, and by testing the field otherwise. Each way must agree with evaluating the atom
directly on the document."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from percolator_support import SCHEMA, VARIANTS, WORDS, baseline, documents, outcome

from percolator import AnalyzedDocument, IndexedPresearcher, Percolator, Schema
from percolator import columnar as columnar_module
from percolator import indexed_presearcher as indexed_module
from percolator import matcher as matcher_module
from percolator.extract import atom_holds, term_filter
from percolator.pattern_table import PatternTable, decisive_literal
from percolator.term_patterns import TERM_EDGE
from query_lang import parse_search
from query_lang.ast import SearchAnd, SearchPrefix, SearchRegex, SearchTerm, SearchWildcard

FIELDS = ["title", "body", "source", "tags", "note", "*"]

#: The regexes the atoms use, each with a word it matches once analysed.
REGEX_WORDS = {"ac.e": "acme", "layoffs?": "layoffs", "mer(ger)?": "merger", "ab+": "abbb",
               "z[e]ta": "zeta", "caf.": "café"}


@st.composite
def worded_pattern_atoms(draw) -> tuple[tuple, str]:
    """A pattern atom and a word it was made to pass: the word a prefix or wildcard was cut
    from, or a word the regex matches."""
    form = draw(st.sampled_from(["prefix", "wildcard", "regex"]))
    word = draw(st.sampled_from(WORDS + ["wire", "Reuters", "x y"]))
    if form == "prefix":
        source = word[: draw(st.integers(1, len(word)))]
    elif form == "wildcard":
        chars = list(word)
        for _ in range(draw(st.integers(1, 2))):
            chars[draw(st.integers(0, len(chars) - 1))] = draw(st.sampled_from("?*"))
        source = "".join(chars) + draw(st.sampled_from(["", "*"]))
    else:
        source = draw(st.sampled_from(sorted(REGEX_WORDS)))
        word = REGEX_WORDS[source]
    kind = draw(st.sampled_from(["text", "keyword"]))
    return ("pattern", draw(st.sampled_from(FIELDS)), kind, form, source), word


def pattern_atoms() -> st.SearchStrategy[tuple]:
    """A pattern atom of a random form, field and kind."""
    return worded_pattern_atoms().map(lambda pair: pair[0])


def _usable(atom: tuple) -> bool:
    # Patterns without a literal long enough become field-presence atoms, never patterns.
    return bool(term_filter(*atom[2:]).literals)


def _usable_pair(pair: tuple[tuple, str]) -> bool:
    return _usable(pair[0])


_WORDED_ATOMS = worded_pattern_atoms()
_USABLE_WORDED_ATOMS = _WORDED_ATOMS.filter(_usable_pair)


@st.composite
def atoms_and_documents(
    draw, usable: bool = False, min_atoms: int = 1, max_atoms: int = 6, max_documents: int = 1
) -> tuple[list[tuple], list[dict]]:
    """Pattern atoms (only those that are patterns, when ``usable``) and one to
    ``max_documents`` documents that often hold them: in each document, the word an atom was
    made to pass is put in the atom's field for some atoms, and ``acme`` at the start of the
    title sometimes. Random documents alone hold an atom too rarely to test the positive side.
    """
    worded = _USABLE_WORDED_ATOMS if usable else _WORDED_ATOMS
    pairs = draw(st.lists(worded, min_size=min_atoms, max_size=max_atoms))
    found = []
    for document in draw(st.lists(documents, min_size=1, max_size=max_documents)):
        document = dict(document)
        for atom, word in pairs:
            if draw(st.booleans()):
                name = "title" if atom[1] == "*" else atom[1]
                if name in ("title", "body"):
                    document[name] = f"{document.get(name, '')} {word}".lstrip()
                else:
                    document[name] = [word] if name == "tags" else word
        if draw(st.booleans()):
            document["title"] = f"acme {document.get('title', '')}".rstrip()
        found.append(document)
    return [atom for atom, _ in pairs], found


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(atoms_and_documents(usable=True), st.booleans())
def test_pattern_atoms_agree_with_direct_evaluation(atoms_and_document, as_keys):
    atoms, [document] = atoms_and_document
    table = PatternTable()
    ids = [table.atom(atom) for atom in atoms]
    table.seal(ids if as_keys else ())
    doc = AnalyzedDocument(document, SCHEMA)
    held = []
    for atom, atom_id in zip(atoms, ids, strict=True):
        expected = atom_holds(doc, atom)
        held.append(expected)
        assert table.holds(doc, atom_id) == expected, atom
        if as_keys:
            # Term by term: the atom holds when some term of its field passes its pattern.
            field_name = atom[1]
            passed = {
                located[i + 1]
                for term in (doc.terms(field_name) if doc.has(field_name) else ())
                for located in [table.passes(term)]
                for i in range(0, len(located), 2)
                if located[i] == field_name
            }
            assert (atom_id in passed) == expected, atom
    # Both outcomes must be common for the agreement to mean much (--hypothesis-show-statistics).
    event("some atom holds" if any(held) else "no atom holds")
    event("some atom fails" if not all(held) else "every atom holds")


@pytest.mark.parametrize(("form", "source", "literal"), [
    ("prefix", "Layoff", " layoff"),
    ("wildcard", "*rger", "rger "),
    ("wildcard", "*qux*", "qux"),
    ("wildcard", "la*offs", False),
    ("wildcard", "m?rger", False),
    ("regex", "acme.*", False),
    ("prefix", "x y", None),
])
def test_only_a_lone_literal_with_stars_decides_a_pattern(form, source, literal):
    assert decisive_literal("text", form, source) == literal


_ASCII = st.lists(st.sampled_from(["ab", "ba", "abc", "c", "a_b", "1", " ", " ", ".", "-"]),
                  max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(_ASCII, _ASCII, st.sampled_from(["ab", "ba", "b", "c", "a_b", "bc", "1"]),
       st.booleans(), st.booleans())
def test_spaced_terms_hold_a_literal_exactly_when_the_framed_terms_do(
    title, body, core, start, end
):
    literal = (TERM_EDGE if start else "") + core + (TERM_EDGE if end else "")
    schema = Schema.of({"title": "text", "body": "text"}, default_fields=["title", "body"])
    doc = AnalyzedDocument({"title": title, "body": body}, schema)
    spaced = literal.replace(TERM_EDGE, " ")
    found = False
    for name in ["title", "body", "*"]:
        # A string value is present even with no term, so every field is compared.
        assert doc.has(name) and doc.frameable(name)
        framed = literal in doc.joined_terms(name)
        assert (spaced in doc.spaced_terms(name)) == framed
        found = found or framed
    event("literal found" if found else "literal absent")


def test_spaced_terms_only_for_plain_text_values():
    schema = Schema.of({"title": "text", "tags": "text", "source": "string"})
    doc = AnalyzedDocument({"title": "Café crème", "tags": ["a", "b"], "source": "x"}, schema)
    assert doc.spaced_terms("title") is None
    assert doc.spaced_terms("tags") is None
    assert doc.spaced_terms("source") is None
    framed = AnalyzedDocument({"source": "a\x1eb"}, schema)
    assert not framed.frameable("source") and framed.frameable("title")


def _python_memory(segment) -> int:
    return len(segment._known)


def _columnar_memory(segment) -> int:
    title = segment._columnar._fields["title"]
    return len(title.known) - len(title.base)


@pytest.mark.parametrize(("module", "threshold", "remembered"), [
    (indexed_module, None, _python_memory),
    (columnar_module, 1, _columnar_memory),
])
def test_learned_terms_are_forgotten_past_the_memory(monkeypatch, module, threshold, remembered):
    # Wildcards alone are posted under their pattern atoms, found term by term and remembered;
    # a small memory is emptied and refilled without changing a match. Same for the flat
    # postings of a columnar segment, which remember the patterns a term passes (the terms of
    # a whole batch of documents at once: two here).
    monkeypatch.setattr(module, "_TERM_MEMORY", 3)
    monkeypatch.setattr(matcher_module, "SELECTION_BATCH", 2)
    standing = [(f"w{i}", SearchWildcard("title", pattern))
                for i, pattern in enumerate(["m?rger*", "*yoff*", "acm?", "z*a", "ca?e"])]
    standing.append(("both", parse_search("title:(acme AND *rger)")))
    docs = [{"id": str(i), "title": " ".join(WORDS[i:i + 4]) + f" filler{i}"}
            for i in range(len(WORDS))]
    percolator = Percolator(SCHEMA, IndexedPresearcher(columnar_threshold=threshold))
    percolator.add_many((name, query, ()) for name, query in standing)
    [sealed] = percolator.index._sealed
    assert sealed.segment.columnar == (threshold is not None)
    if threshold is None:
        assert sealed.segment.patterns.automaton is not None
    for _ in range(2):
        assert outcome(percolator, docs) == outcome(baseline(standing), docs)
    assert remembered(sealed.segment) <= 3 + 2 * 8  # the memory, plus one batch's terms


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(atoms_and_documents(max_atoms=5, max_documents=4))
def test_pattern_queries_with_partners_agree_with_the_baseline(atoms_and_documents_list):
    atoms, document_list = atoms_and_documents_list
    # Each pattern alone (posted under its atom, a key) and AND a term (its atom a partner,
    # tested when a document holds the term).
    node = {"prefix": SearchPrefix, "wildcard": SearchWildcard, "regex": SearchRegex}
    standing = []
    for i, (_, field_name, _, form, source) in enumerate(atoms):
        pattern = node[form](None if field_name == "*" else field_name, source)
        standing.append((f"p{i}", pattern))
        standing.append((f"t{i}", SearchAnd((SearchTerm("title", "acme"), pattern))))
    expected = outcome(baseline(standing), document_list)
    # Without a match only a query the index decides on its own (unverified) can go wrong.
    event("the baseline matches" if any(expected) else "no baseline match")
    partnered = any(name.startswith("t") for found in expected for name, _ in found)
    event("a query with a partner pattern matches" if partnered else "no partnered match")
    for variant in ("indexed-bulk", "indexed-open-delta"):
        assert outcome(VARIANTS[variant](standing), document_list) == expected
