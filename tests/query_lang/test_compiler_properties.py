"""Property tests of the expression compiler: over random expressions and random events with
nulls, missing fields and mistyped values, the per-event and the column-wise evaluators agree
on every row, and a compiled predicate never raises."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from query_lang.ast import (
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    STRING_OPS,
    Between,
    BinOp,
    BoolOp,
    Call,
    Duration,
    Expr,
    FieldRef,
    InList,
    InValues,
    IsNull,
    Literal,
    Matches,
    Neg,
    Not,
    Quantified,
    Search,
    SearchTerm,
)
from query_lang.compiler import (
    Scope,
    compile_columnar_predicate,
    compile_columns,
    compile_expr,
    compile_masked,
    compile_predicate,
    normalise_value,
    value_kind,
)

PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Each example of the enumerating tests checks some forty expressions.
ENUMERATING_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=100)

MISSING = object()
"""Marks a field absent from an event (the key is not there at all)."""


def _search_hook(field: str, query: Any) -> Any:
    text = query.text

    def predicate(value: Any) -> bool:
        # Raises TypeError for numbers: the compiler must contain a failing hook.
        return text in value

    return predicate


SCOPE = Scope(
    streams=frozenset({"txn"}),
    lists={"watch": frozenset({"a", "ab", 3, 2.5})},
    search=_search_hook,
)

INTS = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1, 2**62, 2**63 - 1, -(2**63), 10**12]),
    st.integers(-(2**63), 2**63 - 1),
)
FLOATS = st.one_of(
    st.sampled_from([
        0.0, -0.0, 0.5, 1.0, -2.5, 3.0, 1e308, -1e308, math.inf, -math.inf,
        2.0**53, 2.0**62, -(2.0**63),
    ]),
    st.floats(allow_nan=False),
)
STRINGS = st.sampled_from(["", "a", "ab", "ba", "B", "é", "x y", "A1", "3"])
BOOLS = st.booleans()
TIMESTAMPS = st.integers(1_600_000_000_000, 1_800_000_000_000)
ODD_VALUES = st.sampled_from([
    ["a", "b"], ["ab"], [], {"k": 1}, b"ab", 2**70, -(2**70), np.int64(7), np.float32(1.5),
    np.bool_(True), np.str_("ab"), datetime(2020, 1, 1), np.datetime64("2020-01-01T00:00:01"),
    pd.NA, float("nan"), pd.Timestamp("2021-06-01T12:00:00Z"),
    np.array(["a", "b"], dtype=object),  # a list<string> cell as Arrow converts it
])
MIXED = st.one_of(INTS, FLOATS, STRINGS, BOOLS, ODD_VALUES)

FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "i": INTS, "f": FLOATS, "s": STRINGS, "b": BOOLS, "t": TIMESTAMPS, "m": MIXED,
}
NEVER_PRESENT = "z"


def _cell(values: st.SearchStrategy[Any], name: str) -> st.SearchStrategy[Any]:
    nulls = [st.none(), st.just(MISSING)]
    if name == "f":
        nulls.append(st.just(float("nan")))
    return st.one_of(values, values, *nulls)


ROWS = st.lists(
    st.fixed_dictionaries({name: _cell(values, name) for name, values in FIELDS.items()}),
    min_size=0, max_size=7,
)

# builds() rather than map(): Hypothesis spreads a map over one_of's branches, which would let
# the many literal branches crowd out field references in one_of(FIELD_REFS, LITERALS).
LITERALS = st.builds(
    Literal,
    st.one_of(INTS, FLOATS, STRINGS, BOOLS, st.none(), st.sampled_from([1.5, 2, 0, -1])),
)
FIELD_REFS = st.builds(
    FieldRef,
    st.sampled_from([*FIELDS, NEVER_PRESENT]),
    st.sampled_from([None, None, "txn"]),
)
DURATIONS = st.builds(Duration, st.integers(0, 10**8))
# Field references outnumber constants: a subtree without one is folded to a constant.
LEAVES = st.one_of(FIELD_REFS, FIELD_REFS, FIELD_REFS, LITERALS, DURATIONS)
OPERATORS = st.sampled_from(COMPARISON_OPS + ARITHMETIC_OPS + STRING_OPS)


def _extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    binary = st.builds(BinOp, OPERATORS, children, children)
    return st.one_of(
        binary, binary, binary, binary,
        st.builds(BoolOp, st.sampled_from(["and", "or"]),
                  st.lists(children, min_size=2, max_size=3).map(tuple)),
        st.builds(Not, children),
        st.builds(Neg, children),
        st.builds(InValues, children, st.lists(children, min_size=1, max_size=4).map(tuple)),
        st.builds(InValues, children, st.lists(LITERALS, min_size=1, max_size=5).map(tuple)),
        st.builds(InList, children, st.just("watch")),
        st.builds(Between, children, children, children),
        st.builds(IsNull, children, st.booleans()),
        st.builds(Matches, children, st.sampled_from(["a", "^a", "b$", "[0-9]", "é|y", ""])),
        st.builds(Call, st.sampled_from(["lower", "upper", "abs", "hours", "minutes", "length",
                                         "concat"]),
                  st.tuples(children)),
        st.builds(Call, st.sampled_from(["index_of", "substring", "item", "concat"]),
                  st.tuples(children, children)),
        st.builds(Call, st.sampled_from(["index_of", "substring", "between", "concat"]),
                  st.tuples(children, children, children)),
        st.builds(Call, st.just("between"), st.tuples(children, children, children, children)),
        st.builds(Call, st.just("between"),
                  st.tuples(children, children, children, children, children)),
        # The element name shadows nothing in the events: reading it elsewhere reads null.
        st.builds(Quantified, st.sampled_from(["any", "count"]), st.just("el"),
                  st.builds(FieldRef, st.sampled_from(["m", "s", NEVER_PRESENT])),
                  st.one_of(children, st.builds(BinOp, OPERATORS, st.just(FieldRef("el")),
                                                children))),
        st.builds(Call, st.just("distance_km"), st.tuples(children, children, children, children)),
        st.builds(
            lambda field, text: Search(field, SearchTerm(None, text), text),
            st.sampled_from(["s", "m", "i", NEVER_PRESENT]), st.sampled_from(["a", "b", ""]),
        ),
    )


EXPRESSIONS = st.recursive(LEAVES, _extend, max_leaves=10)


def _events(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if v is not MISSING} for row in rows]


def _frame(rows: list[dict[str, Any]], typed: bool, drop_empty: bool) -> pd.DataFrame:
    """The batch an engine would build from ``rows``: plain object columns, or pandas'
    nullable dtypes where a column's values allow them."""
    columns: dict[str, pd.Series] = {}
    for name in FIELDS:
        cells = [None if row[name] is MISSING else row[name] for row in rows]
        if drop_empty and all(c is None for c in cells):
            continue  # a field no event has may be absent from the batch altogether
        series = pd.Series(cells, dtype=object)
        if typed:
            present = [c for c in cells if normalise_value(c) is not None]
            if name in ("i", "t"):
                series = pd.Series(cells, dtype="Int64")
            elif name == "f":
                series = pd.Series([np.nan if c is None else c for c in cells], dtype=np.float64)
            elif name == "s":
                series = pd.Series(cells, dtype="string")
            elif name == "b" and len(present) == len(cells):
                series = pd.Series(cells, dtype=bool)
            elif name == "b":
                series = pd.Series(cells, dtype="boolean")
        columns[name] = series
    return pd.DataFrame(columns, index=pd.RangeIndex(len(rows)))


