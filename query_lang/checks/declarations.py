"""Checks of streams, tables, queries and metrics: their fields, keys, search syntax, windows,
``select`` and ``having``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from query_lang import ast
from query_lang import types as T
from query_lang.checks.context import ProgramContext, event_time_field, union_fields
from query_lang.checks.expressions import ExpressionScope, has_aggregate
from query_lang.errors import VigilNameError, VigilTypeError, VigilValueError, VigilWarning
from query_lang.lexical import duration_text


def check_stream(ctx: ProgramContext, s: ast.StreamDecl) -> None:
    seen: dict[str, ast.FieldDecl] = {}
    for f in s.fields:
        if f.name in seen:
            ctx.error(VigilNameError, f"stream '{s.name}' declares field '{f.name}' twice", f)
        seen[f.name] = f
    if s.time_field is not None:
        t = s.field_type(s.time_field)
        if t is None:
            ctx.error(
                VigilNameError,
                f"time field '{s.time_field}' is not a field of stream '{s.name}'",
                ctx.find(s, "time", s.time_field),
            )
        elif t not in ("timestamp", "int", "float"):
            ctx.error(
                VigilTypeError,
                f"time field '{s.time_field}' must be a timestamp, not {t}",
                ctx.find(s, "time", s.time_field),
            )
    elif s.lateness is not None:
        ctx.error(VigilValueError, "'lateness' needs a 'time' field", s.lateness)
    if s.time_sources:
        _check_time_sources(ctx, s)
    if s.ahead is not None:
        if s.time_field is None:
            ctx.error(VigilValueError, "'ahead' needs a 'time' field", s.ahead)
        elif s.ahead.ms <= 0:
            # Clocks drift: a bound of zero would reject events stamped a moment ahead.
            ctx.error(VigilValueError, "'ahead' must be longer than zero", s.ahead)
    if s.id_field is not None and s.field_type(s.id_field) is None:
        ctx.error(
            VigilNameError, f"id field '{s.id_field}' is not a field of stream '{s.name}'",
            ctx.find(s, "id", s.id_field),
        )


def _check_time_sources(ctx: ProgramContext, s: ast.StreamDecl) -> None:
    """``time ts sent F received F``: known kinds, each once, two declared time fields other
    than ``ts`` and each other, and no declared field where the device's reading is kept."""
    kinds: dict[str, ast.TimeSource] = {}
    used: dict[str, ast.TimeSource] = {}
    for source in s.time_sources:
        if source.kind not in ast.TIME_SOURCE_KINDS:
            ctx.error(
                VigilNameError,
                f"unknown time field kind '{source.kind}' in stream '{s.name}'; expected one "
                f"of: {', '.join(ast.TIME_SOURCE_KINDS)}",
                source,
            )
            continue
        if source.kind in kinds:
            ctx.error(
                VigilNameError, f"stream '{s.name}' names its '{source.kind}' field twice", source
            )
            continue
        kinds[source.kind] = source
        if source.field == s.time_field or source.field in used:
            ctx.error(
                VigilNameError,
                f"field '{source.field}' of stream '{s.name}' is named twice as a time field",
                source,
            )
        used[source.field] = source
        t = s.field_type(source.field)
        if t is None:
            ctx.error(
                VigilNameError,
                f"{source.kind} field '{source.field}' is not a field of stream '{s.name}'",
                source,
            )
        elif t not in ("timestamp", "int", "float"):
            ctx.error(
                VigilTypeError,
                f"{source.kind} field '{source.field}' must be a timestamp, not {t}",
                source,
            )
    missing = [k for k in ast.TIME_SOURCE_KINDS if k not in kinds]
    if kinds and missing:
        # One of the two gives no offset: the correction needs both clocks' readings.
        ctx.error(
            VigilValueError,
            f"stream '{s.name}' corrects its device clock with both 'sent' and 'received'; "
            f"add `{missing[0]} FIELD`",
            s.time_sources[0],
        )
    device = s.device_time_field
    if device is not None and s.field_type(device) is not None:
        ctx.error(
            VigilNameError,
            f"stream '{s.name}' declares field '{device}', where a clock-corrected stream keeps "
            "the device's own time: rename it",
            next(f for f in s.fields if f.name == device),
        )


