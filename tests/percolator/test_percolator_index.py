"""The live query index: add, replace and delete while documents flow; merges change nothing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from percolator_support import SCHEMA, baseline, documents, outcome, queries

from percolator import (
    DuplicateQueryError,
    IndexedPresearcher,
    InvalidQueryError,
    Percolator,
    QueryIndex,
    UnknownQueryError,
)
from query_lang import parse_search

DOCS = [
    {"id": "a", "title": "acme merger", "views": 10},
    {"id": "b", "title": "zeta layoffs", "body": "café"},
    {"id": "c", "title": "nothing", "views": 5000},
]


def names(percolator: Percolator) -> list[list[str]]:
    return [[m.name for m in found] for found in percolator.match_batch(DOCS).matches]


def test_add_replace_delete_take_effect_immediately():
    percolator = Percolator(SCHEMA, delta_capacity=4)
    percolator.add("q1", parse_search("title:acme"))
    percolator.add("q2", parse_search("title:layoff*"))
    assert names(percolator) == [["q1"], ["q2"], []]
    percolator.replace("q1", parse_search("views > 1000"))
    assert names(percolator) == [[], ["q2"], ["q1"]]
    percolator.delete("q2")
    assert names(percolator) == [[], [], ["q1"]]
    percolator.add("q2", parse_search("body:cafe"))
    assert names(percolator) == [[], ["q2"], ["q1"]]
    assert len(percolator) == 2


def test_errors_name_the_query():
    index = QueryIndex(SCHEMA)
    index.add("q", parse_search("title:acme"))
    with pytest.raises(DuplicateQueryError, match="'q' already exists"):
        index.add("q", parse_search("title:acme"))
    with pytest.raises(UnknownQueryError, match="no standing query named 'nope' to replace"):
        index.replace("nope", parse_search("title:acme"))
    with pytest.raises(UnknownQueryError, match="to delete"):
        index.delete("nope")
    with pytest.raises(KeyError):
        index.get("nope")
    with pytest.raises(InvalidQueryError, match=r"query 'bad': invalid regex /\(/"):
        index.add("bad", parse_search("title:/(/"))
    with pytest.raises(InvalidQueryError, match="non-empty string"):
        index.add("", parse_search("x"))
    with pytest.raises(DuplicateQueryError):
        index.add_many([("n", parse_search("x"), ()), ("n", parse_search("y"), ())])
    assert "bad" not in index and "n" not in index and len(index) == 1


def test_small_delta_seals_and_merges_into_few_segments():
    index = QueryIndex(SCHEMA, delta_capacity=8, merge_factor=2)
    for i in range(1000):
        index.add(f"q{i}", parse_search(f"title:w{i} OR body:x{i}*"))
    stats = index.stats()
    assert stats.queries == 1000
    # Geometric merging keeps the segment count logarithmic.
    assert stats.segments <= 10
    assert index.merges > 0
    from percolator import AnalyzedDocument

    doc = AnalyzedDocument({"title": "w17 w999", "body": "x5000"}, SCHEMA)
    # x5000 starts with x5, x50 and x500: all three prefixes are candidates, and verify.
    assert sorted(q.name for q in index.candidates(doc)) == [
        "q17", "q5", "q50", "q500", "q999"
    ]


def test_tombstones_are_purged_by_merges():
    index = QueryIndex(SCHEMA, delta_capacity=4)
    index.add_many((f"q{i}", parse_search(f"title:w{i}"), ()) for i in range(10))
    for i in range(5):
        index.delete(f"q{i}")
    assert index.stats().tombstones == 5
    index.delete("q5")
    assert index.stats().tombstones == 0  # more than half dead: the segment was rebuilt
    assert index.stats().queries == 4
    index.merge()
    assert index.stats().segments == 1


def test_always_run_count_follows_live_changes_and_options_are_checked():
    from percolator import ConfigurationError, IndexedPresearcher

    index = QueryIndex(SCHEMA, delta_capacity=2)
    index.add("not_a", parse_search("NOT title:a"))
    index.add("b", parse_search("title:b"))
    index.add("not_c", parse_search("-title:c"))
    assert index.always_run() == 2 and index.stats().always_run == 2
    index.replace("not_a", parse_search("title:a"))
    index.delete("not_c")
    assert index.always_run() == 0
    with pytest.raises(ConfigurationError, match="delta_capacity must be at least 1"):
        QueryIndex(SCHEMA, delta_capacity=0)
    with pytest.raises(ConfigurationError, match="merge_factor"):
        QueryIndex(SCHEMA, merge_factor=0)
    segment = IndexedPresearcher().new_segment()
    segment.seal()
    with pytest.raises(ConfigurationError, match="sealed segment"):
        segment.add(0, index.get("b").requirement)


def test_stream_restriction():
    percolator = Percolator(SCHEMA)
    percolator.add("news_only", parse_search("title:acme"), streams=["news"])
    percolator.add("anywhere", parse_search("title:acme"))
    doc = {"id": "1", "title": "acme"}
    assert [m.name for m in percolator.match(doc, stream="news")] == ["anywhere", "news_only"]
    assert [m.name for m in percolator.match(doc, stream="blogs")] == ["anywhere"]
    assert percolator.match_batch([doc], stream="blogs").stats.verified == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["add", "replace", "delete", "merge"]),
                       st.integers(0, 7), queries), min_size=1, max_size=25),
    st.lists(documents, min_size=1, max_size=3),
)
def test_live_changes_match_a_fresh_baseline_before_and_after_merge(operations, docs):
    live = Percolator(SCHEMA, IndexedPresearcher(), delta_capacity=3, merge_factor=2)
    current: dict[str, object] = {}
    for action, number, query in operations:
        name = f"q{number}"
        if action == "merge":
            live.index.merge()
        elif name in current and action == "delete":
            live.delete(name)
            del current[name]
        elif name in current:
            live.replace(name, query)
            current[name] = query
        elif action != "delete":
            live.add(name, query)
            current[name] = query
        expected = outcome(baseline(list(current.items())), docs)
        assert outcome(live, docs) == expected
    live.index.merge()
    assert outcome(live, docs) == expected
    assert live.stats().segments <= 1 and live.stats().tombstones == 0


def test_results_identical_before_and_after_merge_on_a_larger_mix():
    rng = random.Random(7)
    words = ["acme", "zeta", "merger", "layoffs", "cafe", "news", "corp", "w1", "w2"]
    live = Percolator(SCHEMA, delta_capacity=16, merge_factor=3)
    for i in range(300):
        a, b = rng.sample(words, 2)
        text = rng.choice([f"title:{a} AND body:{b}", f"{a}*", f'"{a} {b}"', f"title:/{a}.*/",
                           f"views:[{i} TO {i * 3}]", f"NOT {a}"])
        live.add(f"q{i}", parse_search(text))
    for i in range(0, 300, 3):
        live.delete(f"q{i}")
    docs = [{"id": str(i), "title": " ".join(rng.sample(words, 3)),
             "body": " ".join(rng.sample(words, 3)), "views": rng.randint(0, 900)}
            for i in range(30)]
    before = live.match_batch(docs)
    live.index.merge()
    after = live.match_batch(docs)
    assert before.matches == after.matches
    assert before.stats == after.stats
    fresh = baseline([(q.name, q.query) for q in live.index])
    assert fresh.match_batch(docs).matches == after.matches
