"""Extraction of what a document must contain for a query to possibly match it.

A query's requirement is a monotone condition in conjunctive normal form over *atoms*: an exact
term of a field, a literal inside some term of a field (from prefixes, wildcards and regexes),
a number or timestamp interval, or the presence of a field. Every atom is a necessary
condition, so a document failing the requirement cannot match and need not be verified;
negations contribute nothing. A query with an empty requirement goes to the always-run bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from percolator.analysis import DEFAULT_FIELD, KEYWORD, TEXT, AnalyzedDocument, Schema
from percolator.errors import InvalidQueryError
from percolator.evaluate import (
    TERM_EDGE,
    AllMatch,
    AnyMatch,
    CompiledQuery,
    ExistsMatch,
    Matcher,
    NotMatch,
    PatternMatch,
    RangeMatch,
    TermMatch,
)

__all__ = [
    "MAX_CLAUSES",
    "MIN_LITERAL",
    "Atom",
    "Clause",
    "Requirement",
    "Selectivity",
    "extract",
]

#: ``("term", field, term)``, ``("literal", field, framed literal)``,
#: ``("number" | "time", field, low, high)`` (inclusive floats, None = open) or
#: ``("exists", field)``. ``field`` may be the default-field pseudo-field ``"*"``.
Atom = tuple[Any, ...]
Clause = frozenset[Atom]

#: A disjunction that would distribute into more clauses than this is weakened instead.
MAX_CLAUSES = 32

#: Literals shorter than this (counting their term-edge frames) are too common to filter on.
MIN_LITERAL = 3


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
        if kind == "literal":
            # A literal inside terms hits more documents than a whole term of its length.
            return min(1.0, 16.0 * 0.5 ** len(atom[2]))
        if kind in ("number", "time"):
            return 0.3
        return 0.9

    def clause_cost(self, clause: Clause) -> float:
        """Estimated fraction of documents that hit at least one atom of ``clause``."""
        return min(1.0, sum(self.atom_cost(a) for a in clause))


DEFAULT_SELECTIVITY = Selectivity()


@dataclass(frozen=True)
class Requirement:
    """A conjunction of clauses, each a disjunction of atoms, that every match satisfies.

    No clauses: nothing is required (the query always runs). An empty clause: the query can
    never match.
    """

    clauses: tuple[Clause, ...]

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
    return Requirement(_absorb(c for part in parts for c in part.clauses))


def disjunction(parts: Iterable[Requirement], selectivity: Selectivity) -> Requirement:
    """At least one part holds; distributes into CNF, weakening when it would grow too large."""
    parts = [p for p in parts if not p.never]
    if not parts:
        return FALSE
    if any(p.always for p in parts):
        return TRUE
    size = 1
    for part in parts:
        size *= len(part.clauses)
    if size > MAX_CLAUSES:
        # Each part implies any one of its clauses, so the union of one clause per part is a
        # weaker but still necessary condition; choose the most selective clause of each.
        return Requirement((frozenset().union(*(p.anchor(selectivity) for p in parts)),))
    product: list[Clause] = [frozenset()]
    for part in parts:
        product = [left | right for left in product for right in part.clauses]
    return Requirement(_absorb(product))


def _atom_requirement(atoms: Iterable[Atom]) -> Requirement:
    return Requirement(_absorb(frozenset({a}) for a in atoms))


def _literal_atom(field_name: str, literal: str) -> Atom:
    if literal.startswith(TERM_EDGE) and literal.endswith(TERM_EDGE) and len(literal) > 1:
        # A literal framed on both sides is a whole term: an exact lookup, no automaton.
        return ("term", field_name, literal[1:-1])
    return ("literal", field_name, literal)


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
        return _atom_requirement([("exists", node.field)])
    if isinstance(node, RangeMatch):
        if node.kind == "string":
            return _atom_requirement([("exists", node.field)])
        return _atom_requirement(
            [(node.kind, node.field, _float_bound(node.low), _float_bound(node.high))]
        )
    if isinstance(node, TermMatch):
        name = DEFAULT_FIELD if node.field is None else node.field
        options: list[Requirement] = []
        kinds = schema.possible_kinds(name)
        if TEXT in kinds:
            options.append(
                _atom_requirement(("term", name, w) for w in node.words) if node.words else FALSE
            )
        if KEYWORD in kinds:
            options.append(
                Requirement((frozenset(("term", name, k) for k in node.keywords),))
            )
        return disjunction(options, selectivity)
    if isinstance(node, PatternMatch):
        name = DEFAULT_FIELD if node.field is None else node.field
        options = []
        for kind in sorted(schema.possible_kinds(name)):
            literals = [
                lit for lit in node.pattern_for(kind).literals if len(lit) >= MIN_LITERAL
            ]
            atoms = [_literal_atom(name, lit) for lit in literals] or [("exists", name)]
            options.append(_atom_requirement(atoms))
        return disjunction(options, selectivity)
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
    >>> sorted(sorted(c) for c in extract(compile_query(q, schema)).clauses)
    [[('literal', 'title', '\\x1emerg')], [('term', 'title', 'acme')]]
    """
    return _requirement(query.root, query.schema, selectivity)

