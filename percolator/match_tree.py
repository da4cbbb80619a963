"""The compiled form of a search query: a tree of matchers, one per query node, each deciding a
match on one analysed document, collecting the spans it matched and explaining its decision.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, Literal

from percolator.analysis import KEYWORD, TEXT, analyze_text, canonical_keyword, parse_number
from percolator.document import AnalyzedDocument
from percolator.interning import INTERN_POOL
from percolator.term_patterns import TermPattern, escape_wildcard, glob_pattern, regex_pattern

__all__ = [
    "AllMatch",
    "AnyMatch",
    "ExistsMatch",
    "Matcher",
    "NotMatch",
    "PatternMatch",
    "RangeKind",
    "RangeMatch",
    "TermMatch",
]


def _field_label(field: str | None) -> str:
    return "" if field is None else f"{field}:"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Matcher:
    """A compiled query node. ``field`` None means the document's default fields."""

    __slots__ = ()

    def matches(self, doc: AnalyzedDocument) -> bool:
        """Whether this node matches ``doc``."""
        raise NotImplementedError

    def collect_spans(self, doc: AnalyzedDocument, out: dict[str, set[tuple[int, int]]]) -> None:
        """Add the offsets of the terms this node matched in ``doc`` to ``out``."""

    def describe(self) -> str:
        """This node in query syntax."""
        raise NotImplementedError

    def explain_into(self, doc: AnalyzedDocument, depth: int, lines: list[str]) -> bool:
        """Append one line per node saying whether and why it matched; return the decision."""
        matched = self.matches(doc)
        lines.append(f"{'  ' * depth}{_verdict(matched)} {self.describe()} — {self.reason(doc)}")
        return matched

    def reason(self, doc: AnalyzedDocument) -> str:
        """Why this leaf matched ``doc`` or not, in words."""
        raise NotImplementedError


def _verdict(matched: bool) -> str:
    return "[match]   " if matched else "[no match]"


def _targets(doc: AnalyzedDocument, field: str | None) -> tuple[str, ...]:
    if field is None:
        return doc.default_fields()
    return (field,) if doc.has(field) else ()


def _absent(field: str | None) -> str:
    return "no default field is present" if field is None else f"field {field} is absent"


def _format_spans(spans: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"[{s}, {e}]" for s, e in sorted(spans))


def _leaf_reason(node: Matcher, field: str | None, doc: AnalyzedDocument, what: str) -> str:
    if not _targets(doc, field):
        return _absent(field)
    spans: dict[str, set[tuple[int, int]]] = {}
    node.collect_spans(doc, spans)
    if node.matches(doc):
        found = "; ".join(f"{f} at {_format_spans(s)}" for f, s in sorted(spans.items()) if s)
        return f"found in {found}" if found else "found in a non-text value"
    where = "the default fields" if field is None else field
    return f"no term of {where} {what}"


class TermMatch(Matcher):
    """A term or a phrase. On text fields the analysed words must occur at consecutive positions
    (one word: anywhere); on keyword fields one value must equal the text exactly.

    A numeric text also matches numbers it denotes: ``200`` meets the value ``200.0``.
    """

    __slots__ = ("field", "text", "words", "keywords", "phrase")

    def __init__(self, field: str | None, text: str, *, phrase: bool = False) -> None:
        self.field = field
        self.text = text
        self.phrase = phrase
        # Standing queries repeat words: one string and one tuple per distinct word sequence,
        # however many queries hold it (interned strings are freed with their last query).
        self.words = INTERN_POOL(tuple(map(sys.intern, analyze_text(text))))
        number = parse_number(text)
        spelled = None if number is None else canonical_keyword(number)
        # A tuple of one or two, not a set: a frozenset costs 216 bytes per leaf.
        self.keywords = INTERN_POOL(
            (text,) if spelled is None or spelled == text else (text, spelled)
        )

    def _matches_field(self, doc: AnalyzedDocument, name: str) -> bool:
        terms = doc.terms(name)
        if doc.kind(name) == KEYWORD:
            return not terms.isdisjoint(self.keywords)
        words = self.words
        if not words:
            return False
        if len(words) == 1:
            return words[0] in terms
        if any(w not in terms for w in words):
            return False
        return doc.has_phrase(name, words)

    def _phrase_starts(self, doc: AnalyzedDocument, name: str) -> list[int]:
        return doc.phrase_starts(name, self.words)

    def matches(self, doc: AnalyzedDocument) -> bool:
        return any(self._matches_field(doc, f) for f in _targets(doc, self.field))

    def collect_spans(self, doc: AnalyzedDocument, out: dict[str, set[tuple[int, int]]]) -> None:
        words = self.words
        for name in _targets(doc, self.field):
            if doc.kind(name) == KEYWORD:
                if doc.terms(name).isdisjoint(self.keywords):
                    continue
                found = out.setdefault(name, set())
                spans = doc.term_spans(name)
                for keyword in self.keywords:
                    found.update(spans.get(keyword, ()))
            elif len(words) == 1:
                if words[0] in doc.terms(name):
                    out.setdefault(name, set()).update(doc.term_offsets(name, words[0]))
            elif words and self._matches_field(doc, name):
                found = out.setdefault(name, set())
                width = len(words)
                for start in self._phrase_starts(doc, name):
                    span = doc.phrase_span(name, start, width)
                    if span is not None:
                        found.add(span)

    def describe(self) -> str:
        plain = not self.phrase and self.text and all(
            c.isalnum() or c in "_-." for c in self.text
        )
        return _field_label(self.field) + (self.text if plain else _quote(self.text))

    def reason(self, doc: AnalyzedDocument) -> str:
        return _leaf_reason(self, self.field, doc, f"equals {self.text!r}")



