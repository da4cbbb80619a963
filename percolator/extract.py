"""Extraction of what a document must contain for a query to possibly match it.

A query's requirement is a monotone condition in conjunctive normal form over *atoms*: an exact
term of a field, a term pattern some term of a field passes (from prefixes, wildcards and
regexes), a number or timestamp interval, or the presence of a field. Every atom is a necessary
condition, so a document failing the requirement cannot match and need not be verified;
negations contribute nothing. A query with an empty requirement goes to the always-run bucket.
When every atom also decides its part of the query (a single word on a text field, a keyword,
a prefix or wildcard, an inclusive range, field presence) and only AND and OR combine them, the
requirement is *exact*: it holds exactly when the query matches, as Elasticsearch's percolator
marks fully extracted queries as verified.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from percolator.analysis import DEFAULT_FIELD, KEYWORD, TEXT, Schema
from percolator.document import AnalyzedDocument
from percolator.errors import InvalidQueryError
from percolator.evaluate import CompiledQuery
from percolator.interning import INTERN_POOL
from percolator.match_tree import (
    AllMatch,
    AnyMatch,
    ExistsMatch,
    Matcher,
    NotMatch,
    PatternMatch,
    RangeMatch,
    TermMatch,
)
from percolator.term_patterns import TERM_EDGE, TermPattern, glob_pattern, regex_literals

__all__ = [
    "MAX_CLAUSES",
    "MIN_LITERAL",
    "Atom",
    "Clause",
    "Requirement",
    "Selectivity",
    "atom_holds",
    "extract",
    "term_filter",
]

#: ``("term", field, term)``, ``("pattern", field, kind, form, source)`` (some term of the field
#: passes :func:`term_filter` of ``kind, form, source``), ``("number" | "time", field, low,
#: high)`` (inclusive floats, None = open) or ``("exists", field)``. ``field`` may be the
#: default-field pseudo-field ``"*"``.
Atom = tuple[Any, ...]
Clause = frozenset[Atom]

#: A disjunction that would distribute into more clauses than this is weakened instead.
MAX_CLAUSES = 32

#: Literals shorter than this (counting their term-edge frames) are too common to filter on.
MIN_LITERAL = 3

#: Beyond this magnitude not every integer is a float, so an interval of floats may misjudge it.
_EXACT_FLOAT = 2**53


class _LiteralsIn:
    """Whether a term, framed by :data:`TERM_EDGE`, contains every literal."""

    __slots__ = ("literals",)

    def __init__(self, literals: tuple[str, ...]) -> None:
        self.literals = literals

    def __call__(self, term: str) -> bool:
        framed = TERM_EDGE + term + TERM_EDGE
        return all(literal in framed for literal in self.literals)


@lru_cache(maxsize=1 << 16)
def term_filter(kind: str, form: str, source: str) -> TermPattern:
    """The test a term must pass for a ``("pattern", field, kind, form, source)`` atom.

    A prefix or wildcard is its own test (the atom then decides the query node); a regex is
    tested only for its literals of :data:`MIN_LITERAL` characters or more, all within the one
    term, and the evaluator runs the regex itself. ``literals`` keeps the long literals only.

    Examples
    --------
    >>> bool(term_filter("text", "wildcard", "M?rger*").test("mergers"))
    True
    >>> regex = term_filter("text", "regex", "ac.e")
    >>> regex.literals, regex.test("acmes"), regex.test("lace")
    (('\\x1eac',), True, False)
    """
    if form == "regex":
        literals = _long(regex_literals(source))
        return TermPattern(_LiteralsIn(literals), literals)
    pattern = glob_pattern(form, source, kind)  # type: ignore[arg-type]
    return TermPattern(pattern.test, _long(pattern.literals))


def _long(literals: Iterable[str]) -> tuple[str, ...]:
    return tuple(lit for lit in literals if len(lit) >= MIN_LITERAL)


def atom_holds(doc: AnalyzedDocument, atom: Atom) -> bool:
    """Whether ``atom`` holds for ``doc``, evaluated directly (the reference for the index)."""
    kind, field_name = atom[0], atom[1]
    if kind == "term":
        return atom[2] in doc.terms(field_name)
    if kind == "pattern":
        # Every term tested, not the probe literal's few: the reference for that search too.
        test = term_filter(*atom[2:]).test
        return any(test(term) for term in doc.terms(field_name))
    if kind == "exists":
        return doc.has(field_name)
    low, high = atom[2], atom[3]
    values = doc.numbers(field_name) if kind == "number" else doc.timestamps(field_name)
    for value in values:
        if (low is None or low <= value) and (high is None or value <= high):
            return True
    return False


@dataclass(frozen=True)
class Selectivity:
    """Estimates of the fraction of documents that hit an atom; lower is more selective.

    Parameters
    ----------
    term_frequency
        Optional ``term -> fraction of documents containing it``, e.g. from a sample of the
        stream (Luwak's TermWeightor idea). Terms missing from it count as ``unseen``.
    unseen
        Fraction assumed for a term absent from ``term_frequency``.

    Without statistics, longer terms count as rarer, as the Elasticsearch QueryAnalyzer does.
    """

    term_frequency: Mapping[str, float] | None = None
    unseen: float = 1e-4
    _cache: dict[Atom, float] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    @classmethod
    def from_documents(
        cls, documents: Iterable[Mapping[str, Any]], schema: Schema, **options: Any
    ) -> Selectivity:
        """Term frequencies measured on a sample of documents, over the terms of every field.

        Examples
        --------
        >>> stats = Selectivity.from_documents(
        ...     [{"title": "acme news"}, {"title": "acme"}], Schema.of({"title": "text"}))
        >>> stats.term_frequency["acme"], stats.term_frequency["news"]
        (1.0, 0.5)
        """
        counts: dict[str, int] = {}
        total = 0
        for document in documents:
            total += 1
            doc = AnalyzedDocument(document, schema)
            seen: set[str] = set()
            for name in doc.fields():
                seen |= doc.terms(name)
            for term in seen:
                counts[term] = counts.get(term, 0) + 1
        frequency = {t: n / total for t, n in counts.items()} if total else {}
        return cls(term_frequency=frequency, **options)

    def atom_cost(self, atom: Atom) -> float:
        """Estimated fraction of documents in which ``atom`` holds."""
        cost = self._cache.get(atom)
        if cost is None:
            cost = self._estimate(atom)
            if len(self._cache) < 1 << 20:
                self._cache[atom] = cost
        return cost

    def _estimate(self, atom: Atom) -> float:
        kind = atom[0]
        if kind == "term":
            stats = self.term_frequency
            if stats is not None:
                return stats.get(atom[2], self.unseen)
            return max(0.5 ** len(atom[2]), 1e-6)
        if kind == "pattern":
            # A literal inside terms hits more documents than a whole term of its length.
            literals = term_filter(*atom[2:]).literals
            return min(1.0, 16.0 * 0.5 ** max(len(lit) for lit in literals))
        if kind in ("number", "time"):
            return 0.3
        return 0.9

    def clause_cost(self, clause: Clause) -> float:
        """Estimated fraction of documents that hit at least one atom of ``clause``."""
        return min(1.0, sum(self.atom_cost(a) for a in clause))


DEFAULT_SELECTIVITY = Selectivity()


@dataclass(frozen=True, slots=True)
class Requirement:
    """A conjunction of clauses, each a disjunction of atoms, that every match satisfies.

    No clauses: nothing is required (the query always runs). An empty clause: the query can
    never match. ``exact``: the requirement also suffices, so a document satisfying it matches
    and a presearcher that checks every clause need not run the evaluator to decide.
    """

    clauses: tuple[Clause, ...]
    exact: bool = False

    @property
    def always(self) -> bool:
        """Whether nothing is required, so every document must be verified."""
        return not self.clauses

    @property
    def never(self) -> bool:
        """Whether no document can satisfy the requirement."""
        return any(not c for c in self.clauses)

    def atoms(self) -> frozenset[Atom]:
        """Every atom mentioned by a clause."""
        return frozenset().union(*self.clauses) if self.clauses else frozenset()

    def anchor(self, selectivity: Selectivity = DEFAULT_SELECTIVITY) -> Clause:
        """The clause to post the query under: the one fewest documents should hit."""
        return min(self.clauses, key=lambda c: (selectivity.clause_cost(c), len(c), sorted(
            map(repr, c))))


TRUE = Requirement(())
FALSE = Requirement((frozenset(),))


def _absorb(clauses: Iterable[Clause]) -> tuple[Clause, ...]:
    unique = sorted(set(clauses), key=len)
    kept: list[Clause] = []
    for clause in unique:
        if not clause:
            return FALSE.clauses
        if not any(k <= clause for k in kept):
            kept.append(clause)
    return tuple(kept)


def conjunction(parts: Iterable[Requirement]) -> Requirement:
    """Every part holds."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    return Requirement(
        _absorb(c for part in parts for c in part.clauses), all(p.exact for p in parts)
    )


