"""The percolator's output: match objects, deterministic ids, JSON shape, batches, ids."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from percolator_support import SCHEMA

from percolator import InvalidDocumentError, Percolator, QueryMatch, match_id
from query_lang import parse, parse_search


@pytest.fixture
def percolator() -> Percolator:
    percolator = Percolator(SCHEMA)
    module = parse(
        'query acme_news "ACME in the news"\n'
        "  from news\n"
        '  match title:("acme corp" OR acme) AND body:(layoff* OR merger)'
        " AND NOT source:tabloid AND views >= 1000\n"
    )
    percolator.add_declaration(module.declarations[0])
    percolator.add("zeta", parse_search("zeta"))
    return percolator


def test_match_emits_the_engine_output_shape(percolator):
    doc = {"id": "d1", "title": "Acme Corp cuts jobs", "body": "layoffs loom", "views": 2000,
           "source": "wire"}
    [found] = percolator.match(doc, stream="news", highlights=True)
    assert found == QueryMatch("acme_news", "d1", {"body": [[0, 7]], "title": [[0, 9]]},
                               match_id("acme_news", "d1"))
    assert json.loads(found.to_json()) == {
        "kind": "query",
        "name": "acme_news",
        "document_id": "d1",
        "match_id": match_id("acme_news", "d1"),
        "highlights": {"body": [[0, 7]], "title": [[0, 9]]},
    }
    assert list(found.to_dict()) == ["kind", "name", "document_id", "match_id", "highlights"]
    assert percolator.match(doc, stream="other") == []


def test_match_id_is_deterministic_across_processes():
    here = match_id("acme_news", "d1")
    code = "from percolator import match_id; print(match_id('acme_news', 'd1'))"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert here == there


def test_match_id_keeps_its_value():
    # Outputs, Spark sinks and the alert outbox deduplicate on these ids: a new value for the
    # same match would deliver it again. Hex xxh3-128 (seed 0) of "query\0name\0id" in UTF-8.
    assert match_id("acme_news", "d1") == "631a0cda153ae2e1f1b956d9039cc6ab"
    assert match_id("café", "é1") == "fdc3b2fbca92fab86b4d4a8c8d62290f"


_NAMES = st.text(st.characters(exclude_characters="\x00"), max_size=8)


@given(_NAMES, _NAMES, st.integers(0, 16))
def test_match_ids_are_32_hex_digits_and_tell_matches_apart(name, document, cut):
    first = match_id(name, document)
    assert re.fullmatch("[0-9a-f]{32}", first)
    assert match_id(name, document) == first
    # The same characters cut elsewhere between name and document id are another match: the
    # separator keeps "acme" + "_newsd1" apart from "acme_news" + "d1".
    joined = name + document
    cut = min(cut, len(joined))
    assume(cut != len(name))
    assert match_id(joined[:cut], joined[cut:]) != first


def test_document_ids(percolator):
    doc = {"title": "zeta"}
    with pytest.raises(InvalidDocumentError, match="no 'id' field; pass document_id"):
        percolator.match(doc)
    assert percolator.match(doc, document_id=42)[0].document_id == "42"
    result = percolator.match_batch([doc, {"id": "x", "title": "zeta"}, doc])
    assert [[m.document_id for m in found] for found in result.matches] == [["0"], ["x"], ["2"]]
    given = percolator.match_batch([doc, {"id": "x", "title": "zeta"}, doc],
                                   document_ids=[7, "e", None])
    assert [[m.document_id for m in found] for found in given.matches] == [["7"], ["e"], ["2"]]
    with pytest.raises(InvalidDocumentError, match="document 1 has no id: document_ids is short"):
        percolator.match_batch([doc, doc], document_ids=["a"])
    with pytest.raises(InvalidDocumentError, match="document_ids is longer than the batch"):
        percolator.match_batch([doc], document_ids=["a", "b"])
    custom = Percolator(SCHEMA, id_field="uuid")
    custom.add("z", parse_search("zeta"))
    assert custom.match({"uuid": "u-1", "title": "zeta"})[0].document_id == "u-1"


def test_batch_stats(percolator):
    result = percolator.match_batch([
        {"id": "1", "title": "zeta"},
        {"id": "2", "title": "acme", "body": "merger", "views": 5},
        {"id": "3", "title": "nothing"},
    ])
    stats = result.stats
    assert stats.documents == 3
    assert stats.candidates_per_doc == (1, 0, 0)  # views 5 fails the interval clause
    assert stats.verified == 1 and stats.matched == 1 and stats.always_run == 0
    assert stats.mean_candidates == pytest.approx(1 / 3)
    assert Percolator(SCHEMA).match_batch([]).stats.mean_candidates == 0.0


def test_a_batch_runs_with_the_cyclic_collector_paused(percolator):
    """A batch allocates term sets and matches by the thousand and no cycles: with the
    collector's first threshold at one allocation it would run thousands of times within the
    batch (7,298 here); paused, only the few allocations entering and leaving it count."""
    documents = [{"id": str(i), "title": f"zeta acme {i}", "body": "merger"} for i in range(200)]
    started = []

    def note(phase, info):
        if phase == "start":
            started.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1, *threshold[1:])
    gc.callbacks.append(note)
    try:
        result = percolator.match_batch(documents)
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
    assert len(started) < 20
    assert gc.isenabled()
    assert sum(map(len, result.matches)) == 200


def test_to_json_keeps_unicode_field_names():
    match = QueryMatch("q", "d", {"título": [[0, 1]]}, "id")
    assert '"título"' in match.to_json()


def test_highlights_only_when_a_run_or_the_query_asks_for_them(percolator):
    doc = {"id": "d1", "title": "zeta and Acme Corp", "body": "merger", "views": 5000}
    plain = percolator.match_batch([doc]).matches[0]
    assert [(m.name, m.highlights) for m in plain] == [("acme_news", None), ("zeta", None)]
    assert "highlights" not in plain[0].to_dict()
    asked = percolator.match_batch([doc], highlights=True).matches[0]
    assert [m.highlights for m in asked] == [
        {"body": [[0, 6]], "title": [[9, 18]]}, {"title": [[0, 4]]},
    ]
    # A query registered with highlights gets them in every run; the others do not.
    percolator.replace("zeta", parse_search("zeta"), highlights=True)
    assert [m.highlights for m in percolator.match(doc)] == [None, {"title": [[0, 4]]}]
    # A percolator whose runs ask for them by default; a run may still decline.
    eager = Percolator(SCHEMA, highlights=True)
    eager.add("zeta", parse_search("zeta"))
    assert eager.match(doc)[0].highlights == {"title": [[0, 4]]}
    assert eager.match(doc, highlights=False)[0].highlights is None
