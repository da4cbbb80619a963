"""Document and query-text analysis: the schema, the Unicode tokenizer with lowercasing and accent
folding for ``text`` fields, exact keywords for every other field, and number/timestamp parsing.

A document is analysed lazily: the prefilter needs only each field's set of distinct terms, so
token positions and character offsets are computed only for documents that reach verification.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from percolator.errors import InvalidDocumentError, SchemaError
from query_lang.timestamps import parse_iso_ms

__all__ = [
    "DEFAULT_FIELD",
    "FIELD_TYPES",
    "KEYWORD",
    "TEXT",
    "AnalyzedDocument",
    "Schema",
    "Token",
    "analyze_text",
    "canonical_keyword",
    "normalize_term",
    "parse_number",
    "parse_timestamp",
]

FIELD_TYPES = ("text", "string", "int", "float", "timestamp", "bool", "list<string>")

TEXT: Literal["text"] = "text"
KEYWORD: Literal["keyword"] = "keyword"

#: Pseudo-field under which the prefilter sees the terms of all default fields together.
DEFAULT_FIELD = "*"

# A word starts with a word character and may carry combining marks, so that a decomposed
# "nai\u0308ve" stays one token instead of splitting at the diaeresis.
_WORD = re.compile(r"\w[\w\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]*")

# Values of one list field are laid end to end with this gap between their positions, so a
# phrase never matches across two values (Elasticsearch's position_increment_gap).
POSITION_GAP = 100

# What ``\w`` matches among ASCII characters of lowercased text: a token of an ASCII value is a
# maximal run of these, so with every other character blanked the value is its tokens between
# spaces, and a token's occurrences are those of the token framed by spaces.
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")

# One byte table that lowercases ASCII letters and turns every ASCII character ``\w`` does not
# match into a space: an ASCII value translated through it splits on whitespace into exactly the
# words ``_WORD`` finds in its lowercased form, at the same character offsets.
_ASCII_FOLD = bytes(
    code + 32 if 65 <= code <= 90
    else code if chr(code) in _ASCII_WORD
    else 32
    for code in range(256)
)

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


class Token(NamedTuple):
    """One analysed term of a field: its position and its character offsets in the field's text.

    ``start``/``end`` are None for values that are not strings (numbers, booleans), which have
    no text to highlight.
    """

    term: str
    position: int
    start: int | None
    end: int | None


@lru_cache(maxsize=1 << 16)
def _fold(word: str) -> str:
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", word).casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def normalize_term(word: str) -> str:
    """Lowercase and accent-fold one word (NFKD, case folding, combining marks dropped).

    Examples
    --------
    >>> normalize_term("Café")
    'cafe'
    >>> normalize_term("STRASSE") == normalize_term("Straße")
    True
    """
    if word.isascii():
        return word.lower()
    return _fold(word)


def analyze_text(text: str) -> list[str]:
    """The terms of ``text`` as a ``text`` field indexes them, in order.

    Examples
    --------
    >>> analyze_text("Crème brûlée, 2 ÉCLAIRS!")
    ['creme', 'brulee', '2', 'eclairs']
    """
    return [normalize_term(w) for w in _WORD.findall(text)]


def _ascii_folded(text: str) -> str:
    """An ASCII ``text`` lowercased with every non-word character replaced by a space.

    Examples
    --------
    >>> _ascii_folded("GNU C-Library (v2.3)!")
    'gnu c library  v2 3  '
    """
    return text.encode().translate(_ASCII_FOLD).decode()


def _text_terms(text: str) -> set[str]:
    if text.isascii():
        # One byte-table pass lowercases and blanks the separators; split does the rest.
        return set(_ascii_folded(text).split())
    return {normalize_term(w) for w in _WORD.findall(text)}


def canonical_keyword(value: Any) -> str:
    """The keyword under which a scalar value is indexed for term queries.

    Strings are kept exactly; booleans become ``true``/``false``; numbers their shortest
    decimal form, integral floats without a fraction, so ``200`` and ``200.0`` meet.

    Examples
    --------
    >>> canonical_keyword(200.0), canonical_keyword(True), canonical_keyword("ACME Corp")
    ('200', 'true', 'ACME Corp')
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    raise InvalidDocumentError(f"cannot index a value of type {type(value).__name__}")


