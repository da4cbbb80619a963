"""The percolator: matches each incoming document against every standing query, returning one
:class:`QueryMatch` per (document, query), with highlights where a run or the query asks for
them, plus per-batch prefilter statistics.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import xxhash

from percolator.analysis import Schema
from percolator.collector import collector_paused
from percolator.document import AnalyzedDocument
from percolator.errors import InvalidDocumentError
from percolator.evaluate import CompiledQuery, Highlights
from percolator.index import IndexStats, QueryIndex, RegisteredQuery
from percolator.presearcher import Presearcher
from query_lang.ast import QueryDecl, SearchNode

__all__ = ["BatchResult", "BatchStats", "Percolator", "QueryMatch", "match_id"]

_by_name = attrgetter("name")

#: Documents whose candidates :meth:`Percolator.match_batch` selects together. Enough to share
#: the fixed cost of the array operations of flat segments; few enough that a document's
#: analysis is still in the CPU caches when it is verified (at 256, 10k needle queries ran
#: 20% slower).
SELECTION_BATCH = 32

# What an exhausted ``document_ids`` gives (None is an id left out: the position stands in).
_NO_ID = object()


def match_id(name: str, document_id: str) -> str:
    """Deterministic id of the match of query ``name`` on document ``document_id``.

    The hex xxh3-128 digest (seed 0) of ``"query\\x00" + name + "\\x00" + document_id`` in
    UTF-8 (a lone surrogate, which JSON's ``\\ud800`` escapes can make, encoded as is): the
    same pair always yields the same id, in every process, so replays deduplicate.

    Examples
    --------
    >>> match_id("acme_news", "d1") == match_id("acme_news", "d1")
    True
    >>> len(match_id("acme_news", "d1"))
    32
    """
    data = f"query\x00{name}\x00{document_id}".encode("utf-8", "surrogatepass")
    return xxhash.xxh3_128_hexdigest(data, seed=0)


@dataclass(frozen=True, slots=True)
class QueryMatch:
    """One standing query matching one document, with the offsets of the matched terms when
    they were asked for (``highlights`` None otherwise)."""

    name: str
    document_id: str
    highlights: Highlights | None
    match_id: str

    def to_dict(self) -> dict[str, Any]:
        """The match as the engine's output object (``kind`` is always ``"query"``); the
        ``highlights`` field only when they were asked for."""
        out: dict[str, Any] = {
            "kind": "query",
            "name": self.name,
            "document_id": self.document_id,
            "match_id": self.match_id,
        }
        if self.highlights is not None:
            out["highlights"] = {
                f: [list(s) for s in spans] for f, spans in self.highlights.items()
            }
        return out

    def to_json(self) -> str:
        """The match as one compact JSON object, as written one per line to outputs.

        Examples
        --------
        >>> QueryMatch("acme_news", "d1", {"title": [[0, 4]]}, "ab").to_json()
        '{"kind":"query","name":"acme_news","document_id":"d1","match_id":"ab",\
"highlights":{"title":[[0,4]]}}'
        >>> QueryMatch("acme_news", "d1", None, "ab").to_json()
        '{"kind":"query","name":"acme_news","document_id":"d1","match_id":"ab"}'
        """
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


# A frozen dataclass's __init__ sets each field through object.__setattr__ (~1.2 µs a match);
# matches found in a batch, hundreds per document on broad queries, set the slots directly.
_new_object = object.__new__
_set_name = QueryMatch.name.__set__  # type: ignore[attr-defined]
_set_document_id = QueryMatch.document_id.__set__  # type: ignore[attr-defined]
_set_highlights = QueryMatch.highlights.__set__  # type: ignore[attr-defined]
_set_match_id = QueryMatch.match_id.__set__  # type: ignore[attr-defined]


def _query_match(
    name: str, document_id: str, highlights: Highlights | None, match_id: str
) -> QueryMatch:
    """``QueryMatch(name, document_id, highlights, match_id)``, built at a third of the cost.

    Examples
    --------
    >>> _query_match("q", "d", None, "id") == QueryMatch("q", "d", None, "id")
    True
    """
    found = _new_object(QueryMatch)
    _set_name(found, name)
    _set_document_id(found, document_id)
    _set_highlights(found, highlights)
    _set_match_id(found, match_id)
    return found


@dataclass(frozen=True)
class BatchStats:
    """What the prefilter saved on a batch.

    ``candidates_per_doc`` counts the queries proposed (and so verified) for each document;
    ``verified`` their total, ``matched`` the matches, ``always_run`` the queries in the
    always-run bucket (verified for every document whatever it contains). ``decided`` counts
    the proposed queries the index decided on its own (an exact requirement, see
    :class:`~percolator.extract.Requirement`): they match without running the evaluator.
    """

    documents: int
    candidates_per_doc: tuple[int, ...]
    verified: int
    matched: int
    always_run: int
    decided: int = 0

    @property
    def mean_candidates(self) -> float:
        """Average number of queries verified per document."""
        return self.verified / self.documents if self.documents else 0.0


@dataclass(frozen=True)
class BatchResult:
    """The matches of each document of a batch, in input order, and the batch statistics."""

    matches: tuple[tuple[QueryMatch, ...], ...]
    stats: BatchStats


class Percolator:
    """Standing search queries matched against a stream of documents.

    Parameters
    ----------
    schema
        Field types of the documents (see :class:`~percolator.analysis.Schema`).
    presearcher
        Prefilter strategy; indexed by default, :class:`NoFilterPresearcher` for the baseline.
    id_field
        Field holding a document's id.
    delta_capacity, merge_factor
        Tuning of the live index (see :class:`~percolator.index.QueryIndex`).
    highlights
        Whether runs that do not say (``match``, ``match_batch``) compute the highlights of
        every match. Off by default, as in Elasticsearch and Lucene Monitor: they cost about
        as much as verifying a match, and a query registered with ``highlights=True`` gets
        them in every run anyway.

    Examples
    --------
    >>> from query_lang.ast import SearchAnd, SearchNot, SearchPrefix, SearchTerm
    >>> percolator = Percolator(Schema.of({"title": "text", "source": "string"}))
    >>> _ = percolator.add("acme_news", SearchAnd((SearchTerm("title", "acme"),
    ...     SearchPrefix("title", "layoff"), SearchNot(SearchTerm("source", "tabloid")))))
    >>> doc = {"id": "d1", "title": "ACME layoffs", "source": "wire"}
    >>> [m.name for m in percolator.match(doc)], percolator.match(doc)[0].highlights
    (['acme_news'], None)
    >>> [m.to_dict()["highlights"] for m in percolator.match(doc, highlights=True)]
    [{'title': [[0, 4], [5, 12]]}]
    """

    def __init__(
        self,
        schema: Schema | None = None,
        presearcher: Presearcher | None = None,
        *,
        id_field: str = "id",
        delta_capacity: int = 256,
        merge_factor: int = 4,
        highlights: bool = False,
    ) -> None:
        self.index = QueryIndex(
            schema, presearcher, delta_capacity=delta_capacity, merge_factor=merge_factor
        )
        self.id_field = id_field
        self.highlights = highlights

    @property
    def schema(self) -> Schema:
        """The schema documents are analysed with."""
        return self.index.schema

    def __len__(self) -> int:
        return len(self.index)

    def add(
        self, name: str, query: SearchNode | CompiledQuery, streams: Iterable[str] = (),
        *, highlights: bool = False,
    ) -> RegisteredQuery:
        """Register a standing query under ``name`` (for ``streams``, or every stream);
        ``highlights``: its matches carry them in every run."""
        return self.index.add(name, query, streams, highlights=highlights)

    def add_declaration(self, declaration: QueryDecl) -> RegisteredQuery:
        """Register a parsed ``query`` block: its name, ``match`` expression and streams."""
        return self.index.add(declaration.name, declaration.match, declaration.streams)

    def add_many(
        self, queries: Iterable[tuple[str, SearchNode | CompiledQuery, Iterable[str]]],
        *, highlights: bool = False,
    ) -> int:
        """Register many ``(name, query, streams)`` at once; see :meth:`QueryIndex.add_many`."""
        return self.index.add_many(queries, highlights=highlights)

    def replace(
        self, name: str, query: SearchNode | CompiledQuery, streams: Iterable[str] = (),
        *, highlights: bool = False,
    ) -> RegisteredQuery:
        """Replace the standing query called ``name``."""
        return self.index.replace(name, query, streams, highlights=highlights)

    def delete(self, name: str) -> None:
        """Remove the standing query called ``name``."""
        self.index.delete(name)

    def stats(self) -> IndexStats:
        """Shape of the query index."""
        return self.index.stats()

    def _document_id(self, document: Mapping[str, Any], given: Any) -> str:
        if given is not None:
            return str(given)
        value = document.get(self.id_field) if isinstance(document, Mapping) else None
        if value is None:
            raise InvalidDocumentError(
                f"document has no {self.id_field!r} field; pass document_id explicitly"
            )
        return str(value)

    def _verify(
        self,
        doc: AnalyzedDocument,
        candidates: list[RegisteredQuery],
        document_id: str,
        stream: str | None,
        highlights: bool,
    ) -> tuple[list[QueryMatch], int, int]:
        """The matches of one document among its candidates, the candidates verified and how
        many of those the index decided; highlights for all of them or for the queries that
        ask for them."""
        found: list[QueryMatch] = []
        verified = decided = 0
        for entry in candidates:
            if not entry.applies_to(stream):
                continue
            verified += 1
            if entry.decided:
                decided += 1
            elif not entry.compiled.matches(doc):
                continue
            found.append(_query_match(
                entry.name, document_id,
                entry.compiled.highlights(doc) if highlights or entry.highlights else None,
                match_id(entry.name, document_id),
            ))
        found.sort(key=_by_name)
        return found, verified, decided

    def match(
        self,
        document: Mapping[str, Any],
        *,
        document_id: Any = None,
        stream: str | None = None,
        highlights: bool | None = None,
    ) -> list[QueryMatch]:
        """The standing queries matching ``document``, sorted by name.

        The document id is ``document_id`` if given, else the document's ``id_field``.
        ``stream`` restricts matching to queries registered for that stream (or for all).
        ``highlights`` as in :meth:`match_batch`.
        """
        doc = AnalyzedDocument(document, self.index.schema)
        found, _, _ = self._verify(
            doc, self.index.candidates(doc), self._document_id(document, document_id), stream,
            self.highlights if highlights is None else highlights,
        )
        return found

    def _analysed_chunks(
        self, documents: Iterable[Mapping[str, Any]], document_ids: Iterable[Any] | None
    ) -> Iterator[list[tuple[str, AnalyzedDocument]]]:
        """``(document id, analysed document)`` of ``documents``, :data:`SELECTION_BATCH` at a
        time; ids from ``document_ids``, else the id field, else the position."""
        schema = self.index.schema
        given = iter(document_ids) if document_ids is not None else None
        chunk: list[tuple[str, AnalyzedDocument]] = []
        for position, document in enumerate(documents):
            if given is not None:
                value = next(given, _NO_ID)
                if value is _NO_ID:
                    raise InvalidDocumentError(
                        f"document {position} has no id: document_ids is shorter than the batch"
                    )
            else:
                # type() first: the ABC check costs more than the rest of the id.
                value = (
                    document.get(self.id_field)
                    if type(document) is dict or isinstance(document, Mapping) else None
                )
            document_id = str(position) if value is None else str(value)
            chunk.append((document_id, AnalyzedDocument(document, schema)))
            if len(chunk) == SELECTION_BATCH:
                yield chunk
                chunk = []
        if given is not None and next(given, _NO_ID) is not _NO_ID:
            raise InvalidDocumentError("document_ids is longer than the batch")
        if chunk:
            yield chunk

    def match_batch(
        self,
        documents: Sequence[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        *,
        stream: str | None = None,
        document_ids: Sequence[Any] | None = None,
        highlights: bool | None = None,
    ) -> BatchResult:
        """Match a batch of documents, in order.

        A document's id is its entry of ``document_ids`` when given (one per document; None
        for none), else its ``id_field``; without one, its position in the batch. Candidates
        are selected :data:`SELECTION_BATCH` documents at a time (see
        :meth:`QueryIndex.candidates_batch`). ``highlights``: whether every match carries
        them (None: the percolator's setting); either way the queries registered with
        ``highlights=True`` get them. Python's cyclic collector is paused meanwhile (see
        :func:`~percolator.collector.collector_paused`).
        """
        with collector_paused():
            return self._match_batch(documents, stream, document_ids, highlights)

    def _match_batch(
        self,
        documents: Sequence[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        stream: str | None,
        document_ids: Sequence[Any] | None,
        highlights: bool | None,
    ) -> BatchResult:
        wanted = self.highlights if highlights is None else highlights
        all_matches: list[tuple[QueryMatch, ...]] = []
        per_doc: list[int] = []
        matched = decided = 0
        for chunk in self._analysed_chunks(documents, document_ids):
            docs = [doc for _, doc in chunk]
            selected = self.index.candidates_batch(docs)
            for (document_id, doc), candidates in zip(chunk, selected, strict=True):
                found, verified, by_index = self._verify(
                    doc, candidates, document_id, stream, wanted
                )
                all_matches.append(tuple(found))
                per_doc.append(verified)
                matched += len(found)
                decided += by_index
        stats = BatchStats(
            documents=len(per_doc),
            candidates_per_doc=tuple(per_doc),
            verified=sum(per_doc),
            matched=matched,
            always_run=self.index.always_run(),
            decided=decided,
        )
        return BatchResult(tuple(all_matches), stats)