def _same(row_value: Any, column_value: Any) -> bool:
    a, b = normalise_value(row_value), normalise_value(column_value)
    if value_kind(a) != value_kind(b) or type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isinf(a):
        return a == b
    return bool(a == b)


def _subexpressions(expr: Expr) -> list[Expr]:
    """``expr`` and every expression inside it, each checked on its own: a small operator
    deep inside a tree would otherwise rarely decide the tree's value."""
    found: list[Expr] = []

    def visit(node: Any) -> None:
        if node not in found:
            found.append(node)
        for name in node.__dataclass_fields__:
            child = getattr(node, name)
            children = child if isinstance(child, tuple) else (child,)
            for c in children:
                if isinstance(c, Expr.__args__):
                    visit(c)

    visit(expr)
    return found


def _assert_agree(expr: Expr, events: list[dict[str, Any]], frame: pd.DataFrame) -> None:
    evaluate = compile_expr(expr, SCOPE)
    predicate = compile_predicate(expr, SCOPE)
    row_values = [evaluate(event) for event in events]
    row_tests = [predicate(event) for event in events]
    assert all(type(t) is bool for t in row_tests)

    column_values = compile_columns(expr, SCOPE)(frame)
    column_tests = compile_columnar_predicate(expr, SCOPE)(frame)
    masked = compile_masked(expr, SCOPE)(frame)

    assert column_values.shape == (len(events),)
    assert column_tests.dtype == np.bool_ and column_tests.shape == (len(events),)
    for i, event in enumerate(events):
        context = (expr, i, event, row_values[i])
        assert _same(row_values[i], column_values[i]), (*context, column_values[i])
        assert row_tests[i] == bool(column_tests[i]), context
        assert bool(masked.valid[i]) == (row_values[i] is not None), context
        if masked.valid[i]:
            assert _same(row_values[i], masked.values[i]), (*context, masked.values[i])


@PROPERTY_SETTINGS
@given(expr=EXPRESSIONS, rows=ROWS, typed=st.booleans(), drop_empty=st.booleans())
def test_row_and_column_evaluators_agree(
    expr: Expr, rows: list[dict[str, Any]], typed: bool, drop_empty: bool
) -> None:
    events = _events(rows)
    frame = _frame(rows, typed, drop_empty)
    for sub in _subexpressions(expr):
        _assert_agree(sub, events, frame)


