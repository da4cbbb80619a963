"""Shared by the Sigma tests and bench/sigma_corpus.py: where SigmaHQ's rules and regression
cases are, and one regression case run through the three commands users run."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from cep.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SIGMA_DATA = ROOT.parent / "shared" / "data" / "sigma"
RULES = SIGMA_DATA / "rules"
REGRESSION = SIGMA_DATA / "regression_data"


@dataclass(frozen=True)
class RegressionCase:
    """One SigmaHQ regression case: the rule that must fire and its event log (JSON)."""

    name: str
    rule: Path | None
    events: tuple[Path, ...]
    match_count: int | None


@lru_cache(maxsize=1)
def rules_by_id() -> dict[str, Path]:
    """Every rule file of the SigmaHQ copy by its ``id``."""
    found = {}
    for path in sorted(RULES.rglob("*.yml")):
        match = re.search(r"^id:\s*([0-9a-fA-F-]{36})", path.read_text(encoding="utf-8"), re.M)
        if match:
            found[match.group(1).lower()] = path
    return found


def regression_cases() -> list[RegressionCase]:
    """The regression cases, in path order."""
    cases = []
    for info_path in sorted(REGRESSION.rglob("info.yml")):
        info = yaml.safe_load(info_path.read_text(encoding="utf-8"))
        rule_id = str(info["rule_metadata"][0]["id"]).lower()
        tests = info.get("regression_tests_info") or [{}]
        cases.append(RegressionCase(
            name=str(info_path.parent.relative_to(REGRESSION)),
            rule=rules_by_id().get(rule_id),
            events=tuple(sorted(info_path.parent.glob("*.json"))),
            match_count=tests[0].get("match_count"),
        ))
    return cases


def vigil(*argv: str, stdout: Path) -> tuple[int, str]:
    """Run ``vigil ARGV > stdout`` in this process; the exit code and what went to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    stdout.write_text(out.getvalue(), encoding="utf-8")
    return code, err.getvalue()


def run_case(case: RegressionCase, workdir: Path) -> tuple[int, str]:
    """The matches of the case's rule, through exactly the commands of docs/import.md:
    ``vigil import sigma RULE.yml > r.vigil``, ``vigil convert evtx-json CASE.json >
    events.jsonl``, ``vigil run r.vigil --events events.jsonl --engine embedded --no-alerts``.

    Returns the number of rule matches and, when there is none, what the commands said.
    """
    if case.rule is None:
        return 0, "the rule is not in the rules copy"
    rules, events, out = workdir / "r.vigil", workdir / "events.jsonl", workdir / "out.jsonl"
    code, said = vigil("import", "sigma", str(case.rule), stdout=rules)
    if code != 0:
        return 0, f"import: {said.strip()}"
    code, said_convert = vigil("convert", "evtx-json", *map(str, case.events), stdout=events)
    if code != 0:
        return 0, f"convert: {said_convert.strip()}"
    code, said_run = vigil(
        "run", str(rules), "--events", str(events), "--engine", "embedded", "--no-alerts",
        stdout=out,
    )
    matches = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    found = sum(1 for m in matches if m.get("kind") == "rule")
    if code != 0 or not found:
        return found, f"run (exit {code}): {said_run.strip()}"
    return found, ""
