"""The Examples in the percolator's docstrings run as tests."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "percolator.analysis",
    "percolator.document",
    "percolator.columnar",
    "percolator.evaluate",
    "percolator.extract",
    "percolator.index",
    "percolator.interning",
    "percolator.matcher",
    "percolator.term_patterns",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
