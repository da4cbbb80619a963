"""A large sealed segment keeps both layouts of its postings, serves documents from each in turn,
then keeps the one that spent less time per document: the answers never depend on which."""

from __future__ import annotations

import random

import pytest
from percolator_support import SCHEMA, WORDS, baseline, outcome

from percolator import IndexedPresearcher, Percolator, indexed_presearcher
from percolator.layout_trial import FLAT, POSTINGS, LayoutTrial
from query_lang import parse_search

QUERIES = [
    f"title:{a} AND {b}" for a, b in zip(WORDS, WORDS[1:] + WORDS[:1], strict=True)
] + [f"{w} AND views:[10 TO 500]" for w in WORDS[:4]] + [f"title:{WORDS[0][:3]}* AND {WORDS[2]}"]


def _standing() -> list:
    return [(f"q{i}", parse_search(text)) for i, text in enumerate(QUERIES)]


def _documents(count: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": str(i), "title": " ".join(rng.sample(WORDS, 3)),
         "body": " ".join(rng.sample(WORDS, 4)), "views": rng.randrange(0, 1000)}
        for i in range(count)
    ]


def _segment(percolator: Percolator):
    (sealed,) = percolator.index._sealed
    return sealed.segment


@pytest.mark.parametrize("slow", [FLAT, POSTINGS])
def test_the_layout_that_spends_less_time_per_document_is_kept(monkeypatch, slow):
    now = [0.0]
    monkeypatch.setattr(
        indexed_presearcher, "LayoutTrial",
        lambda: LayoutTrial(warm=3, trial=8, clock=lambda: now[0]),
    )
    segment_class = indexed_presearcher.IndexedSegment
    flat, posted = segment_class._flat, segment_class._posted

    def timed_flat(self, columnar, docs):
        now[0] += (10.0 if slow == FLAT else 1.0) * len(docs)
        return flat(self, columnar, docs)

    def timed_posted(self, doc):
        now[0] += 10.0 if slow == POSTINGS else 1.0
        return posted(self, doc)

    monkeypatch.setattr(segment_class, "_flat", timed_flat)
    monkeypatch.setattr(segment_class, "_posted", timed_posted)
    standing = _standing()
    percolator = Percolator(SCHEMA, IndexedPresearcher(columnar_threshold=1))
    percolator.add_many((name, query, ()) for name, query in standing)
    reference = baseline(standing)
    segment = _segment(percolator)
    assert segment.layout == "trial" and percolator.stats().columnar == 1
    assert percolator.stats().trials == 1
    docs = _documents(60)
    # Single documents and batches of three: each call is one turn of one layout.
    for doc in docs[:6]:
        assert [m.name for m in percolator.match(doc)] == [
            m.name for m in reference.match(doc)]
    for start in range(6, 24, 3):
        batch = docs[start:start + 3]
        assert outcome(percolator, batch) == outcome(reference, batch)
    kept = POSTINGS if slow == FLAT else FLAT
    assert segment.layout == kept
    assert percolator.stats().columnar == (1 if kept == FLAT else 0)
    assert percolator.stats().trials == 0
    if kept == FLAT:
        assert segment._term_keys == {} and segment._known == {}
    assert outcome(percolator, docs) == outcome(reference, docs)


def test_the_trial_ends_on_real_time_and_answers_stay_those_of_every_query():
    standing = _standing()
    percolator = Percolator(SCHEMA, IndexedPresearcher(columnar_threshold=1))
    percolator.add_many((name, query, ()) for name, query in standing)
    reference = baseline(standing)
    segment = _segment(percolator)
    docs = _documents(2 * (LayoutTrial().warm + LayoutTrial().trial) + 64, seed=11)
    seen = set()
    for start in range(0, len(docs), 32):
        seen.add(segment.layout)
        batch = docs[start:start + 32]
        assert outcome(percolator, batch) == outcome(reference, batch)
    assert seen >= {"trial"}
    assert segment.layout in ("flat", "postings") and percolator.stats().trials == 0


def test_without_the_trial_the_flat_arrays_serve_alone():
    percolator = Percolator(
        SCHEMA, IndexedPresearcher(columnar_threshold=1, choose_layout=False))
    percolator.add_many((name, query, ()) for name, query in _standing())
    segment = _segment(percolator)
    assert segment.layout == "flat" and segment._term_keys == {}
    assert percolator.stats().trials == 0
    below = Percolator(SCHEMA, IndexedPresearcher(columnar_threshold=len(QUERIES) + 1))
    below.add_many((name, query, ()) for name, query in _standing())
    assert _segment(below).layout == "postings"


def test_trial_counts_only_documents_past_the_warm_up():
    trial = LayoutTrial(warm=4, trial=4, clock=lambda: 0.0)
    assert [trial.next_layout() for _ in range(4)] == [FLAT, POSTINGS, FLAT, POSTINGS]
    # Six documents in one call, four of them warm-up: a third of its time counts.
    trial.record(FLAT, 6, 0.0, 6.0)
    trial.record(POSTINGS, 6, 0.0, 3.0)
    assert trial.per_document() == {FLAT: 1.0, POSTINGS: 0.5}
    assert trial.winner is None
    trial.record(FLAT, 2, 0.0, 0.2)
    trial.record(POSTINGS, 2, 0.0, 4.0)
    # flat: (2 + 0.2) / 4 documents; postings: (1 + 4) / 4.
    assert trial.winner == FLAT
    assert trial.next_layout() == FLAT
