"""Unit tests of the expression compiler: each operator and function, null and mistyped
values, the pattern context (variables, prev, aggregates), errors, and the columnar form."""

from __future__ import annotations

import doctest
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import query_lang.compiler.evaluators as evaluators_module
import query_lang.compiler.values as values_module
import query_lang.functions as functions_module
from query_lang import parse, parse_expr
from query_lang.ast import (
    BinOp,
    BoolOp,
    Call,
    FieldRef,
    InList,
    Literal,
    Matches,
    PatAbsent,
    PatQuant,
    PatSeq,
    Pattern,
    PatVar,
    Prev,
    RuleDecl,
    Search,
    SearchNode,
    SearchTerm,
    Span,
    VarField,
)
from query_lang.compiler import (
    BatchError,
    CompileError,
    MaskedValues,
    Scope,
    compile_columnar_predicate,
    compile_columns,
    compile_expr,
    compile_masked,
    compile_predicate,
    history_fields,
    is_columnar,
    normalise_value,
    referenced_fields,
    value_kind,
)
from query_lang.errors import VigilError
from query_lang.functions import EARTH_RADIUS_KM, SCALAR_FUNCTIONS, haversine_km

INT64_MIN = -(2**63)


class Context:
    """A MatchContext as the CEP engine supplies it: bound events per variable, and the
    partition's earlier events (most recent last)."""

    def __init__(
        self,
        bound: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        history: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self._bound = dict(bound or {})
        self._history = list(history)

    def bound(self, var: str) -> Sequence[Mapping[str, Any]]:
        return self._bound.get(var, ())

    def prev(self, n: int) -> Mapping[str, Any] | None:
        return self._history[-n] if n <= len(self._history) else None


RULE_SCOPE = Scope(streams=frozenset({"txn"}), variables=frozenset({"a", "probe", "big"}))


def value(text: str, event: Mapping[str, Any] | None = None, ctx: Context | None = None,
          scope: Scope = RULE_SCOPE) -> Any:
    return compile_expr(parse_expr(text), scope)(event or {}, ctx)


def holds(text: str, event: Mapping[str, Any] | None = None, ctx: Context | None = None,
          scope: Scope = RULE_SCOPE) -> bool:
    return compile_predicate(parse_expr(text), scope)(event or {}, ctx)


def column(text: str, frame: pd.DataFrame, scope: Scope = RULE_SCOPE) -> list[Any]:
    return [normalise_value(v) for v in compile_columns(parse_expr(text), scope)(frame)]


def column_holds(text: str, frame: pd.DataFrame, scope: Scope = RULE_SCOPE) -> list[bool]:
    return compile_columnar_predicate(parse_expr(text), scope)(frame).tolist()


def test_module_examples_run() -> None:
    for module in (evaluators_module, values_module, functions_module):
        failures, tried = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert tried > 0 and failures == 0, module.__name__


# ---------------------------------------------------------------- constants and references


@pytest.mark.parametrize(
    ("text", "expected"),
    [("42", 42), ("2.5", 2.5), ('"é"', "é"), ("true", True), ("null", None), ("10m", 600_000),
     ("500ms", 500), ("1d", 86_400_000), ("1e6", 1_000_000.0), ("-3", -3)],
)
def test_constants(text: str, expected: Any) -> None:
    result = value(text)
    assert result == expected and type(result) is type(expected)


def test_field_of_current_event_and_its_nulls() -> None:
    assert value("amount", {"amount": 3.5}) == 3.5
    assert value("txn.amount", {"amount": 3.5}) == 3.5  # stream-qualified: the same field
    assert value("amount", {}) is None  # missing
    assert value("amount", {"amount": None}) is None
    assert value("amount", {"amount": float("nan")}) is None
    assert value("amount", {"amount": np.float64("nan")}) is None
    assert value("amount", {"amount": pd.NA}) is None


def test_variable_field_reads_the_last_bound_event() -> None:
    ctx = Context({"probe": [{"amount": 0.5}, {"amount": 0.7}], "a": [{"lat": 1.0}]})
    assert value("probe.amount", ctx=ctx) == 0.7
    assert value("a.lat", ctx=ctx) == 1.0
    assert value("big.amount", ctx=ctx) is None  # nothing bound yet
    assert value("a.lat") is None  # no match context at all
    assert value("first(probe).amount", ctx=ctx) == 0.5
    assert value("last(probe).amount", ctx=ctx) == 0.7
    assert value("first(big).amount", ctx=ctx) is None


def test_a_variable_shadows_a_stream_of_the_same_name() -> None:
    scope = Scope(streams={"a", "txn"}, variables={"a"})
    ctx = Context({"a": [{"x": "bound"}]})
    assert value("a.x", {"x": "current"}, ctx, scope) == "bound"
    assert value("txn.x", {"x": "current"}, ctx, scope) == "current"


def test_prev_reads_earlier_events_of_the_partition() -> None:
    ctx = Context(history=[{"price": 1.0}, {"price": 2.0}])
    assert value("prev(price)", ctx=ctx) == 2.0
    assert value("prev(price, 2)", ctx=ctx) == 1.0
    assert value("prev(price, 3)", ctx=ctx) is None
    assert value("prev(price)") is None
    assert holds("price < prev(price)", {"price": 1.5}, ctx)
    assert not holds("price < prev(price)", {"price": 1.5}, Context())


def test_a_qualifier_neither_stream_nor_variable_reads_a_json_member() -> None:
    # The checks refuse zz.amount unless zz is a json field; compiled, it reads its member.
    assert value("zz.amount", {"zz": {"amount": 3}}) == 3
    assert value("zz.amount", {"zz": "a string"}) is None
    assert value("zz.amount.cents", {"zz": {"amount": {"cents": 5}}}) == 5


def test_unknown_variable_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match=r"last\(zz\)\.f: 'zz' is not a pattern variable"):
        value("last(zz).f")
    with pytest.raises(CompileError, match=r"prev\(price, 0\)"):
        compile_expr(Prev("price", 0))


