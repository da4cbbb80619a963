"""Mutated and random rule texts never raise anything but a VigilError, and what ``check``
accepts the engine compiles: deep nesting and programs over the compile limits included.

``VIGIL_FUZZ_EXAMPLES`` raises the number of examples of every test (the defaults keep the
suite quick).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.engine import Engine
from query_lang import VigilError, check_program, parse_expr, parse_search
from query_lang.errors import VigilLimitError
from query_lang.limits import (
    MAX_DURATION_MS,
    MAX_NESTING_DEPTH,
    MAX_NUMBER_DIGITS,
    MAX_PATTERN_STEPS,
    MAX_PATTERN_VARIABLES,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
# Checked as if it stood next to streams.vigil, so its `list ... from` files are found.
FUZZ_PATH = str(FIXTURES / "fuzz.vigil")
SEED_TEXTS = (FIXTURES / "valid_snippets.vigil").read_text(encoding="utf-8").split("# ---\n")
STREAMS = (FIXTURES / "streams.vigil").read_text(encoding="utf-8")
TOKENS = [
    "rule", "query", "metric", "stream", "list", "webhook", "include", "from", "by", "pattern",
    "define", "as", "where", "within", "after", "match", "skip", "to", "past", "last", "first",
    "next", "no", "emit", "severity", "notify", "tags", "throttle", "window", "tumbling",
    "hopping", "sliding", "session", "gap", "every", "select", "having", "contiguity", "partials",
    "and", "or", "not", "in", "between", "is", "null", "matches", "AND", "OR", "NOT", "TO",
    "(", ")", "{", "}", "[", "]", ",", ".", ":", "!", "?", "*", "+", "-", "/", "%", "|", "=",
    "==", "!=", "<", ">=", "10m", "0s", "3", "1.5", "1e9", '"x"', "'y'", "/a+/", "/(/", "a", "b",
    "amount", "txn", "prev(amount)", "count(a)", "sum(a.amount)", "\n", " ", "#", "\\", '"',
    "\u00e9", "\u0000", "\t",
    # Past the limits: nesting, steps, digits, durations.
    "(" * (MAX_NESTING_DEPTH + 1), ")" * (MAX_NESTING_DEPTH + 1), "not " * MAX_NESTING_DEPTH,
    "NOT " * (MAX_NESTING_DEPTH + 1), "-" * (MAX_NESTING_DEPTH + 1), " + 1" * MAX_NESTING_DEPTH,
    f"{{{MAX_PATTERN_STEPS + 1}}}", "9" * (MAX_NUMBER_DIGITS + 1),
    f"{MAX_DURATION_MS // 86_400_000 + 1}d",
]


def _examples(default: int) -> int:
    return int(os.environ.get("VIGIL_FUZZ_EXAMPLES", default))


def _check_never_crashes(text: str) -> list[VigilError]:
    """Check ``text`` with the fixture streams: only VigilErrors, each renders; what passes,
    the engine registers (it compiles every rule, query and metric). The errors found."""
    try:
        program, errors = check_program(text=STREAMS + "\n" + text, text_path=FUZZ_PATH)
    except VigilError as err:
        return [err]
    for err in errors:
        assert isinstance(err, VigilError)
        err.render()  # rendering must not fail either
    if not errors:
        try:
            Engine().register(program.modules)
        except VigilError as err:
            raise AssertionError(f"check accepts what the engine refuses: {err}\n{text}") from err
    return errors


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(SEED_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        j = draw(st.integers(i, min(len(text), i + 12)))
        action = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        token = draw(st.sampled_from(TOKENS))
        if action == "delete":
            text = text[:i] + text[j:]
        elif action == "insert":
            text = text[:i] + token + text[i:]
        elif action == "replace":
            text = text[:i] + token + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


SETTINGS = settings(
    max_examples=_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(mutated())
def test_mutated_snippets_only_raise_vigil_errors(text):
    _check_never_crashes(text)


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_token_soup_only_raises_vigil_errors(text):
    _check_never_crashes(text)


@settings(max_examples=_examples(200), deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_only_raises_vigil_errors(text):
    _check_never_crashes(text)
    for parse_one in (parse_expr, parse_search):
        try:
            parse_one(text)
        except VigilError:
            pass


# ---------------------------------------------------------------- deep nesting and limits

# One construct that nests, as a function of its depth (text read with the fixture streams).
NESTINGS = {
    "pattern parentheses": lambda n: f"rule r from txn pattern {'(' * n}a{')' * n}",
    "pattern groups": lambda n: "rule r from txn pattern " + "(a (" * n + "b" + ")?)" * n,
    "pattern alternation": lambda n: "rule r from txn pattern " + "(a | b " * n + ")+" * n,
    "condition parentheses": lambda n: f"rule r from txn pattern a define a as {'(' * n}"
    f"amount > 1{')' * n}",
    "condition not": lambda n: f"rule r from txn pattern a define a as {'not ' * n}amount > 1",
    "condition minus": lambda n: f"rule r from txn pattern a define a as amount > {'-' * n}lat",
    "condition sum": lambda n: f"rule r from txn pattern a define a as amount > 1{' + 1' * n}",
    "condition calls": lambda n: f"rule r from txn pattern a define a as {'abs(' * n}amount"
    f"{')' * n} > 1",
    "condition and/or": lambda n: "rule r from txn pattern a define a as "
    + "(amount > 1 and (lat < 1 or " * n + "true" + "))" * n,
    "emit": lambda n: f"rule r from txn pattern a emit {'(' * n}a.amount{')' * n} as x",
    "metric where": lambda n: f"metric m from txn where {'(' * n}amount > 1{')' * n} "
    "window tumbling 1m select count() as c",
    "metric having": lambda n: "metric m from txn window tumbling 1m select count() as c "
    f"having {'not ' * n}c > 1",
    "query parentheses": lambda n: f"query q from news match {'(' * n}acme{')' * n}",
    "query NOT": lambda n: f"query q from news match {'NOT ' * n}acme",
    "query and/or": lambda n: "query q from news match " + "(acme AND (x OR " * n + "y"
    + "))" * n,
    "search()": lambda n: f'rule r from news pattern a define a as search(body, "{"(" * n}'
    f'acme{")" * n}")',
}
DEPTHS = st.one_of(
    st.integers(0, MAX_NESTING_DEPTH + 3),
    st.sampled_from([MAX_NESTING_DEPTH // 2, MAX_NESTING_DEPTH - 1, MAX_NESTING_DEPTH,
                     MAX_NESTING_DEPTH + 1, 2 * MAX_NESTING_DEPTH, 1_000, 20_000]),
)


@settings(max_examples=_examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(NESTINGS)), DEPTHS)
def test_deep_nesting_is_a_limit_error_or_compiles(construct, depth):
    """However deep: a VigilError (never a RecursionError), and past twice the limit a
    located error about nesting; what checks clean compiles."""
    text = NESTINGS[construct](depth)
    if construct in ("condition sum", "pattern alternation") and depth > 1_000:
        text = NESTINGS[construct](1_000)  # long flat texts only take longer to read
    errors = _check_never_crashes(text)
    if depth > 2 * MAX_NESTING_DEPTH or (depth > MAX_NESTING_DEPTH and "(" * depth in text):
        deep = [e for e in errors if isinstance(e, VigilLimitError)]
        assert deep and deep[0].limit == "MAX_NESTING_DEPTH" and deep[0].line > 0, errors


@st.composite
def over_a_limit(draw):
    """A rule near one of the compile limits, on either side of it."""
    near = draw(st.sampled_from(["variables", "steps", "nested steps", "alternatives",
                                 "optional repeats", "duration", "digits"]))
    delta = draw(st.integers(-2, 2))
    if near == "variables":
        count = MAX_PATTERN_VARIABLES + delta
        return "rule r from txn pattern " + " ".join(f"v{i}" for i in range(count))
    if near == "steps":
        big = draw(st.sampled_from([MAX_PATTERN_STEPS + delta, 10**30]))
        return f"rule r from txn pattern a{{{big}}}"
    if near == "nested steps":
        return f"rule r from txn pattern (a b{{2}}){{{MAX_PATTERN_STEPS // 3 + delta}}}"
    if near == "alternatives":
        half = MAX_PATTERN_STEPS // 2 + delta
        return "rule r from txn pattern (" + " | ".join(["a", "b"] * half) + ")"
    if near == "optional repeats":
        return f"rule r from txn pattern (a?){{{445 + delta}}} b"
    if near == "duration":
        days = MAX_DURATION_MS // 86_400_000 + delta
        clause = draw(st.sampled_from([f"rule r from txn pattern a b within {days}d",
                                       f"metric m from txn window tumbling {days}d select "
                                       "count() as c",
                                       f"rule r from txn pattern a b throttle {days}d"]))
        return clause
    digits = MAX_NUMBER_DIGITS + delta
    return f"rule r from txn pattern a define a as amount < {'9' * digits}"


@settings(max_examples=_examples(15), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(over_a_limit())
def test_near_a_limit_check_and_the_compiler_agree(text):
    errors = _check_never_crashes(text)
    assert all(isinstance(e, VigilLimitError) and e.line > 0 for e in errors), errors
