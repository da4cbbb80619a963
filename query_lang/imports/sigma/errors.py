"""Errors of the Sigma importer: every one names the rule file and the construct that has no
Vigil equivalent, so a user can find and fix (or drop) that part of the rule."""

from __future__ import annotations

from query_lang.ast import Span
from query_lang.errors import VigilError

__all__ = ["SigmaImportError"]


class SigmaImportError(VigilError, ValueError):
    """A Sigma rule (or mapping file) that cannot be imported faithfully.

    Parameters
    ----------
    message:
        What has no equivalent, naming the construct (``the |cidr modifier on ...``).
    path:
        The rule or mapping file.
    line:
        The line in that file, when known.

    Examples
    --------
    >>> print(SigmaImportError("keyword search without a field", "rules/x.yml", 12))
    rules/x.yml:12:1: keyword search without a field
    """

    def __init__(self, message: str, path: str | None = None, line: int = 0):
        super().__init__(message, Span(path or "<sigma>", line, 1 if line else 0))
