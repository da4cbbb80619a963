"""The semantic checks of a whole program: every declaration checked against the names of all
the others, every error collected and sorted by position.
"""

from __future__ import annotations

from collections.abc import Iterable

from query_lang import ast
from query_lang.checks.context import ProgramContext
from query_lang.checks.declarations import check_metric, check_query, check_stream, check_table
from query_lang.checks.rules import check_rule
from query_lang.errors import VigilError
from query_lang.limits import declaration_limit_errors


def check_declarations(
    declarations: Iterable[ast.Declaration],
    sources: dict[str, str] | None = None,
    *,
    known: Iterable[ast.Declaration] = (),
) -> list[VigilError]:
    """Every semantic error of a program, sorted by position.

    ``sources`` (file -> text) lets errors about clause values point at the exact name.
    ``known`` are declarations already checked together (a running engine's): their names are
    in scope for ``declarations``, which alone are checked — so adding one declaration to
    thousands costs the one.

    Examples
    --------
    >>> from query_lang import parse
    >>> module = parse(
    ...     "stream s (x int, ts timestamp)\\nrule r from s pattern a b define c as x > 1\\n"
    ... )
    >>> [e.message for e in check_declarations(module.declarations)]
    ["variable 'c' is defined but does not appear in the pattern"]
    """
    known = list(known)
    ctx = ProgramContext([*known, *declarations], sources)
    ctx.collect_names()
    for decl in ctx.declarations[len(known):]:
        # The compilers refuse what is over a limit (query_lang.limits): report it here too.
        over = declaration_limit_errors(decl)
        ctx.errors.extend(over)
        if any(e.limit == "MAX_NESTING_DEPTH" for e in over):
            continue  # the checks below walk expressions recursively
        if isinstance(decl, ast.StreamDecl):
            check_stream(ctx, decl)
        elif isinstance(decl, ast.TableDecl):
            check_table(ctx, decl)
        elif isinstance(decl, ast.RuleDecl):
            check_rule(ctx, decl)
        elif isinstance(decl, ast.QueryDecl):
            check_query(ctx, decl)
        elif isinstance(decl, ast.MetricDecl):
            check_metric(ctx, decl)
    ctx.errors.sort(key=lambda e: (e.file or "", e.line, e.column))
    return ctx.errors
