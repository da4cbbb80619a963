"""The application layer: the ``vigil`` command line, the only place that parses arguments, prints
for people, defines exit codes and starts Spark (through :mod:`spark_udf`)."""

from __future__ import annotations

from cep.cli.main import main

__all__ = ["main"]
