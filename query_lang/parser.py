"""Text to syntax tree: the Lark parser, the transformer into :mod:`query_lang.ast` nodes, and
the translation of parser errors into messages a user understands.

No Lark ``Tree`` or ``Token`` leaves this module. A file is parsed one top-level block at a time,
so one syntax error does not hide the errors of the blocks after it.
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from importlib import resources

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from query_lang import ast
from query_lang.errors import ErrorList, VigilError, VigilSyntaxError, VigilValueError

DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# What each regex terminal is, in the words an error message uses.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "STRING": 'a string in quotes such as "text"',
    "DURATION": "a duration such as 10m",
    "NUMBER": "a number",
    "INT": "a whole number",
    "REGEX": "a regular expression such as /ab+c/",
    "SWORD": "a search term",
    "COMPARE": "a comparison such as >=",
    "STRING_TEST": "contains, startswith or endswith",
    "ADD_OP": "+ or -",
    "MUL_OP": "*, / or %",
    "RANGE_OPEN": "[ or {",
    "RANGE_CLOSE": "] or }",
    "QMARK": "?",
    "STAR": "*",
    "PLUS": "+",
    "$END": "the end of the file",
}

# Tokens that start a top-level block: a parse resumes here after a syntax error.
_BLOCK_START = re.compile(
    r"^[ \t]*(?:(?:rule|query|metric|stream|list|webhook)[ \t]+[A-Za-z_]|include[ \t]+[\"'])",
    re.IGNORECASE | re.MULTILINE,
)


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = resources.files("query_lang").joinpath("vigil.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        start=["start", "search_query", "expr"],
        propagate_positions=True,
        maybe_placeholders=True,
    )


@lru_cache(maxsize=1)
def _terminal_words() -> dict[str, str]:
    """Terminal name -> description, built from the grammar so no internal name escapes."""
    words = dict(_TERMINAL_WORDS)
    for term in _lark().terminals:
        if term.name in words:
            continue
        pattern = term.pattern
        if pattern.type == "str":
            words[term.name] = f"'{pattern.value}'"
        else:
            # keyword terminals written as alternatives ("OR" | "||") or case-insensitive strings
            text = pattern.value.replace("(?:", "").replace(")", "").replace("\\", "")
            first = text.split("|")[0]
            words[term.name] = f"'{first}'"
    return words


def describe_expected(expected: set[str] | frozenset[str]) -> str:
    """Turn a set of terminal names into ``expected X, Y or Z``."""
    words = _terminal_words()
    if {"NAME", "NUMBER", "STRING"} <= set(expected):
        return "a value or an expression such as amount > 10"
    names = sorted({words.get(name, name.lower().strip("_")) for name in expected})
    # keep messages short: specific words first, punctuation later
    names.sort(key=lambda w: (w.startswith("'") and not w[1:2].isalpha(), w))
    if len(names) > 8:
        names = names[:8] + [f"{len(names) - 8} more"]
    if not names:
        return "nothing more"
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " or " + names[-1]


# --------------------------------------------------------------------------- public API


def parse(text: str, path: str = "<string>") -> ast.Module:
    """Parse a whole file into a :class:`~query_lang.ast.Module`.

    Raises
    ------
    ErrorList
        With every syntax error of the file (one per broken top-level block).
    """
    module, errors = parse_recovering(text, path)
    if errors:
        raise ErrorList(errors)
    return module


def parse_recovering(text: str, path: str = "<string>") -> tuple[ast.Module, list[VigilError]]:
    """Parse what can be parsed; return the module of the good blocks and the errors of the bad.

    Each top-level block is parsed on its own (it starts at a line that opens with ``rule``,
    ``query``, ``metric``, ``stream``, ``list``, ``webhook`` or ``include``), so an error
    resynchronises at the next block.
    """
    declarations: list[ast.Declaration] = []
    errors: list[VigilError] = []
    line_offset = counted = 0
    for start, end in _block_bounds(text):
        chunk = text[start:end]
        if not chunk.strip() or _only_comments(chunk):
            continue
        # Lines before the block, counted on from the previous block (not from the top of the
        # file each time: that made loading n blocks quadratic).
        line_offset += text.count("\n", counted, start)
        counted = start
        try:
            declarations.extend(_parse_start(chunk, path, line_offset, text))
        except VigilError as err:
            errors.append(err)
    module = ast.Module(tuple(declarations), path=path, span=ast.Span(path, 1, 1, 1, 1))
    return module, errors


def parse_expr(text: str, path: str = "<string>") -> ast.Expr:
    """Parse a single expression (used by the API and by tests)."""
    tree = _run_parser(text, "expr", path, 0, text)
    return _transform(tree, path, 0, text)


def parse_search(
    text: str, path: str = "<string>", *, at: ast.Span | None = None
) -> ast.SearchNode:
    """Parse the search syntax of ``query ... match`` (also the text of ``search(f, "...")``).

    ``at`` is where the text sits inside a rule file, so errors point into that file.
    """
    line_offset = (at.line - 1) if at else 0
    column_offset = at.column if at else 0
    try:
        tree = _run_parser(text, "search_query", path, line_offset, text)
        return _transform(tree, path, line_offset, text)
    except VigilError as err:
        if at is not None and err.span is not None:
            # point into the string literal: same line, shifted by the literal's column
            same_line = err.span.line == at.line
            column = err.span.column + column_offset if same_line else err.span.column
            span = dataclasses.replace(err.span, column=column)
            raise type(err)(err.message, span, None) from None
        raise


# --------------------------------------------------------------------------- internals


def _block_bounds(text: str) -> list[tuple[int, int]]:
    starts = [m.start() for m in _BLOCK_START.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    bounds = list(zip(starts, starts[1:] + [len(text)], strict=True))
    return bounds


def _only_comments(chunk: str) -> bool:
    return all(not ln.strip() or ln.strip().startswith("#") for ln in chunk.splitlines())


def _parse_start(chunk: str, path: str, line_offset: int, full_text: str) -> list:
    tree = _run_parser(chunk, "start", path, line_offset, full_text)
    module = _transform(tree, path, line_offset, full_text)
    return list(module)


def _run_parser(text: str, start: str, path: str, line_offset: int, full_text: str):
    try:
        return _lark().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, path, line_offset, full_text) from None


def _syntax_error(
    err: UnexpectedInput, text: str, path: str, line_offset: int, full_text: str
) -> VigilSyntaxError:
    line = (err.line if err.line and err.line > 0 else text.count("\n") + 1) + line_offset
    column = err.column if err.column and err.column > 0 else 1
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            # point just past the last character that is neither blank nor in a comment line
            stripped = text.rstrip()
            while stripped and stripped.rsplit("\n", 1)[-1].lstrip().startswith("#"):
                stripped = stripped.rsplit("\n", 1)[0].rstrip() if "\n" in stripped else ""
            line = stripped.count("\n") + 1 + line_offset
            column = len(stripped.rsplit("\n", 1)[-1]) + 1
            found = "end of the block"
        else:
            found = f"'{token}'"
        message = f"unexpected {found}; expected {describe_expected(err.expected)}"
    elif isinstance(err, UnexpectedCharacters):
        char = text[err.pos_in_stream] if err.pos_in_stream < len(text) else ""
        if char in "\"'":
            message = "unterminated string: a string must end on the line it starts"
        else:
            message = f"unexpected character {char!r}"
            if err.allowed:
                message += f"; expected {describe_expected(set(err.allowed))}"
    elif isinstance(err, UnexpectedEOF):
        message = f"unexpected end of input; expected {describe_expected(set(err.expected))}"
    else:  # pragma: no cover - lark has no other subclasses
        message = str(err)
    span = ast.Span(path, line, column, line, column + 1)
    return VigilSyntaxError(message, span, full_text)


def _transform(tree, path: str, line_offset: int, full_text: str):
    try:
        return _ToAst(path, line_offset, full_text).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, VigilError):
            raise err.orig_exc from None
        raise


def _unescape(body: str) -> str:
    """Process backslash escapes in a string literal's body."""
    out: list[str] = []
    i = 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6] or ""):
                out.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def duration_ms(text: str) -> int:
    """``10m`` -> 600000."""
    match = re.fullmatch(r"([0-9]+)(ms|s|m|h|d)", text)
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return int(match.group(1)) * DURATION_UNITS_MS[match.group(2)]


