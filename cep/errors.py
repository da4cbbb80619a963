"""The errors of the engine's library layers, rooted at :class:`EngineError`, itself a
:class:`~query_lang.errors.VigilError` like every error Vigil reports (the language's, the
percolator's, the Spark operator's, alert delivery's and the command line's usage error).

Each subclass also inherits the matching builtin, so callers may catch either.
"""

from __future__ import annotations

from query_lang.errors import VigilError

__all__ = ["BadEventError", "CheckpointError", "EngineError", "StateError", "UnknownRuleError"]


class EngineError(VigilError):
    """Root of the errors raised by the engine's library layers (events, event time, rules,
    metrics, the engine)."""


class BadEventError(EngineError, ValueError):
    """An event does not fit its stream; becomes a dead letter with ``reason`` and ``detail``.

    Parameters
    ----------
    reason:
        A short machine-readable cause, one of :class:`EventReason`'s values.
    detail:
        What exactly is wrong, naming the field and the offending value.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StateError(EngineError, ValueError):
    """Serialised per-key state is truncated, corrupted or of an unknown format version."""


class CheckpointError(StateError):
    """An engine checkpoint cannot be written, read or restored: a file that is corrupt,
    truncated or of another format version, or an engine it cannot be restored into."""


class UnknownRuleError(EngineError, KeyError):
    """A rule name that is not registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
