"""Error classes of the percolator: one root, `PercolatorError`, and subclasses that also inherit
the matching builtin so callers may catch either."""

from __future__ import annotations

from query_lang.errors import VigilError

__all__ = [
    "ConfigurationError",
    "DuplicateQueryError",
    "InvalidDocumentError",
    "InvalidQueryError",
    "PercolatorError",
    "SchemaError",
    "UnknownQueryError",
]


class PercolatorError(VigilError):
    """Root of every error raised by the percolator package."""


class SchemaError(PercolatorError, ValueError):
    """A schema names an unknown field type or an invalid option."""


class ConfigurationError(PercolatorError, ValueError):
    """An index or percolator option is out of range, or a sealed segment is written to."""


class InvalidQueryError(PercolatorError, ValueError):
    """A standing query cannot be compiled: a bad regex, mixed range bounds, an unknown operator.

    ``query`` names the standing query when the error arose while registering one.
    """

    def __init__(self, message: str, *, query: str | None = None) -> None:
        self.query = query
        super().__init__(f"query {query!r}: {message}" if query else message)


class InvalidDocumentError(PercolatorError, ValueError):
    """A document holds a value that cannot be searched, or lacks an id when one is needed."""


class DuplicateQueryError(PercolatorError, ValueError):
    """A query is added under a name that is already registered."""


class UnknownQueryError(PercolatorError, KeyError):
    """A query is replaced or deleted under a name that is not registered."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a sentence reads better in a log.
        return str(self.args[0]) if self.args else ""