# ---------------------------------------------------------------- aggregates over variables


def test_pattern_aggregates_fold_bound_events_ignoring_nulls() -> None:
    probes = [{"amount": 0.5}, {"amount": None}, {"amount": 0.25}, {}]
    ctx = Context({"probe": probes})
    assert value("count(probe)", ctx=ctx) == 4
    assert value("count(probe.amount)", ctx=ctx) == 2  # non-null values, like SQL count(x)
    assert value("sum(probe.amount)", ctx=ctx) == 0.75
    assert value("avg(probe.amount)", ctx=ctx) == 0.375
    assert value("min(probe.amount)", ctx=ctx) == 0.25
    assert value("max(probe.amount)", ctx=ctx) == 0.5
    assert holds("count(probe) >= 3 and sum(probe.amount) < 1", ctx=ctx)


def test_pattern_aggregates_of_nothing() -> None:
    empty = Context({"probe": [{"amount": None}]})
    for text in ("sum(probe.amount)", "avg(probe.amount)", "min(probe.amount)"):
        assert value(text, ctx=empty) is None
        assert value(text) is None
    assert value("count(probe)", ctx=empty) == 1
    assert value("count(probe)") == 0


def test_pattern_aggregates_of_mixed_kinds_are_null() -> None:
    ctx = Context({"probe": [{"x": 1}, {"x": "one"}], "a": [{"x": "b"}, {"x": "a"}]})
    assert value("sum(probe.x)", ctx=ctx) is None
    assert value("max(probe.x)", ctx=ctx) is None
    assert value("min(a.x)", ctx=ctx) == "a"  # strings order
    assert value("sum(probe.x)", ctx=Context({"probe": [{"x": 2**62}, {"x": 2**62}]})) == 2**63


@pytest.mark.parametrize(
    "text", ["count()", "sum(amount)", "avg(amount)", "approx_distinct(card_id)",
             "approx_percentile(amount, 0.99)", "seen(card_id)", "count(amount)"],
)
def test_metric_aggregates_are_rejected_in_conditions(text: str) -> None:
    with pytest.raises(CompileError, match="only valid in metric select"):
        value(text)


def test_aggregate_of_a_variable_needs_a_field() -> None:
    with pytest.raises(CompileError, match=r"sum\(probe\) needs a field of probe"):
        value("sum(probe)")


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7 + 2", 9), ("7 - 2.5", 4.5), ("7 * 2", 14), ("7 / 2", 3.5), ("6 / 3", 2.0),
     ("7 % 3", 1), ("-7 % 3", 2), ("7 % -3", -2), ("7.5 % 2", 1.5), ("-(3)", -3),
     ('"ab" + "cd"', "abcd"), ("1h - 30m", 1_800_000), ("2 * 3 + 4", 10),
     ("4611686018427387904 * 4", 2**64)],
)
def test_arithmetic(text: str, expected: Any) -> None:
    result = value(text)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    "text",
    ["x + 1", "1 - x", "x * 2", "x / 2", "x % 2", "-x", "1 / 0", "1 % 0", "1.5 / 0.0",
     "0 / 0", '"a" + 1', "true + 1", '"a" * 3', '-"a"', "-true"],
)
def test_arithmetic_null_zero_division_and_mistyped(text: str) -> None:
    assert value(text, {"x": None}) is None


def test_float_overflow_gives_infinity_and_nan_gives_null() -> None:
    assert value("x * 10", {"x": 1e308}) == math.inf
    assert value("x - x", {"x": math.inf}) is None  # inf - inf is NaN: null


def test_timestamps_subtract_to_durations() -> None:
    ctx = Context({"a": [{"ts": 1_700_000_000_000}]})
    assert value("ts - a.ts", {"ts": 1_700_007_200_000}, ctx) == 7_200_000
    assert value("hours(ts - a.ts)", {"ts": 1_700_007_200_000}, ctx) == 2.0
    assert value("minutes(90s)") == 1.5


# ---------------------------------------------------------------- comparisons and logic


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1 == 1.0", True), ("1 != 1.0", False), ("2 < 2.5", True), ("2 <= 2", True),
     ("3 > 2.5", True), ("2 >= 2.5", False), ('"a" < "b"', True), ('"B" < "a"', True),
     ('"a" == "a"', True), ("true == true", True), ("false < true", True),
     ('1 == "1"', False), ('1 != "1"', False), ('1 < "2"', False), ("1 == true", False),
     ("1 != true", False), ("x == 1", False), ("x != 1", False), ("x < 1", False),
     ("not (x == 1)", True), ("not (x != 1)", True)],
)
def test_comparisons(text: str, expected: bool) -> None:
    assert holds(text, {"x": None}) is expected


