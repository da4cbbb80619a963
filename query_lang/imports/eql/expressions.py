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

VIGIL_TYPES = ("string", "int", "float", "bool", "list<string>", "json")
"""The types a field of an imported stream is declared with."""

_NUMBER = "number"  # an integer or a float: settled once every use is seen
_LIST = "list<string>"
_JSON = "json"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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
_ARRAY_FUNCTIONS = frozenset({"arrayContains", "arraySearch", "arrayCount"})


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


def _indexed_field(parsed: ParsedQuery, node: eql_ast.Field) -> tuple[str, int] | None:
    """``(list field, index)`` for ``a.b[1]``; None for a plain field. An index anywhere but
    at the end (``a[0].b``, ``a[0][1]``) is an error: Vigil lists hold strings."""
    parts = [node.base, *node.path]
    if all(isinstance(p, str) for p in parts):
        return None
    if not isinstance(parts[-1], int) or not all(isinstance(p, str) for p in parts[:-1]):
        raise parsed.error(
            node, f"field `{node.render()}` reads inside an array's elements; Vigil lists "
            "hold strings", construct="nested array",
        )
    base = eql_ast.Field(node.base, list(node.path[:-1]))
    return field_name(parsed, base), parts[-1]


def json_member(parsed: ParsedQuery, node: eql_ast.Field,
                is_json: Callable[[str], bool]) -> tuple[str, str] | None:
    """``(json field, Vigil member path)`` when a leading part of the EQL path names a field
    ``is_json`` says holds json: ``mysterious_field.subarray`` -> ``("mysterious_field",
    "mysterious_field.subarray")``; None otherwise. A part inside the json value that is an
    index, or no Vigil name, is an error."""
    parts = [node.base, *node.path]
    for k in range(1, len(parts)):
        head = eql_ast.Field(node.base, list(node.path[:k - 1]))
        if any(not isinstance(p, str) for p in parts[:k]):
            return None
        name = field_name(parsed, head)
        if not is_json(name):
            continue
        return name, _members(parsed, node, name, parts[k:])
    return None