def stream_warnings(
    streams: Iterable[ast.StreamDecl], sources: Mapping[str, str] | None = None
) -> list[VigilWarning]:
    """Streams that probably do not read their times as their author means: a time field
    declared ``int`` or ``float`` without ``unit`` holds epoch numbers read as seconds, and
    epoch milliseconds are as common (``sources``, file -> text, lets a warning show its line).

    Examples
    --------
    >>> from query_lang import parse
    >>> module = parse("stream s (at int) time at")
    >>> [w.message for w in stream_warnings(module.declarations)]  # doctest: +ELLIPSIS
    ["stream 's' reads its time field 'at' (int) as epoch seconds: ..."]
    """
    found = []
    for s in streams:
        if not isinstance(s, ast.StreamDecl) or s.time_field is None or s.time_unit is not None:
            continue
        kind = s.field_type(s.time_field)
        if kind in ("int", "float"):
            decl = next(f for f in s.fields if f.name == s.time_field)
            found.append(VigilWarning(
                f"stream '{s.name}' reads its time field '{s.time_field}' ({kind}) as epoch "
                "seconds: say so with `unit s`, or declare `unit ms` if it holds milliseconds",
                decl.span, (sources or {}).get(decl.span.file),
            ))
    return found


def check_table(ctx: ProgramContext, t: ast.TableDecl) -> None:
    """A table's changelog stream is declared with an event time; its key fields are single
    values of that stream, each once; its op field is a string field outside the key; no op
    value both upserts and deletes."""
    stream = ctx.streams.get(t.stream)
    if stream is None:
        ctx.error(VigilNameError, f"table '{t.name}' reads undeclared stream '{t.stream}'",
                  ctx.find(t, "from", t.stream))
        return
    if event_time_field(stream) is None:
        ctx.error(
            VigilNameError,
            f"table '{t.name}' reads stream '{t.stream}', which has no event time: declare "
            "`time FIELD` (a lookup sees the table as of each event's time)",
            ctx.find(t, "from", t.stream),
        )
    fields = ctx.stream_fields(t.stream)
    seen: set[str] = set()
    for k in t.key:
        where = ctx.find(t, "key", k)
        if k in seen:
            ctx.error(VigilNameError, f"table '{t.name}' names key field '{k}' twice", where)
        seen.add(k)
        if k not in fields:
            ctx.error(VigilNameError,
                      f"key field '{k}' of table '{t.name}' is not a field of stream "
                      f"'{t.stream}'", where)
        elif fields[k] in T.UNKEYED_FIELD_TYPES:
            ctx.error(VigilTypeError,
                      f"key field '{k}' of table '{t.name}' is {T.describe(fields[k])}; a key "
                      "holds single values", where)
    if t.op_field is not None:
        where = ctx.find(t, "op", t.op_field)
        if t.op_field not in fields:
            ctx.error(VigilNameError,
                      f"op field '{t.op_field}' of table '{t.name}' is not a field of stream "
                      f"'{t.stream}'", where)
        elif fields[t.op_field] != T.STRING:
            ctx.error(VigilTypeError,
                      f"op field '{t.op_field}' of table '{t.name}' must be a string, not "
                      f"{T.describe(fields[t.op_field])}", where)
        if t.op_field in t.key:
            ctx.error(VigilNameError,
                      f"'{t.op_field}' is both a key field and the op field of table "
                      f"'{t.name}'", where)
        both = {v.lower() for v in t.upsert_ops} & {v.lower() for v in t.delete_ops}
        if both:
            ctx.error(VigilValueError,
                      f"op value(s) {', '.join(sorted(both))} both upsert and delete in table "
                      f"'{t.name}'", where)
    elif t.upsert or t.delete:
        ctx.error(VigilValueError, "upsert/delete values need an op field", t)
    if t.retain is not None and t.retain.ms < 0:
        ctx.error(VigilValueError, "retain cannot be negative", t.retain)


