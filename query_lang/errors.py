"""The error family of the Vigil language: every error knows its file, line and column.

Errors render as ``path:line:col: error: message`` followed by the source line and a caret, the
format compilers use, so editors and terminals can jump to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from query_lang.ast import Span


class VigilError(Exception):
    """Root of every error Vigil reports about user input.

    Parameters
    ----------
    message:
        What went wrong, in words a user understands.
    span:
        Where: file, line and column (1-based). ``None`` when the error has no position.
    source:
        The text of the file, used to show the offending line; optional.
    """

    def __init__(self, message: str, span: Span | None = None, source: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.source = source

    @property
    def file(self) -> str | None:
        return self.span.file if self.span else None

    @property
    def line(self) -> int:
        return self.span.line if self.span else 0

    @property
    def column(self) -> int:
        return self.span.column if self.span else 0

    def location(self) -> str:
        """``path:line:col`` (or just the path when there is no line)."""
        if not self.span:
            return "<input>"
        if not self.span.line:
            return self.span.file
        return f"{self.span.file}:{self.span.line}:{self.span.column}"

    #: How ``render`` labels it.
    label = "error"

    def render(self) -> str:
        """The error as printed by ``vigil check``: location, message, source line, caret."""
        head = f"{self.location()}: {self.label}: {self.message}"
        text = source_line(self.source, self.line)
        if text is None:
            return head
        column = max(self.column, 1)
        if len(text) > _SHOWN_LINE:
            # A generated line can run to megabytes: show the part around the column.
            start = max(0, min(column - 1 - _SHOWN_LINE // 2, len(text) - _SHOWN_LINE))
            shown = text[start : start + _SHOWN_LINE]
            before = "..." if start > 0 else ""
            after = "..." if start + _SHOWN_LINE < len(text) else ""
            text, column = before + shown + after, column - start + len(before)
        caret = " " * (column - 1) + "^"
        return f"{head}\n  {text}\n  {caret}"

    def __str__(self) -> str:
        if not self.span:
            return self.message
        return f"{self.location()}: {self.message}"


# The most characters of a source line an error shows; a longer line is cut around the column.
_SHOWN_LINE = 120


def source_line(source: str | None, line: int) -> str | None:
    """Line ``line`` (1-based) of ``source`` with tabs expanded to single spaces, or None."""
    if not source or line < 1:
        return None
    lines = source.splitlines()
    if line > len(lines):
        return None
    return lines[line - 1].replace("\t", " ")


class VigilWarning(VigilError):
    """Valid input that probably does not do what its author wants; reported, never fatal."""

    label = "warning"


class VigilSyntaxError(VigilError, SyntaxError):
    """The text does not follow the grammar."""

    def __init__(self, message: str, span: Span | None = None, source: str | None = None):
        VigilError.__init__(self, message, span, source)

    def __str__(self) -> str:
        return VigilError.__str__(self)


class VigilNameError(VigilError, NameError):
    """A name is undeclared, declared twice, or used where it does not belong."""


class VigilTypeError(VigilError, TypeError):
    """An expression combines values of types that do not go together."""


class VigilValueError(VigilError, ValueError):
    """A value is out of range: a zero duration, ``{5,2}``, a regex RE2 rejects."""


class IncludeError(VigilError, OSError):
    """An ``include`` names a missing file or forms a cycle."""


class VigilLimitError(VigilError, ValueError):
    """Valid input beyond one of the compile limits of :mod:`query_lang.limits`: too many
    pattern variables or steps, nested too deeply, a duration or a number too long.

    ``limit`` names the limit (the constant of :mod:`query_lang.limits`), ``value`` is what was
    found (for a nesting depth: the depth at which reading stopped).
    """

    def __init__(
        self,
        message: str,
        span: Span | None = None,
        source: str | None = None,
        *,
        limit: str = "",
        value: int | None = None,
    ):
        super().__init__(message, span, source)
        self.limit = limit
        self.value = value


@dataclass
class ErrorList(VigilError):
    """Several errors at once, as ``vigil check`` reports them; sorted by position."""

    errors: list[VigilError]

    def __post_init__(self) -> None:
        first = self.errors[0] if self.errors else None
        VigilError.__init__(
            self,
            f"{len(self.errors)} error(s)" + (f"; first: {first.message}" if first else ""),
            first.span if first else None,
            first.source if first else None,
        )

    def render(self) -> str:
        return "\n".join(e.render() for e in self.errors)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)

    __hash__ = Exception.__hash__
