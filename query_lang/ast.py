"""Typed syntax tree of the Vigil language: frozen dataclasses that later stages compile.

Every node keeps its source position in ``span``; spans never take part in equality, so a tree
parsed from printed text compares equal to the tree it was printed from. :func:`walk` and
:func:`transform` (from :mod:`query_lang.tree`) visit and rebuild any tree of these nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal as TypingLiteral
from typing import Union

from query_lang.lexical import duration_text, quote
from query_lang.tree import Node as Node
from query_lang.tree import children as children
from query_lang.tree import transform as transform
from query_lang.tree import walk as walk


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
class Member(Node):
    """``payload.kind``: the member ``name`` of a ``json`` value (an object's key), null when
    the value is not an object or has no such key. The parser builds it for names of three
    parts or more (``a.payload.kind``, ``nested.x.y``); a two-part name whose first part is a
    ``json`` field rather than a stream or a pattern variable is one too
    (:func:`query_lang.compiler.resolve.member_of_field`)."""

    base: Expr
    name: str
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
    """``x matches /regex/`` (RE2 syntax); ``pattern_span`` is where the ``/regex/`` is."""

    operand: Expr
    pattern: str
    span: Span = _span()
    pattern_span: Span = _span()

    @property
    def regex_span(self) -> Span:
        """Where to report a problem with the regular expression: at its literal when the
        parser placed it, else at the whole ``matches``."""
        return self.pattern_span if self.pattern_span.line else self.span


@dataclass(frozen=True)
class Quantified(Node):
    """``any(x in tags: cond)``, ``count(x in tags: cond)``: whether some element of a list
    field satisfies ``condition`` (read as the name ``var``), or how many do."""

    func: TypingLiteral["any", "count"]
    var: str
    source: Expr
    condition: Expr
    span: Span = _span()


QUANTIFIERS = ("any", "count")
"""The names of :class:`Quantified` expressions."""


@dataclass(frozen=True)
class Lookup(Node):
    """``lookup(cards, card_id).home_country``: a field of the row of ``table`` whose key is
    ``keys``, as the table stood at the event's time (null when no such row);
    ``field`` None is the row itself, which only ``is [not] null`` may test."""

    table: str
    keys: tuple[Expr, ...]
    field: str | None = None
    span: Span = _span()


Expr = Union[
    Literal, Duration, FieldRef, Member, VarField, Prev, Call, Search, BinOp, BoolOp, Not,
    Neg, InValues, InList, Between, IsNull, Matches, Quantified, Lookup,
]

# ---------------------------------------------------------------- canonical text of expressions
# Here rather than in the printer because an emit item's output name is the text of its
# expression (EmitItem.name); the printer builds on these.

# expression precedence, loosest first
_OR, _AND, _NOT, _PRED, _SUM, _PRODUCT, _UNARY, _ATOM = range(1, 9)


def print_duration(d: Duration) -> str:
    """A duration in the largest unit that divides it, such as ``10m``."""
    return duration_text(d.ms)


def print_expr(e: Expr) -> str:
    """The canonical text of an expression, parenthesised only where precedence needs it.

    Examples
    --------
    >>> print_expr(BinOp("*", BinOp("+", FieldRef("a"), Literal(1)), Duration(60_000)))
    '(a + 1) * 1m'
    """
    return _expr(e, _OR)


def _level(e: Expr) -> int:
    if isinstance(e, BoolOp):
        return _OR if e.op == "or" else _AND
    if isinstance(e, Not):
        return _NOT
    if isinstance(e, BinOp):
        if e.op in ("+", "-"):
            return _SUM
        if e.op in ("*", "/", "%"):
            return _PRODUCT
        return _PRED
    if isinstance(e, InValues | InList | Between | IsNull | Matches):
        return _PRED
    if isinstance(e, Neg):
        return _UNARY
    if isinstance(e, Literal) and isinstance(e.value, int | float) and e.value < 0:
        return _UNARY
    return _ATOM


def _expr(e: Expr, context: int) -> str:
    text = _expr_text(e)
    return f"({text})" if _level(e) < context else text


def _expr_text(e: Expr) -> str:
    if isinstance(e, Literal):
        return _literal(e.value)
    if isinstance(e, Duration):
        return print_duration(e)
    if isinstance(e, FieldRef):
        return f"{e.qualifier}.{e.name}" if e.qualifier else e.name
    if isinstance(e, Member):
        return f"{_expr(e.base, _ATOM)}.{e.name}"
    if isinstance(e, VarField):
        return f"{e.which}({e.var}).{e.name}"
    if isinstance(e, Prev):
        return f"prev({e.name})" if e.n == 1 else f"prev({e.name}, {e.n})"
    if isinstance(e, Call):
        return f"{e.func}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, Search):
        return f"search({e.field}, {quote(e.text)})"
    if isinstance(e, BoolOp):
        inner = _AND if e.op == "or" else _NOT
        return f" {e.op} ".join(_expr(o, inner) for o in e.operands)
    if isinstance(e, Not):
        return f"not {_expr(e.operand, _NOT)}"
    if isinstance(e, Neg):
        return f"-{_expr(e.operand, _UNARY)}"
    if isinstance(e, BinOp):
        level = _level(e)
        if level == _PRED:
            return f"{_expr(e.left, _SUM)} {e.op} {_expr(e.right, _SUM)}"
        return f"{_expr(e.left, level)} {e.op} {_expr(e.right, level + 1)}"
    if isinstance(e, InValues):
        return f"{_expr(e.operand, _SUM)} in ({', '.join(print_expr(v) for v in e.values)})"
    if isinstance(e, InList):
        return f"{_expr(e.operand, _SUM)} in {e.list_name}"
    if isinstance(e, Between):
        return (
            f"{_expr(e.operand, _SUM)} between {_expr(e.low, _SUM)} and {_expr(e.high, _SUM)}"
        )
    if isinstance(e, IsNull):
        return f"{_expr(e.operand, _SUM)} is {'not ' if e.negated else ''}null"
    if isinstance(e, Matches):
        return f"{_expr(e.operand, _SUM)} matches /{e.pattern.replace('/', chr(92) + '/')}/"
    if isinstance(e, Quantified):
        return f"{e.func}({e.var} in {print_expr(e.source)}: {print_expr(e.condition)})"
    if isinstance(e, Lookup):
        call = f"lookup({', '.join([e.table, *(print_expr(k) for k in e.keys)])})"
        return call if e.field is None else f"{call}.{e.field}"
    raise TypeError(f"not an expression: {e!r}")


def _literal(value) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".e") else text + ".0"
    return str(value)


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
    for found in walk(node):
        if not isinstance(found, SearchAnd | SearchOr | SearchNot):
            yield found

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


def nullable(p: Pattern) -> bool:
    """Whether ``p`` can match without taking an event (``a?``, ``a*``, ``!x``, ``(a? | b)``).

    The checks and the NFA compiler both decide by it where a pattern can end, so that a
    trailing ``!x`` that only nullable elements follow needs ``within`` in both.

    Examples
    --------
    >>> nullable(PatSeq((PatQuant(PatVar("a"), 0, 1), PatAbsent("x")))), nullable(PatVar("a"))
    (True, False)
    """
    if isinstance(p, PatVar):
        return False
    if isinstance(p, PatAbsent):
        return True
    if isinstance(p, PatSeq):
        return all(nullable(i) for i in p.items)
    if isinstance(p, PatAlt):
        return any(nullable(o) for o in p.options)
    return p.min == 0 or nullable(p.inner)

# ---------------------------------------------------------------- declarations

FIELD_TYPES = ("string", "int", "float", "bool", "timestamp", "text", "list<string>", "json")


@dataclass(frozen=True)
class FieldDecl(Node):
    name: str
    type: str
    span: Span = _span()


@dataclass(frozen=True)
class Include(Node):
    path: str
    span: Span = _span()


#: Kinds of the extra time fields ``time ts sent F received F`` names (device clock correction).
TIME_SOURCE_KINDS = ("sent", "received")


@dataclass(frozen=True)
class TimeSource(Node):
    """``sent F`` or ``received F`` after ``time ts``: a field holding when the event was sent
    (by the device's clock) or received (by the server's), to correct the device's clock."""

    kind: str
    field: str
    span: Span = _span()


@dataclass(frozen=True)
class StreamDecl(Node):
    name: str
    fields: tuple[FieldDecl, ...]
    time_field: str | None = None
    time_unit: TypingLiteral["s", "ms"] | None = None
    lateness: Duration | None = None
    id_field: str | None = None
    # How far an event time may run ahead of the wall clock; None: the engine's default.
    ahead: Duration | None = None
    span: Span = _span()
    # ``sent``/``received`` fields of the time option, in the order written.
    time_sources: tuple[TimeSource, ...] = ()

    def field_type(self, name: str) -> str | None:
        for f in self.fields:
            if f.name == name:
                return f.type
        return None

    def time_source(self, kind: str) -> str | None:
        """The field named ``kind`` (``sent`` or ``received``) after ``time``, or None."""
        for source in self.time_sources:
            if source.kind == kind:
                return source.field
        return None

    @property
    def device_time_field(self) -> str | None:
        """Where a clock-corrected stream keeps the device's own reading of the event time
        (``<time field>_device``); None without ``sent`` and ``received``.

        Examples
        --------
        >>> StreamDecl("s", (), time_field="ts", time_sources=(
        ...     TimeSource("sent", "a"), TimeSource("received", "b"))).device_time_field
        'ts_device'
        """
        if self.time_field is None or not self.time_sources:
            return None
        return f"{self.time_field}_device"


@dataclass(frozen=True)
class ListDecl(Node):
    """``list NAME from "path"`` (one value a line) or ``list NAME ("a", "b")``."""

    name: str
    path: str | None = None
    values: tuple[str, ...] = ()
    span: Span = _span()


#: What the op field of a changelog row says when ``op`` names no values (compared ignoring
#: case): Debezium's ``c``/``r``/``u``/``d`` and the words of most other change feeds.
DEFAULT_UPSERT_OPS = ("c", "r", "u", "insert", "update", "upsert")
DEFAULT_DELETE_OPS = ("d", "delete")


@dataclass(frozen=True)
class TableDecl(Node):
    """``table cards from card_changes key card_id [op FIELD [upsert "..."] [delete "..."]]
    [retain D]``: the rows of a changelog stream, by key, as of each event time.

    A row of ``stream`` inserts or replaces the row of its key, or deletes it when its ``op``
    field holds a value of ``delete`` or when every field other than the key, the op and the
    time is null (a tombstone); an op value in neither vocabulary makes the row a dead letter.
    ``upsert``/``delete`` not given: :data:`DEFAULT_UPSERT_OPS`, :data:`DEFAULT_DELETE_OPS`.
    ``retain``: how far behind the watermark versions are kept apart (None: the longest
    ``within`` of the rules reading the table).
    """

    name: str
    stream: str
    key: tuple[str, ...]
    op_field: str | None = None
    upsert: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    retain: Duration | None = None
    span: Span = _span()

    @property
    def upsert_ops(self) -> tuple[str, ...]:
        return self.upsert or DEFAULT_UPSERT_OPS

    @property
    def delete_ops(self) -> tuple[str, ...]:
        return self.delete or DEFAULT_DELETE_OPS


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
    """``define v as [STREAM where] EXPR [by K | by (K1, K2)]``: a key ``K`` is a field of the
    current event or an expression of its fields (EQL's ``by pid * 2``)."""

    var: str
    stream: str | None = None
    condition: Expr | None = None
    keys: tuple[Expr, ...] = ()
    span: Span = _span()

    @property
    def key_names(self) -> tuple[str, ...]:
        """What names each key part in a match's key: the field, or the expression's text."""
        return tuple(
            k.name if isinstance(k, FieldRef) and k.qualifier is None else print_expr(k)
            for k in self.keys
        )


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
        return print_expr(self.expr)


@dataclass(frozen=True)
class Unique(Node):
    """A rule's ``unique EXPR, ... [for DURATION]``: a match is reported only when the values of
    ``exprs`` (evaluated as ``emit`` is) differ from those of every match the rule reported
    before for the same key — within ``within`` of event time when given."""

    exprs: tuple[Expr, ...]
    within: Duration | None = None
    span: Span = _span()


SEVERITIES = ("low", "medium", "high", "critical")


@dataclass(frozen=True)
class RuleDecl(Node):
    name: str
    streams: tuple[str, ...]
    pattern: Pattern
    description: str | None = None
    by: tuple[KeyPart, ...] = ()
    contiguity: TypingLiteral["relaxed", "strict", "any"] = "relaxed"
    #: ``contiguity any for v, w``: relaxed, except that a partial match which takes an event
    #: as one of these variables also stays as it was (Flink's ``followedByAny`` into them,
    #: EQL's ``fork``); ``contiguity`` is then ``relaxed``.
    any_for: tuple[str, ...] = ()
    partials: TypingLiteral["all", "latest"] = "all"
    defines: tuple[Define, ...] = ()
    within: Duration | None = None
    skip: SkipStrategy = SkipStrategy()
    emit: tuple[EmitItem, ...] | None = None
    unique: Unique | None = None
    #: ``having EXPR``: a match is reported only when ``EXPR`` (evaluated as ``emit`` is) holds
    having: Expr | None = None
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
    Include, StreamDecl, ListDecl, TableDecl, WebhookDecl, RuleDecl, QueryDecl, MetricDecl
]


