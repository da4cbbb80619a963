"""The exact evaluator of search queries: compiles a ``SearchNode`` once into a tree of matchers
(:mod:`percolator.match_tree`) that decide a match on one analysed document, collect highlights
and explain the decision.

It is the reference the prefilter is verified against: every candidate the presearcher proposes
is confirmed here, and the no-filtering baseline runs it for every query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from percolator.analysis import (
    DEFAULT_SCHEMA,
    Schema,
    canonical_keyword,
    parse_number,
    timestamp_seconds,
)
from percolator.document import AnalyzedDocument
from percolator.errors import InvalidQueryError
from percolator.match_tree import (
    AllMatch,
    AnyMatch,
    ExistsMatch,
    Matcher,
    NotMatch,
    PatternMatch,
    RangeKind,
    RangeMatch,
    TermMatch,
)
from query_lang.ast import (
    SearchAnd,
    SearchCompare,
    SearchExists,
    SearchNode,
    SearchNot,
    SearchOr,
    SearchPhrase,
    SearchPrefix,
    SearchRange,
    SearchRegex,
    SearchTerm,
    SearchWildcard,
)

__all__ = [
    "CompiledQuery",
    "Evaluation",
    "Highlights",
    "compile_query",
    "evaluate",
    "explain",
    "field_predicate",
]

#: ``field -> [[start, end], ...]`` character offsets of the matched terms, sorted.
Highlights = dict[str, list[list[int]]]


# ---------------------------------------------------------------- compilation

_OPEN_BOUND = (None, "*")


def _bound_kind(bound: Any) -> str | None:
    if bound in _OPEN_BOUND:
        return None
    if isinstance(bound, bool):
        raise InvalidQueryError(f"a range bound cannot be the boolean {bound!r}")
    if parse_number(bound) is not None:
        return "number"
    if isinstance(bound, str) and timestamp_seconds(bound) is not None:
        return "time"
    return "string"


def _range_kind(field: str, bounds: Iterable[Any], schema: Schema) -> RangeKind | None:
    kinds = {k for k in (_bound_kind(b) for b in bounds) if k is not None}
    if not kinds:
        return None
    if schema.type_of(field) == "timestamp" and kinds <= {"number", "time"}:
        return "time"
    if kinds == {"number"}:
        return "number"
    if kinds <= {"number", "time"}:
        return "time"
    if kinds == {"string"}:
        return "string"
    raise InvalidQueryError(
        f"range on {field} mixes a text bound with a number or timestamp bound"
    )


def _convert_bound(bound: Any, kind: RangeKind, schema: Schema) -> Any:
    if bound in _OPEN_BOUND:
        return None
    if kind == "number":
        return parse_number(bound)
    if kind == "time":
        return timestamp_seconds(bound, schema.time_unit)
    return bound if isinstance(bound, str) else canonical_keyword(bound)


def _bound_text(bound: Any) -> str:
    if bound in _OPEN_BOUND:
        return "*"
    return bound if isinstance(bound, str) and " " not in bound else repr(bound)


def _compile(node: SearchNode, schema: Schema) -> Matcher:
    if isinstance(node, SearchTerm):
        return TermMatch(node.field, node.text)
    if isinstance(node, SearchPhrase):
        return TermMatch(node.field, node.text, phrase=True)
    if isinstance(node, SearchPrefix):
        return PatternMatch(node.field, "prefix", node.prefix)
    if isinstance(node, SearchWildcard):
        return PatternMatch(node.field, "wildcard", node.pattern)
    if isinstance(node, SearchRegex):
        return PatternMatch(node.field, "regex", node.pattern)
    if isinstance(node, SearchRange):
        kind = _range_kind(node.field, (node.low, node.high), schema)
        label = (
            f"{node.field}:{'[' if node.include_low else '{'}{_bound_text(node.low)} TO "
            f"{_bound_text(node.high)}{']' if node.include_high else '}'}"
        )
        if kind is None:
            # [* TO *] asks only that the field holds a value, as in Lucene.
            return ExistsMatch(node.field)
        return RangeMatch(
            node.field, kind, _convert_bound(node.low, kind, schema),
            _convert_bound(node.high, kind, schema), node.include_low, node.include_high, label,
        )
    if isinstance(node, SearchCompare):
        return _compile_compare(node, schema)
    if isinstance(node, SearchExists):
        return ExistsMatch(node.field)
    if isinstance(node, SearchAnd):
        return _flatten_clauses(AllMatch, [_compile(c, schema) for c in node.clauses])
    if isinstance(node, SearchOr):
        return _flatten_clauses(AnyMatch, [_compile(c, schema) for c in node.clauses])
    if isinstance(node, SearchNot):
        return NotMatch(_compile(node.clause, schema))
    raise InvalidQueryError(f"not a search query node: {type(node).__name__}")


def _flatten_clauses(kind: type[AllMatch] | type[AnyMatch], clauses: list[Matcher]) -> Matcher:
    if not clauses:
        raise InvalidQueryError(f"an {'AND' if kind is AllMatch else 'OR'} without clauses")
    flat: list[Matcher] = []
    for clause in clauses:
        flat.extend(clause.clauses if isinstance(clause, kind) else (clause,))
    return flat[0] if len(flat) == 1 else kind(tuple(flat))


# op -> (bounds the value from above, include_low, include_high)
_COMPARE_RANGES = {
    ">": (False, False, True), ">=": (False, True, True),
    "<": (True, True, False), "<=": (True, True, True),
}


def _compile_compare(node: SearchCompare, schema: Schema) -> Matcher:
    op, value = node.op, node.value
    label = f"{node.field} {op} {_bound_text(value)}"
    if op in ("==", "!=") and isinstance(value, bool):
        equal_flag = TermMatch(node.field, canonical_keyword(value))
        return NotMatch(equal_flag) if op == "!=" else equal_flag
    if op in ("==", "!="):
        kind = _range_kind(node.field, (value,), schema)
        if kind in ("number", "time"):
            bound = _convert_bound(value, kind, schema)
            equal: Matcher = RangeMatch(node.field, kind, bound, bound, True, True, label)
        else:
            equal = TermMatch(node.field, canonical_keyword(value))
        return NotMatch(equal) if op == "!=" else equal
    if op not in _COMPARE_RANGES:
        raise InvalidQueryError(
            f"unknown comparison {op!r} on {node.field}; expected one of == != < <= > >="
        )
    if value in _OPEN_BOUND:
        raise InvalidQueryError(f"comparison {label} needs a value")
    kind = _range_kind(node.field, (value,), schema)
    assert kind is not None
    bound = _convert_bound(value, kind, schema)
    upper, include_low, include_high = _COMPARE_RANGES[op]
    if upper:
        return RangeMatch(node.field, kind, None, bound, True, include_high, label)
    return RangeMatch(node.field, kind, bound, None, include_low, True, label)


@dataclass(frozen=True)
class Evaluation:
    """The verdict of one query on one document, with highlights when it matched."""

    matched: bool
    highlights: Highlights


def _merge_spans(spans: set[tuple[int, int]]) -> list[list[int]]:
    # A phrase and its own words overlap; one span per stretch of highlighted text reads best.
    if len(spans) == 1:
        ((start, end),) = spans
        return [[start, end]]
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


@dataclass(frozen=True, slots=True)
class CompiledQuery:
    """A search query compiled against a schema: decide, highlight, explain."""

    source: SearchNode
    root: Matcher
    schema: Schema

    def matches(self, doc: AnalyzedDocument) -> bool:
        """Whether the query matches the analysed document."""
        return self.root.matches(doc)

    def highlights(self, doc: AnalyzedDocument) -> Highlights:
        """Offsets of the terms matched by the positive (non-negated) clauses, per field."""
        spans: dict[str, set[tuple[int, int]]] = {}
        self.root.collect_spans(doc, spans)
        if len(spans) == 1:
            ((name, found),) = spans.items()
            return {name: _merge_spans(found)} if found else {}
        return {f: _merge_spans(v) for f, v in sorted(spans.items()) if v}

    def explain(self, doc: AnalyzedDocument) -> str:
        """One line per clause saying whether and why it matched."""
        lines: list[str] = []
        matched = self.root.explain_into(doc, 1, lines)
        head = "MATCH" if matched else "NO MATCH"
        return "\n".join([f"{head}: {self.root.describe()}", *lines])


def compile_query(query: SearchNode, schema: Schema | None = None) -> CompiledQuery:
    """Compile ``query`` for documents of ``schema``; raises :class:`InvalidQueryError`."""
    schema = schema or DEFAULT_SCHEMA
    return CompiledQuery(query, _compile(query, schema), schema)


def _as_document(document: Mapping[str, Any] | AnalyzedDocument, schema: Schema) -> Any:
    if isinstance(document, AnalyzedDocument):
        return document
    return AnalyzedDocument(document, schema)


def evaluate(
    query: SearchNode | CompiledQuery,
    document: Mapping[str, Any] | AnalyzedDocument,
    schema: Schema | None = None,
) -> Evaluation:
    """Evaluate one query on one document exactly, with highlights.

    Examples
    --------
    >>> from query_lang.ast import SearchTerm
    >>> schema = Schema.of({"title": "text"})
    >>> evaluate(SearchTerm("title", "acme"), {"title": "Über ACME"}, schema)
    Evaluation(matched=True, highlights={'title': [[5, 9]]})
    """
    compiled = query if isinstance(query, CompiledQuery) else compile_query(query, schema)
    doc = _as_document(document, compiled.schema)
    if not compiled.matches(doc):
        return Evaluation(False, {})
    return Evaluation(True, compiled.highlights(doc))


def explain(
    query: SearchNode | CompiledQuery,
    document: Mapping[str, Any] | AnalyzedDocument,
    schema: Schema | None = None,
) -> str:
    """Why ``query`` matches ``document`` or not, clause by clause, one line each."""
    compiled = query if isinstance(query, CompiledQuery) else compile_query(query, schema)
    return compiled.explain(_as_document(document, compiled.schema))


def field_predicate(
    field: str, query: SearchNode, schema: Schema | None = None
) -> Callable[[Any], bool]:
    """A test of one field value by a search query, for ``search(FIELD, "query")`` in rules.

    Terms without a field search ``field``; the value is analysed as ``field``'s declared type
    in ``schema`` (``text`` when undeclared, since a rule searching a field means full text).
    A None value never matches.

    Examples
    --------
    >>> from query_lang.ast import SearchAnd, SearchPrefix, SearchTerm
    >>> test = field_predicate("body", SearchAnd((SearchTerm(None, "merger"),
    ...                                           SearchPrefix(None, "layoff"))))
    >>> test("Merger talks and layoffs"), test("a merger"), test(None)
    (True, False, False)
    """
    declared = schema.type_of(field) if schema is not None else None
    field_type = declared or "text"
    local = Schema(
        fields=((field, field_type),),
        default_fields=(field,),
        time_unit=schema.time_unit if schema is not None else "s",
    )
    compiled = compile_query(query, local)

    def predicate(value: Any) -> bool:
        if value is None:
            return False
        return compiled.matches(AnalyzedDocument({field: value}, local))

    return predicate
