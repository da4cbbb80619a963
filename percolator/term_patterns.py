"""Term patterns: prefixes, wildcards and regexes compiled into tests of single terms, with the
literals a passing term must contain (what the prefilter's substring automata look for).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import re2

from percolator.analysis import TEXT, normalize_term
from percolator.document import AnalyzedDocument
from percolator.errors import InvalidQueryError

__all__ = [
    "TERM_EDGE",
    "TermPattern",
    "escape_wildcard",
    "glob_pattern",
    "regex_literals",
    "regex_pattern",
    "wildcard_segments",
]

#: Frames a term in the strings the substring automaton runs over; never inside a text term.
TERM_EDGE = "\x1e"

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@dataclass(frozen=True)
class TermPattern:
    """A test on single terms plus literals a matching term must contain.

    ``literals`` are framed with :data:`TERM_EDGE` where anchored: ``"\\x1eacm"`` means the term
    starts with ``acm``. An empty tuple means no literal is known.
    """

    test: Callable[[str], bool]
    literals: tuple[str, ...]

    @cached_property
    def probe(self) -> str | None:
        """The longest literal, used to find the few terms worth testing."""
        if not self.literals:
            return None
        return max(self.literals, key=lambda lit: (len(lit.strip(TERM_EDGE)), len(lit)))

    def matching_terms(self, doc: AnalyzedDocument, name: str) -> Iterator[str]:
        """The distinct terms of field ``name`` that pass the test.

        Rather than testing every term, finds the probe literal in the framed terms of the
        field (one C-level search per occurrence) and tests only the terms containing it.
        """
        yield from self._passing(doc, name, first_only=False)

    def holds_in(self, doc: AnalyzedDocument, name: str) -> bool:
        """Whether some term of field ``name`` passes (:meth:`matching_terms` is not empty),
        found without a generator and stopping at the first (the prefilter and the evaluator
        ask this of each pattern partner of a key a document holds).

        Examples
        --------
        >>> from percolator.analysis import Schema
        >>> doc = AnalyzedDocument({"t": "the acme widget"}, Schema.of({"t": "text"}))
        >>> pattern = glob_pattern("wildcard", "ac?e", TEXT)
        >>> pattern.holds_in(doc, "t"), glob_pattern("prefix", "wid", TEXT).holds_in(doc, "x")
        (True, False)
        """
        return bool(self._passing(doc, name, first_only=True))

    def _passing(self, doc: AnalyzedDocument, name: str, first_only: bool) -> list[str]:
        """The terms of field ``name`` that pass, or only the first of them."""
        probe = self.probe
        test = self.test
        passing: list[str] = []
        if probe is None or not doc.frameable(name):
            for term in doc.terms(name):
                if test(term):
                    passing.append(term)
                    if first_only:
                        break
            return passing
        joined = doc.joined_terms(name)
        lead = probe[0] == TERM_EDGE
        trail = probe[-1] == TERM_EDGE
        found = joined.find(probe)
        while found >= 0:
            start = found if lead else joined.rfind(TERM_EDGE, 0, found)
            end = found + len(probe) - 1 if trail else joined.find(TERM_EDGE, found + len(probe))
            term = joined[start + 1:end]
            if test(term):
                passing.append(term)
                if first_only:
                    break
            found = joined.find(probe, end)
        return passing


class _FullMatch:
    """RE2 whole-string matching through the compiled program, skipping the Python wrapper's
    per-call offset bookkeeping that costs several times the match itself."""

    __slots__ = ("_program", "_anchor", "_fallback")

    def __init__(self, compiled: Any) -> None:
        self._program = getattr(compiled, "_regexp", None)
        anchor_type = getattr(re2, "_Anchor", None)
        self._anchor = getattr(anchor_type, "ANCHOR_BOTH", None)
        self._fallback = compiled.fullmatch
        if self._program is None or self._anchor is None:
            self._program = None

    def __call__(self, term: str) -> bool:
        if self._program is None:
            return self._fallback(term) is not None
        data = term.encode("utf-8")
        return self._program.Match(self._anchor, data, 0, len(data))[0][0] != -1


def _compile_re2(pattern: str, what: str) -> _FullMatch:
    try:
        return _FullMatch(re2.compile(pattern, _RE2_OPTIONS))
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise InvalidQueryError(f"invalid {what} /{pattern}/: {detail}") from None


def _re2_escape(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "\\" + c if c.isascii() else c for c in text)


def wildcard_segments(pattern: str) -> list[tuple[str, str]]:
    """Split a wildcard into ``("literal", text)``, ``("any", "*")`` and ``("one", "?")`` items.

    ``\\`` escapes the next character; consecutive ``*`` collapse into one.
    """
    items: list[tuple[str, str]] = []
    literal: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            literal.append(next(chars, "\\"))
            continue
        if char not in "*?":
            literal.append(char)
            continue
        if literal:
            items.append(("literal", "".join(literal)))
            literal = []
        if char == "*" and items and items[-1][0] == "any":
            continue
        items.append(("any", "*") if char == "*" else ("one", "?"))
    if literal:
        items.append(("literal", "".join(literal)))
    return items


def _wildcard_pattern(pattern: str, normalize: bool) -> TermPattern:
    items = wildcard_segments(pattern)
    if normalize:
        items = [(k, normalize_term(t) if k == "literal" else t) for k, t in items]
    literals = []
    for index, (kind, text) in enumerate(items):
        if kind != "literal":
            continue
        head = TERM_EDGE if index == 0 else ""
        tail = TERM_EDGE if index == len(items) - 1 else ""
        literals.append(head + text + tail)
    kinds = [k for k, _ in items]
    if "any" not in kinds and "one" not in kinds:
        exact = "".join(t for _, t in items)
        return TermPattern(exact.__eq__, tuple(literals))
    if kinds in (["any"], ["literal", "any"]):
        prefix = items[0][1] if kinds[0] == "literal" else ""
        return TermPattern(lambda t: t.startswith(prefix), tuple(literals))
    if kinds.count("any") <= 2:
        # Python's backtracking engine is several times faster per call than RE2 here, and
        # with at most two stars its worst case stays quadratic in the term length.
        regex = "".join(
            ".*" if k == "any" else "." if k == "one" else re.escape(t) for k, t in items
        )
        return TermPattern(re.compile(regex, re.DOTALL).fullmatch, tuple(literals))
    regex = "(?s)" + "".join(
        ".*" if k == "any" else "." if k == "one" else _re2_escape(t) for k, t in items
    )
    return TermPattern(_compile_re2(regex, "wildcard"), tuple(literals))


def glob_pattern(form: Literal["prefix", "wildcard"], source: str, kind: str) -> TermPattern:
    """The term test of a prefix or wildcard on fields analysed as ``kind``.

    Examples
    --------
    >>> pattern = glob_pattern("prefix", "Merg", TEXT)
    >>> pattern.literals, pattern.test("mergers"), pattern.test("emerge")
    (('\\x1emerg',), True, False)
    """
    wildcard = escape_wildcard(source) + "*" if form == "prefix" else source
    return _wildcard_pattern(wildcard, kind == TEXT)


def escape_wildcard(text: str) -> str:
    """``text`` with the wildcard syntax (``\\``, ``*``, ``?``) escaped, to match literally."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")


