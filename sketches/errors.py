"""Error classes for the sketches package: one root, `SketchError`, and subclasses that also
inherit the matching builtin so callers may catch either."""

from __future__ import annotations

__all__ = [
    "CorruptSketchError",
    "IncompatibleSketchError",
    "InvalidParameterError",
    "SketchError",
    "UnsupportedValueError",
]


class SketchError(Exception):
    """Root of every error raised by the sketches package."""


class InvalidParameterError(SketchError, ValueError):
    """A sketch was constructed or queried with a parameter outside its valid range."""


class IncompatibleSketchError(SketchError, ValueError):
    """Two sketches cannot be merged: different kinds, parameters or hash functions."""


class CorruptSketchError(SketchError, ValueError):
    """Serialised sketch bytes are truncated, corrupted or of an unknown format."""


class UnsupportedValueError(SketchError, TypeError):
    """A value has a type that has no canonical hash encoding."""