def disjunction(parts: Iterable[Requirement], selectivity: Selectivity) -> Requirement:
    """At least one part holds; distributes into CNF, weakening when it would grow too large."""
    parts = list(parts)
    # A part that can never match drops out of a disjunction without changing it.
    kept = [p for p in parts if not p.never]
    if not kept:
        return FALSE
    if len(kept) == 1:
        return kept[0]
    if any(p.always for p in kept):
        return TRUE
    exact = all(p.exact for p in kept)
    size = 1
    for part in kept:
        size *= len(part.clauses)
    if size > MAX_CLAUSES:
        # Each part implies any one of its clauses, so the union of one clause per part is a
        # weaker but still necessary condition; choose the most selective clause of each.
        return Requirement((frozenset().union(*(p.anchor(selectivity) for p in kept)),))
    # Distributing OR over the parts' clauses is an equivalence, so exactness survives it.
    product: list[Clause] = [frozenset()]
    for part in kept:
        product = [left | right for left in product for right in part.clauses]
    return Requirement(_absorb(product), exact)


def _single_clause(atom: Atom) -> Clause:
    # The requirements of a million standing queries repeat the same atoms, and a frozenset
    # costs 216 bytes: one interned clause per atom.
    return INTERN_POOL(frozenset((atom,)))


