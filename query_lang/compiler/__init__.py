"""The expression compiler: Vigil expressions into evaluators, a closure over one event (given
the CEP engine's match context) and a vectorised form over a pandas batch for conditions on the
current event.

Both forms share one semantics, which the property tests hold them to row by row:

* **Null** is ``None``, a missing field (or column), or a float NaN (pandas' null). Arithmetic,
  unary minus and functions of null are null; ``x / 0`` and ``x % 0`` are null.
* **Two-valued logic.** Every test with a null operand is *false*: the comparisons
  ``== != < <= > >=`` (``!=`` too), ``in``, ``between``, ``matches``, ``contains``,
  ``startswith``, ``endswith`` and ``search``. Tests never yield null, so ``not (x == 1)`` is
  *true* when ``x`` is null, unlike SQL's three-valued logic. ``is null`` is true for null. In
  a boolean context (``and``, ``or``, ``not``, a whole condition) only the boolean ``true`` is
  true; null and values of other kinds are false.
* **Kinds.** A value is a number (int or float, mixed as in Python: ``1 == 1.0``, ``7 / 2`` is
  ``3.5``, ``%`` takes the sign of the divisor), a string, a boolean (not a number), or a list
  (``list<string>`` fields). Values of different kinds never compare equal and never order;
  arithmetic across kinds is null; ``+`` also concatenates two strings. A mistyped value never
  raises: compiled predicates cannot fail on any event.
* ``a contains b`` is a substring test on strings and a membership test on a list.
  ``x matches /re/`` is an RE2 *search* (unanchored, like Python's ``re.search``): write
  ``^...$`` to match the whole string. ``x in LIST`` tests the value as it is (no conversion)
  against the list's container.
* **Time.** Timestamps and durations are integer milliseconds, so ``ts - a.ts`` is a duration
  and ``hours(d)`` is ``d / 3.6e6``. Datetime values (Python, pandas or numpy) are read as
  epoch milliseconds, a naive datetime as UTC.
* **Pattern context.** ``a.f`` and ``last(a).f`` read the last event bound to ``a``,
  ``first(a).f`` the first; they are null when nothing is bound. ``count(v)`` counts the
  events bound to ``v``; ``sum avg min max`` of ``v.f`` fold the non-null values as ``+`` and
  the comparisons would (null when there are none, or when they mix kinds).

Modules, bottom up: ``values`` (normalised values, kinds, the row semantics of each operator),
``resolve`` (scope, match context and what names resolve to), ``rows`` (the row evaluators),
``kernels`` (columns and the vectorised operators), ``columns`` (the batch evaluators) and
``evaluators`` (the entry points re-exported here).
"""

from __future__ import annotations

from query_lang.compiler.evaluators import (
    MaskedValues,
    compile_columnar_predicate,
    compile_columns,
    compile_expr,
    compile_masked,
    compile_predicate,
    history_fields,
    is_columnar,
    referenced_fields,
)
from query_lang.compiler.kernels import BatchError
from query_lang.compiler.resolve import CompileError, MatchContext, Scope, SearchHook, TableReader
from query_lang.compiler.values import normalise_value, value_kind

__all__ = [
    "BatchError",
    "CompileError",
    "MaskedValues",
    "MatchContext",
    "Scope",
    "SearchHook",
    "TableReader",
    "compile_columnar_predicate",
    "compile_columns",
    "compile_expr",
    "compile_masked",
    "compile_predicate",
    "history_fields",
    "is_columnar",
    "normalise_value",
    "referenced_fields",
    "value_kind",
]
