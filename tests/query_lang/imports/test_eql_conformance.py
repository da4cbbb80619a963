"""The ``eql`` package's own suite through ``vigil import eql`` and the embedded engine: every
case the importer accepts returns exactly the expected events (eql_suite.py says how)."""

from __future__ import annotations

import pytest
from eql_suite import run_suite

# What the importer reaches today; a change that accepts less fails here.
ACCEPTED_AT_LEAST = {"event": 152, "sequence": 30}
PIPES_APPLIED_AT_LEAST = {"event": 11, "sequence": 13}


@pytest.fixture(scope="module")
def report():
    return run_suite()


def test_every_accepted_case_returns_the_expected_events(report):
    failures = [o for o in report.outcomes if o.accepted and not o.passed]
    assert not failures, "\n\n".join(f"#{o.index} {o.query.strip()}\n{o.detail}"
                                      for o in failures)


def test_head_and_tail_applied_to_vigil_matches_give_the_expected_events(report):
    failures = [o for o in report.outcomes if o.pipes_applied and not o.passed]
    assert not failures, "\n\n".join(f"#{o.index} {o.query.strip()}\n{o.detail}"
                                      for o in failures)


@pytest.mark.parametrize("kind", sorted(ACCEPTED_AT_LEAST))
def test_accepted_cases_do_not_drop(report, kind):
    assert report.count(kind, accepted=True) >= ACCEPTED_AT_LEAST[kind]
    assert report.count(kind, pipes_applied=True, passed=True) >= PIPES_APPLIED_AT_LEAST[kind]


def test_every_refusal_names_its_construct(report):
    assert all(o.reason for o in report.outcomes if not o.accepted)
    assert len(report.outcomes) == 241
