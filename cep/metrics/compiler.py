"""Compilation of a ``metric`` declaration into the immutable :class:`CompiledMetric` its window
operator runs, and the deterministic ``match_id`` of each metric result."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cep.events.identity import content_id
from cep.metrics.aggregates import (
    AGGREGATES,
    HLL_PRECISION,
    SEEN_CAPACITY,
    SEEN_ERROR_RATE,
    TDIGEST_COMPRESSION,
    Aggregate,
    ApproxPercentile,
    CountRows,
    CountValues,
)
from cep.metrics.errors import MetricCompileError
from cep.metrics.windows import WindowShape
from query_lang.ast import (
    Call,
    Expr,
    FieldRef,
    Literal,
    Lookup,
    MetricDecl,
    Node,
    Span,
    StreamDecl,
)
from query_lang.compiler import (
    CompileError,
    Scope,
    SearchHook,
    TableReader,
    compile_columnar_predicate,
    compile_expr,
    compile_masked,
    compile_predicate,
)
from query_lang.functions import METRIC_AGGREGATES
from query_lang.limits import metric_limit_errors
from query_lang.printer import print_declaration
from query_lang.tree import transform, walk
from query_lang.types import UNGROUPED_FIELD_TYPES

__all__ = ["CompiledMetric", "aggregate_slot", "compile_metric", "metric_match_id"]


@dataclass(frozen=True)
class CompiledMetric:
    """A metric declaration compiled for the window operator; immutable and shareable.

    Attributes
    ----------
    name, version:
        The metric's name and version (part of every ``match_id``).
    decl:
        The declaration it was compiled from.
    shape:
        The window, reduced to mode, size and step.
    by:
        Group fields.
    lateness_ms:
        How long windows are kept after they fire, for corrections: the largest lateness of
        the metric's streams (or the override given to :func:`compile_metric`).
    select_names:
        Output value names, in ``select`` order.
    fingerprint:
        sha256 of the definition; state bytes only load into an operator of the same metric.
    reads_tables:
        Whether ``where`` or an aggregate's argument reads a table (``lookup``): the operator
        then holds each event until the watermark passes it, and evaluates it as of its time
        (``docs/semantics.md``, *Tables*).
    """

    name: str
    version: int
    decl: MetricDecl = dataclasses.field(repr=False)
    shape: WindowShape
    by: tuple[str, ...]
    lateness_ms: int
    select_names: tuple[str, ...]
    severity: str
    fingerprint: bytes
    where_batch: Callable[[pd.DataFrame], np.ndarray] | None = dataclasses.field(repr=False)
    where_event: Callable[..., bool] | None = dataclasses.field(repr=False)
    args_batch: tuple[Callable[[pd.DataFrame], Any], ...] = dataclasses.field(repr=False)
    args_event: tuple[Callable[..., Any], ...] = dataclasses.field(repr=False)
    aggregates: tuple[Aggregate, ...] = dataclasses.field(repr=False)
    select: tuple[Callable[..., Any], ...] = dataclasses.field(repr=False)
    having: Callable[..., bool] | None = dataclasses.field(repr=False)
    reads_tables: bool = False


def aggregate_slot(i: int) -> str:
    """The field through which the compiled ``select`` expressions read aggregate ``i``."""
    # Not an identifier, so it cannot collide with a field a user can name.
    return f"#aggregate{i}"


def _is_aggregate(node: Node) -> bool:
    return isinstance(node, Call) and node.func in METRIC_AGGREGATES


def _replace_aggregates(expr: Expr, found: list[Call]) -> Expr:
    """``expr`` with every metric aggregate call replaced by a reference to its result slot.

    Calls not in ``found`` yet are appended to it in pre-order; an aggregate's arguments are not
    searched (a nested aggregate is compiled as an argument, which reports it).
    """
    for node in walk(expr, descend=lambda n: not _is_aggregate(n)):
        if _is_aggregate(node) and node not in found:
            found.append(node)

    def to_slot(node: Node) -> Node:
        if _is_aggregate(node) and node in found:
            return FieldRef(aggregate_slot(found.index(node)))
        return node

    return transform(expr, to_slot)


def compile_metric(
    metric: MetricDecl,
    *,
    streams: Mapping[str, StreamDecl],
    lists: Mapping[str, Container[Any]] | None = None,
    search: SearchHook | None = None,
    lateness_ms: int | None = None,
    version: int = 1,
    tables: Mapping[str, TableReader] | None = None,
) -> CompiledMetric:
    """Compile a ``metric`` declaration for :class:`~cep.metrics.MetricOperator`.

    Parameters
    ----------
    metric:
        The declaration, as the parser builds it (checked by ``query_lang``).
    streams:
        Declared streams by name; the metric's ``from`` streams must be among them.
    lists:
        Declared lists by name, each a container (``x in LIST`` in ``where``).
    search:
        The percolator's per-field search hook, for ``search(...)`` in ``where``.
    lateness_ms:
        Overrides the retention of fired windows (default: the largest ``lateness`` of the
        metric's streams, 0 when none is declared).
    version:
        The metric's version, part of every ``match_id``.
    tables:
        Declared tables by name, for ``lookup`` in ``where`` and aggregate arguments.

    Raises
    ------
    MetricCompileError
        Naming the metric, with the span of the offending code: an undeclared stream, a ``by``
        field that is a list, a malformed aggregate, an expression that cannot be compiled, a
        limit of :mod:`query_lang.limits` (nesting, durations) passed.

    Examples
    --------
    >>> import dataclasses
    >>> from query_lang import parse
    >>> stream, decl = parse(
    ...     "stream txn (card string, tags list<string>, amount float, ts timestamp) time ts\\n"
    ...     "metric spend from txn by card window tumbling 1m select sum(amount) as total\\n"
    ... ).declarations
    >>> metric = compile_metric(decl, streams={"txn": stream})
    >>> metric.name, metric.by, metric.select_names, metric.shape
    ('spend', ('card',), ('total',), WindowShape(mode='fixed', size_ms=60000, every_ms=60000))

    A ``by`` field must hold single values; the error points at the declaration:

    >>> try:
    ...     compile_metric(dataclasses.replace(decl, by=("tags",)), streams={"txn": stream})
    ... except MetricCompileError as error:
    ...     print(error.location())
    ...     print(error.message)
    <string>:2:1
    metric 'spend': cannot group by 'tags', a list<string> field; group by single values
    """
    where = f"metric '{metric.name}'"

    def fail(message: str, node: Node | Span | None = None) -> MetricCompileError:
        span = node if isinstance(node, Span) else getattr(node, "span", None)
        if span is None or not span.line:
            span = metric.span
        return MetricCompileError(f"{where}: {message}", span if span.line else None)

    for over in metric_limit_errors(metric):
        # The error `vigil check` reports (query_lang.limits), as this compiler's kind.
        raise MetricCompileError(over.message, over.span) from over
    try:
        shape = WindowShape.from_ast(metric.window)
    except ValueError as error:
        raise fail(str(error), metric.window) from None
    missing = [s for s in metric.streams if s not in streams]
    if missing:
        raise fail(f"reads undeclared stream '{missing[0]}'")
    for field_name in metric.by:
        for s in metric.streams:
            if streams[s].field_type(field_name) in UNGROUPED_FIELD_TYPES:
                raise fail(
                    f"cannot group by '{field_name}', a {streams[s].field_type(field_name)} "
                    "field; group by single values"
                )
    if lateness_ms is None:
        lateness_ms = max(
            (streams[s].lateness.ms for s in metric.streams if streams[s].lateness is not None),
            default=0,
        )
    scope = Scope(streams=frozenset(metric.streams), lists=dict(lists or {}), search=search,
                  tables=dict(tables or {}))
    found: list[Call] = []
    select_exprs = [_replace_aggregates(item.expr, found) for item in metric.select]
    arg_exprs: list[Expr] = []
    aggregates: list[Aggregate] = []
    for call in found:
        aggregates.append(_build_aggregate(call, arg_exprs, fail))
    per_event = [e for e in (metric.where, *arg_exprs) if e is not None]
    reads_tables = any(isinstance(n, Lookup) for e in per_event for n in walk(e))
    # Column-wise, a lookup reads each row as of its time: the operator's batches carry it
    # in their `ts` column.
    batch_scope = dataclasses.replace(scope, time_column="ts") if reads_tables else scope
    try:
        where_batch = where_event = None
        if metric.where is not None:
            where_batch = compile_columnar_predicate(metric.where, batch_scope)
            where_event = compile_predicate(metric.where, scope)
        args_batch = tuple(compile_masked(e, batch_scope) for e in arg_exprs)
        args_event = tuple(compile_expr(e, scope) for e in arg_exprs)
        select = tuple(compile_expr(e, scope) for e in select_exprs)
        having = None if metric.having is None else compile_predicate(metric.having, scope)
    except CompileError as error:
        raise fail(error.message, error.span) from None
    names = tuple(item.name for item in metric.select)
    if len(set(names)) != len(names):
        raise fail("select produces the same name twice; rename one with 'as'")
    definition = json.dumps(
        [print_declaration(metric), shape.mode, shape.size_ms, shape.every_ms, lateness_ms,
         version, HLL_PRECISION, TDIGEST_COMPRESSION, SEEN_CAPACITY, SEEN_ERROR_RATE]
    )
    return CompiledMetric(
        name=metric.name,
        version=version,
        decl=metric,
        shape=shape,
        by=tuple(metric.by),
        lateness_ms=int(lateness_ms),
        select_names=names,
        severity=metric.severity,
        fingerprint=hashlib.sha256(definition.encode("utf-8")).digest(),
        where_batch=where_batch,
        where_event=where_event,
        args_batch=args_batch,
        args_event=args_event,
        aggregates=tuple(aggregates),
        select=select,
        having=having,
        reads_tables=reads_tables,
    )


def _build_aggregate(
    call: Call, arg_exprs: list[Expr], fail: Callable[[str, Node | None], Exception]
) -> Aggregate:
    def argument(expr: Expr) -> int:
        if expr not in arg_exprs:
            arg_exprs.append(expr)
        return arg_exprs.index(expr)

    if call.func == "count":
        if not call.args:
            return CountRows(None)
        if len(call.args) != 1:
            raise fail("count() takes no argument or one field", call)
        return CountValues(argument(call.args[0]))
    if call.func == "approx_percentile":
        if len(call.args) != 2:
            raise fail("approx_percentile() takes a field and a quantile, as in "
                       "approx_percentile(amount, 0.99)", call)
        q = call.args[1]
        if not (
            isinstance(q, Literal) and isinstance(q.value, int | float)
            and not isinstance(q.value, bool) and 0 <= q.value <= 1
        ):
            raise fail("the quantile of approx_percentile() must be a number from 0 to 1", q)
        return ApproxPercentile(argument(call.args[0]), float(q.value))
    if len(call.args) != 1:
        raise fail(f"{call.func}() takes one argument", call)
    return AGGREGATES[call.func](argument(call.args[0]), None)


def metric_match_id(
    name: str,
    version: int,
    key: Mapping[str, Any],
    start_ms: int,
    end_ms: int,
    revision: int,
    values: Mapping[str, Any] | None = None,
) -> str:
    """The deterministic id of one metric result (the scheme: :mod:`cep.events.identity`).

    A correction has a higher ``revision`` and so a new id; the result's ``values`` are part of
    it too, so a window's result from another run (whose revisions restart) with other values
    never shares an id with it; a replay of the same input yields the same ids, so downstream
    deduplication works. Floats enter the id rounded to 9 significant digits: a sum's last
    bits depend on the order of its additions, which differs between the embedded engine and
    Spark's micro-batches, and both must give the same id.

    Examples
    --------
    >>> a = metric_match_id("m", 1, {"k": "x"}, 0, 60_000, 0, {"n": 3})
    >>> len(a), a == metric_match_id("m", 1, {"k": "x"}, 0, 60_000, 1, {"n": 3})
    (32, False)
    >>> a == metric_match_id("m", 1, {"k": "x"}, 0, 60_000, 0, {"n": 4})
    False
    >>> metric_match_id("m", 1, {}, 0, 1, 0, {"s": 0.1 + 0.2}) == metric_match_id(
    ...     "m", 1, {}, 0, 1, 0, {"s": 0.3})
    True
    """
    return content_id(
        ["metric", name, version, dict(key), start_ms, end_ms, revision, _rounded(values or {})]
    )


def _rounded(value: Any) -> Any:
    """``value`` with its floats rounded to 9 significant digits (for :func:`metric_match_id`)."""
    if isinstance(value, float):
        return float(f"{value:.9g}") if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value
