"""The text functions ``index_of``, ``substring``, ``between``, ``concat``, the list functions
``item``, ``length``, ``lower``/``upper`` over lists, and the conditions over a list's elements
``any(v in xs: ...)``, ``count(v in xs: ...)``: their values on one event and on a column (which
must agree), their null handling, and the checks' errors for misuse."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from query_lang import check_program, parse_expr
from query_lang.ast import print_expr
from query_lang.compiler import compile_columns, compile_expr, referenced_fields

STREAM = "stream e (s string, t string, n int, x float, b bool, xs list<string>, ts timestamp) "\
         "time ts\n"
EVENT = {"s": "System Idle Process", "t": "explorer.exe", "n": 2, "x": 1.5, "b": True,
         "xs": ["en-US", "en"], "ts": 0}


def values(text: str, event: dict[str, Any]) -> Any:
    """The value of ``text`` on ``event``, row by row and column-wise (asserted equal)."""
    expr = parse_expr(text)
    row = compile_expr(expr)(event)
    frame = pd.DataFrame({name: pd.Series([value] * 2, dtype=object)
                          for name, value in event.items()})
    column = compile_columns(expr)(frame).tolist()
    assert column == [row, row], (text, row, column)
    return row


def check_errors(condition: str) -> list[str]:
    rule = f"rule r from e pattern a define a as {condition}\n"
    _, errors = check_program(text=STREAM + rule, text_path="f.vigil")
    return [e.message for e in errors]


@pytest.mark.parametrize(("text", "expected"), [
    ('index_of(t, "plore")', 2),
    ('index_of(t, "e")', 0),
    ('index_of(t, "e", 1)', 6),
    ('index_of(t, "e", n)', 6),
    ('index_of(t, "e", -3)', 9),  # a negative start counts from the end
    ('index_of(t, "plore", 100)', None),
    ('index_of(t, ".pf")', None),  # not found: null, never -1
    ('index_of(t, "E")', None),  # exact; lower() both sides to ignore case
    ('index_of(lower(s), lower("IDLE"))', 7),
    ('substring(t, 0, 4)', "expl"),
    ('substring(t, 1, 3)', "xp"),
    ('substring(t, -4)', ".exe"),
    ('substring(t, -4, -1)', ".ex"),
    ('substring(t, 50)', ""),
    ('substring(t, n)', "plorer.exe"),
    ('between(s, "s", "e")', "t"),
    ('between(s, "s", "e", true)', "tem Idle Proc"),
    ('between(s, "s", "e", false, true)', "yst"),  # markers found ignoring case
    ('between(s, "S", "E", true, true)', "ystem Idle Proc"),  # the text as written
    ('between(s, "s", "z")', None),
    ('between(s, "q", "e")', None),
    ('between(s, "s", "e", b)', "tem Idle Proc"),
    ('concat(n, ":", t, 3)', "2:explorer.exe3"),
    ('concat(t)', "explorer.exe"),
    ('concat(x, b, false)', "1.5truefalse"),
    ('item(xs, 0)', "en-US"),
    ('item(xs, 1)', "en"),
    ('item(xs, -1)', "en"),
    ('item(xs, 2)', None),
    ('length(xs)', 2),
    ('length(t)', 12),
    ('lower(xs)', ["en-us", "en"]),
    ('upper(xs)', ["EN-US", "EN"]),
    ('lower(xs) contains "en-us"', True),
    ('xs contains "en-us"', False),
    ('any(v in xs: v endswith "-US")', True),
    ('any(v in xs: v == "fr")', False),
    ('count(v in xs: lower(v) startswith "en")', 2),
    ('count(v in xs: length(v) > n)', 1),  # the condition reads the event's fields too
    ('any(v in xs: any(w in xs: v != w and v startswith w))', True),
    ('count(v in xs: true)', 2),
])
def test_value(text: str, expected: Any) -> None:
    assert values(text, EVENT) == expected
    assert check_errors(f"({text}) is not null") == []


@pytest.mark.parametrize("text", [
    "index_of(missing, t)", "index_of(t, missing)", "index_of(t, t, missing)",
    "substring(missing, 1)", "substring(t, missing)", "substring(t, 1, missing)",
    "between(missing, t, t)", "between(t, missing, t)", "between(t, t, t, missing)",
    'concat(t, missing, "x")', "item(missing, 0)", "item(xs, missing)", "length(missing)",
    "lower(missing)",
])
def test_a_null_argument_gives_null(text: str) -> None:
    assert values(text, {**EVENT, "missing": None}) is None


@pytest.mark.parametrize("xs", [None, [], "en"])
def test_a_missing_or_empty_list_has_no_elements(xs: Any) -> None:
    event = {**EVENT, "xs": xs}
    assert values('any(v in xs: v is null or v is not null)', event) is False
    assert values("count(v in xs: true)", event) == 0


def test_an_element_is_read_under_its_name_and_is_not_a_field() -> None:
    text = 'any(v in xs: v == t) or count(w in xs: w endswith s) > 1'
    expr = parse_expr(text)
    assert print_expr(expr) == text
    assert referenced_fields(expr) == frozenset({"xs", "t", "s"})


def test_a_position_that_is_not_a_whole_number_gives_null() -> None:
    # Values that disobey the declared `int` (the checks refuse a float expression there).
    assert values('index_of(t, "e", n)', {**EVENT, "n": 1.5}) is None
    assert values("substring(t, n)", {**EVENT, "n": 1.5}) is None
    assert values("substring(t, n)", {**EVENT, "n": 1.0}) == "xplorer.exe"
    assert values("item(xs, n)", {**EVENT, "n": 1.0}) == "en"


@pytest.mark.parametrize(("condition", "message"), [
    ('index_of(t) == 1', "index_of() takes 2 to 3 argument(s), got 1"),
    ('index_of(t, 1) == 1', "index_of() needs a string, not an int"),
    ('index_of(t, "a", x) == 1', "index_of() needs an int, not a float"),
    ('substring(t, "a") == "x"', "substring() needs an int, not a string"),
    ('between(t, "a", "b", 1) == "x"', "between() needs a boolean, not an int"),
    ('between(t, "a", "b", true, false, true) == "x"',
     "between() takes 3 to 5 argument(s), got 6"),
    ('concat() == "x"', "concat() takes 1 or more argument(s), got 0"),
    ('concat(t, xs) == "x"',
     "concat() needs a boolean or a float or a string or an int, not a list of strings"),
    ('item(t, 0) == "x"', "item() needs a list of strings, not a string"),
    ('item(xs, "0") == "x"', "item() needs an int, not a string"),
    ('length(n) == 1',
     "length() needs a json value or a list of strings or a string, not an int"),
    ('any(v in t: v == "a")',
     "any() reads the elements of a list of strings or of a json list, not a string"),
    ('count(t in xs: t == "a") == 1',
     "count(): the element name 't' is already a field here; choose another"),
    ('any(v in xs: length(v))', "the condition of any() must be true or false, not an int"),
    ('any(v in xs: v == 1)', "cannot compare a string with an int"),
])
def test_misuse_is_a_check_error(condition: str, message: str) -> None:
    assert message in check_errors(condition)


def test_a_list_compared_as_a_string_is_a_check_error() -> None:
    assert check_errors('lower(xs) == "en"') == ["cannot compare a list of strings with a string"]
