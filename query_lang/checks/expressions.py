"""The types of expressions: each expression node gets a type (:mod:`query_lang.types`) in the
scope where it stands, and every misuse of a name, function, aggregate or operator is reported
at its node.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import re2

from query_lang import ast
from query_lang import types as T
from query_lang.errors import VigilError, VigilNameError, VigilTypeError, VigilValueError
from query_lang.functions import METRIC_AGGREGATES, PATTERN_AGGREGATES, SCALAR_FUNCTIONS
from query_lang.timestamps import parse_iso_ms

ReportError = Callable[[type[VigilError], str, "ast.Node | ast.Span"], None]


@dataclass
class PatternVariable:
    """A variable of a rule's pattern: the fields its events have, and whether it may bind more
    than one event (which aggregates need)."""

    name: str
    fields: dict[str, str]
    quantified: bool


@dataclass(frozen=True)
class TableShape:
    """What ``lookup`` needs of a table: its key fields with their types, and the fields of
    its rows (its changelog stream's)."""

    key: tuple[tuple[str, str], ...]
    fields: dict[str, str]


@dataclass
class ExpressionScope:
    """What an expression may read where it stands."""

    context: str  # "condition", "emit", "metric where", "metric select", "metric argument",
    # "having"
    fields: dict[str, str] = field(default_factory=dict)
    streams: dict[str, dict[str, str]] = field(default_factory=dict)
    variables: dict[str, PatternVariable] = field(default_factory=dict)
    lists: frozenset[str] = frozenset()
    tables: dict[str, TableShape] = field(default_factory=dict)

    @property
    def in_rule(self) -> bool:
        return self.context in ("condition", "emit")

    @property
    def reads_tables(self) -> bool:
        """Whether ``lookup`` may stand here: where an expression is evaluated on one event
        (or a match), at its event time."""
        return self.context in ("condition", "emit", "metric where", "metric argument")


class ExpressionTypes:
    """Gives expressions their types and reports what is wrong with them through ``error``."""

    def __init__(self, error: ReportError) -> None:
        self.error = error

    def want_bool(self, t: str, node, what: str) -> None:
        if t != T.BOOL and t not in T.DYNAMIC:
            self.error(VigilTypeError, f"{what} must be true or false, not {T.describe(t)}", node)

    def check_regex(self, pattern: str, node) -> None:
        problem = re2_problem(pattern)
        if problem:
            self.error(VigilValueError, f"invalid regular expression /{pattern}/: {problem}", node)

    def check_search_leaf(self, leaf: ast.SearchNode, at: ast.Node | None = None) -> None:
        """What the percolator refuses to compile in one leaf of a search query: a range that
        mixes a text bound with a number or time (reported at ``at``, default the leaf)."""
        if isinstance(leaf, ast.SearchRange):
            kinds = {_bound_kind(leaf.low), _bound_kind(leaf.high)}
            if "text" in kinds and kinds & {"number", "time"}:
                self.error(
                    VigilTypeError,
                    f"range on {leaf.field} mixes a text bound with a number or timestamp bound",
                    at or leaf,
                )

    def expr_type(self, e: ast.Expr, scope: ExpressionScope) -> str:
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

    def _type_FieldRef(self, e: ast.FieldRef, scope: ExpressionScope) -> str:
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
        if e.qualifier in scope.fields:  # a member of the current event's json field
            return self._member_of(scope.fields[e.qualifier], e.qualifier, e.name, e)
        if scope.in_rule:
            self.error(
                VigilNameError,
                f"'{e.qualifier}' is neither a pattern variable, a stream of this rule nor a "
                "json field", e,
            )
        else:
            self.error(VigilNameError, f"'{e.qualifier}' is neither a stream nor a json field",
                       e)
        return T.ANY

    def _member_of(self, t: str, base: str, name: str, node) -> str:
        if t not in T.DYNAMIC:
            self.error(
                VigilTypeError,
                f"'{base}' is {T.describe(t)}; only a json value has members ('{base}.{name}')",
                node,
            )
        return T.JSON

    def _type_Member(self, e: ast.Member, scope: ExpressionScope) -> str:
        return self._member_of(self.expr_type(e.base, scope), ast.print_expr(e.base), e.name, e)

    def _unknown_field(self, name: str, node, scope: ExpressionScope) -> None:
        where = {
            "having": "a 'by' field or a select output",
        }.get(scope.context, "a field of the stream")
        self.error(VigilNameError, f"undeclared field '{name}': not {where}", node)

    def _variable(self, name: str, node, scope: ExpressionScope) -> PatternVariable | None:
        if not scope.in_rule:
            self.error(VigilNameError, f"pattern variables only exist in rules, not '{name}'",
                       node)
            return None
        var = scope.variables.get(name)
        if var is None:
            self.error(VigilNameError, f"undeclared pattern variable '{name}'", node)
        return var

    def _type_VarField(self, e: ast.VarField, scope: ExpressionScope) -> str:
        var = self._variable(e.var, e, scope)
        if var is None:
            return T.ANY
        if e.name not in var.fields:
            self.error(VigilNameError, f"variable '{e.var}' has no field '{e.name}'", e)
            return T.ANY
        return var.fields[e.name]

    def _type_Prev(self, e: ast.Prev, scope: ExpressionScope) -> str:
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

    def _type_Search(self, e: ast.Search, scope: ExpressionScope) -> str:
        t = scope.fields.get(e.field)
        if t is None:
            self._unknown_field(e.field, e, scope)
        elif t not in (T.STRING, T.LIST):
            self.error(VigilTypeError, f"search() needs a string or text field, "
                                       f"'{e.field}' is {T.describe(t)}", e)
        for leaf in ast.search_leaves(e.query):
            if isinstance(leaf, ast.SearchRegex):
                self.check_regex(leaf.pattern, e)
            self.check_search_leaf(leaf, e)
        return T.BOOL

    def _type_Quantified(self, e: ast.Quantified, scope: ExpressionScope) -> str:
        t = self.expr_type(e.source, scope)
        if t != T.LIST and t not in T.DYNAMIC:
            self.error(VigilTypeError, f"{e.func}() reads the elements of a list of strings "
                                       f"or of a json list, not {T.describe(t)}", e)
        if e.var in scope.fields or e.var in scope.variables or e.var in scope.streams:
            what = ("pattern variable" if e.var in scope.variables
                    else "stream" if e.var in scope.streams else "field")
            self.error(VigilNameError, f"{e.func}(): the element name '{e.var}' is already a "
                                       f"{what} here; choose another", e)
        element = T.STRING if t == T.LIST else T.JSON
        inner = replace(scope, fields={**scope.fields, e.var: element})
        self.want_bool(self.expr_type(e.condition, inner), e.condition,
                       f"the condition of {e.func}()")
        return T.BOOL if e.func == "any" else T.INT

    def _type_Call(self, e: ast.Call, scope: ExpressionScope) -> str:
        function = SCALAR_FUNCTIONS.get(e.func)
        if function is not None:
            if not function.takes(len(e.args)):
                self.error(
                    VigilTypeError,
                    f"{e.func}() takes {function.arity_text} argument(s), got {len(e.args)}", e,
                )
                return T.ANY
            wanted = function.parameter_types(len(e.args))
            arg_types = [self.expr_type(a, scope) for a in e.args]
            for a, t, allowed in zip(e.args, arg_types, wanted, strict=True):
                if t not in allowed and t not in T.DYNAMIC | {T.NULL}:
                    names = " or ".join(sorted(T.describe(x) for x in allowed))
                    self.error(
                        VigilTypeError, f"{e.func}() needs {names}, not {T.describe(t)}", a
                    )
            return function.result_type(arg_types)
        if e.func in METRIC_AGGREGATES or e.func in PATTERN_AGGREGATES:
            return self._aggregate_type(e, scope)
        self.error(VigilNameError, f"unknown function '{e.func}'", e)
        for a in e.args:
            self.expr_type(a, scope)
        return T.ANY

    def _aggregate_type(self, e: ast.Call, scope: ExpressionScope) -> str:
        if scope.context == "metric select":
            return self._metric_aggregate_type(e, scope)
        if not scope.in_rule or e.func not in PATTERN_AGGREGATES:
            over_variable = " or over a quantified pattern variable"
            self.error(
                VigilNameError,
                f"{e.func}() is an aggregate; it is only valid in a metric's select"
                + (over_variable if e.func in PATTERN_AGGREGATES else ""),
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
        if t not in T.NUMERIC | T.DYNAMIC | {T.DURATION}:
            self.error(VigilTypeError, f"{e.func}() needs numbers, not {T.describe(t)}", arg)
            return T.ANY
        if e.func == "avg":
            return T.DURATION if t == T.DURATION else T.FLOAT
        return t

    def _metric_aggregate_type(self, e: ast.Call, scope: ExpressionScope) -> str:
        args = e.args
        for a in args:
            if has_aggregate(a):
                self.error(VigilValueError, "aggregates cannot be nested", a)
                return T.ANY
        # An aggregate's arguments are evaluated on each event, as the metric's where is.
        scope = replace(scope, context="metric argument")
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
            if t not in T.NUMERIC | T.DYNAMIC | {T.DURATION}:
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

    def _type_BinOp(self, e: ast.BinOp, scope: ExpressionScope) -> str:
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
            ok_left = left in T.DYNAMIC | {T.STRING, T.LIST, T.NULL}
            if not ok_left or right not in T.DYNAMIC | {T.STRING, T.NULL}:
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

    def _type_BoolOp(self, e: ast.BoolOp, scope: ExpressionScope) -> str:
        for operand in e.operands:
            self.want_bool(self.expr_type(operand, scope), operand, f"each side of '{e.op}'")
        return T.BOOL

    def _type_Not(self, e: ast.Not, scope: ExpressionScope) -> str:
        self.want_bool(self.expr_type(e.operand, scope), e.operand, "the operand of 'not'")
        return T.BOOL

    def _type_Neg(self, e: ast.Neg, scope: ExpressionScope) -> str:
        t = self.expr_type(e.operand, scope)
        if t not in T.NUMERIC | T.DYNAMIC | {T.DURATION, T.NULL}:
            self.error(VigilTypeError, f"cannot negate {T.describe(t)}", e)
            return T.ANY
        return t

    def _type_InValues(self, e: ast.InValues, scope: ExpressionScope) -> str:
        t = self.expr_type(e.operand, scope)
        for v in e.values:
            vt = self.expr_type(v, scope)
            if not T.comparable(t, vt):
                self.error(
                    VigilTypeError, f"{T.describe(vt)} in a list compared with {T.describe(t)}",
                    v,
                )
        return T.BOOL

    def _type_InList(self, e: ast.InList, scope: ExpressionScope) -> str:
        self.expr_type(e.operand, scope)
        if "." in e.list_name:
            self.error(VigilNameError, f"'{e.list_name}' is not a declared list; the elements "
                       f"of a json list are read with any(x in {e.list_name}: ...)", e)
        elif e.list_name not in scope.lists:
            self.error(VigilNameError, f"undeclared list '{e.list_name}'", e)
        return T.BOOL

    def _type_Between(self, e: ast.Between, scope: ExpressionScope) -> str:
        t = self.expr_type(e.operand, scope)
        for bound in (e.low, e.high):
            bt = self.expr_type(bound, scope)
            if not T.comparable(t, bt):
                self.error(
                    VigilTypeError, f"cannot compare {T.describe(t)} with {T.describe(bt)}", bound
                )
        return T.BOOL

    def _type_IsNull(self, e: ast.IsNull, scope: ExpressionScope) -> str:
        if isinstance(e.operand, ast.Lookup) and e.operand.field is None:
            self._lookup_shape(e.operand, scope)  # whether the key has a row: no field needed
        else:
            self.expr_type(e.operand, scope)
        return T.BOOL

    def _type_Lookup(self, e: ast.Lookup, scope: ExpressionScope) -> str:
        shape = self._lookup_shape(e, scope)
        if shape is None:
            return T.ANY
        if e.field is None:
            self.error(
                VigilTypeError,
                f"lookup({e.table}, ...) is a row of the table: read one of its fields, as in "
                f"{ast.print_expr(e)}.{next(iter(shape.fields), 'field')}, or test whether "
                "there is one with `is null` / `is not null`",
                e,
            )
            return T.ANY
        if e.field not in shape.fields:
            self.error(
                VigilNameError,
                f"table '{e.table}' has no field '{e.field}' (its fields: "
                f"{', '.join(shape.fields)})",
                e,
            )
            return T.ANY
        return shape.fields[e.field]

    def _lookup_shape(self, e: ast.Lookup, scope: ExpressionScope) -> TableShape | None:
        """Checks the table and key of a lookup; the table's shape when it is known."""
        key_types = [self.expr_type(k, scope) for k in e.keys]
        if not scope.reads_tables:
            self.error(
                VigilValueError,
                f"lookup() is not available in a {scope.context}: it reads the table as of one "
                "event's time; read it in the metric's where or inside an aggregate's argument, "
                "as in sum(lookup(t, k).f)",
                e,
            )
            return None
        shape = scope.tables.get(e.table)
        if shape is None:
            known = ", ".join(sorted(scope.tables)) or "none declared"
            self.error(VigilNameError, f"unknown table '{e.table}' (tables: {known})", e)
            return None
        if len(e.keys) != len(shape.key):
            names = ", ".join(name for name, _ in shape.key)
            self.error(
                VigilTypeError,
                f"table '{e.table}' is keyed by {len(shape.key)} field(s) ({names}); "
                f"this lookup gives {len(e.keys)}",
                e,
            )
            return shape
        for (name, want), got, key in zip(shape.key, key_types, e.keys, strict=True):
            if not T.comparable(want, got):
                self.error(
                    VigilTypeError,
                    f"key '{name}' of table '{e.table}' is {T.describe(want)}; "
                    f"this lookup gives {T.describe(got)}",
                    key,
                )
        return shape

    def _type_Matches(self, e: ast.Matches, scope: ExpressionScope) -> str:
        t = self.expr_type(e.operand, scope)
        if t not in T.DYNAMIC | {T.STRING, T.NULL}:
            self.error(VigilTypeError, f"'matches' needs a string, not {T.describe(t)}", e)
        self.check_regex(e.pattern, e.regex_span)
        return T.BOOL


def re2_problem(pattern: str) -> str | None:
    """Why RE2 rejects ``pattern`` (e.g. backreferences, unbalanced parentheses), or None."""
    options = re2.Options()
    options.log_errors = False  # RE2 would otherwise print to stderr through absl
    try:
        re2.compile(pattern, options)
    except re2.error as err:
        detail = err.args[0] if err.args else str(err)
        return detail.decode() if isinstance(detail, bytes) else str(detail)
    return None


# A number as the percolator reads a range bound (percolator.analysis.parse_number).
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _bound_kind(bound: object) -> str | None:
    """What a range bound is to the percolator (``percolator.evaluate``): a number, a time,
    text, or None for an open bound."""
    if bound is None or bound == "*":
        return None
    if isinstance(bound, int | float) or _NUMBER_TEXT.fullmatch(str(bound).strip()):
        return "number"
    return "time" if parse_iso_ms(str(bound)) is not None else "text"


def has_aggregate(e: ast.Expr) -> bool:
    """Whether a metric aggregate (``count()``, ``sum(f)`` ...) appears anywhere in ``e``."""
    return any(isinstance(n, ast.Call) and n.func in METRIC_AGGREGATES for n in ast.walk(e))
