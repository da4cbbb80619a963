"""SigmaHQ's regression cases end to end, through exactly the commands users run:
``vigil import sigma RULE.yml > r.vigil``, ``vigil convert evtx-json CASE.json >
events.jsonl``, ``vigil run r.vigil --events events.jsonl --engine embedded --no-alerts``.

All 98 run (about 30 s in one process, 50 s on a loaded machine); ``VIGIL_SIGMA_REGRESSION=
sample`` runs every sixth case for a quick local check.
"""

from __future__ import annotations

import os

import pytest
from sigma_support import REGRESSION, regression_cases, run_case

EXPECTED_CASES = 98

if not REGRESSION.is_dir():  # pragma: no cover - the shared data is beside the repository
    pytest.skip(f"no SigmaHQ regression data at {REGRESSION}", allow_module_level=True)

CASES = regression_cases()
SAMPLE = CASES[::6] if os.environ.get("VIGIL_SIGMA_REGRESSION") == "sample" else CASES


def test_every_case_is_there():
    assert len(CASES) == EXPECTED_CASES
    assert all(case.rule is not None and case.events for case in CASES)


@pytest.mark.parametrize("case", SAMPLE, ids=[c.name.rsplit("/", 1)[-1] for c in SAMPLE])
def test_regression_case_fires(tmp_path, case):
    found, said = run_case(case, tmp_path)
    assert found >= 1, said
