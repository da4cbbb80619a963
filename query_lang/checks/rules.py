"""Checks of a rule: its streams and partition key, the shape of its pattern, its variables'
conditions and keys, ``within``, ``after match`` and ``emit``.
"""

from __future__ import annotations

from collections.abc import Iterator

from query_lang import ast
from query_lang import types as T
from query_lang.checks.context import ProgramContext, union_fields
from query_lang.checks.expressions import ExpressionScope, PatternVariable
from query_lang.errors import VigilNameError, VigilTypeError, VigilValueError
from query_lang.functions import METRIC_AGGREGATES, PATTERN_AGGREGATES

_AGGREGATES = PATTERN_AGGREGATES | METRIC_AGGREGATES


def check_rule(ctx: ProgramContext, r: ast.RuleDecl) -> None:
    streams = ctx.check_from(r)
    stream_fields = {s: ctx.stream_fields(s) for s in streams}
    _check_rule_key(ctx, r, streams, stream_fields)

    pattern_vars = list(_pattern_vars(r.pattern))
    quantified = _quantified_vars(r.pattern)
    _check_pattern_shape(ctx, r)

    bound = _bound_vars(r.pattern)
    for name in r.any_for:
        if name not in bound:
            ctx.error(
                VigilNameError,
                f"'contiguity any for {name}': '{name}' is not a variable the pattern binds "
                "events to", r,
            )
    defines: dict[str, ast.Define] = {}
    for d in r.defines:
        if d.var in defines:
            ctx.error(VigilNameError, f"variable '{d.var}' is defined twice", d)
        defines[d.var] = d
        if d.var not in pattern_vars:
            ctx.error(
                VigilNameError,
                f"variable '{d.var}' is defined but does not appear in the pattern", d,
            )
        if d.stream is not None and d.stream not in streams:
            ctx.error(
                VigilNameError,
                f"stream '{d.stream}' is not one of the rule's streams "
                f"({', '.join(r.streams)})",
                d,
            )

    all_fields = union_fields(stream_fields.values())
    variables = {}
    for v in pattern_vars:
        d = defines.get(v)
        fields = stream_fields.get(d.stream, {}) if d and d.stream else all_fields
        variables[v] = PatternVariable(v, fields, v in quantified)

    lists = frozenset(ctx.lists)
    tables = ctx.table_shapes()
    key_sizes = set()
    for d in r.defines:
        var_fields = variables[d.var].fields if d.var in variables else all_fields
        scope = ExpressionScope("condition", var_fields, stream_fields, variables, lists, tables)
        if d.condition is not None:
            t = ctx.types.expr_type(d.condition, scope)
            ctx.types.want_bool(t, d.condition, f"the condition of '{d.var}'")
        if d.keys:
            key_sizes.add(len(d.keys))
            for k in d.keys:
                _check_step_key(ctx, d, k, var_fields, stream_fields, variables, lists)
    if len(key_sizes) > 1:
        ctx.error(
            VigilValueError,
            "every step's 'by' must name the same number of key fields", r.defines[0],
        )

    if r.within is not None and r.within.ms <= 0:
        ctx.error(VigilValueError, "within must be longer than zero", r.within)
    if r.skip.var is not None and r.skip.var not in pattern_vars:
        ctx.error(
            VigilNameError, f"skip names '{r.skip.var}', which is not a pattern variable",
            r.skip,
        )
    elif r.skip.var is not None and r.skip.var not in _bound_vars(r.pattern):
        ctx.error(
            VigilNameError,
            f"skip names '{r.skip.var}', which the pattern only negates (!{r.skip.var}): "
            "it binds no event to skip to",
            r.skip,
        )
    # `unique` and `having` are evaluated on each match as `emit` is: the same scope.
    scope = ExpressionScope("emit", all_fields, stream_fields, variables, lists, tables)
    if r.emit is not None:
        ctx.check_items(r.emit, scope, "emit")
    if r.having is not None:
        ctx.types.want_bool(ctx.types.expr_type(r.having, scope), r.having,
                            f"the having of rule '{r.name}'")
    if r.unique is not None:
        for expr in r.unique.exprs:
            ctx.types.expr_type(expr, scope)
        if r.unique.within is not None and r.unique.within.ms <= 0:
            ctx.error(VigilValueError, "unique ... for must be longer than zero", r.unique.within)
    ctx.check_notify(r)


