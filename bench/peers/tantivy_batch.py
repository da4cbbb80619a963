"""tantivy as a batch reverse search: the peer of Vigil's percolator in the benchmark and in the
differential test (``tests/percolator/test_vs_tantivy.py``).

The way Meltwater's percolator and Luwak's batch mode do it: a batch of documents is indexed in
RAM, then every standing query is run over that batch. Queries are translated from Vigil's
search AST once (they are standing), with Vigil's own analysis of their words; documents are
analysed by tantivy with a tokenizer aligned to Vigil's (``\\w+`` runs, lowercased,
ASCII-folded), so both mean the same thing by a term.

Constructs translated, with the same meaning on both sides: terms, phrases and prefixes on text
fields; keyword equality on ``string`` fields; numeric ranges and comparisons on ``int``
fields; wildcards and regexes on text fields; AND, OR, NOT. Where the meanings part:

- tokenizer: Rust's ``\\w`` also counts marks and connector punctuation inside a run where
  Python's does not end one the same way, and tantivy's ASCII folding is not Unicode case folding
  plus NFKD (``ß`` folds to ``ss`` on both, but full-width forms and ligatures only in Vigil);
  ASCII text tokenises the same;
- lists: tantivy leaves a gap of one position between the values of a field, Vigil 100, so
  a phrase of two words can match across two values in tantivy only;
- a term with no field searches Vigil's default fields: translated as the OR of the term over
  each of them (a phrase must hold within one field in both);
- keyword equality on a number field (``views:1500``) and field presence are not translated.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tantivy

from percolator.analysis import analyze_text, normalize_term
from query_lang.ast import (
    SearchAnd,
    SearchCompare,
    SearchNode,
    SearchNot,
    SearchOr,
    SearchPhrase,
    SearchPrefix,
    SearchRange,
    SearchRegex,
    SearchTerm,
    SearchWildcard,
)

__all__ = ["TantivyBatchPercolator", "UnsupportedQuery"]

#: Vigil's text analysis in tantivy's terms (see the module docstring for where they part).
TOKENIZER = "vigil_text"

#: Hits asked for at first; a query matching more documents of the batch is run again.
FIRST_LIMIT = 64


class UnsupportedQuery(ValueError):
    """A construct with no translation of the same meaning."""


def _analyzer() -> Any:
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(r"\w+"))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
        .build()
    )


def _glob_regex(pattern: str) -> str:
    """A Vigil wildcard (``?`` one character, ``*`` any run, ``\\`` escapes) as a regex."""
    out = []
    escaped = False
    for char in pattern:
        if escaped:
            out.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "?":
            out.append(".")
        elif char == "*":
            out.append(".*")
        else:
            out.append(re.escape(normalize_term(char)))
    return "".join(out)


class TantivyBatchPercolator:
    """Standing queries run over batches of documents indexed by tantivy in RAM.

    Parameters
    ----------
    fields
        ``name -> type`` as in :class:`percolator.Schema` (``text``, ``string``, ``int``).
    default_fields
        The fields a term without a field searches.
    queries
        ``(name, query)`` pairs; see :meth:`translate` for what is translated.
    """

    def __init__(
        self,
        fields: Mapping[str, str],
        default_fields: Sequence[str],
        queries: Iterable[tuple[str, SearchNode]],
        held: int | None = None,
    ) -> None:
        builder = tantivy.SchemaBuilder()
        for name, kind in fields.items():
            if kind == "text":
                builder.add_text_field(name, tokenizer_name=TOKENIZER, index_option="position")
            elif kind == "string":
                builder.add_text_field(name, tokenizer_name="raw", index_option="basic")
            elif kind == "int":
                builder.add_integer_field(name, indexed=True, fast=True)
            else:
                raise UnsupportedQuery(f"field type {kind!r} is not translated")
        self.fields = dict(fields)
        self.default_fields = tuple(default_fields)
        self.schema = builder.build()
        self.names: list[str] = []
        self.queries: list[Any] = []
        #: With ``held``, the queries stay in Vigil's form and are translated ``held`` at a
        #: time for each batch (a translated query takes ~20 kB in tantivy's Python binding:
        #: a million do not fit in memory at once); the CPU seconds spent translating inside
        #: :meth:`match_batch` add up here, for the caller to leave out of its timing.
        self.held = held
        self.translating = 0.0
        self.pending: list[tuple[str, SearchNode]] = []
        for name, query in queries:
            if held is None:
                self.names.append(name)
                self.queries.append(self.translate(query))
            else:
                self.pending.append((name, query))

    # ------------------------------------------------------------ translation

    def translate(self, node: SearchNode) -> Any:
        """The tantivy query meaning what ``node`` means to Vigil."""
        if isinstance(node, SearchAnd):
            return self._boolean(node.clauses)
        if isinstance(node, SearchOr):
            return tantivy.Query.boolean_query(
                [(tantivy.Occur.Should, self.translate(c)) for c in node.clauses]
            )
        if isinstance(node, SearchNot):
            return self._boolean((node,))
        field = getattr(node, "field", None)
        if field is None:
            return tantivy.Query.boolean_query(
                [(tantivy.Occur.Should, self._leaf(node, name)) for name in self.default_fields]
            )
        return self._leaf(node, field)

    def _boolean(self, clauses: Sequence[SearchNode]) -> Any:
        parts = []
        for clause in clauses:
            if isinstance(clause, SearchNot):
                parts.append((tantivy.Occur.MustNot, self.translate(clause.clause)))
            else:
                parts.append((tantivy.Occur.Must, self.translate(clause)))
        if all(occur == tantivy.Occur.MustNot for occur, _ in parts):
            # Only negations match nothing in tantivy; in Vigil, every document without them.
            parts.append((tantivy.Occur.Must, tantivy.Query.all_query()))
        return tantivy.Query.boolean_query(parts)

    def _leaf(self, node: SearchNode, field: str) -> Any:
        kind = self.fields.get(field)
        schema = self.schema
        if kind is None:
            raise UnsupportedQuery(f"field {field!r} is not in the schema")
        if isinstance(node, SearchRange | SearchCompare):
            return self._range(node, field, kind)
        if kind == "string":
            if isinstance(node, SearchTerm | SearchPhrase):
                return tantivy.Query.term_query(schema, field, node.text)
            raise UnsupportedQuery(f"{type(node).__name__} on a keyword field")
        if kind != "text":
            raise UnsupportedQuery(f"{type(node).__name__} on a {kind} field")
        if isinstance(node, SearchTerm | SearchPhrase):
            words = analyze_text(node.text)
            if not words:
                return tantivy.Query.empty_query()
            if len(words) == 1:
                return tantivy.Query.term_query(schema, field, words[0])
            return tantivy.Query.phrase_query(schema, field, words)
        if isinstance(node, SearchPrefix):
            if "\\" in node.prefix:
                raise UnsupportedQuery("a prefix with a backslash")
            return tantivy.Query.regex_query(
                schema, field, re.escape(normalize_term(node.prefix)) + ".*"
            )
        if isinstance(node, SearchWildcard):
            return tantivy.Query.regex_query(schema, field, _glob_regex(node.pattern))
        if isinstance(node, SearchRegex):
            return tantivy.Query.regex_query(schema, field, node.pattern)
        raise UnsupportedQuery(f"{type(node).__name__} is not translated")

    def _range(self, node: SearchRange | SearchCompare, field: str, kind: str) -> Any:
        if kind != "int":
            raise UnsupportedQuery("a range on a field that is not int")
        if isinstance(node, SearchCompare):
            value = node.value
            low, high, include_low, include_high = {
                ">": (value, None, False, True), ">=": (value, None, True, True),
                "<": (None, value, True, False), "<=": (None, value, True, True),
            }.get(node.op, (None, None, True, True))
            if node.op not in (">", ">=", "<", "<="):
                raise UnsupportedQuery(f"comparison {node.op}")
        else:
            low = None if node.low in (None, "*") else node.low
            high = None if node.high in (None, "*") else node.high
            include_low, include_high = node.include_low, node.include_high
        if low is None and high is None:
            raise UnsupportedQuery("an open range")
        for bound in (low, high):
            if bound is not None and not isinstance(bound, int):
                raise UnsupportedQuery("a range bound that is not an integer")
        # An open end is inclusive to tantivy (and its flag means nothing to Vigil).
        return tantivy.Query.range_query(
            self.schema, field, tantivy.FieldType.Integer, low, high,
            include_low or low is None, include_high or high is None,
        )

    # ------------------------------------------------------------ matching

    def index(self, documents: Sequence[Mapping[str, Any]]) -> Any:
        """An index in RAM holding ``documents`` (document ids are their positions)."""
        index = tantivy.Index(self.schema)
        index.register_tokenizer(TOKENIZER, _analyzer())
        # One thread and one commit: one segment whose document ids are the insertion order.
        writer = index.writer(heap_size=max(15_000_000, 4_000 * len(documents)), num_threads=1)
        fields = self.fields
        for document in documents:
            doc = tantivy.Document()
            for name, kind in fields.items():
                value = document.get(name)
                if value is None:
                    continue
                for item in value if isinstance(value, list) else (value,):
                    if kind == "int":
                        doc.add_integer(name, int(item))
                    else:
                        doc.add_text(name, item)
            writer.add_document(doc)
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        return index

    @staticmethod
    def _search(searcher: Any, names: Sequence[str], queries: Sequence[Any],
                found: list[list[str]]) -> None:
        search = searcher.search
        for name, query in zip(names, queries, strict=True):
            result = search(query, FIRST_LIMIT, count=True)
            hits = result.hits
            if result.count > FIRST_LIMIT:
                hits = search(query, result.count, count=False).hits
            for _, address in hits:
                found[address.doc].append(name)

    def match_batch(self, documents: Sequence[Mapping[str, Any]]) -> list[list[str]]:
        """The names of the queries matching each document, sorted, in document order."""
        searcher = self.index(documents).searcher()
        if searcher.num_segments > 1:
            raise RuntimeError("the batch was indexed into more than one segment")
        found: list[list[str]] = [[] for _ in documents]
        if self.held is None:
            self._search(searcher, self.names, self.queries, found)
        for lo in range(0, len(self.pending), self.held or 1):
            start = time.process_time()
            part = self.pending[lo : lo + self.held]
            names = [name for name, _ in part]
            queries = [self.translate(query) for _, query in part]
            self.translating += time.process_time() - start
            self._search(searcher, names, queries, found)
            del queries
        for names in found:
            names.sort()
        return found
