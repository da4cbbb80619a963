"""The docstring examples of every ``spark_udf`` module run, with the tests' SparkSession as
``spark``, so an example that stops working fails CI."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import spark_udf

pytestmark = pytest.mark.slow


def _module_names() -> list[str]:
    names = ["spark_udf"]
    for info in pkgutil.walk_packages(spark_udf.__path__, prefix="spark_udf."):
        names.append(info.name)
    return sorted(names)


def test_docstring_examples_run(spark):
    attempted = 0
    failures = []
    for name in _module_names():
        module = importlib.import_module(name)
        result = doctest.testmod(
            module, extraglobs={"spark": spark}, optionflags=doctest.ELLIPSIS, report=True
        )
        if result.failed:
            failures.append(name)
        attempted += result.attempted
    assert failures == []
    # detect, detect_specs, processor_specs, query_outputs, run_spark, the sources, the sink
    # and the sketch aggregates each carry one: the count falls if some vanish.
    assert attempted >= 80