def parse_number(value: Any) -> int | float | None:
    """``value`` as a number if it is one or a decimal string (``"1e3"``, ``"-2.5"``), else None.

    Booleans are not numbers here, although Python treats them as integers.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return None if isinstance(value, float) and math.isnan(value) else value
    if isinstance(value, str):
        text = value.strip()
        if _INTEGER.fullmatch(text):
            return int(text)
        if _NUMBER.fullmatch(text):
            return float(text)
    return None


def parse_timestamp(value: Any, unit: Literal["s", "ms"] = "s") -> float | None:
    """``value`` as epoch seconds: an ISO-8601 string (naive means UTC) or an epoch number.

    Epoch numbers, and decimal strings, are in ``unit``; None when ``value`` is neither.

    Examples
    --------
    >>> parse_timestamp("2020-01-01T00:00:00Z"), parse_timestamp(1577836800000, unit="ms")
    (1577836800.0, 1577836800.0)
    """
    number = parse_number(value)
    if number is not None:
        return number / 1000.0 if unit == "ms" else float(number)
    if not isinstance(value, str):
        return None
    ms = parse_iso_ms(value)
    return None if ms is None else ms / 1000.0


@dataclass(frozen=True)
class Schema:
    """Field types of the documents a percolator sees.

    Parameters
    ----------
    fields
        ``(name, type)`` pairs; use :meth:`of` to build from a mapping. Types are
        ``text string int float timestamp bool list<string>``. ``text`` fields are tokenised,
        lowercased and accent-folded; every other field is matched as exact keywords.
    default_fields
        The fields a term without a field (``acme`` rather than ``title:acme``) searches. None
        means every text or string field of the document, declared or not.
    dynamic
        How an undeclared field holding a string is analysed: ``"string"`` (exact keyword, the
        default: the open schema of the language) or ``"text"``.
    time_unit
        Unit of epoch numbers in timestamp comparisons: ``"s"`` or ``"ms"``.

    Examples
    --------
    >>> schema = Schema.of({"title": "text", "source": "string"}, default_fields=["title"])
    >>> schema.type_of("title"), schema.type_of("undeclared")
    ('text', None)
    """

    fields: tuple[tuple[str, str], ...] = ()
    default_fields: tuple[str, ...] | None = None
    dynamic: Literal["string", "text"] = "string"
    time_unit: Literal["s", "ms"] = "s"
    _types: dict[str, str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        types: dict[str, str] = {}
        for name, type_name in self.fields:
            if type_name not in FIELD_TYPES:
                raise SchemaError(
                    f"field {name!r} has unknown type {type_name!r}; "
                    f"expected one of {', '.join(FIELD_TYPES)}"
                )
            if name in types and types[name] != type_name:
                raise SchemaError(f"field {name!r} is declared twice with different types")
            types[name] = type_name
        if self.dynamic not in ("string", "text"):
            raise SchemaError(f"dynamic must be 'string' or 'text', not {self.dynamic!r}")
        if self.time_unit not in ("s", "ms"):
            raise SchemaError(f"time_unit must be 's' or 'ms', not {self.time_unit!r}")
        if self.default_fields is not None:
            object.__setattr__(self, "default_fields", tuple(self.default_fields))
        object.__setattr__(self, "_types", types)

    @classmethod
    def of(
        cls,
        fields: Mapping[str, str] | None = None,
        *,
        default_fields: Iterable[str] | None = None,
        dynamic: Literal["string", "text"] = "string",
        time_unit: Literal["s", "ms"] = "s",
    ) -> Schema:
        """Build a schema from a ``field -> type name`` mapping."""
        return cls(
            fields=tuple((fields or {}).items()),
            default_fields=None if default_fields is None else tuple(default_fields),
            dynamic=dynamic,
            time_unit=time_unit,
        )

    @classmethod
    def from_stream(cls, stream: Any, **options: Any) -> Schema:
        """The schema of a ``stream`` declaration (a ``query_lang.ast.StreamDecl``)."""
        if stream.time_unit is not None:
            options.setdefault("time_unit", stream.time_unit)
        return cls(fields=tuple((f.name, f.type) for f in stream.fields), **options)

    def type_of(self, name: str) -> str | None:
        """The declared type of field ``name``, or None when it is not declared."""
        return self._types.get(name)

    def possible_kinds(self, name: str) -> frozenset[str]:
        """How field ``name`` may be analysed in some document: ``text``, ``keyword`` or both.

        Undeclared fields holding numbers or booleans are always keywords; holding strings
        they follow ``dynamic``. ``name`` may be :data:`DEFAULT_FIELD`.
        """
        if name == DEFAULT_FIELD:
            if self.default_fields is not None:
                kinds: set[str] = set()
                for member in self.default_fields:
                    kinds |= self.possible_kinds(member)
                return frozenset(kinds)
            declared_text = any(t == "text" for t in self._types.values())
            kinds = {KEYWORD}
            if declared_text or self.dynamic == "text":
                kinds.add(TEXT)
            return frozenset(kinds)
        declared = self._types.get(name)
        if declared is not None:
            return frozenset({TEXT if declared == "text" else KEYWORD})
        return frozenset({KEYWORD, TEXT if self.dynamic == "text" else KEYWORD})

    def is_default_field(self, name: str, values: tuple[Any, ...]) -> bool:
        """Whether a document field is searched by terms that name no field."""
        if self.default_fields is not None:
            return name in self.default_fields
        declared = self._types.get(name)
        if declared is not None:
            return declared in ("text", "string", "list<string>")
        return any(isinstance(v, str) for v in values)


DEFAULT_SCHEMA = Schema()

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
            for item in items:
                if not isinstance(item, _SCALARS):
                    raise InvalidDocumentError(
                        f"field {name!r} holds a {type(item).__name__} inside a list; only "
                        "strings, numbers and booleans can be searched"
                    )
            if items:
                out[name] = items
        else:
            raise InvalidDocumentError(
                f"field {name!r} holds a {type(value).__name__}; only strings, numbers, "
                "booleans, lists of them and objects can be searched"
            )


class AnalyzedDocument:
    """One document (a mapping of field to value) seen through a schema, analysed on demand.

    Null values and empty lists count as absent. Nested objects are flattened to dotted field
    names. Character offsets of a field with several values count into the values joined by
    one newline.
    """

    __slots__ = (
        "source", "schema", "_values", "_kinds", "_terms", "_tokens", "_positions",
        "_numbers", "_times", "_default_fields", "_joined", "_plain", "_offsets", "_spaced",
        "_frameable",
    )

    def __init__(self, source: Mapping[str, Any], schema: Schema = DEFAULT_SCHEMA) -> None:
        if not isinstance(source, Mapping):
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
            self._default_fields = tuple(
                name for name, vals in self._values.items()
                if self.schema.is_default_field(name, vals)
            )
        return self._default_fields

    def terms_in(self, names: Collection[str]) -> frozenset[str]:
        """The distinct terms this document holds in any of the fields ``names``.

        The default fields' terms are all in :data:`DEFAULT_FIELD`'s, so when it is among
        ``names`` only the other non-default fields add to it.
        """
        if DEFAULT_FIELD in names:
            found = self.terms(DEFAULT_FIELD)
            defaults = self.default_fields()
            others = [f for f in names if f != DEFAULT_FIELD and f not in defaults]
        else:
            found = frozenset()
            others = list(names)
        for name in others:
            terms = self.terms(name)
            if terms:
                found = found | terms
        return found

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
        if terms is None:
            if name == DEFAULT_FIELD:
                union: set[str] = set()
                for member in self.default_fields():
                    union |= self.terms(member)
                terms = frozenset(union)
            else:
                plain = self._plain_text(name)
                if plain is not None:
                    terms = frozenset(plain[1])
                    self._terms[name] = terms
                    return terms
                text = self.kind(name) == TEXT
                collected: set[str] = set()
                for value in self._values.get(name, ()):
                    if text and isinstance(value, str):
                        collected |= _text_terms(value)
                    else:
                        collected.add(canonical_keyword(value))
                terms = frozenset(collected)
            self._terms[name] = terms
        return terms

    def _plain_text(self, name: str) -> tuple[str, list[str], str] | None:
        """``(folded value, words, padded)`` when field ``name`` holds one ASCII string
        analysed as text (the common case, where token positions are word indexes and offsets
        are found by substring search), else None. The folded value is lowercased with every
        non-word character blanked (:func:`_ascii_folded`), so its offsets are the value's;
        ``padded`` is it between two spaces, where a token is exactly a space-framed match."""
        if name in self._plain:
            return self._plain[name]
        values = self._values.get(name, ())
        plain = None
        if (
            len(values) == 1 and isinstance(values[0], str) and values[0].isascii()
            and name != DEFAULT_FIELD and self.kind(name) == TEXT
        ):
            folded = _ascii_folded(values[0])
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
                    for match in _WORD.finditer(source):
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
            parsed = (parse_number(v) for v in self._values.get(name, ()))
            numbers = tuple(n for n in parsed if n is not None)
            self._numbers[name] = numbers
        return numbers

    def timestamps(self, name: str) -> tuple[float, ...]:
        """The values of field ``name`` read as timestamps, in epoch seconds."""
        times = self._times.get(name)
        if times is None:
            unit = self.schema.time_unit
            parsed = (parse_timestamp(v, unit) for v in self._values.get(name, ()))
            times = tuple(t for t in parsed if t is not None)
            self._times[name] = times
        return times
