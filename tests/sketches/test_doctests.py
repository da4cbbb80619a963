"""Runs the doctest Examples of every sketches module, so `pytest tests` covers them."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import sketches

MODULES = sorted(info.name for info in pkgutil.iter_modules(sketches.__path__, prefix="sketches."))


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0


def test_public_classes_have_examples():
    finder = doctest.DocTestFinder()
    for name in ("HyperLogLog", "BloomFilter", "TDigest", "from_bytes", "hash_value"):
        tests = finder.find(getattr(sketches, name))
        assert any(test.examples for test in tests), name
