"""The shared presearcher suite (Lucene Monitor's PresearcherTestBase): every variant must return
exactly the no-filtering baseline's matches, and the filtering ones must run only the queries
whose literals the document contains."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from percolator_support import FILTERING, SCHEMA, VARIANTS, baseline, documents, outcome, queries

from query_lang import parse_search
from query_lang.ast import SearchNot, SearchTerm

STANDING = [
    ("acme_news", parse_search(
        'title:("acme corp" OR acme) AND body:(layoff* OR merger) AND NOT source:tabloid '
        "AND views >= 1000")),
    ("zeta", parse_search("zeta")),
    ("cafe_prefix", parse_search("body:caf*")),
    ("wild", parse_search("title:m?rger*")),
    ("regex", parse_search("body:/lay(off)?s?/")),
    ("range", parse_search("score:[1 TO 2}")),
    ("recent", parse_search("ts:[2024-01-01 TO *]")),
    ("not_tabloid", parse_search("NOT source:tabloid")),
    ("has_tags", parse_search("_exists_:tags")),
    ("tag", parse_search("tags:news")),
]

DOCUMENTS = [
    {"id": "d1", "title": "ACME Corp to cut jobs", "body": "Layoffs follow the merger",
     "source": "reuters", "views": 1500},
    {"id": "d2", "title": "Zeta ships", "body": "Café opens", "source": "tabloid",
     "score": 1.5, "ts": "2024-05-01T10:00:00Z", "tags": ["news", "food"]},
    {"id": "d3", "title": "Mergers wave", "body": "nothing here", "views": 3},
    {"id": "d4", "title": "unrelated", "source": "tabloid"},
]


@pytest.fixture(params=list(VARIANTS))
def variant(request):
    return request.param


def test_matches_equal_the_baseline(variant):
    expected = outcome(baseline(STANDING), DOCUMENTS)
    assert outcome(VARIANTS[variant](STANDING), DOCUMENTS) == expected
    assert [name for name, _ in expected[0]] == ["acme_news", "not_tabloid", "regex"]
    assert dict(expected[0])["acme_news"] == {"body": [[0, 7], [19, 25]], "title": [[0, 9]]}
    assert [name for name, _ in expected[1]] == [
        "cafe_prefix", "has_tags", "range", "recent", "tag", "zeta"
    ]
    assert [name for name, _ in expected[2]] == ["not_tabloid", "wild"]
    assert expected[3] == []


@pytest.mark.parametrize("variant_name", FILTERING)
def test_filtering_runs_only_queries_whose_literals_occur(variant_name):
    percolator = VARIANTS[variant_name](STANDING)
    # "not_tabloid" requires nothing, so it is the only always-run query.
    assert percolator.index.always_run() == 1
    stats = percolator.match_batch(
        [{"id": "empty"}, {"id": "plain", "title": "weather report", "body": "rain"}]
    ).stats
    assert stats.candidates_per_doc == (1, 1)
    assert stats.verified == 2 and stats.matched == 2 and stats.always_run == 1
    # d1 holds acme, corp, layoffs, views and no literal of the others: acme_news, the regex
    # (literal "lay" framed at the term start) and the always-run query are verified.
    stats = percolator.match_batch(DOCUMENTS[:1]).stats
    assert stats.candidates_per_doc == (3,)


def test_baseline_runs_every_query():
    stats = baseline(STANDING).match_batch([{"id": "empty"}]).stats
    assert stats.candidates_per_doc == (len(STANDING),)
    assert stats.always_run == len(STANDING)


@pytest.mark.parametrize("variant_name", FILTERING)
def test_pattern_queries_stay_indexed(variant_name):
    # Unlike the Elasticsearch percolator, prefixes, wildcards and regexes with a literal are
    # indexed: a document without the literal does not run them.
    patterns = [
        ("p", parse_search("title:layof*")),
        ("w", parse_search("title:*rger")),
        ("r", parse_search("title:/.*ship(s|ped)/")),
        ("infix", parse_search("title:*qux*")),
    ]
    percolator = VARIANTS[variant_name](patterns)
    assert percolator.index.always_run() == 0
    for title, expected in [("nothing", 0), ("layoffs", 1), ("merger", 1), ("shipped", 1),
                            ("aquxb", 1), ("layoff merger", 2)]:
        stats = percolator.match_batch([{"title": title}]).stats
        assert stats.candidates_per_doc == (expected,), title
        assert stats.matched == expected, title


@pytest.mark.parametrize("variant_name", FILTERING)
def test_conjunction_needs_every_clause_to_be_a_candidate(variant_name):
    percolator = VARIANTS[variant_name]([
        ("q", parse_search("title:(acme AND merger)")),
        # Posted under two of its clauses; the other two are checked on the posted query.
        ("q3", parse_search("title:(acme AND merger AND (zeta OR news) AND caf*)")),
        ("filler", parse_search("body:abbb")),
    ])

    def verified(title: str) -> int:
        return percolator.match_batch([{"title": title}]).stats.verified

    assert verified("acme") == 0
    assert verified("acme merger") == 1
    assert verified("acme merger zeta") == 1
    assert verified("acme merger café") == 1
    assert verified("acme merger news cafés") == 2


def test_negation_only_query_is_always_run_and_counted():
    percolator = VARIANTS["indexed-bulk"]([("not", SearchNot(SearchTerm("title", "acme")))])
    assert percolator.stats().always_run == 1
    result = percolator.match_batch([{"title": "acme"}, {"title": "other"}])
    assert result.stats.candidates_per_doc == (1, 1)
    assert [len(m) for m in result.matches] == [0, 1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(queries, min_size=1, max_size=8),
    st.lists(documents, min_size=1, max_size=4),
)
def test_every_variant_agrees_with_the_baseline(query_list, document_list):
    standing = [(f"q{i}", q) for i, q in enumerate(query_list)]
    expected_result = baseline(standing).match_batch(document_list, highlights=True)
    expected = [[(m.name, m.highlights) for m in found] for found in expected_result.matches]
    for name in FILTERING:
        result = VARIANTS[name](standing).match_batch(document_list, highlights=True)
        assert [[(m.name, m.highlights) for m in found] for found in result.matches] == expected
        # Filtering never verifies more than the baseline, and at least what matched.
        for ran, all_ran, found in zip(
            result.stats.candidates_per_doc,
            expected_result.stats.candidates_per_doc,
            result.matches,
            strict=True,
        ):
            assert len(found) <= ran <= all_ran


@settings(max_examples=60, deadline=None)
@given(st.lists(queries, min_size=1, max_size=6), documents)
def test_undeclared_fields_and_text_dynamic_schema_agree(query_list, document):
    from percolator import Schema

    schemas = [Schema(), Schema.of({"title": "text"}, dynamic="text"),
               Schema.of(default_fields=["title", "note"])]
    standing = [(f"q{i}", q) for i, q in enumerate(query_list)]
    for schema in schemas:
        expected = outcome(baseline(standing, schema), [document])
        assert outcome(VARIANTS["indexed-bulk"](standing, schema), [document]) == expected
        assert outcome(VARIANTS["indexed-merging"](standing, schema), [document]) == expected


def test_schema_used_by_suite_declares_text_fields():
    assert SCHEMA.type_of("title") == "text"


@pytest.mark.parametrize("variant_name", FILTERING)
def test_terms_with_many_partners_agree_with_the_baseline(variant_name):
    # Enough queries share a posting term that its partners are intersected with the document
    # in bulk rather than probed one by one (pairs of terms, a term with a prefix or a range).
    words = [f"w{i}" for i in range(12)]
    standing = [(f"pair_{w}", parse_search(f"title:(acme AND {w})")) for w in words]
    standing += [(f"prefix_{w}", parse_search(f"title:(acme AND {w}x*)")) for w in words]
    standing += [(f"range_{i}", parse_search(f"title:acme AND views:[{i} TO {i + 5}]"))
                 for i in range(12)]
    documents = [
        {"id": "hit", "title": "Acme w3 w4x w7xyz w11 merger", "views": 6},
        {"id": "one", "title": "acme w4", "views": 100},
        {"id": "none", "title": "w1 w2x"},
        # more terms than the key has partners: probed from the partners' side
        {"id": "long", "title": "acme w5 " + " ".join(f"filler{i}" for i in range(20))},
    ]
    expected = outcome(baseline(standing), documents)
    assert outcome(VARIANTS[variant_name](standing), documents) == expected
    assert sorted(name for name, _ in expected[0]) == sorted(
        ["pair_w3", "pair_w11", "prefix_w4", "prefix_w7"] + [f"range_{i}" for i in range(1, 7)]
    )
    stats = VARIANTS[variant_name](standing).match_batch(documents).stats
    assert stats.candidates_per_doc == (len(expected[0]), 1, 0, 1)
    assert [name for name, _ in expected[1]] == ["pair_w4"]
    assert [name for name, _ in expected[3]] == ["pair_w5"]


@pytest.mark.parametrize("variant_name", FILTERING)
def test_prefix_partners_agree_with_the_baseline_in_ascii_and_accented_text(variant_name):
    # A prefix partner is one substring search in a field's space-joined ASCII terms; accented
    # text has no such form, so there the prefix is tested on the terms themselves.
    standing = [(f"p_{w}", parse_search(f"title:(acme AND {w}*)"))
                for w in ["cafet", "caf", "resume", "resumes", "naive", "nai", "zzzz"]]
    standing += [(f"b_{w}", parse_search(f"body:{w}* AND title:acme"))
                 for w in ["cafet", "naiv"]]
    documents = [
        {"id": "ascii", "title": "Acme cafeteria resumes", "body": "naive cafeteria"},
        {"id": "accented", "title": "Acme Cafétéria résumés", "body": "naïve"},
        {"id": "short", "title": "acme caf nai zzz", "body": "caf"},
        {"id": "no-key", "title": "cafeteria resumes naive", "body": "cafeteria"},
    ]
    expected = outcome(baseline(standing), documents)
    assert outcome(VARIANTS[variant_name](standing), documents) == expected
    assert [[name for name, _ in found] for found in expected] == [
        ["b_cafet", "b_naiv", "p_caf", "p_cafet", "p_resume", "p_resumes"],
        ["b_naiv", "p_caf", "p_cafet", "p_resume", "p_resumes"],
        ["p_caf", "p_nai"],
        [],
    ]