def test_big_ints_compare_exactly_with_floats() -> None:
    assert holds("x != 9007199254740992.0", {"x": 2**53 + 1})
    assert holds("x > 9007199254740992.0", {"x": 2**53 + 1})


def test_boolean_operators_and_truthiness() -> None:
    event = {"t": True, "f": False, "n": None, "one": 1, "s": "yes"}
    assert holds("t and not f", event)
    assert holds("f or t", event)
    assert not holds("t and n", event)
    assert holds("not n", event)  # null is false in a boolean context
    assert not holds("one", event) and not holds("s", event)  # non-booleans are not true
    assert holds("not one", event)
    assert not holds("n or f", event)
    assert value("t and n", event) is False


def test_and_short_circuits() -> None:
    calls: list[Any] = []

    def search(field: str, query: SearchNode) -> Any:
        return lambda v: calls.append(v) or True

    scope = Scope(search=search)
    expr = BoolOp("and", (Literal(False), Search("body", SearchTerm(None, "x"), "x")))
    assert compile_predicate(expr, scope)({"body": "x"}) is False
    assert calls == []


# ---------------------------------------------------------------- membership, ranges, nulls


def test_in_values() -> None:
    assert holds('country in ("US", "CA")', {"country": "CA"})
    assert not holds('country in ("US", "CA")', {"country": "FR"})
    assert not holds('country in ("US", null)', {"country": None})
    assert not holds('x in (null)', {"x": None})
    assert holds("x in (1.0, 2)", {"x": 1})
    assert not holds('x in ("1")', {"x": 1})
    assert not holds("x in (1)", {"x": True})
    assert holds("x in (y, 7)", {"x": 3, "y": 3})
    mixed = 'x in (1, "1", true, 10m)'
    assert [holds(mixed, {"x": x}) for x in (1, 1.0, "1", True, 600_000, "true", 0, False)] == [
        True, True, True, True, True, False, False, False]


def test_in_list_uses_the_declared_container() -> None:
    scope = Scope(lists={"stolen_cards": {"c1", "c2"}})
    assert holds("card_id in stolen_cards", {"card_id": "c2"}, scope=scope)
    assert not holds("card_id in stolen_cards", {"card_id": "c3"}, scope=scope)
    assert not holds("card_id in stolen_cards", {}, scope=scope)
    assert holds("not (card_id in stolen_cards)", {}, scope=scope)


def test_in_list_with_a_container_that_rejects_a_value() -> None:
    class PickyFilter:
        def __contains__(self, item: object) -> bool:
            if not isinstance(item, str):
                raise TypeError("strings only")
            return item == "c1"

    scope = Scope(lists={"cards": PickyFilter()})
    assert holds("x in cards", {"x": "c1"}, scope=scope)
    assert not holds("x in cards", {"x": 5}, scope=scope)
    assert column_holds("x in cards", pd.DataFrame({"x": ["c1", 5, None]}), scope) == [
        True, False, False]


def test_unknown_list_is_a_compile_error_naming_it() -> None:
    with pytest.raises(CompileError, match="unknown list 'nope'; declared lists: ok"):
        compile_expr(parse_expr("x in nope"), Scope(lists={"ok": set()}))


def test_between_is_inclusive() -> None:
    assert holds("x between 1 and 2", {"x": 1})
    assert holds("x between 1 and 2", {"x": 2.0})
    assert not holds("x between 1 and 2", {"x": 2.5})
    assert not holds("x between 2 and 1", {"x": 1.5})
    assert not holds("x between 1 and 2", {"x": None})
    assert not holds('x between 1 and 2', {"x": "1.5"})
    assert holds('x between "a" and "c"', {"x": "b"})


def test_is_null() -> None:
    assert holds("x is null", {}) and holds("x is null", {"x": float("nan")})
    assert not holds("x is not null", {"x": None})
    assert holds("x is not null", {"x": 0})
    assert holds("(x + 1) is null", {"x": "a"})


# ---------------------------------------------------------------- strings and regexes


def test_string_operators() -> None:
    event = {"s": "Hello world", "tags": ["red", "blue"]}
    assert holds('s contains "lo w"', event)
    assert holds('s startswith "Hell"', event) and not holds('s startswith "hell"', event)
    assert holds('s endswith "world"', event)
    assert holds('tags contains "blue"', event)  # list<string>: membership
    assert not holds('tags contains "blu"', event)
    assert not holds('n contains "a"', {"n": 5})
    assert not holds('s contains x', {"s": "a", "x": None})
    assert not holds('s startswith 1', event)


def test_matches_is_an_unanchored_re2_search() -> None:
    assert holds("s matches /b+c/", {"s": "abbbcd"})
    assert not holds("s matches /^b+c$/", {"s": "abbbcd"})
    assert holds("s matches /^café$/", {"s": "café"})
    assert holds("s matches /(?i)HELLO/", {"s": "hello"})
    assert not holds("s matches /a/", {"s": None})
    assert not holds("s matches /1/", {"s": 1})


