"""The exact evaluator of search queries: compiles a ``SearchNode`` once into a tree of matchers
that decide a match on one analysed document, collect highlights and explain the decision.

It is the reference the prefilter is verified against: every candidate the presearcher proposes
is confirmed here, and the no-filtering baseline runs it for every query.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, TypeVar

import re2

from percolator.analysis import (
    DEFAULT_SCHEMA,
    KEYWORD,
    TEXT,
    AnalyzedDocument,
    Schema,
    analyze_text,
    canonical_keyword,
    normalize_term,
    parse_number,
    parse_timestamp,
)
from percolator.errors import InvalidQueryError
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
    "AllMatch",
    "AnyMatch",
    "CompiledQuery",
    "Evaluation",
    "ExistsMatch",
    "Highlights",
    "Matcher",
    "NotMatch",
    "PatternMatch",
    "RangeMatch",
    "SharedValues",
    "TermMatch",
    "TermPattern",
    "compile_query",
    "evaluate",
    "explain",
    "field_predicate",
    "glob_pattern",
    "shared",
]

#: ``field -> [[start, end], ...]`` character offsets of the matched terms, sorted.
Highlights = dict[str, list[list[int]]]

#: Frames a term in the strings the substring automaton runs over; never inside a text term.
TERM_EDGE = "\x1e"

_V = TypeVar("_V")

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


class SharedValues:
    """One object for each distinct immutable value passed through it: what a million standing
    queries repeat (word tuples, one-atom requirement clauses) is stored once. Emptied when it
    holds ``limit`` values, so it stays bounded; values already handed out stay valid.

    Examples
    --------
    >>> share = SharedValues(limit=2)
    >>> a = share(("acme",)); b = share(tuple(["acme"]))
    >>> a is b
    True
    """

    __slots__ = ("_table", "limit")

    def __init__(self, limit: int) -> None:
        self._table: dict[Any, Any] = {}
        self.limit = limit

    def __call__(self, value: _V) -> _V:
        found = self._table.get(value)
        if found is None:
            if len(self._table) >= self.limit:
                self._table.clear()
            found = self._table[value] = value
        return found

    def clear(self) -> None:
        """Forget every value (for measuring memory from a clean start)."""
        self._table.clear()


#: The values the compiled queries and their requirements share.
shared = SharedValues(limit=1 << 20)


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
        self.words = shared(tuple(map(sys.intern, analyze_text(text))))
        number = parse_number(text)
        spelled = None if number is None else canonical_keyword(number)
        # A tuple of one or two, not a set: a frozenset costs 216 bytes per leaf.
        self.keywords = shared((text,) if spelled is None or spelled == text else (text, spelled))

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
        return bool(self._phrase_starts(doc, name))

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


@dataclass(frozen=True)
class TermPattern:
    """A test on single terms plus literals a matching term must contain.

    ``literals`` are framed with :data:`TERM_EDGE` where anchored: ``"\\x1eacm"`` means the term
    starts with ``acm``. An empty tuple means no literal is known.
    """

    test: Callable[[str], bool]
    literals: tuple[str, ...]

    @cached_property
    def probe(self) -> str | None:
        """The longest literal, used to find the few terms worth testing."""
        if not self.literals:
            return None
        return max(self.literals, key=lambda lit: (len(lit.strip(TERM_EDGE)), len(lit)))

    def matching_terms(self, doc: AnalyzedDocument, name: str) -> Iterator[str]:
        """The distinct terms of field ``name`` that pass the test, lazily.

        Rather than testing every term, finds the probe literal in the framed terms of the
        field (one C-level search per occurrence) and tests only the terms containing it.
        """
        probe = self.probe
        joined = doc.joined_terms(name) if probe is not None else ""
        if probe is None or not doc.frameable(name):
            yield from (t for t in doc.terms(name) if self.test(t))
            return
        test = self.test
        lead = probe[0] == TERM_EDGE
        trail = probe[-1] == TERM_EDGE
        found = joined.find(probe)
        while found >= 0:
            start = found if lead else joined.rfind(TERM_EDGE, 0, found)
            end = found + len(probe) - 1 if trail else joined.find(TERM_EDGE, found + len(probe))
            term = joined[start + 1:end]
            if test(term):
                yield term
            found = joined.find(probe, end)


class _FullMatch:
    """RE2 whole-string matching through the compiled program, skipping the Python wrapper's
    per-call offset bookkeeping that costs several times the match itself."""

    __slots__ = ("_program", "_anchor", "_fallback")

    def __init__(self, compiled: Any) -> None:
        self._program = getattr(compiled, "_regexp", None)
        anchor_type = getattr(re2, "_Anchor", None)
        self._anchor = getattr(anchor_type, "ANCHOR_BOTH", None)
        self._fallback = compiled.fullmatch
        if self._program is None or self._anchor is None:
            self._program = None

    def __call__(self, term: str) -> bool:
        if self._program is None:
            return self._fallback(term) is not None
        data = term.encode("utf-8")
        return self._program.Match(self._anchor, data, 0, len(data))[0][0] != -1


def _compile_re2(pattern: str, what: str) -> _FullMatch:
    try:
        return _FullMatch(re2.compile(pattern, _RE2_OPTIONS))
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise InvalidQueryError(f"invalid {what} /{pattern}/: {detail}") from None


def _re2_escape(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "\\" + c if c.isascii() else c for c in text)


def wildcard_segments(pattern: str) -> list[tuple[str, str]]:
    """Split a wildcard into ``("literal", text)``, ``("any", "*")`` and ``("one", "?")`` items.

    ``\\`` escapes the next character; consecutive ``*`` collapse into one.
    """
    items: list[tuple[str, str]] = []
    literal: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            literal.append(next(chars, "\\"))
            continue
        if char not in "*?":
            literal.append(char)
            continue
        if literal:
            items.append(("literal", "".join(literal)))
            literal = []
        if char == "*" and items and items[-1][0] == "any":
            continue
        items.append(("any", "*") if char == "*" else ("one", "?"))
    if literal:
        items.append(("literal", "".join(literal)))
    return items


def _wildcard_pattern(pattern: str, normalize: bool) -> TermPattern:
    items = wildcard_segments(pattern)
    if normalize:
        items = [(k, normalize_term(t) if k == "literal" else t) for k, t in items]
    literals = []
    for index, (kind, text) in enumerate(items):
        if kind != "literal":
            continue
        head = TERM_EDGE if index == 0 else ""
        tail = TERM_EDGE if index == len(items) - 1 else ""
        literals.append(head + text + tail)
    kinds = [k for k, _ in items]
    if "any" not in kinds and "one" not in kinds:
        exact = "".join(t for _, t in items)
        return TermPattern(exact.__eq__, tuple(literals))
    if kinds in (["any"], ["literal", "any"]):
        prefix = items[0][1] if kinds[0] == "literal" else ""
        return TermPattern(lambda t: t.startswith(prefix), tuple(literals))
    if kinds.count("any") <= 2:
        # Python's backtracking engine is several times faster per call than RE2 here, and
        # with at most two stars its worst case stays quadratic in the term length.
        regex = "".join(
            ".*" if k == "any" else "." if k == "one" else re.escape(t) for k, t in items
        )
        return TermPattern(re.compile(regex, re.DOTALL).fullmatch, tuple(literals))
    regex = "(?s)" + "".join(
        ".*" if k == "any" else "." if k == "one" else _re2_escape(t) for k, t in items
    )
    return TermPattern(_compile_re2(regex, "wildcard"), tuple(literals))


_CLASS_ESCAPES = frozenset("dDwWsSbBAz")


def regex_literals(pattern: str) -> tuple[str, ...]:
    """Literal runs every whole-term match of RE2 ``pattern`` must contain (conservatively).

    Only top-level runs of plain characters count; groups, classes and escapes like ``\\d``
    break runs; a character made optional by ``?``, ``*`` or ``{0,`` is dropped. A top-level
    alternation or an inline flag (``(?i)``) means no literal is known. Runs touching the ends
    of the pattern are anchored with :data:`TERM_EDGE`, since the regex must match the whole term.

    Examples
    --------
    >>> regex_literals("acme.*corp")
    ('\\x1eacme', 'corp\\x1e')
    >>> regex_literals("colou?r")
    ('\\x1ecolo', 'r\\x1e')
    >>> regex_literals("a|b")
    ()
    """
    runs: list[tuple[str, int, int]] = []
    run: list[str] = []
    run_start = 0
    i = 0
    n = len(pattern)

    def close(end: int) -> None:
        nonlocal run
        if run:
            runs.append(("".join(run), run_start, end))
        run = []

    while i < n:
        char = pattern[i]
        if char == "\\":
            nxt = pattern[i + 1] if i + 1 < n else ""
            if nxt in _CLASS_ESCAPES:
                close(i)
                i += 2
                continue
            if nxt == "" or (nxt.isascii() and nxt.isalnum()):
                # \x41, \pN, \Q..\E, octal and control escapes: rare, so rather than
                # decode them, know no literal.
                return ()
            if not run:
                run_start = i
            run.append(nxt)
            i += 2
            continue
        if char == "|":
            return ()
        if char == "[":
            close(i)
            i = _skip_class(pattern, i)
            continue
        if char == "(":
            if pattern.startswith("(?", i) and not (
                pattern.startswith("(?:", i) or pattern.startswith("(?P<", i)
                or pattern.startswith("(?<", i)
            ):
                return ()
            close(i)
            i = _skip_group(pattern, i)
            if i < 0:
                return ()
            continue
        if char in "?*":
            if run:
                run.pop()
            close(i)
            i += 1
            continue
        if char == "{":
            if run:
                run.pop()
            close(i)
            end = pattern.find("}", i)
            i = n if end < 0 else end + 1
            continue
        if char in "+.^$":
            # After "x+" the run may not be followed directly by what comes next, and "x+" at
            # the end of the pattern does not anchor the run at the end of the term.
            close(i)
            i += 1
            continue
        if not run:
            run_start = i
        run.append(char)
        i += 1
    close(n)
    literals = []
    for text, start, end in runs:
        if not text:
            continue
        head = TERM_EDGE if start == 0 else ""
        tail = TERM_EDGE if end == n else ""
        literals.append(head + text + tail)
    return tuple(literals)


def _skip_class(pattern: str, i: int) -> int:
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            if end >= 0:
                i = end + 2
                continue
        if pattern[i] == "]":
            return i + 1
        i += 1
    return len(pattern)


def _skip_group(pattern: str, i: int) -> int:
    depth = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _skip_class(pattern, i)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


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
            test = _compile_re2(source, "regex")
            self.text_pattern = self.keyword_pattern = TermPattern(test, regex_literals(source))

    def pattern_for(self, kind: str) -> TermPattern:
        """The term test used on fields analysed as ``kind``."""
        return self.text_pattern if kind == TEXT else self.keyword_pattern

    def _matches_field(self, doc: AnalyzedDocument, name: str) -> bool:
        return next(self.pattern_for(doc.kind(name)).matching_terms(doc, name), None) is not None

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
            return f"{_field_label(self.field)}{_escape_wildcard(self.source)}*"
        return f"{_field_label(self.field)}{self.source}"

    def reason(self, doc: AnalyzedDocument) -> str:
        what = {"prefix": f"starts with {self.source!r}", "wildcard": "matches the wildcard",
                "regex": "matches the regex"}[self.form]
        return _leaf_reason(self, self.field, doc, what)


def glob_pattern(form: Literal["prefix", "wildcard"], source: str, kind: str) -> TermPattern:
    """The term test of a prefix or wildcard on fields analysed as ``kind``.

    Examples
    --------
    >>> pattern = glob_pattern("prefix", "Merg", TEXT)
    >>> pattern.literals, pattern.test("mergers"), pattern.test("emerge")
    (('\\x1emerg',), True, False)
    """
    wildcard = _escape_wildcard(source) + "*" if form == "prefix" else source
    return _wildcard_pattern(wildcard, kind == TEXT)


def _escape_wildcard(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")


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


# ---------------------------------------------------------------- compilation

_OPEN_BOUND = (None, "*")


def _bound_kind(bound: Any) -> str | None:
    if bound in _OPEN_BOUND:
        return None
    if isinstance(bound, bool):
        raise InvalidQueryError(f"a range bound cannot be the boolean {bound!r}")
    if parse_number(bound) is not None:
        return "number"
    if isinstance(bound, str) and parse_timestamp(bound) is not None:
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
        return parse_timestamp(bound, schema.time_unit)
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
