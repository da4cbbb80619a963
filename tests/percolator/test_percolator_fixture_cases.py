"""Data-driven cases from tests/fixtures/percolator_cases.txt: each gives a query, a document,
whether it matches and whether the indexed presearcher runs the query for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from percolator_support import SCHEMA

from percolator import IndexedPresearcher, NoFilterPresearcher, Percolator, Schema
from query_lang import parse_search

CASES_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "percolator_cases.txt"
KEYS = {"case", "schema", "query", "doc", "match", "candidate", "highlights"}


def load_cases() -> list[dict[str, str]]:
    cases = []
    for number, block in enumerate(CASES_FILE.read_text(encoding="utf-8").split("\n\n")):
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
        if not lines:
            continue
        case: dict[str, str] = {}
        for line in lines:
            key, sep, value = line.partition(":")
            if not sep or key not in KEYS:
                raise ValueError(f"{CASES_FILE.name} block {number}: bad line {line!r}")
            case[key] = value.strip()
        missing = {"case", "query", "doc", "match", "candidate"} - case.keys()
        if missing:
            raise ValueError(f"{CASES_FILE.name} block {number}: missing {sorted(missing)}")
        cases.append(case)
    return cases


CASES = load_cases()


def test_fixture_file_holds_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_case(case):
    schema = Schema.of(json.loads(case["schema"])) if "schema" in case else SCHEMA
    query = parse_search(case["query"])
    doc = json.loads(case["doc"])
    expect_match = case["match"] == "yes"
    results = {}
    for presearcher in (NoFilterPresearcher(), IndexedPresearcher()):
        percolator = Percolator(schema, presearcher)
        percolator.add("q", query)
        results[presearcher.name] = percolator.match_batch([doc], highlights=True)
    baseline, indexed = results["no-filter"], results["indexed"]
    assert baseline.matches == indexed.matches
    assert baseline.stats.verified == 1
    assert indexed.stats.verified == (1 if case["candidate"] == "yes" else 0)
    found = indexed.matches[0]
    assert bool(found) is expect_match
    if "highlights" in case:
        assert found[0].highlights == json.loads(case["highlights"])
