"""``vigil explain`` views of a compiled rule: text and Graphviz DOT."""

from __future__ import annotations

from reference_matcher import rule_decl

from cep.nfa.compiler import compile_rule
from cep.nfa.explain import describe, to_dot
from query_lang import ast
from query_lang.parser import parse


def test_describe_lists_states_edges_and_negations():
    module = parse(
        "stream s (v int)\nstream t (v int)\n"
        "rule r from s, t pattern a !x b+? within 1m define a as s"
    )
    rule = compile_rule(module.of_type(ast.RuleDecl)[0])
    text = describe(rule)
    assert "within 60000 ms" in text
    assert "a (stream s, any event)" in text and "x (negated, any event)" in text
    assert "after a#0 -> TAKE b#1 unless x occurs first" in text
    assert "after b#1 (trailing, reluctant) -> ACCEPT | TAKE b#2" in text


def test_dot_is_a_digraph_with_every_state_and_ranked_edges():
    rule = compile_rule(rule_decl("rule r from s pattern a (b | c) !x within 1m"))
    dot = to_dot(rule)
    assert dot.startswith('digraph "r" {') and dot.endswith("}")
    for state in ("s0", "s1", "s2", "START", "ACCEPT"):
        assert f"  {state} [" in dot
    assert 'START -> s0 [label="1: a"]' in dot
    assert 's0 -> s1 [label="1: b"]' in dot and 's0 -> s2 [label="2: c"]' in dot
    assert 's1 -> ACCEPT [label="1: !x", style=dashed]' in dot