def _search_number(text: str) -> str | int | float:
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"-?[0-9]*\.[0-9]+([eE][+-]?[0-9]+)?|-?[0-9]+[eE][+-]?[0-9]+", text):
        return float(text)
    return text


@v_args(meta=True)
class _ToAst(Transformer):
    """Lark tree -> frozen AST dataclasses, with source spans."""

    def __init__(self, path: str, line_offset: int, source: str):
        super().__init__()
        self.path = path
        self.line_offset = line_offset
        self.source = source

    # ----------------------------------------------------------------- helpers

    def _span(self, meta) -> ast.Span:
        if isinstance(meta, Token):
            return ast.Span(
                self.path,
                meta.line + self.line_offset,
                meta.column,
                (meta.end_line or meta.line) + self.line_offset,
                meta.end_column or meta.column,
            )
        if getattr(meta, "empty", True):
            return ast.Span(self.path, 0, 0, 0, 0)
        return ast.Span(
            self.path,
            meta.line + self.line_offset,
            meta.column,
            meta.end_line + self.line_offset,
            meta.end_column,
        )

    def _error(self, cls, message: str, where) -> VigilError:
        return cls(message, self._span(where), self.source)

    def _duration(self, tok: Token) -> ast.Duration:
        return ast.Duration(duration_ms(str(tok)), self._span(tok))

    @staticmethod
    def _string(tok: Token) -> str:
        return _unescape(str(tok)[1:-1])

    # ----------------------------------------------------------------- file

    def start(self, meta, children):
        return children

    def include(self, meta, children):
        return ast.Include(self._string(children[0]), self._span(meta))

    def stream(self, meta, children):
        name, *rest = children
        fields = tuple(c for c in rest if isinstance(c, ast.FieldDecl))
        options: dict = {}
        for opt in rest:
            if isinstance(opt, tuple):
                key, value, where = opt
                if key in options:
                    raise self._error(
                        VigilSyntaxError, f"stream '{name}' sets '{key}' twice", where
                    )
                options[key] = value
        time_field, time_unit = options.get("time", (None, None))
        return ast.StreamDecl(
            str(name),
            fields,
            time_field=time_field,
            time_unit=time_unit,
            lateness=options.get("lateness"),
            id_field=options.get("id"),
            span=self._span(meta),
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
        field_name, unit = children[0], children[1] if len(children) > 1 else None
        unit_text = None
        if unit is not None:
            unit_text = str(unit).lower()
            if unit_text not in ("s", "ms"):
                raise self._error(
                    VigilSyntaxError, "expected a time unit: s or ms", unit
                )
        return ("time", (str(field_name), unit_text), meta)

    def lateness_option(self, meta, children):
        return ("lateness", self._duration(children[0]), meta)

    def id_option(self, meta, children):
        return ("id", str(children[0]), meta)

    def list_from(self, meta, children):
        name, path = children
        return ast.ListDecl(str(name), path=self._string(path), span=self._span(meta))

    def list_values(self, meta, children):
        name, *values = children
        return ast.ListDecl(
            str(name), values=tuple(self._string(v) for v in values), span=self._span(meta)
        )

    def webhook(self, meta, children):
        name, url, *secrets = children
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
        contiguity = fields.pop("contiguity", "relaxed")
        partials = fields.pop("partials", "all")
        return ast.RuleDecl(
            name=str(name),
            description=self._string(description) if description is not None else None,
            streams=streams,
            pattern=fields.pop("pattern"),
            by=fields.pop("by", ()),
            contiguity=contiguity,
            partials=partials,
            defines=defines,
            within=fields.pop("within", None),
            skip=fields.pop("after match", ast.SkipStrategy()),
            emit=fields.pop("emit", None),
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
        return ("contiguity", value, meta)

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
        return (str(children[0]),)

    def keys_many(self, meta, children):
        return tuple(str(c) for c in children)

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

    # ----------------------------------------------------------------- expressions

    def or_(self, meta, children):
        return self._boolop("or", children, meta)

    def and_(self, meta, children):
        return self._boolop("and", children, meta)

    def _boolop(self, op, children, meta):
        if len(children) == 1:
            return children[0]
        operands: list = []
        for c in children:
            operands.extend(c.operands if isinstance(c, ast.BoolOp) and c.op == op else [c])
        return ast.BoolOp(op, tuple(operands), self._span(meta))

    def not_(self, meta, children):
        return ast.Not(children[0], self._span(meta))

    def compare(self, meta, children):
        left, op, right = children
        return ast.BinOp(str(op), left, right, self._span(meta))

    def string_test(self, meta, children):
        left, op, right = children
        return ast.BinOp(str(op).lower(), left, right, self._span(meta))

    def in_values(self, meta, children):
        operand, *values = children
        return ast.InValues(operand, tuple(values), self._span(meta))

    def in_list(self, meta, children):
        return ast.InList(children[0], str(children[1]), self._span(meta))

    def between(self, meta, children):
        return ast.Between(children[0], children[1], children[2], self._span(meta))

    def is_null(self, meta, children):
        return ast.IsNull(children[0], False, self._span(meta))

    def is_not_null(self, meta, children):
        return ast.IsNull(children[0], True, self._span(meta))

    def matches(self, meta, children):
        operand, regex = children
        return ast.Matches(operand, _regex_body(str(regex)), self._span(meta))

    def arith(self, meta, children):
        left = children[0]  # a single operand passes through unchanged
        for i in range(1, len(children), 2):
            op, right = children[i], children[i + 1]
            span = ast.Span(
                self.path, left.span.line, left.span.column, right.span.end_line,
                right.span.end_column,
            )
            left = ast.BinOp(str(op), left, right, span)
        return left

    def neg(self, meta, children):
        operand = children[0]
        if isinstance(operand, ast.Literal) and isinstance(operand.value, int | float) and not (
            isinstance(operand.value, bool)
        ):
            return ast.Literal(-operand.value, self._span(meta))
        return ast.Neg(operand, self._span(meta))

    def number(self, meta, children):
        text = str(children[0])
        value: int | float = float(text) if any(c in text for c in ".eE") else int(text)
        return ast.Literal(value, self._span(meta))

    def string(self, meta, children):
        return ast.Literal(self._string(children[0]), self._span(meta))

    def duration(self, meta, children):
        return self._duration(children[0])

    def true(self, meta, children):
        return ast.Literal(True, self._span(meta))

    def false(self, meta, children):
        return ast.Literal(False, self._span(meta))

    def null(self, meta, children):
        return ast.Literal(None, self._span(meta))

    def field(self, meta, children):
        return ast.FieldRef(str(children[0]), None, self._span(meta))

    def qualified_field(self, meta, children):
        return ast.FieldRef(str(children[1]), str(children[0]), self._span(meta))

    def call(self, meta, children):
        name, *args = children
        args = [a for a in args if a is not None]
        func = str(name)
        span = self._span(meta)
        lowered = func.lower()
        if lowered == "prev":
            return self._prev(args, span, meta)
        if lowered == "search":
            return self._search(args, span, meta)
        if lowered in ("first", "last"):
            raise self._error(
                VigilSyntaxError,
                f"{lowered}(v) names an event; read one of its fields, as in {lowered}(v).amount",
                meta,
            )
        return ast.Call(lowered, tuple(args), span)

    def call_field(self, meta, children):
        name, *rest = children
        field_name = rest[-1]
        args = [a for a in rest[:-1] if a is not None]
        func = str(name).lower()
        if func not in ("first", "last"):
            raise self._error(
                VigilSyntaxError,
                f"only first(v).field and last(v).field can be followed by '.', not {func}()",
                meta,
            )
        if len(args) != 1 or not (
            isinstance(args[0], ast.FieldRef) and args[0].qualifier is None
        ):
            raise self._error(
                VigilSyntaxError, f"{func}() takes one pattern variable, as in {func}(v).amount",
                meta,
            )
        return ast.VarField(func, args[0].name, str(field_name), self._span(meta))

    def _prev(self, args, span, meta):
        if not args or len(args) > 2:
            raise self._error(VigilSyntaxError, "prev() takes a field and an optional count", meta)
        target = args[0]
        if not (isinstance(target, ast.FieldRef) and target.qualifier is None):
            raise self._error(
                VigilSyntaxError, "prev() reads a field of the current stream, as in prev(price)",
                meta,
            )
        n = 1
        if len(args) == 2:
            count = args[1]
            if not (isinstance(count, ast.Literal) and type(count.value) is int):
                raise self._error(
                    VigilSyntaxError, "the count of prev(f, n) must be a whole number", meta
                )
            n = count.value
            if n < 1:
                raise self._error(VigilValueError, "the count of prev(f, n) must be at least 1",
                                  meta)
        return ast.Prev(target.name, n, span)

    def _search(self, args, span, meta):
        if (
            len(args) != 2
            or not (isinstance(args[0], ast.FieldRef) and args[0].qualifier is None)
            or not (isinstance(args[1], ast.Literal) and isinstance(args[1].value, str))
        ):
            raise self._error(
                VigilSyntaxError,
                'search() takes a field and a query in quotes, as in search(body, "acme*")',
                meta,
            )
        text = args[1].value
        at = args[1].span
        query = parse_search(text, self.path, at=ast.Span(
            self.path, at.line, at.column, at.end_line, at.end_column
        )) if text.strip() else None
        if query is None:
            raise self._error(VigilSyntaxError, "search() needs a non-empty query", meta)
        return ast.Search(args[0].name, query, text, span)

    # ----------------------------------------------------------------- search

    def s_or(self, meta, children):
        if len(children) == 1:
            return children[0]
        clauses: list = []
        for c in children:
            clauses.extend(c.clauses if isinstance(c, ast.SearchOr) else [c])
        return ast.SearchOr(tuple(clauses), self._span(meta))

    def s_and(self, meta, children):
        if len(children) == 1:
            return children[0]
        clauses: list = []
        for c in children:
            clauses.extend(c.clauses if isinstance(c, ast.SearchAnd) else [c])
        return ast.SearchAnd(tuple(clauses), self._span(meta))

    def s_not(self, meta, children):
        return ast.SearchNot(children[-1], self._span(meta))

    def s_required(self, meta, children):
        return children[-1]

    def s_default_field(self, meta, children):
        return self._search_leaf(None, children[0])

    def s_group_value(self, meta, children):
        return self._search_leaf(None, children[0])

    def s_field(self, meta, children):
        field_tok, value = children
        field_name = str(field_tok)
        if field_name == "_exists_":
            if value.type != "SWORD":
                raise self._error(VigilSyntaxError, "_exists_ takes a field name", value)
            return ast.SearchExists(str(value), self._span(meta))
        return self._search_leaf(field_name, value, start=field_tok)

    def s_field_group(self, meta, children):
        field_tok, group = children
        return _with_field(group, str(field_tok))

    def s_field_range(self, meta, children):
        field_tok, rng = children
        return dataclasses.replace(rng, field=str(field_tok), span=self._span(meta))

    def s_group_range(self, meta, children):
        return children[0]

    def s_range(self, meta, children):
        open_tok, low, high, close_tok = children
        return ast.SearchRange(
            "", low, high, str(open_tok) == "[", str(close_tok) == "]", self._span(meta)
        )

    def s_bound(self, meta, children):
        tok = children[-1]
        if tok.type == "STRING":
            return self._string(tok)
        text = str(tok)
        if text == "*":
            return None
        return _search_number(text)

    def s_negative_bound(self, meta, children):
        value = _search_number("-" + str(children[0]))
        if isinstance(value, str):
            raise self._error(VigilSyntaxError, "expected a number after '-'", children[0])
        return value

    def s_compare(self, meta, children):
        field_tok, op_tok, value = children
        op = str(op_tok)
        if op in ("==", "!="):
            raise self._error(
                VigilSyntaxError,
                f"use field:value to search for a value (and NOT field:value), not '{op}'",
                op_tok,
            )
        if value is None:
            raise self._error(VigilSyntaxError, "a comparison needs a value, not *", meta)
        return ast.SearchCompare(str(field_tok), op, value, self._span(meta))

    def _search_leaf(self, field_name: str | None, tok: Token, start: Token | None = None):
        span = self._span(start or tok)
        if start is not None:
            span = dataclasses.replace(span, end_line=tok.end_line + self.line_offset,
                                       end_column=tok.end_column)
        text = str(tok)
        if tok.type == "STRING":
            return ast.SearchPhrase(field_name, self._string(tok), span)
        if tok.type == "REGEX":
            return ast.SearchRegex(field_name, _regex_body(text), span)
        wildcards = _unescaped_wildcards(text)
        if not wildcards:
            return ast.SearchTerm(field_name, _unescape_word(text), span)
        if wildcards == [len(text) - 1] and text.endswith("*") and len(text) > 1:
            return ast.SearchPrefix(field_name, _unescape_word(text[:-1]), span)
        return ast.SearchWildcard(field_name, text, span)


def _unescaped_wildcards(word: str) -> list[int]:
    """Positions of the ``*`` and ``?`` in a search word that a backslash does not escape."""
    found, i = [], 0
    while i < len(word):
        if word[i] == "\\":
            i += 2
            continue
        if word[i] in "*?":
            found.append(i)
        i += 1
    return found


def _unescape_word(word: str) -> str:
    """``caf\\*`` -> ``caf*``: a backslash makes the next character literal."""
    return re.sub(r"\\(.)", r"\1", word)


def _regex_body(token_text: str) -> str:
    return token_text[1:-1].replace("\\/", "/")


def _with_field(node, field_name: str):
    """Give every leaf of a field group ``field:(...)`` the group's field."""
    if isinstance(node, ast.SearchAnd | ast.SearchOr):
        return dataclasses.replace(
            node, clauses=tuple(_with_field(c, field_name) for c in node.clauses)
        )
    if isinstance(node, ast.SearchNot):
        return dataclasses.replace(node, clause=_with_field(node.clause, field_name))
    return dataclasses.replace(node, field=field_name)


__all__ = [
    "parse",
    "parse_recovering",
    "parse_expr",
    "parse_search",
    "duration_ms",
    "describe_expected",
    "ErrorList",
]
