"""The errors of metrics: a declaration that cannot be compiled (located at the offending code),
an unusable batch or event, and unreadable operator state."""

from __future__ import annotations

from cep.errors import EngineError, StateError

__all__ = ["MetricCompileError", "MetricError", "MetricInputError", "MetricStateError"]


class MetricError(EngineError, ValueError):
    """Root of the errors of metric compilation and evaluation."""


class MetricCompileError(MetricError):
    """A metric declaration cannot be compiled.

    A language error like every ``VigilError`` (``EngineError`` is one): the message names the
    metric and the span is the offending code (the declaration when nothing more precise is
    known), so it renders as ``file:line:col: error: ...`` with the source line and a caret.
    """


class MetricInputError(MetricError):
    """A batch or event handed to the operator cannot be used (missing time, too old)."""


class MetricStateError(StateError):
    """Operator state bytes are truncated, corrupted, of another version or another metric."""
