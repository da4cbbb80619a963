"""Shared fixtures of the Spark operator tests: one local SparkSession for the whole run."""

from __future__ import annotations

import os
import sys

import pytest
import spark_pairs


@pytest.fixture(scope="session")
def spark():
    """A ``local[2]`` session with the UI off and two shuffle partitions (shared, stopped last)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import cloudpickle

    from spark_udf import session

    # Test-only processors live in the tests tree, which executors cannot import by name.
    cloudpickle.register_pickle_by_value(spark_pairs)
    spark = session("local[2]", shuffle_partitions=2, app_name="vigil-tests")
    yield spark
    spark.stop()
