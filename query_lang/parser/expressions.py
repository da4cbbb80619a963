"""The grammar rules of expressions and of the search syntax, as transformer methods building
syntax-tree nodes.
"""

from __future__ import annotations

import dataclasses
import re

from lark import Token, v_args

from query_lang import ast
from query_lang.errors import VigilSyntaxError, VigilValueError
from query_lang.lexical import search_number
from query_lang.parser.node_builder import NodeBuilder


@v_args(meta=True)
class ExpressionRules(NodeBuilder):
    """Transformer methods for the expressions and the search syntax of the grammar."""

    # ----------------------------------------------------------------- expressions

    def or_(self, meta, children):
        return self._boolop("or", children, meta)

    def and_(self, meta, children):
        return self._boolop("and", children, meta)

    def _boolop(self, op, children, meta):
        if len(children) == 1:
            return children[0]
        operands: list = []
        for c in children:
            operands.extend(c.operands if isinstance(c, ast.BoolOp) and c.op == op else [c])
        return ast.BoolOp(op, tuple(operands), self._span(meta))

    def not_(self, meta, children):
        return ast.Not(children[0], self._span(meta))

    def compare(self, meta, children):
        left, op, right = children
        return ast.BinOp(str(op), left, right, self._span(meta))

    def string_test(self, meta, children):
        left, op, right = children
        return ast.BinOp(str(op).lower(), left, right, self._span(meta))

    def in_values(self, meta, children):
        operand, *values = children
        return ast.InValues(operand, tuple(values), self._span(meta))

    def in_list(self, meta, children):
        # `x in a.b` (a dotted name) only reads a json list inside any()/count(); elsewhere
        # the checks refuse the name as a list.
        return ast.InList(children[0], ".".join(map(str, children[1:])), self._span(meta))

    def between(self, meta, children):
        return ast.Between(children[0], children[1], children[2], self._span(meta))

    def is_null(self, meta, children):
        return ast.IsNull(children[0], False, self._span(meta))

    def is_not_null(self, meta, children):
        return ast.IsNull(children[0], True, self._span(meta))

    def matches(self, meta, children):
        operand, regex = children
        return ast.Matches(
            operand, _regex_body(str(regex)), self._span(meta), pattern_span=self._span(regex)
        )

    def arith(self, meta, children):
        left = children[0]  # a single operand passes through unchanged
        for i in range(1, len(children), 2):
            op, right = children[i], children[i + 1]
            span = ast.Span(
                self.path, left.span.line, left.span.column, right.span.end_line,
                right.span.end_column,
            )
            left = ast.BinOp(str(op), left, right, span)
        return left

    def neg(self, meta, children):
        operand = children[0]
        if isinstance(operand, ast.Literal) and isinstance(operand.value, int | float) and not (
            isinstance(operand.value, bool)
        ):
            return ast.Literal(-operand.value, self._span(meta))
        return ast.Neg(operand, self._span(meta))

    def number(self, meta, children):
        text = str(children[0])
        value: int | float = float(text) if any(c in text for c in ".eE") else int(text)
        return ast.Literal(value, self._span(meta))

    def string(self, meta, children):
        return ast.Literal(self._string(children[0]), self._span(meta))

    def duration(self, meta, children):
        return self._duration(children[0])

    def true(self, meta, children):
        return ast.Literal(True, self._span(meta))

    def false(self, meta, children):
        return ast.Literal(False, self._span(meta))

    def null(self, meta, children):
        return ast.Literal(None, self._span(meta))

    def field(self, meta, children):
        return ast.FieldRef(str(children[0]), None, self._span(meta))

    def qualified_field(self, meta, children):
        return _dotted([str(c) for c in children], self._span(meta))

    def call(self, meta, children):
        name, *args = children
        args = [a for a in args if a is not None]
        func = str(name)
        span = self._span(meta)
        lowered = func.lower()
        if lowered == "prev":
            return self._prev(args, span, meta)
        if lowered == "search":
            return self._search(args, span, meta)
        if lowered == "lookup":
            return self._lookup(args, None, span, meta)
        if lowered in ("first", "last"):
            raise self._error(
                VigilSyntaxError,
                f"{lowered}(v) names an event; read one of its fields, as in {lowered}(v).amount",
                meta,
            )
        return ast.Call(lowered, tuple(args), span)

    def quantified(self, meta, children):
        name, head, condition = children
        func = str(name).lower()
        form = "any(x in tags: condition) or count(x in tags: condition)"
        if func not in ast.QUANTIFIERS:
            raise self._error(
                VigilSyntaxError, f"a condition over a list's elements is written {form}, "
                f"not {func}(...: ...)", meta,
            )
        if not (
            isinstance(head, ast.InList) and isinstance(head.operand, ast.FieldRef)
            and head.operand.qualifier is None
        ):
            raise self._error(
                VigilSyntaxError, f"{func}() names each element and the list field it "
                f"reads: {form}", meta,
            )
        source = _dotted(head.list_name.split("."), head.span)
        return ast.Quantified(func, head.operand.name, source, condition, self._span(meta))

    def call_field(self, meta, children):
        name, *rest = children
        field_name = rest[-1]
        args = [a for a in rest[:-1] if a is not None]
        func = str(name).lower()
        if func == "lookup":
            return self._lookup(args, str(field_name), self._span(meta), meta)
        if func not in ("first", "last"):
            raise self._error(
                VigilSyntaxError,
                "only first(v).field, last(v).field and lookup(table, key).field can be "
                f"followed by '.', not {func}()",
                meta,
            )
        if len(args) != 1 or not (
            isinstance(args[0], ast.FieldRef) and args[0].qualifier is None
        ):
            raise self._error(
                VigilSyntaxError, f"{func}() takes one pattern variable, as in {func}(v).amount",
                meta,
            )
        return ast.VarField(func, args[0].name, str(field_name), self._span(meta))

    def _lookup(self, args, field_name, span, meta):
        if len(args) < 2 or not (isinstance(args[0], ast.FieldRef) and args[0].qualifier is None):
            raise self._error(
                VigilSyntaxError,
                "lookup() takes a table and its key, as in lookup(cards, card_id).home_country",
                meta,
            )
        return ast.Lookup(args[0].name, tuple(args[1:]), field_name, span)

    def _prev(self, args, span, meta):
        if not args or len(args) > 2:
            raise self._error(VigilSyntaxError, "prev() takes a field and an optional count", meta)
        target = args[0]
        if not (isinstance(target, ast.FieldRef) and target.qualifier is None):
            raise self._error(
                VigilSyntaxError, "prev() reads a field of the current stream, as in prev(price)",
                meta,
            )
        n = 1
        if len(args) == 2:
            count = args[1]
            if not (isinstance(count, ast.Literal) and type(count.value) is int):
                raise self._error(
                    VigilSyntaxError, "the count of prev(f, n) must be a whole number", meta
                )
            n = count.value
            if n < 1:
                raise self._error(VigilValueError, "the count of prev(f, n) must be at least 1",
                                  meta)
        return ast.Prev(target.name, n, span)

    def _search(self, args, span, meta):
        if (
            len(args) != 2
            or not (isinstance(args[0], ast.FieldRef) and args[0].qualifier is None)
            or not (isinstance(args[1], ast.Literal) and isinstance(args[1].value, str))
        ):
            raise self._error(
                VigilSyntaxError,
                'search() takes a field and a query in quotes, as in search(body, "acme*")',
                meta,
            )
        text = args[1].value
        at = args[1].span
        query = self._parse_search(text, ast.Span(
            self.path, at.line, at.column, at.end_line, at.end_column
        )) if text.strip() else None
        if query is None:
            raise self._error(VigilSyntaxError, "search() needs a non-empty query", meta)
        return ast.Search(args[0].name, query, text, span)

    # ----------------------------------------------------------------- search

    def s_or(self, meta, children):
        if len(children) == 1:
            return children[0]
        clauses: list = []
        for c in children:
            clauses.extend(c.clauses if isinstance(c, ast.SearchOr) else [c])
        return ast.SearchOr(tuple(clauses), self._span(meta))

    def s_and(self, meta, children):
        if len(children) == 1:
            return children[0]
        clauses: list = []
        for c in children:
            clauses.extend(c.clauses if isinstance(c, ast.SearchAnd) else [c])
        return ast.SearchAnd(tuple(clauses), self._span(meta))

    def s_not(self, meta, children):
        return ast.SearchNot(children[-1], self._span(meta))

    def s_required(self, meta, children):
        return children[-1]

    def s_default_field(self, meta, children):
        return self._search_leaf(None, children[0])

    def s_group_value(self, meta, children):
        return self._search_leaf(None, children[0])

    def s_field(self, meta, children):
        field_tok, value = children
        field_name = str(field_tok)
        if field_name == "_exists_":
            if value.type != "SWORD":
                raise self._error(VigilSyntaxError, "_exists_ takes a field name", value)
            return ast.SearchExists(str(value), self._span(meta))
        return self._search_leaf(field_name, value, start=field_tok)

    def s_field_group(self, meta, children):
        field_tok, group = children
        return _with_field(group, str(field_tok))

    def s_field_range(self, meta, children):
        field_tok, rng = children
        return dataclasses.replace(rng, field=str(field_tok), span=self._span(meta))

    def s_group_range(self, meta, children):
        return children[0]

    def s_range(self, meta, children):
        open_tok, low, high, close_tok = children
        return ast.SearchRange(
            "", low, high, str(open_tok) == "[", str(close_tok) == "]", self._span(meta)
        )

    def s_bound(self, meta, children):
        tok = children[-1]
        if tok.type == "STRING":
            return self._string(tok)
        text = str(tok)
        if text == "*":
            return None
        return search_number(text)

    def s_negative_bound(self, meta, children):
        value = search_number("-" + str(children[0]))
        if isinstance(value, str):
            raise self._error(VigilSyntaxError, "expected a number after '-'", children[0])
        return value

    def s_compare(self, meta, children):
        field_tok, op_tok, value = children
        op = str(op_tok)
        if op in ("==", "!="):
            raise self._error(
                VigilSyntaxError,
                f"use field:value to search for a value (and NOT field:value), not '{op}'",
                op_tok,
            )
        if value is None:
            raise self._error(VigilSyntaxError, "a comparison needs a value, not *", meta)
        return ast.SearchCompare(str(field_tok), op, value, self._span(meta))

    def _search_leaf(self, field_name: str | None, tok: Token, start: Token | None = None):
        span = self._span(start or tok)
        if start is not None:
            span = dataclasses.replace(span, end_line=tok.end_line + self.line_offset,
                                       end_column=tok.end_column)
        text = str(tok)
        if tok.type == "STRING":
            return ast.SearchPhrase(field_name, self._string(tok), span)
        if tok.type == "REGEX":
            return ast.SearchRegex(field_name, _regex_body(text), span)
        wildcards = _unescaped_wildcards(text)
        if not wildcards:
            return ast.SearchTerm(field_name, _unescape_word(text), span)
        if wildcards == [len(text) - 1] and text.endswith("*") and len(text) > 1:
            return ast.SearchPrefix(field_name, _unescape_word(text[:-1]), span)
        return ast.SearchWildcard(field_name, text, span)