def test_invalid_regex_is_a_compile_error_at_the_regex() -> None:
    expr = parse_expr("s matches /(a)\\1/", path="rules.vigil")
    with pytest.raises(CompileError, match=r"rules.vigil:1:11: invalid regular expression"):
        compile_expr(expr)
    with pytest.raises(CompileError, match=r"missing \)"):
        compile_columnar_predicate(Matches(FieldRef("s"), "(a"))


# ---------------------------------------------------------------- functions


def test_string_functions() -> None:
    assert value('lower(s)', {"s": "ÀbC"}) == "àbc"
    assert value('upper(s)', {"s": "straße"}) == "STRASSE"
    assert value("lower(s)", {"s": 5}) is None
    assert value("upper(s)", {}) is None


def test_abs() -> None:
    assert value("abs(x)", {"x": -3}) == 3
    assert value("abs(x)", {"x": -2.5}) == 2.5
    assert value("abs(x)", {"x": INT64_MIN}) == 2**63
    assert value("abs(x)", {"x": True}) is None


def test_distance_km() -> None:
    paris, london = (48.8566, 2.3522), (51.5074, -0.1278)
    event = {"lat": london[0], "lon": london[1]}
    ctx = Context({"a": [{"lat": paris[0], "lon": paris[1]}]})
    # Independent haversine with the same radius.
    p1, p2 = math.radians(paris[0]), math.radians(london[0])
    dp, dl = p2 - p1, math.radians(london[1] - paris[1])
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    expected = 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))
    assert value("distance_km(a.lat, a.lon, lat, lon)", event, ctx) == pytest.approx(expected)
    assert value("distance_km(0, 0, 0, 180)") == pytest.approx(math.pi * EARTH_RADIUS_KM)
    assert value("distance_km(0, 0, 0, 0)") == 0.0
    assert value("distance_km(lat, 0, 0, 0)", {}) is None
    assert value('distance_km("x", 0, 0, 0)') is None


def test_impossible_travel_condition() -> None:
    text = "distance_km(a.lat, a.lon, lat, lon) / hours(ts - a.ts) > 900"
    ctx = Context({"a": [{"lat": 48.8566, "lon": 2.3522, "ts": 0}]})
    london_soon = {"lat": 51.5074, "lon": -0.1278, "ts": 10 * 60_000}  # 344 km in 10 min
    london_later = {"lat": 51.5074, "lon": -0.1278, "ts": 2 * 3_600_000}
    assert holds(text, london_soon, ctx)
    assert not holds(text, london_later, ctx)
    assert not holds(text, {**london_soon, "ts": 0}, ctx)  # zero hours: division by zero is null


@pytest.mark.parametrize(
    ("text", "message"),
    [("lower(a, b)", r"lower\(s\) takes 1 argument, got 2"),
     ("distance_km(1, 2)", r"distance_km\(lat1, lon1, lat2, lon2\) takes 4 arguments, got 2"),
     ("sqrt(x)", r"unknown function sqrt\(\); known functions: abs, avg, ")],
)
def test_function_call_errors(text: str, message: str) -> None:
    with pytest.raises(CompileError, match=message):
        value(text)


def test_haversine_gives_bit_identical_results_for_a_value_and_a_column() -> None:
    rng = np.random.default_rng(7)
    coordinates = [rng.uniform(-90, 90, 500), rng.uniform(-180, 180, 500),
                   rng.uniform(-90, 90, 500), rng.uniform(-180, 180, 500)]
    columns = haversine_km(*coordinates)
    one_by_one = [SCALAR_FUNCTIONS["distance_km"].scalar(*map(float, row))
                  for row in zip(*coordinates, strict=True)]
    assert columns.tolist() == one_by_one


# ---------------------------------------------------------------- search


def test_search_uses_the_percolator_hook() -> None:
    seen: list[tuple[str, SearchNode]] = []

    def hook(field: str, query: SearchNode) -> Any:
        seen.append((field, query))
        words = query.text if isinstance(query, SearchTerm) else ""
        return lambda v: words in v.lower().split()

    scope = Scope(search=hook)
    expr = parse_expr('search(body, "acme")')
    assert compile_predicate(expr, scope)({"body": "ACME layoffs"})
    assert not compile_predicate(expr, scope)({"body": "acmeish"})
    assert not compile_predicate(expr, scope)({})
    assert seen[0] == ("body", SearchTerm(None, "acme"))
    assert referenced_fields(expr, scope) == {"body"}
    frame = pd.DataFrame({"body": ["ACME layoffs", "other", None, "acme"]})
    assert compile_columnar_predicate(expr, scope)(frame).tolist() == [True, False, False, True]


def test_search_hook_failures_are_false() -> None:
    scope = Scope(search=lambda field, query: lambda v: v.lower() == "x")
    expr = parse_expr('search(body, "x")')
    assert not compile_predicate(expr, scope)({"body": 3})
    assert compile_predicate(expr, scope)({"body": "X"})


def test_search_without_a_hook_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match=r"search\(body, 'acme'\) needs the percolator"):
        compile_expr(parse_expr('search(body, "acme")'))


# ---------------------------------------------------------------- robustness


