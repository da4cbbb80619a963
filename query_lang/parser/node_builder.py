"""The base of the transformer from Lark's tree to syntax-tree nodes: the source span of a token
or a tree node, and errors raised at one.
"""

from __future__ import annotations

from lark import Token
from lark.visitors import Transformer_NonRecursive

from query_lang import ast
from query_lang.errors import VigilError
from query_lang.lexical import duration_ms, unescape
from query_lang.parser.comments import LineSource


class NodeBuilder(Transformer_NonRecursive):
    """Lark tree -> frozen AST dataclasses, with source spans; the grammar's rules are
    :class:`~query_lang.parser.declarations.DeclarationRules` and
    :class:`~query_lang.parser.expressions.ExpressionRules`.

    Non-recursive: Lark's tree nests several levels for each level of the text (a pattern's
    group is an alternation of sequences of quantified items), deeper than Python's stack
    allows long before the text reaches :data:`~query_lang.limits.MAX_NESTING_DEPTH`."""

    def __init__(self, path: str, line_offset: int, source: str):
        super().__init__()
        self.path = path
        self.line_offset = line_offset
        self.source = source
        # where the code of each printed line came from, one list per declaration built, in
        # order: the comments are placed by it
        self.layouts: list[list[LineSource]] = []

    def _span(self, meta) -> ast.Span:
        if isinstance(meta, Token):
            return ast.Span(
                self.path,
                meta.line + self.line_offset,
                meta.column,
                (meta.end_line or meta.line) + self.line_offset,
                meta.end_column or meta.column,
            )
        if getattr(meta, "empty", True):
            return ast.Span(self.path, 0, 0, 0, 0)
        return ast.Span(
            self.path,
            meta.line + self.line_offset,
            meta.column,
            meta.end_line + self.line_offset,
            meta.end_column,
        )

    def _error(self, cls, message: str, where) -> VigilError:
        return cls(message, self._span(where), self.source)

    def _duration(self, tok: Token) -> ast.Duration:
        return ast.Duration(duration_ms(str(tok)), self._span(tok))

    @staticmethod
    def _string(tok: Token) -> str:
        return unescape(str(tok)[1:-1])

    def _parse_search(self, text: str, at: ast.Span) -> ast.SearchNode:
        """Parse the query text of ``search(f, "...")``, which sits at ``at`` in the file."""
        raise NotImplementedError  # the transformer that has every rule provides it
