"""Semantic checks: names, types and values that the grammar alone cannot catch.

Each check reports a :class:`~query_lang.errors.VigilError` at the position of the offending
node and carries on, so one run lists every problem of a program.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from query_lang import ast
from query_lang import types as T
from query_lang.errors import VigilError, VigilNameError, VigilTypeError, VigilValueError

SCALAR_FUNCTIONS: dict[str, tuple[tuple[frozenset[str], ...], str]] = {
    # name: (argument types, result type)
    "lower": ((frozenset({T.STRING}),), T.STRING),
    "upper": ((frozenset({T.STRING}),), T.STRING),
    "abs": ((T.NUMERIC | {T.DURATION},), "same"),
    "hours": ((frozenset({T.DURATION}),), T.FLOAT),
    "minutes": ((frozenset({T.DURATION}),), T.FLOAT),
    "distance_km": ((T.NUMERIC,) * 4, T.FLOAT),
}
RULE_AGGREGATES = ("count", "sum", "avg", "min", "max")
METRIC_AGGREGATES = (
    "count", "sum", "avg", "min", "max", "approx_distinct", "approx_percentile", "seen",
)


@dataclass
class _Variable:
    name: str
    fields: dict[str, str]
    quantified: bool


@dataclass
class _Scope:
    """What an expression may read where it stands."""

    context: str  # "condition", "emit", "metric where", "metric select", "having"
    fields: dict[str, str] = field(default_factory=dict)
    streams: dict[str, dict[str, str]] = field(default_factory=dict)
    variables: dict[str, _Variable] = field(default_factory=dict)
    lists: frozenset[str] = frozenset()

    @property
    def in_rule(self) -> bool:
        return self.context in ("condition", "emit")


class Checker:
    """Checks a whole program (all files with their includes) and collects every error."""

    def __init__(
        self, declarations: Iterable[ast.Declaration], sources: dict[str, str] | None = None
    ):
        self.declarations = list(declarations)
        self.sources = sources or {}
        self.errors: list[VigilError] = []
        self.streams: dict[str, ast.StreamDecl] = {}
        self.lists: dict[str, ast.ListDecl] = {}
        self.webhooks: dict[str, ast.WebhookDecl] = {}
        self.standing: dict[str, ast.Node] = {}

    # ------------------------------------------------------------------ driver

    def check(self) -> list[VigilError]:
        self._collect_names()
        for decl in self.declarations:
            if isinstance(decl, ast.StreamDecl):
                self._check_stream(decl)
            elif isinstance(decl, ast.RuleDecl):
                self._check_rule(decl)
            elif isinstance(decl, ast.QueryDecl):
                self._check_query(decl)
            elif isinstance(decl, ast.MetricDecl):
                self._check_metric(decl)
        self.errors.sort(key=lambda e: (e.file or "", e.line, e.column))
        return self.errors

    def error(self, cls: type[VigilError], message: str, node_or_span) -> None:
        span = node_or_span if isinstance(node_or_span, ast.Span) else node_or_span.span
        self.errors.append(cls(message, span))

    def _collect_names(self) -> None:
        tables = (
            (ast.StreamDecl, self.streams, "stream"),
            (ast.ListDecl, self.lists, "list"),
            (ast.WebhookDecl, self.webhooks, "webhook"),
        )
        for decl in self.declarations:
            for cls, table, kind in tables:
                if isinstance(decl, cls):
                    self._declare(table, decl, kind)
            if isinstance(decl, ast.RuleDecl | ast.QueryDecl | ast.MetricDecl):
                self._declare(self.standing, decl, "rule, query or metric")

    def _find(self, decl, keyword: str, name: str) -> ast.Span:
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

    # ------------------------------------------------------------------ streams

    def _check_stream(self, s: ast.StreamDecl) -> None:
        seen: dict[str, ast.FieldDecl] = {}
        for f in s.fields:
            if f.name in seen:
                self.error(VigilNameError, f"stream '{s.name}' declares field '{f.name}' twice", f)
            seen[f.name] = f
        if s.time_field is not None:
            t = s.field_type(s.time_field)
            if t is None:
                self.error(
                    VigilNameError,
                    f"time field '{s.time_field}' is not a field of stream '{s.name}'",
                    self._find(s, "time", s.time_field),
                )
            elif t not in ("timestamp", "int", "float"):
                self.error(
                    VigilTypeError,
                    f"time field '{s.time_field}' must be a timestamp, not {t}",
                    self._find(s, "time", s.time_field),
                )
        elif s.lateness is not None:
            self.error(VigilValueError, "'lateness' needs a 'time' field", s.lateness)
        if s.id_field is not None and s.field_type(s.id_field) is None:
            self.error(
                VigilNameError, f"id field '{s.id_field}' is not a field of stream '{s.name}'",
                self._find(s, "id", s.id_field),
            )

    def _stream_fields(self, name: str) -> dict[str, str]:
        s = self.streams.get(name)
        if s is None:
            return {}
        return {f.name: T.from_field_type(f.type) for f in s.fields}

    def _check_from(self, decl) -> list[str]:
        known = []
        seen = set()
        for name in decl.streams:
            if name in seen:
                self.error(VigilNameError, f"stream '{name}' is listed twice in 'from'", decl)
            seen.add(name)
            if name not in self.streams:
                self.error(
                    VigilNameError, f"undeclared stream '{name}'", self._find(decl, "from", name)
                )
            else:
                known.append(name)
        return known

    def _check_notify(self, decl) -> None:
        for hook in decl.notify:
            if hook not in self.webhooks:
                self.error(
                    VigilNameError, f"undeclared webhook '{hook}' in notify",
                    self._find(decl, "notify", hook),
                )
        if decl.throttle is not None and decl.throttle.ms <= 0:
            self.error(VigilValueError, "throttle must be longer than zero", decl.throttle)

    # ------------------------------------------------------------------ rules

    def _check_rule(self, r: ast.RuleDecl) -> None:
        streams = self._check_from(r)
        stream_fields = {s: self._stream_fields(s) for s in streams}
        self._check_rule_key(r, streams, stream_fields)

        pattern_vars = list(_pattern_vars(r.pattern))
        quantified = set(_quantified_vars(r.pattern))
        self._check_pattern_shape(r)

        defines: dict[str, ast.Define] = {}
        for d in r.defines:
            if d.var in defines:
                self.error(VigilNameError, f"variable '{d.var}' is defined twice", d)
            defines[d.var] = d
            if d.var not in pattern_vars:
                self.error(
                    VigilNameError,
                    f"variable '{d.var}' is defined but does not appear in the pattern", d,
                )
            if d.stream is not None and d.stream not in streams:
                self.error(
                    VigilNameError,
                    f"stream '{d.stream}' is not one of the rule's streams "
                    f"({', '.join(r.streams)})",
                    d,
                )

        all_fields = _union_fields(stream_fields.values())
        variables = {}
        for v in pattern_vars:
            d = defines.get(v)
            fields = stream_fields.get(d.stream, {}) if d and d.stream else all_fields
            variables[v] = _Variable(v, fields, v in quantified)

        lists = frozenset(self.lists)
        key_sizes = set()
        for d in r.defines:
            var_fields = variables[d.var].fields if d.var in variables else all_fields
            scope = _Scope("condition", var_fields, stream_fields, variables, lists)
            if d.condition is not None:
                t = self.expr_type(d.condition, scope)
                self._want_bool(t, d.condition, f"the condition of '{d.var}'")
            if d.keys:
                key_sizes.add(len(d.keys))
                for k in d.keys:
                    if k not in var_fields:
                        self.error(
                            VigilNameError,
                            f"key field '{k}' of variable '{d.var}' is not a field of its stream",
                            d,
                        )
        if len(key_sizes) > 1:
            self.error(
                VigilValueError,
                "every step's 'by' must name the same number of key fields", r.defines[0],
            )

        if r.within is not None and r.within.ms <= 0:
            self.error(VigilValueError, "within must be longer than zero", r.within)
        if r.skip.var is not None and r.skip.var not in pattern_vars:
            self.error(
                VigilNameError, f"skip names '{r.skip.var}', which is not a pattern variable",
                r.skip,
            )
        if r.emit is not None:
            scope = _Scope("emit", all_fields, stream_fields, variables, lists)
            self._check_items(r.emit, scope, "emit")
        self._check_notify(r)

    def _check_rule_key(self, r, streams, stream_fields) -> None:
        for part in r.by:
            covered = set()
            for stream, name in part.refs:
                targets = [stream] if stream else streams
                if stream is not None and stream not in r.streams:
                    self.error(
                        VigilNameError,
                        f"'by' names stream '{stream}', which is not in the rule's 'from'", part,
                    )
                    continue
                for s in targets:
                    if s in stream_fields and name not in stream_fields[s]:
                        self.error(
                            VigilNameError,
                            f"partition key '{name}' is not a field of stream '{s}'", part,
                        )
                covered.update(targets)
            missing = [s for s in streams if s not in covered]
            if missing:
                self.error(
                    VigilNameError,
                    f"partition key {_key_text(part)} says nothing about stream "
                    f"'{missing[0]}'; write {_key_text(part)} = {missing[0]}.FIELD",
                    part,
                )

    def _check_pattern_shape(self, r: ast.RuleDecl) -> None:
        p = r.pattern
        items = p.items if isinstance(p, ast.PatSeq) else (p,)
        if isinstance(items[0], ast.PatAbsent):
            self.error(
                VigilValueError,
                f"a pattern cannot start with an absence (!{items[0].name})", items[0],
            )
        if isinstance(items[-1], ast.PatAbsent) and r.within is None:
            self.error(
                VigilValueError,
                f"a trailing absence (!{items[-1].name}) needs 'within' to know when to fire",
                items[-1],
            )
        for node in _pattern_nodes(p):
            if isinstance(node, ast.PatQuant):
                if node.max is not None and node.min > node.max:
                    self.error(
                        VigilValueError,
                        f"quantifier {{{node.min},{node.max}}} has a minimum larger than its "
                        "maximum",
                        node,
                    )
                elif node.max == 0:
                    self.error(
                        VigilValueError, "a quantifier with a maximum of 0 matches nothing", node
                    )
        if all(isinstance(i, ast.PatAbsent) for i in items):
            return
        for node in _nested_absences(p):
            self.error(
                VigilValueError,
                f"!{node.name} may only stand between the elements of the top-level sequence",
                node,
            )

    # ------------------------------------------------------------------ queries

    def _check_query(self, q: ast.QueryDecl) -> None:
        streams = self._check_from(q)
        fields = _union_fields(self._stream_fields(s) for s in streams)
        self._check_search(q.match, fields)
        self._check_notify(q)

    def _check_search(self, node: ast.SearchNode, fields: dict[str, str]) -> None:
        for leaf in ast.search_leaves(node):
            if isinstance(leaf, ast.SearchRegex):
                self._check_regex(leaf.pattern, leaf)
            if isinstance(leaf, ast.SearchCompare | ast.SearchRange):
                t = fields.get(leaf.field)
                values = (
                    [leaf.value] if isinstance(leaf, ast.SearchCompare) else [leaf.low, leaf.high]
                )
                for v in values:
                    if t in T.NUMERIC and isinstance(v, str):
                        self.error(
                            VigilTypeError,
                            f"field '{leaf.field}' is {T.describe(t)}; '{v}' is not a number",
                            leaf,
                        )
                if t == T.BOOL:
                    self.error(
                        VigilTypeError,
                        f"field '{leaf.field}' is a boolean; search it as {leaf.field}:true",
                        leaf,
                    )

    # ------------------------------------------------------------------ metrics

    def _check_metric(self, m: ast.MetricDecl) -> None:
        streams = self._check_from(m)
        fields = _union_fields(self._stream_fields(s) for s in streams)
        lists = frozenset(self.lists)
        if m.where is not None:
            t = self.expr_type(m.where, _Scope("metric where", fields, lists=lists))
            self._want_bool(t, m.where, "the metric's 'where'")
        for name in m.by:
            if streams and name not in fields:
                self.error(
                    VigilNameError, f"group field '{name}' is not a field of the stream",
                    self._find(m, "by", name),
                )
        w = m.window
        for d in (w.size, w.every):
            if d is not None and d.ms <= 0:
                self.error(VigilValueError, "a window duration must be longer than zero", d)
        if w.every is not None and w.every.ms > w.size.ms:
            self.error(
                VigilValueError,
                f"the window moves every {_ms(w.every.ms)} but is only {_ms(w.size.ms)} long; "
                "events in between would be missed",
                w.every,
            )
        select_scope = _Scope("metric select", fields, lists=lists)
        outputs: dict[str, str] = {name: fields.get(name, T.ANY) for name in m.by}
        for item in m.select:
            t = self.expr_type(item.expr, select_scope)
            if not _has_aggregate(item.expr) and not (
                isinstance(item.expr, ast.FieldRef) and item.expr.name in m.by
            ):
                self.error(
                    VigilValueError,
                    "each select item must be an aggregate such as count() or a 'by' field",
                    item,
                )
            outputs[item.name] = t
        self._check_unique_names(m.select, "select")
        if m.having is not None:
            t = self.expr_type(m.having, _Scope("having", outputs, lists=lists))
            self._want_bool(t, m.having, "'having'")
        self._check_notify(m)

    # ------------------------------------------------------------------ shared

    def _check_items(self, items, scope: _Scope, clause: str) -> None:
        for item in items:
            self.expr_type(item.expr, scope)
        self._check_unique_names(items, clause)

    def _check_unique_names(self, items, clause: str) -> None:
        seen = set()
        for item in items:
            name = item.name
            if name in seen:
                self.error(
                    VigilNameError, f"{clause} produces '{name}' twice; rename one with 'as'", item
                )
            seen.add(name)

    def _want_bool(self, t: str, node, what: str) -> None:
        if t not in (T.BOOL, T.ANY):
            self.error(VigilTypeError, f"{what} must be true or false, not {T.describe(t)}", node)

    def _check_regex(self, pattern: str, node) -> None:
        problem = re2_problem(pattern)
        if problem:
            self.error(VigilValueError, f"invalid regular expression /{pattern}/: {problem}", node)

    # ------------------------------------------------------------------ expression types

    def expr_type(self, e: ast.Expr, scope: _Scope) -> str:
        """The type of ``e``; reports errors and returns ``any`` where the type is unknown."""
        method = getattr(self, f"_type_{type(e).__name__}")
        return method(e, scope)

    def _type_Literal(self, e: ast.Literal, scope) -> str:
        v = e.value
        if v is None:
            return T.NULL
        if isinstance(v, bool):
            return T.BOOL
        if isinstance(v, int):
            return T.INT
        if isinstance(v, float):
            return T.FLOAT
        return T.STRING

    def _type_Duration(self, e: ast.Duration, scope) -> str:
        return T.DURATION

    def _type_FieldRef(self, e: ast.FieldRef, scope: _Scope) -> str:
        if e.qualifier is None:
            if e.name in scope.fields:
                return scope.fields[e.name]
            if e.name in scope.variables:
                self.error(
                    VigilNameError,
                    f"'{e.name}' is a pattern variable; read one of its fields, as in "
                    f"{e.name}.amount",
                    e,
                )
                return T.ANY
            self._unknown_field(e.name, e, scope)
            return T.ANY
        if e.qualifier in scope.variables:
            var = scope.variables[e.qualifier]
            if e.name not in var.fields:
                self.error(
                    VigilNameError, f"variable '{e.qualifier}' has no field '{e.name}'", e
                )
                return T.ANY
            return var.fields[e.name]
        if e.qualifier in scope.streams:
            fields = scope.streams[e.qualifier]
            if e.name not in fields:
                self.error(
                    VigilNameError,
                    f"undeclared field '{e.name}' of stream '{e.qualifier}'", e,
                )
                return T.ANY
            return fields[e.name]
        if scope.in_rule:
            self.error(
                VigilNameError,
                f"'{e.qualifier}' is neither a pattern variable nor a stream of this rule", e,
            )
        else:
            self.error(VigilNameError, f"unknown stream '{e.qualifier}'", e)
        return T.ANY

    def _unknown_field(self, name: str, node, scope: _Scope) -> None:
        where = {
            "having": "a 'by' field or a select output",
        }.get(scope.context, "a field of the stream")
        self.error(VigilNameError, f"undeclared field '{name}': not {where}", node)

    def _variable(self, name: str, node, scope: _Scope) -> _Variable | None:
        if not scope.in_rule:
            self.error(VigilNameError, f"pattern variables only exist in rules, not '{name}'",
                       node)
            return None
        var = scope.variables.get(name)
        if var is None:
            self.error(VigilNameError, f"undeclared pattern variable '{name}'", node)
        return var

    def _type_VarField(self, e: ast.VarField, scope: _Scope) -> str:
        var = self._variable(e.var, e, scope)
        if var is None:
            return T.ANY
        if e.name not in var.fields:
            self.error(VigilNameError, f"variable '{e.var}' has no field '{e.name}'", e)
            return T.ANY
        return var.fields[e.name]

    def _type_Prev(self, e: ast.Prev, scope: _Scope) -> str:
        if not scope.in_rule:
            self.error(
                VigilNameError, "prev() reads the previous event of a rule's partition; "
                "it is only valid in rules", e,
            )
            return T.ANY
        if e.name not in scope.fields:
            self._unknown_field(e.name, e, scope)
            return T.ANY
        return scope.fields[e.name]

    def _type_Search(self, e: ast.Search, scope: _Scope) -> str:
        t = scope.fields.get(e.field)
        if t is None:
            self._unknown_field(e.field, e, scope)
        elif t not in (T.STRING, T.LIST):
            self.error(VigilTypeError, f"search() needs a string or text field, "
                                       f"'{e.field}' is {T.describe(t)}", e)
        for leaf in ast.search_leaves(e.query):
            if isinstance(leaf, ast.SearchRegex):
                self._check_regex(leaf.pattern, e)
        return T.BOOL

    def _type_Call(self, e: ast.Call, scope: _Scope) -> str:
        if e.func in SCALAR_FUNCTIONS:
            wanted, result = SCALAR_FUNCTIONS[e.func]
            if len(e.args) != len(wanted):
                self.error(
                    VigilTypeError,
                    f"{e.func}() takes {len(wanted)} argument(s), got {len(e.args)}", e,
                )
                return T.ANY
            arg_types = [self.expr_type(a, scope) for a in e.args]
            for a, t, allowed in zip(e.args, arg_types, wanted, strict=True):
                if t not in allowed and t not in (T.ANY, T.NULL):
                    names = " or ".join(sorted(T.describe(x) for x in allowed))
                    self.error(
                        VigilTypeError, f"{e.func}() needs {names}, not {T.describe(t)}", a
                    )
            return arg_types[0] if result == "same" else result
        if e.func in METRIC_AGGREGATES or e.func in RULE_AGGREGATES:
            return self._aggregate_type(e, scope)
        self.error(VigilNameError, f"unknown function '{e.func}'", e)
        for a in e.args:
            self.expr_type(a, scope)
        return T.ANY

    def _aggregate_type(self, e: ast.Call, scope: _Scope) -> str:
        if scope.context == "metric select":
            return self._metric_aggregate_type(e, scope)
        if not scope.in_rule or e.func not in RULE_AGGREGATES:
            self.error(
                VigilNameError,
                f"{e.func}() is an aggregate; it is only valid in a metric's select"
                + (" or over a quantified pattern variable" if e.func in RULE_AGGREGATES else ""),
                e,
            )
            return T.ANY
        if len(e.args) != 1:
            self.error(VigilTypeError, f"{e.func}() takes one argument here, as in "
                                       f"{e.func}(v{'' if e.func == 'count' else '.amount'})", e)
            return T.ANY
        arg = e.args[0]
        if e.func == "count":
            if not (isinstance(arg, ast.FieldRef) and arg.qualifier is None):
                self.error(VigilTypeError, "count() counts the events of a variable: count(v)", e)
                return T.INT
            var = self._variable(arg.name, arg, scope)
            if var is not None and not var.quantified:
                self._not_quantified(var.name, e)
            return T.INT
        if not (isinstance(arg, ast.FieldRef) and arg.qualifier in scope.variables):
            self.error(
                VigilTypeError,
                f"{e.func}() aggregates a field of a quantified variable, as in {e.func}(v.amount)",
                e,
            )
            return T.ANY
        var = scope.variables[arg.qualifier]
        if not var.quantified:
            self._not_quantified(var.name, e)
        t = self.expr_type(arg, scope)
        return self._numeric_aggregate(e, t, arg)

    def _not_quantified(self, name: str, node) -> None:
        self.error(
            VigilValueError,
            f"aggregate over '{name}', which matches a single event; quantify it "
            f"({name}+, {name}{{2,}}) or read {name}.field",
            node,
        )

    def _numeric_aggregate(self, e: ast.Call, t: str, arg) -> str:
        if e.func in ("min", "max"):
            if t in (T.BOOL, T.LIST):
                self.error(VigilTypeError, f"{e.func}() of {T.describe(t)}", arg)
            return t
        if t not in T.NUMERIC | {T.ANY, T.DURATION}:
            self.error(VigilTypeError, f"{e.func}() needs numbers, not {T.describe(t)}", arg)
            return T.ANY
        if e.func == "avg":
            return T.DURATION if t == T.DURATION else T.FLOAT
        return t

    def _metric_aggregate_type(self, e: ast.Call, scope: _Scope) -> str:
        args = e.args
        for a in args:
            if _has_aggregate(a):
                self.error(VigilValueError, "aggregates cannot be nested", a)
                return T.ANY
        if e.func == "count":
            if len(args) > 1:
                self.error(VigilTypeError, "count() takes no argument or one field", e)
            for a in args:
                self.expr_type(a, scope)
            return T.INT
        if e.func == "approx_percentile":
            if len(args) != 2:
                self.error(
                    VigilTypeError, "approx_percentile() takes a field and a quantile, "
                    "as in approx_percentile(amount, 0.99)", e,
                )
                return T.FLOAT
            t = self.expr_type(args[0], scope)
            if t not in T.NUMERIC | {T.ANY, T.DURATION}:
                self.error(VigilTypeError, f"approx_percentile() needs numbers, not "
                                           f"{T.describe(t)}", args[0])
            q = args[1]
            if not (
                isinstance(q, ast.Literal) and isinstance(q.value, int | float)
                and not isinstance(q.value, bool) and 0 <= q.value <= 1
            ):
                self.error(VigilValueError, "the quantile must be a number from 0 to 1", q)
            return T.FLOAT
        if len(args) != 1:
            self.error(VigilTypeError, f"{e.func}() takes one argument", e)
            return T.ANY
        t = self.expr_type(args[0], scope)
        if e.func == "approx_distinct":
            return T.INT
        if e.func == "seen":
            return T.BOOL
        return self._numeric_aggregate(e, t, args[0])

    def _type_BinOp(self, e: ast.BinOp, scope: _Scope) -> str:
        left = self.expr_type(e.left, scope)
        right = self.expr_type(e.right, scope)
        if e.op in ast.COMPARISON_OPS:
            if T.NULL in (left, right):
                self.error(
                    VigilTypeError,
                    "a comparison with null is always false; use 'is null' or 'is not null'", e,
                )
            elif not T.comparable(left, right):
                self.error(
                    VigilTypeError,
                    f"cannot compare {T.describe(left)} with {T.describe(right)}", e,
                )
            return T.BOOL
        if e.op in ast.STRING_OPS:
            ok_left = left in (T.STRING, T.LIST, T.ANY, T.NULL)
            if not ok_left or right not in (T.STRING, T.ANY, T.NULL):
                self.error(
                    VigilTypeError,
                    f"'{e.op}' needs strings, not {T.describe(left)} and {T.describe(right)}", e,
                )
            return T.BOOL
        result = T.arithmetic(e.op, left, right)
        if result is None:
            if T.STRING in (left, right):
                message = f"arithmetic '{e.op}' on a string"
            else:
                message = f"cannot apply '{e.op}' to {T.describe(left)} and {T.describe(right)}"
            self.error(VigilTypeError, message, e)
            return T.ANY
        return result

    def _type_BoolOp(self, e: ast.BoolOp, scope: _Scope) -> str:
        for operand in e.operands:
            self._want_bool(self.expr_type(operand, scope), operand, f"each side of '{e.op}'")
        return T.BOOL

    def _type_Not(self, e: ast.Not, scope: _Scope) -> str:
        self._want_bool(self.expr_type(e.operand, scope), e.operand, "the operand of 'not'")
        return T.BOOL

    def _type_Neg(self, e: ast.Neg, scope: _Scope) -> str:
        t = self.expr_type(e.operand, scope)
        if t not in T.NUMERIC | {T.DURATION, T.ANY, T.NULL}:
            self.error(VigilTypeError, f"cannot negate {T.describe(t)}", e)
            return T.ANY
        return t

    def _type_InValues(self, e: ast.InValues, scope: _Scope) -> str:
        t = self.expr_type(e.operand, scope)
        for v in e.values:
            vt = self.expr_type(v, scope)
            if not T.comparable(t, vt):
                self.error(
                    VigilTypeError, f"{T.describe(vt)} in a list compared with {T.describe(t)}",
                    v,
                )
        return T.BOOL

    def _type_InList(self, e: ast.InList, scope: _Scope) -> str:
        self.expr_type(e.operand, scope)
        if e.list_name not in scope.lists:
            self.error(VigilNameError, f"undeclared list '{e.list_name}'", e)
        return T.BOOL

    def _type_Between(self, e: ast.Between, scope: _Scope) -> str:
        t = self.expr_type(e.operand, scope)
        for bound in (e.low, e.high):
            bt = self.expr_type(bound, scope)
            if not T.comparable(t, bt):
                self.error(
                    VigilTypeError, f"cannot compare {T.describe(t)} with {T.describe(bt)}", bound
                )
        return T.BOOL

    def _type_IsNull(self, e: ast.IsNull, scope: _Scope) -> str:
        self.expr_type(e.operand, scope)
        return T.BOOL

    def _type_Matches(self, e: ast.Matches, scope: _Scope) -> str:
        t = self.expr_type(e.operand, scope)
        if t not in (T.STRING, T.ANY, T.NULL):
            self.error(VigilTypeError, f"'matches' needs a string, not {T.describe(t)}", e)
        self._check_regex(e.pattern, e)
        return T.BOOL


# --------------------------------------------------------------------------- helpers


def re2_problem(pattern: str) -> str | None:
    """Why RE2 rejects ``pattern`` (e.g. backreferences, unbalanced parentheses), or None."""
    import re2

    options = re2.Options()
    options.log_errors = False  # RE2 would otherwise print to stderr through absl
    try:
        re2.compile(pattern, options)
    except re2.error as err:
        detail = err.args[0] if err.args else str(err)
        return detail.decode() if isinstance(detail, bytes) else str(detail)
    return None


def check_declarations(
    declarations: Iterable[ast.Declaration], sources: dict[str, str] | None = None
) -> list[VigilError]:
    """Every semantic error of a program, sorted by position.

    ``sources`` (file -> text) lets errors about clause values point at the exact name.
    """
    return Checker(declarations, sources).check()


def _union_fields(field_maps: Iterable[dict[str, str]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for fields in field_maps:
        for name, t in fields.items():
            merged.setdefault(name, t)
    return merged


def _pattern_vars(p: ast.Pattern) -> Iterator[str]:
    seen = set()
    for node in _pattern_nodes(p):
        if isinstance(node, ast.PatVar | ast.PatAbsent) and node.name not in seen:
            seen.add(node.name)
            yield node.name


def _pattern_nodes(p: ast.Pattern) -> Iterator[ast.Pattern]:
    yield p
    if isinstance(p, ast.PatSeq):
        for i in p.items:
            yield from _pattern_nodes(i)
    elif isinstance(p, ast.PatAlt):
        for o in p.options:
            yield from _pattern_nodes(o)
    elif isinstance(p, ast.PatQuant):
        yield from _pattern_nodes(p.inner)


def _quantified_vars(p: ast.Pattern, inside: bool = False) -> Iterator[str]:
    if isinstance(p, ast.PatVar):
        if inside:
            yield p.name
    elif isinstance(p, ast.PatSeq):
        for i in p.items:
            yield from _quantified_vars(i, inside)
    elif isinstance(p, ast.PatAlt):
        for o in p.options:
            yield from _quantified_vars(o, inside)
    elif isinstance(p, ast.PatQuant):
        yield from _quantified_vars(p.inner, inside or p.max is None or p.max > 1)


def _nested_absences(p: ast.Pattern) -> Iterator[ast.PatAbsent]:
    top = p.items if isinstance(p, ast.PatSeq) else (p,)
    for item in top:
        if not isinstance(item, ast.PatAbsent):
            for node in _pattern_nodes(item):
                if isinstance(node, ast.PatAbsent):
                    yield node


def _has_aggregate(e: ast.Expr) -> bool:
    if isinstance(e, ast.Call) and e.func in METRIC_AGGREGATES:
        return True
    return any(_has_aggregate(c) for c in _children(e))


def _children(e: ast.Expr) -> Iterator[ast.Expr]:
    if isinstance(e, ast.Call):
        yield from e.args
    elif isinstance(e, ast.BinOp):
        yield e.left
        yield e.right
    elif isinstance(e, ast.BoolOp):
        yield from e.operands
    elif isinstance(e, ast.Not | ast.Neg | ast.IsNull | ast.Matches | ast.InList):
        yield e.operand
    elif isinstance(e, ast.InValues):
        yield e.operand
        yield from e.values
    elif isinstance(e, ast.Between):
        yield e.operand
        yield e.low
        yield e.high


def _key_text(part: ast.KeyPart) -> str:
    return " = ".join(f"{s}.{f}" if s else f for s, f in part.refs)


def _ms(ms: int) -> str:
    from query_lang.printer import print_duration

    return print_duration(ast.Duration(ms))