ODD_VALUES = [
    None, float("nan"), math.inf, -math.inf, 2**80, -(2**80), INT64_MIN, "", "é", [], ["a"],
    ("a", 1), {"k": "v"}, b"bytes", object(), np.int64(3), np.float32("nan"), np.bool_(True),
    np.array([1, 2]), pd.NA, pd.NaT, datetime(2024, 1, 1), timedelta(seconds=1),
    np.datetime64("NaT"), np.timedelta64(5, "s"), complex(1, 2),
]

CONDITIONS = [
    "x == y", "x != y", "x < y", "x >= y", "x + y > 0", "x - y == 0", "x * y < 1", "x / y > 1",
    "x % y == 0", "-x < 0", "x in (y, 1, \"a\")", "x between y and 3", "x contains y",
    "x startswith y", "x endswith y", "x matches /a/", "lower(x) == y", "abs(x) > y",
    "hours(x) > 1", "distance_km(x, y, 0, 0) > 1", "not x", "x and y", "x or y",
    "x is null", "x is not null", "x in cards", "search(x, \"a\")",
]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_predicates_never_raise_on_odd_values(condition: str) -> None:
    scope = Scope(lists={"cards": {"a"}}, search=lambda f, q: lambda v: "a" in v)
    predicate = compile_predicate(parse_expr(condition), scope)
    for x in ODD_VALUES:
        for y in ODD_VALUES:
            assert predicate({"x": x, "y": y}) in (True, False)


def test_normalise_value() -> None:
    assert normalise_value(np.int64(3)) == 3 and type(normalise_value(np.int64(3))) is int
    assert normalise_value(np.bool_(False)) is False
    assert normalise_value(np.str_("a")) == "a"
    assert normalise_value(pd.NaT) is None and normalise_value(np.datetime64("NaT")) is None
    assert normalise_value(datetime(1970, 1, 1, 0, 0, 2, 500_000)) == 2500
    assert normalise_value(datetime(1970, 1, 1, 1, tzinfo=UTC)) == 3_600_000
    assert normalise_value(pd.Timestamp("1970-01-01T01:00:00+01:00")) == 0
    assert normalise_value(np.datetime64("1970-01-01T00:00:01.5")) == 1500
    assert normalise_value(timedelta(minutes=1)) == 60_000
    assert normalise_value(np.timedelta64(2, "s")) == 2000
    assert normalise_value(["a"]) == ["a"]
    assert [value_kind(v) for v in (None, 1, 1.0, "a", True, ["a"], {})] == [
        "null", "num", "num", "str", "bool", "list", "other"]


def test_compile_error_is_a_vigil_value_error_with_a_position() -> None:
    expr = parse_expr("amount > 1 and x in nope", path="fraud.vigil")
    with pytest.raises(CompileError) as caught:
        compile_expr(expr)
    error = caught.value
    assert isinstance(error, VigilError) and isinstance(error, ValueError)
    assert (error.file, error.line, error.column) == ("fraud.vigil", 1, 16)
    assert str(error).startswith("fraud.vigil:1:16: unknown list 'nope'")


def test_scope_accepts_any_iterable_of_names() -> None:
    scope = Scope(streams=["txn"], variables={"a"})
    assert scope.streams == frozenset({"txn"}) and scope.variables == frozenset({"a"})


# ---------------------------------------------------------------- columnar form


def test_is_columnar() -> None:
    assert is_columnar(parse_expr('amount < 1 and merchant != "x"'), RULE_SCOPE)
    assert is_columnar(parse_expr("txn.amount > 1 and lower(s) matches /a/"), RULE_SCOPE)
    for text in ("a.lat > 1", "last(probe).amount > 1", "price < prev(price)",
                 "count(probe) > 2", "sum(probe.amount) > 1", "count() > 1"):
        assert not is_columnar(parse_expr(text), RULE_SCOPE), text


def test_non_columnar_expression_is_refused_naming_what_it_reads() -> None:
    expr = parse_expr("amount > 500 and merchant != last(probe).merchant", path="r.vigil")
    with pytest.raises(CompileError, match=r"r.vigil:1:30: last\(probe\).merchant reads beyond"):
        compile_columnar_predicate(expr, RULE_SCOPE)
    with pytest.raises(CompileError, match=r"a.lat \(a pattern variable's field\)"):
        compile_columns(parse_expr("a.lat"), RULE_SCOPE)
    with pytest.raises(CompileError, match=r"count\(probe\) reads beyond"):
        compile_columns(parse_expr("count(probe) + 1"), RULE_SCOPE)
    with pytest.raises(CompileError, match=r"count\(\) is only valid in metric select"):
        compile_columns(parse_expr("count() + 1"), RULE_SCOPE)


def test_columnar_predicate_on_typical_columns() -> None:
    frame = pd.DataFrame({
        "amount": [0.5, 0.9, 2.0, np.nan, 0.1],
        "merchant": ["shop", "x", "shop", "shop", None],
    })
    assert column_holds('amount < 1.0 and merchant != "x"', frame) == [
        True, False, False, False, False]
    assert column_holds('not (merchant == "x")', frame) == [True, False, True, True, True]


def test_missing_column_is_all_null() -> None:
    frame = pd.DataFrame({"a": [1, 2]})
    assert column("b", frame) == [None, None]
    assert column_holds("b is null", frame) == [True, True]
    assert column_holds("b != 1", frame) == [False, False]
    assert column("a + b", frame) == [None, None]