class PatternMatch(Matcher):
    """A prefix, wildcard or regex tested against every term of the field.

    On text fields prefix and wildcard literals are lowercased and accent-folded like the
    terms; regexes are used as written. On keyword fields everything is exact.
    """

    __slots__ = ("field", "form", "source", "text_pattern", "keyword_pattern")

    def __init__(
        self,
        field: str | None,
        form: Literal["prefix", "wildcard", "regex"],
        source: str,
    ) -> None:
        self.field = field
        self.form = form
        self.source = source
        if form != "regex":
            self.text_pattern = glob_pattern(form, source, TEXT)
            self.keyword_pattern = glob_pattern(form, source, KEYWORD)
        else:
            self.text_pattern = self.keyword_pattern = regex_pattern(source)

    def pattern_for(self, kind: str) -> TermPattern:
        """The term test used on fields analysed as ``kind``."""
        return self.text_pattern if kind == TEXT else self.keyword_pattern

    def _matches_field(self, doc: AnalyzedDocument, name: str) -> bool:
        return self.pattern_for(doc.kind(name)).holds_in(doc, name)

    def matches(self, doc: AnalyzedDocument) -> bool:
        return any(self._matches_field(doc, f) for f in _targets(doc, self.field))

    def collect_spans(self, doc: AnalyzedDocument, out: dict[str, set[tuple[int, int]]]) -> None:
        for name in _targets(doc, self.field):
            for term in self.pattern_for(doc.kind(name)).matching_terms(doc, name):
                offsets = doc.term_offsets(name, term)
                if offsets:
                    out.setdefault(name, set()).update(offsets)

    def describe(self) -> str:
        if self.form == "regex":
            return f"{_field_label(self.field)}/{self.source}/"
        if self.form == "prefix":
            return f"{_field_label(self.field)}{escape_wildcard(self.source)}*"
        return f"{_field_label(self.field)}{self.source}"

    def reason(self, doc: AnalyzedDocument) -> str:
        what = {"prefix": f"starts with {self.source!r}", "wildcard": "matches the wildcard",
                "regex": "matches the regex"}[self.form]
        return _leaf_reason(self, self.field, doc, what)



RangeKind = Literal["number", "time", "string"]


class RangeMatch(Matcher):
    """A range or comparison on numbers, timestamps (epoch seconds) or strings.

    Number ranges read numbers and decimal strings; time ranges read ISO-8601 strings and epoch
    numbers; string ranges compare the field's terms in code-point order. None is an open end.
    """

    __slots__ = ("field", "kind", "low", "high", "include_low", "include_high", "label")

    def __init__(
        self,
        field: str,
        kind: RangeKind,
        low: Any,
        high: Any,
        include_low: bool,
        include_high: bool,
        label: str,
    ) -> None:
        self.field = field
        self.kind = kind
        self.low = low
        self.high = high
        self.include_low = include_low
        self.include_high = include_high
        self.label = label

    def values(self, doc: AnalyzedDocument) -> Iterable[Any]:
        """The values of the field this range compares, in its kind."""
        if self.kind == "number":
            return doc.numbers(self.field)
        if self.kind == "time":
            return doc.timestamps(self.field)
        return doc.terms(self.field)

    def contains(self, value: Any) -> bool:
        """Whether ``value`` lies within the range."""
        low, high = self.low, self.high
        if low is not None and (value < low if self.include_low else value <= low):
            return False
        return high is None or (value <= high if self.include_high else value < high)

    def matches(self, doc: AnalyzedDocument) -> bool:
        return any(self.contains(v) for v in self.values(doc))

    def describe(self) -> str:
        return self.label

    def reason(self, doc: AnalyzedDocument) -> str:
        if not doc.has(self.field):
            return _absent(self.field)
        values = list(self.values(doc))
        if not values:
            return f"field {self.field} holds no {self.kind} value"
        inside = [v for v in values if self.contains(v)]
        shown = inside or values
        listed = ", ".join(repr(v) for v in shown[:5]) + (" ..." if len(shown) > 5 else "")
        return f"{self.field} = {listed} {'is' if inside else 'is not'} within the range"