def _members(parsed: ParsedQuery, node: Any, base: str, path: list[Any]) -> str:
    for part in path:
        if not isinstance(part, str):
            raise parsed.error(node, f"field `{node.render()}` indexes an array inside a json "
                               "value; Vigil reads a json list with any() or count()",
                               construct="array index")
        if not _NAME.fullmatch(part) or part.lower() in _KEYWORDS:
            raise parsed.error(node, f"`{part}` in `{node.render()}` is not a Vigil name",
                               construct="json member name")
    return ".".join([base, *path])


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

    def is_json(name: str) -> bool:
        return types.known(streams, name) == _JSON

    def static(n: Any) -> str | None:
        if isinstance(n, eql_ast.Literal):
            return _literal_type(n.value)
        if isinstance(n, eql_ast.Field):
            if json_member(parsed, n, is_json) is not None:
                return None  # known at run time only
            if _indexed_field(parsed, n) is not None:
                return "string"
            return types.known(streams, field_name(parsed, n))
        if isinstance(n, eql_ast.MathOperation) or (
            isinstance(n, eql_ast.FunctionCall) and n.name in _MATH_FUNCTIONS
        ):
            return _NUMBER
        if isinstance(n, eql_ast.FunctionCall) and n.name in ("length", "indexOf", "number",
                                                               "arrayCount"):
            return _NUMBER
        if isinstance(n, eql_ast.FunctionCall) and n.name in ("concat", "substring", "string",
                                                               "between"):
            return "string"
        if isinstance(n, eql_ast.FunctionCall) and n.name == "safe" and n.arguments:
            return static(n.arguments[0])
        return None

    def note_field(n: Any, kind: str | None) -> None:
        if isinstance(n, eql_ast.Field) and kind is not None and (
            json_member(parsed, n, is_json) is None and _indexed_field(parsed, n) is None
        ):
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
                elif (n.name in ("indexOf", "substring") and i > 0) or (
                    n.name == "between" and i > 2
                ):
                    note_field(arg, "bool" if n.name == "between" else _NUMBER)
                elif n.name in _ARRAY_FUNCTIONS and i > 0:
                    continue  # a variable of arraySearch, or values: not fields of the event
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
    # The variables of arraySearch/arrayCount in scope: EQL name -> Vigil element name and
    # type (a string of a list<string>, a json value of a json list).
    elements: dict[str, tuple[str, str]] = field(default_factory=dict)
    # In a sequence's filter, `events[i]`: per index, the step's pattern variable, its field
    # types and the set its fields read go to; empty elsewhere.
    events: tuple[tuple[str, Callable[[str], str], set[str]], ...] = ()

    # ------------------------------------------------------------------ conditions

    def condition(self, node: Any) -> Condition:
        method = getattr(self, f"_cond_{type(node).__name__}", None)
        if method is not None:
            return method(node)
        value = self.value(node)
        if value.type == "bool":
            return Condition(f"{_group(value.text)} == true", f"{_group(value.text)} == false")
        if value.type == _JSON:
            return _truthy(value)
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
        textual = {left.type, right.type} <= {"string", _JSON}
        if textual and _JSON in (left.type, right.type) and self.case_insensitive(node):
            return _folded_dynamic_comparison(left, right, op)
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
        if subject.type == _JSON and self.case_insensitive(node):
            # strings compared folded, other values as they are
            strings = [_folded(i).text for i in items if i.type == "string"]
            others = [i.text for i in items if i.type != "string"]
            test = join_terms(" or ", [
                *([f"lower({_group(subject.text)}) in ({', '.join(strings)})"] if strings else []),
                *([f"{_group(subject.text)} in ({', '.join(others)})"] if others else []),
            ])
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
        if name == "safe" and len(node.arguments) == 1:
            return self.condition(node.arguments[0])
        if name == "arrayContains" and len(node.arguments) >= 2:
            return self._array_contains(node)
        if name == "arraySearch" and len(node.arguments) == 3:
            return self._array_search(node)
        value = self.value(node)
        if value.type == "bool":
            return Condition(f"{value.text} == true", f"{value.text} == false")
        if value.text == "null":  # always null (such as arithmetic on a string)
            return Condition("false", "false")
        raise self._unsupported(node)

    def _string_subject(self, node: Any) -> _Value:
        value = self.value(node)
        if value.type not in ("string", _JSON, None):
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

    def _array(self, node: Any) -> _Value:
        value = self.value(node)
        if value.type not in (_LIST, _JSON):
            raise self.parsed.error(node, f"`{node.render()}` is not declared {_LIST} or "
                                    f"{_JSON} (give its type with a schema)",
                                    construct="array type")
        return value

    def _membership(self, node: Any, array: _Value, literal: Any) -> str:
        if isinstance(literal, str):
            if self.case_insensitive(node):
                return f"lower({array.text}) contains {quote(literal.lower())}"
            return f"{array.text} contains {quote(literal)}"
        return "false"  # a list of strings holds no number, boolean or null

    def _array_contains(self, node: eql_ast.FunctionCall) -> Condition:
        subject, *values = node.arguments
        array = self._array(subject)
        if not all(isinstance(v, eql_ast.Literal) for v in values):
            raise self.parsed.error(node, "arrayContains of a value read from a field",
                                    construct="dynamic arrayContains")
        if array.type == _JSON:
            test = self._json_contains(node, array, [v.value for v in values])
            return Condition(test, join_terms(" and ", [f"{array.text} is not null",
                                                        f"not {_group(test)}"]))
        test = join_terms(" or ", [self._membership(node, array, v.value) for v in values])
        # EQL: null for a missing array, else true or false.
        return Condition(test, join_terms(" and ", [f"{array.text} is not null",
                                                    f"not {_group(test)}"]))

    def _array_search(self, node: eql_ast.FunctionCall) -> Condition:
        # `arraySearch(xs, v, v == "literal")` is a membership test; any other condition
        # over the elements, `any(v in xs: ...)`.
        subject, variable, body = node.arguments
        array = self._array(subject)
        literal = None
        if (array.type == _LIST and isinstance(variable, eql_ast.Field) and not variable.path
                and isinstance(body, eql_ast.Comparison) and body.comparator == "=="):
            sides = (body.left, body.right)
            for element, other in (sides, sides[::-1]):
                if (isinstance(element, eql_ast.Field) and element.base == variable.base
                        and not element.path and isinstance(other, eql_ast.String)):
                    literal = other.value
        # (The classic dialect's `==` with a `*` arrives as a wildcard() call, not here.)
        if literal is None:
            test = self._over_elements("any", array, variable, body)
            # EQL: false, never null, when no element satisfies it or the array is missing.
            return Condition(test, f"not {test}")
        test = self._membership(body, array, literal)
        # EQL: false, never null, for a missing array.
        return Condition(test, f"{array.text} is null or not ({test})")

    def _over_elements(self, func: str, array: _Value, variable: Any, body: Any) -> str:
        """``any(...)`` or ``count(...)`` of an EQL condition over the elements of a list."""
        if not isinstance(variable, eql_ast.Field) or variable.path:
            raise self.parsed.error(variable, f"`{variable.render()}` is not a variable name",
                                    construct="array variable")
        name = "each_" + re.sub(r"[^A-Za-z0-9_]", "_", variable.base)
        outer = self.elements.get(variable.base)
        self.elements[variable.base] = (name, "string" if array.type == _LIST else _JSON)
        try:
            condition = self.condition(body)
        finally:
            if outer is None:
                del self.elements[variable.base]
            else:
                self.elements[variable.base] = outer
        return f"{func}({name} in {array.text}: {condition.true})"

    def _json_contains(self, node: Any, array: _Value, literals: list[Any]) -> str:
        """``arrayContains`` of a json list: some element equal to one of the literals."""
        element = "each_element"
        fold = self.case_insensitive(node)
        tests = []
        for literal in literals:
            if literal is None:
                continue
            if isinstance(literal, str) and fold:
                tests.append(f"lower({element}) == {quote(literal.lower())}")
            else:
                tests.append(f"{element} == {_literal_value(literal).text}")
        if not tests:
            return "false"
        return f"any({element} in {array.text}: {join_terms(' or ', tests)})"

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
        if node.base in self.elements:
            element, kind = self.elements[node.base]
            if node.path and kind != _JSON:
                raise self.parsed.error(node, f"`{node.render()}` reads inside an array's "
                                        "elements; a list<string> holds strings",
                                        construct="nested array")
            return _Value(_members(self.parsed, node, element, list(node.path)), kind)
        if self.events:
            return self._event_field(node)
        member = json_member(self.parsed, node, lambda name: self.field_type(name) == _JSON)
        if member is not None:
            self.fields_read.add(member[0])
            return _Value(member[1], _JSON)
        indexed = _indexed_field(self.parsed, node)
        if indexed is not None:
            name, index = indexed
            self.fields_read.add(name)
            if self.field_type(name) != _LIST:
                raise self.parsed.error(
                    node, f"field `{node.render()}` indexes `{name}`, which is not declared "
                    f"{_LIST} (give its type with a schema)", construct="array index",
                )
            return _Value(f"item({name}, {_number(index).text})", "string")
        name = field_name(self.parsed, node)
        self.fields_read.add(name)
        return _Value(name, self.field_type(name))

    def _event_field(self, node: eql_ast.Field) -> _Value:
        """``events[i].field`` of a sequence's filter: the field of the step's variable."""
        path = list(node.path)
        if node.base != "events" or not path or not isinstance(path[0], int):
            raise self.parsed.error(node, f"`{node.render()}` in a sequence's filter: it reads "
                                    "the sequence's events as events[i].field",
                                    construct="sequence filter field")
        index = path[0] + (len(self.events) if path[0] < 0 else 0)
        if not 0 <= index < len(self.events) or len(path) < 2 or not isinstance(path[1], str):
            raise self.parsed.error(node, f"`{node.render()}` names no field of an event of "
                                    f"the sequence (it has {len(self.events)})",
                                    construct="sequence filter field")
        variable, field_type, read = self.events[index]
        name = field_name(self.parsed, eql_ast.Field(path[1], path[2:]))
        read.add(name)
        return _Value(f"{variable}.{name}", field_type(name))

    def _value_MathOperation(self, node: eql_ast.MathOperation) -> _Value:
        return self._arithmetic(node, node.operator, node.left, node.right)

    def _value_FunctionCall(self, node: eql_ast.FunctionCall) -> _Value:
        name, args = node.name, node.arguments
        if name in _MATH_FUNCTIONS and len(args) == 2:
            return self._arithmetic(node, _MATH_FUNCTIONS[name], *args)
        if name == "length" and len(args) == 1:
            if isinstance(args[0], eql_ast.String):
                return _number(len(args[0].value))
            value = self.value(args[0])
            # Elasticsearch's length is defined for strings; the package's engine counts the
            # elements of an array.
            lists = (_LIST,) if self.parsed.dialect == "classic" else ()
            if value.type == _LIST and not lists:
                raise self.parsed.error(args[0], f"`{args[0].render()}` is an array, and "
                                        "Elasticsearch's length is defined for strings (the "
                                        "classic dialect counts elements)",
                                        construct="length of an array")
            if value.type not in ("string", *lists, None):
                raise self.parsed.error(args[0], f"`{args[0].render()}` is not a string or an "
                                        "array", construct="length of a non-string")
            return _Value(f"length({value.text})", "int")
        if name == "indexOf" and len(args) in (2, 3):
            return self._index_of(node)
        if name == "substring" and len(args) in (2, 3):
            text = self._string_subject(args[0]).text
            bounds = [self._integer(a) for a in args[1:]]
            return _Value(f"substring({', '.join([text, *bounds])})", "string")
        if name == "between" and len(args) in (3, 4):
            return self._between(node)
        if name == "concat" and args or name == "string" and len(args) == 1:
            # EQL's string(x) is the text concat(x) writes (booleans as true/false).
            return self._concat(node)
        if name == "safe" and len(args) == 1:
            # Vigil never raises while evaluating: what would fail in EQL is already null.
            return self.value(args[0])
        if name == "arrayCount" and len(args) == 3:
            # EQL counts 0 for a missing array, as Vigil's count() does.
            array = self._array(args[0])
            return _Value(self._over_elements("count", array, args[1], args[2]), "int")
        if name == "number" and all(isinstance(a, eql_ast.Literal) for a in args):
            folded = _to_number(*(a.value for a in args))
            if folded is None:
                return _Value("null", None, None)
            return _number(folded)
        raise self._unsupported(node)

    def _integer(self, node: Any) -> str:
        value = self.value(node)
        if value.type not in ("int", _NUMBER, None):
            raise self.parsed.error(node, f"`{node.render()}` is not an integer",
                                    construct="position type")
        return value.text

    def _index_of(self, node: eql_ast.FunctionCall) -> _Value:
        subject, part, *start = node.arguments
        text, needle = self._string_subject(subject), self._string_subject(part)
        if self.case_insensitive(node):
            # EQL folds both and returns the position in the folded text.
            text, needle = _folded(text), _folded(needle)
        parts = [text.text, needle.text, *(self._integer(s) for s in start)]
        if start and self.parsed.dialect != "classic":
            # Elasticsearch starts a negative position at 0; Vigil's counts from the end.
            first = _constant_number(start[0])
            if not isinstance(first, int):
                raise self.parsed.error(start[0], "Elasticsearch's indexOf starts a negative "
                                        "position at 0, Vigil's index_of counts it from the "
                                        "end: give the start as a whole number",
                                        construct="indexOf start from a field")
            parts[2] = str(max(first, 0))
        return _Value(f"index_of({', '.join(parts)})", "int")

    def _between(self, node: eql_ast.FunctionCall) -> _Value:
        if self.parsed.dialect != "classic":
            raise self.parsed.error(
                node, "Elasticsearch's between gives \"\" where the markers are missing, "
                "Vigil's between (the eql package's) gives null", construct="function between",
            )
        subject, left, right, *greedy = node.arguments
        parts = [self._string_subject(a).text for a in (subject, left, right)]
        if greedy:
            flag = self.value(greedy[0])
            if flag.type not in ("bool", None):
                raise self.parsed.error(greedy[0], f"`{greedy[0].render()}` is not a boolean",
                                        construct="between flag")
            parts.append(flag.text)
        if self.case_insensitive(node):
            if not greedy:
                parts.append("false")
            parts.append("true")
        return _Value(f"between({', '.join(parts)})", "string")

    def _concat(self, node: eql_ast.FunctionCall) -> _Value:
        parts = []
        for arg in node.arguments:
            value = self.value(arg)
            if value.type is None:  # EQL's concat of a null is null
                return _Value("null", None, None)
            if value.type not in ("string", "int", "float", "bool", _NUMBER):
                raise self.parsed.error(arg, f"`{arg.render()}` is {value.type}, not a value "
                                        "concat writes", construct="concat type")
            if value.type == "int" and "/" in value.text:
                # Only an integer division writes `/` into an int's text (a field's name
                # cannot hold one): EQL's quotient is an int, Vigil's division a float.
                raise self.parsed.error(arg, f"`{arg.render()}` divides integers, which EQL "
                                        "writes as an integer and Vigil as a float",
                                        construct="text of an integer division")
            parts.append(value.text)
        return _Value(f"concat({', '.join(parts)})", "string")

    def _arithmetic(self, node: Any, op: str, left_node: Any, right_node: Any) -> _Value:
        left, right = self.value(left_node), self.value(right_node)
        if any(side.type not in ("int", "float", _NUMBER, None) for side in (left, right)):
            # EQL's arithmetic is null unless both sides are numbers; a field declared as a
            # string (or a list, a boolean) never is.
            return _Value("null", None, None)
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
    if isinstance(node, eql_ast.FunctionCall) and node.name == "safe" and node.arguments:
        return _is_condition(node.arguments[0])
    return isinstance(node, eql_ast.FunctionCall) and node.name in (
        "wildcard", "match", "matchLite", "cidrMatch", "arrayContains", "arraySearch",
        *_STRING_TESTS
    )


