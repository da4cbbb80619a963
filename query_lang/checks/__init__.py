"""Semantic checks: names, types and values that the grammar alone cannot catch.

Each check reports a :class:`~query_lang.errors.VigilError` at the position of the offending
node and carries on, so one run lists every problem of a program.

Modules, bottom up: ``expressions`` (the type of each expression, and what is wrong with it),
``context`` (the program's names and the checks every declaration shares), ``rules`` and
``declarations`` (streams, queries, metrics), ``program`` (the driver re-exported here).
"""

from __future__ import annotations

from query_lang.checks.context import event_time_field
from query_lang.checks.declarations import stream_warnings
from query_lang.checks.expressions import re2_problem
from query_lang.checks.program import check_declarations

__all__ = ["check_declarations", "event_time_field", "re2_problem", "stream_warnings"]