class ExistsMatch(Matcher):
    """``_exists_:field``: the field is present with a non-null value."""

    __slots__ = ("field",)

    def __init__(self, field: str) -> None:
        self.field = field

    def matches(self, doc: AnalyzedDocument) -> bool:
        return doc.has(self.field)

    def describe(self) -> str:
        return f"_exists_:{self.field}"

    def reason(self, doc: AnalyzedDocument) -> str:
        return f"field {self.field} is {'present' if doc.has(self.field) else 'absent'}"


class AllMatch(Matcher):
    """Conjunction: every clause matches."""

    __slots__ = ("clauses",)

    def __init__(self, clauses: tuple[Matcher, ...]) -> None:
        self.clauses = clauses

    def matches(self, doc: AnalyzedDocument) -> bool:
        return all(c.matches(doc) for c in self.clauses)

    def collect_spans(self, doc: AnalyzedDocument, out: dict[str, set[tuple[int, int]]]) -> None:
        for clause in self.clauses:
            clause.collect_spans(doc, out)

    def describe(self) -> str:
        return "(" + " AND ".join(c.describe() for c in self.clauses) + ")"

    def explain_into(self, doc: AnalyzedDocument, depth: int, lines: list[str]) -> bool:
        header = len(lines)
        lines.append("")
        results = [c.explain_into(doc, depth + 1, lines) for c in self.clauses]
        matched = all(results)
        lines[header] = (
            f"{'  ' * depth}{_verdict(matched)} AND — {sum(results)} of {len(results)} "
            "clauses match, all are required"
        )
        return matched


class AnyMatch(Matcher):
    """Disjunction: at least one clause matches."""

    __slots__ = ("clauses",)

    def __init__(self, clauses: tuple[Matcher, ...]) -> None:
        self.clauses = clauses

    def matches(self, doc: AnalyzedDocument) -> bool:
        return any(c.matches(doc) for c in self.clauses)

    def collect_spans(self, doc: AnalyzedDocument, out: dict[str, set[tuple[int, int]]]) -> None:
        for clause in self.clauses:
            # A leaf (and a negation) adds spans only where it matches, so only a conjunction,
            # whose clauses may match on their own, is asked first.
            if type(clause) is not AllMatch or clause.matches(doc):
                clause.collect_spans(doc, out)

    def describe(self) -> str:
        return "(" + " OR ".join(c.describe() for c in self.clauses) + ")"

    def explain_into(self, doc: AnalyzedDocument, depth: int, lines: list[str]) -> bool:
        header = len(lines)
        lines.append("")
        results = [c.explain_into(doc, depth + 1, lines) for c in self.clauses]
        matched = any(results)
        lines[header] = (
            f"{'  ' * depth}{_verdict(matched)} OR — {sum(results)} of {len(results)} "
            "clauses match, one is required"
        )
        return matched


class NotMatch(Matcher):
    """Negation: the clause does not match. Contributes no highlights."""

    __slots__ = ("clause",)

    def __init__(self, clause: Matcher) -> None:
        self.clause = clause

    def matches(self, doc: AnalyzedDocument) -> bool:
        return not self.clause.matches(doc)

    def describe(self) -> str:
        return f"NOT {self.clause.describe()}"

    def explain_into(self, doc: AnalyzedDocument, depth: int, lines: list[str]) -> bool:
        header = len(lines)
        lines.append("")
        inner = self.clause.explain_into(doc, depth + 1, lines)
        lines[header] = (
            f"{'  ' * depth}{_verdict(not inner)} NOT — the clause "
            f"{'matches, so this fails' if inner else 'does not match'}"
        )
        return not inner

