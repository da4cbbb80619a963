"""Sigma's matching of one value as a Vigil expression: the one home of the translation of its
semantics — strings compare case-insensitively with ``*`` and ``?`` wildcards unless ``|cased``,
``|re`` is an unanchored RE2 search, ``|cidr`` a network test, numbers compare as the field's
declared type.

Every function takes the field as a Vigil name and returns expression text; a value that has no
exact equivalent raises :class:`Untranslatable` naming the construct.
"""

from __future__ import annotations

from collections.abc import Sequence

import re2

from query_lang.lexical import quote

__all__ = [
    "Untranslatable",
    "WILDCARD_MULTI",
    "WILDCARD_SINGLE",
    "cidr_match",
    "compare_number",
    "equals_any",
    "field_reference",
    "number_literal",
    "regex_literal",
    "regex_match",
    "string_literal",
    "string_match",
]

WILDCARD_MULTI = object()
"""A ``*`` of a Sigma string: any run of characters, newlines included."""

WILDCARD_SINGLE = object()
"""A ``?`` of a Sigma string: any one character."""

Part = str | object
"""A piece of a Sigma string: literal text or one of the two wildcards."""

_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


class Untranslatable(ValueError):
    """A Sigma value or modifier without an exact Vigil equivalent; the message names it."""


def string_literal(text: str) -> str:
    """``text`` as a Vigil string literal; control characters as ``\\uXXXX`` escapes.

    Examples
    --------
    >>> print(string_literal('C:\\\\Windows\\\\'))
    "C:\\\\Windows\\\\"
    >>> print(string_literal("a\\x00b"))
    "a\\u0000b"
    """
    quoted = quote(text)
    return "".join(
        f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 else ch for ch in quoted
    )


def number_literal(number: int | float) -> str:
    """A Sigma number as a Vigil literal (negative numbers in parentheses, as ``(-1)``)."""
    text = repr(number)
    return f"({text})" if number < 0 else text