def _atom_requirement(atoms: Iterable[Atom], exact: bool = False) -> Requirement:
    clauses = [_single_clause(a) for a in atoms]
    return Requirement(tuple(clauses) if len(clauses) == 1 else _absorb(clauses), exact)


def _exact_bound(value: Any, included: bool) -> bool:
    """Whether an interval atom's float bound decides a range bound exactly."""
    if value is None:
        return True
    if not included:
        return False
    try:
        return float(value) == value and abs(value) <= _EXACT_FLOAT
    except OverflowError:
        return False


def _pattern_requirement(node: PatternMatch, name: str, kind: str, exact: bool) -> Requirement:
    """The atom of a prefix, wildcard or regex on fields of one analysis ``kind``."""
    literals = term_filter(kind, node.form, node.source).literals
    if not literals:
        # Too short to filter on, or no literal at all: the field must still be present.
        return _atom_requirement([("exists", name)])
    exact = exact and node.form != "regex"
    for literal in literals:
        if literal.startswith(TERM_EDGE) and literal.endswith(TERM_EDGE) and len(literal) > 1:
            # A literal framed on both sides is a whole term: an exact lookup.
            return _atom_requirement([("term", name, literal[1:-1])], exact)
    return _atom_requirement([("pattern", name, kind, node.form, node.source)], exact)


def _float_bound(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _requirement(node: Matcher, schema: Schema, selectivity: Selectivity) -> Requirement:
    if isinstance(node, AllMatch):
        return conjunction(_requirement(c, schema, selectivity) for c in node.clauses)
    if isinstance(node, AnyMatch):
        return disjunction(
            (_requirement(c, schema, selectivity) for c in node.clauses), selectivity
        )
    if isinstance(node, NotMatch):
        return TRUE
    if isinstance(node, ExistsMatch):
        return _atom_requirement([("exists", node.field)], True)
    if isinstance(node, RangeMatch):
        if node.kind == "string":
            return _atom_requirement([("exists", node.field)])
        exact = _exact_bound(node.low, node.include_low) and _exact_bound(
            node.high, node.include_high
        )
        return _atom_requirement(
            [(node.kind, node.field, _float_bound(node.low), _float_bound(node.high))], exact
        )
    if isinstance(node, TermMatch):
        name = DEFAULT_FIELD if node.field is None else node.field
        options: list[Requirement] = []
        kinds = schema.possible_kinds(name)
        # Fields that may be analysed either way meet text words and keywords in one term
        # set, so only a field of one kind decides the node.
        single = len(kinds) == 1
        if TEXT in kinds:
            options.append(
                _atom_requirement(
                    (("term", name, w) for w in node.words), single and len(node.words) == 1
                ) if node.words else FALSE
            )
        if KEYWORD in kinds:
            options.append(
                Requirement((frozenset(("term", name, k) for k in node.keywords),), single)
            )
        return disjunction(options, selectivity)
    if isinstance(node, PatternMatch):
        name = DEFAULT_FIELD if node.field is None else node.field
        kinds = schema.possible_kinds(name)
        return disjunction(
            (_pattern_requirement(node, name, kind, len(kinds) == 1) for kind in sorted(kinds)),
            selectivity,
        )
    raise InvalidQueryError(f"cannot extract from {type(node).__name__}")


def extract(
    query: CompiledQuery, selectivity: Selectivity = DEFAULT_SELECTIVITY
) -> Requirement:
    """The requirement every document matching ``query`` satisfies.

    Examples
    --------
    >>> from query_lang.ast import SearchAnd, SearchNot, SearchPrefix, SearchTerm
    >>> from percolator.evaluate import compile_query
    >>> schema = Schema.of({"title": "text"})
    >>> q = SearchAnd((SearchTerm("title", "acme"), SearchPrefix("title", "merg"),
    ...                SearchNot(SearchTerm("title", "rumour"))))
    >>> requirement = extract(compile_query(q, schema))
    >>> sorted(sorted(c) for c in requirement.clauses), requirement.exact
    ([[('pattern', 'title', 'text', 'prefix', 'merg')], [('term', 'title', 'acme')]], False)

    Without the negation every atom decides its node, so the requirement is exact:

    >>> extract(compile_query(SearchAnd(q.clauses[:2]), schema)).exact
    True
    """
    return _requirement(query.root, query.schema, selectivity)

