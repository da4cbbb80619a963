"""The errors of rules: one that cannot be compiled, and those raised while running a compiled
rule on a key (bad input order, failing conditions or ``emit`` expressions, unreadable state
bytes)."""

from __future__ import annotations

from cep.errors import EngineError, StateError

__all__ = ["OutOfOrderEventError", "RuleCompileError", "RuleRuntimeError", "StateFormatError"]


class RuleCompileError(EngineError, ValueError):
    """A rule cannot be compiled into an NFA (bad pattern structure, missing condition ...).

    A language error (it renders with file, line and caret like every ``VigilError``) that the
    engine's ``EngineError`` handlers also catch.
    """


class RuleRuntimeError(EngineError):
    """Root of the errors raised while running a compiled rule on a key."""


class OutOfOrderEventError(RuleRuntimeError, ValueError):
    """An event reached the runtime out of event-time order or behind the key's watermark."""


class StateFormatError(RuleRuntimeError, StateError):
    """Serialised rule state is corrupt, truncated, of an unknown version or of another rule."""
