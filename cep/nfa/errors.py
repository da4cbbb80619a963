"""The errors raised while running a compiled rule on a key: bad input order, failing
conditions or ``emit`` expressions, and unreadable state bytes."""

from __future__ import annotations

from cep.events.event import EngineError, StateError

__all__ = ["OutOfOrderEventError", "RuleRuntimeError", "StateFormatError"]


class RuleRuntimeError(EngineError):
    """Root of the errors raised while running a compiled rule on a key."""


class OutOfOrderEventError(RuleRuntimeError, ValueError):
    """An event reached the runtime out of event-time order or behind the key's watermark."""


class StateFormatError(RuleRuntimeError, StateError):
    """Serialised rule state is corrupt, truncated, of an unknown version or of another rule."""