# The clause of the comments that stand on lines of their own just below a declaration.
AFTER_DECLARATION = "end"


@dataclass(frozen=True)
class Comment:
    """A ``#`` comment of a file and the printed line it goes back to.

    Not a syntax-tree node: walks skip it and modules compare equal whatever their comments.
    ``declaration`` is the index in :attr:`Module.declarations` of the declaration it belongs
    with (``len(declarations)``: after the last one, at the end of the file). ``clause`` and
    ``item`` name the printed line: ``""`` the declaration's first line; else a clause keyword
    (``"from"``, ``"within"``, ``"after match"``, ``"options"`` of a stream) with ``item`` 0,
    or ``"define"`` / ``"field"`` with ``item`` the entry's position. A ``trailing`` comment ends
    that line; the others stand on lines of their own before it (before the whole declaration
    when ``clause`` is ``""``, followed by a blank line when ``blank_after`` says so), or after
    the declaration's last line when ``clause`` is :data:`AFTER_DECLARATION`.
    """

    text: str
    declaration: int
    clause: str = ""
    item: int = 0
    trailing: bool = False
    blank_after: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class Module(Node):
    """One parsed file: its declarations in source order, and its comments (which take no part
    in equality, so a module compares equal to the one printed from it)."""

    declarations: tuple[Declaration, ...]
    path: str = field(default="<string>", compare=False)
    span: Span = _span()
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)

    def of_type(self, kind: type) -> list:
        return [d for d in self.declarations if isinstance(d, kind)]