def _unescaped_wildcards(word: str) -> list[int]:
    """Positions of the ``*`` and ``?`` in a search word that a backslash does not escape."""
    found, i = [], 0
    while i < len(word):
        if word[i] == "\\":
            i += 2
            continue
        if word[i] in "*?":
            found.append(i)
        i += 1
    return found


def _unescape_word(word: str) -> str:
    """``caf\\*`` -> ``caf*``: a backslash makes the next character literal."""
    return re.sub(r"\\(.)", r"\1", word)


def _regex_body(token_text: str) -> str:
    return token_text[1:-1].replace("\\/", "/")


def _with_field(node, field_name: str):
    """Give every leaf of a field group ``field:(...)`` the group's field."""

    def give_field(found):
        if isinstance(found, ast.SearchAnd | ast.SearchOr | ast.SearchNot):
            return found
        return dataclasses.replace(found, field=field_name)

    return ast.transform(node, give_field)


def _dotted(parts: list[str], span: ast.Span) -> ast.Expr:
    """``a.b`` as a field reference (``a`` a stream, a pattern variable or a json field: the
    checks and the compiler resolve which); each further part a member of a json value."""
    if len(parts) == 1:
        return ast.FieldRef(parts[0], None, span)
    node: ast.Expr = ast.FieldRef(parts[1], parts[0], span)
    for name in parts[2:]:
        node = ast.Member(node, name, span)
    return node
