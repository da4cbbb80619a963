"""Text analysis and the schema: the Unicode tokenizer with lowercasing and accent folding for
``text`` fields, exact keywords for every other field, number/timestamp parsing, and the field
types a percolator sees (:class:`Schema`). Documents seen through them: :mod:`percolator.document`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
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
    "Schema",
    "Token",
    "analyze_text",
    "canonical_keyword",
    "normalize_term",
    "parse_number",
    "timestamp_seconds",
]

FIELD_TYPES = ("text", "string", "int", "float", "timestamp", "bool", "list<string>", "json")

TEXT: Literal["text"] = "text"
KEYWORD: Literal["keyword"] = "keyword"

#: Pseudo-field under which the prefilter sees the terms of all default fields together.
DEFAULT_FIELD = "*"

# A word starts with a word character and may carry combining marks, so that a decomposed
# "nai\u0308ve" stays one token instead of splitting at the diaeresis.
WORD = re.compile(r"\w[\w\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]*")

# Values of one list field are laid end to end with this gap between their positions, so a
# phrase never matches across two values (Elasticsearch's position_increment_gap).
POSITION_GAP = 100

# What ``\w`` matches among ASCII characters of lowercased text: a token of an ASCII value is a
# maximal run of these, so with every other character blanked the value is its tokens between
# spaces, and a token's occurrences are those of the token framed by spaces.
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")

# One byte table that lowercases ASCII letters and turns every ASCII character ``\w`` does not
# match into a space: an ASCII value translated through it splits on whitespace into exactly the
# words ``WORD`` finds in its lowercased form, at the same character offsets.
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
    return [normalize_term(w) for w in WORD.findall(text)]


def ascii_folded(text: str) -> str:
    """An ASCII ``text`` lowercased with every non-word character replaced by a space.

    Examples
    --------
    >>> ascii_folded("GNU C-Library (v2.3)!")
    'gnu c library  v2 3  '
    """
    return text.encode().translate(_ASCII_FOLD).decode()


def text_terms(text: str) -> set[str]:
    if text.isascii():
        # One byte-table pass lowercases and blanks the separators; split does the rest.
        return set(ascii_folded(text).split())
    return {normalize_term(w) for w in WORD.findall(text)}


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
    if type(value) is int:
        return value
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


def timestamp_seconds(value: Any, unit: Literal["s", "ms"] = "s") -> float | None:
    """``value`` as epoch seconds: an ISO-8601 string (naive means UTC) or an epoch number.

    Epoch numbers, and decimal strings, are in ``unit``; None when ``value`` is neither.

    Examples
    --------
    >>> timestamp_seconds("2020-01-01T00:00:00Z"), timestamp_seconds(1577836800000, unit="ms")
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
        ``text string int float timestamp bool list<string> json``. ``text`` fields are
        tokenised, lowercased and accent-folded; every other field is matched as exact keywords
        (a ``json`` object's members by their dotted names, ``payload.kind``, as undeclared
        fields are).
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
