"""EQL conditions as Vigil expressions, with EQL's three-valued logic kept exact.

EQL's ``not``, ``and`` and ``or`` treat a comparison with null as null, not false:
``not (x == 1)`` is null when ``x`` is missing, so the event does not match. Vigil's logic is
two-valued (a comparison with null is false, and ``not`` of false is true). So every EQL
condition becomes two Vigil expressions, never null: when it is *true* and when it is *false*
(:class:`Condition`); ``not c`` swaps them, and "c is null" is "neither". A comparison's
"false" is the opposite comparison (``x != 1``), which Vigil makes false on null, as needed.

Field types come first (:class:`FieldTypes`, from a schema and from how each field is used), so
that case folding and integer division are decided before any text is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eql import ast as eql_ast

from query_lang.functions import SCALAR_FUNCTIONS
from query_lang.imports.eql.errors import EqlImportError
from query_lang.imports.eql.reading import ParsedQuery
from query_lang.imports.eql.regex import PatternError, python_regex, wildcard_regex
from query_lang.lexical import quote

__all__ = [
    "Condition",
    "ExpressionWriter",
    "FieldTypes",
    "VIGIL_TYPES",
    "field_name",
    "infer_types",
    "join_terms",
    "pipe_name",
]

VIGIL_TYPES = ("string", "int", "float", "bool")
"""The types a field of an imported stream is declared with."""

_NUMBER = "number"  # an integer or a float: settled once every use is seen
_NOT_WRITTEN = object()

# Words that end or change an expression where a field name would stand.
_KEYWORDS = frozenset(
    "and or not in between is null true false matches contains startswith endswith as where "
    "by within define pattern from emit severity".split()
)

_NEGATED_COMPARISON = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_MATH_FUNCTIONS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "modulo": "%"}
_STRING_TESTS = {"startsWith": "startswith", "endsWith": "endswith", "stringContains": "contains"}
_STRING_ARGUMENT_FUNCTIONS = frozenset(
    {"wildcard", "match", "matchLite", "length", "cidrMatch", "between", "indexOf", "substring",
     *_STRING_TESTS}
)


@dataclass(frozen=True)
class Condition:
    """An EQL condition as two Vigil boolean expressions: when it holds, when it fails (both
    false when the EQL value is null)."""

    true: str
    false: str

    def negated(self) -> Condition:
        return Condition(self.false, self.true)


@dataclass(frozen=True)
class _Value:
    text: str
    type: str | None  # a Vigil type, _NUMBER, or None (null)
    literal: Any = _NOT_WRITTEN


def field_name(parsed: ParsedQuery, node: eql_ast.Field) -> str:
    """The Vigil field an EQL field path reads: ``process.parent.name`` -> ``process_parent_name``
    (flattened events carry it under that name); an array index is an error."""
    parts = [node.base, *node.path]
    if any(not isinstance(p, str) for p in parts):
        raise parsed.error(
            node, f"field `{node.render()}` indexes an array; Vigil fields are scalars or "
            "lists of strings", construct="array index",
        )
    name = "_".join(re.sub(r"[^A-Za-z0-9_]", "_", p) for p in parts)
    if name[0].isdigit():
        name = "_" + name
    if name.lower() in _KEYWORDS:
        raise parsed.error(node, f"field `{node.render()}` would be the Vigil keyword `{name}`",
                           construct="keyword field")
    return name


class FieldTypes:
    """The type of each field of each stream: a schema's word first, else what the queries'
    uses say (compared with a string: ``string``; with an integer: ``int`` ...), else
    ``string``."""

    def __init__(self, schema: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.schema = {s: dict(f) for s, f in (schema or {}).items()}
        self.inferred: dict[tuple[str, str], str] = {}
        self.where: dict[tuple[str, str], tuple[ParsedQuery, Any]] = {}

    def declared(self, stream: str, name: str) -> str | None:
        return self.schema.get(stream, {}).get(name) or self.schema.get("*", {}).get(name)

    def note(self, streams: Iterable[str], name: str, kind: str, parsed: ParsedQuery,
             node: Any) -> None:
        for stream in streams:
            if self.declared(stream, name):
                continue
            key = (stream, name)
            before = self.inferred.get(key)
            merged = _merge(before, kind)
            if merged is None:
                raise parsed.error(
                    node, f"field `{name}` of stream `{stream}` is used as {before} and as "
                    f"{kind}; give its type with a schema", construct="field type conflict",
                )
            self.inferred[key] = merged
            self.where.setdefault(key, (parsed, node))

    def known(self, streams: Iterable[str], name: str) -> str | None:
        found = None
        for stream in streams:
            kind = self.declared(stream, name) or self.inferred.get((stream, name))
            found = found or kind
        return found

    def of(self, stream: str, name: str) -> str:
        """The declared type: a schema's, else the inferred one, else ``string``."""
        kind = self.declared(stream, name) or self.inferred.get((stream, name)) or "string"
        return "int" if kind == _NUMBER else kind


