"""``vigil check`` refuses exactly what ``vigil run`` and ``vigil explain`` refuse.

For every compile limit of :mod:`query_lang.limits`: a program just under it checks clean and
runs in the embedded engine; one just over it fails ``check`` with the limit named and located,
and ``run`` and ``explain`` fail with the same clean message and exit code, never a traceback.
Deep nesting is an error at the parenthesis that goes too deep, however deep, at once.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from cep.cli import main
from cep.cli.arguments import EXIT_ERRORS, EXIT_OK
from query_lang import VigilError, check_program, parse_expr, parse_search
from query_lang.errors import VigilLimitError
from query_lang.limits import (
    MAX_DURATION_MS,
    MAX_INCLUDE_DEPTH,
    MAX_NESTING_DEPTH,
    MAX_NUMBER_DIGITS,
    MAX_PATTERN_STEPS,
    MAX_PATTERN_TRANSITIONS,
    MAX_PATTERN_VARIABLES,
    pattern_transitions,
)
from query_lang.parser import parse

STREAM = "stream s (k string, n float, body string, ts timestamp) time ts\n"
EVENTS = [
    {"k": "a", "n": 1.0, "body": "hello world", "ts": "2026-01-01T00:00:00Z"},
    {"k": "a", "n": 2.0, "body": "x", "ts": "2026-01-01T00:00:01Z"},
]
DAYS = MAX_DURATION_MS // 86_400_000


def _optional_repeats() -> int:
    """The largest n for which ``(a?){n} b`` is within the limit on transitions."""
    n = 1
    while pattern_transitions(parse(f"rule r from s pattern (a?){{{n + 1}}} b")
                              .declarations[0].pattern) <= MAX_PATTERN_TRANSITIONS:
        n += 1
    return n


N_OPTIONAL = _optional_repeats()


def _variables(count: int) -> str:
    return " ".join(f"v{i}" for i in range(count))


def _nested_not(depth: int) -> str:
    """``depth`` levels: ``not`` depth - 1 times, around a comparison (a level too)."""
    return "not " * (depth - 1) + "n > 1"


# name -> (the limit, rule text at the limit, rule text one past it, where the error points)
CASES = {
    "pattern variables": (
        "MAX_PATTERN_VARIABLES",
        f"rule r from s by k pattern {_variables(MAX_PATTERN_VARIABLES)}",
        f"rule r from s by k pattern {_variables(MAX_PATTERN_VARIABLES + 1)}",
        f"v{MAX_PATTERN_VARIABLES}",
    ),
    "pattern steps": (
        "MAX_PATTERN_STEPS",
        f"rule r from s by k pattern a{{{MAX_PATTERN_STEPS}}}",
        f"rule r from s by k pattern b a{{{MAX_PATTERN_STEPS}}}",
        "b a{",  # no one part is over the limit: the error is at the whole pattern
    ),
    "alternatives": (
        "MAX_PATTERN_STEPS",
        "rule r from s by k pattern (" + " | ".join(["a", "b"] * (MAX_PATTERN_STEPS // 2)) + ")",
        "rule r from s by k pattern (" + " | ".join(["a", "b"] * (MAX_PATTERN_STEPS // 2 + 1))
        + ")",
        "a | b",
    ),
    "pattern transitions": (
        "MAX_PATTERN_TRANSITIONS",
        f"rule r from s by k pattern (a?){{{N_OPTIONAL}}} b",
        f"rule r from s by k pattern (a?){{{N_OPTIONAL + 1}}} b",
        "(a?)",
    ),
    "nesting: prefix operators": (
        "MAX_NESTING_DEPTH",
        f"rule r from s by k pattern a define a as {_nested_not(MAX_NESTING_DEPTH)}",
        f"rule r from s by k pattern a define a as {_nested_not(MAX_NESTING_DEPTH + 1)}",
        "n > 1",
    ),
    "nesting: parentheses": (
        "MAX_NESTING_DEPTH",
        "rule r from s by k pattern " + "(" * MAX_NESTING_DEPTH + "a" + ")" * MAX_NESTING_DEPTH,
        "rule r from s by k pattern " + "(" * (MAX_NESTING_DEPTH + 1) + "a"
        + ")" * (MAX_NESTING_DEPTH + 1),
        "(a)",
    ),
    "nesting: a long sum": (
        "MAX_NESTING_DEPTH",
        "rule r from s by k pattern a define a as n < 0" + " + 1" * (MAX_NESTING_DEPTH - 1),
        "rule r from s by k pattern a define a as n < 0" + " + 1" * (MAX_NESTING_DEPTH + 5),
        "0 + 1",
    ),
    "duration": (
        "MAX_DURATION_MS",
        f"rule r from s by k pattern a b within {DAYS}d",
        f"rule r from s by k pattern a b within {DAYS + 1}d",
        f"{DAYS + 1}d",
    ),
    "metric window": (
        "MAX_DURATION_MS",
        f"metric m from s by k window tumbling {DAYS}d select count() as c",
        f"metric m from s by k window tumbling {DAYS + 1}d select count() as c",
        f"{DAYS + 1}d",
    ),
    "number digits": (
        "MAX_NUMBER_DIGITS",
        "rule r from s by k pattern a define a as n < " + "9" * MAX_NUMBER_DIGITS,
        "rule r from s by k pattern a define a as n < " + "9" * (MAX_NUMBER_DIGITS + 1),
        "9" * 20,
    ),
}


def _write(tmp_path, text: str, name: str = "rules.vigil"):
    path = tmp_path / name
    path.write_text(STREAM + text + "\n")
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    return path, events


def _run(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _location(rules, text: str, needle: str) -> str:
    """``path:line:col`` of the first ``needle`` in the rule text (the second line)."""
    return f"{rules}:2:{text.index(needle) + 1}"


@pytest.mark.parametrize("case", CASES)
def test_at_the_limit_a_program_checks_and_runs(case, tmp_path, capsys) -> None:
    _, under, _, _ = CASES[case]
    rules, events = _write(tmp_path, under)
    assert _run(["check", str(rules)], capsys)[0] == EXIT_OK
    code, err = _run(
        ["run", str(rules), "--engine", "embedded", "--events", str(events), "--out",
         str(tmp_path / "out.jsonl")],
        capsys,
    )
    assert code == EXIT_OK, err
    assert "2 event(s)" in err
    if under.startswith("rule"):
        assert _run(["explain", str(rules), "--rule", "r"], capsys)[0] == EXIT_OK


@pytest.mark.parametrize("case", CASES)
def test_past_the_limit_check_run_and_explain_refuse_it_alike(case, tmp_path, capsys) -> None:
    limit, _, over, needle = CASES[case]
    rules, events = _write(tmp_path, over)
    _, errors = check_program([str(rules)])
    assert [type(e) for e in errors] == [VigilLimitError]
    assert errors[0].limit == limit
    located = f"{_location(rules, over, needle)}: error: "
    code, err = _run(["check", str(rules)], capsys)
    assert code == EXIT_ERRORS
    assert err.startswith(located), err[:300]
    message = err.splitlines()[0].removeprefix(located)
    words = {
        "MAX_PATTERN_VARIABLES": "(pattern variables)",
        "MAX_PATTERN_STEPS": "(pattern steps)",
        "MAX_PATTERN_TRANSITIONS": "(pattern transitions)",
        "MAX_NESTING_DEPTH": "(nesting depth)",
        "MAX_DURATION_MS": "(100 years)",
        "MAX_NUMBER_DIGITS": "(number digits)",
    }[limit]
    assert words in message
    for args in (
        ["run", str(rules), "--engine", "embedded", "--events", str(events)],
        ["explain", str(rules), "--rule", "r"],
    ):
        code, err = _run(args, capsys)
        assert code == EXIT_ERRORS
        assert err.splitlines()[0] == f"{located}{message}"


def test_the_engine_refuses_what_check_refuses_with_the_same_message() -> None:
    from cep.engine import Engine

    for case, (_, _, over, _) in CASES.items():
        _, errors = check_program(text=STREAM + over)
        with pytest.raises(VigilError) as caught:
            Engine().register(STREAM + over)
        assert caught.value.message == errors[0].message, case


def _include_chain(directory, files: int):
    """``f0.vigil`` includes ``f1.vigil`` ... up to the last, which declares the rule."""
    directory.mkdir()
    for i in range(files):
        last = i == files - 1
        body = STREAM + "rule r from s pattern a\n" if last else f'include "f{i + 1}.vigil"\n'
        (directory / f"f{i}.vigil").write_text(body)
    return directory / "f0.vigil"


def test_include_chains_are_held_to_their_limit(tmp_path, capsys) -> None:
    ok = _include_chain(tmp_path / "ok", MAX_INCLUDE_DEPTH)
    assert _run(["check", str(ok)], capsys)[0] == EXIT_OK
    over = _include_chain(tmp_path / "over", MAX_INCLUDE_DEPTH + 1)
    code, err = _run(["check", str(over)], capsys)
    assert code == EXIT_ERRORS
    last = tmp_path / "over" / f"f{MAX_INCLUDE_DEPTH - 1}.vigil"
    assert err.startswith(f"{last}:1:1: error: cannot include ")
    assert "(include depth)" in err


# ---------------------------------------------------------------- deep nesting

DEEP = {
    "pattern": lambda n: "rule r from s by k pattern " + "(" * n + "a" + ")" * n,
    "where": lambda n: (
        "metric m from s by k where " + "(" * n + "n > 1" + ")" * n
        + " window tumbling 1m select count() as c"
    ),
    "condition": lambda n: "rule r from s by k pattern a define a as " + "(" * n + "n > 1"
    + ")" * n,
    "search query": lambda n: "query q from s match " + "(" * n + "hello" + ")" * n,
    "search()": lambda n: 'rule r from s by k pattern a define a as search(body, "'
    + "(" * n + "hello" + ")" * n + '")',
    "search NOT": lambda n: "query q from s match " + "NOT " * n + "hello",
}


@pytest.mark.parametrize("depth", [200, 1_000, 100_000])
@pytest.mark.parametrize("where", DEEP)
def test_deep_nesting_is_a_located_error_at_once(where, depth, tmp_path) -> None:
    text = DEEP[where](depth)
    rules = tmp_path / "deep.vigil"
    rules.write_text(STREAM + text + "\n")
    started = time.perf_counter()
    _, errors = check_program([str(rules)])
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5, elapsed
    [error] = errors
    assert isinstance(error, VigilLimitError) and error.limit == "MAX_NESTING_DEPTH"
    # At the parenthesis (or NOT) that goes one level too deep.
    opening = "(" if "(" * 2 in text else "NOT "
    column = text.index(opening * 2) + MAX_NESTING_DEPTH * len(opening) + 1
    if where == "search()":
        column = text.index('"(') + 1 + MAX_NESTING_DEPTH + 1
    assert (error.file, error.line, error.column) == (str(rules), 2, column)
    rendered = error.render()
    assert "(nesting depth)" in rendered and len(rendered) < 1_000  # the line is cut to fit


def test_deep_nesting_in_an_included_file_is_located_in_that_file(tmp_path, capsys) -> None:
    (tmp_path / "deep.vigil").write_text(STREAM + DEEP["condition"](5_000) + "\n")
    main_file = tmp_path / "main.vigil"
    main_file.write_text('include "deep.vigil"\n')
    code, err = _run(["check", str(main_file)], capsys)
    assert code == EXIT_ERRORS
    assert err.startswith(f"{tmp_path / 'deep.vigil'}:2:")
    code, err = _run(["explain", str(main_file), "--rule", "r"], capsys)
    assert code == EXIT_ERRORS and "(nesting depth)" in err
    code, err = _run(["format", str(tmp_path / "deep.vigil")], capsys)
    assert code == EXIT_ERRORS and "(nesting depth)" in err


@pytest.mark.parametrize(
    "text",
    [
        "(" * 5_000 + "x" + ")" * 5_000,
        "not " * 5_000 + "x",
        "-" * 5_000 + "x",
        "x" + " + 1" * 2_000,
        "abs(" * 2_000 + "x" + ")" * 2_000,
        'search(body, "' + "(" * 5_000 + "x" + ")" * 5_000 + '")',
    ],
)
def test_parse_expr_refuses_deep_expressions(text) -> None:
    with pytest.raises(VigilLimitError, match=re.escape("(nesting depth)")):
        parse_expr(text)


@pytest.mark.parametrize("text", ["(" * 5_000 + "x" + ")" * 5_000, "NOT " * 5_000 + "x",
                                  "!" * 5_000 + "x", "x AND (y OR " * 500 + "z" + ")" * 500])
def test_parse_search_refuses_deep_queries(text) -> None:
    with pytest.raises(VigilLimitError, match=re.escape("(nesting depth)")):
        parse_search(text)


def test_at_the_nesting_limit_everything_that_walks_the_tree_copes(tmp_path, capsys) -> None:
    """Trees exactly at the limit, of every shape that nests, go through every path."""
    d = MAX_NESTING_DEPTH
    calls = "abs(" * (d - 1) + "n" + ")" * (d - 1)
    rules, events = _write(tmp_path, "\n".join([
        f"rule r1 from s by k pattern a define a as {calls} > 1",
        "rule r2 from s by k pattern " + "(a (" * (d // 2 - 1) + "b" + ")?)" * (d // 2 - 1),
        f"rule r3 from s by k pattern a define a as n > {'-' * (d - 2)}n",
        "query q from s match " + "(hello AND (x OR " * (d // 2) + "y" + "))" * (d // 2),
        "metric m from s by k where " + "(n > 1 and (n < 1 or " * (d // 2 - 1) + "true"
        + "))" * (d // 2 - 1) + " window tumbling 1m select count() as c",
    ]))
    assert _run(["check", str(rules)], capsys)[0] == EXIT_OK
    assert _run(["format", str(rules)], capsys)[0] == EXIT_OK
    for rule in ("r1", "r2", "r3"):
        assert _run(["explain", str(rules), "--rule", rule], capsys)[0] == EXIT_OK
    code, err = _run(["run", str(rules), "--engine", "embedded", "--events", str(events),
                      "--out", str(tmp_path / "out.jsonl")], capsys)
    assert code == EXIT_OK, err


# ---------------------------------------------------------------- other check/run mismatches

MISMATCHES = {
    "skip to a negated variable": (
        "rule r from s by k pattern a !x b within 1h define x as n > 5 after match skip to "
        "first x",
        "skip to",
    ),
    "a trailing absence that only optional steps follow": (
        "rule r from s by k pattern a !x b*", "!x",
    ),
    "a rule partitioned by a list": ("rule r from s2 by tags pattern a", "tags"),
    "a step keyed by a list": (
        "rule r from s2 by k pattern a b define a as n > 1 by tags, b as n > 2 by tags",
        "a as",
    ),
    "a metric grouped by a list": (
        "metric m from s2 by tags window tumbling 1m select count() as c", "tags",
    ),
    "a metric grouped by a text": (
        "metric m from s2 by doc window tumbling 1m select count() as c", "doc",
    ),
    "a stream without event time": (
        "stream plain (k string)\nquery q from plain match hello", "plain match",
    ),
    "a missing list file": ('list gone from "nowhere.txt"\nrule r from s pattern a', "list"),
}


S2 = "stream s2 (k string, n float, tags list<string>, doc text, ts timestamp) time ts\n"


@pytest.mark.parametrize("case", MISMATCHES)
def test_check_reports_what_run_refuses(case, tmp_path, capsys) -> None:
    text, needle = MISMATCHES[case]
    text = S2 + text
    rules, events = _write(tmp_path, text)
    line, at = next(
        (number, row.index(needle) + 1)
        for number, row in enumerate((STREAM + text).splitlines(), start=1)
        if number > 2 and needle in row
    )
    located = f"{rules}:{line}:{at}: error: "
    code, err = _run(["check", str(rules)], capsys)
    assert code == EXIT_ERRORS and err.startswith(located), err
    code, err = _run(["run", str(rules), "--engine", "embedded", "--events", str(events)], capsys)
    assert code == EXIT_ERRORS and err.startswith(located), err
