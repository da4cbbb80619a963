"""Errors of the ``vigil serve`` API as RFC 9457 problem details: ``type``, ``title``,
``status``, ``detail``, and for refused DSL ``errors``: ``[{file, line, column, message}]``.

Located errors carry no source line: the text they point into is the client's own body, or the
registry's (which may hold a webhook's literal secret).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from query_lang import VigilError

__all__ = ["PROBLEM_JSON", "Problem", "located"]

PROBLEM_JSON = "application/problem+json"

_TYPE = "urn:vigil:problem:"


class Problem(Exception):
    """An error answer. ``kind`` names its ``type`` (``urn:vigil:problem:KIND``; ``None``:
    ``about:blank``, a plain HTTP status).

    Examples
    --------
    >>> Problem(404, "Not found", "no rule, query or metric named 'x'").body()
    {'type': 'about:blank', 'title': 'Not found', 'status': 404, 'detail': "no rule, query or metric named 'x'"}
    """  # noqa: E501

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        *,
        kind: str | None = None,
        errors: Sequence[Mapping[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.kind = kind
        self.errors = list(errors) if errors is not None else None
        self.headers = dict(headers or {})
        self.extra = extra

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": _TYPE + self.kind if self.kind else "about:blank",
            "title": self.title,
            "status": self.status,
        }
        if self.detail:
            body["detail"] = self.detail
        if self.errors is not None:
            body["errors"] = self.errors
        body.update(self.extra)
        return body


def located(
    errors: Sequence[VigilError], files: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """``errors`` as ``{file, line, column, message}``; ``files`` renames paths (a temporary
    file to ``<body>``).

    Examples
    --------
    >>> from query_lang.ast import Span
    >>> located([VigilError("undeclared field 'amout'", Span("/tmp/x/q.vigil", 2, 41))],
    ...         {"/tmp/x/q.vigil": "<body>"})
    [{'file': '<body>', 'line': 2, 'column': 41, 'message': "undeclared field 'amout'"}]
    """
    files = files or {}

    def renamed(text: str) -> str:
        for path, name in files.items():
            text = text.replace(path, name)
        return text

    return [
        {
            "file": renamed(e.file) if e.file is not None else None,
            "line": e.line or None,
            "column": e.column or None,
            "message": renamed(e.message),
        }
        for e in errors
    ]
