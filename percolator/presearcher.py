"""Prefilter strategies: given a document, which standing queries could match it.

A :class:`Presearcher` turns compiled queries into requirements and builds index segments over
them; a segment answers a document with candidate query slots, which the evaluator verifies.
:class:`NoFilterPresearcher` proposes every query (the baseline every other strategy must agree
with); :class:`IndexedPresearcher` indexes exact terms in dicts, literals of prefixes, wildcards
and regexes in Aho-Corasick automata, and numeric/time intervals in sorted arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

import ahocorasick
import numpy as np

from percolator.analysis import DEFAULT_FIELD, AnalyzedDocument
from percolator.errors import ConfigurationError
from percolator.evaluate import CompiledQuery
from percolator.extract import (
    DEFAULT_SELECTIVITY,
    TRUE,
    Atom,
    Clause,
    Requirement,
    Selectivity,
    extract,
)

__all__ = [
    "IndexedPresearcher",
    "IndexedSegment",
    "NoFilterPresearcher",
    "NoFilterSegment",
    "Presearcher",
    "Segment",
]


#: A query is posted under term pairs only when its two clauses give at most this many pairs.
MAX_PAIRS = 16


class Segment(ABC):
    """A set of query slots with a structure that proposes candidates for a document.

    A segment is *open* while queries are added (the live delta) and *sealed* once built;
    sealing may build structures that do not support cheap insertion.
    """

    def __init__(self) -> None:
        self.size = 0
        self.always_run = 0
        self.sealed = False

    @abstractmethod
    def add(self, slot: int, requirement: Requirement) -> None:
        """Add the query in ``slot`` with its requirement; only while the segment is open."""

    def seal(self) -> None:
        """Build the read-optimised structures; no query can be added afterwards."""
        self.sealed = True

    @abstractmethod
    def candidates(self, doc: AnalyzedDocument) -> Iterable[int]:
        """Slots of the queries in this segment that could match ``doc`` (each once)."""

    def _check_open(self) -> None:
        if self.sealed:
            raise ConfigurationError("cannot add a query to a sealed segment")


class Presearcher(ABC):
    """A prefilter strategy: how queries are reduced to requirements and indexed."""

    name = "presearcher"

    @abstractmethod
    def requirement(self, query: CompiledQuery) -> Requirement:
        """What a document must contain for ``query`` to be proposed for it."""

    @abstractmethod
    def new_segment(self) -> Segment:
        """An empty open segment."""


class NoFilterSegment(Segment):
    """Proposes every query it holds for every document."""

    def __init__(self) -> None:
        super().__init__()
        self._slots: list[int] = []

    def add(self, slot: int, requirement: Requirement) -> None:
        self._check_open()
        self._slots.append(slot)
        self.size += 1
        self.always_run += 1

    def candidates(self, doc: AnalyzedDocument) -> Iterable[int]:
        return self._slots


class NoFilterPresearcher(Presearcher):
    """The baseline: no prefilter, every query is verified against every document."""

    name = "no-filter"

    def requirement(self, query: CompiledQuery) -> Requirement:
        return TRUE

    def new_segment(self) -> Segment:
        return NoFilterSegment()


class _IntervalTable:
    """Intervals of one (kind, field), inclusive, open ends as infinities, sorted by low end."""

    __slots__ = ("pending", "lows", "highs", "atoms", "low_list")

    def __init__(self) -> None:
        self.pending: list[tuple[float, float, int]] = []
        self.lows = self.highs = self.atoms = None
        self.low_list: list[float] = []

    def seal(self) -> None:
        self.pending.sort()
        self.low_list = [low for low, _, _ in self.pending]
        self.lows = np.array(self.low_list, dtype=np.float64)
        self.highs = np.array([high for _, high, _ in self.pending], dtype=np.float64)
        self.atoms = np.array([atom for _, _, atom in self.pending], dtype=np.int64)

    def stab(self, value: float, hits: set[int]) -> None:
        try:
            value = float(value)
        except OverflowError:
            value = np.inf if value > 0 else -np.inf
        if self.atoms is None:
            hits.update(a for low, high, a in self.pending if low <= value <= high)
            return
        count = bisect_right(self.low_list, value)
        if count:
            hits.update(self.atoms[:count][self.highs[:count] >= value].tolist())


def _atom_holds(doc: AnalyzedDocument, atom: Atom) -> bool:
    kind, field_name = atom[0], atom[1]
    if kind == "literal":
        return atom[2] in doc.joined_terms(field_name)
    if kind == "term":
        return atom[2] in doc.terms(field_name)
    if kind == "exists":
        return doc.has(field_name)
    low, high = atom[2], atom[3]
    values = doc.numbers(field_name) if kind == "number" else doc.timestamps(field_name)
    for value in values:
        if (low is None or low <= value) and (high is None or value <= high):
            return True
    return False


def _probe_terms(doc: AnalyzedDocument, fields: Iterable[str]) -> frozenset[str] | set[str]:
    """The distinct terms ``doc`` holds in any of ``fields``, each once.

    The default fields' terms are all in :data:`DEFAULT_FIELD`'s, so when it is among
    ``fields`` only the other non-default fields add to it.
    """
    if DEFAULT_FIELD in fields:
        probe: frozenset[str] | set[str] = doc.terms(DEFAULT_FIELD)
        defaults = doc.default_fields()
        others = [f for f in fields if f != DEFAULT_FIELD and f not in defaults]
    else:
        probe = frozenset()
        others = list(fields)
    for field_name in others:
        terms = doc.terms(field_name)
        if terms:
            probe = probe | terms
    return probe


#: Partner dicts up to this size are probed key by key; larger ones are intersected in C from
#: their smaller side, so the cost follows the candidates and not the size of the index.
_SMALL_PARTNERS = 8


def _partners_present(
    partners: dict[Any, list[int]], present: frozenset[Any] | set[Any], posted: set[int]
) -> None:
    """Add to ``posted`` the slots of every partner in ``present``."""
    if len(partners) <= _SMALL_PARTNERS:
        for key, slots in partners.items():
            if key in present:
                posted.update(slots)
        return
    keys = (
        partners.keys() & present if len(present) < len(partners)
        else present.intersection(partners)
    )
    for key in keys:
        posted.update(partners[key])


_second = itemgetter(1)


def _automaton(literals: Iterable[tuple[str, int]]) -> ahocorasick.Automaton:
    automaton = ahocorasick.Automaton()
    for literal, atom_id in literals:
        automaton.add_word(literal, atom_id)
    automaton.make_automaton()
    return automaton


class IndexedSegment(Segment):
    """Postings of queries under the most selective clauses of their requirement.

    Exact terms live in dicts per field, framed literals in one Aho-Corasick automaton per
    field run over the document's distinct terms (a substring scan while the segment is open),
    intervals in arrays sorted by low end, present fields in a dict; a document looks each of
    its distinct terms up once per table, in C. Most queries are posted under a pair: two terms
    of their two most selective clauses, or a term and an atom of another clause, found by
    intersecting the partners of each document term with the document from the smaller side
    (a term's few partner literals are tested by substring search, so the automata a document
    must be scanned with hold only the literals queries are posted under alone). A posted
    query becomes a candidate only when its other clauses hold too, checked directly against
    the document (minimum-should-match over all clauses, as Elasticsearch's percolator does for
    conjunctions).
    """

    def __init__(self, selectivity: Selectivity = DEFAULT_SELECTIVITY) -> None:
        super().__init__()
        self._selectivity = selectivity
        self._atom_ids: dict[Atom, int] = {}
        self._atoms: list[Atom] = []
        self._postings: dict[int, list[int]] = {}
        # slot -> the clauses its posting leaves to check, as tuples of check-atom ids (small
        # ints, cheap to memoise per document); equal atoms of many queries share one id.
        self._checks: dict[int, tuple[tuple[int, ...], ...]] = {}
        self._check_ids: dict[Atom, int] = {}
        self._check_atoms: list[Atom] = []
        self._always: list[int] = []
        self._terms: dict[str, dict[str, int]] = {}
        self._literals: dict[str, dict[str, int]] = {}
        self._automata: dict[str, ahocorasick.Automaton] = {}
        # Automata over the literals queries are posted under alone, which every document
        # must be scanned for; the literals queries are posted under with a term are tested
        # only for the document terms that carry them.
        self._anchor_automata: dict[str, ahocorasick.Automaton] = {}
        self._intervals: dict[tuple[str, str], _IntervalTable] = {}
        self._exists: dict[str, int] = {}
        # field -> term -> [pair partners, mixed partners]; its keys are the fields whose
        # terms a document probes (see _term_fields for the lookup). Pair partners map a partner
        # term (same field) to the slots of the queries posted under a pair of terms that must
        # both occur; mixed partners map the id of another atom (a literal, an interval, a
        # term of another field...) to the slots of queries posted under a term and another
        # clause. Either is None when the term has none.
        self._by_term: dict[str, dict[str, list[Any]]] = {}
        # The same postings keyed by term first (term -> field -> [pairs, mixed]), so that a
        # document probes each of its distinct terms once, not once per field that holds it.
        self._term_fields: dict[str, dict[str, list[Any]]] = {}
        # Once sealed: term -> ((field, pairs, mixed), ...) with a term's few partners as
        # tuples (see _flat_partners).
        self._flat: dict[str, tuple[tuple[str, Any, Any], ...]] = {}

    def _atom_id(self, atom: Atom) -> int:
        known = self._atom_ids.get(atom)
        if known is not None:
            return known
        atom_id = len(self._atom_ids)
        self._atom_ids[atom] = atom_id
        self._atoms.append(atom)
        kind = atom[0]
        if kind == "term":
            self._terms.setdefault(atom[1], {})[atom[2]] = atom_id
        elif kind == "literal":
            self._literals.setdefault(atom[1], {})[atom[2]] = atom_id
        elif kind in ("number", "time"):
            low = -np.inf if atom[2] is None else atom[2]
            high = np.inf if atom[3] is None else atom[3]
            table = self._intervals.setdefault((kind, atom[1]), _IntervalTable())
            table.pending.append((low, high, atom_id))
        else:
            self._exists[atom[1]] = atom_id
        return atom_id

    def add(self, slot: int, requirement: Requirement) -> None:
        self._check_open()
        self.size += 1
        if requirement.never:
            return
        if requirement.always:
            self._always.append(slot)
            self.always_run += 1
            return
        selectivity = self._selectivity
        posted = self._post_pair(slot, requirement) or self._post_mixed(slot, requirement)
        if not posted:
            anchor = requirement.anchor(selectivity)
            for atom in anchor:
                self._postings.setdefault(self._atom_id(atom), []).append(slot)
            posted = (anchor,)
        rest = sorted(
            (c for c in requirement.clauses if c not in posted), key=selectivity.clause_cost
        )
        if rest:
            # Most selective clause first: a failing check usually stops at the first atom.
            self._checks[slot] = tuple(
                tuple(map(self._check_id, sorted(c, key=selectivity.atom_cost))) for c in rest
            )

    def _check_id(self, atom: Atom) -> int:
        known = self._check_ids.get(atom)
        if known is None:
            known = self._check_ids[atom] = len(self._check_atoms)
            self._check_atoms.append(atom)
        return known

    def _post_pair(self, slot: int, requirement: Requirement) -> tuple[Clause, ...]:
        """Post the query under every pair of terms of its two most selective term clauses.

        A document then proposes the query only when it holds both terms of a pair, so the
        queries posted per document follow co-occurrence, not the frequency of single terms:
        what keeps candidate counts flat as the number of queries grows.
        """
        cost = self._selectivity.clause_cost
        by_field: dict[str, list[Clause]] = {}
        for clause in requirement.clauses:
            fields = {a[1] for a in clause if a[0] == "term"}
            if len(fields) == 1 and all(a[0] == "term" for a in clause):
                by_field.setdefault(fields.pop(), []).append(clause)
        options = [
            sorted(clauses, key=cost)[:2] for clauses in by_field.values() if len(clauses) >= 2
        ]
        if not options:
            return ()
        first, second = min(options, key=lambda pair: cost(pair[0]) * cost(pair[1]))
        if len(first) * len(second) > MAX_PAIRS:
            return ()
        atom_cost = self._selectivity.atom_cost
        for left in first:
            for right in second:
                rare, common = (left, right) if atom_cost(left) <= atom_cost(right) else (
                    right, left)
                partners = self._partners(rare[1], rare[2], 0)
                partners.setdefault(common[2], []).append(slot)
        return (first, second)

    def _partners(self, field_name: str, term: str, kind: int) -> dict[Any, list[int]]:
        """The pair (``kind`` 0) or mixed (``kind`` 1) partners of ``term`` in ``field_name``."""
        by_term = self._by_term.setdefault(field_name, {})
        both = by_term.get(term)
        if both is None:
            both = by_term[term] = [None, None]
            self._term_fields.setdefault(term, {})[field_name] = both
        partners = both[kind]
        if partners is None:
            partners = both[kind] = {}
        return partners

    def _post_mixed(self, slot: int, requirement: Requirement) -> tuple[Clause, ...]:
        """Post the query under a term of one clause paired with an atom of another.

        Used when no two clauses are terms of one field: a prefix AND a term, a term AND a
        range, terms of two fields. The document's hit atoms are intersected with the
        partners of each of its terms.
        """
        cost = self._selectivity.clause_cost
        clauses = sorted(requirement.clauses, key=cost)
        term_clauses = [
            c for c in clauses if len(c) <= MAX_PAIRS and all(a[0] == "term" for a in c)
        ]
        if not term_clauses or len(clauses) < 2:
            return ()
        first = term_clauses[0]
        second = next((c for c in clauses if c != first), None)
        if second is None or len(first) * len(second) > MAX_PAIRS:
            return ()
        for term_atom in first:
            partners = self._partners(term_atom[1], term_atom[2], 1)
            for atom in second:
                partners.setdefault(self._atom_id(atom), []).append(slot)
        return (first, second)

    def seal(self) -> None:
        postings = self._postings
        for field_name, literals in self._literals.items():
            self._automata[field_name] = _automaton(literals.items())
            anchors = [(lit, atom) for lit, atom in literals.items() if atom in postings]
            if anchors:
                self._anchor_automata[field_name] = _automaton(anchors)
        for table in self._intervals.values():
            table.seal()
        self._flat = {
            term: tuple(
                (field_name, self._flat_partners(pairs, False),
                 self._flat_partners(mixed, True))
                for field_name, (pairs, mixed) in fields.items()
            )
            for term, fields in self._term_fields.items()
        }
        super().seal()

    def _flat_partners(self, partners: dict[Any, list[int]] | None, mixed: bool) -> Any:
        """A term's few partners as parallel tuples (keys, slots), contiguous to read; many
        stay a dict, to be intersected. Mixed partners' keys are ``(atom id, atom)`` pairs."""
        if partners is None or len(partners) > _SMALL_PARTNERS:
            return partners
        keys = tuple((k, self._atoms[k]) for k in partners) if mixed else tuple(partners)
        return keys, tuple(tuple(slots) for slots in partners.values())

    def hits(self, doc: AnalyzedDocument, *, anchors_only: bool = False) -> set[int]:
        """Ids of the indexed atoms of this segment that ``doc`` satisfies.

        With ``anchors_only``, the literals found are only those some query is posted under
        alone (terms, intervals and fields are always complete).
        """
        hits: set[int] = set()
        for field_name, table in self._terms.items():
            if doc.has(field_name):
                hits.update(map(table.__getitem__, table.keys() & doc.terms(field_name)))
        if self.sealed:
            automata = self._anchor_automata if anchors_only else self._automata
            for field_name, automaton in automata.items():
                if doc.has(field_name):
                    joined = doc.joined_terms(field_name)
                    if joined:
                        hits.update(map(_second, automaton.iter(joined)))
        else:
            for field_name, literals in self._literals.items():
                if doc.has(field_name):
                    joined = doc.joined_terms(field_name)
                    hits.update(atom for lit, atom in literals.items() if lit in joined)
        for (kind, field_name), intervals in self._intervals.items():
            if doc.has(field_name):
                values = doc.numbers(field_name) if kind == "number" else doc.timestamps(
                    field_name)
                for value in values:
                    intervals.stab(value, hits)
        for field_name, atom_id in self._exists.items():
            if doc.has(field_name):
                hits.add(atom_id)
        return hits

    def candidates(self, doc: AnalyzedDocument) -> Iterable[int]:
        posted: set[int] = set()
        postings = self._postings
        if postings:
            for atom_id in self.hits(doc, anchors_only=True):
                slots = postings.get(atom_id)
                if slots is not None:
                    posted.update(slots)
        if self._by_term:
            self._post_partner_hits(doc, posted)
        found = list(self._always)
        if not posted:
            return found
        checks = self._checks
        check_atoms = self._check_atoms
        memo: dict[int, bool] = {}
        for slot in posted:
            clauses = checks.get(slot)
            if clauses is not None:
                for clause in clauses:
                    for atom in clause:
                        held = memo.get(atom)
                        if held is None:
                            held = memo[atom] = _atom_holds(doc, check_atoms[atom])
                        if held:
                            break
                    else:
                        break
                else:
                    found.append(slot)
                continue
            found.append(slot)
        return found

    def _post_partner_hits(self, doc: AnalyzedDocument, posted: set[int]) -> None:
        """Add the queries posted under a document term and a partner the document holds.

        The partners are those of the document's terms, found by one intersection of all its
        distinct terms with the indexed ones, then checked per field. A pair partner is a term
        of the same field; a mixed partner an atom of another clause.
        A term's few partners are probed one by one (a substring search for a literal, cheaper
        than scanning the document for every literal of the segment); many are intersected
        with the document's terms, or with all the atoms it satisfies, found once.
        """
        held: dict[int, bool] = {}
        every: set[int] | None = None
        probe = _probe_terms(doc, self._by_term)
        if not probe:
            return
        field_terms: dict[str, frozenset[str]] = {}
        if not self.sealed:
            for term in self._term_fields.keys() & probe:
                for field_name, (pairs, mixed) in self._term_fields[term].items():
                    terms = field_terms.get(field_name)
                    if terms is None:
                        terms = field_terms[field_name] = doc.terms(field_name)
                    if term in terms:
                        if pairs is not None:
                            _partners_present(pairs, terms, posted)
                        if mixed is None:
                            continue
                        if len(mixed) > _SMALL_PARTNERS:
                            if every is None:
                                every = self.hits(doc)
                            _partners_present(mixed, every, posted)
                            continue
                        for atom_id, slots in mixed.items():
                            holds = held.get(atom_id)
                            if holds is None:
                                holds = held[atom_id] = _atom_holds(doc, self._atoms[atom_id])
                            if holds:
                                posted.update(slots)
            return
        flat = self._flat
        for term in flat.keys() & probe:
            for field_name, pairs, mixed in flat[term]:
                terms = field_terms.get(field_name)
                if terms is None:
                    terms = field_terms[field_name] = doc.terms(field_name)
                if term not in terms:
                    continue
                if pairs is not None:
                    if type(pairs) is tuple:
                        for partner, slots in zip(*pairs, strict=True):
                            if partner in terms:
                                posted.update(slots)
                    else:
                        _partners_present(pairs, terms, posted)
                if mixed is None:
                    continue
                if type(mixed) is tuple:
                    for (atom_id, atom), slots in zip(*mixed, strict=True):
                        holds = held.get(atom_id)
                        if holds is None:
                            holds = held[atom_id] = _atom_holds(doc, atom)
                        if holds:
                            posted.update(slots)
                else:
                    if every is None:
                        every = self.hits(doc)
                    _partners_present(mixed, every, posted)


class IndexedPresearcher(Presearcher):
    """Indexes query requirements: terms, substring literals, intervals and field presence.

    Parameters
    ----------
    selectivity
        Estimates used to choose the clause each query is posted under; pass a
        :class:`Selectivity` with term frequencies from a sample of the stream for the best
        anchors.
    """

    name = "indexed"

    def __init__(self, selectivity: Selectivity | None = None) -> None:
        self.selectivity = selectivity or DEFAULT_SELECTIVITY

    def requirement(self, query: CompiledQuery) -> Requirement:
        return extract(query, self.selectivity)

    def new_segment(self) -> Segment:
        return IndexedSegment(self.selectivity)
