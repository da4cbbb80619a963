"""Windowed metrics: aggregates (exact, or backed by mergeable sketches), window shapes, the
compiled metric and its window operator, and the keyed metric processor."""

from __future__ import annotations

from cep.metrics.aggregates import (
    HLL_PRECISION,
    SEEN_CAPACITY,
    SEEN_ERROR_RATE,
    SEEN_EXACT_LIMIT,
    SMALL_DISTINCT,
    TDIGEST_COMPRESSION,
)
from cep.metrics.compiler import CompiledMetric, compile_metric, metric_match_id
from cep.metrics.errors import (
    MetricCompileError,
    MetricError,
    MetricInputError,
    MetricStateError,
)
from cep.metrics.operator import MetricOperator
from cep.metrics.processor import MetricProcessor
from cep.metrics.state import STATE_VERSION
from cep.metrics.windows import WindowShape

__all__ = [
    "HLL_PRECISION",
    "SEEN_CAPACITY",
    "SEEN_ERROR_RATE",
    "SEEN_EXACT_LIMIT",
    "SMALL_DISTINCT",
    "STATE_VERSION",
    "TDIGEST_COMPRESSION",
    "CompiledMetric",
    "MetricCompileError",
    "MetricError",
    "MetricInputError",
    "MetricOperator",
    "MetricProcessor",
    "MetricStateError",
    "WindowShape",
    "compile_metric",
    "metric_match_id",
]
