"""SigmaHQ's rules and regression cases through `vigil import sigma`: the figures of
docs/import.md.

The corpus check imports every rule under ``../shared/data/sigma/rules`` (one call, as
``vigil import sigma rules/`` does), checks the output file as ``vigil check`` does, and tables
the reasons of the rules not imported. The regression check runs every SigmaHQ regression case
through the three commands users run (``tests/query_lang/sigma_support.py``)::

    .venv/bin/python bench/sigma_corpus.py [--skip-regression] [--markdown PATH]

It takes a few minutes; CI runs a sample of the regression cases instead
(``tests/query_lang/test_sigma_regression.py``).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "query_lang"))

from sigma_support import RULES, regression_cases, run_case  # noqa: E402

from cep.cli.sigma_import import _validate  # noqa: E402
from query_lang.imports.sigma import import_sigma  # noqa: E402

# Reasons of refusal, by what the error says: (label, whether the importer claims the feature).
REASONS = (
    (r"keyword search", "keyword search (value without a field) on a stream with no "
     "`keywords` field in the mapping", False),
    (r"not RE2 syntax", "regular expression outside RE2 (look-around, back-references)", True),
    (r"numeric comparison", "numeric comparison on a field the mapping does not type", False),
    (r"placeholder", "|expand placeholder without values in the mapping", False),
    (r"time-part modifier", "time-part modifier (|minute, |hour ...)", False),
    (r"correlation", "correlation type or form not supported", False),
    (r"not a valid Sigma rule|not a Sigma rule", "not a valid Sigma rule (pySigma refuses it)",
     False),
    (r"Vigil refuses", "translation refused by `vigil check`", True),
)


def reason_of(message: str) -> tuple[str, bool]:
    for pattern, label, claimed in REASONS:
        if re.search(pattern, message):
            return label, claimed
    return "other: " + message[:80], True


def corpus(lines: list[str]) -> None:
    rules = sorted(p for p in RULES.rglob("*") if p.suffix in (".yml", ".yaml"))
    start = time.perf_counter()
    result = import_sigma([str(RULES)], validate=_validate)
    seconds = time.perf_counter() - start
    problems = _validate(result.text)
    reasons = Counter(reason_of(e.message) for e in result.errors)
    unclaimed = sum(n for (_, claimed), n in reasons.items() if not claimed)
    claimed_total = len(rules) - unclaimed
    imported_files = len({b.origin for b in result.blocks})
    lines += [
        f"SigmaHQ rules: {len(rules)} files; imported {imported_files} "
        f"({100 * imported_files / len(rules):.1f}%) as {result.imported} declarations in "
        f"{seconds:.0f} s; the output file checks "
        f"{'clean' if not problems else f'with {len(problems)} error(s)'}.",
        f"Rules whose features the importer claims: {claimed_total}; imported "
        f"{imported_files} ({100 * imported_files / max(claimed_total, 1):.1f}%).",
        "",
        "| reason a rule is not imported | rules | feature claimed |",
        "|---|---:|---|",
    ]
    for (label, claimed), count in reasons.most_common():
        lines.append(f"| {label} | {count} | {'yes' if claimed else 'no'} |")
    for error in result.errors:
        if reason_of(error.message)[1]:
            lines.append(f"<!-- {error.location()}: {error.message} -->")


def regression(lines: list[str]) -> None:
    cases = regression_cases()
    start = time.perf_counter()
    failed, counts = [], []
    for case in cases:
        with tempfile.TemporaryDirectory() as folder:
            found, said = run_case(case, Path(folder))
        if not found:
            failed.append((case.name, said))
        elif case.match_count is not None and found != case.match_count:
            counts.append((case.name, found, case.match_count))
    seconds = time.perf_counter() - start
    lines += [
        "",
        f"Regression cases: {len(cases) - len(failed)} of {len(cases)} fire "
        f"({seconds:.0f} s for all).",
    ]
    for name, said in failed:
        lines.append(f"- FAILS {name}: {said[:300]}")
    for name, found, expected in counts:
        lines.append(f"- {name}: {found} matches where info.yml says {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-regression", action="store_true")
    parser.add_argument("--markdown", help="also write the report to this file")
    args = parser.parse_args(argv)
    lines: list[str] = []
    corpus(lines)
    if not args.skip_regression:
        regression(lines)
    report = "\n".join(lines) + "\n"
    sys.stdout.write(report)
    if args.markdown:
        Path(args.markdown).write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
