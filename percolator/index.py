"""The live index of standing queries: add, replace and delete while documents flow.

Queries live in log-structured segments. New queries go to a small open *delta* segment
(dict postings, a linear substring scan); when it fills it is sealed (automata built over its
few queries only) and merged with neighbours of similar size, so each query is re-indexed
O(log n) times over its life and no change costs a rebuild of the whole index. Deletes and
replacements leave tombstones that merges purge. Every query gets a fresh *slot* number; a
segment always holds a contiguous range of slots, which is how a slot finds its segment.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from percolator.analysis import DEFAULT_SCHEMA, Schema
from percolator.document import AnalyzedDocument
from percolator.errors import (
    ConfigurationError,
    DuplicateQueryError,
    InvalidQueryError,
    UnknownQueryError,
)
from percolator.evaluate import CompiledQuery, compile_query
from percolator.extract import Requirement
from percolator.indexed_presearcher import IndexedPresearcher
from percolator.presearcher import Presearcher, Segment
from query_lang.ast import SearchNode

__all__ = ["IndexStats", "QueryIndex", "RegisteredQuery"]


@dataclass(frozen=True, slots=True)
class RegisteredQuery:
    """A standing query as stored: its name, source, compiled form, streams and requirement.

    ``streams`` empty means the query applies to documents of every stream. ``decided``: the
    presearcher proposes the query only for documents it matches (an exact requirement, every
    clause of which the presearcher checks), so the evaluator need not confirm it.
    ``highlights``: the query asks for the offsets of its matched terms in every match, also
    in runs that do not ask for them (see :meth:`Percolator.match_batch`).
    """

    name: str
    query: SearchNode
    compiled: CompiledQuery
    streams: tuple[str, ...]
    requirement: Requirement
    slot: int
    decided: bool = False
    highlights: bool = False

    def applies_to(self, stream: str | None) -> bool:
        """Whether documents of ``stream`` (None: unknown stream) are matched by this query."""
        return not self.streams or stream is None or stream in self.streams


@dataclass(frozen=True)
class IndexStats:
    """Shape of the index: live queries, segments, tombstones and the always-run bucket.

    ``columnar`` counts the sealed segments whose postings are flat arrays (see
    :class:`~percolator.columnar.ColumnarPostings`); ``trials`` those still timing both
    layouts on the stream (see :class:`~percolator.layout_trial.LayoutTrial`), which count
    as flat until they choose.
    """

    queries: int
    segments: int
    delta: int
    tombstones: int
    always_run: int
    columnar: int = 0
    trials: int = 0


class _SealedSegment:
    __slots__ = ("segment", "first", "last", "dead")

    def __init__(self, segment: Segment, first: int, last: int) -> None:
        self.segment = segment
        self.first = first
        self.last = last
        self.dead = 0

    @property
    def live(self) -> int:
        return self.segment.size - self.dead


class QueryIndex:
    """Standing queries by name, indexed for candidate selection, changeable at any time.

    Parameters
    ----------
    schema
        Field types of the documents; queries are compiled against it.
    presearcher
        The prefilter strategy; :class:`IndexedPresearcher` by default.
    delta_capacity
        Queries the open delta segment holds before it is sealed.
    merge_factor
        A sealed segment is merged into its older neighbour while that neighbour holds at
        most this many times its live queries; larger means fewer merges, more segments.

    Examples
    --------
    >>> from query_lang.ast import SearchTerm
    >>> index = QueryIndex(Schema.of({"title": "text"}))
    >>> index.add("acme", SearchTerm("title", "acme")).slot
    0
    >>> doc = AnalyzedDocument({"title": "ACME news"}, index.schema)
    >>> [q.name for q in index.candidates(doc)]
    ['acme']
    """

    def __init__(
        self,
        schema: Schema | None = None,
        presearcher: Presearcher | None = None,
        *,
        delta_capacity: int = 256,
        merge_factor: int = 4,
    ) -> None:
        if delta_capacity < 1:
            raise ConfigurationError(f"delta_capacity must be at least 1, not {delta_capacity}")
        if merge_factor < 1:
            raise ConfigurationError(f"merge_factor must be at least 1, not {merge_factor}")
        self.schema = schema or DEFAULT_SCHEMA
        self.presearcher = presearcher or IndexedPresearcher()
        self.delta_capacity = delta_capacity
        self.merge_factor = merge_factor
        self._entries: dict[int, RegisteredQuery] = {}
        self._by_name: dict[str, int] = {}
        self._sealed: list[_SealedSegment] = []
        self._firsts: list[int] = []
        self._next_slot = 0
        self._delta = self.presearcher.new_segment()
        self._delta_first = 0
        self._delta_dead = 0
        self._always_live = 0
        self.merges = 0

    # ------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[RegisteredQuery]:
        return iter(list(self._entries.values()))

    def get(self, name: str) -> RegisteredQuery:
        """The registered query called ``name``; raises :class:`UnknownQueryError`."""
        slot = self._by_name.get(name)
        if slot is None:
            raise UnknownQueryError(f"no standing query named {name!r}")
        return self._entries[slot]

    def stats(self) -> IndexStats:
        """Current shape of the index."""
        dead = sum(s.dead for s in self._sealed) + self._delta_dead
        return IndexStats(
            len(self._entries), len(self._sealed), self._delta.size, dead, self._always_live,
            sum(s.segment.columnar for s in self._sealed),
            sum(s.segment.on_trial for s in self._sealed),
        )

    def always_run(self) -> int:
        """Live queries that are verified for every document (nothing required of them)."""
        return self._always_live

    def candidates(self, doc: AnalyzedDocument) -> list[RegisteredQuery]:
        """Live queries that could match ``doc``, in slot order."""
        return self.candidates_batch((doc,))[0]

    def candidates_batch(self, docs: Sequence[AnalyzedDocument]) -> list[list[RegisteredQuery]]:
        """The :meth:`candidates` of each of ``docs``; segments with flat postings find those
        of the whole batch at once."""
        per_doc: list[list[int]] = [[] for _ in docs]
        for sealed in self._sealed:
            for slots, found in zip(per_doc, sealed.segment.candidates_batch(docs), strict=True):
                slots.extend(found)
        if self._delta.size:
            for slots, doc in zip(per_doc, docs, strict=True):
                slots.extend(self._delta.candidates(doc))
        entry = self._entries.get
        out: list[list[RegisteredQuery]] = []
        for slots in per_doc:
            slots.sort()
            # Tombstoned slots are no longer in the entries.
            out.append([e for e in map(entry, slots) if e is not None])
        return out

    # ------------------------------------------------------------ changing

    def _register(
        self, name: str, query: SearchNode | CompiledQuery, streams: Iterable[str],
        highlights: bool = False,
    ) -> RegisteredQuery:
        if not isinstance(name, str) or not name:
            raise InvalidQueryError(f"a query name must be a non-empty string, not {name!r}")
        try:
            compiled = (
                query if isinstance(query, CompiledQuery) else compile_query(query, self.schema)
            )
            requirement = self.presearcher.requirement(compiled)
        except InvalidQueryError as exc:
            raise InvalidQueryError(str(exc), query=name) from None
        entry = RegisteredQuery(
            name, compiled.source, compiled, tuple(streams), requirement, self._next_slot,
            self.presearcher.decides and requirement.exact, highlights,
        )
        self._next_slot += 1
        return entry

    def add(
        self, name: str, query: SearchNode | CompiledQuery, streams: Iterable[str] = (),
        *, highlights: bool = False,
    ) -> RegisteredQuery:
        """Register a new standing query; raises :class:`DuplicateQueryError` if ``name`` exists.
        ``highlights``: its matches always carry highlights."""
        if name in self._by_name:
            raise DuplicateQueryError(f"a standing query named {name!r} already exists")
        entry = self._register(name, query, streams, highlights)
        self._insert(entry)
        return entry

    def add_many(
        self, queries: Iterable[tuple[str, SearchNode | CompiledQuery, Iterable[str]]],
        *, highlights: bool = False,
    ) -> int:
        """Register many new queries at once into one freshly built segment; returns the count.

        Faster than :meth:`add` in a loop for an initial load. Nothing is registered if any
        query is invalid or duplicated. ``highlights`` as in :meth:`add`, for each of them.
        """
        batch: list[RegisteredQuery] = []
        names: set[str] = set()
        for name, query, streams in queries:
            if name in self._by_name or name in names:
                raise DuplicateQueryError(f"a standing query named {name!r} already exists")
            names.add(name)
            batch.append(self._register(name, query, streams, highlights))
        if not batch:
            return 0
        self._seal_delta()
        segment = self.presearcher.new_segment()
        for entry in batch:
            segment.add(entry.slot, entry.requirement)
            self._entries[entry.slot] = entry
            self._by_name[entry.name] = entry.slot
            self._always_live += entry.requirement.always
        segment.seal()
        self._append_sealed(_SealedSegment(segment, batch[0].slot, batch[-1].slot))
        self._delta_first = self._next_slot
        self._compact_tail()
        return len(batch)

    def replace(
        self, name: str, query: SearchNode | CompiledQuery, streams: Iterable[str] = (),
        *, highlights: bool = False,
    ) -> RegisteredQuery:
        """Replace the query called ``name``; raises :class:`UnknownQueryError` if absent."""
        if name not in self._by_name:
            raise UnknownQueryError(f"no standing query named {name!r} to replace")
        entry = self._register(name, query, streams, highlights)
        self._remove(name)
        self._insert(entry)
        return entry

    def delete(self, name: str) -> None:
        """Remove the query called ``name``; raises :class:`UnknownQueryError` if absent."""
        if name not in self._by_name:
            raise UnknownQueryError(f"no standing query named {name!r} to delete")
        self._remove(name)

    def merge(self) -> None:
        """Merge every segment and the delta into one sealed segment, purging tombstones."""
        self._seal_delta()
        if len(self._sealed) > 1 or any(s.dead for s in self._sealed):
            merged = self._merge_range(0, len(self._sealed))
            self._sealed = [merged] if merged.segment.size else []
            self._firsts = [s.first for s in self._sealed]

    # ------------------------------------------------------------ internals

    def _insert(self, entry: RegisteredQuery) -> None:
        self._entries[entry.slot] = entry
        self._by_name[entry.name] = entry.slot
        self._always_live += entry.requirement.always
        self._delta.add(entry.slot, entry.requirement)
        if self._delta.size >= self.delta_capacity:
            self._seal_delta()
            self._compact_tail()

    def _remove(self, name: str) -> None:
        slot = self._by_name.pop(name)
        self._always_live -= self._entries.pop(slot).requirement.always
        if slot >= self._delta_first:
            self._delta_dead += 1
            return
        position = bisect_right(self._firsts, slot) - 1
        sealed = self._sealed[position]
        sealed.dead += 1
        if sealed.dead * 2 > sealed.segment.size:
            # Mostly tombstones: rebuild it alone so dead queries stop costing lookups.
            self._sealed[position] = self._merge_range(position, position + 1)
            self._drop_empty()

    def _seal_delta(self) -> None:
        delta = self._delta
        if delta.size:
            if self._delta_dead == delta.size:
                pass
            elif self._delta_dead:
                self._append_sealed(self._rebuild(self._delta_first, self._next_slot - 1))
            else:
                delta.seal()
                self._append_sealed(
                    _SealedSegment(delta, self._delta_first, self._next_slot - 1)
                )
        self._delta = self.presearcher.new_segment()
        self._delta_first = self._next_slot
        self._delta_dead = 0

    def _append_sealed(self, sealed: _SealedSegment) -> None:
        self._sealed.append(sealed)
        self._firsts.append(sealed.first)

    def _compact_tail(self) -> None:
        sealed = self._sealed
        while len(sealed) >= 2 and sealed[-2].live <= self.merge_factor * sealed[-1].live:
            sealed[-2:] = [self._merge_range(len(sealed) - 2, len(sealed))]
        self._drop_empty()

    def _drop_empty(self) -> None:
        self._sealed = [s for s in self._sealed if s.live > 0]
        self._firsts = [s.first for s in self._sealed]

    def _merge_range(self, start: int, stop: int) -> _SealedSegment:
        first, last = self._sealed[start].first, self._sealed[stop - 1].last
        self.merges += 1
        return self._rebuild(first, last)

    def _rebuild(self, first: int, last: int) -> _SealedSegment:
        segment = self.presearcher.new_segment()
        entries = self._entries
        if last - first + 1 <= 2 * len(entries):
            slots: Iterable[int] = range(first, last + 1)
        else:
            slots = sorted(s for s in entries if first <= s <= last)
        for slot in slots:
            entry = entries.get(slot)
            if entry is not None:
                segment.add(slot, entry.requirement)
        segment.seal()
        return _SealedSegment(segment, first, last)
