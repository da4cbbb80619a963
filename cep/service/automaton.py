"""A registered rule's compiled automaton as a picture: the DOT of ``vigil explain --format
dot`` (:func:`cep.nfa.to_dot`), with a legend of the conditions its transitions take, drawn as
SVG by Graphviz's ``dot`` on the server."""

from __future__ import annotations

import shutil
import subprocess

from cep.engine.program import compile_program_rule, empty_tables, load_list
from cep.nfa import to_dot
from cep.service.problems import Problem
from query_lang import Program, VigilError, ast, print_expr

__all__ = ["DOT_TIMEOUT_S", "automaton_dot", "automaton_svg"]

DOT_TIMEOUT_S = 20.0
"""How long ``dot`` may take to draw one automaton."""


def automaton_dot(program: Program, name: str) -> str:
    """The DOT of rule ``name`` of ``program`` (404 when ``name`` is no rule of it)."""
    rule = program.rules.get(name)
    if rule is None:
        what = ("a query" if name in program.queries else "a metric" if name in program.metrics
                else None)
        detail = (f"'{name}' is {what}: only a rule has an automaton" if what
                  else f"no rule named '{name}' is registered")
        raise Problem(404, "Not found", detail, kind="not-found")
    try:
        lists = {list_name: load_list(decl) for list_name, decl in program.lists.items()}
        tables = empty_tables(program.tables, program.streams)
        dot = to_dot(compile_program_rule(rule, program.streams, lists, tables=tables))
    except VigilError as err:  # the registry checked it: a limit only compiling finds
        raise Problem(400, "The rule does not compile", err.message,
                      kind="invalid-program") from None
    return _with_legend(dot, rule)


def _with_legend(dot: str, rule: ast.RuleDecl) -> str:
    """``dot`` with a note beside the automaton: the condition of each pattern variable (the
    edges are labelled with the variables) and the rule's time limit."""
    lines = [f"{d.var}: {_condition(d)}" for d in rule.defines]
    if rule.within is not None:
        lines.append(f"within {ast.print_duration(rule.within)}")
    if not lines:
        return dot
    label = "".join(_escaped(line) + "\\l" for line in lines)
    note = f'  legend [shape=note, fontsize=11, label="{label}"];'
    head, _, tail = dot.rpartition("}")
    return f"{head}{note}\n}}{tail}"


def _condition(define: ast.Define) -> str:
    body = print_expr(define.condition) if define.condition is not None else "true"
    return f"{define.stream} where {body}" if define.stream is not None else body


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def automaton_svg(dot_text: str) -> str:
    """``dot_text`` drawn by ``dot -Tsvg``; 503 when Graphviz is not installed."""
    dot = shutil.which("dot")
    if dot is None:
        raise Problem(503, "Graphviz is not installed",
                      "drawing an automaton needs Graphviz's 'dot' on the server's PATH "
                      "(Debian: apt-get install graphviz); the DOT text is at "
                      "automaton.dot", kind="tool-missing")
    try:
        done = subprocess.run([dot, "-Tsvg"], input=dot_text.encode("utf-8"),
                              capture_output=True, timeout=DOT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise Problem(503, "Graphviz took too long", f"dot ran over {DOT_TIMEOUT_S:.0f} s",
                      kind="tool-failed") from None
    if done.returncode != 0:
        raise Problem(503, "Graphviz failed", done.stderr.decode("utf-8", "replace")[:500],
                      kind="tool-failed")
    return done.stdout.decode("utf-8")
