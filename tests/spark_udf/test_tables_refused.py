"""The Spark operator does not keep tables yet: a program with a ``table`` is refused, naming
it and where it is declared, before any Spark work (never run with lookups that are all null)."""

from __future__ import annotations

import pytest

from spark_udf.errors import OperatorConfigError
from spark_udf.rules import processor_specs


def test_a_program_with_a_table_is_refused_naming_it():
    program = """
stream changes (k string, v string, ts timestamp) time ts
stream ev (k string, ts timestamp) time ts
table t from changes key k
rule r from ev by k pattern a define a as lookup(t, k).v == "x"
"""
    with pytest.raises(OperatorConfigError, match=r"<string>:4:1: table 't': tables run in the "
                       r"embedded engine only so far"):
        processor_specs(program)
