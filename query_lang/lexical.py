"""How single tokens of the language read and print: durations, quoted strings and the numbers
of search text. The parser reads them and the printer writes them, both through this module, so
``parse(print_module(m)) == m`` holds token by token.
"""

from __future__ import annotations

import re

__all__ = [
    "DURATION_UNITS_MS",
    "duration_ms",
    "duration_text",
    "quote",
    "search_number",
    "unescape",
]

DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# Largest unit first: a duration prints in the largest unit that divides it.
_UNITS_LARGEST_FIRST = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def duration_ms(text: str) -> int:
    """``10m`` -> 600000.

    Examples
    --------
    >>> duration_ms("10m"), duration_ms("250ms")
    (600000, 250)
    """
    match = re.fullmatch(r"([0-9]+)(ms|s|m|h|d)", text)
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return int(match.group(1)) * DURATION_UNITS_MS[match.group(2)]


def duration_text(ms: int) -> str:
    """A duration in the largest unit that divides it: 600000 -> ``10m``.

    Examples
    --------
    >>> duration_text(600_000), duration_text(90_000), duration_text(0)
    ('10m', '90s', '0ms')
    """
    for unit, size in _UNITS_LARGEST_FIRST:
        if ms % size == 0 and ms:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def quote(text: str) -> str:
    """``text`` as a string literal in double quotes, backslash-escaped.

    Examples
    --------
    >>> print(quote('say "hi"'))
    "say \\"hi\\""
    """
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        .replace("\r", "\\r")
    )
    return f'"{escaped}"'


def unescape(body: str) -> str:
    """Process the backslash escapes in a string literal's body (the text between quotes)."""
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6] or ""):
                out.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def search_number(text: str) -> str | int | float:
    """A bare word of search text as the value it stands for: a number when it reads as one.

    Examples
    --------
    >>> search_number("42"), search_number("-1.5"), search_number("v2")
    (42, -1.5, 'v2')
    """
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"-?[0-9]*\.[0-9]+([eE][+-]?[0-9]+)?|-?[0-9]+[eE][+-]?[0-9]+", text):
        return float(text)
    return text
