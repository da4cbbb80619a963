"""EQL's patterns as RE2 regular expressions (what Vigil's ``matches`` runs): wildcards, the
Python regular expressions of the ``eql`` package's ``match()``, and the Lucene ones of
Elasticsearch's ``regex``.

Python's ``\\w``, ``\\d`` and ``\\s`` are Unicode-aware and RE2's are ASCII-only, so they are
rewritten to the Unicode classes they stand for; what RE2 cannot run (look-arounds,
back-references) and Lucene's operators without an RE2 spelling are errors.
"""

from __future__ import annotations

import re

import re2

__all__ = ["PatternError", "python_regex", "wildcard_regex"]


class PatternError(ValueError):
    """A pattern without an exact RE2 equivalent."""


_LITERAL_SAFE = re.compile(r"[A-Za-z0-9_\s]|[^\x00-\x7f]")

# Python's Unicode classes (``re.UNICODE``): \w is str.isalnum() or "_", \d is Nd, \s is
# str.isspace().
_PY_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}" \
            r"\x{202f}\x{205f}\x{3000}"
_CLASS_BODY = {"w": r"\p{L}\p{N}_", "d": r"\p{Nd}", "s": _PY_SPACE}


def _escape(text: str) -> str:
    return "".join(ch if _LITERAL_SAFE.fullmatch(ch) else "\\" + ch for ch in text)


def wildcard_regex(pattern: str, *, case_insensitive: bool, question_mark: bool) -> str:
    """An anchored RE2 regex for a wildcard pattern: ``*`` is any text, and with
    ``question_mark`` ``?`` is one character.

    Examples
    --------
    >>> wildcard_regex("*\\\\red_ttp\\\\wininit.*", case_insensitive=True, question_mark=False)
    '(?is)^.*\\\\\\\\red_ttp\\\\\\\\wininit\\\\..*$'
    >>> wildcard_regex("a?c", case_insensitive=False, question_mark=True)
    '(?s)^a.c$'
    """
    pieces = []
    for ch in pattern:
        if ch == "*":
            pieces.append(".*")
        elif ch == "?" and question_mark:
            pieces.append(".")
        else:
            pieces.append(_escape(ch))
    flags = "(?is)" if case_insensitive else "(?s)"
    return f"{flags}^{''.join(pieces)}$"


def python_regex(
    patterns: list[str], *, case_insensitive: bool, whole: bool, lucene: bool = False
) -> str:
    r"""One RE2 regex matching where one of ``patterns`` matches: from the start of the value
    (Python's ``re.match``, the ``eql`` package's ``match()``), or the whole value (``whole``:
    Elasticsearch's ``regex``, whose patterns are Lucene's (``lucene``)).

    Examples
    --------
    >>> print(python_regex([r"net1\w{4}"], case_insensitive=True, whole=False))
    (?is)^(?:net1[\p{L}\p{N}_]{4})
    >>> python_regex(["a.c"], case_insensitive=False, whole=True, lucene=True)
    '(?s)^(?:a.c)$'
    """
    converted = [_lucene(p) if lucene else _python(p) for p in patterns]
    body = "|".join(f"(?:{c})" if len(converted) > 1 else c for c in converted)
    flags = "(?is)" if case_insensitive else "(?s)"
    regex = f"{flags}^(?:{body})" + ("$" if whole else "")
    options = re2.Options()
    options.log_errors = False
    try:
        re2.compile(regex, options)
    except re2.error as err:
        detail = err.args[0] if err.args else err
        detail = detail.decode() if isinstance(detail, bytes) else str(detail)
        raise PatternError(f"regular expression {patterns!r} has no RE2 equivalent: {detail}")\
            from None
    return regex


def _python(pattern: str) -> str:
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _CLASS_BODY:
                out.append(_CLASS_BODY[nxt] if in_class else f"[{_CLASS_BODY[nxt]}]")
            elif nxt.lower() in _CLASS_BODY:  # \W \D \S
                if in_class:
                    raise PatternError(f"`\\{nxt}` inside a character class in {pattern!r}")
                out.append(f"[^{_CLASS_BODY[nxt.lower()]}]")
            elif nxt in "AZbB" and not in_class:
                replacement = {"A": "^", "Z": "$"}.get(nxt)
                if replacement is None:
                    raise PatternError(f"`\\{nxt}` (a word boundary) in {pattern!r}: Python's "
                                       "is Unicode-aware, RE2's is not")
                out.append(replacement if nxt == "A" else r"\z")
            else:
                out.append(ch + nxt)
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            if pattern[i + 1 : i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1 : i + 2] == "]":
                out.append("\\]")
                i += 1
        elif ch == "]" and in_class:
            in_class = False
            out.append(ch)
        elif ch == "$" and not in_class:
            # Python's $ also matches before a final newline.
            out.append(r"(?:\n?\z)")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


_LUCENE_OPERATORS = set('@&~<>#"')


def _lucene(pattern: str) -> str:
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt.isalnum():
                raise PatternError(f"`\\{nxt}` in the Lucene regular expression {pattern!r}")
            out.append(_escape(nxt))
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
            out.append(ch)
        elif ch == "[":
            in_class = True
            out.append(ch)
        elif ch in _LUCENE_OPERATORS:
            raise PatternError(f"the Lucene operator `{ch}` in {pattern!r} has no RE2 equivalent")
        elif ch in "^$":
            out.append("\\" + ch)  # literal characters in Lucene's syntax
        else:
            out.append(ch)
        i += 1
    return "".join(out)
