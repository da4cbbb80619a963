"""Windowed metrics: aggregates (exact, or backed by mergeable sketches), window shapes, the
compiled metric and its window operator, and the keyed metric processor."""

from __future__ import annotations

from cep.metrics.operator import CompiledMetric, MetricOperator, compile_metric
from cep.metrics.processor import MetricProcessor

__all__ = ["CompiledMetric", "MetricOperator", "MetricProcessor", "compile_metric"]
