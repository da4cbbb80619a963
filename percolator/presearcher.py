"""Prefilter strategies: given a document, which standing queries could match it.

A :class:`Presearcher` turns compiled queries into requirements and builds index segments over
them; a segment answers a document with candidate query slots, which the evaluator verifies.
:class:`NoFilterPresearcher` proposes every query (the baseline every other strategy must agree
with); :class:`~percolator.indexed_presearcher.IndexedPresearcher` indexes the requirements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from percolator.document import AnalyzedDocument
from percolator.errors import ConfigurationError
from percolator.evaluate import CompiledQuery
from percolator.extract import TRUE, Requirement

__all__ = [
    "NoFilterPresearcher",
    "NoFilterSegment",
    "Presearcher",
    "Segment",
]


class Segment(ABC):
    """A set of query slots with a structure that proposes candidates for a document.

    A segment is *open* while queries are added (the live delta) and *sealed* once built;
    sealing may build structures that do not support cheap insertion.
    """

    def __init__(self) -> None:
        self.size = 0
        self.always_run = 0
        self.sealed = False

    @property
    def columnar(self) -> bool:
        """Whether this segment's postings are flat arrays."""
        return False

    @property
    def on_trial(self) -> bool:
        """Whether this segment still times two layouts of its postings to keep the faster."""
        return False

    @abstractmethod
    def add(self, slot: int, requirement: Requirement) -> None:
        """Add the query in ``slot`` with its requirement; only while the segment is open."""

    def seal(self) -> None:
        """Build the read-optimised structures; no query can be added afterwards."""
        self.sealed = True

    @abstractmethod
    def candidates(self, doc: AnalyzedDocument) -> Iterable[int]:
        """Slots of the queries in this segment that could match ``doc`` (each once)."""

    def candidates_batch(self, docs: Sequence[AnalyzedDocument]) -> list[Iterable[int]]:
        """The :meth:`candidates` of each of ``docs``; a segment may find them all at once."""
        return [self.candidates(doc) for doc in docs]

    def _check_open(self) -> None:
        if self.sealed:
            raise ConfigurationError("cannot add a query to a sealed segment")


class Presearcher(ABC):
    """A prefilter strategy: how queries are reduced to requirements and indexed.

    ``decides`` says whether its segments propose a query only when its whole requirement
    holds, so that a query whose requirement is exact needs no verification.
    """

    name = "presearcher"
    decides = False

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
