"""Shared pieces of the percolator tests: the schema, the presearcher variants every suite runs
against, and Hypothesis strategies for random queries and documents over a small vocabulary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

from percolator import (
    IndexedPresearcher,
    NoFilterPresearcher,
    Percolator,
    Schema,
    Selectivity,
)
from query_lang.ast import (
    SearchAnd,
    SearchCompare,
    SearchExists,
    SearchNode,
    SearchNot,
    SearchOr,
    SearchPhrase,
    SearchPrefix,
    SearchRange,
    SearchRegex,
    SearchTerm,
    SearchWildcard,
)

SCHEMA = Schema.of(
    {
        "title": "text",
        "body": "text",
        "source": "string",
        "tags": "list<string>",
        "views": "int",
        "score": "float",
        "ts": "timestamp",
    }
)

Query = tuple[str, SearchNode]


def _bulk(presearcher: Callable[[], Any], **options: Any) -> Callable[..., Percolator]:
    def build(queries: Sequence[Query], schema: Schema = SCHEMA) -> Percolator:
        percolator = Percolator(schema, presearcher(), **options)
        percolator.add_many((name, query, ()) for name, query in queries)
        return percolator

    return build


def _live(presearcher: Callable[[], Any], **options: Any) -> Callable[..., Percolator]:
    def build(queries: Sequence[Query], schema: Schema = SCHEMA) -> Percolator:
        percolator = Percolator(schema, presearcher(), **options)
        for name, query in queries:
            percolator.add(name, query)
        return percolator

    return build


#: Every presearcher variant, built from the same queries. "no-filter" is the baseline.
VARIANTS: dict[str, Callable[..., Percolator]] = {
    "no-filter": _bulk(NoFilterPresearcher),
    "indexed-bulk": _bulk(IndexedPresearcher),
    "indexed-open-delta": _live(IndexedPresearcher, delta_capacity=10_000),
    "indexed-merging": _live(IndexedPresearcher, delta_capacity=2, merge_factor=2),
    # Every sealed segment as flat arrays alone, however small.
    "indexed-columnar": _bulk(
        lambda: IndexedPresearcher(columnar_threshold=1, choose_layout=False)
    ),
    "indexed-columnar-merging": _live(
        lambda: IndexedPresearcher(columnar_threshold=1, choose_layout=False),
        delta_capacity=2, merge_factor=2,
    ),
    # Every sealed segment keeps both layouts and serves documents from each in turn.
    "indexed-layout-trial": _bulk(lambda: IndexedPresearcher(columnar_threshold=1)),
    "indexed-term-stats": _bulk(
        lambda: IndexedPresearcher(Selectivity({"acme": 0.9, "news": 0.8, "zeta": 0.01}))
    ),
}
FILTERING = [name for name in VARIANTS if name != "no-filter"]


def baseline(queries: Sequence[Query], schema: Schema = SCHEMA) -> Percolator:
    return VARIANTS["no-filter"](queries, schema)


def outcome(percolator: Percolator, documents: Sequence[dict[str, Any]]) -> list[list[tuple]]:
    """Per document: (query name, highlights) of every match, comparable across variants."""
    result = percolator.match_batch(documents, highlights=True)
    return [[(m.name, m.highlights) for m in found] for found in result.matches]


# ---------------------------------------------------------------- strategies

WORDS = ["acme", "corp", "merger", "layoff", "layoffs", "news", "café", "zeta", "ab", "abbb"]
SPELLINGS = {
    "acme": ["acme", "ACME", "Acme"],
    "café": ["café", "CAFE", "cafe\u0301", "Café"],
    "merger": ["merger", "Merger"],
}
SOURCES = ["reuters", "Reuters", "tabloid", "wire"]
TEXT_FIELDS = [None, "title", "body", "source", "tags", "note"]


def _spelled(word: str) -> st.SearchStrategy[str]:
    return st.sampled_from(SPELLINGS.get(word, [word]))


sentence = st.lists(st.sampled_from(WORDS).flatmap(_spelled), max_size=6).map(
    lambda words: ", ".join(words) if len(words) % 3 == 0 else " ".join(words)
)
timestamps = st.one_of(
    st.integers(1_577_836_800, 1_735_689_600),
    st.sampled_from(["2020-01-01T00:00:00Z", "2022-06-15", "2024-05-01T10:00:00+02:00"]),
)

documents = st.fixed_dictionaries(
    {},
    optional={
        "title": sentence,
        "body": sentence,
        "source": st.sampled_from(SOURCES),
        "tags": st.lists(st.sampled_from(["acme", "news", "x y"]), max_size=3),
        "note": st.sampled_from(["acme", "Acme news", "zeta"]),
        "views": st.integers(0, 2000) | st.sampled_from(["1500"]),
        "score": st.floats(-5, 5, allow_nan=False),
        "ts": timestamps,
    },
)


def _pattern_of(word: str, draw: Any) -> str:
    chars = list(word)
    index = draw(st.integers(0, len(chars) - 1))
    chars[index] = draw(st.sampled_from(["?", "*", chars[index]]))
    if draw(st.booleans()):
        chars.append("*")
    return "".join(chars)


@st.composite
def leaves(draw: Any) -> SearchNode:
    kind = draw(st.sampled_from(
        ["term", "term", "phrase", "prefix", "wildcard", "regex", "range", "compare", "time",
         "exists"]
    ))
    field = draw(st.sampled_from(TEXT_FIELDS))
    # Queries spell words the way documents do (case, accents, decomposed marks), so analysis
    # differences between query and document sides are exercised.
    word = draw(st.sampled_from(WORDS + ["wire", "x y", "1500", "Reuters"]).flatmap(_spelled))
    if kind == "term":
        return SearchTerm(field, word)
    if kind == "phrase":
        return SearchPhrase(field, f"{word} {draw(st.sampled_from(WORDS))}")
    if kind == "prefix":
        return SearchPrefix(field, word[: draw(st.integers(1, max(1, len(word))))])
    if kind == "wildcard":
        return SearchWildcard(field, _pattern_of(word, draw))
    if kind == "regex":
        return SearchRegex(field, draw(st.sampled_from(
            ["ac.e", "layoffs?", "(merger|acme)", "[a-z]+", "caf.", ".*o.*", "z[e]ta", "ab+"]
        )))
    if kind == "range":
        low = draw(st.none() | st.integers(0, 2000))
        high = draw(st.none() | st.integers(0, 2000))
        return SearchRange(draw(st.sampled_from(["views", "score"])), low, high,
                           draw(st.booleans()), draw(st.booleans()))
    if kind == "compare":
        return SearchCompare("views", draw(st.sampled_from([">", ">=", "<", "<="])),
                             draw(st.integers(0, 2000)))
    if kind == "time":
        return SearchRange("ts", draw(st.sampled_from([None, "2021-01-01", 1_600_000_000])),
                           draw(st.sampled_from([None, "2023-01-01T00:00:00Z"])),
                           draw(st.booleans()), draw(st.booleans()))
    return SearchExists(draw(st.sampled_from(["title", "views", "tags", "missing"])))


queries = st.recursive(
    leaves(),
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=3).map(lambda cs: SearchAnd(tuple(cs))),
        st.lists(children, min_size=2, max_size=3).map(lambda cs: SearchOr(tuple(cs))),
        children.map(SearchNot),
    ),
    max_leaves=6,
)