def test_constant_expressions_broadcast_to_the_batch() -> None:
    frame = pd.DataFrame({"a": [1, 2, 3]})
    assert column("1 + 2", frame) == [3, 3, 3]
    assert column_holds("true", frame) == [True, True, True]
    assert column_holds('"abc" matches /b/', frame) == [True, True, True]


def test_empty_batch() -> None:
    frame = pd.DataFrame({"a": pd.Series([], dtype=np.int64)})
    assert compile_columnar_predicate(parse_expr("a > 1"))(frame).shape == (0,)
    assert compile_columns(parse_expr("a + 1"))(frame).shape == (0,)
    assert compile_columns(parse_expr("1"))(pd.DataFrame()).shape == (0,)


def test_columns_of_every_dtype_match_the_rows() -> None:
    frame = pd.DataFrame({
        "i64": np.array([1, -2, 3], dtype=np.int64),
        "i32": np.array([1, -2, 3], dtype=np.int32),
        "u64": np.array([2**64 - 1, 0, 5], dtype=np.uint64),
        "nullable": pd.array([1, None, 3], dtype="Int64"),
        "f32": np.array([0.5, np.nan, 1.5], dtype=np.float32),
        "flag": pd.array([True, None, False], dtype="boolean"),
        "bools": np.array([True, False, True]),
        "text": pd.array(["a", None, "b"], dtype="string"),
        "cat": pd.Categorical(["x", None, "y"]),
        "when": pd.to_datetime(
            ["2024-01-01T00:00:00.000Z", None, "1970-01-01T00:00:01.500Z"], format="ISO8601"),
        "naive": pd.to_datetime(
            ["1970-01-01T00:00:02", None, "1970-01-01T00:00:00"], format="ISO8601"),
        "span": pd.to_timedelta(["1s", None, "1ms"]),
        "mixed": pd.Series([1, "one", None], dtype=object),
        # Arrow-backed columns, as pyarrow and Spark's Arrow conversion produce them.
        "a_int": pd.Series([1, None, 3], dtype="int64[pyarrow]"),
        "a_float": pd.Series([1.5, None, -2.0], dtype="double[pyarrow]"),
        "a_text": pd.Series(["a", None, "b"], dtype=pd.ArrowDtype(pa.string())),
        "a_flag": pd.Series([True, None, False], dtype="bool[pyarrow]"),
        "a_time": pd.Series([1000, None, 0], dtype=pd.ArrowDtype(pa.timestamp("ms", tz="UTC"))),
        "a_tags": pd.Series([["a", "b"], None, []], dtype=pd.ArrowDtype(pa.list_(pa.string()))),
    })
    events = [{k: normalise_value(v) for k, v in row.items()}
              for row in frame.to_dict("records")]
    for name in frame.columns:
        for text in (f"{name}", f"{name} is null", f"{name} + {name}", f"{name} == {name}",
                     f"-{name}", f"{name} > 1", f'{name} contains "a"'):
            rows = [compile_expr(parse_expr(text))(e) for e in events]
            assert column(text, frame) == rows, text
    assert column("u64", frame) == [2**64 - 1, 0, 5]
    assert column("when", frame) == [1_704_067_200_000, None, 1500]
    assert column("naive", frame) == [2000, None, 0]
    assert column("span", frame) == [1000, None, 1]
    assert column("a_time", frame) == [1000, None, 0]
    assert column("a_tags", frame) == [["a", "b"], None, []]
    assert column_holds('a_tags contains "b"', frame) == [True, False, False]


def test_exact_integer_arithmetic_where_int64_would_overflow() -> None:
    frame = pd.DataFrame({"x": np.array([2**62, 3, INT64_MIN, 2**53 + 1], dtype=np.int64),
                          "ts": np.array([1_700_000_000_000] * 4, dtype=np.int64)})
    events = frame.to_dict("records")
    for text in ("x * 4", "x + x", "x - 1", "-x", "abs(x)", "ts * ts", "x / 3",
                 "x / 9007199254740993", "x == 4611686018427387904.0",
                 "x > 4611686018427387903.0", "x % -1", "x == 9007199254740992.0",
                 "x <= 9007199254740992.0", "x != 9007199254740992.0"):
        rows = [compile_expr(parse_expr(text))({"x": int(e["x"]), "ts": int(e["ts"])})
                for e in events]
        assert column(text, frame) == rows, text
    assert column("x * 4", frame)[0] == 2**64
    assert column("-x", frame)[2] == 2**63
    assert column_holds("x == 9007199254740992.0", frame) == [False, False, False, False]


def test_compile_columns_null_representation() -> None:
    frame = pd.DataFrame({"f": [1.5, None], "i": pd.array([1, None], dtype="Int64"),
                          "s": ["a", None]})
    floats = compile_columns(parse_expr("f * 2"))(frame)
    assert floats.dtype == np.float64 and floats[0] == 3.0 and np.isnan(floats[1])
    ints = compile_columns(parse_expr("i * 2"))(frame)
    assert ints.dtype == object and ints.tolist() == [2, None]
    full = compile_columns(parse_expr("i * 2"))(frame.iloc[:1])
    assert full.dtype == np.int64 and full.tolist() == [2]
    strings = compile_columns(parse_expr('s + "!"'))(frame)
    assert strings.tolist() == ["a!", None]


