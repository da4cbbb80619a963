"""The grammar rules of a file's declarations (streams, lists, webhooks, rules, queries,
metrics) and of patterns, as transformer methods building syntax-tree nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lark import v_args

from query_lang import ast
from query_lang.errors import VigilSyntaxError
from query_lang.parser.comments import LineSource
from query_lang.parser.node_builder import NodeBuilder


@v_args(meta=True)
class DeclarationRules(NodeBuilder):
    """Transformer methods for the declarations and patterns of the grammar."""

    # ----------------------------------------------------------------- file

    def start(self, meta, children):
        return children

    def _lay_out(self, meta, head=None, lines: Sequence[LineSource] = ()) -> None:
        """Record where the code of each printed line of the declaration at ``meta`` came from,
        for the comments: its first line (ended by the tokens ``head``, the whole declaration
        when not given), then ``lines``."""
        span = self._span(meta)
        head_end = span.end_line
        if head is not None:
            head_end = max(self._span(t).end_line for t in head if t is not None)
        self.layouts.append([("", 0, span.line, head_end), *lines])

    def _clause_lines(self, clauses) -> list[LineSource]:
        """Where the printed lines of ``(key, value, meta)`` clauses came from: one line a
        clause, one an entry of ``define`` (the first from the keyword on)."""
        lines: list[LineSource] = []
        for key, value, where in clauses:
            at = self._span(where)
            if key == "define":
                lines.extend(
                    ("define", i, at.line if i == 0 else d.span.line, d.span.end_line)
                    for i, d in enumerate(value)
                )
            else:
                lines.append((key, 0, at.line, at.end_line))
        return lines

    def _options(self, children, owner: str) -> dict:
        """The ``(key, value, meta)`` options among a declaration's children, each at most
        once."""
        options: dict = {}
        for opt in children:
            if isinstance(opt, tuple):
                key, value, where = opt
                if key in options:
                    raise self._error(VigilSyntaxError, f"{owner} sets '{key}' twice", where)
                options[key] = value
        return options

    def include(self, meta, children):
        self._lay_out(meta)
        return ast.Include(self._string(children[0]), self._span(meta))

    def stream(self, meta, children):
        name, *rest = children
        fields = tuple(c for c in rest if isinstance(c, ast.FieldDecl))
        options = self._options(rest, f"stream '{name}'")
        time_field, time_unit, time_sources = options.get("time", (None, None, ()))
        span = self._span(meta)
        option_lines = [self._span(opt[2]).line for opt in rest if isinstance(opt, tuple)]
        self._lay_out(
            meta,
            [name],
            [("field", i, f.span.line, f.span.end_line) for i, f in enumerate(fields)]
            + [("options", 0, min(option_lines, default=span.end_line), span.end_line)],
        )
        return ast.StreamDecl(
            str(name),
            fields,
            time_field=time_field,
            time_unit=time_unit,
            lateness=options.get("lateness"),
            id_field=options.get("id"),
            ahead=options.get("ahead"),
            span=self._span(meta),
            time_sources=time_sources,
        )

    def field_decl(self, meta, children):
        name, type_name = children
        return ast.FieldDecl(str(name), type_name, self._span(meta))

    def type_name(self, meta, children):
        base, inner = children[0], children[1] if len(children) > 1 else None
        text = str(base).lower() if inner is None else f"{str(base).lower()}<{str(inner).lower()}>"
        if text not in ast.FIELD_TYPES:
            raise self._error(
                VigilSyntaxError,
                f"unknown type '{text}'; expected one of: {', '.join(ast.FIELD_TYPES)}",
                meta,
            )
        return text

    def time_option(self, meta, children):
        sources = tuple(c for c in children if isinstance(c, ast.TimeSource))
        children = [c for c in children if not isinstance(c, ast.TimeSource)]
        field_name, unit = children[0], children[1] if len(children) > 1 else None
        unit_text = None
        if unit is not None:
            unit_text = str(unit).lower()
            if unit_text not in ("s", "ms"):
                raise self._error(
                    VigilSyntaxError, "expected a time unit: s or ms", unit
                )
        return ("time", (str(field_name), unit_text, sources), meta)

    def time_source(self, meta, children):
        kind, field_name = children
        return ast.TimeSource(str(kind).lower(), str(field_name), self._span(meta))

    def lateness_option(self, meta, children):
        return ("lateness", self._duration(children[0]), meta)

    def ahead_option(self, meta, children):
        return ("ahead", self._duration(children[0]), meta)

    def id_option(self, meta, children):
        return ("id", str(children[0]), meta)

    def list_from(self, meta, children):
        name, path = children
        self._lay_out(meta)
        return ast.ListDecl(str(name), path=self._string(path), span=self._span(meta))

    def list_values(self, meta, children):
        name, *values = children
        self._lay_out(meta)
        return ast.ListDecl(
            str(name), values=tuple(self._string(v) for v in values), span=self._span(meta)
        )

    def table(self, meta, children):
        name, stream, *rest = children
        keys = tuple(str(c) for c in rest if not isinstance(c, tuple))
        options = self._options(rest, f"table '{name}'")
        op_field, vocabularies = options.get("op", (None, {}))
        self._lay_out(meta)
        return ast.TableDecl(
            str(name),
            str(stream),
            keys,
            op_field=op_field,
            upsert=vocabularies.get("upsert", ()),
            delete=vocabularies.get("delete", ()),
            retain=options.get("retain"),
            span=self._span(meta),
        )

    def op_option(self, meta, children):
        field_name, *vocabularies = children
        chosen: dict[str, tuple[str, ...]] = {}
        for kind, values, where in vocabularies:
            if kind in chosen:
                raise self._error(VigilSyntaxError, f"op lists its '{kind}' values twice", where)
            chosen[kind] = values
        return ("op", (str(field_name), chosen), meta)

    def op_upsert(self, meta, children):
        return ("upsert", tuple(self._string(c) for c in children), meta)

    def op_delete(self, meta, children):
        return ("delete", tuple(self._string(c) for c in children), meta)

    def retain_option(self, meta, children):
        return ("retain", self._duration(children[0]), meta)

    def webhook(self, meta, children):
        name, url, *secrets = children
        self._lay_out(meta)
        return ast.WebhookDecl(str(name), self._string(url), tuple(secrets), self._span(meta))

    def secret_env(self, meta, children):
        return ast.Secret(env=str(children[0]), span=self._span(meta))

    def secret_value(self, meta, children):
        return ast.Secret(value=self._string(children[0]), span=self._span(meta))

    # ----------------------------------------------------------------- rule

    def rule(self, meta, children):
        name, description, *clauses = children
        fields: dict = {}
        for clause in clauses:
            key, value, where = clause
            if key in fields:
                raise self._error(
                    VigilSyntaxError, f"rule '{name}' has more than one '{key}' clause", where
                )
            fields[key] = value
        for required in ("from", "pattern"):
            if required not in fields:
                raise self._error(
                    VigilSyntaxError, f"rule '{name}' needs a '{required}' clause", meta
                )
        streams = fields.pop("from")
        defines = tuple(
            self._resolve_define_stream(d, streams) for d in fields.pop("define", ())
        )
        contiguity, any_for = fields.pop("contiguity", ("relaxed", ()))
        if any_for:
            contiguity = "relaxed"
        partials = fields.pop("partials", "all")
        self._lay_out(meta, [name, description], self._clause_lines(clauses))
        return ast.RuleDecl(
            name=str(name),
            description=self._string(description) if description is not None else None,
            streams=streams,
            pattern=fields.pop("pattern"),
            by=fields.pop("by", ()),
            contiguity=contiguity,
            any_for=any_for,
            partials=partials,
            defines=defines,
            within=fields.pop("within", None),
            skip=fields.pop("after match", ast.SkipStrategy()),
            emit=fields.pop("emit", None),
            unique=fields.pop("unique", None),
            having=fields.pop("having", None),
            severity=fields.pop("severity", "medium"),
            notify=fields.pop("notify", ()),
            tags=fields.pop("tags", ()),
            throttle=fields.pop("throttle", None),
            span=self._span(meta),
        )

    @staticmethod
    def _resolve_define_stream(define: ast.Define, streams: tuple[str, ...]) -> ast.Define:
        # `v as payments` names one of the rule's streams, not a boolean field
        cond = define.condition
        if (
            define.stream is None
            and isinstance(cond, ast.FieldRef)
            and cond.qualifier is None
            and cond.name in streams
        ):
            return dataclasses.replace(define, stream=cond.name, condition=None)
        return define

    def from_clause(self, meta, children):
        return ("from", tuple(str(c) for c in children), meta)

    def rule_by(self, meta, children):
        return ("by", tuple(children), meta)

    def key_part(self, meta, children):
        return ast.KeyPart(tuple(children), self._span(meta))

    def qualified_name(self, meta, children):
        if len(children) == 2:
            return (str(children[0]), str(children[1]))
        return (None, str(children[0]))

    def pattern_clause(self, meta, children):
        return ("pattern", children[0], meta)

    def contiguity_clause(self, meta, children):
        value = str(children[0]).lower()
        if value not in ("relaxed", "strict", "any"):
            raise self._error(
                VigilSyntaxError, "expected a contiguity: relaxed, strict or any", children[0]
            )
        names = children[1] if len(children) > 1 else None
        if names is not None and value != "any":
            raise self._error(
                VigilSyntaxError,
                f"'contiguity {value} for ...': only `any` applies to some variables "
                "(`contiguity any for v`: relaxed, but an event v takes leaves the partial "
                "match it extends waiting as well)",
                children[0],
            )
        return ("contiguity", (value, tuple(names or ())), meta)

    def contiguity_for(self, meta, children):
        return [str(c) for c in children]

    def partials_clause(self, meta, children):
        value = str(children[0]).lower()
        if value not in ("all", "latest"):
            raise self._error(VigilSyntaxError, "expected 'all' or 'latest'", children[0])
        return ("partials", value, meta)

    def define_clause(self, meta, children):
        return ("define", tuple(children), meta)

    def define(self, meta, children):
        var, body, keys = children[0], children[1], children[2] if len(children) > 2 else None
        stream, condition = body
        return ast.Define(
            str(var), stream=stream, condition=condition, keys=keys or (), span=self._span(meta)
        )

    def define_body(self, meta, children):
        first, second = children[0], children[1] if len(children) > 1 else None
        if second is None:
            return (None, first)
        if not (isinstance(first, ast.FieldRef) and first.qualifier is None):
            raise self._error(
                VigilSyntaxError,
                "expected a stream name before 'where', as in: v as orders where status == \"x\"",
                meta,
            )
        return (first.name, second)

    def keys_one(self, meta, children):
        return (children[0],)

    def keys_many(self, meta, children):
        return tuple(children)

    def within_clause(self, meta, children):
        return ("within", self._duration(children[0]), meta)

    def skip_clause(self, meta, children):
        return ("after match", children[0], meta)

    def skip_past_last(self, meta, children):
        return ast.SkipStrategy("past_last", span=self._span(meta))

    def skip_to_next(self, meta, children):
        return ast.SkipStrategy("to_next", span=self._span(meta))

    def skip_to_first(self, meta, children):
        return ast.SkipStrategy("to_first", str(children[0]), self._span(meta))

    def skip_to_last(self, meta, children):
        return ast.SkipStrategy("to_last", str(children[0]), self._span(meta))

    def no_skip(self, meta, children):
        return ast.SkipStrategy("no_skip", span=self._span(meta))

    def emit_clause(self, meta, children):
        return ("emit", tuple(children), meta)

    def unique_clause(self, meta, children):
        *exprs, within = children
        unique = ast.Unique(
            tuple(exprs), None if within is None else self._duration(within), self._span(meta)
        )
        return ("unique", unique, meta)

    def emit_item(self, meta, children):
        expr, alias = children[0], children[1] if len(children) > 1 else None
        return ast.EmitItem(expr, str(alias) if alias is not None else None, self._span(meta))

    def severity_clause(self, meta, children):
        value = str(children[0]).lower()
        if value not in ast.SEVERITIES:
            raise self._error(
                VigilSyntaxError,
                "expected a severity: low, medium, high or critical",
                children[0],
            )
        return ("severity", value, meta)

    def notify_clause(self, meta, children):
        return ("notify", tuple(str(c) for c in children), meta)

    def tags_clause(self, meta, children):
        return ("tags", tuple(self._string(c) for c in children), meta)

    def throttle_clause(self, meta, children):
        return ("throttle", self._duration(children[0]), meta)

    # ----------------------------------------------------------------- patterns

    def pat_alt(self, meta, children):
        if len(children) == 1:
            return children[0]
        options: list = []
        for c in children:
            options.extend(c.options if isinstance(c, ast.PatAlt) else [c])
        return ast.PatAlt(tuple(options), self._span(meta))

    def pat_seq(self, meta, children):
        if len(children) == 1:
            return children[0]
        items: list = []
        for c in children:
            items.extend(c.items if isinstance(c, ast.PatSeq) else [c])
        return ast.PatSeq(tuple(items), self._span(meta))

    def pat_quant(self, meta, children):
        if len(children) == 1:
            return children[0]
        inner, quant = children
        if quant is None:
            return inner
        low, high, greedy = quant
        return ast.PatQuant(inner, low, high, greedy, self._span(meta))

    def pat_absent(self, meta, children):
        return ast.PatAbsent(str(children[0]), self._span(meta))

    def pat_var(self, meta, children):
        return ast.PatVar(str(children[0]), self._span(meta))

    def _bounds(self, low: int, high: int | None, reluctant, meta):
        # impossible bounds ({5,2}, {0}) are reported by the checks, with the rest of the rule
        return (low, high, reluctant is None)

    def q_optional(self, meta, children):
        return self._bounds(0, 1, children[1] if len(children) > 1 else None, meta)

    def q_star(self, meta, children):
        return self._bounds(0, None, children[1] if len(children) > 1 else None, meta)

    def q_plus(self, meta, children):
        return self._bounds(1, None, children[1] if len(children) > 1 else None, meta)

    def q_exact(self, meta, children):
        n = int(children[0])
        return self._bounds(n, n, children[1] if len(children) > 1 else None, meta)

    def q_range(self, meta, children):
        low = int(children[0])
        high = int(children[1]) if children[1] is not None else None
        return self._bounds(low, high, children[2] if len(children) > 2 else None, meta)

    def q_upto(self, meta, children):
        return self._bounds(0, int(children[0]), children[1] if len(children) > 1 else None, meta)

    def reluctant(self, meta, children):
        return True

    # ----------------------------------------------------------------- query and metric

    def query(self, meta, children):
        name, description, *clauses = children
        fields: dict = {}
        for key, value, where in clauses:
            if key in fields:
                raise self._error(
                    VigilSyntaxError, f"query '{name}' has more than one '{key}' clause", where
                )
            fields[key] = value
        for required in ("from", "match"):
            if required not in fields:
                raise self._error(
                    VigilSyntaxError, f"query '{name}' needs a '{required}' clause", meta
                )
        self._lay_out(meta, [name, description], self._clause_lines(clauses))
        return ast.QueryDecl(
            name=str(name),
            streams=fields["from"],
            match=fields["match"],
            description=self._string(description) if description is not None else None,
            severity=fields.get("severity", "medium"),
            notify=fields.get("notify", ()),
            tags=fields.get("tags", ()),
            throttle=fields.get("throttle"),
            span=self._span(meta),
        )

    def match_clause(self, meta, children):
        return ("match", children[0], meta)

    def metric(self, meta, children):
        name, description, *clauses = children
        fields: dict = {}
        for key, value, where in clauses:
            if key in fields:
                raise self._error(
                    VigilSyntaxError, f"metric '{name}' has more than one '{key}' clause", where
                )
            fields[key] = value
        for required in ("from", "window", "select"):
            if required not in fields:
                raise self._error(
                    VigilSyntaxError, f"metric '{name}' needs a '{required}' clause", meta
                )
        self._lay_out(meta, [name, description], self._clause_lines(clauses))
        return ast.MetricDecl(
            name=str(name),
            streams=fields["from"],
            window=fields["window"],
            select=fields["select"],
            description=self._string(description) if description is not None else None,
            by=fields.get("by", ()),
            where=fields.get("where"),
            having=fields.get("having"),
            severity=fields.get("severity", "medium"),
            notify=fields.get("notify", ()),
            tags=fields.get("tags", ()),
            throttle=fields.get("throttle"),
            span=self._span(meta),
        )

    def where_clause(self, meta, children):
        return ("where", children[0], meta)

    def metric_by(self, meta, children):
        return ("by", tuple(str(c) for c in children), meta)

    def window_clause(self, meta, children):
        return ("window", children[0], meta)

    def select_clause(self, meta, children):
        return ("select", tuple(children), meta)

    def having_clause(self, meta, children):
        return ("having", children[0], meta)

    def w_tumbling(self, meta, children):
        return ast.Window("tumbling", self._duration(children[0]), span=self._span(meta))

    def w_hopping(self, meta, children):
        return ast.Window(
            "hopping", self._duration(children[0]), self._duration(children[1]), self._span(meta)
        )

    def w_sliding(self, meta, children):
        every = self._duration(children[1]) if len(children) > 1 and children[1] else None
        return ast.Window("sliding", self._duration(children[0]), every, self._span(meta))

    def w_session(self, meta, children):
        return ast.Window("session", self._duration(children[0]), span=self._span(meta))