def _constant_number(node: Any) -> int | float | None:
    """The value of a number written as a literal (``3``, ``-3``), else None."""
    if isinstance(node, eql_ast.Number):
        return node.value
    if (isinstance(node, eql_ast.MathOperation) and node.operator == "-"
            and isinstance(node.left, eql_ast.Number) and node.left.value == 0
            and isinstance(node.right, eql_ast.Number)):
        return -node.right.value
    return None


def _comparable(a: str | None, b: str | None) -> bool:
    numeric = {"int", "float", _NUMBER}
    return (a is None or b is None or a == b or _JSON in (a, b)
            or (a in numeric and b in numeric))


def _truthy(value: _Value) -> Condition:
    """EQL's truth of a json value (Python's: not null, false, 0, "", an empty list or
    object) as two Vigil conditions."""
    x = _group(value.text)
    falsy = f"{x} in (false, 0, \"\") or length({x}) == 0"
    return Condition(f"{x} is not null and not ({falsy})", f"{x} is not null and ({falsy})")


def _folded_dynamic_comparison(left: _Value, right: _Value, op: str) -> Condition:
    """``==``/``!=`` ignoring case where a side is json (a string or another kind, known at
    run time only): strings compare folded, other values as they are."""
    if op not in ("==", "!="):
        a, b = _folded(left), _folded(right)
        return Condition(f"{_group(a.text)} {op} {_group(b.text)}",
                         f"{_group(a.text)} {_NEGATED_COMPARISON[op]} {_group(b.text)}")
    a, b = _group(left.text), _group(right.text)
    fa, fb = _group(_folded(left).text), _group(_folded(right).text)
    equal = f"{fa} == {fb} or {a} == {b}"
    unequal = f"{a} != {b} and ({fa} != {fb} or {fa} is null or {fb} is null)"
    return Condition(equal, unequal) if op == "==" else Condition(unequal, equal)


def _literal_value(value: Any) -> _Value:
    if isinstance(value, str):
        return _Value(quote(value), "string", value)
    if isinstance(value, bool):
        return _Value("true" if value else "false", "bool", value)
    return _number(value)


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


_SIMPLE = re.compile(
    r'[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*|[A-Za-z_][A-Za-z0-9_]*(\([^()]*\))?'
    r'|"(\\.|[^"\\])*"|[0-9.eE+]+|\(.*\)'
)


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

