"""The indexed prefilter: queries posted under the rarest atoms of their requirements (exact
terms in dicts, prefixes, wildcards and regexes by the terms that pass them, numeric and time
intervals in sorted arrays), so that a document proposes only the queries whose requirement it
holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from percolator.columnar import ColumnarPostings
from percolator.document import AnalyzedDocument
from percolator.errors import ConfigurationError
from percolator.evaluate import CompiledQuery
from percolator.extract import DEFAULT_SELECTIVITY, Atom, Requirement, Selectivity, extract
from percolator.intervals import IntervalTable, value_hits
from percolator.layout_trial import FLAT, LayoutTrial
from percolator.pattern_table import PATTERN_ATOMS, PATTERN_ID_MASK, PatternTable
from percolator.presearcher import Presearcher, Segment

__all__ = [
    "COLUMNAR_THRESHOLD",
    "MAX_PAIRS",
    "IndexedPresearcher",
    "IndexedSegment",
]

#: Segments sealed with at least this many queries also lay their postings out as flat arrays
#: (:class:`~percolator.columnar.ColumnarPostings`) and keep whichever layout selects faster on
#: the stream (:class:`~percolator.layout_trial.LayoutTrial`). Below it the Python postings
#: win on every mix of the benchmark (docs/benchmarks.md): flat arrays pay a fixed cost per
#: batch and per atom a document holds.
COLUMNAR_THRESHOLD = 200_000

#: A query is posted under atom pairs only when its two clauses give at most this many pairs.
MAX_PAIRS = 16


#: Distinct document terms a sealed segment remembers before it starts afresh.
_TERM_MEMORY = 1 << 17

#: Partner terms of a key up to this many are kept as a tuple of (term, slots) pairs once
#: sealed and probed one by one; more stay a dict, intersected with the document's terms in C
#: from the smaller side.
_SMALL_PARTNERS = 8

#: What a sealed segment knows of a term no query is posted under and no key pattern accepts.
_NOTHING: tuple[Any, ...] = ((), ())


class IndexedSegment(Segment):
    """Postings of queries under the most selective clauses of their requirement.

    A query with two or more clauses is posted under pairs of atoms, one from each of its two
    most selective clauses: the rarer atom is the *key*, the other its *partner*. So a
    document proposes it only when it holds both, and the queries it proposes follow the
    co-occurrence of their atoms rather than how many queries share a frequent one (as
    Elasticsearch's percolator requires a minimum number of clauses to match). A query with
    one clause, or clauses too wide to pair, is posted under each atom of its most selective
    clause alone. The clauses not posted under are checked for the queries posted, so a
    proposed query satisfies its whole requirement.

    Keys are terms wherever a clause offers one (patterns cost more to find). A document's
    term keys are found by one intersection in C of its distinct terms with the terms keyed;
    a key's partner terms by probing the document's terms of their field, from the smaller
    side. When some pattern is a key (a wildcard alone, say), the sealed segment instead keeps
    per document term, filled in the first time a document holds it, both the keys of the term
    and the key patterns it passes (see :class:`PatternTable`), so the intersection finds
    both. Intervals and field presence are found for the document up front; a partner or
    checked pattern is tested when a posted query needs it, mostly by one substring search.
    The number of queries enters the work per document only through the partners of the keys
    it holds. A segment sealed with at least ``columnar_threshold`` queries lays the same
    postings out as flat arrays too (:class:`~percolator.columnar.ColumnarPostings`) and, with
    ``choose_layout``, serves documents from both in turn until it keeps the faster (else the
    flat arrays alone).
    """

    def __init__(
        self,
        selectivity: Selectivity = DEFAULT_SELECTIVITY,
        columnar_threshold: int | None = None,
        choose_layout: bool = True,
    ) -> None:
        super().__init__()
        self._selectivity = selectivity
        self._columnar_threshold = columnar_threshold
        self._choose_layout = choose_layout
        # Sealed with at least columnar_threshold queries: the postings as flat arrays.
        self._columnar: ColumnarPostings | None = None
        # While both layouts are kept: which serves the next documents, and their times.
        self._trial: LayoutTrial | None = None
        self._atom_ids: dict[Atom, int] = {}
        # Non-pattern atom id -> the atom, to evaluate the terms left to check.
        self._atoms: list[Atom | None] = []
        self.patterns = PatternTable()
        self._intervals: dict[tuple[str, str], IntervalTable] = {}
        self._exists: dict[str, int] = {}
        self._always: list[int] = []
        # term -> field -> key postings of the term atom; other atom id -> its key postings.
        # Key postings: [field, slots posted under the atom alone, partner term of the field
        # -> slots, other field -> partner term -> slots, partner atom id (not a term) ->
        # slots]; once sealed, a tuple (see _sealed_key) and term -> tuple of them.
        self._term_keys: dict[str, Any] = {}
        self._atom_keys: dict[int, Any] = {}
        # The fields whose document terms are looked up: of term keys and of patterns.
        self._probe_fields: set[str] = set()
        # Sealed: field -> the partner terms of its keys with many partners.
        self.partnered: dict[str, frozenset[str]] = {}
        # slot -> the clauses its posting leaves to check, as tuples of atom ids
        self._checks: dict[int, tuple[tuple[int, ...], ...]] = {}
        # Sealed: term -> (its key postings, (field, atom id, ...) of the key pattern atoms it
        # passes), for the terms seen so far.
        self._known: dict[str, tuple[Any, ...]] = {}
        # The entries of _known other than _NOTHING.
        self._useful: dict[str, tuple[Any, ...]] = {}

    def _atom_id(self, atom: Atom) -> int:
        known = self._atom_ids.get(atom)
        if known is not None:
            return known
        kind = atom[0]
        if kind == "pattern":
            atom_id = self.patterns.atom(atom)
            self._probe_fields.add(atom[1])
        else:
            atom_id = len(self._atoms)
            self._atoms.append(atom)
        self._atom_ids[atom] = atom_id
        if kind in ("number", "time"):
            self._intervals.setdefault((kind, atom[1]), IntervalTable()).add(
                atom[2], atom[3], atom_id)
        elif kind == "exists":
            self._exists[atom[1]] = atom_id
        return atom_id

    def _key(self, atom: Atom) -> list[Any]:
        """The key postings of ``atom``, created empty."""
        if atom[0] == "term":
            by_field = self._term_keys.setdefault(atom[2], {})
            key = by_field.get(atom[1])
            if key is None:
                key = by_field[atom[1]] = [atom[1], [], {}, {}, {}]
                self._probe_fields.add(atom[1])
            return key
        atom_id = self._atom_id(atom)
        key = self._atom_keys.get(atom_id)
        if key is None:
            key = self._atom_keys[atom_id] = [None, [], {}, {}, {}]
        return key

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
        clauses = sorted(
            requirement.clauses, key=lambda c: (selectivity.clause_cost(c), len(c))
        )
        first = clauses[0]
        if len(clauses) >= 2 and len(first) * len(clauses[1]) <= MAX_PAIRS:
            rest = clauses[2:]
            atom_cost = selectivity.atom_cost
            for left in first:
                for right in clauses[1]:
                    # The rarer atom is the key, but a pattern only when both are: the keys
                    # a document holds are found first, and patterns cost more to find.
                    rare, other = (left, right) if (
                        (left[0] == "pattern", atom_cost(left))
                        <= (right[0] == "pattern", atom_cost(right))
                    ) else (right, left)
                    key = self._key(rare)
                    if other[0] != "term":
                        partners = key[4].setdefault(self._atom_id(other), [])
                    elif other[1] == key[0]:
                        partners = key[2].setdefault(other[2], [])
                    else:
                        partners = key[3].setdefault(other[1], {}).setdefault(other[2], [])
                    partners.append(slot)
        else:
            rest = clauses[1:]
            for atom in first:
                self._key(atom)[1].append(slot)
        if rest:
            self._checks[slot] = tuple(tuple(map(self._atom_id, c)) for c in rest)

    def seal(self) -> None:
        threshold = self._columnar_threshold
        if threshold is not None and self.size >= threshold:
            self._columnar = self._flat_postings()
            if not self._choose_layout:
                self._drop_postings()
                super().seal()
                return
            self._trial = LayoutTrial()
        self.patterns.seal(self._atom_keys)
        for table in self._intervals.values():
            table.seal()
        self._term_keys = {
            term: tuple(self._sealed_key(key) for key in by_field.values())
            for term, by_field in self._term_keys.items()
        }
        self._atom_keys = {
            atom_id: self._sealed_key(key) for atom_id, key in self._atom_keys.items()
        }
        partnered: dict[str, set[str]] = {}
        for keys in self._term_keys.values():
            for key in keys:
                if type(key[2]) is dict:
                    partnered.setdefault(key[0], set()).update(key[2])
        self.partnered = {name: frozenset(terms) for name, terms in partnered.items()}
        # Only term atoms are looked up by id once sealed (to check them); the ids of the
        # others are needed only to add queries, which a sealed segment no longer does.
        self._atoms = [atom if atom is not None and atom[0] == "term" else None
                       for atom in self._atoms]
        self._atom_ids = {}
        super().seal()

    @property
    def columnar(self) -> bool:
        return self._columnar is not None

    @property
    def on_trial(self) -> bool:
        return self._trial is not None

    @property
    def layout(self) -> str:
        """``postings`` (Python objects), ``flat`` (arrays), or ``trial`` while both are kept."""
        if self._trial is not None:
            return "trial"
        return "postings" if self._columnar is None else "flat"

    def _flat_postings(self) -> ColumnarPostings:
        """The segment's postings as :class:`ColumnarPostings`."""
        offsets = self.patterns.offsets
        fields = {offset: field_name for field_name, offset in offsets.items()}
        sources = {pattern_id: key for key, pattern_id in self.patterns.pattern_ids.items()}
        atoms = self._atoms

        def atom_of(atom_id: int) -> Atom:
            if atom_id >= PATTERN_ATOMS:
                field_name = fields[atom_id & ~PATTERN_ID_MASK]
                return ("pattern", field_name, *sources[atom_id & PATTERN_ID_MASK])
            atom = atoms[atom_id]
            assert atom is not None
            return atom

        def postings() -> Iterator[tuple[Atom, Atom | None, int]]:
            for term, by_field in self._term_keys.items():
                for field_name, key in by_field.items():
                    yield from _key_postings(("term", field_name, term), key, atom_of)
            for atom_id, key in self._atom_keys.items():
                yield from _key_postings(atom_of(atom_id), key, atom_of)

        checks = {
            slot: [[atom_of(atom_id) for atom_id in clause] for clause in clauses]
            for slot, clauses in self._checks.items()
        }
        return ColumnarPostings(postings(), checks)

    def _drop_postings(self) -> None:
        """Free the postings as Python objects: the flat arrays serve alone from now on."""
        self._term_keys = {}
        self._atom_keys = {}
        self._checks = {}
        self._atoms = []
        self._atom_ids = {}
        self._intervals = {}
        self._exists = {}
        self.patterns = PatternTable()
        self._known = {}
        self._useful = {}
        self.partnered = {}

    def _settle(self, winner: str) -> None:
        """End the trial keeping the ``winner`` layout, freeing the other."""
        self._trial = None
        if winner == FLAT:
            self._drop_postings()
        else:
            self._columnar = None

    def _learn(self, terms: Iterable[str]) -> None:
        """Fill in what the segment knows of terms first seen."""
        known = self._known
        useful = self._useful
        term_keys = self._term_keys
        passes = self.patterns.passes
        for term in terms:
            keys = term_keys.get(term, ())
            key_patterns = passes(term)
            if keys or key_patterns:
                known[term] = useful[term] = (keys, key_patterns)
            else:
                known[term] = _NOTHING

    def candidates_batch(self, docs: Sequence[AnalyzedDocument]) -> list[Iterable[int]]:
        if self._trial is not None:
            return self._on_trial(self._trial, docs)
        if self._columnar is None:
            return [self._posted(doc) for doc in docs]
        return self._flat(self._columnar, docs)

    def candidates(self, doc: AnalyzedDocument) -> Iterable[int]:
        if self._trial is not None:
            return self._on_trial(self._trial, (doc,))[0]
        if self._columnar is None:
            return self._posted(doc)
        return self._flat(self._columnar, (doc,))[0]

    def _on_trial(
        self, trial: LayoutTrial, docs: Sequence[AnalyzedDocument]
    ) -> list[Iterable[int]]:
        """Candidates from the layout whose turn it is, timed; the trial may end here."""
        layout = trial.next_layout()
        started = trial.clock()
        if layout == FLAT:
            assert self._columnar is not None
            found = self._flat(self._columnar, docs)
        else:
            found = [self._posted(doc) for doc in docs]
        trial.record(layout, len(docs), started, trial.clock())
        if trial.winner is not None:
            self._settle(trial.winner)
        return found

    def _flat(
        self, columnar: ColumnarPostings, docs: Sequence[AnalyzedDocument]
    ) -> list[Iterable[int]]:
        """Candidates from the flat arrays: a batch at once, or one document alone."""
        if len(docs) == 1:
            found = [columnar.candidates(docs[0])]
        else:
            found = columnar.candidates_batch(docs)
        if self._always:
            for slots in found:
                slots.extend(self._always)
        return list(found)

    def _posted(self, doc: AnalyzedDocument) -> list[int]:
        """Candidates from the postings as Python objects."""
        view = _DocumentView(doc, self)
        hits = view.hits
        value_hits(doc, self._intervals, self._exists, hits)
        # Each field's set of terms as it is, not their union: a document's text is not
        # copied into one more set (a term in two of them is looked up twice, to no effect).
        parts = doc.term_parts(self._probe_fields)
        held: list[tuple[str, Any]] = []
        if not self.sealed:
            self.patterns.hits(doc, hits)
            term_keys = self._term_keys
            held = [
                (term, term_keys[term].values())
                for part in parts for term in term_keys.keys() & part
            ]
        elif self.patterns.automaton is None:
            # No pattern is a key: the term keys are all there is to look up by term.
            term_keys = self._term_keys
            held = [(term, term_keys[term]) for part in parts for term in term_keys.keys() & part]
        elif parts:
            known = self._known
            unseen = [part for part in parts if not known.keys() >= part]
            if unseen:
                if len(known) + sum(map(len, unseen)) > _TERM_MEMORY:
                    # Start afresh, so what is remembered stays the stream's recent terms.
                    known.clear()
                    self._useful.clear()
                    for part in parts:
                        self._learn(part.difference(known))
                else:
                    # difference() with the dict walks the part; `part - known.keys()` would
                    # walk every remembered term.
                    for part in unseen:
                        self._learn(part.difference(known))
            # Only the terms that key something are walked: most of a document's do not.
            useful = self._useful
            for part in parts:
                for term in useful.keys() & part:
                    keys, key_patterns = useful[term]
                    if keys:
                        held.append((term, keys))
                    for index in range(0, len(key_patterns), 2):
                        if term in view.terms(key_patterns[index]):
                            hits.add(key_patterns[index + 1])
        # The fields' terms looked up once (view.terms), then read from its cache.
        field_terms = view.field_terms
        for term, keys in held:
            for key in keys:
                terms = field_terms.get(key[0]) or view.terms(key[0])
                if term in terms:
                    self._post(view, key, terms)
        if hits and self._atom_keys:
            atom_keys = self._atom_keys
            for atom_id in atom_keys.keys() & hits:
                self._post(view, atom_keys[atom_id], frozenset())
        found = list(self._always)
        checks = self._checks
        atoms = self._atoms
        for slot in view.posted:
            clauses = checks.get(slot)
            if clauses is not None:
                for clause in clauses:
                    for atom_id in clause:
                        if atom_id in hits:
                            break
                        if atom_id >= PATTERN_ATOMS:
                            if view.pattern_holds(atom_id):
                                break
                            continue
                        # Other atoms than terms and patterns are all among the hits.
                        atom = atoms[atom_id]
                        if atom is not None and atom[0] == "term" and atom[2] in view.terms(
                            atom[1]
                        ):
                            break
                    else:
                        break
                else:
                    found.append(slot)
                continue
            found.append(slot)
        return found

    def _sealed_key(self, key: list[Any]) -> tuple[Any, ...]:
        """Key postings as read once sealed, slots as tuples: ``(field, slots alone, partner
        terms of the field, {other field: {partner term: slots}}, ((partner atom id, slots,
        field, literal), ...))``. The field's few partner terms are a tuple of ``(term,
        slots)`` pairs, contiguous to scan, many a dict to intersect; a partner pattern that
        its only literal decides carries its field and that literal with spaces for frames
        (see :meth:`AnalyzedDocument.spaced_terms`), other partners None twice; empty parts
        are None."""
        field_name, alone, same, other_fields, others = key
        patterns = self.patterns
        described = []
        for atom_id, slots in others.items():
            literal = None
            if atom_id >= PATTERN_ATOMS:
                decisive = patterns.decisive[atom_id & PATTERN_ID_MASK]
                if isinstance(decisive, str):
                    literal = decisive
            where = patterns.field_of(atom_id) if literal is not None else None
            described.append((atom_id, tuple(slots), where, literal))
        return (
            field_name,
            tuple(alone) or None,
            (tuple((t, tuple(s)) for t, s in same.items()) if len(same) <= _SMALL_PARTNERS
             else {t: tuple(s) for t, s in same.items()}) or None,
            {
                partner_field: {t: tuple(s) for t, s in partners.items()}
                for partner_field, partners in other_fields.items()
            } or None,
            tuple(described) or None,
        )

    def _post(self, view: _DocumentView, key: Any, present: frozenset[str]) -> None:
        """Add to the view's posted queries those of a key the document holds whose partner
        it holds too; ``present`` are its terms in the key's field, where most partners are."""
        field_name, alone, same, other_fields, others = key
        posted = view.posted
        if alone:
            posted.update(alone)
        if same:
            if type(same) is dict:
                if self.sealed:
                    present = view.partnered(field_name, present)
                for term in _common(same, present):
                    posted.update(same[term])
            else:
                for term, slots in same:
                    if term in present:
                        posted.update(slots)
        if other_fields:
            for field_name, partners in other_fields.items():
                for term in _common(partners, view.terms(field_name)):
                    posted.update(partners[term])
        if not others:
            return
        hits = view.hits
        if type(others) is dict:
            # Open: every atom the document holds is among the hits.
            for atom_id in others.keys() & hits:
                posted.update(others[atom_id])
            return
        for atom_id, slots, field_name, literal in others:
            if atom_id in hits:
                posted.update(slots)
            elif literal is not None:
                # A pattern its only literal decides: one substring search.
                spaced = view.doc.spaced_terms(field_name)
                if spaced is not None:
                    if literal in spaced:
                        posted.update(slots)
                elif view.pattern_holds(atom_id):
                    posted.update(slots)
            elif atom_id >= PATTERN_ATOMS and view.pattern_holds(atom_id):
                posted.update(slots)


def _key_postings(
    atom: Atom, key: list[Any], atom_of: Callable[[int], Atom]
) -> Iterator[tuple[Atom, Atom | None, int]]:
    """The ``(key atom, partner atom, slot)`` postings of an open segment's key postings."""
    field_name, alone, same, other_fields, others = key
    for slot in alone:
        yield atom, None, slot
    for term, slots in same.items():
        partner = ("term", field_name, term)
        for slot in slots:
            yield atom, partner, slot
    for other_field, partners in other_fields.items():
        for term, slots in partners.items():
            partner = ("term", other_field, term)
            for slot in slots:
                yield atom, partner, slot
    for atom_id, slots in others.items():
        partner = atom_of(atom_id)
        for slot in slots:
            yield atom, partner, slot


def _common(mapping: dict[str, Any], terms: frozenset[str]) -> Iterable[str]:
    """The keys of ``mapping`` among ``terms``, probing from the smaller side (``keys() &
    frozenset`` alone always walks the frozenset)."""
    if len(mapping) < len(terms):
        return terms.intersection(mapping)
    return mapping.keys() & terms


class _DocumentView:
    """One document as one segment reads it: the atoms found up front (``hits``), the queries
    posted so far, and, looked up once each, its terms per field and the pattern atoms that
    are no key."""

    __slots__ = ("doc", "segment", "hits", "posted", "field_terms", "_partnered", "_tested")

    def __init__(self, doc: AnalyzedDocument, segment: IndexedSegment) -> None:
        self.doc = doc
        self.segment = segment
        self.hits: set[int] = set()
        self.posted: set[int] = set()
        #: The document's terms per field looked up so far (see :meth:`terms`).
        self.field_terms: dict[str, frozenset[str]] = {}
        self._partnered: dict[str, frozenset[str]] = {}
        self._tested: dict[int, bool] = {}

    def terms(self, field_name: str) -> frozenset[str]:
        """The document's terms in ``field_name``."""
        terms = self.field_terms.get(field_name)
        if terms is None:
            terms = self.field_terms[field_name] = self.doc.terms(field_name)
        return terms

    def partnered(self, field_name: str, present: frozenset[str]) -> frozenset[str]:
        """Of the terms ``present`` in ``field_name``, those some key of the field with many
        partners has among them: fewer probes of cold dicts as the segment grows."""
        terms = self._partnered.get(field_name)
        if terms is None:
            terms = self._partnered[field_name] = (
                self.segment.partnered.get(field_name, frozenset()) & present
            )
        return terms

    def pattern_holds(self, atom_id: int) -> bool:
        """Whether a pattern atom missing from the hits holds (only once sealed: while open
        every pattern atom that holds is among them)."""
        segment = self.segment
        if not segment.sealed:
            return False
        held = self._tested.get(atom_id)
        if held is None:
            held = self._tested[atom_id] = segment.patterns.holds(self.doc, atom_id)
        return held


class IndexedPresearcher(Presearcher):
    """Indexes query requirements: terms, term patterns, intervals and field presence.

    Parameters
    ----------
    selectivity
        Estimates used to choose the clauses each query is posted under; pass a
        :class:`Selectivity` with term frequencies from a sample of the stream for the best
        anchors.
    columnar_threshold
        Segments sealed with at least this many queries keep their postings as flat arrays
        (:class:`~percolator.columnar.ColumnarPostings`) besides the Python postings; None
        keeps every segment's postings as Python objects alone.
    choose_layout
        Whether such a segment times both layouts on its first documents
        (:class:`~percolator.layout_trial.LayoutTrial`) and keeps the faster; False keeps the
        flat arrays alone from the start.
    """

    name = "indexed"
    decides = True

    def __init__(
        self,
        selectivity: Selectivity | None = None,
        *,
        columnar_threshold: int | None = COLUMNAR_THRESHOLD,
        choose_layout: bool = True,
    ) -> None:
        if columnar_threshold is not None and columnar_threshold < 1:
            raise ConfigurationError(
                f"columnar_threshold must be at least 1 or None, not {columnar_threshold}"
            )
        self.selectivity = selectivity or DEFAULT_SELECTIVITY
        self.columnar_threshold = columnar_threshold
        self.choose_layout = choose_layout

    def requirement(self, query: CompiledQuery) -> Requirement:
        return extract(query, self.selectivity)

    def new_segment(self) -> Segment:
        return IndexedSegment(self.selectivity, self.columnar_threshold, self.choose_layout)
