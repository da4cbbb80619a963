"""Typed syntax tree of the Vigil language: frozen dataclasses that later stages compile.

Every node keeps its source position in ``span``; spans never take part in equality, so a tree
parsed from printed text compares equal to the tree it was printed from.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal as TypingLiteral
from typing import Union


@dataclass(frozen=True)
class Span:
    """Where a node came from: file, 1-based line and column of its start and end."""

    file: str = "<string>"
    line: int = 0
    column: int = 0
    end_line: int = 0
    end_column: int = 0


NO_SPAN = Span()


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Node:
    """Base of every syntax-tree node."""


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Literal(Node):
    """A string, number, boolean or ``null`` constant."""

    value: str | int | float | bool | None
    span: Span = _span()


@dataclass(frozen=True)
class Duration(Node):
    """A duration such as ``10m``; ``ms`` is its length in milliseconds."""

    ms: int
    span: Span = _span()


@dataclass(frozen=True)
class FieldRef(Node):
    """``amount`` (field of the current event) or ``q.amount``.

    ``q`` is either a stream (the current event's field) or a pattern variable (the field of
    the single event bound to it); the semantic checks resolve which.
    """

    name: str
    qualifier: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class VarField(Node):
    """``first(v).f`` or ``last(v).f``: a field of the first/last event bound to ``v``."""

    which: TypingLiteral["first", "last"]
    var: str
    name: str
    span: Span = _span()


@dataclass(frozen=True)
class Prev(Node):
    """``prev(f, n)``: field ``f`` of the n-th previous event of the partition."""

    name: str
    n: int = 1
    span: Span = _span()


@dataclass(frozen=True)
class Call(Node):
    """A function call: ``lower(x)``, ``count(v)``, ``sum(v.f)``, ``approx_distinct(f)`` ..."""

    func: str
    args: tuple[Expr, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class Search(Node):
    """``search(FIELD, "query text")``: the search language evaluated on one field."""

    field: str
    query: SearchNode
    text: str
    span: Span = _span()


ARITHMETIC_OPS = ("+", "-", "*", "/", "%")
COMPARISON_OPS = ("==", "!=", "<", "<=", ">", ">=")
STRING_OPS = ("contains", "startswith", "endswith")


@dataclass(frozen=True)
class BinOp(Node):
    """Arithmetic, comparison or string-test operator applied to two operands."""

    op: str
    left: Expr
    right: Expr
    span: Span = _span()


@dataclass(frozen=True)
class BoolOp(Node):
    """``and`` / ``or`` over two or more operands (flattened)."""

    op: TypingLiteral["and", "or"]
    operands: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Not(Node):
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Neg(Node):
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True)
class InValues(Node):
    """``x in (a, b, c)``."""

    operand: Expr
    values: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True)
class InList(Node):
    """``x in LISTNAME`` where the list is declared with ``list``."""

    operand: Expr
    list_name: str
    span: Span = _span()


@dataclass(frozen=True)
class Between(Node):
    operand: Expr
    low: Expr
    high: Expr
    span: Span = _span()


@dataclass(frozen=True)
class IsNull(Node):
    operand: Expr
    negated: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class Matches(Node):
    """``x matches /regex/`` (RE2 syntax)."""

    operand: Expr
    pattern: str
    span: Span = _span()


Expr = Union[
    Literal, Duration, FieldRef, VarField, Prev, Call, Search, BinOp, BoolOp, Not, Neg,
    InValues, InList, Between, IsNull, Matches,
]

# ---------------------------------------------------------------- search (query ... match)


@dataclass(frozen=True)
class SearchTerm(Node):
    """A single term; ``field`` None means any text field (the default field set)."""

    field: str | None
    text: str
    span: Span = _span()


@dataclass(frozen=True)
class SearchPhrase(Node):
    field: str | None
    text: str
    span: Span = _span()


@dataclass(frozen=True)
class SearchPrefix(Node):
    """``acm*``: terms starting with ``prefix``."""

    field: str | None
    prefix: str
    span: Span = _span()


@dataclass(frozen=True)
class SearchWildcard(Node):
    """``ac?e*``: ``?`` is one character, ``*`` any run of characters."""

    field: str | None
    pattern: str
    span: Span = _span()


@dataclass(frozen=True)
class SearchRegex(Node):
    """``/ac.e/``: RE2 regex that must match a whole term."""

    field: str | None
    pattern: str
    span: Span = _span()


@dataclass(frozen=True)
class SearchRange(Node):
    """``field:[lo TO hi]`` (inclusive) or ``field:{lo TO hi}`` (exclusive); None = open."""

    field: str
    low: str | int | float | None
    high: str | int | float | None
    include_low: bool = True
    include_high: bool = True
    span: Span = _span()


@dataclass(frozen=True)
class SearchCompare(Node):
    """``views >= 1000``."""

    field: str
    op: str
    value: str | int | float
    span: Span = _span()


@dataclass(frozen=True)
class SearchExists(Node):
    """``_exists_:field``."""

    field: str
    span: Span = _span()


@dataclass(frozen=True)
class SearchAnd(Node):
    clauses: tuple[SearchNode, ...]
    span: Span = _span()


@dataclass(frozen=True)
class SearchOr(Node):
    clauses: tuple[SearchNode, ...]
    span: Span = _span()


@dataclass(frozen=True)
class SearchNot(Node):
    clause: SearchNode
    span: Span = _span()


SearchNode = Union[
    SearchTerm, SearchPhrase, SearchPrefix, SearchWildcard, SearchRegex, SearchRange,
    SearchCompare, SearchExists, SearchAnd, SearchOr, SearchNot,
]


def search_leaves(node: SearchNode) -> Iterator[SearchNode]:
    """The leaves of a search expression (terms, phrases, patterns, ranges...), in order,
    including those under NOT."""
    if isinstance(node, SearchAnd | SearchOr):
        for clause in node.clauses:
            yield from search_leaves(clause)
    elif isinstance(node, SearchNot):
        yield from search_leaves(node.clause)
    else:
        yield node

# ---------------------------------------------------------------- patterns


@dataclass(frozen=True)
class PatVar(Node):
    """One pattern variable."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class PatAbsent(Node):
    """``!x``: no ``x`` between the neighbours (or, trailing, before the window closes)."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class PatSeq(Node):
    items: tuple[Pattern, ...]
    span: Span = _span()


@dataclass(frozen=True)
class PatAlt(Node):
    options: tuple[Pattern, ...]
    span: Span = _span()


@dataclass(frozen=True)
class PatQuant(Node):
    """``inner{min,max}``; ``max`` None is unbounded; ``greedy`` False for a trailing ``?``."""

    inner: Pattern
    min: int
    max: int | None
    greedy: bool = True
    span: Span = _span()


Pattern = Union[PatVar, PatAbsent, PatSeq, PatAlt, PatQuant]

# ---------------------------------------------------------------- declarations

FIELD_TYPES = ("string", "int", "float", "bool", "timestamp", "text", "list<string>")


@dataclass(frozen=True)
class FieldDecl(Node):
    name: str
    type: str
    span: Span = _span()


@dataclass(frozen=True)
class Include(Node):
    path: str
    span: Span = _span()


@dataclass(frozen=True)
class StreamDecl(Node):
    name: str
    fields: tuple[FieldDecl, ...]
    time_field: str | None = None
    time_unit: TypingLiteral["s", "ms"] | None = None
    lateness: Duration | None = None
    id_field: str | None = None
    span: Span = _span()

    def field_type(self, name: str) -> str | None:
        for f in self.fields:
            if f.name == name:
                return f.type
        return None


@dataclass(frozen=True)
class ListDecl(Node):
    """``list NAME from "path"`` (one value a line) or ``list NAME ("a", "b")``."""

    name: str
    path: str | None = None
    values: tuple[str, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class Secret(Node):
    """A webhook secret: from the environment (``env NAME``) or given literally."""

    env: str | None = None
    value: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class WebhookDecl(Node):
    name: str
    url: str
    secrets: tuple[Secret, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class KeyPart(Node):
    """One component of a partition key: ``card_id``, or ``orders.id = payments.order_id``.

    ``refs`` holds (stream or None, field) pairs that name the same key in different streams.
    """

    refs: tuple[tuple[str | None, str], ...]
    span: Span = _span()


@dataclass(frozen=True)
class Define(Node):
    """``define v as [STREAM where] EXPR [by f | by (f1, f2)]``."""

    var: str
    stream: str | None = None
    condition: Expr | None = None
    keys: tuple[str, ...] = ()
    span: Span = _span()


SKIP_KINDS = ("past_last", "to_next", "to_first", "to_last", "no_skip")


@dataclass(frozen=True)
class SkipStrategy(Node):
    kind: str = "past_last"
    var: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class EmitItem(Node):
    expr: Expr
    alias: str | None = None
    span: Span = _span()

    @property
    def name(self) -> str:
        """The output column name: the alias, else the printed expression."""
        if self.alias:
            return self.alias
        from query_lang.printer import print_expr

        return print_expr(self.expr)


SEVERITIES = ("low", "medium", "high", "critical")


@dataclass(frozen=True)
class RuleDecl(Node):
    name: str
    streams: tuple[str, ...]
    pattern: Pattern
    description: str | None = None
    by: tuple[KeyPart, ...] = ()
    contiguity: TypingLiteral["relaxed", "strict", "any"] = "relaxed"
    partials: TypingLiteral["all", "latest"] = "all"
    defines: tuple[Define, ...] = ()
    within: Duration | None = None
    skip: SkipStrategy = SkipStrategy()
    emit: tuple[EmitItem, ...] | None = None
    severity: str = "medium"
    notify: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    throttle: Duration | None = None
    span: Span = _span()

    def define(self, var: str) -> Define | None:
        for d in self.defines:
            if d.var == var:
                return d
        return None


@dataclass(frozen=True)
class QueryDecl(Node):
    name: str
    streams: tuple[str, ...]
    match: SearchNode
    description: str | None = None
    severity: str = "medium"
    notify: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    throttle: Duration | None = None
    span: Span = _span()


WINDOW_KINDS = ("tumbling", "hopping", "sliding", "session")


@dataclass(frozen=True)
class Window(Node):
    """``tumbling D | hopping D every E | sliding D [every E] | session gap D``."""

    kind: str
    size: Duration
    every: Duration | None = None
    span: Span = _span()


@dataclass(frozen=True)
class MetricDecl(Node):
    name: str
    streams: tuple[str, ...]
    window: Window
    select: tuple[EmitItem, ...]
    description: str | None = None
    by: tuple[str, ...] = ()
    where: Expr | None = None
    having: Expr | None = None
    severity: str = "medium"
    notify: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    throttle: Duration | None = None
    span: Span = _span()


Declaration = Union[
    Include, StreamDecl, ListDecl, WebhookDecl, RuleDecl, QueryDecl, MetricDecl
]


@dataclass(frozen=True)
class Module(Node):
    """One parsed file: its declarations in source order."""

    declarations: tuple[Declaration, ...]
    path: str = field(default="<string>", compare=False)
    span: Span = _span()

    def of_type(self, kind: type) -> list:
        return [d for d in self.declarations if isinstance(d, kind)]