OPERANDS = st.one_of(FIELD_REFS, FIELD_REFS, LITERALS, DURATIONS)


@ENUMERATING_SETTINGS
@given(left=OPERANDS, right=OPERANDS, rows=ROWS, typed=st.booleans())
def test_every_binary_form_agrees(
    left: Expr, right: Expr, rows: list[dict[str, Any]], typed: bool
) -> None:
    # Every operator, both ways round, on the same operands: each kernel meets every pairing
    # of column kinds, nulls, placeholders under nulls, and constants.
    events, frame = _events(rows), _frame(rows, typed, drop_empty=True)
    for a, b in ((left, right), (right, left)):
        for op in COMPARISON_OPS + ARITHMETIC_OPS + STRING_OPS:
            _assert_agree(BinOp(op, a, b), events, frame)
        _assert_agree(InValues(a, (b, Literal("a"), Literal(3))), events, frame)
        _assert_agree(Between(a, b, Literal(2**62)), events, frame)
        _assert_agree(Between(a, Literal(-1.5), b), events, frame)


@ENUMERATING_SETTINGS
@given(operand=OPERANDS, rows=ROWS, typed=st.booleans())
def test_every_unary_form_agrees(operand: Expr, rows: list[dict[str, Any]], typed: bool) -> None:
    events, frame = _events(rows), _frame(rows, typed, drop_empty=True)
    forms: list[Expr] = [
        Neg(operand), Not(operand), IsNull(operand), IsNull(operand, negated=True),
        InList(operand, "watch"), Matches(operand, "^a|3"),
        Call("distance_km", (operand, Literal(2.5), Literal(-40), operand)),
        *(Call(f, (operand,)) for f in ("lower", "upper", "abs", "hours", "minutes")),
    ]
    if isinstance(operand, FieldRef):
        forms.append(Search(operand.name, SearchTerm(None, "a"), "a"))
    for form in forms:
        _assert_agree(form, events, frame)


@PROPERTY_SETTINGS
@given(expr=EXPRESSIONS, event=st.dictionaries(st.sampled_from([*FIELDS, NEVER_PRESENT]), MIXED))
def test_predicate_never_raises_on_any_event(expr: Expr, event: dict[str, Any]) -> None:
    # Any value in any field — lists, bytes, huge ints, numpy scalars, datetimes — is handled.
    result = compile_predicate(expr, SCOPE)(event)
    assert type(result) is bool
    compile_expr(expr, SCOPE)(event)


class _Versions:
    """A table reader over ``{key: [(time, row or None), ...]}``: the newest change at or before
    the time (rows are ``(k, v)``), as :class:`cep.tables.VersionedTable` answers."""

    def __init__(self, changes: dict) -> None:
        self.changes = changes

    def position(self, field: str) -> int:
        return ("k", "v").index(field)

    def as_of(self, key: tuple, ts: int):
        seen = [row for at, row in self.changes.get(key, []) if at <= ts]
        return seen[-1] if seen else None

    def values_as_of(self, keys, times, position):
        rows = [None if ts is None or None in key else self.as_of(key, ts)
                for key, ts in zip(keys, times, strict=True)]
        return [None if row is None else True if position is None else row[position]
                for row in rows]


class _At:
    def __init__(self, ts):
        self.ts = ts

    def bound(self, var):
        return []

    def prev(self, n):
        return None

    def time(self):
        return self.ts


@PROPERTY_SETTINGS
@given(
    changes=st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.lists(st.tuples(st.integers(0, 20), st.one_of(
            st.none(), st.builds(lambda k, v: (k, v), st.just("x"), st.none() | st.integers(-3, 9))
        )), max_size=4).map(lambda vs: sorted(vs, key=lambda c: c[0])),
    ),
    rows=st.lists(st.fixed_dictionaries({
        "key": st.none() | st.sampled_from(["a", "b", "c", "d"]),
        "ts": st.integers(0, 25),
    }), min_size=1, max_size=12),
)
def test_a_column_wise_lookup_reads_each_row_as_of_its_time(changes, rows) -> None:
    from query_lang import parse_expr

    table = _Versions({(k,): v for k, v in changes.items()})
    row_scope = Scope(tables={"t": table})
    column_scope = Scope(tables={"t": table}, time_column="ts")
    frame = pd.DataFrame(rows)
    for text in ("lookup(t, key).v", "lookup(t, key) is null", "lookup(t, key).v > 3",
                 "abs(lookup(t, key).v) + 1"):
        expr = parse_expr(text)
        evaluate = compile_expr(expr, row_scope)
        expected = [evaluate(row, _At(row["ts"])) for row in rows]
        got = compile_columns(expr, column_scope)(frame)
        assert [normalise_value(v) for v in got] == expected, text
