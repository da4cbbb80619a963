"""Analysis: tokenizer, lowercasing, accent folding, offsets, keywords, schema and values."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from percolator import (
    DEFAULT_FIELD,
    AnalyzedDocument,
    InvalidDocumentError,
    Schema,
    SchemaError,
    analyze_text,
    normalize_term,
)
from percolator.analysis import (
    WORD,
    ascii_folded,
    canonical_keyword,
    parse_number,
    timestamp_seconds,
)


@pytest.mark.parametrize(
    ("word", "folded"),
    [
        ("Café", "cafe"),
        ("cafe\u0301", "cafe"),  # decomposed accent stays in the token and is dropped
        ("ÉCOLE", "ecole"),
        ("Straße", "strasse"),
        ("ﬁancé", "fiance"),  # compatibility ligature
        ("Ｆｕｌｌ", "full"),  # full-width letters
        ("İstanbul", "istanbul"),
        ("naïve", "naive"),
        ("ASCII", "ascii"),
    ],
)
def test_normalize_term_folds_case_and_accents(word, folded):
    assert normalize_term(word) == folded


def test_tokenizer_is_unicode_aware_and_keeps_decomposed_words_whole():
    assert analyze_text("Nai\u0308ve résumé—über_alles 42.5 日本語") == [
        "naive", "resume", "uber_alles", "42", "5", "日本語"
    ]
    assert analyze_text("!!! ...") == []


def test_tokens_keep_positions_and_original_character_offsets():
    doc = AnalyzedDocument({"title": "Ünïcode  CAFÉ, café"}, Schema.of({"title": "text"}))
    tokens = doc.tokens("title")
    assert [(t.term, t.position, t.start, t.end) for t in tokens] == [
        ("unicode", 0, 0, 7), ("cafe", 1, 9, 13), ("cafe", 2, 15, 19)
    ]
    text = doc.source["title"]
    assert [text[t.start:t.end] for t in tokens] == ["Ünïcode", "CAFÉ", "café"]
    assert doc.terms("title") == {"unicode", "cafe"}
    assert doc.positions("title") == {"unicode": {0}, "cafe": {1, 2}}


def test_list_values_offsets_count_into_values_joined_by_newline_and_positions_gap():
    schema = Schema.of({"notes": "text", "tags": "list<string>"})
    doc = AnalyzedDocument({"notes": ["red fox", "blue"], "tags": ["A b", "c"]}, schema)
    assert [(t.term, t.position, t.start, t.end) for t in doc.tokens("notes")] == [
        ("red", 0, 0, 3), ("fox", 1, 4, 7), ("blue", 102, 8, 12)
    ]
    assert [(t.term, t.start, t.end) for t in doc.tokens("tags")] == [
        ("A b", 0, 3), ("c", 4, 5)
    ]
    assert doc.terms("tags") == {"A b", "c"}


def test_keyword_fields_are_exact_and_undeclared_strings_are_keywords():
    schema = Schema.of({"title": "text", "source": "string"})
    doc = AnalyzedDocument({"title": "Big News", "source": "Reuters UK", "extra": "Free Text"},
                           schema)
    assert doc.kind("source") == doc.kind("extra") == "keyword"
    assert doc.terms("source") == {"Reuters UK"}
    assert doc.terms("extra") == {"Free Text"}
    dynamic = AnalyzedDocument({"extra": "Free Text"}, Schema(dynamic="text"))
    assert dynamic.kind("extra") == "text"
    assert dynamic.terms("extra") == {"free", "text"}


def test_default_fields_are_text_and_string_fields_unless_configured():
    schema = Schema.of({"title": "text", "views": "int", "source": "string"})
    doc = AnalyzedDocument(
        {"title": "a b", "views": 3, "source": "x", "other": "Y", "n": 5, "flag": True}, schema
    )
    assert doc.default_fields() == ("title", "source", "other")
    assert doc.terms(DEFAULT_FIELD) == {"a", "b", "x", "Y"}
    configured = Schema.of({"title": "text"}, default_fields=["title"])
    assert AnalyzedDocument({"title": "a", "other": "b"}, configured).default_fields() == (
        "title",
    )


def test_nulls_empty_lists_and_nested_objects():
    doc = AnalyzedDocument({"a": None, "b": [], "c": [None, "x"], "user": {"name": "Ann"}})
    assert doc.fields() == ("c", "user.name")
    assert not doc.has("a") and not doc.has("b")
    assert doc.terms("user.name") == {"Ann"}


def test_lists_of_lists_and_of_objects_flatten_as_elasticsearch_indexes_them():
    doc = AnalyzedDocument({"n": [[1, [2]], None, [3]], "tags": [{"k": "a"}, [{"k": "b"}], "x"]})
    assert doc.values("n") == (1, 2, 3)
    assert doc.values("tags.k") == ("a", "b") and doc.values("tags") == ("x",)


def test_values_that_cannot_be_searched_are_named():
    with pytest.raises(InvalidDocumentError, match="field 'blob' holds a bytes"):
        AnalyzedDocument({"blob": b"\x00"})
    with pytest.raises(InvalidDocumentError, match="field 'items' holds a set inside a list"):
        AnalyzedDocument({"items": [[{"a"}]]})
    with pytest.raises(InvalidDocumentError, match="must be a mapping"):
        AnalyzedDocument(["not", "a", "document"])  # type: ignore[arg-type]


def test_numbers_and_timestamps_are_parsed_from_values():
    doc = AnalyzedDocument(
        {"views": "1500", "score": 2.5, "flag": True, "ts": "2020-01-01T01:00:00+01:00",
         "epoch": 1577836800}
    )
    assert doc.numbers("views") == (1500,)
    assert doc.numbers("flag") == ()
    assert doc.timestamps("ts") == (1577836800.0,)
    assert doc.timestamps("epoch") == (1577836800.0,)
    ms = AnalyzedDocument({"epoch": 1577836800000}, Schema(time_unit="ms"))
    assert ms.timestamps("epoch") == (1577836800.0,)


def test_scalar_keywords_are_canonical():
    assert canonical_keyword(200.0) == "200"
    assert canonical_keyword(0.5) == "0.5"
    assert canonical_keyword(False) == "false"
    assert parse_number("1e3") == 1000.0
    assert parse_number("1_000") is None
    assert parse_number("nan") is None
    assert timestamp_seconds("not a date") is None
    assert timestamp_seconds("2020-01-01") == 1577836800.0


def test_schema_rejects_unknown_types_and_options():
    with pytest.raises(SchemaError, match="field 'x' has unknown type 'varchar'"):
        Schema.of({"x": "varchar"})
    with pytest.raises(SchemaError, match="dynamic must be"):
        Schema(dynamic="json")  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="declared twice"):
        Schema(fields=(("a", "int"), ("a", "text")))


def test_schema_from_stream_declaration():
    from query_lang import parse

    module = parse("stream news (title text, views int, ts timestamp) time ts unit ms")
    schema = Schema.from_stream(module.declarations[0])
    assert schema.type_of("title") == "text"
    assert schema.time_unit == "ms"


_ASCII_TEXT = st.lists(
    st.sampled_from(list("abAB_1 .,-\n'") + ["ab", "Ab", "ba", "a_b", "ab ba "]), max_size=25
).map("".join)


@settings(max_examples=300, deadline=None)
@given(_ASCII_TEXT, st.lists(st.sampled_from(["a", "b", "ab", "ba", "a_b", "1", "b1"]),
                             min_size=1, max_size=3))
def test_plain_text_offsets_and_phrases_equal_the_tokenised_path(text, words):
    # A single ASCII text value takes the substring-search path; tokens() is the reference.
    doc = AnalyzedDocument({"title": text}, Schema.of({"title": "text"}))
    tokens = doc.tokens("title")
    spans = doc.term_spans("title")
    for term in {*words, *doc.terms("title")}:
        assert doc.term_offsets("title", term) == spans.get(term, [])
    positions = doc.positions("title")
    expected = sorted(
        p for p in positions.get(words[0], ())
        if all(p + i + 1 in positions.get(w, set()) for i, w in enumerate(words[1:]))
    )
    assert doc.phrase_starts("title", tuple(words)) == expected
    assert doc.has_phrase("title", tuple(words)) == bool(expected)
    at = {t.position: t for t in tokens}
    for start in expected:
        assert doc.phrase_span("title", start, len(words)) == (
            at[start].start, at[start + len(words) - 1].end
        )
    assert doc.terms("title") == {t.term for t in tokens}


def test_phrases_in_list_values_do_not_cross_values():
    doc = AnalyzedDocument({"notes": ["red fox", "Fox red fox"]}, Schema.of({"notes": "text"}))
    assert doc.phrase_starts("notes", ("fox", "red")) == [102]
    assert doc.has_phrase("notes", ("fox", "red")) and not doc.has_phrase("notes", ("fox", "fox"))
    assert doc.phrase_span("notes", 102, 2) == (8, 15)
    assert doc.term_offsets("notes", "fox") == [(4, 7), (8, 11), (16, 19)]


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=40))
def test_ascii_fast_path_equals_the_regex_tokenizer(text):
    # The byte-table fold must split into exactly the words the Unicode regex finds, at the
    # same offsets, for every ASCII character.
    folded = ascii_folded(text)
    assert folded.split() == WORD.findall(text.lower()) == analyze_text(text)
    assert len(folded) == len(text)
    assert [m.span() for m in re.finditer(r"\S+", folded)] == [
        m.span() for m in WORD.finditer(text.lower())
    ]
    doc = AnalyzedDocument({"title": text, "tags": [text, "x"]}, Schema.of(
        {"title": "text", "tags": "text"}))
    assert doc.terms("title") == {t.term for t in doc.tokens("title")}
    assert doc.terms("tags") == {t.term for t in doc.tokens("tags")}


_VALUES = st.one_of(
    _ASCII_TEXT, st.text(max_size=12), st.integers(-5, 5), st.floats(-2, 2), st.booleans(),
    st.none(), st.lists(st.one_of(_ASCII_TEXT, st.integers(0, 3)), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["title", "body", "tag", "code", "n", "extra"]), _VALUES),
    st.lists(st.sampled_from([DEFAULT_FIELD, "title", "body", "tag", "code", "n", "extra"]),
             max_size=5),
    st.booleans(),
)
def test_terms_in_fields_is_the_union_of_each_fields_terms(source, names, declared_defaults):
    # The prefilter probes terms_in(fields) once; it must hold exactly the terms each named
    # field holds (the default fields' under DEFAULT_FIELD), keyword and text fields alike.
    schema = Schema.of(
        {"title": "text", "body": "text", "tag": "string", "code": "string", "n": "int"},
        default_fields=["title", "body"] if declared_defaults else None,
    )
    doc = AnalyzedDocument(source, schema)
    fresh = AnalyzedDocument(source, schema)
    expected = set().union(*(fresh.terms(name) for name in names))
    assert doc.terms_in(names) == expected
    # The parts the presearcher walks instead: each one named field's non-empty terms (the
    # default fields' together), and together exactly the same terms.
    parts = AnalyzedDocument(source, schema).term_parts(names)
    assert set().union(*parts) == expected
    assert all(parts)
    assert all(any(part == fresh.terms(name) for name in names) for part in parts)
    defaults = set().union(*(AnalyzedDocument(source, schema).terms(f)
                             for f in doc.default_fields()))
    assert doc.terms(DEFAULT_FIELD) == defaults
    # In the document's order, whether the schema names the default fields or not.
    assert doc.default_fields() == tuple(
        f for f in doc.fields() if schema.is_default_field(f, doc.values(f))
    )
