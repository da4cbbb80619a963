"""EQL into Vigil: Elastic's Event Query Language (and the ``eql`` package's classic dialect)
translated into Vigil rules with the same results, or refused with the construct named.

Parsing is the ``eql`` package's; :mod:`~query_lang.imports.eql.reading` keeps the positions
and case flags its tree drops, :mod:`~query_lang.imports.eql.expressions` writes conditions,
:mod:`~query_lang.imports.eql.rules` rules, :mod:`~query_lang.imports.eql.importer` files.
"""

from __future__ import annotations

from query_lang.imports.eql.errors import EqlImportError
from query_lang.imports.eql.importer import (
    EqlImport,
    EqlOptions,
    EqlSource,
    import_eql,
    read_sources,
)
from query_lang.imports.eql.reading import DIALECTS, parse_eql

__all__ = [
    "DIALECTS",
    "EqlImport",
    "EqlImportError",
    "EqlOptions",
    "EqlSource",
    "import_eql",
    "parse_eql",
    "read_sources",
]
