"""What an expression may name and what the names resolve to: the scope and match context it is
compiled against, and the resolution of variables, functions, aggregates, operators, lists,
search, tables and regular expressions, with a :class:`CompileError` for anything that does not
resolve.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import re2

from query_lang.ast import (
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    STRING_OPS,
    BinOp,
    Call,
    Expr,
    FieldRef,
    InList,
    Lookup,
    Matches,
    Member,
    Node,
    Prev,
    Quantified,
    Search,
    SearchNode,
    Span,
    VarField,
    walk,
)
from query_lang.compiler.values import _ARITHMETIC, _COMPARE, _STRING_TESTS
from query_lang.errors import VigilError
from query_lang.functions import (
    METRIC_AGGREGATES,
    PATTERN_AGGREGATES,
    SCALAR_FUNCTIONS,
    ScalarFunction,
)


class CompileError(VigilError, ValueError):
    """An expression cannot be compiled: unknown name, wrong arguments, bad regex ...

    ``span`` says where in the source the offending node is; ``str()`` starts with
    ``file:line:column`` when it is known.
    """


class MatchContext(Protocol):
    """What a condition may read beyond the current event; supplied by the CEP engine."""

    def bound(self, var: str) -> Sequence[Mapping[str, Any]]:
        """Events bound to ``var`` so far, oldest first.

        While variable ``v``'s own condition is evaluated, ``bound(v)`` already includes the
        candidate event.
        """
        ...

    def prev(self, n: int) -> Mapping[str, Any] | None:
        """The n-th previous event of the partition (1 = the one before), or None."""
        ...

    def time(self) -> int | None:
        """The event time (ms) of the event whose fields are evaluated: what ``lookup`` reads
        a table as of. None: unknown (lookups are null)."""
        ...


class TableReader(Protocol):
    """A table ``lookup`` reads (supplied by the CEP engine): rows by key as of a time."""

    def position(self, field: str) -> int:
        """Where ``field`` sits in a row."""
        ...

    def as_of(self, key: tuple, ts: int) -> Sequence[Any] | None:
        """The row of ``key`` as of event time ``ts``, or None."""
        ...

    def values_as_of(
        self, keys: Iterable[tuple], times: Iterable[int | None], position: int | None
    ) -> Sequence[Any]:
        """For each key and time, the field at ``position`` of the row as of that time
        (``True``, a row exists, for ``position`` None); None without a row, or where the
        time or a part of the key is None: :meth:`as_of` over a batch in one call."""
        ...


SearchHook = Callable[[str, SearchNode], Callable[[Any], bool]]


@dataclass(frozen=True)
class Scope:
    """The names an expression is compiled against.

    Parameters
    ----------
    streams
        Stream names: ``txn.amount`` with ``txn`` a stream is the current event's field.
    variables
        Pattern variables of the rule: ``a.amount`` is a field of the last event bound to
        ``a``. A variable shadows a stream of the same name.
    lists
        Declared lists by name, each a container supporting ``in`` (a set, a Bloom filter).
    search
        Given a field name and a parsed search query, returns a predicate over that field's
        (non-null) value; supplied by the percolator.
    tables
        Declared tables by name, each a :class:`TableReader` that ``lookup`` reads.
    time_column
        In column-wise evaluation, the batch column holding each row's event time (ms), as of
        which ``lookup`` reads a table there; ``None``: a lookup is evaluated per event only.
    """

    streams: frozenset[str] = frozenset()
    variables: frozenset[str] = frozenset()
    lists: Mapping[str, Container[Any]] = field(default_factory=dict)
    search: SearchHook | None = None
    tables: Mapping[str, TableReader] = field(default_factory=dict)
    time_column: str | None = None

    def __post_init__(self) -> None:
        # Accept any iterable of names (a list, a set) without letting a mutable one leak in.
        object.__setattr__(self, "streams", frozenset(self.streams))
        object.__setattr__(self, "variables", frozenset(self.variables))


def _is_variable_ref(ref: FieldRef, scope: Scope) -> bool:
    return ref.qualifier is not None and ref.qualifier in scope.variables


def member_of_field(ref: FieldRef, scope: Scope) -> Member | None:
    """``q.n`` read as the member ``n`` of the current event's json field ``q`` — when ``q`` is
    neither a pattern variable nor a stream (the checks have seen that ``q`` is a json field, or
    the element of a json list in ``any``/``count``); ``None`` for any other reference.

    Examples
    --------
    >>> member_of_field(FieldRef("kind", "payload"), Scope(streams={"txn"}))
    Member(base=FieldRef(name='payload', qualifier=None), name='kind')
    >>> member_of_field(FieldRef("amount", "txn"), Scope(streams={"txn"})) is None
    True
    """
    q = ref.qualifier
    if q is None or q in scope.variables or q in scope.streams:
        return None
    return Member(FieldRef(q, None, ref.span), ref.name, ref.span)


def _names(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) if names else "none here"


def _require_variable(var: str, node: Node, scope: Scope, usage: str) -> None:
    if var not in scope.variables:
        raise CompileError(
            f"{usage}: {var!r} is not a pattern variable ({_names(scope.variables)})",
            node.span,
        )


@dataclass(frozen=True)
class _Aggregate:
    """A running aggregate over the events bound to a pattern variable."""

    func: str
    var: str
    field: str | None


def _pattern_aggregate(call: Call, scope: Scope) -> _Aggregate:
    """Resolve ``count(v)``, ``count(v.f)``, ``sum(v.f)`` ...; anything else is an error."""
    metric_only = CompileError(
        f"aggregate {call.func}() is only valid in metric select; in a rule condition, "
        f"aggregate the events bound to a pattern variable, such as count(v) or sum(v.amount)",
        call.span,
    )
    if call.func not in PATTERN_AGGREGATES or len(call.args) != 1:
        raise metric_only
    arg = call.args[0]
    if not isinstance(arg, FieldRef):
        raise metric_only
    if arg.qualifier is None:
        if arg.name not in scope.variables:
            raise metric_only
        if call.func != "count":
            raise CompileError(
                f"{call.func}({arg.name}) needs a field of {arg.name}, "
                f"such as {call.func}({arg.name}.amount)",
                call.span,
            )
        return _Aggregate("count", arg.name, None)
    if arg.qualifier not in scope.variables:
        raise metric_only
    return _Aggregate(call.func, arg.qualifier, arg.name)


def _scalar_function(call: Call) -> ScalarFunction | None:
    """The builtin a call names, None for an aggregate; unknown names and arities raise."""
    function = SCALAR_FUNCTIONS.get(call.func)
    if function is None:
        if call.func in METRIC_AGGREGATES:
            return None
        known = ", ".join(sorted(set(SCALAR_FUNCTIONS) | PATTERN_AGGREGATES))
        raise CompileError(f"unknown function {call.func}(); known functions: {known}", call.span)
    if not function.takes(len(call.args)):
        plural = "argument" if function.arity_text == "1" else "arguments"
        raise CompileError(
            f"{function.summary} takes {function.arity_text} {plural}, got {len(call.args)}",
            call.span,
        )
    return function


def _is_aggregate(node: Node) -> bool:
    return isinstance(node, Call) and _scalar_function(node) is None


def _context_reads(expr: Expr, scope: Scope) -> list[Node]:
    """Nodes of ``expr`` that read more than the current event (variables, prev, aggregates,
    table lookups, unless the batch carries each row's time: ``Scope.time_column``).

    The arguments of an aggregate are not searched: they are read from the bound events.
    """
    beyond = VarField | Prev if scope.time_column is not None else VarField | Prev | Lookup
    return [
        node
        for node in walk(expr, descend=lambda node: not _is_aggregate(node))
        if isinstance(node, beyond)
        or (isinstance(node, FieldRef) and _is_variable_ref(node, scope))
        or _is_aggregate(node)
    ]


def _span_of(node: Any) -> Span | None:
    span = getattr(node, "span", None)
    return span if isinstance(span, Span) else None


def _binary_function(node: BinOp) -> Callable[[Any, Any], Any]:
    if node.op in _COMPARE:
        return _COMPARE[node.op]
    if node.op in _ARITHMETIC:
        return _ARITHMETIC[node.op]
    if node.op in _STRING_TESTS:
        return _STRING_TESTS[node.op]
    known = " ".join(COMPARISON_OPS + ARITHMETIC_OPS + STRING_OPS)
    raise CompileError(f"unknown operator {node.op!r}; expected one of {known}", node.span)


def _list_container(node: InList, scope: Scope) -> Container[Any]:
    container = scope.lists.get(node.list_name)
    if container is None:
        raise CompileError(
            f"unknown list {node.list_name!r}; declared lists: {_names(frozenset(scope.lists))}",
            node.span,
        )
    return container


def _table_reader(node: Lookup, scope: Scope) -> TableReader:
    table = scope.tables.get(node.table)
    if table is None:
        raise CompileError(
            f"unknown table {node.table!r}; declared tables: {_names(frozenset(scope.tables))}",
            node.span,
        )
    return table


def _search_predicate(node: Search, scope: Scope) -> Callable[[Any], bool]:
    if scope.search is None:
        raise CompileError(
            f"search({node.field}, {node.text!r}) needs the percolator's search support, "
            "which this compilation was not given",
            node.span,
        )
    return scope.search(node.field, node.query)


def _compile_regex(node: Matches) -> Any:
    options = re2.Options()
    options.log_errors = False  # the error goes into the CompileError, not to stderr via absl
    try:
        return re2.compile(node.pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise CompileError(
            f"invalid regular expression /{node.pattern}/: {reason} (RE2 syntax)", node.regex_span
        ) from None
    except TypeError as error:
        raise CompileError(f"invalid regular expression {node.pattern!r}: {error}",
                           node.regex_span) from None


def _field_reads(expr: Expr, scope: Scope) -> tuple[frozenset[str], frozenset[str]]:
    """Fields read from the current event, and fields read from earlier events."""
    current: set[str] = set()
    history: set[str] = set()
    # any(x in tags: ...): inside the condition, ``x`` is an element of the list, not a field
    # (and in ``x.a``, ``x`` is an element of a json list)
    elements = {
        id(ref)
        for node in walk(expr) if isinstance(node, Quantified)
        for ref in walk(node.condition)
        if isinstance(ref, FieldRef) and node.var == (ref.qualifier or ref.name)
    }
    # count(v): ``v`` is a pattern variable, not a field
    for node in walk(expr, descend=lambda node: not _names_a_variable(node, scope)):
        if id(node) in elements:
            continue
        if isinstance(node, FieldRef):
            member = member_of_field(node, scope)
            if member is not None:
                current.add(node.qualifier)
            else:
                (history if _is_variable_ref(node, scope) else current).add(node.name)
        elif isinstance(node, VarField | Prev):
            history.add(node.name)
        elif isinstance(node, Search):
            current.add(node.field)
    return frozenset(current), frozenset(history)


def _names_a_variable(call: Node, scope: Scope) -> bool:
    return (
        isinstance(call, Call)
        and call.func in PATTERN_AGGREGATES
        and len(call.args) == 1
        and isinstance(call.args[0], FieldRef)
        and call.args[0].qualifier is None
        and call.args[0].name in scope.variables
    )