def regex_pattern(source: str) -> TermPattern:
    """The term test of an RE2 regex, matched against whole terms as written on every field
    kind; raises :class:`InvalidQueryError` when ``source`` is no valid regex."""
    return TermPattern(_compile_re2(source, "regex"), regex_literals(source))


_CLASS_ESCAPES = frozenset("dDwWsSbBAz")


def regex_literals(pattern: str) -> tuple[str, ...]:
    """Literal runs every whole-term match of RE2 ``pattern`` must contain (conservatively).

    Only top-level runs of plain characters count; groups, classes and escapes like ``\\d``
    break runs; a character made optional by ``?``, ``*`` or ``{0,`` is dropped. A top-level
    alternation or an inline flag (``(?i)``) means no literal is known. Runs touching the ends
    of the pattern are anchored with :data:`TERM_EDGE`, since the regex must match the whole term.

    Examples
    --------
    >>> regex_literals("acme.*corp")
    ('\\x1eacme', 'corp\\x1e')
    >>> regex_literals("colou?r")
    ('\\x1ecolo', 'r\\x1e')
    >>> regex_literals("a|b")
    ()
    """
    runs: list[tuple[str, int, int]] = []
    run: list[str] = []
    run_start = 0
    i = 0
    n = len(pattern)

    def close(end: int) -> None:
        nonlocal run
        if run:
            runs.append(("".join(run), run_start, end))
        run = []

    while i < n:
        char = pattern[i]
        if char == "\\":
            nxt = pattern[i + 1] if i + 1 < n else ""
            if nxt in _CLASS_ESCAPES:
                close(i)
                i += 2
                continue
            if nxt == "" or (nxt.isascii() and nxt.isalnum()):
                # \x41, \pN, \Q..\E, octal and control escapes: rare, so rather than
                # decode them, know no literal.
                return ()
            if not run:
                run_start = i
            run.append(nxt)
            i += 2
            continue
        if char == "|":
            return ()
        if char == "[":
            close(i)
            i = _skip_class(pattern, i)
            continue
        if char == "(":
            if pattern.startswith("(?", i) and not (
                pattern.startswith("(?:", i) or pattern.startswith("(?P<", i)
                or pattern.startswith("(?<", i)
            ):
                return ()
            close(i)
            i = _skip_group(pattern, i)
            if i < 0:
                return ()
            continue
        if char in "?*":
            if run:
                run.pop()
            close(i)
            i += 1
            continue
        if char == "{":
            if run:
                run.pop()
            close(i)
            end = pattern.find("}", i)
            i = n if end < 0 else end + 1
            continue
        if char in "+.^$":
            # After "x+" the run may not be followed directly by what comes next, and "x+" at
            # the end of the pattern does not anchor the run at the end of the term.
            close(i)
            i += 1
            continue
        if not run:
            run_start = i
        run.append(char)
        i += 1
    close(n)
    literals = []
    for text, start, end in runs:
        if not text:
            continue
        head = TERM_EDGE if start == 0 else ""
        tail = TERM_EDGE if end == n else ""
        literals.append(head + text + tail)
    return tuple(literals)


def _skip_class(pattern: str, i: int) -> int:
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            if end >= 0:
                i = end + 2
                continue
        if pattern[i] == "]":
            return i + 1
        i += 1
    return len(pattern)


def _skip_group(pattern: str, i: int) -> int:
    depth = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _skip_class(pattern, i)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1

