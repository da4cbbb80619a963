"""The builtin function table is the one signature both the checks and the compiler obey: every
declared signature checks clean and compiles to a value of the declared type, and every other
call is rejected by both or, where only types tell them apart, by the checks."""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd
import pytest

from query_lang import check_program, parse_expr
from query_lang import types as T
from query_lang.compiler import CompileError, compile_columns, compile_expr, value_kind
from query_lang.functions import SCALAR_FUNCTIONS

STREAM = ("stream e (s string, i int, f float, b bool, xs list<string>, j json, ts timestamp, "
          "t0 timestamp) time ts\n")
EVENT = {"s": "Ab", "i": -7, "f": -2.5, "b": True, "xs": ["Ab", "c", "D", "e", "f", "g", "h", "i"],
         "ts": 1_700_000_000_000, "t0": 1_699_999_910_000, "j": {"a": 1, "b": [2]}}

# An argument of each type, and a literal of each type to compare a result with.
ARGUMENT = {T.STRING: "s", T.INT: "i", T.FLOAT: "f", T.TIMESTAMP: "ts", T.DURATION: "(ts - t0)",
            T.BOOL: "b", T.LIST: "xs", T.JSON: "j"}
LITERAL = {T.STRING: '"x"', T.INT: "1", T.FLOAT: "1.5", T.DURATION: "1m", T.TIMESTAMP: "t0",
           T.BOOL: "true"}
# What a value of each type is once compiled.
RUNTIME_KIND = {T.STRING: "str", T.INT: "num", T.FLOAT: "num", T.TIMESTAMP: "num",
                T.DURATION: "num", T.BOOL: "bool", T.LIST: "list", T.JSON: "other"}
# Calls that are null on EVENT whatever their argument types: between(s, s, s) finds no text
# after "Ab" and before another "Ab".
NULL_ON_EVENT = frozenset({"between"})


def argument_counts(name: str) -> range:
    function = SCALAR_FUNCTIONS[name]
    return range(function.minimum, function.arity + (2 if function.variadic else 1))


def declared_calls() -> list[tuple[str, tuple[str, ...]]]:
    return [
        (name, types)
        for name, function in sorted(SCALAR_FUNCTIONS.items())
        for count in argument_counts(name)
        for types in itertools.product(
            *(sorted(accepted) for accepted in function.parameter_types(count))
        )
    ]


def call_text(name: str, types: tuple[str, ...]) -> str:
    return f"{name}({', '.join(ARGUMENT[t] for t in types)})"


def check_errors(condition: str) -> list[str]:
    rule = f"rule r from e by s pattern a define a as {condition}\n"
    _, errors = check_program(text=STREAM + rule, text_path="f.vigil")
    return [e.message for e in errors]


def evaluate(text: str) -> Any:
    return compile_expr(parse_expr(text))(EVENT)


def test_every_function_has_a_summary_of_its_arity() -> None:
    for name, function in SCALAR_FUNCTIONS.items():
        assert function.summary.startswith(f"{name}(")
        assert function.summary.count(",") == function.arity - 1 + function.variadic
        assert function.summary.endswith(", ...)") == function.variadic
        assert len(function.kinds) == function.arity


@pytest.mark.parametrize(("name", "types"), declared_calls(), ids=lambda v: str(v))
def test_declared_signature_checks_and_compiles_to_its_declared_type(
    name: str, types: tuple[str, ...]
) -> None:
    function = SCALAR_FUNCTIONS[name]
    result_type = function.result_type(types)
    text = call_text(name, types)
    # Comparing with a literal of the declared result type checks clean only when the checker
    # gives the call that type (a list has no literal: `contains` takes a list or a string).
    if result_type == T.LIST:
        assert check_errors(f"{text} contains \"x\"") == []
        assert check_errors(f"{text} == \"x\"") != []
    else:
        assert check_errors(f"{text} == {LITERAL[result_type]}") == []
    result = evaluate(text)
    if name not in NULL_ON_EVENT:
        assert result is not None, text
        assert value_kind(result) == RUNTIME_KIND[result_type], (text, result)
    column = compile_columns(parse_expr(text))(pd.DataFrame([EVENT]))
    assert column.tolist() == [result]


@pytest.mark.parametrize("name", sorted(SCALAR_FUNCTIONS))
def test_a_wrong_number_of_arguments_is_rejected_by_both(name: str) -> None:
    function = SCALAR_FUNCTIONS[name]
    wrong = [function.minimum - 1] + ([] if function.variadic else [function.arity + 1])
    for count in wrong:
        text = f"{name}({', '.join(['f'] * count)})"
        assert check_errors(f"{text} is null") == [
            f"{name}() takes {function.arity_text} argument(s), got {count}"
        ]
        with pytest.raises(CompileError, match=rf"takes {function.arity_text} argument"):
            compile_expr(parse_expr(text))


@pytest.mark.parametrize("name", sorted(SCALAR_FUNCTIONS))
def test_an_undeclared_argument_type_is_rejected_by_the_checks(name: str) -> None:
    function = SCALAR_FUNCTIONS[name]
    for position, accepted in enumerate(function.accepts):
        # (a json value's type is known at run time only: every function takes it)
        for wrong in sorted(set(ARGUMENT) - accepted - T.DYNAMIC):
            types = [sorted(a)[0] for a in function.accepts]
            types[position] = wrong
            text = call_text(name, tuple(types))
            errors = check_errors(f"{text} is null")
            assert len(errors) == 1 and errors[0].startswith(f"{name}() needs "), (text, errors)
            if RUNTIME_KIND[wrong] not in function.kinds[position]:
                # The compiled kernel cannot take it either: the call is null.
                assert evaluate(text) is None, text


@pytest.mark.parametrize(("address", "network", "inside"), [
    ("10.1.2.3", "10.0.0.0/8", True), ("11.0.0.1", "10.0.0.0/8", False),
    ("FE80::1", "fe80::/10", True), ("fec0::1", "fe80::/10", False),
    ("::ffff:10.0.0.1", "10.0.0.0/8", False), ("host", "10.0.0.0/8", False),
    ("10.1.2.3", "not a network", False), ("10.1.2.3", "10.1.2.3", True),
])
def test_cidr_match_row_and_column_agree(address: str, network: str, inside: bool) -> None:
    event = {**EVENT, "s": address}
    for text in (f"cidr_match(s, {network!r})", "cidr_match(s, n)"):
        row = compile_expr(parse_expr(text))({**event, "n": network})
        column = compile_columns(parse_expr(text))(pd.DataFrame([{**event, "n": network}] * 2))
        assert row is inside and column.tolist() == [inside, inside], text