def test_columnar_division_by_zero_and_nan_results_are_null() -> None:
    frame = pd.DataFrame({"i": [6, 7], "f": [math.inf, 1.5], "zero": [0, 0.0]})
    assert column("i / zero", frame) == [None, None]
    assert column("i % zero", frame) == [None, None]
    assert column("i % 0", frame) == [None, None]
    assert column("f - f", frame) == [None, 0.0]  # inf - inf is NaN: null
    assert column("f * 0", frame) == [None, 0.0]
    assert column_holds("(f - f) is null", frame) == [True, False]


def test_compile_masked_keeps_dtype_and_mask() -> None:
    frame = pd.DataFrame({"i": pd.array([1, None, 3], dtype="Int64")})
    result = compile_masked(parse_expr("i * 2"))(frame)
    assert isinstance(result, MaskedValues)
    assert result.values.dtype == np.int64
    assert result.valid.tolist() == [True, False, True]
    assert result.values[result.valid].tolist() == [2, 6]
    missing = compile_masked(parse_expr("nothing"))(frame)
    assert missing.valid.tolist() == [False, False, False]


def test_duplicate_column_is_a_batch_error() -> None:
    frame = pd.DataFrame([[1, 2]], columns=["a", "a"])
    with pytest.raises(BatchError, match="2 columns named 'a'"):
        compile_columnar_predicate(parse_expr("a > 1"))(frame)


def test_columnar_string_and_membership_operators() -> None:
    frame = pd.DataFrame({
        "s": ["abc", "xbz", None, "abc", "ABC"],
        "t": ["b", "z", "a", "q", "b"],
        "tags": [["x", "y"], [], None, ["y"], ["z"]],
    })
    scope = Scope(lists={"known": {"abc", "ABC"}})
    assert column_holds('s contains "b"', frame) == [True, True, False, True, False]
    assert column_holds("s contains t", frame) == [True, True, False, False, False]
    assert column_holds('"zzb" endswith t', frame) == [True, False, False, False, True]
    assert column_holds('s startswith "a"', frame) == [True, False, False, True, False]
    assert column_holds('tags contains "y"', frame) == [True, False, False, True, False]
    assert column_holds("s matches /^a.c$/", frame) == [True, False, False, True, False]
    assert column_holds("s in known", frame, scope) == [True, False, False, True, True]
    assert column_holds('s in ("abc", "nope", 1)', frame) == [True, False, False, True, False]
    assert column_holds('lower(s) == "abc"', frame) == [True, False, False, True, True]


def test_columnar_tests_are_false_on_null_rows_whatever_they_hold() -> None:
    # Null rows of typed columns hold placeholders (0, "", False) that a test could match.
    frame = pd.DataFrame({
        "i": pd.array([None, 1], dtype="Int64"),
        "s": pd.array([None, "a"], dtype="string"),
        "b": pd.array([None, True], dtype="boolean"),
    })
    scope = Scope(lists={"zeros": {0, ""}})  # False in {0} holds: Python sets equate them
    for text in ("i in (0, 1)", 's in ("", "a")', "b in (false, true)", "i in zeros",
                 "s in zeros", "b in zeros", "s matches /^$/", 's startswith ""', "i <= 0",
                 "i == 0", 's == ""', "b == false", "i between -1 and 1",
                 "abs(i) == 0", 'lower(s) == ""'):
        assert column_holds(text, frame, scope)[0] is False, text
        assert holds(text, {}, scope=scope) is False, text


def test_columnar_in_values_keeps_kinds_apart() -> None:
    frame = pd.DataFrame({"i": [1, 0, 2], "s": ["1", "true", "x"]})
    assert column_holds("i in (true, false)", frame) == [False, False, False]
    assert column_holds('i in ("1", 2.0)', frame) == [False, False, True]
    assert column_holds("s in (1, true)", frame) == [False, False, False]


def test_columnar_predicate_is_vectorised_over_large_batches() -> None:
    # A million rows must not go through Python one row at a time; correctness is checked on
    # a sample against the per-event predicate.
    rng = np.random.default_rng(3)
    n = 1_000_000
    frame = pd.DataFrame({
        "amount": rng.uniform(0, 2, n),
        "merchant": rng.choice(np.array(["x", "shop", "cafe"], dtype=object), n),
    })
    expr = parse_expr('amount < 1.0 and merchant != "x"')
    result = compile_columnar_predicate(expr)(frame)
    predicate = compile_predicate(expr)
    sample = frame.sample(500, random_state=1)
    for index, row in zip(sample.index, sample.to_dict("records"), strict=True):
        assert result[index] == predicate(row)


def test_evaluators_survive_shipping_to_spark_executors() -> None:
    # Spark sends compiled evaluators to executors with cloudpickle, which copies module
    # constants: nothing may depend on the identity of objects defined in the compiler.
    cloudpickle = pytest.importorskip("pyspark.cloudpickle")
    expr = parse_expr('x matches /a+/ or y > 1 or z is null or lower(s) in ("q")')
    frame = pd.DataFrame({"x": ["a", "b", None, "c"], "y": [0, 2, None, 0],
                          "z": [1, 1, 1, None], "s": ["Q", "r", None, "r"]})
    shipped = cloudpickle.loads(cloudpickle.dumps(compile_columnar_predicate(expr)))
    assert shipped(frame).tolist() == [True, True, False, True]
    row = cloudpickle.loads(cloudpickle.dumps(compile_predicate(expr)))
    assert [row(e) for e in frame.to_dict("records")] == [True, True, False, True]