def _merge(before: str | None, kind: str) -> str | None:
    if before is None or before == kind:
        return kind
    numeric = {_NUMBER, "int", "float"}
    if before in numeric and kind in numeric:
        if "float" in (before, kind):
            return "float"
        return "int"
    return None


def _literal_type(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string"


def infer_types(parsed: ParsedQuery, node: Any, streams: list[str], types: FieldTypes) -> None:
    """Note in ``types`` what the uses of the fields of ``node`` (a condition on events of
    ``streams``) say about their types."""
    pairs: list[tuple[str, str]] = []

    def static(n: Any) -> str | None:
        if isinstance(n, eql_ast.Literal):
            return _literal_type(n.value)
        if isinstance(n, eql_ast.Field):
            return types.known(streams, field_name(parsed, n))
        if isinstance(n, eql_ast.MathOperation) or (
            isinstance(n, eql_ast.FunctionCall) and n.name in _MATH_FUNCTIONS
        ):
            return _NUMBER
        if isinstance(n, eql_ast.FunctionCall) and n.name in ("length", "indexOf", "number"):
            return _NUMBER
        if isinstance(n, eql_ast.FunctionCall) and n.name in ("concat", "substring", "string",
                                                               "between"):
            return "string"
        return None

    def note_field(n: Any, kind: str | None) -> None:
        if isinstance(n, eql_ast.Field) and kind is not None:
            types.note(streams, field_name(parsed, n), kind, parsed, n)

    def walk(n: Any, boolean: bool) -> None:
        if isinstance(n, eql_ast.Field):
            if boolean:
                note_field(n, "bool")
            return
        if isinstance(n, eql_ast.Comparison):
            left, right = n.left, n.right
            if isinstance(left, eql_ast.Field) and isinstance(right, eql_ast.Field):
                pairs.append((field_name(parsed, left), field_name(parsed, right)))
            note_field(left, static(right))
            note_field(right, static(left))
            walk(left, False)
            walk(right, False)
            return
        if isinstance(n, eql_ast.InSet):
            kinds = {static(c) for c in n.container if not isinstance(c, eql_ast.Field)}
            kinds.discard(None)
            if len(kinds) == 1:
                note_field(n.expression, kinds.pop())
            walk(n.expression, False)
            for item in n.container:
                if isinstance(item, eql_ast.Field) and isinstance(n.expression, eql_ast.Field):
                    pairs.append((field_name(parsed, n.expression), field_name(parsed, item)))
                walk(item, False)
            return
        if isinstance(n, eql_ast.MathOperation):
            for side in (n.left, n.right):
                note_field(side, _NUMBER)
                walk(side, False)
            return
        if isinstance(n, eql_ast.FunctionCall):
            for i, arg in enumerate(n.arguments):
                if n.name in _MATH_FUNCTIONS:
                    note_field(arg, _NUMBER)
                elif n.name in _STRING_ARGUMENT_FUNCTIONS and (i == 0 or n.name in _STRING_TESTS):
                    note_field(arg, "string")
                walk(arg, False)
            return
        if isinstance(n, (eql_ast.And, eql_ast.Or)):
            for term in n.terms:
                walk(term, True)
            return
        if isinstance(n, eql_ast.Not):
            walk(n.term, True)
            return
        if isinstance(n, (eql_ast.IsNull, eql_ast.IsNotNull)):
            walk(n.expr, False)

    walk(node, True)
    # A field compared with another takes its type.
    for _ in range(len(pairs)):
        for a, b in pairs:
            ka, kb = types.known(streams, a), types.known(streams, b)
            if ka and not kb:
                types.note(streams, b, ka, parsed, node)
            elif kb and not ka:
                types.note(streams, a, kb, parsed, node)


@dataclass
class ExpressionWriter:
    """Writes the Vigil text of EQL conditions of one query, for events of ``streams``.

    ``case_insensitive(node)`` says whether a string operation folds case (the dialect's rule);
    ``field_type(name)`` gives a field's Vigil type.
    """

    parsed: ParsedQuery
    case_insensitive: Callable[[Any], bool]
    field_type: Callable[[str], str]
    fields_read: set[str] = field(default_factory=set)

    # ------------------------------------------------------------------ conditions

    def condition(self, node: Any) -> Condition:
        method = getattr(self, f"_cond_{type(node).__name__}", None)
        if method is not None:
            return method(node)
        value = self.value(node)
        if value.type == "bool":
            return Condition(f"{_group(value.text)} == true", f"{_group(value.text)} == false")
        raise self._unsupported(node)

    def _cond_Boolean(self, node: eql_ast.Boolean) -> Condition:
        return Condition("true", "false") if node.value else Condition("false", "true")

    def _cond_Null(self, node: eql_ast.Null) -> Condition:
        return Condition("false", "false")

    def _cond_Not(self, node: eql_ast.Not) -> Condition:
        return self.condition(node.term).negated()

    def _cond_And(self, node: eql_ast.And) -> Condition:
        terms = [self.condition(t) for t in node.terms]
        return Condition(join_terms(" and ", [t.true for t in terms]),
                         join_terms(" or ", [t.false for t in terms]))

    def _cond_Or(self, node: eql_ast.Or) -> Condition:
        terms = [self.condition(t) for t in node.terms]
        return Condition(join_terms(" or ", [t.true for t in terms]),
                         join_terms(" and ", [t.false for t in terms]))

    def _cond_IsNull(self, node: eql_ast.IsNull) -> Condition:
        if _is_condition(node.expr):
            inner = self.condition(node.expr)
            neither = f"not {_group(inner.true)} and not {_group(inner.false)}"
            return Condition(neither, join_terms(" or ", [inner.true, inner.false]))
        value = self.value(node.expr)
        return Condition(f"{_group(value.text)} is null", f"{_group(value.text)} is not null")

    def _cond_IsNotNull(self, node: eql_ast.IsNotNull) -> Condition:
        return self._cond_IsNull(eql_ast.IsNull(node.expr)).negated()

    def _cond_Comparison(self, node: eql_ast.Comparison) -> Condition:
        op = node.comparator
        if _is_condition(node.left) or _is_condition(node.right):
            return self._compare_conditions(node, op)
        left, right = self.value(node.left), self.value(node.right)
        if left.type == "string" and right.type == "string" and self.case_insensitive(node):
            left, right = _folded(left), _folded(right)
        elif left.type and right.type and not _comparable(left.type, right.type):
            # EQL compares values of different kinds as null: neither true nor false.
            return Condition("false", "false")
        return Condition(
            f"{_group(left.text)} {op} {_group(right.text)}",
            f"{_group(left.text)} {_NEGATED_COMPARISON[op]} {_group(right.text)}",
        )

    def _compare_conditions(self, node: eql_ast.Comparison, op: str) -> Condition:
        if op not in ("==", "!="):
            raise self.parsed.error(node, f"ordering booleans with `{op}`", "boolean order")
        a, b = self._as_condition(node.left), self._as_condition(node.right)
        both = join_terms(" and ", [a.true, b.true])
        neither = join_terms(" and ", [a.false, b.false])
        first = join_terms(" and ", [a.true, b.false])
        second = join_terms(" and ", [a.false, b.true])
        same = Condition(join_terms(" or ", [both, neither]), join_terms(" or ", [first, second]))
        return same if op == "==" else same.negated()

    def _as_condition(self, node: Any) -> Condition:
        return self.condition(node)

    def _cond_InSet(self, node: eql_ast.InSet) -> Condition:
        if not all(isinstance(item, eql_ast.Literal) for item in node.container):
            # What the package's engine does too: a chain of == comparisons.
            return self.condition(node.synonym)
        subject = self.value(node.expression)
        items = [self.value(item) for item in node.container if item.value is not None]
        fold = subject.type == "string" and self.case_insensitive(node)
        if fold:
            subject = _folded(subject)
            items = [_folded(i) if i.type == "string" else i for i in items]
        items = [i for i in items if subject.type is None or _comparable(subject.type, i.type)]
        if not items:
            return Condition("false", f"{_group(subject.text)} is not null")
        listed = ", ".join(i.text for i in items)
        test = f"{_group(subject.text)} in ({listed})"
        return Condition(test, f"{_group(subject.text)} is not null and not ({test})")

    def _cond_FunctionCall(self, node: eql_ast.FunctionCall) -> Condition:
        name = node.name
        if name == "wildcard":
            return self._wildcard(node)
        if name in ("match", "matchLite"):
            return self._regex(node)
        if name in _STRING_TESTS:
            return self._string_test(node, _STRING_TESTS[name])
        if name == "cidrMatch":
            return self._cidr_match(node)
        value = self.value(node)
        if value.type == "bool":
            return Condition(f"{value.text} == true", f"{value.text} == false")
        raise self._unsupported(node)

    def _string_subject(self, node: Any) -> _Value:
        value = self.value(node)
        if value.type not in ("string", None):
            raise self.parsed.error(node, f"`{node.render()}` is not a string",
                                    construct="string function on a non-string")
        return value

    def _wildcard(self, node: eql_ast.FunctionCall) -> Condition:
        subject, *patterns = node.arguments
        value = self._string_subject(subject)
        if not all(isinstance(p, eql_ast.String) for p in patterns):
            raise self.parsed.error(node, "a wildcard pattern read from a field",
                                    construct="dynamic wildcard")
        fold = self.case_insensitive(node)
        question_mark = self.parsed_dialect_question_mark(node)
        tests = [self._one_wildcard(value, p.value, fold, question_mark) for p in patterns]
        test = join_terms(" or ", tests)
        return Condition(test, f"{_group(value.text)} is not null and not {_group(test)}")

    def parsed_dialect_question_mark(self, node: Any) -> bool:
        # Elasticsearch's `:` and `like` take `?` for one character; the classic `==` does not.
        return self.parsed.operator_of.get(id(node)) is not None

    def _one_wildcard(self, value: _Value, pattern: str, fold: bool, question_mark: bool) -> str:
        subject = _folded(value).text if fold else value.text
        text = pattern.lower() if fold else pattern
        singles = "?" if question_mark else ""
        stars = text.count("*")
        if not any(c in text for c in singles):
            inner = text.strip("*")
            if "*" not in inner:
                starts, ends = text.startswith("*"), text.endswith("*") and len(text) > 1
                if stars == 0:
                    return f"{_group(subject)} == {quote(text)}"
                if starts and ends and inner:
                    return f"{_group(subject)} contains {quote(inner)}"
                if ends and not starts:
                    return f"{_group(subject)} startswith {quote(inner)}"
                if starts and not ends and inner:
                    return f"{_group(subject)} endswith {quote(inner)}"
                if not inner:  # "*" alone: any string
                    return f"{_group(subject)} startswith \"\""
        regex = wildcard_regex(pattern, case_insensitive=fold, question_mark=question_mark)
        return f"{_group(value.text)} matches {_regex_literal(regex)}"

    def _regex(self, node: eql_ast.FunctionCall) -> Condition:
        subject, *patterns = node.arguments
        value = self._string_subject(subject)
        if not all(isinstance(p, eql_ast.String) for p in patterns):
            raise self.parsed.error(node, "a regular expression read from a field",
                                    construct="dynamic regex")
        operator = self.parsed.operator_of.get(id(node))
        whole = operator in ("regex", "regex~")  # Elasticsearch: the whole value must match
        try:
            regex = python_regex(
                [p.value for p in patterns], case_insensitive=self.case_insensitive(node),
                whole=whole, lucene=whole,
            )
        except PatternError as err:
            raise self.parsed.error(node, str(err), construct="regex syntax") from None
        test = f"{_group(value.text)} matches {_regex_literal(regex)}"
        return Condition(test, f"{_group(value.text)} is not null and not ({test})")

    def _string_test(self, node: eql_ast.FunctionCall, op: str) -> Condition:
        if len(node.arguments) != 2:
            raise self._unsupported(node)
        left, right = (self._string_subject(a) for a in node.arguments)
        if self.case_insensitive(node):
            left, right = _folded(left), _folded(right)
        test = f"{_group(left.text)} {op} {_group(right.text)}"
        guards = [f"{_group(v.text)} is not null" for v in (left, right)
                  if v.literal is _NOT_WRITTEN]
        return Condition(test, join_terms(" and ", [*guards, f"not ({test})"]))

    def _cidr_match(self, node: eql_ast.FunctionCall) -> Condition:
        if "cidr_match" not in SCALAR_FUNCTIONS:
            raise self._unsupported(node)
        subject, *blocks = node.arguments
        value = self._string_subject(subject)
        tests = [f"cidr_match({value.text}, {quote(b.value)})" for b in blocks]
        test = join_terms(" or ", tests)
        # cidr_match is null for a value that is not an address, as EQL's is false: EQL's
        # engine returns false for any string, so "false" is a string that does not match.
        return Condition(test, f"{_group(value.text)} is not null and not {_group(test)}")

    # ------------------------------------------------------------------ values

    def value(self, node: Any) -> _Value:
        method = getattr(self, f"_value_{type(node).__name__}", None)
        if method is None:
            raise self._unsupported(node)
        return method(node)

    def _value_String(self, node: eql_ast.String) -> _Value:
        return _Value(quote(node.value), "string", node.value)

    def _value_Number(self, node: eql_ast.Number) -> _Value:
        return _number(node.value)

    def _value_Boolean(self, node: eql_ast.Boolean) -> _Value:
        return _Value("true" if node.value else "false", "bool", node.value)

    def _value_Null(self, node: eql_ast.Null) -> _Value:
        return _Value("null", None, None)

    def _value_Field(self, node: eql_ast.Field) -> _Value:
        name = field_name(self.parsed, node)
        self.fields_read.add(name)
        return _Value(name, self.field_type(name))

    def _value_MathOperation(self, node: eql_ast.MathOperation) -> _Value:
        return self._arithmetic(node, node.operator, node.left, node.right)

    def _value_FunctionCall(self, node: eql_ast.FunctionCall) -> _Value:
        name, args = node.name, node.arguments
        if name in _MATH_FUNCTIONS and len(args) == 2:
            return self._arithmetic(node, _MATH_FUNCTIONS[name], *args)
        if name == "length" and len(args) == 1:
            if isinstance(args[0], eql_ast.String):
                return _number(len(args[0].value))
            if "length" in SCALAR_FUNCTIONS:
                value = self._string_subject(args[0])
                return _Value(f"length({value.text})", "int")
        if name == "number" and all(isinstance(a, eql_ast.Literal) for a in args):
            folded = _to_number(*(a.value for a in args))
            if folded is None:
                return _Value("null", None, None)
            return _number(folded)
        raise self._unsupported(node)

    def _arithmetic(self, node: Any, op: str, left_node: Any, right_node: Any) -> _Value:
        left, right = self.value(left_node), self.value(right_node)
        for side, side_node in ((left, left_node), (right, right_node)):
            if side.type not in ("int", "float", _NUMBER, None):
                raise self.parsed.error(side_node, f"arithmetic on `{side_node.render()}`, "
                                        f"which is {side.type}", construct="arithmetic type")
        kind = "float" if "float" in (left.type, right.type) else "int"
        a, b = _group(left.text), _group(right.text)
        if op == "/" and kind == "int":
            # EQL divides integers to an integer, rounding down (Python's //).
            return _Value(f"(({a} - {a} % {b}) / {b})", "int")
        return _Value(f"{a} {op} {b}", kind)

    # ------------------------------------------------------------------ errors

    def _unsupported(self, node: Any) -> EqlImportError:
        if isinstance(node, eql_ast.FunctionCall):
            return self.parsed.error(
                node, f"function `{node.name}` has no Vigil equivalent",
                construct=f"function {node.name}",
            )
        if isinstance(node, eql_ast.NamedSubquery):
            return self.parsed.error(
                node, f"`{node.query_type} of [...]` (process lineage) has no Vigil equivalent",
                construct=f"{node.query_type} of",
            )
        kind = type(node).__name__
        return self.parsed.error(node, f"`{node.render()}` ({kind}) has no Vigil equivalent",
                                 construct=kind)


def _is_condition(node: Any) -> bool:
    if isinstance(node, (eql_ast.Comparison, eql_ast.InSet, eql_ast.And, eql_ast.Or,
                         eql_ast.Not, eql_ast.IsNull, eql_ast.IsNotNull)):
        return True
    return isinstance(node, eql_ast.FunctionCall) and node.name in (
        "wildcard", "match", "matchLite", "cidrMatch", *_STRING_TESTS
    )


def _comparable(a: str | None, b: str | None) -> bool:
    numeric = {"int", "float", _NUMBER}
    return a is None or b is None or a == b or (a in numeric and b in numeric)


def _folded(value: _Value) -> _Value:
    if value.literal is not _NOT_WRITTEN:
        if isinstance(value.literal, str):
            return _Value(quote(value.literal.lower()), "string", value.literal.lower())
        return value
    return _Value(f"lower({value.text})", value.type)


def _number(value: int | float) -> _Value:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    text = repr(value)
    if "inf" in text or "nan" in text:
        return _Value("null", None, None)
    if isinstance(value, float) and "e" not in text and "." not in text:
        text += ".0"
    if text.startswith("-"):
        text = f"(-{text[1:]})"
    return _Value(text, "float" if isinstance(value, float) else "int", value)


def _to_number(text: Any, base: Any = None) -> int | float | None:
    if not isinstance(text, str):
        return None
    try:
        if base is not None:
            return int(text, int(base))
        try:
            return int(text)
        except ValueError:
            return float(text)
    except ValueError:
        return None


def _regex_literal(regex: str) -> str:
    return "/" + regex.replace("/", "\\/").replace("\n", "\\n") + "/"


_SIMPLE = re.compile(r'[A-Za-z_][A-Za-z0-9_]*(\([^()]*\))?|"(\\.|[^"\\])*"|[0-9.eE+]+|\(.*\)')


def _group(text: str) -> str:
    """``text`` in parentheses unless it is one token (a name, a call, a literal, a group)."""
    if _SIMPLE.fullmatch(text) and _balanced(text):
        return text
    return f"({text})"


def _balanced(text: str) -> bool:
    if not text.startswith("("):
        return True
    depth = 0
    in_string = False
    escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return False
    return True


def join_terms(sep: str, parts: list[str]) -> str:
    """``parts`` joined by `` and `` or `` or ``, each grouped; constants simplified."""
    if sep == " and ":
        if "false" in parts:
            return "false"
        parts = [p for p in parts if p != "true"] or ["true"]
    else:
        if "true" in parts:
            return "true"
        parts = [p for p in parts if p != "false"] or ["false"]
    if len(parts) == 1:
        return parts[0]
    return sep.join(_group(p) for p in parts)


def pipe_name(pipe: Any) -> str:
    """The name an EQL pipe is written with (``head``, ``filter`` ...)."""
    return getattr(type(pipe), "name", None) or type(pipe).__name__

