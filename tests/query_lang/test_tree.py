"""The one tree walker: ``walk`` and ``children`` visit every node of any syntax tree, in
pre-order; ``transform`` rebuilds a tree bottom-up and copies nothing it does not change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from query_lang import ast, parse, parse_expr
from query_lang.ast import BinOp, Call, FieldRef, Literal, Module, Node

FIXTURES = Path(__file__).parent.parent / "fixtures"
COMPLETE = (FIXTURES / "language_complete.vigil").read_text(encoding="utf-8")


def by_hand(node: object) -> list[Node]:
    """Pre-order over every Node held by a dataclass field, tuples included: the reference."""
    found: list[Node] = []

    def visit(value: object) -> None:
        if isinstance(value, Node):
            found.append(value)
            for f in dataclasses.fields(value):
                if f.name != "span":
                    visit(getattr(value, f.name))
        elif isinstance(value, tuple | list):
            for item in value:
                visit(item)

    visit(node)
    return found


def test_walk_visits_every_node_of_a_whole_program_in_pre_order() -> None:
    module = parse(COMPLETE)
    visited = list(ast.walk(module))
    assert [id(n) for n in visited] == [id(n) for n in by_hand(module)]
    kinds = {type(n).__name__ for n in visited}
    # every family of nodes is reached: declarations, patterns, expressions, search
    assert {"RuleDecl", "Define", "PatQuant", "BinOp", "Call", "QueryDecl", "SearchTerm",
            "MetricDecl", "Window", "EmitItem", "KeyPart", "Duration"} <= kinds
    assert not any(isinstance(n, ast.Span) for n in visited)


def test_children_are_the_direct_nodes_in_field_order() -> None:
    e = parse_expr("x between lower(a) and b + 1")
    assert [type(c).__name__ for c in ast.children(e)] == ["FieldRef", "Call", "BinOp"]
    assert list(ast.children(FieldRef("x"))) == []


def test_descend_prunes_below_a_node_but_still_yields_it() -> None:
    e = parse_expr("count(v) > 1 and sum(v.amount) > x")
    names = [
        type(n).__name__
        for n in ast.walk(e, descend=lambda n: not isinstance(n, Call))
    ]
    assert names == ["BoolOp", "BinOp", "Call", "Literal", "BinOp", "Call", "FieldRef"]


def test_walk_goes_into_the_query_of_search() -> None:
    e = parse_expr('search(body, "acme* AND NOT fraud")')
    assert [type(n).__name__ for n in ast.walk(e)] == [
        "Search", "SearchAnd", "SearchPrefix", "SearchNot", "SearchTerm",
    ]


def test_transform_that_changes_nothing_returns_the_same_tree() -> None:
    module = parse(COMPLETE)
    assert ast.transform(module, lambda n: n) is module


def test_transform_is_bottom_up_and_keeps_spans() -> None:
    e = parse_expr("abs(x) + x")
    seen: list[str] = []

    def rename(n: Node) -> Node:
        seen.append(type(n).__name__)
        return dataclasses.replace(n, name="y") if isinstance(n, FieldRef) else n

    result = ast.transform(e, rename)
    assert seen == ["FieldRef", "Call", "FieldRef", "BinOp"]
    assert result == parse_expr("abs(y) + y")
    assert result.span == e.span and result.left.span == e.left.span


def test_transform_replaces_whole_subtrees_in_tuples() -> None:
    module = parse(COMPLETE)

    def fold(n: Node) -> Node:
        if isinstance(n, BinOp) and n.op == "+" and all(
            isinstance(side, Literal) and type(side.value) is int for side in (n.left, n.right)
        ):
            return Literal(n.left.value + n.right.value, n.span)
        return n

    e = parse_expr("f(1 + 2, x + (3 + 4))")
    assert ast.transform(e, fold) == parse_expr("f(3, x + 7)")
    rebuilt = ast.transform(module, fold)
    assert isinstance(rebuilt, Module) and rebuilt.path == module.path
