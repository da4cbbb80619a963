"""The error of an EQL import: what has no Vigil equivalent (or does not parse), where it stands
in the EQL text."""

from __future__ import annotations

from query_lang.ast import Span
from query_lang.errors import VigilError

__all__ = ["EqlImportError"]


class EqlImportError(VigilError, ValueError):
    """An EQL query that cannot be brought into Vigil exactly: a syntax error, or a construct
    without an equivalent (named in the message), at its file, line and column.

    ``construct`` names the EQL construct (``"pipe head"``, ``"function concat"``,
    ``"join"`` ...): the conformance report counts refusals by it.

    Examples
    --------
    >>> from query_lang.ast import Span
    >>> err = EqlImportError("`| head` has no Vigil equivalent", Span("q.eql", 2, 1),
    ...                      "process where true\\n| head 5", construct="pipe head")
    >>> print(err.render())
    q.eql:2:1: error: `| head` has no Vigil equivalent
      | head 5
      ^
    """

    def __init__(
        self, message: str, span: Span | None = None, source: str | None = None, *,
        construct: str = "",
    ) -> None:
        super().__init__(message, span, source)
        self.construct = construct
