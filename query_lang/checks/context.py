"""The program under check: its declarations by kind and name, the errors found so far, and the
checks that every kind of declaration shares (its streams, its webhooks, its output names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from query_lang import ast
from query_lang import types as T
from query_lang.checks.expressions import ExpressionScope, ExpressionTypes, TableShape
from query_lang.errors import VigilError, VigilNameError, VigilValueError


class ProgramContext:
    """A whole program (all files with their includes) being checked, and every error found."""

    def __init__(
        self, declarations: Iterable[ast.Declaration], sources: dict[str, str] | None = None
    ):
        self.declarations = list(declarations)
        self.sources = sources or {}
        self.errors: list[VigilError] = []
        self.streams: dict[str, ast.StreamDecl] = {}
        self.lists: dict[str, ast.ListDecl] = {}
        self.tables: dict[str, ast.TableDecl] = {}
        self.webhooks: dict[str, ast.WebhookDecl] = {}
        self.standing: dict[str, ast.Node] = {}
        self.types = ExpressionTypes(self.error)

    def error(self, cls: type[VigilError], message: str, node_or_span) -> None:
        span = node_or_span if isinstance(node_or_span, ast.Span) else node_or_span.span
        self.errors.append(cls(message, span))

    def collect_names(self) -> None:
        tables = (
            (ast.StreamDecl, self.streams, "stream"),
            (ast.ListDecl, self.lists, "list"),
            (ast.TableDecl, self.tables, "table"),
            (ast.WebhookDecl, self.webhooks, "webhook"),
        )
        for decl in self.declarations:
            for cls, table, kind in tables:
                if isinstance(decl, cls):
                    self._declare(table, decl, kind)
            if isinstance(decl, ast.RuleDecl | ast.QueryDecl | ast.MetricDecl):
                self._declare(self.standing, decl, "rule, query or metric")

    def find(self, decl, keyword: str, name: str) -> ast.Span:
        """The position of ``name`` after ``keyword`` inside ``decl``'s text (clause values
        such as ``notify a, b`` are plain names in the tree and carry no position)."""
        span = decl.span
        text = self.sources.get(span.file)
        if text and span.line:
            lines = text.splitlines()
            pattern = re.compile(
                rf"\b{re.escape(keyword)}\b[^#]*?\b({re.escape(name)})\b", re.IGNORECASE
            )
            for number in range(span.line, min(span.end_line or span.line, len(lines)) + 1):
                match = pattern.search(lines[number - 1])
                if match:
                    column = match.start(1) + 1
                    return ast.Span(span.file, number, column, number, column + len(name))
        return span

    def _declare(self, table: dict, decl, kind: str) -> None:
        earlier = table.get(decl.name)
        if earlier is not None:
            where = f"{earlier.span.file}:{earlier.span.line}"
            self.error(
                VigilNameError, f"duplicate {kind} name '{decl.name}' (first declared at {where})",
                decl,
            )
            return
        table[decl.name] = decl

    def stream_fields(self, name: str) -> dict[str, str]:
        s = self.streams.get(name)
        if s is None:
            return {}
        fields = {f.name: T.from_field_type(f.type) for f in s.fields}
        device = s.device_time_field
        if device is not None:
            # The device's reading of the time field: of the time field's type.
            stamp = T.from_field_type("timestamp")
            fields.setdefault(device, fields.get(s.time_field or "", stamp))
        return fields

    def table_shapes(self) -> dict[str, TableShape]:
        """What ``lookup`` may read: each declared table whose stream is declared."""
        shapes = {}
        for name, table in self.tables.items():
            fields = self.stream_fields(table.stream)
            if table.stream in self.streams:
                key = tuple((k, fields.get(k, T.ANY)) for k in table.key)
                row = {f: t for f, t in fields.items() if f != table.op_field}
                shapes[name] = TableShape(key, row)
        return shapes

    def check_from(self, decl) -> list[str]:
        known = []
        seen = set()
        for name in decl.streams:
            if name in seen:
                self.error(VigilNameError, f"stream '{name}' is listed twice in 'from'", decl)
            seen.add(name)
            if name not in self.streams:
                self.error(
                    VigilNameError, f"undeclared stream '{name}'", self.find(decl, "from", name)
                )
            else:
                known.append(name)
                if event_time_field(self.streams[name]) is None:
                    kind = type(decl).__name__.removesuffix("Decl").lower()
                    self.error(
                        VigilNameError,
                        f"{kind} '{decl.name}' reads stream '{name}', which has no event time: "
                        "declare `time FIELD`",
                        self.find(decl, "from", name),
                    )
        return known

    def check_notify(self, decl) -> None:
        for hook in decl.notify:
            if hook not in self.webhooks:
                self.error(
                    VigilNameError, f"undeclared webhook '{hook}' in notify",
                    self.find(decl, "notify", hook),
                )
        if decl.throttle is not None and decl.throttle.ms <= 0:
            self.error(VigilValueError, "throttle must be longer than zero", decl.throttle)

    def check_items(self, items, scope: ExpressionScope, clause: str) -> None:
        for item in items:
            self.types.expr_type(item.expr, scope)
        self.check_unique_names(items, clause)

    def check_unique_names(self, items, clause: str) -> None:
        seen = set()
        for item in items:
            name = item.name
            if name in seen:
                self.error(
                    VigilNameError, f"{clause} produces '{name}' twice; rename one with 'as'", item
                )
            seen.add(name)


def event_time_field(stream: ast.StreamDecl) -> str | None:
    """The field that holds a stream's event time: the one ``time`` names, else its only
    ``timestamp`` field, else None (rules, queries and metrics cannot read the stream).

    Examples
    --------
    >>> from query_lang import parse
    >>> [event_time_field(s) for s in parse(
    ...     "stream a (at timestamp)\\nstream b (n int, at int) time at\\nstream c (n int)\\n"
    ... ).declarations]
    ['at', 'at', None]
    """
    if stream.time_field is not None:
        return stream.time_field
    stamps = [f.name for f in stream.fields if f.type == "timestamp"]
    return stamps[0] if len(stamps) == 1 else None


def union_fields(field_maps: Iterable[dict[str, str]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for fields in field_maps:
        for name, t in fields.items():
            merged.setdefault(name, t)
    return merged
