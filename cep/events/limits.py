"""Limits on one event: the size and nesting of its line, and the encoding of its text.

Both engines check them where a line is read, before it is parsed (:func:`cep.events.event.
parse_json_line`), so that no line can exhaust the parser's stack or a worker's memory; a line
over a limit is a dead letter like any other bad line (``docs/semantics.md``, *Event limits*).
"""

from __future__ import annotations

import re

import numpy as np

__all__ = [
    "INVALID_UTF8_MARK",
    "MAX_EVENT_BYTES",
    "MAX_EVENT_DEPTH",
    "decode_line",
    "line_bytes",
    "line_text",
    "nesting_depth",
    "shown_line",
    "too_large_detail",
]

MAX_EVENT_BYTES = 1 << 20
"""Largest line (UTF-8 bytes, without its line break) that is parsed as an event: 1 MiB.

Events are records of a few hundred bytes to a few KiB; 1 MiB leaves room for a long text that
queries search, while bounding what one event costs wherever it is held whole (a partial
match's buffered events, a Spark blob, the percolator's analysis of its text)."""

MAX_EVENT_DEPTH = 64
"""Most levels of arrays and objects a line may nest (the event object itself is level 1).

Records are flat or nearly so (Elasticsearch's default mapping depth limit is 20); 64 keeps
every walk of an event (the JSON parser, the percolator's flattening, dead-letter rendering)
far from Python's recursion limit of 1,000, whatever stack it is called from."""

INVALID_UTF8_MARK = "\x00vigil:invalid-utf8\x00"
"""Prefix of the text :func:`decode_line` gives a line that is not valid UTF-8. A text column
(Arrow, Spark) can only hold valid text, so the line travels as its bytes escaped behind this
mark, which no JSON text begins with, and :func:`~cep.events.event.parse_json_line` reports it
as ``invalid_utf8``."""

# A JSON string, complete or running to the end of the text; a backslash escapes any character.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_OPEN, _CLOSE = np.frombuffer(b"[{", dtype=np.uint8), np.frombuffer(b"]}", dtype=np.uint8)


def too_large_detail(size: int) -> str:
    """The detail of a ``too_large`` dead letter: the line's ``size`` in bytes and the limit.

    Examples
    --------
    >>> too_large_detail(2_000_000)
    'the line takes 2,000,000 bytes; an event may take at most 1,048,576'
    """
    return f"the line takes {size:,} bytes; an event may take at most {MAX_EVENT_BYTES:,}"


def decode_line(data: bytes) -> str:
    """The text of one line's bytes; bytes that are not UTF-8 give the line with them escaped
    (``\\xNN``) behind :data:`INVALID_UTF8_MARK`.

    Examples
    --------
    >>> decode_line(b'{"a": "caf\\xc3\\xa9"}')
    '{"a": "café"}'
    >>> shown_line(decode_line(b'{"a": "caf\\xe9"}'))
    '{"a": "caf\\\\xe9"}'
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return INVALID_UTF8_MARK + data.decode("utf-8", "backslashreplace")


def line_text(data: bytes) -> str:
    """One input line's text as both engines read it: :func:`decode_line`, without the white
    space around it (which JSON ignores); empty for a blank line, which is no event.

    Examples
    --------
    >>> line_text(b'  {"a": 1}\\r'), line_text(b' \\t')
    ('{"a": 1}', '')
    """
    text = decode_line(data)
    if text.startswith(INVALID_UTF8_MARK):
        return INVALID_UTF8_MARK + shown_line(text).strip()
    return text.strip()


def shown_line(text: str) -> str:
    """A line's text as a dead letter shows it (without :data:`INVALID_UTF8_MARK`)."""
    return text[len(INVALID_UTF8_MARK):] if text.startswith(INVALID_UTF8_MARK) else text


def line_bytes(text: str) -> int:
    """The size of ``text`` in UTF-8 bytes.

    Examples
    --------
    >>> line_bytes("abc"), line_bytes("é" * 10)
    (3, 20)
    """
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def nesting_depth(text: str) -> int:
    """How many arrays and objects the JSON text opens one inside another at most, brackets
    inside strings not counted (also for text that is not valid JSON).

    Examples
    --------
    >>> nesting_depth('{"a": [1, {"b": "[[["}]}'), nesting_depth("[]"), nesting_depth("1")
    (3, 1, 0)
    """
    bare = _STRING.sub("", text).encode("utf-8", "surrogatepass")
    codes = np.frombuffer(bare, dtype=np.uint8)
    steps = np.isin(codes, _OPEN).astype(np.int64) - np.isin(codes, _CLOSE)
    if not len(steps):
        return 0
    return max(int(np.cumsum(steps).max()), 0)
