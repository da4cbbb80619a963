"""A document seen through a schema (:class:`AnalyzedDocument`), analysed lazily: the prefilter
needs only each field's set of distinct terms, so token positions and character offsets are
computed only for documents that reach verification."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from itertools import chain
from typing import Any

from percolator.analysis import (
    DEFAULT_FIELD,
    DEFAULT_SCHEMA,
    KEYWORD,
    POSITION_GAP,
    TEXT,
    WORD,
    Schema,
    Token,
    ascii_folded,
    canonical_keyword,
    normalize_term,
    parse_number,
    text_terms,
    timestamp_seconds,
)
from percolator.errors import InvalidDocumentError

__all__ = ["AnalyzedDocument"]

_SCALARS = (str, int, float, bool)
_EXACT_SCALARS = frozenset(_SCALARS)


def _flatten(source: Mapping[str, Any], prefix: str, out: dict[str, tuple[Any, ...]]) -> None:
    for key, value in source.items():
        if not isinstance(key, str):
            raise InvalidDocumentError(f"field names must be strings, not {key!r}")
        name = prefix + key
        if value is None:
            continue
        if type(value) in _EXACT_SCALARS:
            # The common case first: exact built-in scalars are never mappings.
            out[name] = (value,)
        elif isinstance(value, Mapping):
            # Objects flatten to dotted names, as Elasticsearch maps them.
            _flatten(value, name + ".", out)
        elif isinstance(value, _SCALARS):
            out[name] = (value,)
        elif isinstance(value, list | tuple):
            items = tuple(v for v in value if v is not None)
            if all(isinstance(item, _SCALARS) for item in items):
                if items:
                    out[name] = items
            else:
                _flatten_list(items, name, out)
        else:
            raise InvalidDocumentError(
                f"field {name!r} holds a {type(value).__name__}; only strings, numbers, "
                "booleans, lists of them and objects can be searched"
            )


def _flatten_list(items: tuple[Any, ...], name: str, out: dict[str, tuple[Any, ...]]) -> None:
    """A list holding lists or objects, as Elasticsearch indexes one: nested lists are laid
    end to end (``[[1, 2], [3]]`` is ``[1, 2, 3]``) and the fields of its objects become
    dotted names holding every object's values in order (``[{"a": 1}, {"a": 2}]`` gives
    ``name.a`` the values 1 and 2)."""
    found: dict[str, list[Any]] = {}
    pending = list(reversed(items))
    while pending:
        item = pending.pop()
        if item is None:
            continue
        if isinstance(item, _SCALARS):
            found.setdefault(name, []).append(item)
        elif isinstance(item, list | tuple):
            pending.extend(reversed(item))
        elif isinstance(item, Mapping):
            fields: dict[str, tuple[Any, ...]] = {}
            _flatten(item, name + ".", fields)
            for field, values in fields.items():
                found.setdefault(field, []).extend(values)
        else:
            raise InvalidDocumentError(
                f"field {name!r} holds a {type(item).__name__} inside a list; only strings, "
                "numbers, booleans, lists and objects can be searched"
            )
    for field, values in found.items():
        out[field] = tuple(values)


class AnalyzedDocument:
    """One document (a mapping of field to value) seen through a schema, analysed on demand.

    Null values and empty lists count as absent. Nested objects are flattened to dotted field
    names, and so are objects inside lists; lists inside lists are laid end to end (as
    Elasticsearch indexes them). Character offsets of a field with several values count into
    the values joined by one newline.
    """

    __slots__ = (
        "source", "schema", "_values", "_kinds", "_terms", "_tokens", "_positions",
        "_numbers", "_times", "_default_fields", "_joined", "_plain", "_offsets", "_spaced",
        "_single",
        "_frameable",
    )

    def __init__(self, source: Mapping[str, Any], schema: Schema = DEFAULT_SCHEMA) -> None:
        if type(source) is not dict and not isinstance(source, Mapping):
            raise InvalidDocumentError(
                f"a document must be a mapping of field to value, not {type(source).__name__}"
            )
        self.source = source
        self.schema = schema
        values: dict[str, tuple[Any, ...]] = {}
        _flatten(source, "", values)
        self._values = values
        self._kinds: dict[str, str] = {}
        self._terms: dict[str, frozenset[str]] = {}
        self._tokens: dict[str, tuple[Token, ...]] = {}
        # Also caches term_spans and token_at, under prefixed keys.
        self._positions: dict[str, dict[Any, Any]] = {}
        self._numbers: dict[str, tuple[int | float, ...]] = {}
        self._times: dict[str, tuple[float, ...]] = {}
        self._joined: dict[str, str] = {}
        self._plain: dict[str, tuple[str, list[str], str] | None] = {}
        self._offsets: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self._spaced: dict[str, str | None] = {}
        # Field -> its tokens joined by single spaces, framed by two: made on the first phrase.
        self._single: dict[str, str] | None = None
        self._frameable: dict[str, bool] = {}
        self._default_fields: tuple[str, ...] | None = None

    def fields(self) -> tuple[str, ...]:
        """Names of the fields present (not null, not an empty list)."""
        return tuple(self._values)

    def has(self, name: str) -> bool:
        """Whether field ``name`` is present; :data:`DEFAULT_FIELD` asks for any default field."""
        if name == DEFAULT_FIELD:
            return bool(self.default_fields())
        return name in self._values

    def values(self, name: str) -> tuple[Any, ...]:
        """The raw non-null values of field ``name`` (empty when absent)."""
        return self._values.get(name, ())

    def default_fields(self) -> tuple[str, ...]:
        """The fields present in this document that terms without a field search."""
        if self._default_fields is None:
            declared = self.schema.default_fields
            self._default_fields = (
                tuple(name for name, vals in self._values.items()
                      if self.schema.is_default_field(name, vals))
                if declared is None
                # In the document's order, as the schema would say field by field.
                else tuple([name for name in self._values if name in declared])
            )
        return self._default_fields

    def terms_in(self, names: Collection[str]) -> frozenset[str]:
        """The distinct terms this document holds in any of the fields ``names``: the union
        of :meth:`term_parts`."""
        found, *parts = self.term_parts(names) or (frozenset(),)
        # One union of every part: adding them one by one would copy the text's terms each time.
        return found.union(*parts) if parts else found

    def term_parts(self, names: Collection[str]) -> list[frozenset[str]]:
        """The terms of the fields ``names`` as the sets they are kept in, the empty ones left
        out: together they are :meth:`terms_in`, and a term may be in more than one of them.
        What looks each term up can walk them one by one instead of copying a document's text
        into one more set.

        The default fields' terms are all in :data:`DEFAULT_FIELD`'s, so when it is among
        ``names`` only the other non-default fields add to it.
        """
        if DEFAULT_FIELD in names:
            defaults = self.default_fields()
            parts = [
                terms for f in names
                if f != DEFAULT_FIELD and f not in defaults and (terms := self.terms(f))
            ]
            found = self.terms(DEFAULT_FIELD)
            if found:
                parts.insert(0, found)
            return parts
        return [terms for f in names if (terms := self.terms(f))]

    def kind(self, name: str) -> str:
        """``text`` or ``keyword``: how field ``name`` is analysed in this document."""
        kind = self._kinds.get(name)
        if kind is None:
            declared = self.schema.type_of(name)
            if declared is not None:
                kind = TEXT if declared == "text" else KEYWORD
            elif self.schema.dynamic == "text" and any(
                isinstance(v, str) for v in self._values.get(name, ())
            ):
                kind = TEXT
            else:
                kind = KEYWORD
            self._kinds[name] = kind
        return kind

    def terms(self, name: str) -> frozenset[str]:
        """The distinct terms of field ``name``; for :data:`DEFAULT_FIELD`, of all default fields.

        Text fields give their analysed words; keyword fields their exact values; numbers and
        booleans their :func:`canonical_keyword`.
        """
        terms = self._terms.get(name)
        if terms is not None:
            return terms
        if name == DEFAULT_FIELD:
            members = self.default_fields()
            if len(members) == 1:
                terms = self.terms(members[0])
            else:
                # From the words of plain text fields rather than their own sets: most
                # documents never need a default field's terms on their own.
                pieces: list[Collection[str]] = []
                for member in members:
                    plain = None if member in self._terms else self._plain_text(member)
                    pieces.append(self.terms(member) if plain is None else plain[1])
                terms = frozenset(chain.from_iterable(pieces))
        elif self.kind(name) == TEXT:
            plain = self._plain_text(name)
            if plain is not None:
                terms = frozenset(plain[1])
            else:
                collected: set[str] = set()
                for value in self._values.get(name, ()):
                    if isinstance(value, str):
                        collected |= text_terms(value)
                    else:
                        collected.add(canonical_keyword(value))
                terms = frozenset(collected)
        else:
            terms = frozenset([
                value if type(value) is str else canonical_keyword(value)
                for value in self._values.get(name, ())
            ])
        self._terms[name] = terms
        return terms

    def _plain_text(self, name: str) -> tuple[str, list[str], str] | None:
        """``(folded value, words, padded)`` when field ``name`` holds one ASCII string
        analysed as text (the common case, where token positions are word indexes and offsets
        are found by substring search), else None. The folded value is lowercased with every
        non-word character blanked (:func:`ascii_folded`), so its offsets are the value's;
        ``padded`` is it between two spaces, where a token is exactly a space-framed match."""
        if name in self._plain:
            return self._plain[name]
        values = self._values.get(name, ())
        plain = None
        if (
            len(values) == 1 and isinstance(values[0], str) and values[0].isascii()
            and name != DEFAULT_FIELD and self.kind(name) == TEXT
        ):
            folded = ascii_folded(values[0])
            plain = (folded, folded.split(), " " + folded + " ")
        self._plain[name] = plain
        return plain

    def term_offsets(self, name: str, term: str) -> list[tuple[int, int]]:
        """Character offsets of the tokens of field ``name`` equal to ``term``, in order.

        Equals ``term_spans(name).get(term, [])`` but finds only the one term, without
        tokenising the whole field when it holds a single ASCII text value.

        Examples
        --------
        >>> doc = AnalyzedDocument({"t": "a cab, CAB cabs"}, Schema.of({"t": "text"}))
        >>> doc.term_offsets("t", "cab")
        [(2, 5), (7, 10)]
        """
        key = (name, term)
        found = self._offsets.get(key)
        if found is not None:
            return found
        plain = self._plain_text(name)
        if plain is None:
            found = self.term_spans(name).get(term, [])
        else:
            # In the padded folded text every token sits between two spaces, so each match
            # of the space-framed term is one of its tokens, one character to the right.
            padded = plain[2]
            framed = " " + term + " "
            size = len(term)
            found = []
            at = padded.find(framed)
            while at >= 0:
                found.append((at, at + size))
                at = padded.find(framed, at + size + 1)
        self._offsets[key] = found
        return found

    def phrase_starts(self, name: str, words: tuple[str, ...]) -> list[int]:
        """Sorted positions where ``words`` occur consecutively in field ``name``."""
        plain = self._plain_text(name)
        if plain is None:
            positions = self.positions(name)
            tails = [positions.get(w, set()) for w in words[1:]]
            return sorted(
                p for p in positions.get(words[0], ())
                if all(p + i + 1 in tail for i, tail in enumerate(tails))
            )
        tokens = plain[1]
        first = words[0]
        rest = list(words[1:])
        width = len(words)
        starts: list[int] = []
        start = -1
        while True:
            try:
                start = tokens.index(first, start + 1)
            except ValueError:
                return starts
            if tokens[start + 1:start + width] == rest:
                starts.append(start)

    def has_phrase(self, name: str, words: tuple[str, ...]) -> bool:
        """Whether ``words`` occur consecutively in field ``name``: ``phrase_starts`` is not
        empty. On a single ASCII text value, one substring search of the words, spaced, in its
        tokens joined by single spaces (tokens hold no space).

        Examples
        --------
        >>> doc = AnalyzedDocument({"t": "Red fox, red-fox!"}, Schema.of({"t": "text"}))
        >>> doc.has_phrase("t", ("fox", "red")), doc.has_phrase("t", ("red", "red"))
        (True, False)
        """
        plain = self._plain_text(name)
        if plain is None:
            return bool(self.phrase_starts(name, words))
        single = self._single
        if single is None:
            single = self._single = {}
        joined = single.get(name)
        if joined is None:
            joined = single[name] = " " + " ".join(plain[1]) + " "
        return " " + " ".join(words) + " " in joined

    def phrase_span(self, name: str, start: int, width: int) -> tuple[int, int] | None:
        """Character offsets from the token at position ``start`` to the end of the token
        ``width - 1`` positions later; None when either has no text offsets."""
        plain = self._plain_text(name)
        if plain is None:
            at = self.token_at(name)
            first, final = at[start], at[start + width - 1]
            if first.start is None or final.end is None:
                return None
            return first.start, final.end
        tokens = plain[1]
        last = start + width - 1
        # The k-th token equal to a term is the k-th occurrence that term_offsets finds.
        head = self.term_offsets(name, tokens[start])[tokens[:start].count(tokens[start])]
        tail = self.term_offsets(name, tokens[last])[tokens[:last].count(tokens[last])]
        return head[0], tail[1]

    def joined_terms(self, name: str) -> str:
        """The distinct terms of a field, each framed by ``\\x1e``, for substring automata."""
        joined = self._joined.get(name)
        if joined is None:
            terms = self.terms(name)
            joined = "\x1e" + "\x1e".join(terms) + "\x1e" if terms else ""
            self._joined[name] = joined
        return joined

    def spaced_terms(self, name: str) -> str | None:
        """The tokens of field ``name`` separated by spaces, with a space at each end, when
        every value it searches is a plain ASCII text (its folded form is exactly that); None
        otherwise. A literal some term holds, with spaces for its ``\x1e`` frames, is then a
        substring.

        Examples
        --------
        >>> doc = AnalyzedDocument({"t": "Calendar sync!"}, Schema.of({"t": "text"}))
        >>> doc.spaced_terms("t")
        ' calendar sync  '
        """
        if name in self._spaced:
            return self._spaced[name]
        fields = self.default_fields() if name == DEFAULT_FIELD else (name,)
        parts = []
        for field_name in fields:
            plain = self._plain_text(field_name)
            if plain is None:
                parts = None
                break
            parts.append(plain[2])
        spaced = "".join(parts) if parts is not None else None
        self._spaced[name] = spaced
        return spaced

    def frameable(self, name: str) -> bool:
        """Whether no term of field ``name`` holds the frame character, so that
        :meth:`joined_terms` splits back into exactly the terms (true for every text field)."""
        found = self._frameable.get(name)
        if found is None:
            if name == DEFAULT_FIELD:
                found = all(self.frameable(f) for f in self.default_fields())
            elif self.kind(name) == TEXT:
                found = True
            else:
                # The frame character occurs once more than there are terms, unless a term
                # holds it.
                joined = self.joined_terms(name)
                found = joined.count("\x1e") == len(self.terms(name)) + 1 if joined else True
            self._frameable[name] = found
        return found

    def tokens(self, name: str) -> tuple[Token, ...]:
        """Every token of field ``name`` in order, with positions and character offsets."""
        tokens = self._tokens.get(name)
        if tokens is None:
            text = self.kind(name) == TEXT
            collected: list[Token] = []
            base = 0
            position = 0
            for value in self._values.get(name, ()):
                if not isinstance(value, str):
                    collected.append(Token(canonical_keyword(value), position, None, None))
                    position += POSITION_GAP
                    continue
                if text:
                    # ASCII lowercasing keeps offsets, so words come out already normalised.
                    ascii_text = value.isascii()
                    source = value.lower() if ascii_text else value
                    last = position
                    for match in WORD.finditer(source):
                        word = match.group()
                        collected.append(Token(
                            word if ascii_text else normalize_term(word), last,
                            base + match.start(), base + match.end(),
                        ))
                        last += 1
                    position = last + POSITION_GAP
                else:
                    collected.append(Token(value, position, base, base + len(value)))
                    position += POSITION_GAP
                base += len(value) + 1
            tokens = tuple(collected)
            self._tokens[name] = tokens
        return tokens

    def term_spans(self, name: str) -> dict[str, list[tuple[int, int]]]:
        """``term -> [(start, end), ...]`` character offsets of field ``name``, for highlights."""
        key = "spans\x00" + name
        spans = self._positions.get(key)
        if spans is None:
            spans = {}
            for token in self.tokens(name):
                if token.start is not None:
                    spans.setdefault(token.term, []).append((token.start, token.end))
            self._positions[key] = spans
        return spans  # type: ignore[return-value]

    def token_at(self, name: str) -> dict[int, Token]:
        """``position -> token`` of field ``name``, for highlighting phrases."""
        key = "at\x00" + name
        at = self._positions.get(key)
        if at is None:
            at = {token.position: token for token in self.tokens(name)}
            self._positions[key] = at
        return at  # type: ignore[return-value]

    def positions(self, name: str) -> dict[str, set[int]]:
        """``term -> positions`` of field ``name``, for phrase matching."""
        positions = self._positions.get(name)
        if positions is None:
            positions = {}
            for token in self.tokens(name):
                positions.setdefault(token.term, set()).add(token.position)
            self._positions[name] = positions
        return positions

    def numbers(self, name: str) -> tuple[int | float, ...]:
        """The values of field ``name`` that are numbers or decimal strings."""
        numbers = self._numbers.get(name)
        if numbers is None:
            numbers = tuple([
                n for v in self._values.get(name, ()) if (n := parse_number(v)) is not None
            ])
            self._numbers[name] = numbers
        return numbers

    def timestamps(self, name: str) -> tuple[float, ...]:
        """The values of field ``name`` read as timestamps, in epoch seconds."""
        times = self._times.get(name)
        if times is None:
            unit = self.schema.time_unit
            parsed = (timestamp_seconds(v, unit) for v in self._values.get(name, ()))
            times = tuple(t for t in parsed if t is not None)
            self._times[name] = times
        return times
