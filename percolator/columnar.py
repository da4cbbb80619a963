"""Flat postings of a large sealed segment: candidate selection in a few array operations.

Kept as Python objects (dicts of keys, tuples of partner terms and of slots), the postings of a
segment of a million queries spread every key a document holds over a chain of objects across
gigabytes of heap, and candidate selection spends most of its time waiting for memory. Here
every atom of the segment has a dense id. A document is first turned into the ids of the atoms
it holds: its terms looked up per field (with the term patterns each term passes, remembered
per term), its values stabbed into interval tables, its fields' presence. The queries posted
under those atoms then come out of three contiguous arrays (each key's postings, each
posting's partner atom, each posting's query slot): a posting survives when the document holds
its partner too, and the clauses its posting leaves unchecked are tested on the survivors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from operator import itemgetter

import ahocorasick
import numpy as np

from percolator.document import AnalyzedDocument
from percolator.extract import Atom, term_filter
from percolator.intervals import IntervalTable, value_hits
from percolator.term_patterns import TERM_EDGE, TermPattern

__all__ = ["ColumnarPostings", "probe_automaton"]

#: Distinct terms per field whose pattern atoms are remembered beyond the terms of the segment's
#: own term atoms, before the memory starts afresh.
_TERM_MEMORY = 1 << 17

_NONE: tuple[int, ...] = ()

#: From this many atoms held by a document on, its postings are gathered in array operations
#: (a fixed cost of some microseconds) rather than one at a time (``few_hits`` of an instance).
FEW_HITS = 64


def probe_automaton(probes: Iterable[tuple[str, int]]) -> ahocorasick.Automaton:
    """An Aho-Corasick automaton of term-pattern probe literals, each found with the tuple of
    the indexes given for it; run it over a term framed by :data:`TERM_EDGE`."""
    by_probe: dict[str, list[int]] = {}
    for probe, index in probes:
        by_probe.setdefault(probe, []).append(index)
    automaton = ahocorasick.Automaton()
    for probe, indexes in by_probe.items():
        automaton.add_word(probe, tuple(indexes))
    automaton.make_automaton()
    return automaton


class _FieldAtoms:
    """The term and pattern atoms of one field: per term, the dense ids of the atoms it makes
    hold when a document has it in the field.

    The segment's own terms are known from the start; with pattern atoms, other terms are
    tested the first time a document holds them (an Aho-Corasick automaton of the patterns'
    longest literals finds the few worth testing) and remembered.
    """

    __slots__ = ("known", "base", "patterns", "automaton", "unprobed")

    def __init__(self) -> None:
        # term -> ids: the segment's own terms (base) and, with patterns, every term seen.
        self.known: dict[str, tuple[int, ...]] = {}
        self.base: dict[str, tuple[int, ...]] = {}
        # (test, dense id) of each pattern atom; the automaton maps probes to their indexes,
        # and patterns without a probe literal are tested on every term.
        self.patterns: list[tuple[TermPattern, int]] = []
        self.automaton: ahocorasick.Automaton | None = None
        self.unprobed: list[int] = []

    def seal(self) -> None:
        probes = []
        for index, (pattern, _) in enumerate(self.patterns):
            if pattern.probe is None:
                self.unprobed.append(index)
            else:
                probes.append((pattern.probe, index))
        if probes:
            self.automaton = probe_automaton(probes)
        self.base = {term: ids + self.passing(term) for term, ids in self.known.items()}
        self.known = dict(self.base)

    def passing(self, term: str) -> tuple[int, ...]:
        """Dense ids of the pattern atoms ``term`` passes."""
        if not self.patterns:
            return _NONE
        found: set[int] = set(self.unprobed)
        if self.automaton is not None:
            for _, indexes in self.automaton.iter(TERM_EDGE + term + TERM_EDGE):
                found.update(indexes)
        patterns = self.patterns
        return tuple(patterns[i][1] for i in sorted(found) if patterns[i][0].test(term))

    def learn(self, terms: frozenset[str], unseen: frozenset[str]) -> None:
        """Test the terms of a document first seen (``unseen`` of its ``terms``) against the
        pattern atoms and remember what each passes, also when that is nothing."""
        known = self.known
        if len(known) + len(unseen) - len(self.base) > _TERM_MEMORY:
            # Start afresh, so what is remembered stays the stream's recent terms.
            known = self.known = dict(self.base)
            unseen = frozenset(term for term in terms if term not in known)
        for term in unseen:
            known[term] = self.passing(term)

    def held(self, terms: frozenset[str], hits: set[int]) -> None:
        """Add to ``hits`` the atoms a document with ``terms`` in this field holds."""
        # Set operations and itemgetter run in C: no interpreted step per term.
        common = self.known.keys() & terms
        if self.patterns and len(common) < len(terms):
            self.learn(terms, terms - common)
            common = terms
        if len(common) > 1:
            hits.update(chain.from_iterable(itemgetter(*common)(self.known)))
        elif common:
            hits.update(self.known[next(iter(common))])


class ColumnarPostings:
    """The postings of a sealed segment as flat arrays over dense atom ids.

    Parameters
    ----------
    postings
        ``(key atom, partner atom or None, slot)``: the query in ``slot`` is proposed when a
        document holds the key atom and the partner atom (None: the key alone suffices).
    checks
        ``slot -> clauses``: each clause a sequence of atoms, one of which must hold as well.

    Examples
    --------
    >>> from percolator.analysis import Schema
    >>> postings = ColumnarPostings(
    ...     [(("term", "t", "acme"), ("term", "t", "news"), 7),
    ...      (("term", "t", "zeta"), None, 9)],
    ...     {9: [[("pattern", "t", "text", "prefix", "ship")]]})
    >>> schema = Schema.of({"t": "text"})
    >>> postings.candidates(AnalyzedDocument({"t": "ACME news: zeta shipped"}, schema))
    [7, 9]
    >>> postings.candidates(AnalyzedDocument({"t": "ACME zeta"}, schema))
    []
    """

    def __init__(
        self,
        postings: Iterable[tuple[Atom, Atom | None, int]],
        checks: Mapping[int, Sequence[Iterable[Atom]]],
    ) -> None:
        self._ids: dict[Atom, int] = {}
        self._fields: dict[str, _FieldAtoms] = {}
        self._intervals: dict[tuple[str, str], IntervalTable] = {}
        self._exists: dict[str, int] = {}
        keys: list[int] = []
        partners: list[int] = []
        slots: list[int] = []
        dense = self._dense
        for key, partner, slot in postings:
            keys.append(dense(key))
            partners.append(-1 if partner is None else dense(partner))
            slots.append(slot)
        self.checks = {
            slot: tuple(tuple(dense(atom) for atom in clause) for clause in clauses)
            for slot, clauses in checks.items()
        }
        self._checks_by_arrays(self.checks)
        count = len(self._ids)
        key_ids = np.asarray(keys, dtype=np.int64)
        order = np.argsort(key_ids, kind="stable")
        sorted_keys = key_ids[order]
        partner_ids = np.asarray(partners, dtype=np.int64)[order]
        # A posting without a partner points at an extra atom every document holds.
        partner_ids[partner_ids < 0] = count
        self._everyone = count
        self.few_hits = FEW_HITS
        self._partner_array = partner_ids
        self._slot_array = np.asarray(slots, dtype=np.int64)[order]
        self._slot_stride = int(self._slot_array.max()) + 1 if slots else 1
        self._start_array = np.searchsorted(sorted_keys, np.arange(count + 1)).astype(np.int64)
        # Views of the same arrays read an item at a time: they hand out plain ints cheaply.
        self._partners = memoryview(self._partner_array)
        self._slots = memoryview(self._slot_array)
        self._starts = memoryview(self._start_array)
        # Scratch marks of the atoms a document holds; the last one, every document's.
        self._held = np.zeros(count + 1, dtype=bool)
        self._held[count] = True
        for field_atoms in self._fields.values():
            field_atoms.seal()
        for table in self._intervals.values():
            table.seal()
        self._ids = {}

    def _dense(self, atom: Atom) -> int:
        atom_id = self._ids.get(atom)
        if atom_id is not None:
            return atom_id
        atom_id = self._ids[atom] = len(self._ids)
        kind, field_name = atom[0], atom[1]
        if kind == "term":
            known = self._fields.setdefault(field_name, _FieldAtoms()).known
            known[atom[2]] = known.get(atom[2], _NONE) + (atom_id,)
        elif kind == "pattern":
            field_atoms = self._fields.setdefault(field_name, _FieldAtoms())
            field_atoms.patterns.append((term_filter(*atom[2:]), atom_id))
        elif kind == "exists":
            self._exists[field_name] = atom_id
        else:
            self._intervals.setdefault((kind, field_name), IntervalTable()).add(
                atom[2], atom[3], atom_id)
        return atom_id

    def held(self, doc: AnalyzedDocument) -> set[int]:
        """Dense ids of the atoms ``doc`` holds."""
        hits: set[int] = set()
        for field_name, field_atoms in self._fields.items():
            terms = doc.terms(field_name)
            if terms:
                field_atoms.held(terms, hits)
        value_hits(doc, self._intervals, self._exists, hits)
        return hits

    def candidates(self, doc: AnalyzedDocument) -> list[int]:
        """Slots of the queries whose posting and checks ``doc`` satisfies, sorted, each once."""
        hits = self.held(doc)
        if len(hits) >= self.few_hits:
            posted = self._posted_by_arrays(hits)
        else:
            posted = self._posted_by_items(hits)
        checks = self.checks
        found: list[int] = []
        for slot in posted:
            clauses = checks.get(slot)
            if clauses is not None and not _all_hold(clauses, hits):
                continue
            found.append(slot)
        return found

    def candidates_batch(self, docs: Sequence[AnalyzedDocument]) -> list[list[int]]:
        """The :meth:`candidates` of each of ``docs``, found for all of them at once.

        Only finding the atoms each document holds is done a document at a time; the postings
        of all the documents are then gathered and their partners and checks tested in one
        run of array operations, whose fixed cost is shared by the batch.
        """
        if not docs:
            return []
        stride = self._everyone + 1
        # (document, atom) as one sorted code, for membership tests by binary search.
        held_codes = self._held_codes(docs, stride)
        atom_docs = held_codes // stride
        atom_ids = held_codes - atom_docs * stride
        posting_docs, positions = _runs(self._start_array, atom_ids, atom_docs)
        partners = self._partner_array[positions]
        alive = (partners == self._everyone) | _members(held_codes,
                                                         posting_docs * stride + partners)
        pairs = _unique(posting_docs[alive] * self._slot_stride
                        + self._slot_array[positions[alive]])
        if self.checks:
            pairs = pairs[self._checks_hold(pairs, held_codes, stride)]
        pair_docs = pairs // self._slot_stride
        bounds = np.searchsorted(pair_docs, np.arange(len(docs) + 1)).tolist()
        slots = (pairs % self._slot_stride).tolist()
        return [slots[bounds[i]:bounds[i + 1]] for i in range(len(docs))]

    def _held_codes(self, docs: Sequence[AnalyzedDocument], stride: int) -> np.ndarray:
        """``document index * stride + atom id`` of the atoms each of ``docs`` holds, sorted,
        each once."""
        held: list[int] = []
        counts: list[int] = []
        for doc in docs:
            hits = self.held(doc)
            held.extend(hits)
            counts.append(len(hits))
        atom_docs = np.repeat(np.arange(len(docs), dtype=np.int64), counts)
        codes = atom_docs * stride + np.asarray(held, dtype=np.int64)
        # Each document's atoms are distinct already: a plain sort keeps them unique.
        codes.sort()
        return codes

    def _checks_by_arrays(self, checks: Mapping[int, tuple[tuple[int, ...], ...]]) -> None:
        """The checks as arrays: the checked slots, sorted; per slot its clauses; per clause
        its atoms (each run given by start offsets)."""
        checked = sorted(checks)
        clause_starts = [0]
        atom_starts = [0]
        atoms: list[int] = []
        for slot in checked:
            for clause in checks[slot]:
                atoms.extend(clause)
                atom_starts.append(len(atoms))
            clause_starts.append(len(atom_starts) - 1)
        self._checked_slots = np.asarray(checked, dtype=np.int64)
        self._clause_starts = np.asarray(clause_starts, dtype=np.int64)
        self._atom_starts = np.asarray(atom_starts, dtype=np.int64)
        self._clause_atoms = np.asarray(atoms, dtype=np.int64)

    def _checks_hold(self, pairs: np.ndarray, held_codes: np.ndarray, stride: int) -> np.ndarray:
        """Whether each (document, slot) pair passes its slot's checks (true when it has none).
        """
        slots = pairs % self._slot_stride
        rows = np.searchsorted(self._checked_slots, slots)
        rows[rows == len(self._checked_slots)] = 0
        checked = np.flatnonzero(self._checked_slots[rows] == slots)
        passed = np.ones(len(pairs), dtype=bool)
        if not len(checked):
            return passed
        # Every clause of every checked pair, then every atom of those clauses.
        clause_pairs, clauses = _runs(self._clause_starts, rows[checked], checked)
        clause_ids = np.arange(len(clauses), dtype=np.int64)
        atom_clauses, atom_positions = _runs(self._atom_starts, clauses, clause_ids)
        atom_docs = pairs[clause_pairs[atom_clauses]] // self._slot_stride
        holds = _members(held_codes, atom_docs * stride + self._clause_atoms[atom_positions])
        clause_holds = np.bincount(atom_clauses[holds], minlength=len(clauses)) > 0
        failed = np.bincount(clause_pairs[~clause_holds], minlength=len(pairs)) > 0
        passed[failed] = False
        return passed

    def _posted_by_items(self, hits: set[int]) -> list[int]:
        """The slots posted under ``hits`` whose partner is among them, an item at a time."""
        starts, partners, slots = self._starts, self._partners, self._slots
        everyone = self._everyone
        posted: set[int] = set()
        for atom_id in hits:
            start = starts[atom_id]
            stop = starts[atom_id + 1]
            while start < stop:
                partner = partners[start]
                if partner == everyone or partner in hits:
                    posted.add(slots[start])
                start += 1
        return sorted(posted)

    def _posted_by_arrays(self, hits: set[int]) -> list[int]:
        """The same as :meth:`_posted_by_items` in array operations, for many hits."""
        held_ids = np.fromiter(hits, dtype=np.int64, count=len(hits))
        # Each held key's run of postings, laid end to end.
        _, positions = _runs(self._start_array, held_ids, held_ids)
        if not len(positions):
            return []
        held = self._held
        held[held_ids] = True
        try:
            survivors = positions[held[self._partner_array[positions]]]
        finally:
            held[held_ids] = False
        return _unique(self._slot_array[survivors]).tolist()


def _runs(
    starts: np.ndarray, rows: np.ndarray, owners: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The runs ``starts[row]:starts[row + 1]`` of ``rows`` laid end to end: for each position,
    the owner of its row and the position itself."""
    first = starts[rows]
    counts = starts[rows + 1] - first
    total = int(counts.sum())
    if not total:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    ends = np.cumsum(counts)
    positions = np.arange(total, dtype=np.int64) + np.repeat(first - ends + counts, counts)
    return np.repeat(owners, counts), positions


def _unique(values: np.ndarray) -> np.ndarray:
    """``values`` sorted, each once (``np.unique`` finds them by hashing first: slower)."""
    values = np.sort(values)
    if len(values) > 1:
        keep = np.empty(len(values), dtype=bool)
        keep[0] = True
        np.not_equal(values[1:], values[:-1], out=keep[1:])
        values = values[keep]
    return values


def _members(sorted_codes: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Whether each of ``codes`` is in ``sorted_codes`` (sorted ascending)."""
    if not len(sorted_codes):
        return np.zeros(len(codes), dtype=bool)
    found = np.searchsorted(sorted_codes, codes)
    found[found == len(sorted_codes)] = 0
    return sorted_codes[found] == codes


def _all_hold(clauses: tuple[tuple[int, ...], ...], hits: set[int]) -> bool:
    for clause in clauses:
        for atom_id in clause:
            if atom_id in hits:
                break
        else:
            return False
    return True