def regex_literal(pattern: str) -> str:
    """An RE2 pattern as a Vigil regular-expression literal ``/.../``.

    The literal reads ``\\/`` as ``/`` and ends at a newline, so slashes are escaped and line
    breaks written as RE2's ``\\n``; everything else is kept.

    Examples
    --------
    >>> print(regex_literal("a/b\\\\/c"))
    /a\\/b\\/c/
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append("\\/" if nxt == "/" else "\\n" if nxt == "\n" else ch + nxt)
            i += 2
            continue
        out.append({"/": "\\/", "\n": "\\n", "\r": "\\r"}.get(ch, ch))
        i += 1
    return "/" + "".join(out) + "/"


def _caseless(text: str) -> bool:
    """Whether case-insensitive and exact comparison with ``text`` agree (no cased letter)."""
    return text.lower() == text and text.upper() == text


def _escape(text: str) -> str:
    return "".join("\\" + ch if ch in _RE2_SPECIAL else ch for ch in text)


def _operand(field: str, cased: bool, literals: Sequence[str]) -> str:
    # lower(F) on both sides is the case-insensitive comparison; a value without cased
    # letters compares the same either way, and the plain field reads better and runs faster.
    if cased or all(_caseless(text) for text in literals):
        return field
    return f"lower({field})"


def string_match(field: str, parts: Sequence[Part], *, cased: bool = False) -> str:
    """Sigma's match of one string value (literal text and wildcards) against ``field``.

    Without wildcards it is an equality; a ``*`` at one or both ends only becomes
    ``startswith``/``endswith``/``contains``; ``*`` alone any value; anything else an anchored
    RE2 match. Case-insensitive unless ``cased``: the field is lowered (``lower``, Python's
    ``str.lower``) and so is the value.

    Examples
    --------
    >>> string_match("Image", ["\\\\whoami.exe"]) == 'lower(Image) == "\\\\\\\\whoami.exe"'
    True
    >>> print(string_match("CommandLine", [WILDCARD_MULTI, " -Enc ", WILDCARD_MULTI]))
    lower(CommandLine) contains " -enc "
    >>> print(string_match("Image", ["C:", WILDCARD_MULTI, ".EXE"], cased=True))
    Image matches /(?s)^C:.*\\.EXE$/
    >>> print(string_match("EventID", ["4688"]))
    EventID == "4688"
    """
    parts = _merged(parts)
    literals = [p for p in parts if isinstance(p, str)]
    if not literals:
        if parts and all(p is WILDCARD_MULTI for p in parts):
            return f"{field} is not null"  # * matches every string
    elif len(literals) == 1:
        text = literals[0]
        shape = tuple(p if p is WILDCARD_MULTI else "s" for p in parts)
        value = text if cased else text.lower()
        operand = _operand(field, cased, [text])
        test = {
            ("s",): "==",
            ("s", WILDCARD_MULTI): "startswith",
            (WILDCARD_MULTI, "s"): "endswith",
            (WILDCARD_MULTI, "s", WILDCARD_MULTI): "contains",
        }.get(shape)
        if test is not None:
            return f"{operand} {test} {string_literal(value)}"
    if not parts:
        return f'{field} == ""'
    operand = _operand(field, cased, literals)
    lower = operand != field and not cased
    body = "".join(
        ".*" if p is WILDCARD_MULTI else "." if p is WILDCARD_SINGLE
        else _escape(p.lower() if lower else p)  # type: ignore[union-attr]
        for p in parts
    )
    return f"{operand} matches {regex_literal('(?s)^' + body + '$')}"


def equals_any(field: str, texts: Sequence[str], *, cased: bool = False) -> str:
    """Sigma's match of a list of plain strings (no wildcards): ``field in (...)``.

    Examples
    --------
    >>> print(equals_any("User", ["SYSTEM", "LocalService"]))
    lower(User) in ("system", "localservice")
    """
    operand = _operand(field, cased, texts)
    values = [text if operand == field else text.lower() for text in texts]
    unique = list(dict.fromkeys(values))
    if len(unique) == 1:
        return f"{operand} == {string_literal(unique[0])}"
    return f"{operand} in ({', '.join(string_literal(v) for v in unique)})"


def _merged(parts: Sequence[Part]) -> list[Part]:
    out: list[Part] = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if out and isinstance(out[-1], str):
                out[-1] = out[-1] + part
                continue
        out.append(part)
    return out


def regex_match(field: str, pattern: str, flags: str = "") -> str:
    """Sigma's ``|re`` (with flags ``i``, ``m``, ``s``): an unanchored RE2 search.

    Raises :class:`Untranslatable` for what RE2 refuses (look-around, back-references).

    Examples
    --------
    >>> print(regex_match("CommandLine", "-e(nc)? [A-Za-z0-9+/]{20}", "i"))
    CommandLine matches /(?i)-e(nc)? [A-Za-z0-9+\\/]{20}/
    """
    full = (f"(?{''.join(sorted(flags))})" if flags else "") + pattern
    options = re2.Options()
    options.log_errors = False
    try:
        re2.compile(full, options)
    except re2.error as err:
        reason = err.args[0] if err.args else err
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise Untranslatable(
            f"regular expression {pattern!r} is not RE2 syntax ({reason}); Vigil's `matches` "
            "is RE2, without look-around or back-references"
        ) from None
    if not full:
        return f"{field} is not null"
    return f"{field} matches {regex_literal(full)}"


def cidr_match(field: str, network: str) -> str:
    """Sigma's ``|cidr``: the address in ``field`` lies in ``network`` (IPv4 or IPv6).

    Examples
    --------
    >>> print(cidr_match("DestinationIp", "10.0.0.0/8"))
    cidr_match(DestinationIp, "10.0.0.0/8")
    """
    return f"cidr_match({field}, {string_literal(network)})"


_COMPARE = {"LT": "<", "LTE": "<=", "GT": ">", "GTE": ">=", "NEQ": "!="}


def compare_number(field: str, op_name: str, number: int | float) -> str:
    """Sigma's ``|lt`` ``|lte`` ``|gt`` ``|gte`` ``|neq`` on a numeric field.

    Examples
    --------
    >>> print(compare_number("Count", "GTE", 10))
    Count >= 10
    """
    return f"{field} {_COMPARE[op_name]} {number_literal(number)}"


def field_reference(field: str, other: str, *, starts: bool, ends: bool, cased: bool) -> str:
    """Sigma's ``|fieldref``: the value of ``field`` equals (starts with, ends with, contains)
    the value of ``other`` in the same event, case-insensitively unless ``cased``.

    Examples
    --------
    >>> print(field_reference("SourceUser", "TargetUser", starts=False, ends=False, cased=False))
    lower(SourceUser) == lower(TargetUser)
    """
    left, right = (field, other) if cased else (f"lower({field})", f"lower({other})")
    test = {
        (False, False): "==", (True, False): "startswith", (False, True): "endswith",
        (True, True): "contains",
    }[(starts, ends)]
    return f"{left} {test} {right}"
