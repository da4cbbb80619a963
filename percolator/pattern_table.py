"""The pattern atoms of an indexed segment (some term of a field passes a prefix, wildcard or
regex): their ids, and how a document is found to hold them, term by term or by one substring
search.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ahocorasick

from percolator.columnar import probe_automaton
from percolator.document import AnalyzedDocument
from percolator.extract import Atom, term_filter
from percolator.term_patterns import TERM_EDGE, TermPattern, wildcard_segments

__all__ = [
    "PATTERN_ATOMS",
    "PATTERN_ID_BITS",
    "PATTERN_ID_MASK",
    "PatternTable",
    "decisive_literal",
]

#: Pattern atom ids are the pattern id plus a multiple of this power of two per field, above
#: the ids of the other atoms of a segment, which count from 0.
PATTERN_ID_BITS = 40
PATTERN_ATOMS = 1 << PATTERN_ID_BITS
PATTERN_ID_MASK = PATTERN_ATOMS - 1


class PatternTable:
    """The pattern atoms of a segment: some term of a field passes a term pattern.

    A pattern is a ``(kind, form, source)`` with its :func:`term_filter`; its atom id is the
    pattern id plus an offset per field, so the field and the pattern of an atom id are a
    shift and a mask away. While the segment is open every pattern is tested against its
    field directly. Once sealed, the patterns whose atoms are keys are found term by term
    (:meth:`passes`: the framed term is scanned with an Aho-Corasick automaton of their
    longest literals and only the patterns found are tested; the segment remembers the
    answer per term), and the others are tested when a query posted under a key the
    document holds needs them (:meth:`holds`).
    """

    __slots__ = (
        "offsets", "pattern_ids", "filters", "patterns", "automaton", "keys", "field_names",
        "decisive",
    )

    def __init__(self) -> None:
        # field -> offset of its pattern atom ids; (kind, form, source) -> pattern id.
        self.offsets: dict[str, int] = {}
        self.pattern_ids: dict[tuple[str, str, str], int] = {}
        self.filters: list[TermPattern] = []
        # While open: field -> pattern ids of its atoms.
        self.patterns: dict[str, set[int]] = {}
        # Sealed: the automaton of the key patterns' longest literals (values: pattern ids);
        # key pattern id -> the fields where its atom is a key; offset >> PATTERN_ID_BITS ->
        # field. Pattern id -> its literal when a term holds its only literal exactly when it
        # passes, with spaces for frames (None if the literal holds a space), else False.
        self.automaton: ahocorasick.Automaton | None = None
        self.keys: dict[int, tuple[str, ...]] = {}
        self.field_names: list[str] = []
        self.decisive: list[str | bool | None] = []

    def atom(self, atom: Atom) -> int:
        """Register a pattern atom; returns its atom id."""
        key = atom[2:]
        pattern_id = self.pattern_ids.get(key)
        if pattern_id is None:
            pattern_id = self.pattern_ids[key] = len(self.filters)
            self.filters.append(term_filter(*key))
            self.decisive.append(decisive_literal(*key))
        offset = self.offsets.get(atom[1])
        if offset is None:
            offset = self.offsets[atom[1]] = (len(self.offsets) + 1) << PATTERN_ID_BITS
        self.patterns.setdefault(atom[1], set()).add(pattern_id)
        return offset + pattern_id

    def field_of(self, atom_id: int) -> str:
        """The field of a pattern atom."""
        return self.field_names[atom_id >> PATTERN_ID_BITS]

    def hits(self, doc: AnalyzedDocument, hits: set[int]) -> None:
        """Add to ``hits`` every pattern atom ``doc`` satisfies, testing each (while open)."""
        filters = self.filters
        for field_name, pattern_ids in self.patterns.items():
            if doc.has(field_name):
                offset = self.offsets[field_name]
                for pattern_id in pattern_ids:
                    if filters[pattern_id].holds_in(doc, field_name):
                        hits.add(offset + pattern_id)

    def seal(self, keys: Iterable[int]) -> None:
        """Build the read structures; ``keys`` are the atom ids queries are posted under."""
        self.field_names = [""] * (len(self.offsets) + 1)
        for field_name, offset in self.offsets.items():
            self.field_names[offset >> PATTERN_ID_BITS] = field_name
        located: dict[int, list[str]] = {}
        for atom_id in keys:
            if atom_id >= PATTERN_ATOMS:
                located.setdefault(atom_id & PATTERN_ID_MASK, []).append(self.field_of(atom_id))
        self.keys = {pattern_id: tuple(fields) for pattern_id, fields in located.items()}
        if self.keys:
            self.automaton = probe_automaton(
                (self.filters[pattern_id].probe, pattern_id) for pattern_id in self.keys
            )
        self.patterns = {}
        self.pattern_ids = {}

    def passes(self, term: str) -> tuple[Any, ...]:
        """``(field, atom id, field, atom id, ...)`` of the key pattern atoms ``term`` passes
        (for the fields of those atoms that hold it)."""
        if self.automaton is None:
            return ()
        filters = self.filters
        found: set[int] = set()
        for _, pattern_ids in self.automaton.iter(TERM_EDGE + term + TERM_EDGE):
            for pattern_id in pattern_ids:
                if pattern_id not in found and filters[pattern_id].test(term):
                    found.add(pattern_id)
        keys = self.keys
        offsets = self.offsets
        return tuple(
            item
            for pattern_id in found
            for field_name in keys[pattern_id]
            for item in (field_name, offsets[field_name] + pattern_id)
        )

    def holds(self, doc: AnalyzedDocument, atom_id: int) -> bool:
        """Whether the pattern atom ``atom_id`` holds.

        When the pattern's only literal decides it (a prefix, a suffix, an infix) that is one
        substring search in the field's terms; otherwise the terms holding its longest
        literal are tested.
        """
        field_name = self.field_names[atom_id >> PATTERN_ID_BITS]
        if not doc.has(field_name):
            return False
        pattern_id = atom_id & PATTERN_ID_MASK
        pattern = self.filters[pattern_id]
        decisive = self.decisive[pattern_id]
        if decisive is not False:
            if decisive is not None:
                spaced = doc.spaced_terms(field_name)
                if spaced is not None:
                    return decisive in spaced
            if doc.frameable(field_name):
                return pattern.probe in doc.joined_terms(field_name)  # type: ignore[operator]
        return pattern.holds_in(doc, field_name)


def decisive_literal(kind: str, form: str, source: str) -> str | bool | None:
    """The only literal of a pattern, spaces for its frames, when a field's framed terms hold
    it exactly when one of them passes the pattern (a prefix, or a wildcard of one literal and
    ``*`` only); None for such a literal holding a space; False for other patterns."""
    literals = term_filter(kind, form, source).literals
    if len(literals) != 1 or form == "regex":
        return False
    if form == "wildcard":
        items = [k for k, _ in wildcard_segments(source)]
        if items.count("literal") != 1 or "one" in items:
            return False
    literal = literals[0]
    if " " in literal or TERM_EDGE in literal[1:-1]:
        return None
    return literal.replace(TERM_EDGE, " ")

