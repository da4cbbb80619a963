"""Text to syntax tree: the Lark parser, the transformer into :mod:`query_lang.ast` nodes, and
the translation of parser errors into messages a user understands.

No Lark ``Tree`` or ``Token`` leaves this package. A file is parsed one top-level block at a
time, so one syntax error does not hide the errors of the blocks after it.

Modules, bottom up: ``grammar`` (the Lark parser and its errors in a user's words),
``node_builder`` (spans and errors of the transformer), ``declarations`` and ``expressions``
(the transformer's rules), ``source`` (the entry points re-exported here).
"""

from __future__ import annotations

from query_lang.errors import ErrorList
from query_lang.lexical import DURATION_UNITS_MS, duration_ms
from query_lang.parser.grammar import describe_expected
from query_lang.parser.source import parse, parse_expr, parse_recovering, parse_search

__all__ = [
    "DURATION_UNITS_MS",
    "parse",
    "parse_recovering",
    "parse_expr",
    "parse_search",
    "duration_ms",
    "describe_expected",
    "ErrorList",
]
