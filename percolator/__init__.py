"""Indexed percolator: standing ``query`` blocks matched against every incoming document.

Queries are compiled (:mod:`percolator.evaluate`) into trees of matchers
(:mod:`percolator.match_tree`, term tests from :mod:`percolator.term_patterns`), reduced to what a
matching document must contain (:mod:`percolator.extract`), indexed by a swappable prefilter
(:mod:`percolator.presearcher`: the protocol and the no-filter baseline;
:mod:`percolator.indexed_presearcher` with :mod:`percolator.pattern_table`; large segments as
flat arrays, :mod:`percolator.columnar`) in a live segmented index (:mod:`percolator.index`),
and each document's candidates are verified exactly (:mod:`percolator.matcher`).
"""

from __future__ import annotations

from percolator.analysis import (
    DEFAULT_FIELD,
    FIELD_TYPES,
    Schema,
    Token,
    analyze_text,
    normalize_term,
)
from percolator.columnar import ColumnarPostings
from percolator.document import AnalyzedDocument
from percolator.errors import (
    ConfigurationError,
    DuplicateQueryError,
    InvalidDocumentError,
    InvalidQueryError,
    PercolatorError,
    SchemaError,
    UnknownQueryError,
)
from percolator.evaluate import (
    CompiledQuery,
    Evaluation,
    Highlights,
    compile_query,
    evaluate,
    explain,
    field_predicate,
)
from percolator.extract import Requirement, Selectivity, extract
from percolator.index import IndexStats, QueryIndex, RegisteredQuery
from percolator.indexed_presearcher import COLUMNAR_THRESHOLD, IndexedPresearcher
from percolator.matcher import BatchResult, BatchStats, Percolator, QueryMatch, match_id
from percolator.presearcher import NoFilterPresearcher, Presearcher, Segment

__all__ = [
    "COLUMNAR_THRESHOLD",
    "DEFAULT_FIELD",
    "FIELD_TYPES",
    "AnalyzedDocument",
    "BatchResult",
    "BatchStats",
    "ColumnarPostings",
    "CompiledQuery",
    "ConfigurationError",
    "DuplicateQueryError",
    "Evaluation",
    "Highlights",
    "IndexStats",
    "IndexedPresearcher",
    "InvalidDocumentError",
    "InvalidQueryError",
    "NoFilterPresearcher",
    "Percolator",
    "PercolatorError",
    "Presearcher",
    "QueryIndex",
    "QueryMatch",
    "RegisteredQuery",
    "Requirement",
    "Schema",
    "SchemaError",
    "Segment",
    "Selectivity",
    "Token",
    "UnknownQueryError",
    "analyze_text",
    "compile_query",
    "evaluate",
    "explain",
    "extract",
    "field_predicate",
    "match_id",
    "normalize_term",
]
