"""The Examples in the library packages' docstrings run as tests: every module of ``query_lang``,
``sketches``, ``percolator`` and ``cep``. (``spark_udf``'s need the shared Spark session and run
from ``tests/spark_udf/test_spark_doctests.py``.)"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import cep
import cep.alerts
import percolator
import query_lang
import sketches

PACKAGES = (query_lang, sketches, percolator, cep)

MODULES = sorted(
    info.name
    for package in PACKAGES
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
    if not info.name.endswith(".__main__")
) + sorted(package.__name__ for package in PACKAGES)

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

ENTRY_POINTS = {
    "query_lang.parse": query_lang.parse,
    "query_lang.check_program": query_lang.check_program,
    "cep.compile_rule": cep.compile_rule,
    "cep.Engine": cep.Engine,
    "cep.Engine.snapshot": cep.Engine.snapshot,
    "cep.engine.CheckpointStore": cep.engine.CheckpointStore,
    "cep.RuleProcessor": cep.RuleProcessor,
    "cep.RuleState": cep.RuleState,
    "cep.process_event": cep.process_event,
    "cep.MetricOperator": cep.MetricOperator,
    "cep.compile_metric": cep.compile_metric,
    "cep.alerts.Outbox": cep.alerts.Outbox,
    "cep.alerts.Dispatcher": cep.alerts.Dispatcher,
    "sketches.HyperLogLog": sketches.HyperLogLog,
    "sketches.BloomFilter": sketches.BloomFilter,
    "sketches.TDigest": sketches.TDigest,
    "sketches.from_bytes": sketches.from_bytes,
    "sketches.hash_value": sketches.hash_value,
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=FLAGS)
    assert result.failed == 0


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_public_entry_points_carry_an_example(name: str) -> None:
    found = doctest.DocTestFinder(recurse=False).find(ENTRY_POINTS[name], name)
    assert any(test.examples for test in found), f"{name} has no runnable example"


def test_examples_do_not_vanish() -> None:
    finder = doctest.DocTestFinder()
    count = sum(
        len(test.examples)
        for name in MODULES
        for test in finder.find(importlib.import_module(name))
    )
    assert count >= 280, count