def check_query(ctx: ProgramContext, q: ast.QueryDecl) -> None:
    streams = ctx.check_from(q)
    fields = union_fields(ctx.stream_fields(s) for s in streams)
    _check_search(ctx, q.match, fields)
    ctx.check_notify(q)


def _check_search(ctx: ProgramContext, node: ast.SearchNode, fields: dict[str, str]) -> None:
    for leaf in ast.search_leaves(node):
        if isinstance(leaf, ast.SearchRegex):
            ctx.types.check_regex(leaf.pattern, leaf)
        ctx.types.check_search_leaf(leaf)
        if isinstance(leaf, ast.SearchCompare | ast.SearchRange):
            t = fields.get(leaf.field)
            values = (
                [leaf.value] if isinstance(leaf, ast.SearchCompare) else [leaf.low, leaf.high]
            )
            for v in values:
                if t in T.NUMERIC and isinstance(v, str):
                    ctx.error(
                        VigilTypeError,
                        f"field '{leaf.field}' is {T.describe(t)}; '{v}' is not a number",
                        leaf,
                    )
            if t == T.BOOL:
                ctx.error(
                    VigilTypeError,
                    f"field '{leaf.field}' is a boolean; search it as {leaf.field}:true",
                    leaf,
                )


def check_metric(ctx: ProgramContext, m: ast.MetricDecl) -> None:
    streams = ctx.check_from(m)
    fields = union_fields(ctx.stream_fields(s) for s in streams)
    lists = frozenset(ctx.lists)
    tables = ctx.table_shapes()
    if m.where is not None:
        scope = ExpressionScope("metric where", fields, lists=lists, tables=tables)
        t = ctx.types.expr_type(m.where, scope)
        ctx.types.want_bool(t, m.where, "the metric's 'where'")
    for name in m.by:
        if streams and name not in fields:
            ctx.error(
                VigilNameError, f"group field '{name}' is not a field of the stream",
                ctx.find(m, "by", name),
            )
        for stream in streams:
            declared = ctx.streams[stream].field_type(name)
            if declared in T.UNGROUPED_FIELD_TYPES:
                ctx.error(
                    VigilTypeError,
                    # As the metric compiler words it (cep.metrics.compiler.compile_metric).
                    f"metric '{m.name}': cannot group by '{name}', a {declared} field; "
                    "group by single values",
                    ctx.find(m, "by", name),
                )
                break
    w = m.window
    for d in (w.size, w.every):
        if d is not None and d.ms <= 0:
            ctx.error(VigilValueError, "a window duration must be longer than zero", d)
    if w.every is not None and w.every.ms > w.size.ms:
        every, size = duration_text(w.every.ms), duration_text(w.size.ms)
        ctx.error(
            VigilValueError,
            f"the window moves every {every} but is only {size} long; "
            "events in between would be missed",
            w.every,
        )
    select_scope = ExpressionScope("metric select", fields, lists=lists, tables=tables)
    outputs: dict[str, str] = {name: fields.get(name, T.ANY) for name in m.by}
    for item in m.select:
        t = ctx.types.expr_type(item.expr, select_scope)
        if not has_aggregate(item.expr) and not (
            isinstance(item.expr, ast.FieldRef) and item.expr.name in m.by
        ):
            ctx.error(
                VigilValueError,
                "each select item must be an aggregate such as count() or a 'by' field",
                item,
            )
        outputs[item.name] = t
    ctx.check_unique_names(m.select, "select")
    if m.having is not None:
        t = ctx.types.expr_type(m.having, ExpressionScope("having", outputs, lists=lists))
        ctx.types.want_bool(t, m.having, "'having'")
    ctx.check_notify(m)