def _check_step_key(
    ctx: ProgramContext,
    d: ast.Define,
    key: ast.Expr,
    var_fields: dict[str, str],
    stream_fields: dict[str, dict[str, str]],
    variables: dict,
    lists: frozenset[str],
) -> None:
    """A step's key: a field of the event the step binds, or an expression of its fields
    (computed when the event arrives, before any match exists: nothing else can be read)."""
    if isinstance(key, ast.FieldRef) and key.qualifier is None:
        if key.name not in var_fields:
            ctx.error(
                VigilNameError,
                f"key field '{key.name}' of variable '{d.var}' is not a field of its stream", d,
            )
            return
        t = var_fields[key.name]
        what = f"key field '{key.name}'"
    else:
        for node in ast.walk(key):
            reads = (
                "prev()" if isinstance(node, ast.Prev)
                else "lookup()" if isinstance(node, ast.Lookup)
                else f"{node.func}()"
                if isinstance(node, ast.Call) and node.func in _AGGREGATES
                else f"variable '{node.var}'" if isinstance(node, ast.VarField)
                else f"variable '{node.qualifier}'"
                if isinstance(node, ast.FieldRef) and node.qualifier in variables
                else None
            )
            if reads is not None:
                ctx.error(
                    VigilValueError,
                    f"the key of variable '{d.var}' reads {reads}; a step's key is computed "
                    "from the fields of the event it binds alone",
                    key,
                )
                return
        scope = ExpressionScope("step key", var_fields, stream_fields, {}, lists, {})
        t = ctx.types.expr_type(key, scope)
        what = f"key '{ast.print_expr(key)}'"
    if t in T.UNKEYED_FIELD_TYPES or t == T.JSON or t.startswith("list"):
        ctx.error(
            VigilTypeError,
            f"{what} of variable '{d.var}' is {T.describe(t)}; a key holds single values",
            key if not isinstance(key, ast.FieldRef) else d,
        )


def _check_rule_key(ctx: ProgramContext, r, streams, stream_fields) -> None:
    for part in r.by:
        covered = set()
        for stream, name in part.refs:
            targets = [stream] if stream else streams
            if stream is not None and stream not in r.streams:
                ctx.error(
                    VigilNameError,
                    f"'by' names stream '{stream}', which is not in the rule's 'from'", part,
                )
                continue
            for s in targets:
                if s in stream_fields and name not in stream_fields[s]:
                    ctx.error(
                        VigilNameError,
                        f"partition key '{name}' is not a field of stream '{s}'", part,
                    )
                elif s in stream_fields and stream_fields[s][name] in T.UNKEYED_FIELD_TYPES:
                    ctx.error(
                        VigilTypeError,
                        f"partition key '{name}' is {T.describe(stream_fields[s][name])} in "
                        f"stream '{s}'; a key holds single values",
                        part,
                    )
            covered.update(targets)
        missing = [s for s in streams if s not in covered]
        if missing:
            ctx.error(
                VigilNameError,
                f"partition key {_key_text(part)} says nothing about stream "
                f"'{missing[0]}'; write {_key_text(part)} = {missing[0]}.FIELD",
                part,
            )


def _check_pattern_shape(ctx: ProgramContext, r: ast.RuleDecl) -> None:
    p = r.pattern
    items = p.items if isinstance(p, ast.PatSeq) else (p,)
    if isinstance(items[0], ast.PatAbsent):
        ctx.error(
            VigilValueError,
            f"a pattern cannot start with an absence (!{items[0].name})", items[0],
        )
    # An absence the pattern can end on: only elements that may match nothing follow it.
    trailing = next(
        (
            item for i, item in enumerate(items)
            if isinstance(item, ast.PatAbsent) and all(ast.nullable(x) for x in items[i + 1:])
        ),
        None,
    )
    if trailing is not None and r.within is None:
        ctx.error(
            VigilValueError,
            f"a trailing absence (!{trailing.name}) needs 'within' to know when to fire"
            + ("" if trailing is items[-1] else "; what follows it may match nothing"),
            trailing,
        )
    for node in ast.walk(p):
        if isinstance(node, ast.PatQuant):
            if node.max is not None and node.min > node.max:
                ctx.error(
                    VigilValueError,
                    f"quantifier {{{node.min},{node.max}}} has a minimum larger than its "
                    "maximum",
                    node,
                )
            elif node.max == 0:
                ctx.error(
                    VigilValueError, "a quantifier with a maximum of 0 matches nothing", node
                )
    if all(isinstance(i, ast.PatAbsent) for i in items):
        return
    for node in _nested_absences(p):
        ctx.error(
            VigilValueError,
            f"!{node.name} may only stand between the elements of the top-level sequence",
            node,
        )


def _pattern_vars(p: ast.Pattern) -> Iterator[str]:
    seen = set()
    for node in ast.walk(p):
        if isinstance(node, ast.PatVar | ast.PatAbsent) and node.name not in seen:
            seen.add(node.name)
            yield node.name


def _bound_vars(p: ast.Pattern) -> set[str]:
    """Variables the pattern binds events to somewhere (not only as ``!x``)."""
    return {node.name for node in ast.walk(p) if isinstance(node, ast.PatVar)}


def _quantified_vars(p: ast.Pattern) -> set[str]:
    """Variables under a quantifier that lets them match more than one event."""
    return {
        node.name
        for quant in ast.walk(p)
        if isinstance(quant, ast.PatQuant) and (quant.max is None or quant.max > 1)
        for node in ast.walk(quant.inner)
        if isinstance(node, ast.PatVar)
    }


def _nested_absences(p: ast.Pattern) -> Iterator[ast.PatAbsent]:
    top = p.items if isinstance(p, ast.PatSeq) else (p,)
    for item in top:
        if not isinstance(item, ast.PatAbsent):
            for node in ast.walk(item):
                if isinstance(node, ast.PatAbsent):
                    yield node


def _key_text(part: ast.KeyPart) -> str:
    return " = ".join(f"{s}.{f}" if s else f for s, f in part.refs)
