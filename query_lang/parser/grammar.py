"""The Lark parser of ``vigil.lark`` (package data), and the translation of its errors into
messages in a user's words: ``unexpected 'soon'; expected a duration such as 10m``.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from functools import lru_cache
from importlib import resources

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from query_lang import ast
from query_lang.errors import VigilLimitError, VigilSyntaxError
from query_lang.limits import MAX_NESTING_DEPTH, MAX_NUMBER_DIGITS

# What each regex terminal is, in the words an error message uses.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "STRING": 'a string in quotes such as "text"',
    "DURATION": "a duration such as 10m",
    "NUMBER": "a number",
    "INT": "a whole number",
    "REGEX": "a regular expression such as /ab+c/",
    "SWORD": "a search term",
    "COMPARE": "a comparison such as >=",
    "STRING_TEST": "contains, startswith or endswith",
    "ADD_OP": "+ or -",
    "MUL_OP": "*, / or %",
    "RANGE_OPEN": "[ or {",
    "RANGE_CLOSE": "] or }",
    "QMARK": "?",
    "STAR": "*",
    "PLUS": "+",
    "$END": "the end of the file",
}

# The COMMENT tokens of the parse running in this context, when its caller asked for them: the
# grammar ignores comments, so only the lexer sees them (and knows a `#` inside a string, a
# regular expression or a search word is none).
_comment_sink: ContextVar[list[Token] | None] = ContextVar("vigil_comment_sink", default=None)


def _keep_comment(token: Token) -> Token:
    sink = _comment_sink.get()
    if sink is not None:
        sink.append(token)
    return token


# Tokens that open a level of nesting until their operand: `not`, unary `-`, search's NOT and `!`
# (a pattern's `!x` too, harmlessly: its operand is one name). Search's `+` builds no node.
_PREFIX_OPERATORS = frozenset({"_NOT", "_S_NOT", "MINUS", "BANG"})
_NUMBER_TOKENS = frozenset({"NUMBER", "INT", "DURATION"})
_SEARCH_INTEGER = re.compile(r"-?[0-9]+")


class _TextLimit(Exception):
    """A token over a limit of the text; :func:`run_parser` makes it a located error."""

    def __init__(self, token: Token, message: str, limit: str, value: int):
        super().__init__(message)
        self.token, self.message, self.limit, self.value = token, message, limit, value


class _TextGuard:
    """A Lark post-lexer that checks the tokens as the parser reads them, before any tree is
    built: parentheses and prefix operators nested deeper than :data:`MAX_NESTING_DEPTH`, and
    numbers of more than :data:`MAX_NUMBER_DIGITS` digits, stop the parse at the token.

    A parenthesis is a level until it closes; a prefix operator until its operand's first
    token, so ``not not x`` is two levels where it reaches ``x`` and ``not a and not b`` one.
    """

    always_accept: tuple[str, ...] = ()

    def process(self, stream):
        parens = prefixes = 0
        for token in stream:
            kind = token.type
            if kind == "LPAR":
                parens += 1
            elif kind in _PREFIX_OPERATORS:
                prefixes += 1
            else:
                prefixes = 0
                if kind == "RPAR":
                    parens = max(parens - 1, 0)
                elif kind in _NUMBER_TOKENS or (
                    kind == "SWORD" and _SEARCH_INTEGER.fullmatch(token)
                ):
                    _check_digits(token)
            if parens + prefixes > MAX_NESTING_DEPTH:
                raise _TextLimit(
                    token,
                    f"nested too deeply: more than {MAX_NESTING_DEPTH} levels of parentheses "
                    "and prefix operators (nesting depth); simplify or split it",
                    "MAX_NESTING_DEPTH", parens + prefixes,
                )
            yield token


def _check_digits(token: Token) -> None:
    digits = sum(c.isdigit() for c in token)
    if digits > MAX_NUMBER_DIGITS:
        raise _TextLimit(
            token,
            f"a number of {digits:,} digits; the limit is {MAX_NUMBER_DIGITS} (number digits)",
            "MAX_NUMBER_DIGITS", digits,
        )


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = resources.files("query_lang").joinpath("vigil.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        start=["start", "search_query", "expr"],
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _keep_comment},
        postlex=_TextGuard(),
    )


@lru_cache(maxsize=1)
def _terminal_words() -> dict[str, str]:
    """Terminal name -> description, built from the grammar so no internal name escapes."""
    words = dict(_TERMINAL_WORDS)
    for term in _lark().terminals:
        if term.name in words:
            continue
        pattern = term.pattern
        if pattern.type == "str":
            words[term.name] = f"'{pattern.value}'"
        else:
            # keyword terminals written as alternatives ("OR" | "||") or case-insensitive strings
            text = pattern.value.replace("(?:", "").replace(")", "").replace("\\", "")
            first = text.split("|")[0]
            words[term.name] = f"'{first}'"
    return words


def describe_expected(expected: set[str] | frozenset[str]) -> str:
    """Turn a set of terminal names into ``expected X, Y or Z``."""
    words = _terminal_words()
    if {"NAME", "NUMBER", "STRING"} <= set(expected):
        return "a value or an expression such as amount > 10"
    names = sorted({words.get(name, name.lower().strip("_")) for name in expected})
    # keep messages short: specific words first, punctuation later
    names.sort(key=lambda w: (w.startswith("'") and not w[1:2].isalpha(), w))
    if len(names) > 8:
        names = names[:8] + [f"{len(names) - 8} more"]
    if not names:
        return "nothing more"
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " or " + names[-1]


def run_parser(
    text: str,
    start: str,
    path: str,
    line_offset: int,
    full_text: str,
    comments: list[Token] | None = None,
):
    """The Lark tree of ``text`` from grammar rule ``start``; a syntax error is raised as a
    :class:`VigilSyntaxError` that points into ``full_text`` (``text`` starts
    ``line_offset`` lines into it). The COMMENT tokens of ``text`` are appended to
    ``comments`` when it is given.
    """
    sink = _comment_sink.set(comments)
    try:
        return _lark().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, path, line_offset, full_text) from None
    except _TextLimit as over:
        token = over.token
        line = token.line + line_offset
        span = ast.Span(path, line, token.column, line, token.column + 1)
        raise VigilLimitError(
            over.message, span, full_text, limit=over.limit, value=over.value
        ) from None
    finally:
        _comment_sink.reset(sink)


def _syntax_error(
    err: UnexpectedInput, text: str, path: str, line_offset: int, full_text: str
) -> VigilSyntaxError:
    line = (err.line if err.line and err.line > 0 else text.count("\n") + 1) + line_offset
    column = err.column if err.column and err.column > 0 else 1
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            # point just past the last character that is neither blank nor in a comment line
            stripped = text.rstrip()
            while stripped and stripped.rsplit("\n", 1)[-1].lstrip().startswith("#"):
                stripped = stripped.rsplit("\n", 1)[0].rstrip() if "\n" in stripped else ""
            line = stripped.count("\n") + 1 + line_offset
            column = len(stripped.rsplit("\n", 1)[-1]) + 1
            found = "end of the block"
        else:
            found = f"'{token}'"
        message = f"unexpected {found}; expected {describe_expected(err.expected)}"
    elif isinstance(err, UnexpectedCharacters):
        char = text[err.pos_in_stream] if err.pos_in_stream < len(text) else ""
        if char in "\"'":
            message = "unterminated string: a string must end on the line it starts"
        else:
            message = f"unexpected character {char!r}"
            if err.allowed:
                message += f"; expected {describe_expected(set(err.allowed))}"
    elif isinstance(err, UnexpectedEOF):
        message = f"unexpected end of input; expected {describe_expected(set(err.expected))}"
    else:  # pragma: no cover - lark has no other subclasses
        message = str(err)
    span = ast.Span(path, line, column, line, column + 1)
    return VigilSyntaxError(message, span, full_text)