# ---------------------------------------------------------------- fields read


def test_referenced_and_history_fields() -> None:
    expr = parse_expr(
        "distance_km(a.lat, a.lon, lat, lon) / hours(ts - a.ts) > 900 and count(probe) > 1 "
        "and sum(probe.amount) < 5 and price < prev(price, 2) and last(big).x == txn.y"
    )
    assert referenced_fields(expr, RULE_SCOPE) == {"lat", "lon", "ts", "price", "y"}
    assert history_fields(expr, RULE_SCOPE) == {"lat", "lon", "ts", "amount", "price", "x"}
    # In a metric's select, aggregates read the current event's fields.
    metric = parse_expr("approx_percentile(amount, 0.99) > 1 and count() > sum(fee)")
    assert referenced_fields(metric) == {"amount", "fee"}
    assert history_fields(metric) == frozenset()


# ---------------------------------------------------------------- whole rules through the parser


RULES = """
stream txn (card_id string, amount float, merchant string, lat float, lon float,
            ts timestamp) time ts

list stolen_cards ("c9")

rule card_testing
  from txn by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m

rule impossible_travel
  from txn by card_id
  pattern a b
  define b as distance_km(a.lat, a.lon, lat, lon) / hours(ts - a.ts) > 900
  within 6h

rule stolen_card_use
  from txn by card_id
  pattern t
  define t as card_id in stolen_cards
"""


def _pattern_variables(pattern: Pattern) -> set[str]:
    if isinstance(pattern, PatVar | PatAbsent):
        return {pattern.name}
    if isinstance(pattern, PatQuant):
        return _pattern_variables(pattern.inner)
    parts = pattern.items if isinstance(pattern, PatSeq) else pattern.options
    return set().union(*(_pattern_variables(p) for p in parts))


def _rule_conditions(rule: RuleDecl, lists: Mapping[str, Any]) -> dict[str, Any]:
    scope = Scope(
        streams=frozenset(rule.streams),
        variables=frozenset(_pattern_variables(rule.pattern)),
        lists=lists,
    )
    return {d.var: (d.condition, scope) for d in rule.defines if d.condition is not None}


def test_conditions_of_parsed_rules() -> None:
    module = parse(RULES, path="fraud.vigil")
    rules = {r.name: r for r in module.of_type(RuleDecl)}
    lists = {"stolen_cards": {"c9"}}

    testing = _rule_conditions(rules["card_testing"], lists)
    probe_expr, scope = testing["probe"]
    assert is_columnar(probe_expr, scope)
    frame = pd.DataFrame({"amount": [0.5, 700.0, None], "merchant": ["a", "b", "c"]})
    assert compile_columnar_predicate(probe_expr, scope)(frame).tolist() == [True, False, False]
    big_expr, scope = testing["big"]
    assert not is_columnar(big_expr, scope)
    big = compile_predicate(big_expr, scope)
    probes = Context({"probe": [{"merchant": "a"}, {"merchant": "b"}]})
    assert big({"amount": 900.0, "merchant": "c"}, probes)
    assert not big({"amount": 900.0, "merchant": "b"}, probes)

    travel_expr, scope = _rule_conditions(rules["impossible_travel"], lists)["b"]
    travel = compile_predicate(travel_expr, scope)
    start = Context({"a": [{"lat": 48.8566, "lon": 2.3522, "ts": 0}]})
    assert travel({"lat": 51.5074, "lon": -0.1278, "ts": 600_000}, start)
    assert history_fields(travel_expr, scope) == {"lat", "lon", "ts"}

    stolen_expr, scope = _rule_conditions(rules["stolen_card_use"], lists)["t"]
    frame = pd.DataFrame({"card_id": ["c1", "c9", None]})
    assert compile_columnar_predicate(stolen_expr, scope)(frame).tolist() == [False, True, False]


def test_ast_nodes_built_directly_compile_too() -> None:
    expr = BoolOp("and", (
        BinOp("<", FieldRef("amount"), Literal(1.0)),
        InList(FieldRef("card_id"), "cards"),
        BinOp(">", Call("abs", (FieldRef("delta"),)), Literal(2)),
        BinOp("==", VarField("first", "a", "card_id"), FieldRef("card_id", "txn")),
    ))
    scope = Scope(streams={"txn"}, variables={"a"}, lists={"cards": {"c1"}})
    ctx = Context({"a": [{"card_id": "c1"}]})
    assert compile_predicate(expr, scope)({"amount": 0.5, "card_id": "c1", "delta": -3}, ctx)


def test_unknown_node_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="SearchTerm is not an expression"):
        compile_expr(SearchTerm(None, "x"))  # type: ignore[arg-type]
    with pytest.raises(CompileError, match="unknown operator '\\*\\*'"):
        compile_expr(BinOp("**", Literal(1), Literal(2)))
    with pytest.raises(CompileError, match="<string>:3:4: unknown operator"):
        compile_columns(BinOp("^", FieldRef("a"), Literal(2), span=Span(line=3, column=4)))
