"""Parsing source text: a whole file one top-level block at a time (so one syntax error does not
hide the errors of the blocks after it), a single expression, or search text.
"""

from __future__ import annotations

import copy
import dataclasses
import re

from lark.exceptions import VisitError

from query_lang import ast
from query_lang.errors import ErrorList, VigilError
from query_lang.limits import nesting_errors
from query_lang.parser import comments
from query_lang.parser.declarations import DeclarationRules
from query_lang.parser.expressions import ExpressionRules
from query_lang.parser.grammar import run_parser

# Tokens that start a top-level block: a parse resumes here after a syntax error.
_BLOCK_START = re.compile(
    r"^[ \t]*(?:(?:rule|query|metric|stream|list|webhook)[ \t]+[A-Za-z_]|include[ \t]+[\"'])",
    re.IGNORECASE | re.MULTILINE,
)


def parse(text: str, path: str = "<string>") -> ast.Module:
    """Parse a whole file into a :class:`~query_lang.ast.Module`.

    Raises
    ------
    ErrorList
        With every syntax error of the file (one per broken top-level block).

    Examples
    --------
    >>> module = parse(
    ...     "stream txn (card string, amount float, ts timestamp) time ts\\n"
    ...     "rule big from txn by card pattern a+ define a as amount > 500\\n"
    ... )
    >>> [type(d).__name__ for d in module.declarations]
    ['StreamDecl', 'RuleDecl']
    >>> module.declarations[1].pattern
    PatQuant(inner=PatVar(name='a'), min=1, max=None, greedy=True)
    >>> try:
    ...     parse("rule r from txn pattern")
    ... except ErrorList as err:
    ...     print(err.errors[0])
    <string>:1:24: unexpected end of the block; expected a name, '!' or '('
    """
    module, errors = parse_recovering(text, path)
    if errors:
        raise ErrorList(errors)
    return module


def parse_recovering(text: str, path: str = "<string>") -> tuple[ast.Module, list[VigilError]]:
    """Parse what can be parsed; return the module of the good blocks and the errors of the bad.

    Each top-level block is parsed on its own (it starts at a line that opens with ``rule``,
    ``query``, ``metric``, ``stream``, ``list``, ``webhook`` or ``include``), so an error
    resynchronises at the next block. The comments of the good blocks are kept in
    :attr:`~query_lang.ast.Module.comments`, placed for the printer.
    """
    declarations: list[ast.Declaration] = []
    layouts: list[list[comments.LineSource]] = []
    found: list[comments.FoundComment] = []
    errors: list[VigilError] = []
    line_offset = counted = 0
    for start, end in _block_bounds(text):
        chunk = text[start:end]
        if not chunk.strip():
            continue
        # Lines before the block, counted on from the previous block (not from the top of the
        # file each time: that made loading n blocks quadratic).
        line_offset += text.count("\n", counted, start)
        counted = start
        if _only_comments(chunk):
            found.extend(comments.found_in_comment_lines(chunk, line_offset))
            continue
        tokens: list = []
        try:
            built, built_layouts = _parse_start(chunk, path, line_offset, text, tokens)
        except VigilError as err:
            errors.append(err)
            continue
        declarations.extend(built)
        layouts.extend(built_layouts)
        found.extend(comments.found_in_tokens(tokens, chunk, line_offset))
    module = ast.Module(
        tuple(declarations),
        path=path,
        span=ast.Span(path, 1, 1, 1, 1),
        comments=comments.attach(found, layouts, text, path),
    )
    return module, errors


def parse_expr(text: str, path: str = "<string>") -> ast.Expr:
    """Parse a single expression (used by the API and by tests).

    Examples
    --------
    >>> parse_expr("amount > 500 and country in risky")
    BoolOp(op='and', operands=(BinOp(op='>', left=FieldRef(name='amount', qualifier=None), \
right=Literal(value=500)), InList(operand=FieldRef(name='country', qualifier=None), \
list_name='risky')))
    """
    tree = run_parser(text, "expr", path, 0, text)
    return _within_limits(_transform(tree, path, 0, text), text)


def parse_search(
    text: str, path: str = "<string>", *, at: ast.Span | None = None
) -> ast.SearchNode:
    """Parse the search syntax of ``query ... match`` (also the text of ``search(f, "...")``).

    ``at`` is where the text sits inside a rule file, so errors point into that file.
    """
    line_offset = (at.line - 1) if at else 0
    column_offset = at.column if at else 0
    try:
        tree = run_parser(text, "search_query", path, line_offset, text)
        return _within_limits(_transform(tree, path, line_offset, text), text)
    except VigilError as err:
        if at is not None and err.span is not None:
            # point into the string literal: same line, shifted by the literal's column
            same_line = err.span.line == at.line
            column = err.span.column + column_offset if same_line else err.span.column
            moved = copy.copy(err)
            moved.span, moved.source = dataclasses.replace(err.span, column=column), None
            raise moved from None
        raise


def _block_bounds(text: str) -> list[tuple[int, int]]:
    starts = [m.start() for m in _BLOCK_START.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    bounds = list(zip(starts, starts[1:] + [len(text)], strict=True))
    return bounds


def _only_comments(chunk: str) -> bool:
    return all(not ln.strip() or ln.strip().startswith("#") for ln in chunk.splitlines())


def _parse_start(
    chunk: str, path: str, line_offset: int, full_text: str, tokens: list
) -> tuple[list, list[list[comments.LineSource]]]:
    """The declarations of ``chunk`` and where the code of their printed lines came from; its
    COMMENT tokens are appended to ``tokens``."""
    tree = run_parser(chunk, "start", path, line_offset, full_text, tokens)
    builder = _ToAst(path, line_offset, full_text)
    declarations = _transform(tree, path, line_offset, full_text, builder)
    for declaration in declarations:
        _within_limits(declaration, full_text)
    return list(declarations), builder.layouts


def _within_limits(node, full_text: str):
    """``node``, unless its tree nests deeper than the limit: everything after the parser
    (checks, printer, compilers) walks trees recursively, so a deeper one never leaves it."""
    for error in nesting_errors(node, getattr(node, "span", None)):
        error.source = full_text
        raise error
    return node


def _transform(tree, path: str, line_offset: int, full_text: str, builder=None):
    try:
        return (builder or _ToAst(path, line_offset, full_text)).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, VigilError):
            raise err.orig_exc from None
        raise


class _ToAst(DeclarationRules, ExpressionRules):
    """The transformer with every rule of the grammar."""

    def _parse_search(self, text: str, at: ast.Span) -> ast.SearchNode:
        return parse_search(text, self.path, at=at)
