"""Mutated and random rule texts never raise anything but a VigilError."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from query_lang import VigilError, check_program, parse_expr, parse_search

FIXTURES = Path(__file__).parent.parent / "fixtures"
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
]


def _check_never_crashes(text: str) -> None:
    try:
        _, errors = check_program(text=STREAMS + "\n" + text, text_path="fuzz.vigil")
    except VigilError:
        return
    for err in errors:
        assert isinstance(err, VigilError)
        err.render()  # rendering must not fail either


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
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(mutated())
def test_mutated_snippets_only_raise_vigil_errors(text):
    _check_never_crashes(text)


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_token_soup_only_raises_vigil_errors(text):
    _check_never_crashes(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_only_raises_vigil_errors(text):
    _check_never_crashes(text)
    for parse_one in (parse_expr, parse_search):
        try:
            parse_one(text)
        except VigilError:
            pass
